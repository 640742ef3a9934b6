"""The Claude Code adapter's per-line scans (the C kernel's ``scan_transcript`` and the
simdjson one, payload left as bytes) against the plain orjson reading of the same lines:
the same verdict on every line, the same entries, findings, rows and usage
(docs/formats.md, "The per-line scan").

Each case is read with each scan on every line and with no scan at all (the reading
before the scans existed), and compared. The lines are hostile on purpose:
repeated keys at every level the scan reads, a byte order mark, numbers out of range,
NaN, invalid UTF-8, lone surrogates, deep nesting, trailing commas, objects and arrays
where strings are expected, a subagent's copied line (``agent_progress``: read by the scan
down to the copy's usage) and the lines the scan leaves to orjson (a ``toolUseResult``
naming a subagent).
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.formats.claude_code as cc
from pipeline.audit.session import SessionAudit, audit_session
from pipeline.formats.base import Scanned
from pipeline.ledger import kernel
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import Entry, LineStats, audit_view
from tests.helpers.data_paths import REAL

KEY = "projects/-w/s1.jsonl"
TS = "2026-02-11T20:31:53.375Z"


#: The scans under test: the C kernel's where it built, and the simdjson one.
SCANS = ["c", "simdjson"] if kernel.scan_transcript_c is not None else ["simdjson"]
#: No scan: every line read by orjson.
NONE = ("simdjson", 1 << 62)


def forced(m: pytest.MonkeyPatch, implementation: str, limit: int) -> None:
    """Make the adapter read with ``implementation``'s scan (``scanner()``), the simdjson
    one from ``limit`` bytes."""
    m.setattr(kernel, "IMPLEMENTATION", implementation)
    m.setattr(cc, "SCAN_MIN_BYTES", limit)


def read_both(lines: list[bytes], monkeypatch: pytest.MonkeyPatch, implementation: str
              ) -> tuple[tuple[list[Any], SessionAudit], tuple[list[Any], SessionAudit]]:
    """(entries and findings, audit) with ``implementation``'s scan on every line, then
    with none."""
    key = parse_session_path(KEY)
    assert key is not None
    out = []
    for arm in ((implementation, 0), NONE):
        with monkeypatch.context() as m:
            forced(m, *arm)
            assert (cc.scanner()[0] is cc.scan) == (arm[0] != "c")
            items = list(cc.ClaudeCode().read(iter(lines), LineStats(), {}))
            audit = audit_session(key, iter(lines))
        out.append((items, audit))
    return out[0], out[1]


def assert_same(lines: list[bytes], monkeypatch: pytest.MonkeyPatch,
                implementation: str) -> None:
    (items, audit), (plain_items, plain) = read_both(lines, monkeypatch, implementation)
    # Entries compare by value (a lazy payload equals the data it parses to).
    assert items == plain_items
    for entry, plain_entry in zip(items, plain_items, strict=True):
        if isinstance(entry, Entry) and entry.kind == "message":
            # What the audit reads: meta whole, a user's blocks by their type.
            view, full = audit_view(entry), audit_view(plain_entry)
            assert view["meta"] == full["meta"]
            if full["message"]["role"] == "user":
                assert list(map(block_type, view["message"]["content"])) == list(
                    map(block_type, full["message"]["content"]))
    assert audit.row == plain.row
    assert audit.findings == plain.findings
    assert audit.usage == plain.usage
    assert audit.links == plain.links


def block_type(block: Any) -> str | None:
    """A block's type as the audit reads it (one that is not a string equals none)."""
    kind = block.get("type") if type(block) is dict else None
    return kind if type(kind) is str else None


def line(uuid: str, parent: str | None, **fields: Any) -> dict[str, Any]:
    return {"parentUuid": parent, "isSidechain": False, "cwd": "/w", "sessionId": "s1",
            "version": "2.1.39", "type": "user", "timestamp": TS, "uuid": uuid,
            "message": {"role": "user", "content": "hello"}, **fields}


def dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def assistant(uuid: str, parent: str, **message: Any) -> dict[str, Any]:
    body = {"model": "claude-opus-4-6", "id": "msg_1", "role": "assistant",
            "content": [{"type": "text", "text": "ok"}],
            "usage": {"input_tokens": 3, "output_tokens": 5, "cache_read_input_tokens": 7,
                      "cache_creation_input_tokens": 11,
                      "cache_creation": {"ephemeral_1h_input_tokens": 4}}, **message}
    return line(uuid, parent, type="assistant", requestId="req_1", message=body)


BASE = [dump(line("u1", None)), dump(assistant("a1", "u1"))]


def copied(uuid: bytes, copy: bytes, agent: bytes = b"ag1") -> bytes:
    """A parent's agent_progress line holding ``copy`` (a subagent's line, as bytes)."""
    return (b'{"uuid":"' + uuid + b'","parentUuid":"a1","type":"progress","timestamp":"'
            + TS.encode() + b'","data":{"message":' + copy
            + b',"type":"agent_progress","agentId":"' + agent + b'"}}')


#: Lines spliced by hand: what json.dumps cannot write (repeated keys, bad bytes).
HOSTILE: list[bytes] = [
    b'{"uuid":"x1","uuid":"x2","parentUuid":"a1","type":"user","timestamp":"' + TS.encode()
    + b'","message":{"role":"user","content":"hi"}}',
    b'{"uuid":"x3","parentUuid":"a1","type":"assistant","requestId":"r","timestamp":"'
    + TS.encode() + b'","message":{"id":"m","id":"n","model":"claude-opus-4-6",'
    b'"usage":{"input_tokens":1,"input_tokens":9}}}',
    b'{"uuid":"x4","parentUuid":"a1","type":"user","timestamp":"' + TS.encode()
    + b'","message":{"role":"user","content":[{"type":"text","type":"tool_result"}]}}',
    b'{"uuid":"x5","parentUuid":"a1","type":"progress","timestamp":"' + TS.encode()
    + b'","data":{"type":"hook_progress","type":"agent_progress"}}',
    b'\xef\xbb\xbf{"uuid":"x6","parentUuid":"a1","type":"user","timestamp":"' + TS.encode()
    + b'"}',
    b'{"uuid":"x7","parentUuid":"a1","type":"user","n":1e400}',
    b'{"uuid":"x8","parentUuid":"a1","type":"user","n":NaN}',
    b'{"uuid":"x9","parentUuid":"a1","type":"user","t":"\xff\xfe"}',
    b'{"uuid":"x10","parentUuid":"a1","type":"user","t":"\\ud800"}',
    b'{"uuid":"x11","parentUuid":"a1","type":"user","n":[1,2,],}',
    b'{"uuid":"x12","parentUuid":"a1","type":"user","n":' + b"[" * 2000 + b"]" * 2000 + b"}",
    b'{"uuid":"x13","parentUuid":"a1","type":"assistant","n":99999999999999999999999}',
    b'{"uuid":"x14","parentUuid":"a1","type":"assistant","requestId":"r2","timestamp":"'
    + TS.encode() + b'","message":{"id":"m2","model":"claude-opus-4-6","usage":{'
    b'"input_tokens":18446744073709551615,"output_tokens":-1}}}',
    # every key the scan keeps, repeated past the number of keys it keeps
    b'{' + b'"uuid":"x16","parentUuid":"a1",' * 20 + b'"type":"user","timestamp":"'
    + TS.encode() + b'"}',
    b'[1,2]',
    b'"a string"',
    b'{"uuid":"x15","parentUuid":"a1","type":"user"} trailing',
    # a subagent's copy: repeated keys in the copied line and in its message, an escape
    copied(b"x17", b'{"type":"user","type":"assistant","requestId":"r3","message":'
           b'{"id":"m3","model":"claude-opus-4-6","usage":{"input_tokens":2}}}'),
    copied(b"x18", b'{"type":"assistant","requestId":"r4","message":{"id":"m4",'
           b'"id":"m5","model":"claude-opus-4-6","usage":{"input_tokens":2}}}'),
    copied(b"x19", b'{"type":"assistant","requestId":"r\\u0035","message":{"id":'
           b'"m6","model":"claude-\\u006fpus-4-6","usage":{"input_tokens":2}}}',
           agent=b"a\\u0067"),
    copied(b"x20", b'{"type":"assistant","requestId":"r7","message":{"id":"m7",'
           b'"model":"claude-opus-4-6","usage":{"input_tokens":1e400}}}'),
]
#: Valid lines with odd types where the scan reads plain values.
ODD: list[dict[str, Any]] = [
    line("o1", "a1", timestamp={"t": 1}),
    line("o2", ["a1"]),
    line("o3", None, logicalParentUuid="a1"),
    line("o4", None, logicalParentUuid={"x": 1}),
    line("o5", "nowhere", isSidechain=True),
    line("o6", "a1", message={"role": "user", "content": [1, None, "x", {"type": 5}, {}]}),
    line("o7", "a1", message={"role": "user", "content": {"type": "text"}}),
    line("o8", "a1", message=["x"]),
    line("o9", "a1", isMeta=True),
    line("o10", "a1", isCompactSummary=True),
    line("o11", "a1", type="system", subtype="compact_boundary"),
    line("o12", "a1", type="progress", data={"type": "hook_progress", "x": [1] * 50}),
    line("o13", "a1", type="progress", data=["agent_progress"]),
    line("o14", "a1", type="progress", data={"type": "agent_progress", "agentId": "ag1",
                                             "message": assistant("m1", "zz")}),
    line("o24", "a1", type="progress", data={"message": assistant("m2", "zz"),
                                             "normalizedMessages": [assistant("m2", "zz")],
                                             "type": "agent_progress", "agentId": "ag2"}),
    line("o25", "a1", type="progress", data={"type": "agent_progress", "agentId": 5,
                                             "message": line("m3", "zz")}),
    line("o26", "a1", type="progress", data={"type": "agent_progress", "message": "x"}),
    line("o27", "a1", type="progress", data={"type": "agent_progress", "agentId": "ag3",
                                             "message": {"type": "assistant",
                                                         "message": ["x"]}}),
    line("o28", "a1", type="progress", data={
        "type": "agent_progress", "agentId": "ag4",
        "message": assistant("m4", "zz", model="<synthetic>")}),
    line("o29", "a1", type="progress", data={
        "type": "agent_progress", "agentId": "ag5",
        "message": assistant("m5", "zz", usage={"input_tokens": 1, "speed": "fast",
                                                "cache_creation_input_tokens": 9,
                                                "cache_creation": {
                                                    "ephemeral_1h_input_tokens": 20}})}),
    line("o15", "a1", toolUseResult={"agentId": "ag1", "status": "completed"},
         message={"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}),
    line("o16", "a1", toolUseResult={"status": "completed", "content": ["x" * 100]}),
    line("o17", "a1", toolUseResult=["agentId"]),
    assistant("o18", "a1", model="<synthetic>"),
    assistant("o19", "a1", usage=[1, 2]),
    assistant("o20", "a1", usage={"input_tokens": 2.5, "output_tokens": True}),
    assistant("o21", "a1", id={"x": 1}),
    line("o22", "a1", type="custom-title", message=None),
    line("", "a1"),
    {**line("o23", "a1"), "uuid": 7},
]


@pytest.mark.parametrize("implementation", SCANS)
@pytest.mark.parametrize("bad", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_line_gets_the_same_verdict_with_and_without_the_scan(
        bad: bytes, implementation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_same([*BASE, bad + b"\n", dump(line("after", "a1"))], monkeypatch, implementation)
    # as the last line (torn tail)
    assert_same([*BASE, bad], monkeypatch, implementation)


@pytest.mark.parametrize("implementation", SCANS)
@pytest.mark.parametrize("odd", ODD, ids=range(len(ODD)))
def test_an_odd_valid_line_reads_the_same_with_and_without_the_scan(
        odd: dict[str, Any], implementation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_same([*BASE, dump(odd), dump(line("after", "a1"))], monkeypatch, implementation)


def test_the_real_transcripts_read_the_same_with_and_without_the_scan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    files = sorted((REAL / "claude-code").rglob("*.jsonl"))
    assert len(files) == 12
    arms = [*((name, 0) for name in SCANS), ("simdjson", cc.SCAN_MIN_BYTES), NONE]
    for path in files:
        key = parse_session_path(path.relative_to(REAL / "claude-code").as_posix())
        assert key is not None
        audits = []
        for arm in arms:
            with monkeypatch.context() as m, path.open("rb") as f:
                forced(m, *arm)
                audits.append(audit_session(key, f, size=path.stat().st_size))
        first = audits[0]
        for other in audits[1:]:
            assert (other.row, other.findings, other.usage, other.links) == (
                first.row, first.findings, first.usage, first.links), path.name


@pytest.mark.skipif("c" not in SCANS, reason="the C kernel did not build here")
def test_the_c_scan_gives_what_the_simdjson_scan_gives_on_every_real_line() -> None:
    read = deferred = 0
    for path in sorted((REAL / "claude-code").rglob("*.jsonl")):
        for raw in path.read_bytes().splitlines():
            assert kernel.scan_transcript_c is not None
            found = kernel.scan_transcript_c(Scanned, raw)
            if found is None:
                deferred += 1
                continue
            read += 1
            assert type(found) is Scanned
            assert found == cc.scan(raw)
    # Left to orjson: the tool results naming a subagent (4 lines); the subagents'
    # copied lines (130) are read by the scan.
    assert 0 < deferred < read / 100


@pytest.mark.parametrize("implementation", SCANS)
def test_a_scanned_entry_parses_its_payload_on_demand_and_pickles(
        implementation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    forced(monkeypatch, implementation, 0)
    lines = [dump(line("u1", None)), dump(assistant("a1", "u1"))]
    entries = [e for e in cc.ClaudeCode().read(iter(lines), LineStats(), {})
               if isinstance(e, Entry)][1:]
    user, reply = entries
    assert user.data == {"message": {"role": "user", "content": [
        {"type": "text", "text": "hello"}]}, "meta": {}}
    assert reply.data["message"]["content"] == [{"type": "text", "text": "ok"}]
    assert pickle.loads(pickle.dumps(reply)) == reply
    assert reply.digest == ""  # no chain here: only the head is hashed (the row's head_hash)


def json_value(depth: int = 3) -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text()
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.sampled_from(
                            ["type", "uuid", "id", "usage", "agentId", "x"]) | st.text(max_size=4),
                            inner, max_size=3), max_leaves=8)


FIELDS = ["uuid", "parentUuid", "logicalParentUuid", "isSidechain", "type", "timestamp",
          "message", "data", "toolUseResult", "requestId", "subtype", "isMeta"]


@settings(max_examples=150, deadline=None)
@given(base=st.sampled_from([line("f", "a1"), assistant("f", "a1"),
                             line("f", "a1", type="progress", data={"type": "agent_progress"})]),
       changes=st.dictionaries(st.sampled_from(FIELDS), json_value(), max_size=3),
       cut=st.integers(0, 400), junk=st.binary(max_size=4))
def test_any_fuzzed_line_reads_the_same_with_and_without_the_scan(
        base: dict[str, Any], changes: dict[str, Any], cut: int, junk: bytes) -> None:
    obj = {**base, **changes}
    try:
        raw = json.dumps(obj, separators=(",", ":"), allow_nan=True).encode()
    except (ValueError, UnicodeEncodeError):
        return
    damaged = raw[:cut] + junk + raw[cut:] if junk else raw
    for implementation in SCANS:
        with pytest.MonkeyPatch.context() as m:
            assert_same([*BASE, raw + b"\n", damaged + b"\n"], m, implementation)
