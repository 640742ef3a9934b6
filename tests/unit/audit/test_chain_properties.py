"""Properties of the reader and the audit over generated, valid vak ledgers (hypothesis).

The ledgers come from :mod:`ledgers` (vak's wire format, ``prev_hash`` chained), with a
varying number and size of entries, tool steps, receipts, ``work`` lines and branches.
Each property mutates one and checks what spec 2.1 says an audit must see.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.audit.session import SessionAudit
from pipeline.ledger.types import Severity
from tests.helpers.ledgers import (
    LedgerBuilder,
    attempt,
    audit_bytes,
    read_bytes,
    split_lines,
    usage,
)

PROPERTY = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

words = st.text(max_size=40)
counts = st.integers(min_value=0, max_value=5000)


@st.composite
def ledgers(draw: Any, min_lines: int = 2) -> LedgerBuilder:
    """A valid, chained vak ledger of a few turns (some branched, some with receipts)."""
    b = LedgerBuilder()
    written = [b.header()]
    for t in range(draw(st.integers(min_value=0, max_value=4))):
        if len(written) > 1 and draw(st.integers(0, 4)) == 0:
            b.branch_at(draw(st.sampled_from(written)))  # an abandoned branch
        written.append(b.user(draw(words)))
        for s in range(draw(st.integers(0, 2))):
            call = f"call_{t}_{s}"
            u = usage(draw(counts), draw(counts)) if draw(st.booleans()) else None
            a = b.assistant(draw(words), tools=[call], u=u)
            written.append(a)
            if draw(st.booleans()):
                attempts = [attempt(0, "failed", usage(draw(counts), 0))] if draw(
                    st.booleans()) else []
                attempts.append(attempt(len(attempts), "ok", usage(draw(counts), draw(counts))))
                written.append(b.receipt(attempts, winning=len(attempts) - 1, parent=a))
            written.append(b.tool_results(call, content=draw(words)))
        extra = draw(st.sampled_from(["none", "activity", "work", "control"]))
        if extra == "activity":
            written.append(b.activity(draw(words)))
        elif extra == "work":
            written.append(b.work())
        elif extra == "control":
            written.append(b.control())
        written.append(b.assistant(draw(words)))
    while len(b.lines) < min_lines:
        written.append(b.activity(draw(words)))
    return b


def audit(lines: list[bytes]) -> SessionAudit:
    return audit_bytes(b"".join(lines))


def worst(a: SessionAudit) -> Severity | None:
    return max((f.severity for f in a.findings), default=None)


def check_invariants(data: bytes) -> SessionAudit:
    """Audit bytes and check what holds for any input: no exception, sane line numbers."""
    result = audit_bytes(data)
    n = len(split_lines(data))
    assert result.row["lines"] == n
    assert result.row["bytes"] == len(data)
    assert 0 <= result.row["entries"] <= n
    for f in result.findings:
        assert f.line is None or 1 <= f.line <= n
        assert len(f.detail) <= 200
    entries, _ = read_bytes(data)
    assert [e.line for e in entries] == sorted({e.line for e in entries})
    return result


# -- (1) parsing never raises ----------------------------------------------------------

tokens = st.sampled_from([
    b'{"id":', b'"parent_id":', b'"ts":"2026-09-21T14:13:20Z"', b'"kind":', b'"work"',
    b'"header"', b"null", b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"\n", b"NaN",
    b"\xff", b"\xed\xa0\x80", b"1e999", b"-0", b'"prev_hash":', b"\r",
])


@PROPERTY
@given(st.one_of(st.binary(max_size=2000), st.lists(tokens, max_size=200).map(b"".join)))
def test_reading_arbitrary_bytes_never_raises(data: bytes) -> None:
    check_invariants(data)


mutation = st.tuples(
    st.sampled_from(["substitute", "delete", "insert", "truncate", "duplicate", "splice"]),
    st.integers(min_value=0), st.integers(min_value=0), st.binary(min_size=1, max_size=40),
)


@PROPERTY
@given(ledgers(), st.lists(mutation, min_size=1, max_size=4))
def test_reading_mutated_ledgers_never_raises(b: LedgerBuilder, ops: list[Any]) -> None:
    data = bytearray(b.to_bytes())
    for op, i, j, blob in ops:
        if not data:
            data.extend(blob)
            continue
        i %= len(data)
        j = i + j % 200
        if op == "substitute":
            data[i] = blob[0] if blob[0] != data[i] else (data[i] + 1) % 256
        elif op == "delete":
            del data[i:j]
        elif op == "insert":
            data[i:i] = blob
        elif op == "truncate":
            del data[i:]
        elif op == "duplicate":
            data[i:i] = data[i:j]
        else:
            data[i:i] = b'{"id":' + blob
    check_invariants(bytes(data))


# -- (2) to (5): changes before the last line are always reported -------------------


@PROPERTY
@given(ledgers(), st.data())
def test_single_byte_change_before_the_last_line_is_reported(
    b: LedgerBuilder, data: st.DataObject
) -> None:
    lines = b.physical()
    i = data.draw(st.integers(0, len(lines) - 2), label="line")
    j = data.draw(st.integers(0, len(lines[i]) - 1), label="byte")
    new = data.draw(st.integers(0, 255).filter(lambda v: v != lines[i][j]), label="value")
    line = bytearray(lines[i])
    line[j] = new
    lines[i] = bytes(line)
    result = audit(lines)
    # Spec 2.1: a bad line is classified by the next entry's prev_hash, a changed valid
    # line shows as hash_mismatch on its successor. Either way it is at least a warning;
    # in fact always an error (no mutation of a sealed line can name its predecessor).
    assert worst(result) is Severity.ERROR, result.findings


@PROPERTY
@given(ledgers(), st.data())
def test_deleting_a_line_before_the_last_is_an_error(
    b: LedgerBuilder, data: st.DataObject
) -> None:
    lines = b.physical()
    i = data.draw(st.integers(0, len(lines) - 2), label="line")
    del lines[i]
    result = audit(lines)
    assert worst(result) is Severity.ERROR
    assert (i + 1, "hash_mismatch") in {(f.line, f.code.text) for f in result.findings}


@PROPERTY
@given(ledgers(), st.data())
def test_inserting_a_line_anywhere_is_reported(b: LedgerBuilder, data: st.DataObject) -> None:
    lines = b.physical()
    at = data.draw(st.integers(0, len(lines)), label="position")
    if data.draw(st.booleans(), label="garbage"):
        body = data.draw(st.binary(max_size=120).map(lambda x: x.replace(b"\n", b"")),
                         label="bytes")
        new = body + b"\n"
    else:
        new = lines[data.draw(st.integers(0, len(lines) - 1), label="copy of")]
    lines.insert(at, new)
    result = audit(lines)
    assert worst(result) in (Severity.WARNING, Severity.ERROR), result.findings


@PROPERTY
@given(ledgers(), st.data())
def test_swapping_adjacent_lines_is_an_error(b: LedgerBuilder, data: st.DataObject) -> None:
    lines = b.physical()
    i = data.draw(st.integers(0, len(lines) - 2), label="line")
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    result = audit(lines)
    assert worst(result) is Severity.ERROR
    assert (i + 1, "hash_mismatch") in {(f.line, f.code.text) for f in result.findings}


# -- (6) the last line: caught against a checkpoint -----------------------------------


@PROPERTY
@given(ledgers(), st.data())
def test_last_line_change_moves_the_checkpoint(b: LedgerBuilder, data: st.DataObject) -> None:
    """Inside one file a changed or deleted last line may look fine (nothing chains to
    it); what a checkpoint compares (head hash, entries, bytes) changes."""
    lines = b.physical()
    before = audit(lines).row
    if data.draw(st.booleans(), label="delete"):
        del lines[-1]
    else:
        j = data.draw(st.integers(0, len(lines[-1]) - 1), label="byte")
        new = data.draw(st.integers(0, 255).filter(lambda v: v != lines[-1][j]), label="value")
        last = bytearray(lines[-1])
        last[j] = new
        lines[-1] = bytes(last)
    after = audit(lines).row
    assert after["head_hash"] != before["head_hash"]
    assert (after["head_hash"], after["entries"], after["bytes"]) != (
        before["head_hash"], before["entries"], before["bytes"])


# -- (7) a valid ledger --------------------------------------------------------------


@PROPERTY
@given(ledgers(min_lines=1))
def test_valid_ledger_has_no_warning_or_error(b: LedgerBuilder) -> None:
    data = b.to_bytes()
    result = check_invariants(data)
    assert [f for f in result.findings if f.severity >= Severity.WARNING] == []
    assert {f.code.text for f in result.findings} <= {"duplicate_kind_key"}
    assert result.row["status"] == "ok"
    assert result.row["entries"] == result.row["lines"] == len(b.lines)
    assert result.row["active_chain_len"] + result.row["abandoned_entries"] == len(b.lines)
