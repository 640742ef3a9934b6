"""Checkpoints between audits (spec section 6): the prefix hasher, the checks against a
previous checkpoint, and the classification of listed objects. Pure: bytes in memory.

A "night" here is what a nightly run does to one object: stream its physical lines
through a :class:`PrefixHasher` while the audit reads them, then check the previous
checkpoint and take the new one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.audit.checkpoint import (
    Change,
    Checkpoint,
    PrefixHasher,
    checkpoint_of,
    classify,
    missing_finding,
)
from pipeline.audit.session import audit_session
from pipeline.ledger.types import Code, Severity
from tests.helpers.ledgers import LedgerBuilder, sample_session, session_key, sha, split_lines

PATH = session_key().path
PROPERTY = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def night(data: bytes, previous: Checkpoint | None = None,
          etag: str | None = "e1") -> tuple[Checkpoint, list[str]]:
    """Audit ``data`` with its lines hashed on the way: the new checkpoint and the codes
    of the history findings against ``previous``."""
    hasher = PrefixHasher(previous.verified_bytes if previous else None)

    def tee() -> Iterator[bytes]:
        for line in split_lines(data):
            hasher.update(line)
            yield line

    audit = audit_session(session_key(), tee(), size=len(data))
    audit.row["etag"] = etag
    found = hasher.findings(previous) if previous is not None else []
    return checkpoint_of(PATH, hasher, audit.row), [f.code.text for f in found]


def feed(data: bytes, check_at: int | None) -> PrefixHasher:
    """A hasher that has seen ``data``'s physical lines (no audit)."""
    hasher = PrefixHasher(check_at)
    for line in split_lines(data):
        hasher.update(line)
    return hasher


@pytest.fixture
def ledger() -> LedgerBuilder:
    """A small valid session: header and two turns of tool use (15 lines)."""
    return sample_session()


# -- the checkpoint a night takes ------------------------------------------------------


def test_checkpoint_records_what_was_verified(ledger: LedgerBuilder) -> None:
    data = ledger.to_bytes()
    cp, found = night(data)
    assert found == []
    assert cp.session_path == PATH
    assert cp.verified_bytes == cp.size == len(data)
    assert cp.prefix_sha256 == hashlib.sha256(data).hexdigest()
    assert cp.entries == len(ledger.lines)
    assert cp.head_hash == sha(ledger.bodies()[-1])
    assert cp.etag == "e1"
    assert Checkpoint.from_row(cp.as_row()) == cp


def test_a_torn_last_line_is_not_verified_history(ledger: LedgerBuilder) -> None:
    clean = ledger.to_bytes()
    cp, _ = night(clean + b'{"id":"0199a1f2-6a00-7000-8000-0000000000ff","par')
    assert cp.verified_bytes == len(clean)
    assert cp.prefix_sha256 == hashlib.sha256(clean).hexdigest()


# -- the checks against the previous checkpoint ----------------------------------------


def test_clean_growth_is_no_finding(ledger: LedgerBuilder) -> None:
    before, _ = night(ledger.to_bytes())
    ledger.user("and now?")
    ledger.assistant("now this")
    after, found = night(ledger.to_bytes(), before, etag="e2")
    assert found == []
    assert after.verified_bytes > before.verified_bytes
    assert after.entries == before.entries + 2


def test_unchanged_content_is_no_finding(ledger: LedgerBuilder) -> None:
    before, _ = night(ledger.to_bytes())
    after, found = night(ledger.to_bytes(), before, etag="e2")  # e.g. touched: new mtime
    assert found == [] and after.prefix_sha256 == before.prefix_sha256


def test_shorter_object_is_history_truncated(ledger: LedgerBuilder) -> None:
    data = ledger.to_bytes()
    before, _ = night(data)
    lines = split_lines(data)
    # The last whole line dropped: the file is still perfectly valid on its own.
    after, found = night(b"".join(lines[:-1]), before, etag="e2")
    assert found == ["history_truncated"]
    assert after.verified_bytes == len(data) - len(lines[-1])
    # Cut mid-line too, and down to nothing.
    assert night(data[:-5], before)[1] == ["history_truncated"]
    assert night(b"", before)[1] == ["history_truncated"]


def test_same_length_other_head_is_history_rewritten(ledger: LedgerBuilder) -> None:
    data = ledger.to_bytes()
    before, _ = night(data)
    # One character of the head line flipped: same length, another head hash.
    at = data.rindex(b'"purpose":"execute"') + len(b'"purpose":"')
    edited = data[:at] + b"E" + data[at + 1:]
    assert len(edited) == len(data)
    after, found = night(edited, before, etag="e2")
    assert found == ["history_rewritten"]
    assert after.head_hash != before.head_hash
    hasher = feed(edited, before.verified_bytes)
    [finding] = hasher.findings(before)
    assert finding.code is Code.HISTORY_REWRITTEN and finding.severity is Severity.ERROR
    assert "same length" in finding.detail


def test_prefix_edited_then_appended_is_history_rewritten(ledger: LedgerBuilder) -> None:
    data = ledger.to_bytes()
    before, _ = night(data)
    edited = data.replace(b"what is the weather #0", b"what is the weather #9", 1)
    assert len(edited) == len(data) and edited != data
    ledger.user("more")
    grown = edited + ledger.physical()[-1]
    _, found = night(grown, before, etag="e2")
    assert found == ["history_rewritten"]
    [finding] = feed(grown, before.verified_bytes).findings(before)
    assert f"first {before.verified_bytes:,} bytes" in finding.detail


def test_torn_tail_completed_by_the_next_write_is_no_finding(ledger: LedgerBuilder) -> None:
    clean = ledger.to_bytes()
    ledger.user("the next directive")
    complete = ledger.physical()[-1]
    torn = clean + complete[:40]
    before, _ = night(torn)
    assert before.verified_bytes == len(clean)
    # The append completed (the same line, now whole) ...
    _, found = night(clean + complete, before, etag="e2")
    assert found == []
    # ... or vak's next append written straight onto the fragment (a torn merge).
    _, found = night(torn + complete, before, etag="e3")
    assert found == []


def test_nothing_verified_before_is_no_finding() -> None:
    # An empty object (or one that held only a torn line) verified nothing: whatever it
    # holds now, even nothing at all, extends that.
    before, _ = night(b"")
    assert before.verified_bytes == 0
    assert night(b"", before, etag="e2")[1] == []
    assert night(b'{"id":"x"', before, etag="e2")[1] == []
    torn_only, _ = night(b'{"id":"x"')
    assert torn_only.verified_bytes == 0
    assert night(b"", torn_only, etag="e2")[1] == []


def test_check_point_inside_a_line_of_the_new_content(ledger: LedgerBuilder) -> None:
    # The previous checkpoint's boundary need not fall on a line boundary of the new
    # content (a newline edited away joins two lines): the digest is taken at the byte.
    data = ledger.to_bytes()
    before, _ = night(data)
    first_nl = data.index(b"\n")
    joined = data[:first_nl] + b" " + data[first_nl + 1:] + b"tail\n"
    assert night(joined, before)[1] == ["history_rewritten"]
    # And the hasher reports the right digest when the content is unchanged but longer
    # lines straddle the old end.
    hasher = feed(data[:-1] + b"more bytes on the last line\n", before.verified_bytes)
    assert hasher.at_check == hashlib.sha256(data[:-1] + b"m").hexdigest()


# -- properties ------------------------------------------------------------------------


@st.composite
def verified_ledgers(draw: st.DrawFn) -> bytes:
    """A valid session of a few turns, all lines complete."""
    turns = draw(st.integers(min_value=0, max_value=3))
    text = draw(st.text(min_size=0, max_size=30))
    return sample_session(turns=turns, text=text).to_bytes()


@PROPERTY
@given(verified_ledgers(), st.data(), st.binary(max_size=200))
def test_any_single_byte_edit_in_the_verified_prefix_then_any_append_is_detected(
    data: bytes, draw: st.DataObject, append: bytes
) -> None:
    before, _ = night(data)
    at = draw.draw(st.integers(min_value=0, max_value=before.verified_bytes - 1), label="at")
    value = draw.draw(st.integers(0, 255).filter(lambda b: b != data[at]), label="byte")
    edited = data[:at] + bytes([value]) + data[at + 1:] + append
    hasher = feed(edited, before.verified_bytes)
    assert [f.code for f in hasher.findings(before)] == [Code.HISTORY_REWRITTEN]


@PROPERTY
@given(verified_ledgers(), st.binary(max_size=300))
def test_any_append_to_the_verified_prefix_is_no_finding(data: bytes, append: bytes) -> None:
    before, _ = night(data)
    assert feed(data + append, before.verified_bytes).findings(before) == []


@PROPERTY
@given(verified_ledgers(), st.data())
def test_any_cut_inside_the_verified_prefix_is_history_truncated(
    data: bytes, draw: st.DataObject
) -> None:
    before, _ = night(data)
    cut = draw.draw(st.integers(min_value=0, max_value=before.verified_bytes - 1))
    assert [f.code for f in feed(data[:cut], before.verified_bytes).findings(before)] == [
        Code.HISTORY_TRUNCATED]


# -- classify, and the findings of sessions not read -------------------------------------


def checkpoint(etag: str | None = "abc", size: int = 100) -> Checkpoint:
    return Checkpoint(PATH, 90, "0" * 64, 3, "1" * 64, etag, size)


def test_classify() -> None:
    assert classify(100, "abc", None) is Change.NEW
    assert classify(100, None, None) is Change.NEW
    assert classify(100, "abc", checkpoint()) is Change.UNCHANGED
    assert classify(101, "abc", checkpoint()) is Change.CHANGED  # same ETag, other size
    assert classify(100, "abd", checkpoint()) is Change.CHANGED  # same size, other ETag
    # No ETag on either side: size alone cannot show bytes rewritten in place.
    assert classify(100, None, checkpoint()) is Change.CHANGED
    assert classify(100, None, checkpoint(etag=None)) is Change.CHANGED
    assert classify(100, "abc", checkpoint(etag=None)) is Change.CHANGED


def test_reread_drops_only_the_etag() -> None:
    cp = checkpoint()
    again = cp.reread()
    assert again.etag is None
    assert {k: v for k, v in again.as_row().items() if k != "etag"} == \
        {k: v for k, v in cp.as_row().items() if k != "etag"}
    assert classify(cp.size, cp.etag, again) is Change.CHANGED


def test_missing_finding() -> None:
    finding = missing_finding(checkpoint())
    assert finding.code is Code.SESSION_MISSING and finding.severity is Severity.ERROR
    assert finding.line is None and "no longer in the archive" in finding.detail


def test_a_checkpoint_row_of_a_table_without_the_segments_column_reads() -> None:
    # A baseline written before segment ledgers had checkpoints of their own.
    row = checkpoint("e1", 90).as_row()
    del row["segments"]
    assert Checkpoint.from_row(row) == checkpoint("e1", 90)
    assert Checkpoint.from_row({**row, "segments": "{}"}).segments == "{}"
