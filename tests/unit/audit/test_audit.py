"""Unit tests of pipeline.audit.session: the session row, header checks, vak's sample ledger."""

from __future__ import annotations

import copy
import gc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import pipeline.audit.session as session_module
from pipeline.audit.session import (
    _DIRECTIVE,
    _figures,
    _figures_row,
    _node_info,
    _Receipt,
    _Request,
    _transcript_info_py,
    _usage_rows,
    audit_session,
    verdict,
)
from pipeline.formats import detect
from pipeline.ledger import kernel
from pipeline.ledger.entry import USAGE_KEYS, ZERO_USAGE, ts_nanos, usage_of
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import Entry, LineStats, parse_entry, parse_entry_orjson
from pipeline.ledger.tree import Node
from pipeline.ledger.types import MAX_TOKEN_COUNT, Code, Finding, Severity, Status, token_count
from tests.helpers.data_paths import REAL, SPEC
from tests.helpers.ledgers import (
    BASE_SECONDS,
    TS_STEP_NS,
    LedgerBuilder,
    attempt,
    audit_bytes,
    codes,
    dumps,
    sample_session,
    sha,
    split_lines,
    usage,
)

EXAMPLE: Path = SPEC / "example-ledger.jsonl"
EXAMPLE_PATH = "agents/vak/sessions/2d872b17b24e117e/0199a1f2-5f00-7000-8000-00000000abcd.jsonl"


def ts_of(n: int) -> int:
    """Nanoseconds of the n-th entry the builder wrote."""
    return BASE_SECONDS * 1_000_000_000 + n * TS_STEP_NS


def figures_session() -> tuple[LedgerBuilder, dict[str, str]]:
    """A session with retries, a receipt fallback, a control nudge and an abandoned branch.

    h u1 a1 r1 tr1 a2 r2 | u2 a3 r3 (abandoned) | branch at r2: ctl u3 a4 r4 (head)
    """
    b = LedgerBuilder()
    n: dict[str, str] = {}
    n["h"] = b.header()
    n["u1"] = b.user("first question")
    n["a1"] = b.assistant("looking", tools=["c1"], u=usage(100, 10, 5, 3))
    n["r1"] = b.receipt([
        attempt(0, "failed", usage(50, 0), domain="provider"),
        attempt(1, "ok", usage(100, 10, 5, 3), reason="retry"),
    ], winning=1, parent=n["a1"])
    n["tr1"] = b.tool_results("c1")
    n["a2"] = b.assistant("answer")  # no meta.usage: its receipt stands in
    n["r2"] = b.receipt([attempt(0, "ok", usage(200, 20, 0, 7))], winning=0, parent=n["a2"])
    n["u2"] = b.user("abandoned question")
    n["a3"] = b.assistant("abandoned answer", u=usage(7, 1))
    n["r3"] = b.receipt([attempt(0, "ok", usage(7, 1))], winning=0, parent=n["a3"])
    b.branch_at(n["r2"])
    n["ctl"] = b.control()
    n["u3"] = b.user("second question")
    n["a4"] = b.assistant("second answer", u=usage(300, 30, 100, 0))
    n["r4"] = b.receipt([
        attempt(0, "cancelled"),
        attempt(1, "ok", usage(310, 31, 100, 0), reason="route_fallback"),
    ], winning=1, parent=n["a4"])
    return b, n


def test_session_row_figures() -> None:
    b, n = figures_session()
    data = b.to_bytes()
    audit = audit_bytes(data)
    assert audit.findings == []
    row = audit.row
    assert row["session_path"] == EXAMPLE_PATH
    assert row["agent"] == "vak" and row["cwd_hash"] == "2d872b17b24e117e"
    assert row["session_id"] == "0199a1f2-5f00-7000-8000-00000000abcd"
    assert row["model"] == "gemma4:e2b-mlx" and row["provider"] == "ollama"
    assert row["app_version"] == "3.5.0"
    assert row["status"] == "ok"
    assert (row["errors"], row["warnings"], row["infos"]) == (0, 0, 0)
    assert row["lines"] == row["entries"] == 14
    assert row["bytes"] == len(data)
    assert row["active_chain_len"] == 11 and row["abandoned_entries"] == 3
    # turns: directives on the active chain (u1, u3; not the control nudge, not u2)
    assert row["turns"] == 2
    # requests: assistant messages (a1, a2, a4 active; a3 abandoned)
    assert row["requests"] == 3 and row["requests_abandoned"] == 1
    # active usage: meta.usage of a1 and a4 (a4's own usage wins over its receipt's),
    # the winning attempt of r2 for a2 which has none
    assert (row["input_tokens"], row["output_tokens"], row["cache_read_tokens"],
            row["cache_write_tokens"]) == (100 + 200 + 300, 10 + 20 + 30, 5 + 100, 3 + 7)
    assert (row["input_tokens_abandoned"], row["output_tokens_abandoned"],
            row["cache_read_tokens_abandoned"],
            row["cache_write_tokens_abandoned"]) == (7, 1, 0, 0)
    # billed: every attempt of every receipt that reported usage, failed retries and
    # abandoned branches included
    assert (row["billed_input_tokens"], row["billed_output_tokens"],
            row["billed_cache_read_tokens"], row["billed_cache_write_tokens"]) == (
        50 + 100 + 200 + 7 + 310, 0 + 10 + 20 + 1 + 31, 5 + 100, 3 + 7)
    assert row["receipt_attempts"] == 6 and row["receipt_failed_attempts"] == 2
    assert row["first_ts"] == ts_of(1) and row["last_ts"] == ts_of(14)
    assert row["head_id"] == n["r4"]
    assert row["head_hash"] == sha(b.lines[-1].data)


def test_active_chain_is_the_heads_path_in_file_order() -> None:
    b, n = figures_session()
    audit = audit_bytes(b.to_bytes())
    on_chain = ["h", "u1", "a1", "r1", "tr1", "a2", "r2", "ctl", "u3", "a4", "r4"]
    lines = {ident: number for number, ident in enumerate(n.values(), 1)}
    assert audit.chain_ids == tuple(n[k] for k in on_chain)
    assert audit.chain_lines == tuple(lines[n[k]] for k in on_chain)
    # the set the replay asks for, made from the same pairs (and once)
    assert audit.active == {(lines[n[k]], n[k]) for k in on_chain}
    assert audit.active is audit.active


def test_receipt_fallback_needs_a_winning_attempt() -> None:
    b = LedgerBuilder()
    b.header()
    b.user("q")
    a = b.assistant("a")
    b.receipt([attempt(0, "failed", usage(40, 0))], parent=a)  # no winner
    row = audit_bytes(b.to_bytes()).row
    assert row["requests"] == 1 and row["input_tokens"] == 0
    assert row["billed_input_tokens"] == 40 and row["receipt_failed_attempts"] == 1


def test_receipt_not_following_an_assistant_message_is_only_billed() -> None:
    b = LedgerBuilder()
    b.header()
    u = b.user("q")
    b.assistant("a")
    b.receipt([attempt(0, "ok", usage(40, 4))], winning=0, parent=u)
    row = audit_bytes(b.to_bytes()).row
    assert row["input_tokens"] == 0 and row["billed_input_tokens"] == 40


def test_an_audit_leaves_no_reference_cycles() -> None:
    # A worker reads each object with the cyclic collector paused (docs/scaling.md):
    # what the audit built must go with reference counts, receipts and their messages
    # (retries, a fallback, an abandoned branch, a receipt on a user message) included.
    # Only the audit's own objects are looked for among what the collector finds:
    # other threads of the test process (a cluster's, a server's) may leave cycles.
    b, _ = figures_session()
    data = b.to_bytes()
    audit_bytes(data)  # imports and caches of a first audit, once
    gc.collect()
    gc.disable()
    debug = gc.get_debug()
    gc.set_debug(debug | gc.DEBUG_SAVEALL)  # what it finds is kept in gc.garbage
    try:
        audit = audit_bytes(data)
        assert audit.usage
        del audit
        gc.collect()
        assert not [o for o in gc.garbage if type(o) in (Node, _Request, _Receipt)]
    finally:
        gc.set_debug(debug)
        gc.garbage.clear()
        gc.enable()


_ABSENT: Any = object()
COUNT = (st.integers(0, MAX_TOKEN_COUNT) | st.integers() | st.booleans() | st.floats()
         | st.text(max_size=3) | st.none() | st.just(_ABSENT))


@given(counts=st.tuples(COUNT, COUNT, COUNT, COUNT),
       other=st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
def test_a_usage_is_read_count_by_count(counts: tuple[Any, ...], other: dict[str, Any]) -> None:
    # The rule, count by count: absent or null is 0, a token count is itself, anything
    # else (a bool, a float, a string, out of range) makes the whole usage unreadable.
    obj = {**other, **{k: v for k, v in zip(USAGE_KEYS, counts, strict=True)
                       if v is not _ABSENT}}
    read = [0 if v is None or v is _ABSENT else token_count(v) for v in counts]
    want = None if None in read else tuple(read)
    assert usage_of(obj) == want


def test_malformed_usage_is_ignored() -> None:
    assert usage_of({"input_tokens": 1, "output_tokens": 2}) == (1, 2, 0, 0)
    assert usage_of({"input_tokens": 1, "output_tokens": 2, "cache_read_input_tokens": None,
                     "cache_creation_input_tokens": 4}) == (1, 2, 0, 4)
    bads: list[Any] = [None, [], {"input_tokens": "1"}, {"input_tokens": -1},
                       {"input_tokens": True}, {"input_tokens": 1.5}]
    for bad in bads:
        assert usage_of(bad) is None
    b = LedgerBuilder()
    b.header()
    b.user("q")
    malformed: dict[str, Any] = {"input_tokens": "many", "output_tokens": 1}
    b.assistant("a", u=malformed)
    row = audit_bytes(b.to_bytes()).row
    assert row["requests"] == 1 and row["input_tokens"] == 0 and row["output_tokens"] == 0


@pytest.mark.parametrize(
    ("ts", "ns"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("2026-09-21T14:13:20Z", BASE_SECONDS * 10**9),
        ("2026-09-21T14:13:20.123Z", BASE_SECONDS * 10**9 + 123_000_000),
        ("2026-09-21T14:13:20.123456Z", BASE_SECONDS * 10**9 + 123_456_000),
        ("2026-09-21T14:13:20.123456789Z", BASE_SECONDS * 10**9 + 123_456_789),
        ("2026-09-21T14:13:20.000000001Z", BASE_SECONDS * 10**9 + 1),
        (None, None),
        ("", None),
    ],
)
def test_ts_nanos(ts: str | None, ns: int | None) -> None:
    assert ts_nanos(ts) == ns


def test_status_ok_with_info_only() -> None:
    b = sample_session(turns=1)
    b.work()
    audit = audit_bytes(b.to_bytes())
    assert codes(audit.findings) == {(len(b.lines), "duplicate_kind_key")}
    assert audit.row["status"] == "ok"
    assert (audit.row["errors"], audit.row["warnings"], audit.row["infos"]) == (0, 0, 1)


def test_status_warning() -> None:
    b = sample_session(turns=1)
    b.chained = False
    b.user("legacy")
    b.raw(b'{"id":', newline=False)
    audit = audit_bytes(b.to_bytes())
    n = len(b.lines)
    assert codes(audit.findings) == {(n - 1, "unchained"), (n, "torn_tail")}
    assert audit.row["status"] == "warning"
    assert (audit.row["errors"], audit.row["warnings"], audit.row["infos"]) == (0, 2, 0)
    assert audit.row["lines"] == n and audit.row["entries"] == n - 1
    assert audit.row["head_hash"] == sha(b.lines[-2].data)


def test_status_error() -> None:
    b = sample_session(turns=1)
    lines = b.physical()
    lines[1] = lines[1].replace(b"weather", b"WEATHER")
    key = parse_session_path(EXAMPLE_PATH)
    assert key is not None
    audit = audit_session(key, lines)
    assert codes(audit.findings) == {(3, "hash_mismatch")}
    assert audit.row["status"] == "error"
    assert (audit.row["errors"], audit.row["warnings"], audit.row["infos"]) == (1, 0, 0)


def test_findings_come_in_line_order() -> None:
    b = LedgerBuilder()
    b.raw(b"junk")
    b.user("a", parent="nowhere")
    b.raw(b"junk")
    audit = audit_bytes(b.to_bytes())
    lines = [f.line for f in audit.findings]
    assert lines[0] is None  # missing_header first
    assert lines[1:] == sorted(line or 0 for line in lines[1:])


def test_size_overrides_counted_bytes() -> None:
    b = sample_session(turns=1)
    key = parse_session_path(EXAMPLE_PATH)
    assert key is not None
    audit = audit_session(key, b.physical(), size=12345)
    assert audit.row["bytes"] == 12345


def test_empty_ledger() -> None:
    audit = audit_bytes(b"")
    assert codes(audit.findings) == {(None, "missing_header")}
    assert audit.row["entries"] == 0 and audit.row["lines"] == 0
    assert audit.row["head_id"] is None and audit.row["head_hash"] is None
    assert audit.row["first_ts"] is None and audit.row["last_ts"] is None


# -- header checks -------------------------------------------------------------------


def test_cwd_hash_and_session_id_mismatch_on_the_header_line() -> None:
    b = sample_session(turns=1)
    key = parse_session_path("agents/vak/sessions/0123456789abcdef/not-the-id.jsonl")
    assert key is not None
    audit = audit_session(key, b.physical())
    assert codes(audit.findings) == {(1, "cwd_hash_mismatch"), (1, "session_id_mismatch")}
    assert audit.row["status"] == "warning"
    assert audit.row["cwd_hash"] == "0123456789abcdef"
    assert audit.row["session_id"] == "0199a1f2-5f00-7000-8000-00000000abcd"


def test_header_checks_carry_the_header_line_when_it_is_not_line_1() -> None:
    b = LedgerBuilder()
    b.raw(b"torn before the header")
    b.header()
    b.user("q")
    key = parse_session_path("agents/vak/sessions/0123456789abcdef/not-the-id.jsonl")
    assert key is not None
    audit = audit_session(key, b.physical())
    assert codes(audit.findings) == {
        (1, "damaged_entry"), (2, "cwd_hash_mismatch"), (2, "session_id_mismatch")}


def test_second_header_is_not_checked_against_the_path() -> None:
    b = sample_session(turns=1)
    b.header(session_id="other", cwd="/elsewhere")
    audit = audit_bytes(b.to_bytes())
    assert codes(audit.findings) == {(len(b.lines), "second_header")}


def test_header_without_cwd_or_session_id() -> None:
    b = LedgerBuilder()
    b.entry("header", {"created_at": "2026-09-21T14:13:20Z", "cwd": 7}, parent=None)
    audit = audit_bytes(b.to_bytes())
    assert codes(audit.findings) == {(1, "cwd_hash_mismatch"), (1, "session_id_mismatch")}
    assert audit.row["session_id"] is None and audit.row["model"] is None


# -- vak's own sample ----------------------------------------------------------------


def test_example_ledger_audits_clean() -> None:
    key = parse_session_path(EXAMPLE_PATH)
    assert key is not None
    data = EXAMPLE.read_bytes()
    with EXAMPLE.open("rb") as f:
        audit = audit_session(key, f)
    assert [(f.line, f.code) for f in audit.findings] == [(17, Code.DUPLICATE_KIND_KEY)]
    row = audit.row
    assert row["status"] == "ok"
    assert row["entries"] == row["lines"] == row["active_chain_len"] == 22
    assert row["bytes"] == len(data)
    assert row["head_id"] == "0199a1f2-6a00-7000-8000-000000000016"
    assert row["head_hash"] == sha(split_lines(data)[-1].rstrip(b"\n"))
    assert row["turns"] == 1 and row["requests"] == 2
    assert row["input_tokens"] == 812 and row["output_tokens"] == 41
    assert row["billed_input_tokens"] == 812 and row["receipt_attempts"] == 1
    assert row["first_ts"] == ts_nanos("2026-09-21T14:13:20.123456789Z")
    assert row["last_ts"] == ts_nanos("2026-09-21T14:13:22.716049358Z")


# The node info of an entry, made in C for the common ones (kernel.node_info_c): the same
# info and findings as _node_info on any payload a vak line can carry where the audit
# reads it. JSON values of every type at every field the info reads, and the values vak
# writes there, more often.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=6)
_JSON_COUNT = (st.integers(0, MAX_TOKEN_COUNT) | st.integers() | st.booleans() | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=3) | st.none() | st.just(_ABSENT))
_NAME = st.sampled_from(["ok", "failed", "anthropic", "claude-sonnet-4-5"]) | _JSON


def _some(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with any of ``fields`` (each may be absent)."""
    return st.fixed_dictionaries({}, optional=fields)


_USAGE = (st.builds(lambda counts: {k: v for k, v in zip(USAGE_KEYS, counts, strict=True)
                                    if v is not _ABSENT},
                    st.tuples(_JSON_COUNT, _JSON_COUNT, _JSON_COUNT, _JSON_COUNT)) | _JSON)
_BLOCK_TYPE = st.sampled_from(["text", "tool_result", "tool_use"])
_BLOCK = _some(type=_BLOCK_TYPE | _JSON, text=_JSON) | _JSON
_META = _some(usage=_USAGE, model=_NAME, control=_JSON)


def _message_payload(meta: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    """Message payloads with ``meta``."""
    return (
        # As vak writes them: a role, blocks of its types, a meta.
        st.fixed_dictionaries({
            "message": st.fixed_dictionaries({
                "role": st.sampled_from(["user", "assistant"]),
                "content": st.lists(st.fixed_dictionaries({"type": _BLOCK_TYPE}), max_size=3)}),
        }, optional={"meta": meta})
        # Anything at each field the info reads.
        | _some(message=_some(role=st.sampled_from(["user", "assistant", "system"]) | _JSON,
                              content=st.lists(_BLOCK, max_size=3) | _JSON) | _JSON,
                meta=meta | _JSON)
    )


_MESSAGE_PAYLOAD = _message_payload(_META)
_ORDINAL = st.integers(-1, 3) | st.sampled_from([1.0, True, None]) | _JSON
_RECEIPT_PAYLOAD = _some(
    attempts=st.lists(_some(ordinal=_ORDINAL, settlement=_NAME, usage=_USAGE, provider=_NAME,
                            model=_NAME) | _JSON, max_size=4) | _JSON,
    winning_attempt=_ORDINAL, provider=_NAME, model=_NAME, purpose=_NAME,
)


def _entries(kind: str, payload: dict[str, Any]) -> list[Entry]:
    """A vak line of ``kind`` and ``payload`` as the reader reads it, with the kernel
    and with orjson alone (a message then has no view)."""
    body = dumps({"id": "e", "parent_id": "p", "ts": "2026-11-01T05:09:29.866Z",
                  "kind": kind, **payload})
    return [e for e in (parse_entry(body, 2)[0], parse_entry_orjson(body, 2)[0])
            if e is not None]


@pytest.mark.skipif(kernel.node_info_c is None, reason="the C kernel did not build here")
@settings(max_examples=500)  # three kinds of entry, each with its own shapes
@given(st.tuples(st.just("message"), _MESSAGE_PAYLOAD)
       | st.tuples(st.just("receipt"), _RECEIPT_PAYLOAD)
       | st.tuples(st.sampled_from(["turn_card", "activity"]), _MESSAGE_PAYLOAD))
def test_the_c_node_info_is_the_python_one(case: tuple[str, dict[str, Any]]) -> None:
    assert kernel.node_info_c is not None
    for entry in _entries(*case):
        bad_c: list[Any] = []
        bad_py: list[Any] = []
        got, want = kernel.node_info_c(entry, bad_c), _node_info(entry, bad_py)
        assert type(got) is type(want) and got == want
        assert bad_c == bad_py
        if type(want) is _Request and want.usage is not None:
            assert [type(n) for n in got.usage] == [int] * 4
        if type(want) is _Receipt:
            assert type(got.billed) is tuple and got.billed == want.billed


@pytest.fixture
def slow_calls() -> Any:
    """The entries the C node info hands to the Python one, recorded while it runs."""
    assert kernel.configure_info_c is not None
    calls: list[Entry] = []

    def slow(entry: Entry, bad: list[Any]) -> Any:
        calls.append(entry)
        return _node_info(entry, bad)

    kernel.configure_info_c(_Request, _Receipt, _DIRECTIVE, ZERO_USAGE, slow,
                            _transcript_info_py)
    try:
        yield calls
    finally:
        kernel.configure_info_c(_Request, _Receipt, _DIRECTIVE, ZERO_USAGE, _node_info,
                                _transcript_info_py)


@pytest.mark.skipif(kernel.node_info_c is None, reason="the C kernel did not build here")
def test_the_c_node_info_takes_only_the_common_entries(slow_calls: list[Entry]) -> None:
    assert kernel.node_info_c is not None
    b = LedgerBuilder()
    b.header()
    b.user("q")
    b.control()
    b.assistant("a", u=usage(10, 2, 3))
    b.assistant("no usage")
    b.message("assistant", [], None)
    b.receipt([attempt(0, "failed", usage(5, 0)), attempt(1, "ok", usage(10, 2, 3))],
              winning=1)
    b.activity()
    common = [e for body in b.bodies() if (e := parse_entry(body, 1)[0]) is not None]
    infos = [kernel.node_info_c(e, []) for e in common]
    assert slow_calls == []
    assert infos[:3] == [None, _DIRECTIVE, None]  # header, prompt, control nudge
    assert infos[3] == _Request((10, 2, 3, 0), common[3].ts, "gemma4:e2b-mlx")
    assert infos[4] == _Request(None, common[4].ts, "gemma4:e2b-mlx")
    assert infos[5] == _Request(None, common[5].ts, None)
    receipt = infos[6]
    assert type(receipt) is _Receipt and (receipt.attempts, receipt.failed) == (2, 1)
    assert receipt.billed == (15, 2, 3, 0) and receipt.winning == (10, 2, 3, 0)
    assert infos[7] is None
    # Whatever makes a finding is the Python function's, which makes it.
    odd = [parse_entry(dumps({"id": "x", "parent_id": "p", "ts": "2026-11-01T05:09:29Z",
                              "kind": kind, **payload}), 9)[0]
           for kind, payload in [
               ("message", {"message": {"role": "assistant", "content": []},
                            "meta": {"usage": {"input_tokens": -1}}}),
               ("message", {"message": {"role": "robot", "content": []}}),
               ("receipt", {"attempts": [{"ordinal": 0, "usage": {"output_tokens": True}}]}),
               ("receipt", {"attempts": 5})]]
    bad: list[Any] = []
    for entry in odd:
        assert entry is not None
        kernel.node_info_c(entry, bad)
    assert slow_calls == odd
    assert [f.code for f in bad] == [Code.BAD_FIELD] * 4


# The same for an entry a transcript's adapter made (kernel.transcript_info_c): with a
# request's key, one-hour cache writes and mirror, read from its meta as the Python
# function reads them, of every JSON type.
_TRANSCRIPT_META = _some(usage=_USAGE, model=_NAME, control=_JSON,
                         request_key=st.sampled_from(["msg_1:req_1", ""]) | _JSON,
                         write_1h=st.integers(0, MAX_TOKEN_COUNT) | st.integers() | _JSON,
                         mirror=st.sampled_from(["a1b2c3"]) | _JSON)
_TRANSCRIPT_PAYLOAD = _message_payload(_TRANSCRIPT_META)


def _same_info(got: Any, want: Any, bad_c: list[Any], bad_py: list[Any]) -> None:
    assert type(got) is type(want) and got == want
    assert bad_c == bad_py
    if type(want) is _Request:
        # 1 == True in Python: the types too (a bool is no token count)
        assert type(got.write_1h) is type(want.write_1h)
        assert type(got.key) is type(want.key) and type(got.mirror) is type(want.mirror)


@pytest.mark.skipif(kernel.transcript_info_c is None, reason="the C kernel did not build here")
@settings(max_examples=500)
@given(st.tuples(st.just("message"), _TRANSCRIPT_PAYLOAD)
       | st.tuples(st.sampled_from(["activity", "receipt", "turn_card"]), _TRANSCRIPT_PAYLOAD))
@example(("message", {"message": {"role": "assistant", "content": []},
                      "meta": {"write_1h": True, "request_key": "k", "mirror": 5}}))
@example(("message", {"message": {"role": "assistant", "content": []},
                      "meta": {"write_1h": 2**63, "usage": {"input_tokens": -1}}}))
def test_the_c_transcript_info_is_the_python_one(case: tuple[str, dict[str, Any]]) -> None:
    assert kernel.transcript_info_c is not None
    for entry in _entries(*case):
        bad_c: list[Any] = []
        bad_py: list[Any] = []
        got = kernel.transcript_info_c(entry, bad_c)
        _same_info(got, _transcript_info_py(entry, bad_py), bad_c, bad_py)


@pytest.mark.skipif(kernel.transcript_info_c is None, reason="the C kernel did not build here")
def test_the_c_transcript_info_of_every_real_transcripts_entry_is_the_python_one() -> None:
    assert kernel.transcript_info_c is not None
    requests = 0
    keys: list[str] = []
    for path in sorted((REAL / "claude-code").rglob("*.jsonl")) + sorted(
            (REAL / "codex").rglob("*.jsonl")):
        fmt, lines = detect(iter(path.read_bytes().splitlines(True)))
        assert fmt is not None
        for item in fmt.read(lines, LineStats(), {}):
            if not isinstance(item, Entry):
                continue
            bad_c: list[Any] = []
            bad_py: list[Any] = []
            got, want = kernel.transcript_info_c(item, bad_c), _transcript_info_py(item, bad_py)
            _same_info(got, want, bad_c, bad_py)
            requests += type(want) is _Request
            if type(got) is _Request and got.key is not None:
                keys.append(got.key)
    assert requests > 500 and len(keys) > 500
    # A request streamed over several lines keeps one string for its key, as interning
    # would (1,016 keys of 487 requests: 512 strings, the other 25 repeats not adjacent).
    assert len({id(k) for k in keys}) <= len(set(keys)) + len(keys) // 20


@given(st.lists(st.sampled_from(list(Code)), max_size=6))
def test_a_verdict_counts_each_severity_and_takes_the_worst(found: list[Code]) -> None:
    findings = [Finding(code, None, None, "") for code in found]
    row = verdict(findings)
    assert row == {"status": Status.of(findings).value,
                   "errors": sum(f.severity is Severity.ERROR for f in findings),
                   "warnings": sum(f.severity is Severity.WARNING for f in findings),
                   "infos": sum(f.severity is Severity.INFO for f in findings)}


# A session's figures and active chain in one C call (kernel.figures_c): the same as
# _figures and the chain walked in Python, receipts tied to the same requests.

COUNT = st.integers(0, 2**40) | st.sampled_from([0, 2**62, 2**63 - 1])
USAGE = st.tuples(COUNT, COUNT, COUNT, COUNT)
TEXT = st.none() | st.sampled_from(["", "a", "anthropic"])
#: A metered attempt: (ordinal, settlement, usage, provider, model, winning).
METERED = st.tuples(st.none() | st.integers(-2, 2**31 + 1) | st.sampled_from([2**31 - 1, 2**31])
                    | st.just(1.0) | st.just(True),
                    TEXT, USAGE, TEXT, TEXT, st.booleans())
#: What the audit hangs on a node, and what it never does (a defer, never a guess).
INFO = st.one_of(
    st.none(), st.just(_DIRECTIVE), st.just("other"),
    st.builds(lambda u, model, part, mirror, key, hour, speed: _Request(
        u, "t", model, None, key, part, hour, mirror, speed),
              st.none() | USAGE, TEXT, st.booleans(), st.none() | st.just("sub"), TEXT,
              st.none() | st.integers(0, 9), st.none() | st.just("fast")),
    st.builds(lambda w, b, a, f, p, m, why, metered: _Receipt(w, b, a, f, "t", p, m, why,
                                                              metered),
              st.none() | USAGE, USAGE, st.integers(0, 5), st.integers(0, 5), TEXT, TEXT,
              TEXT, st.lists(METERED, max_size=3)),
)
ODD = st.sampled_from(["mark", "part", "usage", "receipt_usage", "attempts", "parent",
                       "model", "metered", "attempt", "speed"])


def figure_tree(spec: list[tuple[Any, int, bool]], odd: str | None, where: int) -> Any:
    """Nodes of ``spec`` (info, parent: an earlier node's index or -1 for none, on the
    active chain), ``odd`` (one thing the audit never makes) put on node ``where``."""
    from pipeline.ledger.tree import TreeIndex

    tree = TreeIndex()
    for i, (info, parent, active) in enumerate(spec):
        made = copy.copy(info) if isinstance(info, (_Request, _Receipt)) else info
        node = Node(i + 1, f"n{i}", f"n{parent}" if 0 <= parent < i else None, "message",
                    made, active)
        tree.nodes.append(node)
        tree.by_id[node.id] = node
    if odd is not None and tree.nodes:
        node = tree.nodes[where % len(tree.nodes)]
        if odd == "mark":
            node.on_active_chain = None
        elif odd == "part" and type(node.info) is _Request:
            node.info.part = node.line % 2  # an int: true or false as a bool would be
        elif odd == "usage" and type(node.info) is _Request:
            node.info.usage = [1, 2, 3, 4]
        elif odd == "receipt_usage" and type(node.info) is _Receipt:
            node.info.billed = (1, 2, 3)
        elif odd == "attempts" and type(node.info) is _Receipt:
            node.info.attempts = True
        elif odd == "parent":
            node.parent_id = 7
        elif odd == "model" and type(node.info) is _Request:
            node.info.model = 3
        elif odd == "speed" and type(node.info) is _Request:
            node.info.speed = 2
        elif odd == "metered" and type(node.info) is _Receipt:
            node.info.metered = tuple(node.info.metered)
        elif odd == "attempt" and type(node.info) is _Receipt and node.info.metered:
            node.info.metered[0] = list(node.info.metered[0])
    return tree


@pytest.mark.skipif(kernel.figures_c is None, reason="the C kernel did not build here")
@settings(max_examples=400, deadline=None)
@given(spec=st.lists(st.tuples(INFO, st.integers(-1, 12), st.booleans()), max_size=14),
       odd=st.none() | ODD, where=st.integers(0, 20))
@example(spec=[(_Request(None, "t", None), -1, True),  # billed by its receipt
               (_Receipt((1, 2, 3, 4), (5, 6, 7, 8), 2, 1, "t", None, None, None, []), 0,
                True)], odd=None, where=0)
@example(spec=[(_Request((1, 2, 3, 4), "t", None), -1, True)], odd="mark", where=0)
def test_the_c_figures_are_the_python_ones(spec: list[tuple[Any, int, bool]],
                                           odd: str | None, where: int) -> None:
    assert kernel.figures_c is not None
    c_tree, py_tree = figure_tree(spec, odd, where), figure_tree(spec, odd, where)
    got = kernel.figures_c(c_tree.nodes, c_tree.by_id)
    try:
        want = _figures(py_tree)
    except (TypeError, KeyError, IndexError):  # the Python path fails: the C must defer
        assert got is None
        return

    def ties(tree: Any) -> list[int | None]:
        """Each request's receipt, as its node's index."""
        return [tree.nodes.index(next(m for m in tree.nodes if m.info is n.info.receipt))
                if type(n.info) is _Request and n.info.receipt is not None else None
                for n in tree.nodes]

    if got is None:  # deferred (only for what the audit never makes): the caller's
        assert odd is not None  # _figures then runs after whatever the C tied
        assert (_figures(c_tree), ties(c_tree)) == (want, ties(py_tree))
        return
    active = [n for n in py_tree.nodes if n.on_active_chain]
    *figures, lines, ids = got
    assert _figures_row(*figures) == want
    assert (lines, ids) == (tuple(n.line for n in active), tuple(n.id for n in active))
    assert ties(c_tree) == ties(py_tree)  # the same receipts tied to the same requests


@pytest.mark.skipif(kernel.usage_rows_c is None, reason="the C kernel did not build here")
@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=st.lists(st.tuples(INFO, st.integers(-1, 12), st.booleans()), max_size=14),
       odd=st.none() | ODD, where=st.integers(0, 20), header=st.tuples(TEXT, TEXT),
       subagent=st.none() | st.just("a1"))
@example(spec=[(_Request(None, "t", "m"), -1, True),  # a message, then two receipts of it:
               *[(_Receipt(w, (1, 1, 1, 1), 2, 1, "t", None, None, "p",  # the second
                           [(0, "failed", (1, 1, 1, 1), None, None, False),  # a retry
                            (1, "ok", (2, 2, 2, 2), "x", "", True)]), 0, True)
                 for w in ((2, 2, 2, 2), (3, 3, 3, 3))]],
          odd=None, where=0, header=("anthropic", "m0"), subagent=None)
def test_the_c_usage_rows_are_the_python_ones(
        spec: list[tuple[Any, int, bool]], odd: str | None, where: int,
        header: tuple[str | None, str | None], subagent: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert kernel.usage_rows_c is not None
    c_tree, py_tree = figure_tree(spec, odd, where), figure_tree(spec, odd, where)
    fields = {"provider": header[0], "model": header[1]}
    try:
        _figures(c_tree)
        _figures(py_tree)
    except (TypeError, KeyError, IndexError):
        return  # the figures' own test above
    try:
        with monkeypatch.context() as m:
            m.setattr(session_module, "usage_rows_c", None)
            want = _usage_rows(py_tree, fields, subagent)
    except (TypeError, KeyError, IndexError, ValueError):  # the C must defer
        assert kernel.usage_rows_c(c_tree.nodes, c_tree.by_id, header[0] or None,
                                   header[1] or None, subagent) is None
        return
    got = kernel.usage_rows_c(c_tree.nodes, c_tree.by_id, header[0] or None,
                              header[1] or None, subagent)
    if got is None:  # deferred: only for what the audit never makes
        assert odd is not None
        return
    assert got == want
    assert [tuple(map(type, row)) for row in got] == [tuple(map(type, r)) for r in want]
    assert _usage_rows(c_tree, fields, subagent) == want  # the caller's way
