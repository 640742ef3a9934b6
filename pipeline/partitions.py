"""Per-partition functions: what one Dask task does to one batch of sessions.

Module-level and picklable. They read through :mod:`pipeline.io.storage`, run the pure
audit, and return Arrow tables; they never write output (the client commits it), so
workers need read access to the archive only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from pipeline.audit import SessionAudit, audit_session
from pipeline.io.storage import Location, SessionObject, open_lines, storage_errors
from pipeline.io.tables import findings_table, sessions_table
from pipeline.reader import MAX_DETAIL_CHARS
from pipeline.types import Code, Finding, Status


@dataclass
class BatchResult:
    """What one audit task sends back: its two tables and a few counts."""

    index: int
    sessions: pa.Table
    findings: pa.Table
    bytes_read: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    #: Further datasets of the run (replay: ``turns``, ``requests``), by name.
    extra: dict[str, pa.Table] = field(default_factory=dict)
    #: Files the task wrote under the run's staging folder (compacted ledgers), by dataset.
    files: dict[str, list[str]] = field(default_factory=dict)


def unreadable(obj: SessionObject, err: BaseException) -> SessionAudit:
    """The audit of an object that could not be read: one error finding, no figures."""
    text = f"{type(err).__name__}: {err}".splitlines()[0][:MAX_DETAIL_CHARS]
    finding = Finding(Code.UNREADABLE_OBJECT, None, None, text)
    row = {
        "session_path": obj.key.path,
        "agent": obj.key.agent,
        "cwd_hash": obj.key.cwd_hash,
        "bytes": obj.size,
        "status": Status.ERROR.value,
        "errors": 1,
        "warnings": 0,
        "infos": 0,
    }
    return SessionAudit(row, [finding])


def audit_object(root: Location, obj: SessionObject) -> SessionAudit:
    """Audit one session object, streaming it; a read failure becomes a finding."""
    try:
        with open_lines(root, obj) as lines:
            result = audit_session(obj.key, lines, size=obj.size)
    except storage_errors() as err:
        return unreadable(obj, err)
    result.row["etag"] = obj.etag
    return result


def audit_batch(root: Location, index: int, batch: list[SessionObject]) -> BatchResult:
    """Audit a batch of whole sessions; the unit of work of one Dask task.

    Parameters
    ----------
    root:
        The archive root (rebuilt into a filesystem on the worker).
    index:
        The batch's position in the run's plan; it names the output part.
    batch:
        The sessions to audit, in path order.
    """
    return audit_batch_result(index, batch, [audit_object(root, obj) for obj in batch])


def audit_batch_result(index: int, batch: list[SessionObject],
                       audits: list[SessionAudit]) -> BatchResult:
    """The integrity tables and counts of a batch's audits."""
    result = BatchResult(
        index,
        sessions_table([a.row for a in audits]),
        findings_table((a.row["session_path"], f) for a in audits for f in a.findings),
        bytes_read=sum(obj.size for obj in batch),
    )
    for a in audits:
        result.statuses[a.row["status"]] += 1
        result.codes.update(f.code.text for f in a.findings)
    return result
