"""Row 2: a torn tail cut at every byte of the last line.

A crash mid-append leaves the first ``c`` bytes of the last entry, for every ``c`` from
1 to the whole entry without its newline. Expected (spec 2.1 and docs/audit.md):

* the fragment is ``torn_tail`` (warning) on the last line, and nothing else is
  reported; every earlier entry is read, with the same digest, tree and figures as in
  the intact file (the cut costs the torn entry only);
* ``c`` = the whole entry, newline missing: the entry is read too (``torn_tail`` still
  says the append was cut short);
* vak's next append written straight onto the fragment (its torn merge): one
  ``torn_merge`` (warning) on that line, the appended entry recovered and chained to the
  last complete entry; with the whole first entry there (only its newline lost), both
  entries are recovered.

Each cut is read through the IO layer's line iterator, as an audit task reads a file.
"""

from __future__ import annotations

import io

import pytest

from pipeline.audit.session import SessionAudit, audit_session
from pipeline.io.storage import guarded_lines
from pipeline.ledger.reader import Entry, read_ledger
from tests.helpers.ledgers import LedgerBuilder, sample_session, session_key, sha


def session() -> LedgerBuilder:
    """Two turns of tool use (receipts, results, answers); the last line is a long
    assistant answer with multi-byte text, so cuts land inside UTF-8 sequences too."""
    b = sample_session(turns=2)
    b.assistant("Résumé: tout va bien — 两个服务都正常 ✓ " * 8, u={"input_tokens": 9,
                                                         "output_tokens": 3})
    return b


BUILDER = session()
LINES = BUILDER.physical()
HEAD, LAST = b"".join(LINES[:-1]), LINES[-1][:-1]
INTACT = audit_session(session_key(), LINES[:-1])
ENTRIES_BEFORE = [e for e in read_ledger(LINES[:-1]) if isinstance(e, Entry)]


def audit(data: bytes) -> SessionAudit:
    return audit_session(session_key(), guarded_lines(io.BytesIO(data)))


def entries(data: bytes) -> list[Entry]:
    return [e for e in read_ledger(guarded_lines(io.BytesIO(data))) if isinstance(e, Entry)]


def appended(prev_hash: str) -> bytes:
    """The entry vak appends next, chained to ``prev_hash`` (a whole line)."""
    b = LedgerBuilder()
    b.tail_id, b.tail_hash = ENTRIES_BEFORE[-1].id, prev_hash
    b._n = 100
    b.user("carry on")
    return b.physical()[0]


def test_the_intact_prefix_is_clean() -> None:
    assert [f for f in INTACT.findings if f.severity.label != "info"] == []
    assert len(LAST) > 400 and any(byte >= 0x80 for byte in LAST)


@pytest.mark.parametrize("part", range(4))
def test_a_tail_torn_at_every_byte_is_torn_tail_and_nothing_else(part: int) -> None:
    n = len(LINES)
    for cut in range(1 + part, len(LAST) + 1, 4):
        data = HEAD + LAST[:cut]
        result = audit(data)
        where = f"cut at byte {cut} of {len(LAST)}"
        assert [(f.line, f.code.text) for f in result.findings] == [(n, "torn_tail")], where
        read = entries(data)
        # every earlier entry is read, byte for byte
        assert [e.digest for e in read[: n - 1]] == [e.digest for e in ENTRIES_BEFORE], where
        if cut < len(LAST):
            assert len(read) == n - 1, where
            for column in ("entries", "head_id", "head_hash", "active_chain_len", "turns",
                           "requests", "input_tokens", "output_tokens"):
                assert result.row[column] == INTACT.row[column], (where, column)
        else:
            # the whole entry, only its newline missing: it is read as well
            assert len(read) == n and read[-1].digest == sha(LAST), where
        assert result.row["lines"] == n and result.row["bytes"] == len(data), where


@pytest.mark.parametrize("part", range(4))
def test_the_next_append_onto_a_torn_tail_is_a_torn_merge_and_recovered(part: int) -> None:
    n = len(LINES)
    for cut in range(1 + part, len(LAST) + 1, 4):
        whole = cut == len(LAST)
        # vak chains its next append to the last line it could parse
        nxt = appended(sha(LAST) if whole else ENTRIES_BEFORE[-1].digest)
        data = HEAD + LAST[:cut] + nxt
        result = audit(data)
        where = f"cut at byte {cut} of {len(LAST)}"
        assert [(f.line, f.code.text) for f in result.findings] == [(n, "torn_merge")], where
        read = entries(data)
        assert [e.digest for e in read[: n - 1]] == [e.digest for e in ENTRIES_BEFORE], where
        assert read[-1].digest == sha(nxt[:-1]) and read[-1].line == n, where
        assert len(read) == (n + 1 if whole else n), where
