"""Unit tests of pipeline.ledger.reader: envelope, strict JSON, the hash chain, spec 2.1 codes."""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
import pytest

from pipeline.ledger import reader
from pipeline.ledger.reader import Entry, parse_entry, read_ledger
from pipeline.ledger.types import Code, Severity
from tests.helpers.ledgers import (
    LedgerBuilder,
    codes,
    dumps,
    read_bytes,
    sample_session,
    serious,
    sha,
    split_lines,
)


def only(findings: list[Any], code: Code) -> list[int | None]:
    return [f.line for f in findings if f.code is code]


# -- a valid ledger ----------------------------------------------------------------------


def test_valid_ledger_reads_every_line_without_findings() -> None:
    b = sample_session(turns=3)
    entries, findings = read_bytes(b.to_bytes())
    assert findings == []
    assert [e.line for e in entries] == list(range(1, len(b.lines) + 1))
    assert entries[0].is_header and entries[0].prev_hash is None
    for prev, cur in itertools.pairwise(entries):
        assert cur.prev_hash == prev.digest
    assert [e.digest for e in entries] == [sha(x) for x in b.bodies()]


def test_reader_is_a_stream() -> None:
    """Items come out while lines go in: nothing is read ahead beyond one line."""
    b = sample_session(turns=1)
    pulled = 0

    def source() -> Any:
        nonlocal pulled
        for raw in b.physical():
            pulled += 1
            yield raw

    it = read_ledger(source())
    first = next(it)
    assert isinstance(first, Entry) and first.line == 1
    assert pulled == 1


# -- spec 2.1 finding codes ----------------------------------------------------------


def test_damaged_entry_in_the_middle() -> None:
    b = sample_session(turns=2)
    lines = b.physical()
    lines[3] = b'{"id":"0199a1f2-6a00-7000-8000-000000000004","parent_id":' + b"\n"
    entries, findings = read_bytes(b"".join(lines))
    assert codes(findings) == {(4, "damaged_entry")}
    assert findings[0].severity is Severity.ERROR
    # The bad line is skipped, the rest of the file is still read; the next entry's
    # own prev_hash mismatch is explained by the damaged line, not reported twice.
    assert [e.line for e in entries] == [n for n in range(1, len(lines) + 1) if n != 4]


def test_hash_mismatch_on_an_edited_line() -> None:
    b = sample_session(turns=2)
    lines = b.physical()
    lines[2] = lines[2].replace(b"looking", b"LOOKING")
    entries, findings = read_bytes(b"".join(lines))
    assert codes(findings) == {(4, "hash_mismatch")}
    assert findings[0].severity is Severity.ERROR
    assert len(entries) == len(lines)


def test_hash_mismatch_on_a_deleted_line() -> None:
    b = sample_session(turns=2)
    lines = b.physical()
    del lines[4]
    _, findings = read_bytes(b"".join(lines))
    assert codes(findings) == {(5, "hash_mismatch")}


def test_torn_tail_fragment_without_newline() -> None:
    b = sample_session(turns=1)
    b.raw(b'{"id":"0199a1f2-6a00-7000-8000-0000000000ff","parent_id":"01', newline=False)
    entries, findings = read_bytes(b.to_bytes())
    n = len(b.lines)
    assert codes(findings) == {(n, "torn_tail")}
    assert findings[0].severity is Severity.WARNING
    assert len(entries) == n - 1


def test_torn_tail_bad_last_line_with_newline() -> None:
    b = sample_session(turns=1)
    b.raw(b'{"id":"x"')
    _, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(len(b.lines), "torn_tail")}


def test_final_valid_line_without_newline_is_torn_tail() -> None:
    """A complete entry whose newline never made it: kept, but the next append merges."""
    b = sample_session(turns=1)
    b.lines[-1].newline = False
    entries, findings = read_bytes(b.to_bytes())
    n = len(b.lines)
    assert codes(findings) == {(n, "torn_tail")}
    assert len(entries) == n and entries[-1].line == n


def test_two_bad_lines_at_the_end() -> None:
    """Only the last line is the torn tail; a bad line before it is damage."""
    b = sample_session(turns=1)
    b.raw(b"garbage")
    b.raw(b'{"id":', newline=False)
    n = len(b.lines)
    _, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(n - 1, "damaged_entry"), (n, "torn_tail")}


def test_torn_write_recovered() -> None:
    b = LedgerBuilder()
    b.header()
    b.user("hi")
    b.raw(b'{"id":"0199a1f2-6a00-7000-8000-0000000000ff","parent_id":"0199a1f2-6a00-70')
    b.assistant("hello")  # chains to the user message, as vak's writer does
    entries, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(3, "torn_write_recovered")}
    assert findings[0].severity is Severity.WARNING
    assert [e.line for e in entries] == [1, 2, 4]


def test_several_sealed_bad_lines_are_all_recovered() -> None:
    b = LedgerBuilder()
    b.header()
    b.raw(b"{")
    b.raw(b"[1]")
    b.user("hi")
    _, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(2, "torn_write_recovered"), (3, "torn_write_recovered")}


def test_bad_line_before_the_header_is_damage() -> None:
    """No previous valid entry and no prev_hash on the header: nothing shows a torn write."""
    b = LedgerBuilder()
    b.raw(b"garbage")
    b.header()
    b.user("hi")
    entries, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(1, "damaged_entry")}
    assert [e.line for e in entries] == [2, 3]


def merged_ledger(bad_prev: bool = False) -> tuple[LedgerBuilder, bytes, list[str]]:
    """header, user, <torn fragment><assistant> on line 3, receipt, user."""
    b = LedgerBuilder()
    ids = [b.header(), b.user("hi")]
    fragment = b'{"id":"0199a1f2-6a00-7000-8000-0000000000ff","parent_id":"0199a1f2-6a00-7000-80'
    ids.append(b.assistant("hello", prev_hash="0" * 64 if bad_prev else True))
    merged = b.lines[-1]
    merged.data = fragment + merged.data
    ids.append(b.receipt([], parent=ids[-1]))
    ids.append(b.user("next"))
    return b, fragment, ids


def test_torn_merge_recovers_the_entry_into_the_chain() -> None:
    b, fragment, ids = merged_ledger()
    entries, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(3, "torn_merge")}
    assert findings[0].severity is Severity.WARNING
    assert [e.id for e in entries] == ids
    recovered = entries[2]
    assert recovered.line == 3 and recovered.kind == "message" and recovered.role == "assistant"
    # The entry's digest is that of its own bytes (what vak's writer hashed), not of the
    # physical line: the receipt after it chains to it without a mismatch.
    assert recovered.digest == sha(b.lines[2].data[len(fragment):])
    assert entries[3].prev_hash == recovered.digest


def test_torn_merge_after_a_fragment_full_of_nested_ids() -> None:
    """A torn message whose tool input lists many ``{"id":...}`` records (serde_json
    sorts object keys, so ``id`` often comes first) still lets the merged entry out."""
    b = LedgerBuilder()
    b.header()
    u = b.user("import these")
    records = [{"id": i, "name": f"r{i}"} for i in range(300)]
    b.message("assistant", [{"type": "tool_use", "id": "c1", "name": "db", "input": records}])
    torn = b.lines.pop().data[:-20]  # the crash cut it short; vak reopened after it
    b.tail_hash, b.tail_id = sha(b.lines[-1].data), u
    assert torn.count(b'{"id":') > 300
    merged = b.assistant("sorry, again")
    b.lines[-1].data = torn + b.lines[-1].data
    b.user("next")
    entries, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(3, "torn_merge")}
    assert [e.id for e in entries][2] == merged


def test_torn_merge_entry_prev_hash_is_checked() -> None:
    b, _, _ = merged_ledger(bad_prev=True)
    _, findings = read_bytes(b.to_bytes())
    # The recovered entry names another predecessor; the entry after it still chains.
    assert codes(findings) == {(3, "torn_merge"), (3, "hash_mismatch")}


def test_torn_merge_joins_the_tree() -> None:
    from tests.helpers.ledgers import audit_bytes

    b, _, ids = merged_ledger()
    audit = audit_bytes(b.to_bytes())
    assert codes(audit.findings) == {(3, "torn_merge")}
    assert audit.row["entries"] == 5 and audit.row["active_chain_len"] == 5
    assert audit.row["requests"] == 1
    assert audit.row["head_id"] == ids[-1]


def test_torn_merge_of_a_work_line_reports_both() -> None:
    b = LedgerBuilder()
    b.header()
    b.work()
    b.lines[-1].data = b'{"id":"abc","par' + b.lines[-1].data
    b.user("x")
    entries, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(2, "torn_merge"), (2, "duplicate_kind_key")}
    assert entries[1].kind == "work"


def test_unchained_entries_after_the_header() -> None:
    b = LedgerBuilder(chained=False)
    b.header()
    b.user("hi")
    b.assistant("hello")
    entries, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(2, "unchained"), (3, "unchained")}
    assert all(f.severity is Severity.WARNING for f in findings)
    assert len(entries) == 3


def test_unchained_then_chained() -> None:
    """vak started chaining mid-file: the first chained entry names the last legacy line."""
    b = LedgerBuilder(chained=False)
    b.header()
    b.user("hi")
    b.chained = True
    b.assistant("hello")
    _, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(2, "unchained")}


def test_unchained_entry_after_a_bad_line_is_still_unchained() -> None:
    b = LedgerBuilder(chained=False)
    b.header()
    b.raw(b"garbage")
    b.user("hi")
    _, findings = read_bytes(b.to_bytes())
    # Without prev_hash nothing shows the bad line was a torn write.
    assert codes(findings) == {(2, "damaged_entry"), (3, "unchained")}


def test_duplicate_kind_key_work_line() -> None:
    b = LedgerBuilder()
    b.header()
    event = {"kind": "contract_status_changed", "from": "draft", "to": "active"}
    b.work(event)
    b.user("after")
    assert b.lines[1].data.count(b'"kind":') == 3  # envelope, event tag, nested tag
    entries, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(2, "duplicate_kind_key")}
    assert findings[0].severity is Severity.INFO
    work = entries[1]
    assert work.kind == "work" and work.work_event == event
    assert entries[2].prev_hash == work.digest == sha(b.lines[1].data)


def test_duplicate_kind_on_another_kind_is_not_the_quirk() -> None:
    b = LedgerBuilder()
    b.header()
    env = b.envelope("message")
    data = dumps(env)[:-1] + b',"kind":{"kind":"x"}}'
    b.write(data, env["id"])
    b.user("after")
    _, findings = read_bytes(b.to_bytes())
    assert codes(findings) == {(2, "damaged_entry")}


# -- strict JSON ---------------------------------------------------------------------


def ledger_with_line_3(bad: bytes) -> bytes:
    b = LedgerBuilder()
    b.header()
    b.user("hi")
    b.raw(bad)
    b.assistant("hello")
    lines = b.physical()
    # The entry after the bad line names something else than the previous valid entry,
    # so the bad line is classified as damage (bytes changed after writing).
    lines[3] = lines[3].replace(sha(b.lines[1].data).encode(), sha(bad).encode())
    return b"".join(lines)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(b'{"id":"a","parent_id":null,"ts":"2026-09-21T14:13:20Z","kind":"x","v":NaN}',
                     id="NaN"),
        pytest.param(b'{"id":"a","parent_id":null,"ts":"2026-09-21T14:13:20Z","v":Infinity}',
                     id="Infinity"),
        pytest.param(b'{"id":"a\xff\xfe","parent_id":null,"ts":"2026-09-21T14:13:20Z","kind":"x"}',
                     id="invalid-utf8"),
        pytest.param(b'{"id":"\xed\xa0\x80","parent_id":null,"ts":"2026-09-21T14:13:20Z",'
                     b'"kind":"x"}', id="utf8-surrogate"),
        pytest.param(b'{"id":"\\ud800","parent_id":null,"ts":"2026-09-21T14:13:20Z","kind":"x"}',
                     id="lone-surrogate-escape"),
        pytest.param(b"\xef\xbb\xbf{}", id="bom"),
        pytest.param(b"[" * 200_000, id="deep-open"),
        pytest.param(b"[" * 200_000 + b"]" * 200_000, id="deep-balanced"),
        pytest.param(b'{"a":' * 100_000 + b"1" + b"}" * 100_000, id="deep-objects"),
        pytest.param(b'{"id":' * 100_000, id="deep-id"),
        pytest.param(b"[1,2]", id="array"),
        pytest.param(b'"text"', id="string"),
        pytest.param(b"42", id="number"),
        pytest.param(b"null", id="null"),
        pytest.param(b"{}", id="empty-object"),
        pytest.param(b"{}{}", id="two-objects"),
        pytest.param(b'{"id":"a"} x', id="trailing"),
        pytest.param(b"\x00", id="nul"),
    ],
)
def test_strict_json_bad_line_is_damaged(bad: bytes) -> None:
    entries, findings = read_bytes(ledger_with_line_3(bad))
    assert codes(findings) == {(3, "damaged_entry")}
    assert [e.line for e in entries] == [1, 2, 4]
    assert len(findings[0].detail) <= reader.MAX_DETAIL_CHARS


def test_deep_nesting_does_not_reach_python_recursion() -> None:
    body = b"[" * 200_000 + b"]" * 200_000
    entry, dup, reason = parse_entry(body, 1)
    assert entry is None and not dup and reason


def test_blank_line_in_the_middle() -> None:
    """A blank line is not a JSON object: a bad line like any other (spec 2.1).

    The chain runs on past it untouched, so it reads as a sealed torn write (warning);
    the line numbers after it stay physical.
    """
    b = sample_session(turns=1)
    lines = b.physical()
    lines.insert(2, b"\n")
    entries, findings = read_bytes(b"".join(lines))
    assert codes(findings) == {(3, "torn_write_recovered")}
    assert [e.line for e in entries] == [1, 2, *range(4, len(lines) + 1)]


def test_crlf_line_is_an_edit() -> None:
    """vak writes \\n only; a \\r kept in the stored bytes changes the line's digest."""
    b = sample_session(turns=1)
    lines = b.physical()
    lines[1] = lines[1][:-1] + b"\r\n"
    _, findings = read_bytes(b"".join(lines))
    assert codes(findings) == {(3, "hash_mismatch")}


# -- envelope types ------------------------------------------------------------------


def envelope_line(**override: Any) -> bytes:
    obj: dict[str, Any] = {"id": "e1", "parent_id": "h", "ts": "2026-09-21T14:13:20.123Z",
                           "prev_hash": "0" * 64, "at_turn": "e1", "kind": "message"}
    for k, v in override.items():
        if v is KeyError:
            obj.pop(k)
        else:
            obj[k] = v
    return json.dumps(obj, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "ts",
    [
        "2026-09-21T14:13:20Z",
        "2026-09-21T14:13:20.123Z",
        "2026-09-21T14:13:20.123456Z",
        "2026-09-21T14:13:20.123456789Z",
        "2024-02-29T23:59:59.000000000Z",
    ],
)
def test_ts_accepted(ts: str) -> None:
    entry, _, reason = parse_entry(envelope_line(ts=ts), 1)
    assert entry is not None, reason
    assert entry.ts == ts


@pytest.mark.parametrize(
    "ts",
    [
        "2026-09-21T14:13:20.1Z",
        "2026-09-21T14:13:20.12Z",
        "2026-09-21T14:13:20.1234Z",
        "2026-09-21T14:13:20.12345Z",
        "2026-09-21T14:13:20.1234567Z",
        "2026-09-21T14:13:20.1234567890Z",
        "2026-09-21T14:13:20.Z",
        "2026-09-21T14:13:20+00:00",
        "2026-09-21T14:13:20.123+00:00",
        "2026-09-21T14:13:20",
        "2026-09-21T14:13:20z",
        "2026-09-21t14:13:20Z",
        "2026-09-21 14:13:20Z",
        "2026-09-21",
        "2026-09-21T14:13Z",
        "2026-09-21T14:13:20Z\n",
        " 2026-09-21T14:13:20Z",
        "2026-13-21T14:13:20Z",
        "2026-02-30T14:13:20Z",
        "2026-09-21T24:00:00Z",
        "2026-09-21T14:61:20Z",
        "2026-09-21T23:59:60Z",
        "٢٠٢٦-09-21T14:13:20Z",
        "",
        1790000000,
        None,
        ["2026-09-21T14:13:20Z"],
        KeyError,
    ],
)
def test_ts_rejected(ts: Any) -> None:
    entry, _, reason = parse_entry(envelope_line(ts=ts), 1)
    assert entry is None
    assert "ts" in reason


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", KeyError), ("id", 1), ("id", ""), ("id", None), ("id", {"a": 1}),
        ("parent_id", KeyError), ("parent_id", 5), ("parent_id", ["h"]),
        ("prev_hash", None), ("prev_hash", 12), ("prev_hash", ["x"]),
        ("at_turn", None), ("at_turn", 3),
        ("kind", KeyError), ("kind", None), ("kind", 7), ("kind", ""), ("kind", {"kind": "x"}),
    ],
)
def test_envelope_type_rejected(field: str, value: Any) -> None:
    entry, _, reason = parse_entry(envelope_line(**{field: value}), 1)
    assert entry is None
    assert reason.startswith("envelope")


@pytest.mark.parametrize(
    "override",
    [
        {},
        {"parent_id": None},  # null parent: a tree question (orphan_parent), not an envelope one
        {"prev_hash": KeyError},  # omitted: unchained, still an entry
        {"at_turn": KeyError},  # T13 entries have no at_turn
        {"kind": "evidence_body"},
        {"kind": "some_future_kind"},  # unknown kinds are entries (tree: unknown_kind)
    ],
)
def test_envelope_accepted(override: dict[str, Any]) -> None:
    entry, dup, reason = parse_entry(envelope_line(**override), 7)
    assert entry is not None, reason
    assert entry.line == 7 and not dup


def test_entry_accessors_tolerate_malformed_payloads() -> None:
    line = envelope_line(message={"role": 5, "content": "nope"}, meta=[1])
    entry, _, _ = parse_entry(line, 1)
    assert entry is not None
    assert entry.role is None and entry.content == [] and entry.meta == {}
    line = envelope_line(message={"role": "user", "content": [1, {"type": "text"}]})
    entry, _, _ = parse_entry(line, 1)
    assert entry is not None and entry.content == [{"type": "text"}]


# -- hostile input -------------------------------------------------------------------


def count_parses(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    stats = {"calls": 0, "bytes": 0}
    real = orjson.loads

    def counting(data: Any) -> Any:
        stats["calls"] += 1
        stats["bytes"] += len(data)
        return real(data)

    # orjson is one module object everywhere: patching it counts the reader's calls;
    # every line goes to orjson here (the per-line kernel would read the short ones).
    monkeypatch.setattr(orjson, "loads", counting)
    monkeypatch.setattr(reader, "_worth_it", lambda body: False)
    return stats


@pytest.mark.parametrize(
    "hostile",
    [
        pytest.param(b'{"id":' * 20_000, id="ids"),
        pytest.param(b'{"id":1,' * 20_000 + b"}", id="ids-values"),
        pytest.param(b'x{"id":"a","parent_id":"b"}' * 20_000, id="near-entries"),
        pytest.param(b'{"id":[' * 20_000 + b"]" * 20_000, id="ids-deep"),
        pytest.param(b'{"id":"a","parent_id":null,"ts":"' * 20_000, id="envelopes"),
        pytest.param(b'{"id":"a","parent_id":"b","ts":"2026-09-21T14:13:20Z","kind":"x"'
                     * 20_000, id="open-entries"),
    ],
)
def test_hostile_merge_candidates_are_bounded(
    monkeypatch: pytest.MonkeyPatch, hostile: bytes
) -> None:
    """A line full of ``{"id":`` is not probed at every occurrence (no quadratic time)."""
    stats = count_parses(monkeypatch)
    b = LedgerBuilder()
    b.header()
    b.raw(hostile)
    b.user("hi")
    entries, findings = read_bytes(b.to_bytes())
    occurrences = hostile.count(b'{"id":')
    assert occurrences >= 20_000
    assert codes(findings) == {(2, "torn_write_recovered")}
    assert len(entries) == 2
    # Generous: a constant number of attempts per line, and total parsed bytes linear in
    # the line's size (quadratic would be ~occurrences/2 times the line).
    assert stats["calls"] >= 3  # every line parsed once: the counter does see the reader
    assert stats["calls"] <= 200
    assert stats["bytes"] <= 200 * len(hostile)


def test_hostile_line_does_not_crash_on_binary() -> None:
    noise = bytes(range(256)) * 50
    entries, findings = read_bytes(noise + b"\n" + noise)
    assert entries == []
    assert {f.code for f in findings} <= {Code.DAMAGED_ENTRY, Code.TORN_TAIL}


def test_lines_as_given_by_split_lines() -> None:
    assert split_lines(b"a\nb\n\nc") == [b"a\n", b"b\n", b"\n", b"c"]


def test_valid_ledger_has_no_serious_finding_with_work_lines() -> None:
    b = sample_session(turns=1)
    b.work()
    b.user("more")
    _, findings = read_bytes(b.to_bytes())
    assert serious(findings) == []
    assert only(findings, Code.DUPLICATE_KIND_KEY) == [len(b.lines) - 1]


def test_lost_newline_between_two_entries_recovers_both() -> None:
    """A crash after an entry's JSON but before its newline: the next append lands on the
    same line (``{A}{B}``) and B chains to A. Both are recovered: a warning, no error."""
    from tests.helpers.ledgers import audit_bytes

    b = LedgerBuilder()
    b.header()
    b.user("hello")
    first = b.assistant("hi")
    second = b.user("and again")
    joined = b.lines[-2].data + b.lines[-1].data
    b.lines[-2].data = joined
    del b.lines[-1]
    b.assistant("yes")
    audit = audit_bytes(b.to_bytes())
    assert codes(audit.findings) == {(3, "torn_merge")}
    assert audit.findings[0].severity is Severity.WARNING
    assert audit.row["entries"] == 5 and audit.row["active_chain_len"] == 5
    entries, _ = read_bytes(b.to_bytes())
    assert [e.id for e in entries][2:4] == [first, second]
