"""Per-partition functions: what one Dask task does to one batch of sessions.

Module-level and picklable. They read through :mod:`pipeline.io.storage`, run the pure
audit, and return Arrow tables; they never write output (the client commits it), so
workers need read access to the archive only.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from pipeline.audit import SessionAudit, audit_session, verdict
from pipeline.errors import ObjectChangedError, PipelineError
from pipeline.io.storage import (
    MAX_LINE_BYTES,
    Location,
    SessionObject,
    open_lines,
    refresh_object,
    storage_errors,
)
from pipeline.io.tables import findings_table, sessions_table, subagents_table, usage_table
from pipeline.layout import SessionKey
from pipeline.reader import MAX_DETAIL_CHARS
from pipeline.types import Code, Finding


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


#: Codes of a session that was not audited at all (no figures): a run with any is partial.
NOT_READ_CODES = frozenset({Code.UNREADABLE_OBJECT.text, Code.CHANGED_DURING_AUDIT.text,
                            Code.WORKER_CRASHED.text, Code.AUDIT_FAILED.text})

#: Errors never contained per object: those vakpipe raises on purpose (a summariser that
#: fails, the output's storage: they stop the run, exit 2) and running out of memory.
#: Exceptions outside :class:`Exception` (``KeyboardInterrupt``, ``SystemExit``, a
#: cancelled task) are never caught at all.
UNCONTAINED: tuple[type[BaseException], ...] = (PipelineError, MemoryError)


def unreadable(obj: SessionObject, err: BaseException) -> SessionAudit:
    """The audit of an object that could not be read: one error finding, no figures."""
    return not_audited(obj.key, obj.size,
                       Finding(Code.UNREADABLE_OBJECT, None, None, _error_text(err)))


def changed(obj: SessionObject, err: BaseException) -> SessionAudit:
    """The audit of an object that changed under both reads: one warning, no figures."""
    return not_audited(obj.key, obj.size,
                       Finding(Code.CHANGED_DURING_AUDIT, None, None, _error_text(err)))


def failed(obj: SessionObject, err: Exception) -> SessionAudit:
    """The audit of an object whose audit or replay raised: a bug (or an input no test
    foresaw), not a storage error. One error finding naming the exception and where it
    was raised, no figures; nothing else of the object is kept."""
    return not_audited(obj.key, obj.size,
                       Finding(Code.AUDIT_FAILED, None, None, _failure_text(err)))


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".splitlines()[0][:MAX_DETAIL_CHARS]


_PACKAGE = Path(__file__).resolve().parent


def _failure_text(err: BaseException) -> str:
    """``TypeError at pipeline/audit.py:98 (is_directive): <message>``: the innermost
    frame of vakpipe's own code (the last one when none is), then the message."""
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(_PACKAGE)]
    where = ""
    if ours or frames:
        frame = (ours or frames)[-1]
        path = Path(frame.filename).resolve()
        name = (f"pipeline/{path.relative_to(_PACKAGE).as_posix()}"
                if path.is_relative_to(_PACKAGE) else path.name)
        where = f" at {name}:{frame.lineno} ({frame.name})"
    message = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}{where}: {message}"[:MAX_DETAIL_CHARS]


def read_consistently(root: Location, obj: SessionObject,
                      read: Callable[[SessionObject], SessionAudit]) -> tuple[SessionAudit, bool]:
    """``read(obj)``, the audit of one version of the object; whether it was read.

    ``read`` audits the version it is given and raises
    :class:`~pipeline.errors.ObjectChangedError` when the object is another by the time
    it is opened or read. Then the object is looked up again and read once more, as the
    version found (the audit's row names that version: its ETag and size); a second
    change makes it ``changed_during_audit``, nothing kept of the partial read (a live
    object: the next run audits it). A storage error, on either read or on the
    look-up, makes it ``unreadable_object``; any other exception of ``read`` (a bug)
    ``audit_failed`` (but those of :data:`UNCONTAINED`, which propagate). Those
    findings come with no figures and ``False``.
    """
    first = _read_once(lambda: read(obj), obj)
    if not isinstance(first, ObjectChangedError):
        return first

    def again() -> SessionAudit:
        nonlocal obj
        obj = refresh_object(root, obj)
        return read(obj)

    second = _read_once(again, obj)
    return (changed(obj, second), False) if isinstance(second, ObjectChangedError) else second


def _read_once(attempt: Callable[[], SessionAudit],
               obj: SessionObject) -> tuple[SessionAudit, bool] | ObjectChangedError:
    """One read of :func:`read_consistently`, its failures as findings (the change of
    the object under it returned, for the caller to decide)."""
    try:
        return attempt(), True
    except ObjectChangedError as err:
        return err
    except storage_errors() as err:
        return unreadable(obj, err), False
    except UNCONTAINED:
        raise
    except Exception as err:
        return failed(obj, err), False


def not_audited(key: SessionKey, size: int, finding: Finding) -> SessionAudit:
    """The row of a session reported without reading it (unreadable, missing)."""
    row = {"session_path": key.path, "agent": key.agent, "cwd_hash": key.cwd_hash,
           "parent_session_path": key.parent, "subagent": key.subagent,
           "bytes": size, **verdict([finding])}
    return SessionAudit(row, [finding])


def audit_object(root: Location, obj: SessionObject,
                 max_line_bytes: int = MAX_LINE_BYTES) -> SessionAudit:
    """Audit one session object, streaming it; a read failure becomes a finding, a line
    over ``max_line_bytes`` a line that is not a valid entry, an object that changed
    under the read is read once more, an audit that raises is ``audit_failed`` (see
    :func:`read_consistently`)."""
    def read(version: SessionObject) -> SessionAudit:
        with open_lines(root, version, max_line_bytes=max_line_bytes) as lines:
            result = audit_session(version.key, lines, size=version.size)
        result.row["etag"] = version.etag
        return result

    return read_consistently(root, obj, read)[0]


def audit_batch(root: Location, index: int, batch: list[SessionObject],
                max_line_bytes: int = MAX_LINE_BYTES) -> BatchResult:
    """Audit a batch of whole sessions; the unit of work of one Dask task.

    Parameters
    ----------
    root:
        The archive root (rebuilt into a filesystem on the worker).
    index:
        The batch's position in the run's plan; it names the output part.
    batch:
        The sessions to audit, in path order.
    max_line_bytes:
        The longest line read (``--max-line-bytes``).
    """
    return audit_batch_result(index, batch,
                              [audit_object(root, obj, max_line_bytes) for obj in batch])


def audit_batch_result(index: int, batch: list[SessionObject],
                       audits: list[SessionAudit]) -> BatchResult:
    """The integrity tables (sessions, findings, usage) and counts of a batch's audits."""
    result = BatchResult(
        index,
        sessions_table([a.row for a in audits]),
        findings_table((a.row["session_path"], f) for a in audits for f in a.findings),
        bytes_read=sum(obj.size for obj in batch),
    )
    result.extra["usage"] = usage_table(audits)
    result.extra["subagents"] = subagents_table(audits)
    for a in audits:
        result.statuses[a.row["status"]] += 1
        result.codes.update(f.code.text for f in a.findings)
    return result


def quarantined(index: int, obj: SessionObject, detail: str) -> BatchResult:
    """The result of a session that was never audited because every worker that ran it
    died (computed on the client): a ``worker_crashed`` row, no figures."""
    audit = not_audited(obj.key, obj.size, Finding(Code.WORKER_CRASHED, None, None, detail))
    return audit_batch_result(index, [obj], [audit])
