"""Row 1: every single-bit flip of a small valid ledger is reported on the right line.

Exhaustive over every bit of a five-entry ledger (about 11,000 flips). "The right line"
follows spec section 2.1, line by line of the *original* file (a flip that makes or
removes a newline shifts the physical numbering; findings are mapped back):

* the flipped line is no longer a valid entry: ``damaged_entry`` on it (the next entry's
  ``prev_hash`` names the line's original bytes, not the previous valid entry), or
  ``torn_tail`` when it is the last line;
* it is still a valid entry, with other bytes: ``hash_mismatch`` on the next line; when
  it is the last line nothing inside the file can show it, and the session's
  ``head_hash`` (what the next audit's checkpoint compares, spec 6) differs;
* a byte became a newline (the line split in two): both parts are bad lines of the
  flipped line (``damaged_entry``, the second ``torn_tail`` at the end of the file);
* the newline itself changed (two lines merged): ``torn_merge`` recovers the second
  entry, whose ``prev_hash`` names the lost first one: ``hash_mismatch``;

and every warning or error is about the flipped line or the next one (``missing_header``,
which has no line, only when the header was hit). The next line is "right" too because
the chain and the tree report a changed entry on its successor: its ``prev_hash`` and
``parent_id`` name the old bytes and id.

The ledger's entry ids differ from each other in at least two bits, so that no single
flip turns one id into another: a flip that does (shown apart below) makes a legitimate
reference to another entry, and the tree reports ``duplicate_id`` on the later copy,
wherever that is.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import fsspec
import pytest

from pipeline.audit.session import SessionAudit, audit_session
from pipeline.io.commit import read_dataset
from pipeline.io.storage import guarded_lines, resolve
from pipeline.ledger.reader import parse_entry
from pipeline.ledger.types import Severity
from pipeline.run.orchestrate import run_audit
from tests.helpers.ledgers import LedgerBuilder, make_id, session_key, split_lines, usage

NL = 0x0A
#: Pairwise at least two bits apart in their last character (1, 2, 4, 7, 8).
IDS = [make_id(n) for n in (1, 2, 4, 7, 8)]


def ledger() -> list[bytes]:
    """Five chained entries, each the child of the one before (a linear tree)."""
    b = LedgerBuilder()
    b.header(ident=IDS[0])
    b.user("list the *.txt files", ident=IDS[1])
    b.assistant("looking", tools=["call_0"], u=usage(100, 10), ident=IDS[2])
    b.tool_results("call_0", content="a.txt b.txt (JSON: Ê)", ident=IDS[3])
    b.assistant("two files", u=usage(150, 20), ident=IDS[4])
    return b.physical()


LINES = ledger()
DATA = b"".join(LINES)
ORIGINAL = audit_session(session_key(), LINES)


@dataclass(frozen=True)
class Flip:
    """One flipped bit: where, and what the flip did to the line structure."""

    offset: int
    bit: int
    line: int  # 1-based line of the original file holding the flipped byte
    case: str  # "bad", "valid", "split", "merge"

    @property
    def data(self) -> bytes:
        out = bytearray(DATA)
        out[self.offset] ^= 1 << self.bit
        return bytes(out)

    def original_line(self, physical: int | None) -> int | None:
        """A line of the flipped file as a line of the original."""
        if physical is None or physical <= self.line:
            return physical
        if self.case == "split":
            return physical - 1
        if self.case == "merge":
            return physical + 1
        return physical


def flips() -> list[Flip]:
    out = []
    start = 0
    for number, line in enumerate(LINES, 1):
        for j, byte in enumerate(line):
            for bit in range(8):
                new = byte ^ (1 << bit)
                if byte == NL:
                    case = "merge"
                elif new == NL:
                    case = "split"
                else:
                    body = bytearray(line[:-1])
                    body[j] = new
                    case = "valid" if parse_entry(bytes(body), number)[0] else "bad"
                out.append(Flip(start + j, bit, number, case))
        start += len(line)
    return out


FLIPS = flips()
LAST = len(LINES)


def audit_flip(flip: Flip) -> tuple[SessionAudit, set[tuple[int | None, str]]]:
    """Audit the flipped file through the IO layer's line iterator; its serious
    findings as ``(original line, code)``."""
    result = audit_session(session_key(), guarded_lines(io.BytesIO(flip.data)))
    serious = {(flip.original_line(f.line), f.code.text) for f in result.findings
               if f.severity >= Severity.WARNING}
    return result, serious


def test_the_ledger_is_clean_and_every_case_occurs() -> None:
    assert not [f for f in ORIGINAL.findings if f.severity >= Severity.WARNING]
    assert ORIGINAL.row["entries"] == LAST
    assert {f.case for f in FLIPS} == {"bad", "valid", "split", "merge"}
    assert len(FLIPS) == 8 * len(DATA)


def expected(flip: Flip) -> set[tuple[int | None, str]]:
    """The findings a flip must raise (others may come with them, on the same lines)."""
    k = flip.line
    if flip.case == "bad":
        return {(k, "damaged_entry" if k < LAST else "torn_tail")}
    if flip.case == "split":
        return {(k, "damaged_entry"), (k, "damaged_entry" if k < LAST else "torn_tail")}
    if flip.case == "merge":
        return {(k, "torn_merge"), (k, "hash_mismatch")} if k < LAST else {(k, "torn_tail")}
    return {(k + 1, "hash_mismatch")} if k < LAST else set()


@pytest.mark.parametrize("number", range(1, LAST + 1))
def test_every_bit_flip_is_reported_on_the_right_line(number: int) -> None:
    for flip in (f for f in FLIPS if f.line == number):
        result, serious = audit_flip(flip)
        where = f"{flip} → {sorted(serious, key=str)}"
        assert expected(flip) <= serious, where
        assert {line for line, _ in serious} <= {flip.line, flip.line + 1, None}, where
        if (None, "missing_header") in serious:
            assert flip.line == 1, where
        if flip.case in ("bad", "split") and flip.line < LAST:
            # classified by its successor, which is not blamed again for the same break
            assert (flip.line + 1, "hash_mismatch") not in serious, where
        if not serious:
            assert flip.case == "valid" and flip.line == LAST, where
            assert result.row["head_hash"] != ORIGINAL.row["head_hash"], where
        # the audit counted every physical line of the flipped file
        assert result.row["lines"] == len(split_lines(flip.data)), where


def test_a_flip_that_makes_one_id_another_is_reported_where_the_copy_is() -> None:
    # '1' (0x31) -> '5' (0x35): the header takes the id of no entry here, but with ids
    # one bit apart it could be the last entry's: then the later copy is the duplicate.
    b = LedgerBuilder()
    b.header(ident=make_id(1))
    b.user("hi", ident=make_id(2))
    b.assistant("hello", ident=make_id(5))
    data = bytearray(b.to_bytes())
    at = data.index(make_id(1).encode()) + len(make_id(1)) - 1
    data[at] ^= 0x04
    result = audit_session(session_key(), split_lines(bytes(data)))
    found = {(f.line, f.code.text) for f in result.findings if f.severity >= Severity.ERROR}
    assert found == {(2, "hash_mismatch"), (2, "orphan_parent"), (3, "duplicate_id")}


def test_a_run_over_flipped_copies_completes_with_a_row_for_each(
        memfs: fsspec.AbstractFileSystem) -> None:
    sample = FLIPS[::41]
    root = resolve("memory://flips/archive")
    for i, flip in enumerate(sample):
        memfs.pipe_file(root.join(session_key(session_id=f"flip-{i:05d}").path), flip.data)
    out = resolve("memory://flips/out")
    summary = run_audit(root, out, progress=False)
    assert summary.sessions == sum(summary.statuses.values()) == len(sample)
    sessions = read_dataset(out, "integrity/sessions")
    assert sessions.num_rows == len(sample)
    assert sorted(sessions["lines"].to_pylist()) == sorted(
        len(split_lines(f.data)) for f in sample)
