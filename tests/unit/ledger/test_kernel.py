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

import io
from typing import Any

import orjson
import pytest
import simdjson
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeline.audit.session import audit_session
from pipeline.ledger import kernel, reader
from pipeline.ledger.entry import starts_turn
from pipeline.ledger.reader import Entry, LazyEntry, audit_view, parse_entry, read_ledger
from tests.helpers.ledgers import dumps, sample_session, session_key

ENVELOPE = {"id": "01a1b38f-04cf-78f0-8a1f-9bc406bc3226",
            "parent_id": "01a1b38e-9caa-79f6-b93e-fc0a81576b6c",
            "ts": "2026-11-07T01:10:56.975281879Z",
            "prev_hash": "7c4c4aeace9e62e322c470c953d379e8b714a3d312b66837035165b2d7f8ac57",
            "at_turn": "01a1b38e-2dff-7bae-a49e-1ab2490052be"}


@pytest.fixture(autouse=True)
def kernel_on_every_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel reads every line here, short ones included (in a run, only long ones)."""
    monkeypatch.setattr(reader, "_worth_it", lambda body: True)


def same(body: bytes) -> None:
    """The kernel's reading of ``body`` is the orjson reader's, in every respect."""
    got = parse_entry(body, 7)
    want = reader.parse_entry_orjson(body, 7)
    assert got[1:] == want[1:]
    assert (got[0] is None) == (want[0] is None)
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
    assert kernel.scan(big) is None and parse_entry(big, 1)[0] is not None
    bom = b"\xef\xbb\xbf" + line(USER)
    assert parser.parse(bom) is not None  # simdjson skips a byte order mark
    assert kernel.scan(bom) is None and parse_entry(bom, 1)[0] is None  # orjson refuses it


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
