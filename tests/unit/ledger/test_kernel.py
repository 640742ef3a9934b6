"""The per-line kernel (pipeline.ledger.kernel) against the orjson reader it stands in for.

No strictness lost (issue 21): on the same hostile and fuzzed lines (deep nesting, big
numbers, invalid UTF-8, lone surrogates, NaN, repeated keys, trailing commas, a byte
order mark, cut and flipped bytes), :func:`parse_entry` with the kernel forced on every
line gives exactly what the orjson reader gives: the same verdict, the same reason, the
same envelope and the same payload; and what the audit reads of a message through the
kernel's view is what it would read from the whole payload.

Where simdjson and orjson differ by design, the kernel defers to orjson (docs/audit.md,
"The per-line kernel"): simdjson refuses integers past 64 bits that orjson reads as
floats, and skips a leading byte order mark that orjson refuses. The kernel never
decides those lines: ``test_where_simdjson_and_orjson_differ_orjson_decides`` says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import simdjson
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from pipeline.audit.session import _header_fields, _info, _node_info, audit_session
from pipeline.ledger import kernel, reader
from pipeline.ledger import tree as tree_module
from pipeline.ledger.entry import starts_turn
from pipeline.ledger.reader import (
    Entry,
    LazyEntry,
    audit_view,
    header_view,
    parse_entry,
    read_ledger,
)
from pipeline.ledger.tree import TreeIndex
from pipeline.ledger.types import Code, OversizeLine
from tests.helpers.data_paths import CONFORMANCE, REAL
from tests.helpers.ledgers import (
    LedgerBuilder,
    dumps,
    message_with_roles,
    sample_session,
    session_key,
)

ENVELOPE = {"id": "01a1b38f-04cf-78f0-8a1f-9bc406bc3226",
            "parent_id": "01a1b38e-9caa-79f6-b93e-fc0a81576b6c",
            "ts": "2026-11-07T01:10:56.975281879Z",
            "prev_hash": "7c4c4aeace9e62e322c470c953d379e8b714a3d312b66837035165b2d7f8ac57",
            "at_turn": "01a1b38e-2dff-7bae-a49e-1ab2490052be"}


#: Both implementations of the kernel's one contract (the C one where it built).
IMPLEMENTATIONS = [
    pytest.param("c", marks=pytest.mark.skipif(kernel.scan_c is None,
                                                reason="the C kernel did not build here")),
    "simdjson",
]


@pytest.fixture(autouse=True, params=IMPLEMENTATIONS)
def kernel_on_every_line(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The kernel (each implementation in turn) reads every line here, short ones
    included (in a run, simdjson only long ones)."""
    monkeypatch.setattr(reader, "_worth_it", lambda body: True)
    monkeypatch.setattr(reader, "_scan", {"c": kernel.scan_c,
                                          "simdjson": kernel.scan_simdjson}[request.param])
    return str(request.param)


def same(body: bytes) -> None:
    """The kernel's reading of ``body`` is the orjson reader's, in every respect; and
    where both kernels vouch for a line, they read it alike."""
    found = reader._scan(body)
    if found is not None and kernel.scan_c is not None:
        other = kernel.scan_simdjson(body) if reader._scan is kernel.scan_c \
            else c_scan(body)
        assert other is None or other == found
    got = parse_entry(body, 7)
    if found is not None and reader.valid_ts(found[3]):  # vouched for: the tuple's entry
        assert type(got[0]) is LazyEntry
        assert tuple(got[0][1:7]) == found[:6]
    want = reader.parse_entry_orjson(body, 7)
    assert got[1:] == want[1:]
    assert (got[0] is None) == (want[0] is None)
    if kernel.entry_c is not None:  # the C kernel's whole entry: none, or orjson's reading
        whole = kernel.entry_c(body, 7)
        if whole is not None:
            assert want[1:] == (False, "")
            assert tuple(whole[:8]) == tuple(want[0][:8])
            assert kernel.worth_it_c is not None
            if kernel.worth_it_c(body):
                assert type(whole) is LazyEntry
                if type(got[0]) is LazyEntry:  # and the scan's view
                    assert tuple.__getitem__(whole, 8).view == \
                        tuple.__getitem__(got[0], 8).view
            elif type(whole) is LazyEntry:  # a receipt or a header read in C
                assert_kept_as_read(whole, want[0])
            else:  # a receipt or a header read by orjson: orjson's entry, made in C
                assert type(whole) is Entry
                if body.count(b"[") + body.count(b"{") < 500:
                    assert whole.data == want[0].data
    entry, ref = got[0], want[0]
    if entry is None or ref is None:
        return
    assert tuple(entry[:8]) == tuple(ref[:8])
    if body.count(b"[") + body.count(b"{") < 500:  # Python's == recurses on nesting
        assert entry.data == ref.data
    view = tuple.__getitem__(entry, 8).view if type(entry) is LazyEntry else None
    if view is not None:  # the kernel's view of a message: what the payload says
        assert audit_view(entry) is view
        data = ref.data
        message = data["message"]
        assert view["message"]["role"] == message["role"]
        assert isinstance(message["content"], list)
        assert view.get("meta", 0) == data.get("meta", 0)
        if message["role"] == "user":  # the audit reads the blocks of those only
            assert starts_turn(view["message"], view.get("meta")) == \
                starts_turn(message, data.get("meta"))


def assert_receipt_info(whole: Entry, ref: Entry) -> None:
    """A receipt the C kernel read itself (a lazy entry): its payload's view is the node
    info the audit makes of the whole line (no finding: else orjson would have read
    it), its data the parsed line, and nothing reads the view as the line's data."""
    info = tuple.__getitem__(whole, 8).view
    bad: list[Any] = []
    assert info == _node_info(ref, bad) and not bad
    assert node_info_of(whole) is info
    assert audit_view(whole) == ref.data == whole.data


def assert_header_fields(whole: Entry, ref: Entry) -> None:
    """A header the C kernel read itself: the fields the audit reads of it are those
    of the parsed line, without a finding, and its data is the parsed line."""
    bad: list[Any] = []
    assert header_view(whole) is not None
    assert _header_fields(whole, bad) == _header_fields(ref, bad) and not bad
    assert audit_view(whole) == ref.data == whole.data


def assert_kept_as_read(whole: Entry, ref: Entry) -> None:
    """:func:`assert_receipt_info` or :func:`assert_header_fields` by the entry's kind."""
    assert whole.kind in ("receipt", "header")
    (assert_receipt_info if whole.kind == "receipt" else assert_header_fields)(whole, ref)


def node_info_of(entry: Entry) -> Any:
    bad: list[Any] = []
    info = _info(entry, bad)
    assert not bad
    return info


# -- hand-picked hostile lines -----------------------------------------------------------


def line(payload: dict[str, Any], **env: Any) -> bytes:
    return dumps({**ENVELOPE, **env, **payload})


USER = {"kind": "message", "message": {"role": "user", "content": [
    {"type": "text", "text": "hello"},
    {"type": "tool_result", "tool_use_id": "t1", "content": "ok", "is_error": False}]}}
ASSISTANT = {"kind": "message", "message": {"role": "assistant", "content": [
    {"type": "text", "text": "done"}]}, "meta": {"model": "m", "usage": {
        "input_tokens": 1, "output_tokens": 2, "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 4}}}

HOSTILE = [
    line(USER), line(ASSISTANT), line({"kind": "turn_card", "turn_id": "t", "card": {}}),
    line({"kind": "header", "session_id": "s", "contract": {"model": "m"}}),
    # numbers: out of double range, past 64 bits (orjson reads a float), NaN, Infinity
    line(USER)[:-1] + b',"n":1e400}', line(USER)[:-1] + b',"n":-1e400}',
    line(USER)[:-1] + b',"n":18446744073709551616}',
    line(USER)[:-1] + b',"n":-9223372036854775809}',
    line(USER)[:-1] + b',"n":18446744073709551615}',
    line(USER)[:-1] + b',"n":NaN}', line(USER)[:-1] + b',"n":Infinity}',
    line(USER)[:-1] + b',"n":1e-400}', line(USER)[:-1] + b',"n":-0}',
    # strings: invalid UTF-8, an encoded surrogate, lone and reversed surrogate escapes
    line(USER).replace(b"hello", b"hel\xfflo"), line(USER).replace(b"hello", b"\xed\xa0\x80"),
    line(USER).replace(b"hello", b"\\ud800"), line(USER).replace(b"hello", b"\\udc00\\ud800"),
    line(USER).replace(b"hello", b"\\ud83d\\ude00"), line(USER).replace(b"hello", b"\\u0000"),
    line(USER).replace(b"hello", b"a\x01b"),
    # nesting: at and past the depth both parsers take
    line(USER)[:-1] + b',"d":' + b"[" * 1000 + b"]" * 1000 + b"}",
    line(USER)[:-1] + b',"d":' + b"[" * 1030 + b"]" * 1030 + b"}",
    line(USER)[:-1] + b',"d":' + b'{"a":' * 1030 + b"1" + b"}" * 1030 + b"}",
    *(line(USER)[:-1] + b',"d":' + b"[" * n + b"]" * n + b"}" for n in range(1020, 1028)),
    # syntax: trailing commas, trailing bytes, a byte order mark, whitespace
    line(USER)[:-1] + b",}", line(USER).replace(b'"ok"}]', b'"ok"},]'),
    line(USER) + b" x", line(USER) + b"\x00", b"\xef\xbb\xbf" + line(USER),
    b" \t" + line(USER) + b" \r", line(USER)[:-20], b"\x0c" + line(USER),
    line(USER) + b"\x0b", line(USER) + b"\xc2\xa0", line(USER).replace(b",", b" , ", 3),
    # repeated keys: in the envelope, the message, a block, meta; vak's work quirk
    line(USER)[:-1] + b',"id":"other"}', line(USER)[:-1] + b',"kind":"turn_card"}',
    line(USER)[:-1] + b',"ts":"2026-11-07T01:10:56Z"}', line(USER)[:-1] + b',"at_turn":7}',
    line(USER)[:-1] + b',"prev_hash":null}', line(USER)[:-1] + b',"message":{}}',
    line(USER).replace(b'"role":"user"', b'"role":"user","role":"assistant"'),
    line(USER).replace(b'{"type":"text"', b'{"type":"tool_result","type":"text"'),
    line(ASSISTANT).replace(b'"model":"m"', b'"model":"m","model":"n"'),
    line(ASSISTANT)[:-1] + b',"meta":null}', line(ASSISTANT)[:-1] + b',"meta":[]}',
    line({"kind": "work", "contract_id": "c"}).replace(b'"kind":"work"',
                                                      b'"kind":"work","kind":{"type":"x"}'),
    # escaped key spellings and odd envelopes
    line(USER).replace(b'"id":', b'"\\u0069d":'), line(USER)[:-1] + b',"\\u0069d":"x"}',
    line(USER, at_turn=None), line(USER, prev_hash=None), line(USER, parent_id=None),
    line(USER, ts="2026-13-45T25:61:00Z"), line(USER, id=""), line(USER, id=5),
    line({"kind": 5}), line({"kind": ""}), line({"kind": "message", "message": "text"}),
    line({"kind": "message", "message": {"role": "user", "content": "text"}}),
    line({"kind": "message", "message": {"role": 5, "content": []}}),
    line({"kind": "message", "message": {"role": "user", "content": [5, None, {"type": 1},
                                                                   {"type": {"a": 1}}]}}),
    b"", b"[]", b"5", b'"x"', b"null", b"{}", b"{", b"}", b"\xff",
    # over 1 MiB: a parser of its own (freed with the line), valid and damaged
    line(USER).replace(b"hello", b"x" * (3 << 19)),
    line(USER).replace(b"hello", b"x" * (3 << 19) + b"\xff"),
]


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_lines_read_as_the_orjson_reader_reads_them(body: bytes) -> None:
    same(body)


def test_where_simdjson_and_orjson_differ_orjson_decides() -> None:
    """The differences by design: the kernel does not vouch, orjson decides."""
    parser = simdjson.Parser()
    big = line(USER)[:-1] + b',"n":18446744073709551616}'
    with pytest.raises(ValueError):
        parser.parse(big)  # simdjson: no integer past 64 bits
    assert orjson.loads(big)["n"] == float(2**64)  # orjson: a float
    assert kernel.scan_simdjson(big) is None and parse_entry(big, 1)[0] is not None
    bom = b"\xef\xbb\xbf" + line(USER)
    assert parser.parse(bom) is not None  # simdjson skips a byte order mark
    assert kernel.scan_simdjson(bom) is None and parse_entry(bom, 1)[0] is None  # orjson: no


def test_the_kernel_reads_the_common_lines_itself() -> None:
    for body in (line(USER), line(ASSISTANT), line({"kind": "turn_card", "card": {}})):
        entry = parse_entry(body, 1)[0]
        assert type(entry) is LazyEntry


# -- fuzzed lines ----------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "text", "role", "content", "meta", "id", "kind", "usage",
                         "model", "control", "x"]), inner, max_size=4),
    max_leaves=12,
)
BLOCK = st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_result", "image", 5])},
                              optional={"text": st.text(max_size=10), "content": JSON})
PAYLOAD = st.one_of(
    st.fixed_dictionaries({
        "kind": st.just("message"),
        "message": st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "x"]),
                                          "content": st.lists(BLOCK | JSON, max_size=4)}),
    }, optional={"meta": st.none() | st.dictionaries(st.sampled_from(
        ["model", "control", "usage", "x"]), JSON, max_size=3)}),
    st.fixed_dictionaries({"kind": st.sampled_from(["turn_card", "receipt", "header", "x"])},
                          optional={"card": JSON, "attempts": JSON}),
)
# Byte-level damage: where, and what goes in (each one a thing a parser may get wrong).
INSERTS = [b"1e400", b"NaN", b"\xff", b"\xed\xa0\x80", b"\\ud800", b",", b",}", b"]",
           b'"id":"z",', b'"kind":"x",', b'"role":"x",', b'"type":"text",', b"[" * 1100,
           b"18446744073709551616", b"-9223372036854775809", b"\x00", b"\xef\xbb\xbf", b" "]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=PAYLOAD, drop=st.sets(st.sampled_from(["prev_hash", "at_turn", "parent_id"])),
       damage=st.lists(st.tuples(st.floats(0, 1), st.sampled_from(INSERTS)), max_size=3),
       cut=st.none() | st.floats(0, 1))
def test_fuzzed_lines_read_as_the_orjson_reader_reads_them(
        payload: dict[str, Any], drop: set[str], damage: list[tuple[float, bytes]],
        cut: float | None) -> None:
    env = {k: v for k, v in ENVELOPE.items() if k not in drop}
    body = dumps({**env, **payload})
    for where, what in damage:
        at = int(where * len(body))
        body = body[:at] + what + body[at:]
    if cut is not None:
        body = body[: int(cut * len(body))]
    same(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_read_as_the_orjson_reader_reads_them(body: bytes) -> None:
    assume(b"\n" not in body)
    same(body)


# -- whole sessions ------------------------------------------------------------------------


def test_an_audit_with_the_kernel_is_the_audit_without_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = sample_session(turns=6).to_bytes()
    data += data.splitlines(keepends=True)[3][:-9] + b"\n"  # a torn tail
    with_kernel = audit_session(session_key(), io.BytesIO(data))
    monkeypatch.setattr(reader, "_worth_it", lambda body: False)
    without = audit_session(session_key(), io.BytesIO(data))
    assert with_kernel.row == without.row
    assert with_kernel.findings == without.findings
    assert with_kernel.usage == without.usage


@pytest.mark.parametrize("roles", [("assistant", "user"), ("user", "assistant"),
                                   ("assistant", "user", "assistant")])
def test_a_repeated_role_gets_no_view_and_is_reported_or_not_as_without_the_kernel(
        roles: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader skips its duplicate-role search on a line the kernel gave a view of:
    # a view is only made of a message object without a repeated key.
    data, line = message_with_roles(*roles)
    found = reader._scan(data.splitlines()[line - 1])
    assert found is None or found[6] is None
    with_kernel = list(read_ledger(io.BytesIO(data)))
    monkeypatch.setattr(reader, "_worth_it", lambda body: False)
    without = list(read_ledger(io.BytesIO(data)))
    assert with_kernel == without
    dups = [f for f in with_kernel if not isinstance(f, Entry)]
    # (first and last alike: not seen, with or without the kernel: docs/audit.md)
    assert [f.code for f in dups] == ([Code.DUPLICATE_KEY] if roles[0] != roles[-1] else [])


@pytest.mark.skipif(kernel.entry_c is None, reason="the C kernel did not build here")
def test_the_c_kernels_whole_entry_reads_a_session_as_the_reader_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A run's reader: the C kernel's one call per line (this module's fixture turns it
    # off elsewhere), against the scan's steps in Python and against orjson alone.
    data = sample_session(turns=6).to_bytes()
    data += data.splitlines(keepends=True)[3][:-9] + b"\n"  # a torn tail
    monkeypatch.setattr(reader, "_scan", kernel.scan_c)
    monkeypatch.setattr(reader, "_worth_it", kernel.worth_it_c)
    whole = list(read_ledger(io.BytesIO(data)))
    assert sum(type(e) is LazyEntry for e in whole) > 10
    audit = audit_session(session_key(), io.BytesIO(data))
    monkeypatch.setattr(reader, "_worth_it", lambda body: kernel.worth_it_c(body))
    assert list(read_ledger(io.BytesIO(data))) == whole  # the steps in Python
    monkeypatch.setattr(reader, "_worth_it", lambda body: False)
    assert list(read_ledger(io.BytesIO(data))) == whole  # orjson alone
    without = audit_session(session_key(), io.BytesIO(data))
    assert (audit.row, audit.findings, audit.usage) == (without.row, without.findings,
                                                        without.usage)


def without_chained(lines: list[bytes], monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The reader's items of ``lines`` with the C kernel, its one-call common line off."""
    with monkeypatch.context() as m:
        m.setattr(reader, "_chained_c", None)
        return list(read_ledger(lines))


#: Edits of a session's lines, each a way a line leaves the reader's common path.
EDITS = st.sampled_from(["drop", "repeat", "swap", "cut", "blank", "flip", "unterminate",
                         "oversize", "unchain", "crlf"])


def edited(data: bytes, edits: list[tuple[str, float, float]]) -> list[bytes]:
    """A session's bytes edited line by line with ``edits`` (:data:`EDITS`, each at a
    place and with an amount in [0, 1]), as a file yields its lines."""
    lines: list[bytes] = data.splitlines(keepends=True)
    for edit, where, what in edits:
        at = min(int(where * len(lines)), len(lines) - 1)
        if edit == "drop" and len(lines) > 1:
            del lines[at]
        elif edit == "repeat":
            lines.insert(at, lines[at])
        elif edit == "swap":
            other = min(int(what * len(lines)), len(lines) - 1)
            lines[at], lines[other] = lines[other], lines[at]
        elif edit == "cut":
            lines[at] = lines[at][: int(what * len(lines[at]))] + b"\n"
        elif edit == "blank":
            lines.insert(at, b"\n")
        elif edit == "flip" and lines[at]:
            i = int(what * (len(lines[at]) - 1))
            lines[at] = lines[at][:i] + bytes([lines[at][i] ^ 0x20]) + lines[at][i + 1:]
        elif edit == "unterminate":
            lines[at] = lines[at].rstrip(b"\n")
        elif edit == "unchain":
            lines[at] = lines[at].replace(b'"prev_hash":"', b'"prev_hash":"0', 1)
        elif edit == "crlf":
            lines[at] = lines[at].replace(b"\n", b"\r\n")
    lines = b"".join(lines).splitlines(keepends=True)  # as a file yields them
    if any(edit == "oversize" for edit, _, _ in edits):
        # A skipped over-long line (the IO layer's marker) in the middle of the session.
        lines.insert(len(lines) // 2, OversizeLine(10**7, 10**6, terminated=True))
    return lines


@pytest.mark.skipif(kernel.chained_c is None, reason="the C kernel did not build here")
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(EDITS, st.floats(0, 1), st.floats(0, 1)), max_size=4),
       roles=st.sampled_from([(), ("assistant", "user"), ("user", "user")]))
def test_the_c_kernels_common_line_reads_a_session_as_the_reader_does(
        edits: list[tuple[str, float, float]], roles: tuple[str, ...],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # read_ledger takes a chained line in one C call (chained_c) and every other line
    # through its own path: on a session edited line by line, the same items either way.
    monkeypatch.setattr(reader, "_scan", kernel.scan_c)
    monkeypatch.setattr(reader, "_worth_it", kernel.worth_it_c)
    data = message_with_roles(*roles)[0] if roles else sample_session(turns=3).to_bytes()
    lines = edited(data, edits)
    assert list(read_ledger(lines)) == without_chained(lines, monkeypatch)


def audited(lines: list[bytes], keep: list[Entry] | None = None) -> tuple[Any, ...]:
    """What an audit of ``lines`` says: its row, findings, active chain and usage rows."""
    audit = audit_session(session_key(), lines, keep=keep)
    return audit.row, audit.findings, audit.chain_lines, audit.chain_ids, audit.usage


@pytest.mark.skipif(kernel.run_c is None, reason="the C kernel did not build here")
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(EDITS, st.floats(0, 1), st.floats(0, 1)), max_size=4),
       roles=st.sampled_from([(), ("assistant", "user"), ("user", "user")]),
       headers=st.integers(0, 2), headless=st.booleans())
def test_the_c_kernels_run_audits_a_session_as_the_audit_loop_does(
        edits: list[tuple[str, float, float]], roles: tuple[str, ...], headers: int,
        headless: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The audit hands the tree the common lines that follow a common one in one C loop
    # (TreeIndex.runner): on a session edited line by line, with headers chained in
    # its middle (the first of the tree when the file's own is gone), the same audit as
    # its own loop over every entry (the run off), and as when it keeps every entry
    # (which turns the run off too).
    monkeypatch.setattr(reader, "_scan", kernel.scan_c)
    monkeypatch.setattr(reader, "_worth_it", kernel.worth_it_c)
    if roles:
        data = message_with_roles(*roles)[0]
    else:
        b = sample_session(turns=3)
        for turn in range(headers):  # chained to the line before it: the run stops there
            b.header(prev_hash=True)
            b.user(f"after header {turn}")
            b.assistant("answer", u={"input_tokens": turn, "output_tokens": 1})
        data = b.to_bytes()
    if headless:
        data = data.split(b"\n", 1)[1]
    lines = edited(data, edits)
    with_run = audited(lines)
    with monkeypatch.context() as m:
        m.setattr(tree_module, "run_c", None)
        assert audited(lines) == with_run
    assert audited(lines, keep=[]) == with_run


@pytest.mark.skipif(kernel.run_c is None, reason="the C kernel did not build here")
def test_the_c_kernels_run_takes_common_lines_and_gives_back_the_first_other() -> None:
    assert kernel.run_c is not None and kernel.pushback_c is not None
    assert kernel.entry_c is not None
    b = sample_session(turns=2)
    mark = len(b.lines)
    b.header(prev_hash=True)  # chained, in the middle
    b.user("after it")
    lines = b.to_bytes().splitlines(keepends=True)
    first = kernel.entry_c(lines[0][:-1], 1)
    tree = TreeIndex()
    assert tree.add(first) == []
    findings: list[Any] = []
    last: list[Any] = [None]
    run = tree.runner(_node_info, findings, last)
    assert run is not None
    it = kernel.pushback_c(lines[1:])
    taken, used, digest = run(it, 1, first.digest)
    assert (taken, used) == (mark - 1, sum(map(len, lines[1:mark])))
    assert last[0] is not None and last[0].line == mark and digest == last[0].digest
    assert [n.line for n in tree.nodes] == list(range(1, mark + 1)) and findings == []
    assert next(it) == lines[mark]  # the header, given back: the reader's to yield
    # A line not chained to the digest given is given back too, and nothing is taken.
    it = kernel.pushback_c(lines[1:])
    assert run(it, 1, "0" * 64) == (0, 0, "0" * 64) and next(it) == lines[1]
    # An entry the tree's own add decides (a repeated id): its findings appended.
    again = TreeIndex()
    again.add(first)
    entry = kernel.entry_c(lines[1][:-1], 2)
    dup = lines[1].replace(entry.prev_hash.encode(), entry.digest.encode())  # chained to it
    found: list[Any] = []
    runner = again.runner(_node_info, found, [None])
    assert runner is not None
    assert runner(kernel.pushback_c([lines[1], dup]), 1, first.digest)[0] == 2
    assert [f.code for f in found] == [Code.DUPLICATE_ID]


@pytest.mark.skipif(kernel.chained_c is None, reason="the C kernel did not build here")
def test_the_c_kernels_common_line_is_only_a_chained_entry_with_nothing_to_look_for(
        ) -> None:
    assert kernel.chained_c is not None and kernel.entry_c is not None
    data = sample_session(turns=2).to_bytes()
    lines = data.splitlines(keepends=True)
    first = prev = kernel.entry_c(lines[0][:-1], 1).digest
    for n, raw in enumerate(lines[1:], 2):  # message, receipt and other lines alike
        entry = kernel.chained_c(raw, n, prev)
        assert entry is not None and entry == kernel.entry_c(raw[:-1], n)
        prev = entry.digest
    second = lines[1]
    assert kernel.chained_c(second, 2, first) is not None
    # Each of these is the reader's general path's to decide.
    assert kernel.chained_c(second, 2, "0" * 64) is None  # not chained to prev
    assert kernel.chained_c(second[:-1], 2, first) is None  # no newline: a torn tail
    assert kernel.chained_c(b"\n", 2, first) is None  # a blank line
    assert kernel.chained_c(OversizeLine(10**7, 10**6, terminated=True), 2, first) is None
    assert kernel.chained_c(second[:-1] + b"\r\n", 2, first) is None
    assert kernel.chained_c(second[:40] + b"\n", 2, first) is None
    roles, at = message_with_roles("assistant", "user")
    doubt = roles.splitlines(keepends=True)
    before = kernel.entry_c(doubt[at - 2][:-1], at - 1).digest
    assert kernel.entry_c(doubt[at - 1][:-1], at) is not None  # read, but no view:
    assert kernel.chained_c(doubt[at - 1], at, before) is None  # its roles to look at


@contextlib.contextmanager
def digests(direct: bool) -> Iterator[bool]:
    """The C kernel's digests direct (where OpenSSL's ``SHA256()`` was found) or through
    hashlib for the block; whether they are direct, as the block's value."""
    assert kernel.direct_sha256_c is not None
    was = kernel.direct_sha256_c()
    try:
        yield kernel.direct_sha256_c(direct)
    finally:
        kernel.direct_sha256_c(was)


@pytest.mark.skipif(kernel.direct_sha256_c is None, reason="the C kernel did not build here")
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="no /proc to look in")
def test_the_c_kernels_digest_is_direct_where_hashlib_has_a_shared_libcrypto() -> None:
    # Where hashlib runs on a shared libcrypto (this machine's Python), the kernel finds
    # its SHA256(): a lookup that breaks fails here instead of slowing every line.
    with open("/proc/self/maps") as maps:
        shared = "/libcrypto.so" in maps.read()
    assert kernel.direct_sha256_c is not None and kernel.direct_sha256_c() is shared


@pytest.mark.skipif(kernel.direct_sha256_c is None, reason="the C kernel did not build here")
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="no /proc to look in")
def test_the_c_kernels_digest_takes_the_low_level_calls_where_libcrypto_exports_them(
) -> None:
    # OpenSSL 3's one-shot SHA256() fetches the algorithm and allocates a context for
    # every line (docs/audit.md, "The digest"): where the libcrypto hashlib loaded still
    # exports SHA256_Init/Update/Final, the kernel must be calling those.
    from pipeline.ledger._ckernel import sha256_calls
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libcrypto.so" in line}
    if not paths:
        pytest.skip("hashlib runs on no shared libcrypto here")
    low_level = all(hasattr(ctypes.CDLL(path), name) for path in paths
                    for name in ("SHA256_Init", "SHA256_Update", "SHA256_Final"))
    assert sha256_calls() == ("SHA256_Init/Update/Final" if low_level else "SHA256")
    with digests(direct=False):
        assert sha256_calls() == "hashlib"


@pytest.mark.skipif(kernel.sha256_hex_c is None, reason="the C kernel did not build here")
@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=3000))
def test_the_c_kernels_digest_is_hashlibs(body: bytes) -> None:
    assert kernel.sha256_hex_c is not None
    wanted = hashlib.sha256(body).hexdigest()
    assert kernel.sha256_hex_c(body) == wanted
    with digests(direct=False):
        assert kernel.sha256_hex_c(body) == wanted  # through hashlib


@pytest.mark.skipif(kernel.chained_c is None, reason="the C kernel did not build here")
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "hashlib"])
def test_the_c_kernels_common_line_keeps_the_line_as_read(direct: bool) -> None:
    # With the digest direct, a chained line's payload is the line as read (newline and
    # all: no copy without it); through hashlib, a copy without the newline. The same
    # entry, data and digest either way.
    assert kernel.chained_c is not None and kernel.direct_sha256_c is not None
    lines = sample_session(turns=2).to_bytes().splitlines(keepends=True)
    with digests(direct) as direct_now:
        prev = hashlib.sha256(lines[0][:-1]).hexdigest()
        for n, raw in enumerate(lines[1:], 2):
            entry = kernel.chained_c(raw, n, prev)
            assert entry is not None and entry.digest == hashlib.sha256(raw[:-1]).hexdigest()
            if type(entry) is LazyEntry:
                body = tuple.__getitem__(entry, 8).body
                assert body is raw if direct_now else body == raw[:-1]
            assert entry == reader.parse_entry_orjson(raw[:-1], n)[0]
            prev = entry.digest


@pytest.mark.skipif(kernel.chained_c is None, reason="the C kernel did not build here")
@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(EDITS, st.floats(0, 1), st.floats(0, 1)), max_size=4))
def test_a_session_reads_the_same_with_the_digest_direct_or_through_hashlib(
        edits: list[tuple[str, float, float]], monkeypatch: pytest.MonkeyPatch) -> None:
    assert kernel.direct_sha256_c is not None
    monkeypatch.setattr(reader, "_scan", kernel.scan_c)
    monkeypatch.setattr(reader, "_worth_it", kernel.worth_it_c)
    lines = edited(sample_session(turns=3).to_bytes(), edits)
    with digests(direct=True):
        direct = audited(lines)
    with digests(direct=False):
        assert audited(lines) == direct


DIGIT = st.sampled_from("0123456789")
TWO = st.text(DIGIT, min_size=2, max_size=2)


@pytest.mark.skipif(kernel.entry_c is None, reason="the C kernel did not build here")
@settings(max_examples=500, deadline=None)
@given(year=st.text(DIGIT, min_size=4, max_size=4) | st.sampled_from(
           ["0000", "0001", "1900", "2000", "2024", "2100", "9999"]),
       month=TWO | st.sampled_from(["00", "01", "02", "12", "13"]),
       day=TWO | st.sampled_from(["00", "28", "29", "30", "31", "32"]),
       hour=TWO | st.sampled_from(["00", "19", "23", "24"]),
       minute=TWO, second=TWO | st.sampled_from(["59", "60"]),
       fraction=st.sampled_from(["", ".1", ".12", ".123", ".1234", ".123456", ".1234567",
                                 ".123456789", ".1234567890", ".12a", "."]),
       zone=st.sampled_from(["Z", "z", "+00:00", "", "Z "]),
       seps=st.sampled_from(["-", "/", "T", ":", "٣"]))
def test_the_c_kernel_takes_the_timestamps_valid_ts_takes(
        year: str, month: str, day: str, hour: str, minute: str, second: str,
        fraction: str, zone: str, seps: str) -> None:
    for ts in (f"{year}-{month}-{day}T{hour}:{minute}:{second}{fraction}{zone}",
               f"{year}{seps}{month}-{day}T{hour}:{minute}:{second}{fraction}{zone}"):
        body = line({"kind": "turn_card", "card": {}}, ts=ts)
        assert (kernel.entry_c(body, 1) is not None) == reader.valid_ts(ts), ts


def test_lazy_entries_are_entries_for_every_later_stage() -> None:
    data = sample_session(turns=2).to_bytes()
    lazy = [e for e in read_ledger(io.BytesIO(data)) if isinstance(e, Entry)]
    assert lazy and all(type(e) is LazyEntry for e in lazy)
    plain = [reader.parse_entry_orjson(b.rstrip(b"\n"), i)[0]
             for i, b in enumerate(data.splitlines(keepends=True), 1)]
    assert lazy == plain
    for e, p in zip(lazy, plain, strict=True):
        assert e.data == p.data and e.message == p.message and e.meta == p.meta
        assert e.content == p.content and e.role == p.role
    # what a replay keeps and a task hands on survives pickling, payload and all
    import pickle
    assert pickle.loads(pickle.dumps(lazy)) == plain


def _first_key(obj: dict[str, Any]) -> dict[str, Any]:
    # A mapper for the lazy entries below: module level, so that their entries pickle.
    return {"first": next(iter(obj), None)}


@pytest.mark.skipif(kernel.lazy_c is None, reason="the C kernel did not build here")
@settings(max_examples=200, deadline=None)
@given(line=st.integers(1, 2**40), ident=st.text(max_size=8),
       parent=st.none() | st.text(max_size=8), kind=st.sampled_from(["message", "activity"]),
       ts=st.text(max_size=8), digest=st.sampled_from(["", "ab" * 32]),
       body=st.builds(orjson.dumps, st.dictionaries(
           st.text(max_size=4), st.integers(-(2**63), 2**63 - 1), max_size=3)),
       view=st.none() | st.just({"message": {"role": "user", "content": []}}),
       mapper=st.sampled_from([None, _first_key]))
def test_the_c_lazy_entry_is_the_python_one(
    line: int, ident: str, parent: str | None, kind: str, ts: str, digest: str, body: bytes,
    view: dict[str, Any] | None, mapper: Any,
) -> None:
    import pickle

    args = (line, ident, parent, kind, ts, digest, body, view, mapper)
    made, reference = reader.lazy_entry(*args), reader.lazy_entry_py(*args)
    assert reader.lazy_entry is kernel.lazy_c
    assert type(made) is type(reference) is LazyEntry
    assert tuple.__eq__(made[:8], reference[:8])  # the envelope, the payload apart
    payloads: list[Any] = [tuple.__getitem__(entry, 8) for entry in (made, reference)]
    assert all(type(p) is reader._Payload and p.body is body for p in payloads)
    assert audit_view(made) == audit_view(reference)
    assert made.data == reference.data and made == reference
    assert payloads[0].body is None  # parsed once, the bytes dropped
    assert pickle.loads(pickle.dumps(reader.lazy_entry(*args))) == reference
    assert reader.lazy_entry(*args[:8]) == reader.lazy_entry_py(*args[:8])
    with pytest.raises(TypeError):
        reader.lazy_entry(*args[:7])


# -- the C kernel's own edges (docs/audit.md, "The per-line kernel") -----------------------

needs_c = pytest.mark.skipif(kernel.scan_c is None, reason="the C kernel did not build here")


def c_scan(body: bytes) -> tuple[Any, ...] | None:
    assert kernel.scan_c is not None
    return kernel.scan_c(body)


def valid(text: bytes) -> bool:
    """The C kernel's grammar alone, on one JSON text."""
    from pipeline.ledger import _ckernel
    return _ckernel.valid(text)


def orjson_takes(text: bytes) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


# Every class of bad UTF-8, in a string and (a few) outside one: a stray continuation,
# overlong leads, overlong 3- and 4-byte forms, encoded surrogates, past U+10FFFF, cut
# sequences, bytes that never start one; and the valid edges next to each.
BAD_UTF8 = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf",
            b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf",
            b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xff", b"\xfe", b"\xc2", b"\xe2\x82",
            b"\xf0\x9f\x98", b"\xc2\x41", b"\xe2\x28\xa1"]
GOOD_UTF8 = [b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xee\x80\x80",
             b"\xef\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf0\x9f\x98\x80"]
NUMBERS = [b"0", b"-0", b"1", b"-1", b"0.5", b"1e5", b"1E+5", b"1e-5", b"-0.0e0", b"9" * 18,
           b"-" + b"9" * 18, b"1.7976931348623157e308", b"1e300", b"1e-300", b"0." + b"0" * 30,
           # refused by both: grammar, overflow
           b"01", b"-", b"+1", b".5", b"1.", b"1e", b"1e+", b"--1", b"0x1", b"1.e5", b"NaN",
           b"Infinity", b"-Infinity", b"1e400", b"1.8e308", b"1" + b"0" * 400,
           # taken by orjson, deferred by the kernel: past 64 bits, near the double's range
           b"9" * 19, b"18446744073709551616", b"-9223372036854775809", b"1e-400", b"1e301",
           b"1" * 30 + b".5", b"1e00001", b"0." + b"0" * 50 + b"1"]


@needs_c
@pytest.mark.parametrize("seq", BAD_UTF8 + GOOD_UTF8)
def test_every_class_of_utf8_is_read_as_orjson_reads_it(seq: bytes) -> None:
    body = line(USER).replace(b"hello", b"a" + seq + b"b")
    assert valid(b'"' + seq + b'"') == orjson_takes(b'"' + seq + b'"') == (seq in GOOD_UTF8)
    assert (c_scan(body) is not None) == (seq in GOOD_UTF8)
    same(body)
    outside = line(USER)[:-1] + b"," + seq + b"}"
    assert c_scan(outside) is None
    same(outside)


@needs_c
@pytest.mark.parametrize("number", NUMBERS)
def test_numbers_are_taken_only_where_orjson_reads_them_alike(number: bytes) -> None:
    if valid(b"[" + number + b"]"):
        assert orjson_takes(b"[" + number + b"]")
    body = line(USER)[:-1] + b',"n":' + number + b"}"
    same(body)


@needs_c
def test_nesting_is_deferred_past_the_kernels_depth() -> None:
    from pipeline.ledger import _ckernel
    limit = _ckernel.MAX_DEPTH
    for depth in (limit - 2, limit - 1, limit, limit + 1, 5000):
        body = line(USER)[:-1] + b',"d":' + b"[" * depth + b"]" * depth + b"}"
        # the line is one level, so `depth` arrays inside it reach depth + 1
        assert (c_scan(body) is not None) == (depth + 1 <= limit)
        same(body)
    assert not valid(b"[" * 100_000)  # no recursion past the limit, however deep


@needs_c
@pytest.mark.parametrize("text", [
    b'"a\x00b"', b'"\x1f"', b'"\x7f"', b'"\\u0000"', b'"\\ud83d\\ude00"', b'"\\ud83d"',
    b'"\\ude00"', b'"\\ud83d\\u0041"', b'"\\ud83d\\ud83d"', b'"\\x41"', b'"\\u00g1"',
    b'"\\u004"', b'"\\/\\b\\f\\n\\r\\t\\"\\\\"', b'"\\', b'"abc', b"\x00", b"[1,]",
    b'{"a":1,}', b"[1 2]", b'{"a" 1}', b'{"a":1 "b":2}', b"tru", b"nul", b"[true,false,null]",
    b" [1] ", b"[\t1\r\n]", b"[1]x", b"{}{}", b"[\x0c1]", b'{"a":{"b":[{}]}}', b""])
def test_the_grammar_takes_only_what_orjson_takes(text: bytes) -> None:
    if valid(text):
        assert orjson_takes(text)


@needs_c
@pytest.mark.parametrize("where", ["id", "parent_id", "kind", "ts", "prev_hash", "at_turn"])
def test_escapes_in_envelope_strings_are_left_to_orjson(where: str) -> None:
    body = line(USER).replace(f'"{where}":"'.encode(), f'"{where}":"\\u0030'.encode())
    assert c_scan(body) is None
    same(body)
    same(line(USER).replace(b'"role":"user"', b'"role":"\\u0075ser"'))
    same(line(USER).replace(b'"type":"text"', b'"type":"te\\u0078t"'))
    same(line(USER).replace(b"hello", b'he\\"l\\\\lo\\n\\u00e9'))  # payload escapes: fine
    assert c_scan(line(USER).replace(b"hello", b"\\u00e9")) is not None


@needs_c
def test_huge_lines_and_many_keys() -> None:
    text = "é€😀x" * (1 << 18)  # over 2 MiB of multi-byte text
    for body in (line(USER).replace(b"hello", text.encode()),
                 line(ASSISTANT).replace(b"done", text.encode()),
                 line(USER).replace(b"hello", text.encode() + b"\xff"),
                 line(USER).replace(b"hello", text.encode()[:-1])):
        assert len(body) > 1 << 20
        same(body)
    many = line(USER)[:-1] + b"".join(b',"k%d":%d' % (i, i) for i in range(200)) + b"}"
    assert c_scan(many) is None  # keys past what it compares
    same(many)
    blocks = {"kind": "message", "message": {"role": "user", "content": [
        {"type": "text", "text": str(i)} for i in range(1000)]}}
    found = c_scan(line(blocks))
    assert found is not None and len(found[6]["message"]["content"]) == 1000
    same(line(blocks))


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                               max_size=4),
    max_leaves=20), st.booleans(), st.integers(0, 10_000), st.binary(max_size=4))
def test_the_grammar_never_takes_what_orjson_refuses(value: Any, ascii_only: bool, at: int,
                                                     junk: bytes) -> None:
    # the standard library writes big integers, escapes (surrogate pairs too) and
    # Infinity, which orjson's writer refuses to
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert not valid(text) or orjson_takes(text)
    at %= len(text) + 1
    damaged = text[:at] + junk + text[at:]
    assert not valid(damaged) or orjson_takes(damaged)


@needs_c
def test_the_c_kernel_leaves_receipts_and_headers_to_its_other_readers() -> None:
    # Not scanned: entry() reads a receipt into its node info, a header into the fields
    # the audit reads (the tests below).
    assert kernel.worth_it_c is not None
    for payload, wanted in ((USER, True), (ASSISTANT, True), ({"kind": "turn_card"}, True),
                            ({"kind": "receipt", "call": {}}, False),
                            ({"kind": "header", "session_id": "s"}, False)):
        body = line(payload)
        assert kernel.worth_it_c(body) is wanted
        # the simdjson kernel's guess on the same line, past its size thresholds
        assert kernel.worth_it_simdjson(body + b" " * 8192) is wanted
    for body in (b"", b'"kind":"', b'"kind":"receipt', b'{"kind":"header"}', b"x" * 600):
        assert kernel.worth_it_c(body) is (b'receipt"' not in body and b'header"' not in body)


RECEIPT = {"kind": "receipt", "purpose": "execute", "winning_attempt": 0, "attempts": [
    {"ordinal": 0, "settlement": "ok", "usage": {"input_tokens": 3, "output_tokens": 1}}]}
HEADER = {"kind": "header", "session_id": "s", "contract": {"model": "m"}}
#: An envelope field's values the orjson reader takes or refuses (``...``: absent).
FIELD_VALUES: list[Any] = ["x", "", None, 5, 1.5, True, [], {}, ..., "2026-11-07T01:10:56Z",
                "2026-02-30T01:10:56Z", "2026-11-07T01:10:56.975281879Z", "\u0663"]


def enveloped(payload: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``payload`` in the test envelope with ``values`` set (``...``: the field removed)."""
    env = {**ENVELOPE, **payload}
    for name, value in values.items():
        if value is ...:
            env.pop(name, None)
        else:
            env[name] = value
    return env


@needs_c
@pytest.mark.parametrize("payload", [RECEIPT, HEADER], ids=["receipt", "header"])
def test_the_c_kernel_reads_receipts_and_headers_as_orjson_does(payload: dict[str, Any]) -> None:
    # Read in C into what the audit reads of them (a receipt's info, a header's five
    # fields: a lazy entry, equal to orjson's), or by orjson called from C (the orjson
    # reader's own entry, an eager one); either is None where that reader would go on
    # to its other paths (then it reads the line itself).
    assert kernel.entry_c is not None
    body = line(payload)
    whole = kernel.entry_c(body, 3)
    assert whole == reader.parse_entry_orjson(body, 3)[0]
    assert whole.data == {**ENVELOPE, **payload}
    assert type(whole) is LazyEntry  # read in C, what the audit reads of it kept
    assert_kept_as_read(whole, reader.parse_entry_orjson(body, 3)[0])
    for name in ("id", "parent_id", "kind", "ts", "prev_hash", "at_turn"):
        for value in FIELD_VALUES:
            env = enveloped(payload, {name: value})
            damaged = dumps(env)
            whole, want = kernel.entry_c(damaged, 3), reader.parse_entry_orjson(damaged, 3)
            if whole is not None:
                assert (whole, False, "") == want
            assert parse_entry(damaged, 3) == want
    for damaged in (body[:-1], body + b" x", body[:-1] + b',"attempts":NaN}', b"[]",
                    body[:-1] + b',"kind":{"type":"x"}}', b"\xef\xbb\xbf" + body,
                    body.replace(b'"01a1b38f', b'"\xff01a1b38f')):
        assert kernel.entry_c(damaged, 3) is None  # orjson refuses it, or vak's work quirk
        assert parse_entry(damaged, 3) == reader.parse_entry_orjson(damaged, 3)
    repeated = body.replace(b'"kind":', b'"kind":"receipt","kind":', 1)  # orjson: the last
    assert (kernel.entry_c(repeated, 3), False, "") == reader.parse_entry_orjson(repeated, 3)


@needs_c
@settings(max_examples=300, deadline=None)
@given(values=st.dictionaries(st.sampled_from(["id", "parent_id", "kind", "ts", "prev_hash",
                                                "at_turn"]),
                              st.sampled_from(FIELD_VALUES), max_size=3),
       payload=st.sampled_from([RECEIPT, HEADER]))
def test_receipts_and_headers_with_any_envelope_read_as_orjson_reads_them(
        values: dict[str, Any], payload: dict[str, Any]) -> None:
    body = dumps(enveloped(payload, values))
    assert kernel.entry_c is not None
    whole, want = kernel.entry_c(body, 9), reader.parse_entry_orjson(body, 9)
    assert whole is None or (whole, False, "") == want
    assert parse_entry(body, 9) == want


#: Values a receipt's fields may hold (``...``: absent): what vak writes, and every type
#: and edge the audit's info refuses or reads otherwise (19 digits: past the grammar).
_ANY = st.sampled_from([None, ..., "x", "", "é", 1.5, True, False, [], {}, -1, 0, 1, 2,
                        10**17, 10**19])
_COUNT = st.one_of(st.sampled_from([None, ..., 0, 3, 10**17, -1, 1.5, True, "3", []]),
                   st.integers(min_value=0, max_value=10**12))
_USAGE = st.one_of(_ANY, st.fixed_dictionaries({}, optional={
    "input_tokens": _COUNT, "output_tokens": _COUNT, "cache_read_input_tokens": _COUNT,
    "cache_creation_input_tokens": _COUNT, "extra": _ANY}))
_ORDINAL = st.one_of(_ANY, st.integers(min_value=-2, max_value=4))
_NAME = st.sampled_from([None, ..., "ok", "failed", "anthropic", "é", 3, {}])
_ATTEMPT = st.one_of(_ANY, st.fixed_dictionaries({}, optional={
    "ordinal": _ORDINAL, "settlement": _NAME, "usage": _USAGE, "provider": _NAME,
    "model": _NAME, "reason": _ANY, "latency_ms": _ANY}))
#: An attempt as vak writes it.
_VAK_ATTEMPT = st.fixed_dictionaries({
    "ordinal": st.integers(min_value=0, max_value=3),
    "settlement": st.sampled_from(["ok", "failed", "cancelled"])}, optional={
    "usage": st.fixed_dictionaries({}, optional={
        k: st.integers(min_value=0, max_value=2**40) for k in (
            "input_tokens", "output_tokens", "cache_read_input_tokens",
            "cache_creation_input_tokens")}),
    "provider": st.sampled_from(["anthropic", "openai"]), "model": st.just("m"),
    "reason": st.just("retry"), "error": st.just("connection reset by peer")})


def read_alike(payload: dict[str, Any], edit: tuple[str, str] | None,
               audit: Callable[[Entry, list[Any]], Any],
               reference: Callable[[Entry, list[Any]], Any]) -> None:
    """``payload`` in the test envelope, ``edit`` made once in its JSON text: the C
    kernel's entry is none or the orjson reader's, and ``audit`` of it (the audit's
    reading) gives what ``reference`` gives of the parsed line, findings included."""
    text = dumps({**ENVELOPE, **payload}).decode()
    if edit is not None:
        text = text.replace(*edit, 1)
    body = text.encode()
    assert kernel.entry_c is not None
    whole, want = kernel.entry_c(body, 4), reader.parse_entry_orjson(body, 4)
    assert parse_entry(body, 4) == want
    event("not an entry" if whole is None else type(whole).__name__)
    if whole is None:
        return
    assert (whole, False, "") == want
    got_bad: list[Any] = []
    ref_bad: list[Any] = []
    assert audit(whole, got_bad) == reference(want[0], ref_bad)
    assert got_bad == ref_bad
    if type(whole) is LazyEntry:
        assert_kept_as_read(whole, want[0])


def _present(obj: Any) -> Any:
    """``obj`` without its ``...`` (absent) values, recursively."""
    if isinstance(obj, dict):
        return {k: _present(v) for k, v in obj.items() if v is not ...}
    if isinstance(obj, list):
        return [_present(v) for v in obj if v is not ...]
    return obj


@needs_c
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attempts=st.one_of(st.lists(_VAK_ATTEMPT, max_size=18), _ANY,
                         st.lists(st.one_of(_VAK_ATTEMPT, _ATTEMPT), max_size=18)),
       winning=st.one_of(st.integers(min_value=0, max_value=3), _ORDINAL),
       names=st.fixed_dictionaries({}, optional={"provider": _NAME, "model": _NAME,
                                                 "purpose": _NAME}),
       edit=st.sampled_from([None, ("\"ok\"", "\"o\\u006b\""),
                             ("\"usage\":", "\"usage\":null,\"usage\":"),
                             ("\"ordinal\":", "\"ordinal\":7,\"ordinal\":"),
                             ("\"input_tokens\":", "\"input_tokens\":1,\"input_tokens\":"),
                             ("\"attempts\":", "\"attempts\":[],\"attempts\":"),
                             ("\"anthropic\"", "\"anthr\\u006fpic\""),
                             ("\"settlement\"", "\"sett\\u006cement\"")]))
def test_a_receipt_of_any_shape_gets_the_audits_info_of_the_whole_line(
        attempts: Any, winning: Any, names: dict[str, Any], edit: tuple[str, str] | None) -> None:
    # The C kernel's receipt (read without orjson, its view the audit's info) is the
    # orjson reader's entry, and its info and findings are the ones the audit makes of
    # the parsed line; anything it does not take is orjson's entry, as before.
    read_alike(_present({"kind": "receipt", **names, "winning_attempt": winning,
                         "attempts": attempts}), edit, _info, _node_info)


_TEXT = st.sampled_from([None, ..., "s", "", "/home/lin/é", 3, 1.5, True, [], {"a": 1}])


@needs_c
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.fixed_dictionaries({}, optional={"session_id": _TEXT, "cwd": _TEXT}),
       contract=st.one_of(_TEXT, st.fixed_dictionaries({}, optional={
           "model": _TEXT, "provider": _TEXT, "app_version": _TEXT,
           "system_prompt": st.text(max_size=40), "tools": st.lists(_ANY, max_size=3)})),
       edit=st.sampled_from([None, ("\"model\":", "\"model\":\"x\",\"model\":"),
                             ("\"cwd\":", "\"cwd\":\"x\",\"cwd\":"),
                             ("\"s\"", "\"\\u0073\""),
                             ("\"contract\":", "\"contract\":null,\"contract\":"),
                             ("\"provider\"", "\"pr\\u006fvider\"")]))
def test_a_header_of_any_shape_gives_the_audit_the_fields_of_the_whole_line(
        fields: dict[str, Any], contract: Any, edit: tuple[str, str] | None) -> None:
    # The C kernel's header (read without orjson, its view the five fields the audit
    # reads) is the orjson reader's entry, and those fields and their findings are the
    # ones the audit reads from the parsed line; anything it does not take is orjson's.
    read_alike(_present({"kind": "header", **fields, "contract": contract}), edit,
               _header_fields, _header_fields)


@pytest.mark.parametrize("forced", ["", "c", "simdjson", "orjson", "nonsense"])
def test_vakpipe_kernel_chooses_the_kernel(forced: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from pipeline.ledger import kernel, reader; "
         "print(kernel.IMPLEMENTATION, reader._scan is kernel.scan, "
         "reader._worth_it is kernel.worth_it)"],
        env={**os.environ, "VAKPIPE_KERNEL": forced},
        capture_output=True, text=True, check=True).stdout.split()
    default = "c" if kernel.scan_c is not None else "simdjson"
    assert out == [forced if forced in ("simdjson", "orjson") else default, "True", "True"]


_AUDIT_EVERY_SESSION = """
import json, sys
from pipeline.io.storage import enumerate_sessions, resolve
from pipeline.run.batches import audit_object
out = []
for folder in sys.argv[1:]:
    root = resolve(folder)
    for obj in enumerate_sessions(root).sessions:
        audit = audit_object(root, obj)
        out.append([audit.row, [(f.code, f.line, f.entry_id) for f in audit.findings],
                    audit.usage])
print(json.dumps(out, sort_keys=True, default=str))
"""


def test_without_the_c_extension_every_session_audits_alike() -> None:
    # A machine without a compiler: `pip install` goes on without the extension, and its
    # import fails as an unbuilt one does. The kernel is then pysimdjson's, the lazy
    # entries the Python ones, and every audit the same as with the extension.
    folders = [str(REAL / "claude-code"), str(REAL / "codex"), str(CONFORMANCE / "corpus")]
    blocked = ("import sys; sys.modules['pipeline.ledger._ckernel'] = None\n"
               "from pipeline.ledger import kernel, reader\n"
               "assert kernel.IMPLEMENTATION == 'simdjson' and kernel.entry_c is None\n"
               "assert reader.lazy_entry is reader.lazy_entry_py\n")
    runs = [subprocess.run([sys.executable, "-c", prelude + _AUDIT_EVERY_SESSION, *folders],
                           env={**os.environ, "VAKPIPE_KERNEL": ""}, capture_output=True,
                           text=True, check=True).stdout
            for prelude in (blocked, "")]
    without, with_c = (json.loads(out) for out in runs)
    assert len(without) > 20 and without == with_c


def python_work_quirk(body: bytes) -> bool:
    """reader._work_quirk's own answer, with the C kernel's left out."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader, "_work_quirk_c", None)
        return reader._work_quirk(body)


#: Members of a top-level object around vak's work quirk: the kinds (plain, escaped,
#: objects, other values), an escaped key that reads "kind", and other keys.
KIND_MEMBERS = st.lists(st.one_of(
    st.sampled_from([b'"kind":"work"', b'"kind":"w\\u006frk"', b'"kind":"message"',
                     b'"kind":{"kind":"contract_status_changed","to":"active"}',
                     b'"kind":{}', b'"kind":null', b'"kind":["work"]', b'"\\u006bind":"work"',
                     b'"\\u006bind":{"a":1}', b'"kind" : "work"']),
    st.tuples(st.sampled_from(["id", "ts", "contract_id", "revision", "x"]), JSON).map(
        lambda kv: json.dumps(kv[0]).encode() + b":" + json.dumps(kv[1]).encode())),
    max_size=6)


@pytest.mark.skipif(kernel.work_quirk_c is None, reason="the C kernel did not build here")
@settings(max_examples=300, deadline=None)
@given(members=KIND_MEMBERS, pad=st.sampled_from([b"", b" ", b"\n"]))
def test_the_c_kernel_tells_the_work_quirk_as_the_pairs_hook_does(
        members: list[bytes], pad: bytes) -> None:
    body = pad + b"{" + b",".join(members) + b"}" + pad
    assert kernel.work_quirk_c is not None
    told = kernel.work_quirk_c(body)
    event("told in C" if told is not None else "left to Python")
    if told is not None:
        assert told == python_work_quirk(body)


@pytest.mark.skipif(kernel.work_quirk_c is None, reason="the C kernel did not build here")
def test_the_c_kernel_tells_vaks_own_work_lines() -> None:
    builder = LedgerBuilder()
    builder.header()
    builder.work()
    (work,) = [b for b in builder.bodies() if b"contract_id" in b]
    assert kernel.work_quirk_c is not None and kernel.work_quirk_c(work) is True
    assert python_work_quirk(work) is True
    for body, quirk in [(b'{"kind":"message","kind":{}}', False),
                        (b'{"kind":"work","kind":"work"}', False),
                        (b'{"kind":"work","kind":{},"kind":{}}', False),
                        (b'{"kind":{},"kind":"work"}', False),
                        (b'{"kind":"work"}', False)]:
        assert kernel.work_quirk_c(body) is quirk is python_work_quirk(body)
