"""The audit of a record-segment ledger (docs/segments.md). Pure.

A segment ledger reaches the audit as the lines of its JSONL projection
(:class:`~pipeline.ledger.segments.SegmentLines`): opened with its key, they are audited
as any vak ledger (tree, turns, usage), and the segments' own findings join the
projection's. Without the key (or for a shredded scope) nothing of the content is read:
the row counts the frames as the ledger's entries, its token figures are null (never a
silent zero), ``content`` says ``sealed`` and one ``usage`` row of kind ``sealed`` stands
for the usage that could not be read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pipeline.audit.session import USAGE_FIELDS, SessionAudit, audit_session, verdict
from pipeline.ledger.layout import SessionKey
from pipeline.ledger.reader import Entry
from pipeline.ledger.segments import SegmentLines, SegmentReport
from pipeline.ledger.types import Code

#: Segment findings after which some entries of the ledger could not be read.
LOSSES = frozenset({Code.FRAME_LENGTH, Code.FRAME_UNREADABLE, Code.SEALED_SEGMENT_MALFORMED,
                    Code.SEGMENT_DROPPED, Code.SEGMENT_MISSING})
#: Tree findings that entries lost with a segment (or a frame) explain: the segment's
#: finding already says so, and these would be false alarms beside it.
EXPLAINED = frozenset({Code.MISSING_HEADER, Code.HEADER_NOT_FIRST, Code.ORPHAN_PARENT,
                       Code.UNCHAINED})


def audit_lines(key: SessionKey, lines: Iterable[bytes], size: int | None = None,
                keep: list[Entry] | None = None) -> SessionAudit:
    """:func:`~pipeline.audit.session.audit_session`, or for a segment ledger's lines
    (:class:`~pipeline.ledger.segments.SegmentLines`) :func:`audit_segments`; the row
    says the ledger's ``storage`` either way."""
    if isinstance(lines, SegmentLines):
        return audit_segments(key, lines, size, keep)
    audit = audit_session(key, lines, size=size, keep=keep)
    audit.row["storage"] = key.storage
    return audit


def audit_segments(key: SessionKey, lines: SegmentLines, size: int | None = None,
                   keep: list[Entry] | None = None) -> SessionAudit:
    """Audit a segment ledger from its projection's lines and its segments' report."""
    audit = audit_session(key, lines, size=size, keep=keep)
    report = lines.report  # complete: the audit consumed every line
    if report.content == "sealed":
        if keep is not None:
            keep.clear()
        audit = sealed_audit(key, report, size)
    else:
        lost = any(f.code in LOSSES for f in report.findings)
        kept = [f for f in audit.findings if not (lost and f.code in EXPLAINED)]
        audit.findings[:] = report.findings + kept
        audit.row.update(verdict(audit.findings))
    audit.row["storage"] = key.storage
    audit.row["content"] = report.content
    return audit


def sealed_audit(key: SessionKey, report: SegmentReport, size: int | None) -> SessionAudit:
    """The row of a ledger whose content could not be opened: integrity only."""
    row: dict[str, Any] = {
        "session_path": key.path, "source": "vak", "agent": key.agent,
        "cwd_hash": key.cwd_hash, "session_id": None, "parent_session_path": key.parent,
        "subagent": key.subagent, "bytes": size, "lines": report.frames,
        "entries": report.frames, "head_hash": report.head, **verdict(report.findings),
    }
    usage = dict.fromkeys(USAGE_FIELDS)
    usage.update(kind="sealed", billed=False, effective=False)
    return SessionAudit(row, list(report.findings), usage=[tuple(usage.values())])


