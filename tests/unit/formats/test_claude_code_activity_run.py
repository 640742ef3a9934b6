"""The Claude Code adapter's activity lines in one C loop (``activity_run``: the kernel's
``activity_run`` as :func:`~pipeline.formats.base.json_lines`' ``run``) against the
adapter's own loop over the same lines: the same entries (of the same types), findings,
rows, usage and links (docs/formats.md, "Activity lines in one loop").

Each transcript is read three ways: the C scan with the run, the C scan without it, and
no scan at all (every line read by orjson). The lines are progress lines most of the
time, each now and then made into one the run must leave to the loop: a parent not
seen yet (a sidechain's, or an orphan's), a null parent (a logical parent), an escaped
or empty or missing uuid, a timestamp of another type, a subagent's copy, data of
another type, a message, a number or an escape where the scan defers, a repeated key,
spaces in the JSON, a blank line, a line too long to read, a damaged line, no newline at
the end.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeline.formats.claude_code as cc
from pipeline.audit.session import audit_session
from pipeline.ledger import kernel
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import Entry, LineStats
from pipeline.ledger.types import OversizeLine
from tests.helpers.data_paths import REAL

pytestmark = pytest.mark.skipif(kernel.activity_run_c is None,
                                reason="the C kernel did not build here")

KEY = "projects/-w/s1.jsonl"
TS = "2026-02-11T20:31:53.375Z"
ARMS = ("run", "no run", "no scan")


def dump(obj: dict[str, Any], **dumps: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), **dumps).encode() + b"\n"


def line(uuid: Any, parent: Any, **fields: Any) -> dict[str, Any]:
    return {"parentUuid": parent, "isSidechain": False, "userType": "external", "cwd": "/w",
            "sessionId": "s1", "version": "2.1.39", "type": "user", "timestamp": TS,
            "uuid": uuid, "message": {"role": "user", "content": "hello"}, **fields}


def progress(uuid: Any, parent: Any, **fields: Any) -> dict[str, Any]:
    obj = line(uuid, parent, **{"type": "progress", "toolUseID": "t1",
                                "data": {"type": "hook_progress", "n": "x"}, **fields})
    del obj["message"]
    return obj


def variant(kind: str, n: int, parent: str) -> bytes | OversizeLine:
    """Line ``n`` of a transcript, of ``kind``, its parent ``parent`` (an earlier uuid)."""
    uuid = f"p{n}"
    plain = {
        "progress": lambda: progress(uuid, parent),
        "orphan": lambda: progress(uuid, "nowhere"),
        "sidechain": lambda: progress(uuid, "nowhere", isSidechain=True),
        "logical": lambda: progress(uuid, None, logicalParentUuid=parent),
        "no parent": lambda: {k: v for k, v in progress(uuid, parent).items()
                              if k != "parentUuid"},
        "empty uuid": lambda: progress("", parent),
        "uuid not a string": lambda: progress(7, parent),
        "no uuid": lambda: {k: v for k, v in progress(uuid, parent).items() if k != "uuid"},
        "no timestamp": lambda: {k: v for k, v in progress(uuid, parent).items()
                                 if k != "timestamp"},
        "null timestamp": lambda: progress(uuid, parent, timestamp=None),
        "numeric timestamp": lambda: progress(uuid, parent, timestamp=17),
        "object timestamp": lambda: progress(uuid, parent, timestamp={"t": 1}),
        "copy": lambda: progress(uuid, parent, data={"type": "agent_progress", "x": 1}),
        "data list": lambda: progress(uuid, parent, data=["agent_progress"]),
        "data string": lambda: progress(uuid, parent, data="x"),
        "data number": lambda: progress(uuid, parent, data=5),
        "data type number": lambda: progress(uuid, parent, data={"type": 5}),
        "data untyped": lambda: progress(uuid, parent, data={"x": 1}),
        "with message": lambda: progress(uuid, parent, message={"role": "user"}),
        "number": lambda: progress(uuid, parent, isMeta=3),
        # its type past the run's first look (1,024 bytes in)
        "type late": lambda: progress(uuid, parent, cwd="/w" * 600),
        "user": lambda: line(uuid, parent),
        "system": lambda: line(uuid, parent, type="system", subtype="stop_hook_summary"),
    }
    if kind in plain:
        return dump(plain[kind]())
    if kind == "escaped uuid":
        return dump(progress(uuid, parent)).replace(b'"uuid":"p', b'"uuid":"\\u0070')
    if kind == "escaped parent":
        escaped = f"\\u{ord(parent[0]):04x}{parent[1:]}".encode()
        return dump(progress(uuid, parent)).replace(
            b'"parentUuid":"' + parent.encode(), b'"parentUuid":"' + escaped)
    if kind == "escaped timestamp":
        return dump(progress(uuid, parent)).replace(b'"2026', b'"\\u0032026')
    if kind == "non-ascii":
        return dump(progress(uuid, parent, data={"type": "hook_progress", "t": "é✓"}),
                    ensure_ascii=False)
    if kind == "repeated key":
        return dump(progress(uuid, parent))[:-2] + b',"uuid":"again"}\n'
    if kind == "spaced":
        return json.dumps(progress(uuid, parent)).encode() + b"\n"
    if kind == "blank":
        return b"\n"
    if kind == "too long":
        return OversizeLine(400, 10, True)
    if kind == "damaged":
        return dump(progress(uuid, parent))[:-3] + b"\n"
    raise AssertionError(kind)


KINDS = ["progress", "orphan", "sidechain", "logical", "no parent", "empty uuid",
         "uuid not a string", "no uuid", "no timestamp", "null timestamp",
         "numeric timestamp", "object timestamp", "copy", "data list", "data string",
         "data number", "data type number", "data untyped", "with message", "number",
         "user", "system", "escaped uuid", "escaped parent", "escaped timestamp",
         "non-ascii", "repeated key", "spaced", "type late", "blank", "too long", "damaged"]


def transcript(kinds: list[str], opening: str, torn: bool) -> list[bytes]:
    """An opening line, then one line per kind (mostly plain progress lines), each
    parented on the line two before (a uuid read earlier)."""
    lines: list[bytes] = [variant(opening, 0, "u0") if opening != "user"
                          else dump(line("u0", None))]
    for n, kind in enumerate(kinds, 1):
        lines.append(variant(kind, n, "u0" if n < 3 else f"p{n - 2}"))
    if torn and lines[-1][-1:] == b"\n" and type(lines[-1]) is bytes:
        lines[-1] = lines[-1][:-1]
    return lines


def read(lines: list[bytes], arm: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    with monkeypatch.context() as m:
        m.setattr(kernel, "IMPLEMENTATION", "simdjson" if arm == "no scan" else "c")
        if arm == "no scan":
            m.setattr(cc, "SCAN_MIN_BYTES", 1 << 62)
        if arm != "run":
            m.setattr(kernel, "activity_run_c", None)
        header: dict[str, Any] = {}
        stats = LineStats()
        items = list(cc.ClaudeCode().read(iter(lines), stats, header))
        key = parse_session_path(KEY)
        assert key is not None
        audit = audit_session(key, iter(lines))
    return items, header, (stats.lines, stats.bytes), audit.row, audit.findings, audit.usage, \
        audit.links


def assert_same(lines: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    run, no_run, no_scan = (read(lines, arm, monkeypatch) for arm in ARMS)
    # The run makes the entries the loop makes from the same scan: the same types too.
    assert [type(e) for e in run[0]] == [type(e) for e in no_run[0]]
    assert run == no_run
    assert run == no_scan  # a lazy payload equals the data it parses to


@settings(max_examples=200, deadline=None)
@given(kinds=st.lists(st.sampled_from(KINDS) | st.just("progress"), max_size=14),
       opening=st.sampled_from(["user", "progress", "no uuid", "damaged", "blank"]),
       torn=st.booleans())
@example(kinds=["progress"] * 5, opening="user", torn=False)
@example(kinds=["progress", "orphan", "progress", "sidechain", "progress"], opening="user",
         torn=True)
@example(kinds=["progress", "progress"], opening="no uuid", torn=False)
def test_any_transcript_reads_the_same_with_and_without_the_run(
        kinds: list[str], opening: str, torn: bool) -> None:
    with pytest.MonkeyPatch.context() as m:
        assert_same(transcript(kinds, opening, torn), m)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_line_after_progress_lines_reads_the_same(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_same(transcript(["progress", "progress", kind, "progress"], "user", False),
                monkeypatch)


def test_the_run_takes_the_plain_progress_lines_and_nothing_else(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Which lines the run takes (a run that takes none would pass the tests above)."""
    kinds = ["progress", "progress", "user", "progress", "orphan", "progress", "copy",
             "escaped uuid", "non-ascii", "progress", "type late"]
    lines = transcript(kinds, "user", False)
    taken: list[int] = []
    real = kernel.activity_run_c
    assert real is not None

    def counting(seen: set[str], batch: list[Any], it: Any, number: int) -> tuple[int, int]:
        answer = real(seen, batch, it, number)
        taken.extend(e.line for e in batch[len(batch) - answer[0]:])
        return answer

    monkeypatch.setattr(kernel, "activity_run_c", counting)
    monkeypatch.setattr(kernel, "IMPLEMENTATION", "c")
    items = list(cc.ClaudeCode().read(iter(lines), LineStats(), {}))
    # Line 1 is the user line; the run takes the plain progress lines after a line the
    # loop read (line 2 after it, 3 too, 5, 7 after the orphan the loop read, the
    # non-ascii one and the one after it), never the others.
    assert taken == [2, 3, 5, 7, 10, 11]
    entries = [e for e in items if isinstance(e, Entry)]
    assert [e.line for e in entries] == list(range(0, 13))  # the root is line 0
    assert all(e.kind == "activity" for e in entries if e.line in taken)


def test_nothing_is_taken_before_the_first_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first entry names the session (the header's session id, cwd and version):
    while no entry is read, the run takes nothing, even a progress line whose parent is
    the root's id."""
    lines = [dump({"type": "summary", "summary": "x"}),
             dump(progress("p1", cc.ROOT_ID, sessionId="first")),
             dump(progress("p2", "p1", sessionId="second"))]
    monkeypatch.setattr(kernel, "IMPLEMENTATION", "c")
    header: dict[str, Any] = {}
    list(cc.ClaudeCode().read(iter(lines), LineStats(), header))
    assert header["session_id"] == "first"
    assert_same(lines, monkeypatch)


def test_the_real_transcripts_read_the_same_with_and_without_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    files = sorted((REAL / "claude-code").rglob("*.jsonl"))
    assert len(files) == 12
    for path in files:
        assert_same(path.read_bytes().splitlines(keepends=True), monkeypatch)


def test_the_run_wants_its_arguments() -> None:
    run = kernel.activity_run_c
    assert run is not None and kernel.pushback_c is not None
    with pytest.raises(TypeError):
        run(set(), [], iter([b"{}\n"]), 1)  # not pushback lines
    with pytest.raises(TypeError):
        run([], [], kernel.pushback_c([]), 1)  # type: ignore[arg-type]
