"""The replay's second pass over a spooled ledger (replay_batches.active_entries):
the active chain's entries as the reader gives them, whatever damage the ledger holds."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pipeline.audit.session import SessionAudit, audit_session
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import Entry, reread_entry
from pipeline.ledger.types import Code
from pipeline.run.replay_batches import active_entries
from pipeline.synth.generator import generate_fleet
from tests.helpers.data_paths import CONFORMANCE
from tests.helpers.ledgers import LedgerBuilder, audit_bytes, read_bytes, sample_session

CORPUS: Path = CONFORMANCE / "corpus"


def expected(data: bytes, active: frozenset[tuple[int, str]]) -> list[Entry]:
    """The active entries the reader finds, without their digests."""
    entries, _ = read_bytes(data)
    return [e._replace(digest="") for e in entries if (e.line, e.id) in active]


def second_pass(data: bytes, audit: SessionAudit) -> list[Entry]:
    """What the replay reads (a digest or none: it uses none)."""
    return [e._replace(digest="") for e in active_entries(io.BytesIO(data), audit)]


def test_generated_sessions_with_every_fault() -> None:
    for session in generate_fleet(80, seed=5, faults=True, consistent=False):
        data = b"".join(session.lines())
        key = parse_session_path(session.path)
        assert key is not None
        kept: list[Entry] = []
        audit = audit_session(key, io.BytesIO(data), keep=kept)
        assert second_pass(data, audit) == expected(data, audit.active), session.path
        # A small session's entries, kept from the audit: the same, digests and all.
        assert list(active_entries(io.BytesIO(b""), audit, kept=kept)) == [
            e for e in read_bytes(data)[0] if (e.line, e.id) in audit.active]


def test_torn_merge_takes_the_reader_path() -> None:
    b = sample_session(LedgerBuilder())
    lines = [w.data for w in b.lines]
    # Two entries on one line (the newline between them lost), and a torn fragment.
    data = b"\n".join([*lines[:3], lines[3] + lines[4], b'{"id":"x","par' + lines[5],
                       *lines[6:]]) + b"\n"
    audit = audit_bytes(data)
    assert any(f.code is Code.TORN_MERGE for f in audit.findings)
    got = second_pass(data, audit)
    assert got == expected(data, audit.active)
    assert len(got) == len(audit.active)


def test_reread_entry_reads_the_work_quirk_as_work() -> None:
    body = (b'{"id":"w1","parent_id":"h","ts":"2026-01-01T00:00:00Z","kind":"work",'
            b'"kind":{"type":"step"}}')
    entry = reread_entry(body, 7)
    assert (entry.line, entry.id, entry.kind, entry.digest) == (7, "w1", "work", "")
    with pytest.raises(ValueError):
        reread_entry(b'{"id":"x"', 1)


def test_conformance_corpus() -> None:
    for path in sorted(CORPUS.rglob("*.jsonl")):
        key = parse_session_path(path.relative_to(CORPUS).as_posix())
        if key is None:
            continue
        data = path.read_bytes()
        audit = audit_session(key, io.BytesIO(data))
        assert second_pass(data, audit) == expected(data, audit.active), path
