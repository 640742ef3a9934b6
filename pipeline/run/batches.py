"""Per-batch functions: what one Dask task does to one batch of sessions.

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
from typing import IO

import pyarrow as pa

from pipeline.audit.checkpoint import PrefixHasher
from pipeline.audit.segments import audit_lines
from pipeline.audit.session import SessionAudit, verdict
from pipeline.errors import ObjectChangedError, PipelineError
from pipeline.io.storage import (
    MAX_LINE_BYTES,
    Location,
    ReadAhead,
    SessionObject,
    Tap,
    endpoint_unreachable,
    open_lines,
    refresh_object,
    storage_errors,
)
from pipeline.ledger.layout import SessionKey
from pipeline.ledger.reader import MAX_DETAIL_CHARS, Entry
from pipeline.ledger.redact import quote
from pipeline.ledger.segments import SegmentCheckpoint, SegmentLines, SegmentReport
from pipeline.ledger.types import Code, Finding
from pipeline.run.collector import cyclic_gc_paused
from pipeline.tables.schemas import findings_table, sessions_table, subagents_table, usage_table

#: A session up to this size keeps its parsed entries from the audit for the replay
#: (~10 times its bytes in memory); a larger one is parsed again from the spool.
KEEP_ENTRIES_BYTES = 4 * 2**20


@dataclass(frozen=True)
class RunContext:
    """What the runner settles for one run, built once and shipped with every task.

    What the user asked travels apart (:class:`~pipeline.run.replay_batches.ReplayOptions`,
    built once by the CLI or the job and never written into); this is what only the
    run knows. The checkpoints of a nightly differ per batch: they travel beside it.
    """

    #: The run's id (the manifest's, the staging folder's name).
    run_id: str = ""
    #: Lines longer than this are skipped unread and reported (``--max-line-bytes``).
    max_line_bytes: int = MAX_LINE_BYTES
    #: Where the workers write compacted copies: the run's staging folder for them, set
    #: only when the run writes an archive (``compact --write-archive``).
    staging: Location | None = None
    #: The run's start, stamped on the packets of the compacted copies.
    run_ns: int = 0


@dataclass
class BatchResult:
    """What one audit task sends back: its two tables and a few counts."""

    index: int
    sessions: pa.Table
    findings: pa.Table
    bytes_read: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    #: Further datasets of the run (``usage``; replay: ``turns``, ``requests``), by name.
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

#: Objects in a row of one task's batch whose read could not connect to the storage
#: endpoint at all (refused, connect timeout, unknown host; see
#: :func:`~pipeline.io.storage.endpoint_unreachable`) after which the task stops trying:
#: the rest of its batch is reported not read without a request. Each failed object
#: costs the whole retry budget (seconds to tens of seconds with the S3 defaults), so a
#: dead endpoint used to hold a run for minutes per batch; three in a row tell a dead
#: endpoint from a flaky one (any answer, even an error, starts the count again).
MAX_CONNECTION_FAILURES = 3


@dataclass
class EndpointWatch:
    """Counts the objects in a row of one task's batch that could not reach the storage
    endpoint (:data:`MAX_CONNECTION_FAILURES`)."""

    limit: int = MAX_CONNECTION_FAILURES
    failures: int = 0
    #: The last such failure, quoted in the findings of the objects not attempted.
    last: str = ""
    #: Whether the endpoint answered a read of this batch yet.
    answered: bool = False

    def saw(self, err: BaseException | None) -> None:
        """Count one object's outcome: ``err``, the storage error its read ended with,
        or ``None`` when the endpoint answered (the object read or not)."""
        if err is not None and endpoint_unreachable(err):
            self.failures += 1
            self.last = _error_text(err)
        else:
            self.failures = 0
            self.answered = True

    def reachable(self) -> bool:
        """Whether the endpoint is known to answer: it answered, and the last read
        reached it (what a :class:`~pipeline.io.storage.ReadAhead` waits for)."""
        return self.answered and not self.failures

    @property
    def dead(self) -> bool:
        """Whether the endpoint is taken for dead: the batch's next objects are skipped."""
        return self.failures >= self.limit


def not_attempted(obj: SessionObject, watch: EndpointWatch) -> SessionAudit:
    """The audit of an object a task did not try to read, its storage endpoint
    unreachable (:class:`EndpointWatch`): ``unreadable_object``, no figures."""
    detail = (f"not read: the storage endpoint was unreachable ({watch.failures} objects in "
              f"a row before it could not connect; last: {watch.last})")
    return not_audited(obj.key, obj.size, Finding(Code.UNREADABLE_OBJECT, None, None,
                                                  quote(detail, MAX_DETAIL_CHARS)))


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
    return quote(f"{type(err).__name__}: {err}".splitlines()[0], MAX_DETAIL_CHARS)


_PACKAGE = Path(__file__).resolve().parents[1]  # pipeline/, above run/


def _failure_text(err: BaseException) -> str:
    """``TypeError at pipeline/audit/session.py:98 (is_directive): <message>``: the innermost
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
    return quote(f"{type(err).__name__}{where}: {message}", MAX_DETAIL_CHARS)


def read_consistently(root: Location, obj: SessionObject,
                      read: Callable[[SessionObject], SessionAudit],
                      watch: EndpointWatch | None = None) -> tuple[SessionAudit, bool]:
    """``read(obj)``, the audit of one version of the object; whether it was read.

    ``read`` audits the version it is given and raises
    :class:`~pipeline.errors.ObjectChangedError` when the object is another by the time
    it is opened or read. Then the object is looked up again and read once more, as the
    version found (the audit's row names that version: its ETag and size); a second
    change makes it ``changed_during_audit``, nothing kept of the partial read (a live
    object: the next run audits it). A storage error, on either read or on the
    look-up, makes it ``unreadable_object``; any other exception of ``read`` (a bug)
    ``audit_failed`` (but those of :data:`UNCONTAINED`, which propagate). Those
    findings come with no figures and ``False``. ``watch`` counts the reads that could
    not reach the endpoint (:class:`EndpointWatch`).
    """
    first = _read_once(lambda: read(obj), obj, watch)
    if not isinstance(first, ObjectChangedError):
        return first

    def again() -> SessionAudit:
        nonlocal obj
        obj = refresh_object(root, obj)
        return read(obj)

    second = _read_once(again, obj, watch)
    return (changed(obj, second), False) if isinstance(second, ObjectChangedError) else second


def _read_once(attempt: Callable[[], SessionAudit], obj: SessionObject,
               watch: EndpointWatch | None = None
               ) -> tuple[SessionAudit, bool] | ObjectChangedError:
    """One read of :func:`read_consistently`, its failures as findings (the change of
    the object under it returned, for the caller to decide); ``watch`` sees whether it
    reached the endpoint."""
    failure: BaseException | None = None
    try:
        return attempt(), True
    except ObjectChangedError as err:
        return err
    except storage_errors() as err:
        failure = err
        return unreadable(obj, err), False
    except UNCONTAINED:
        raise
    except Exception as err:
        return failed(obj, err), False
    finally:
        if watch is not None:
            watch.saw(failure)


def not_audited(key: SessionKey, size: int, finding: Finding) -> SessionAudit:
    """The row of a session reported without reading it (unreadable, missing)."""
    row = {"session_path": key.path, "agent": key.agent, "cwd_hash": key.cwd_hash,
           "storage": key.storage,
           "parent_session_path": key.parent, "subagent": key.subagent,
           "bytes": size, **verdict([finding])}
    return SessionAudit(row, [finding])


@dataclass
class ObjectRead:
    """One object read through the per-object pipeline (:func:`read_object`)."""

    #: The audit of the version read (its row stamped with that version's ETag), or the
    #: finding that says why it was not read.
    audit: SessionAudit
    #: Whether the object was read (else ``audit`` holds only a finding, no figures).
    read: bool
    #: The entries the audit parsed, when asked to keep them (small objects only).
    kept: list[Entry] | None = None
    #: The hasher that saw every byte of the version read (``None``: not asked, or it
    #: did not see the whole object).
    hasher: PrefixHasher | None = None
    #: A segment ledger's report (its history against ``segments_before``, its
    #: checkpoint), when read whole.
    segments: SegmentReport | None = None


def read_object(root: Location, obj: SessionObject, context: RunContext, *,
                spool: IO[bytes] | None = None,
                new_hasher: Callable[[], PrefixHasher] | None = None,
                watch: EndpointWatch | None = None,
                segments_before: SegmentCheckpoint | None = None,
                ahead: ReadAhead | None = None) -> ObjectRead:
    """Read and audit one session object: the one per-object pipeline of every run.

    The audit task, the replay task (and so the nightly) and ``vakpipe show`` all read
    an object here: its lines streamed through the run's line limit into the audit,
    the version read stamped on the audit's row (its ETag), an object that changed
    under the read read once more, a read failure or an audit that raises turned into
    a finding (:func:`read_consistently`; ``watch`` counts the reads that could not
    reach the endpoint).

    ``spool``, when given, receives the object's exact bytes (an over-long line in
    pieces), for a replay to read again; the audit then keeps the parsed entries of an
    object up to :data:`KEEP_ENTRIES_BYTES`. ``new_hasher`` makes the hasher that sees
    every byte too (a nightly's checkpoint); it is returned when it saw the whole
    object (also when the audit raised), else ``None``. ``segments_before``: a nightly's
    checkpoint of a segment ledger, checked on the way (the report returned as
    ``segments``). ``ahead``: the batch's :class:`~pipeline.io.storage.ReadAhead`.
    """
    hashers: list[PrefixHasher] = []
    reports: list[SegmentReport] = []
    kept: list[Entry] | None = None
    whole = False  # the hasher saw every byte of the version read

    def read(version: SessionObject) -> SessionAudit:
        nonlocal kept, whole
        whole = False
        taps: list[Tap] = []
        # A re-read starts over: the spool, the hasher and the entries kept hold one
        # version's bytes.
        hashers.clear()
        reports.clear()
        if spool is not None:
            spool.seek(0)
            spool.truncate()
            taps.append(spool.write)
        kept = [] if spool is not None and version.size <= KEEP_ENTRIES_BYTES else None
        if new_hasher is not None:
            hashers.append(new_hasher())
            taps.append(hashers[0].update)
        with open_lines(root, version, max_line_bytes=context.max_line_bytes,
                        tap=_tee(taps), segments_before=segments_before,
                        ahead=ahead) as lines:
            if isinstance(lines, SegmentLines):
                reports.append(lines.report)
            try:
                audit = audit_lines(version.key, lines, size=version.size, keep=kept)
            except (*UNCONTAINED, *storage_errors()):
                raise
            except Exception:
                # An audit that raises (audit_failed) must not hide a history break:
                # the rest of the object still goes past the hasher.
                if hashers:
                    for _ in lines:
                        pass
                    whole = True
                raise
        whole = True
        audit.row["etag"] = version.etag
        return audit

    audit, was_read = read_consistently(root, obj, read, watch)
    # Only a hasher that saw the whole object can judge it against its checkpoint.
    hasher = hashers[0] if hashers and whole else None
    report = reports[0] if reports and whole else None
    return ObjectRead(audit, was_read, kept if was_read else None, hasher, report)


def _tee(taps: list[Tap]) -> Tap | None:
    """One tap feeding every tap of ``taps`` (``None`` for none)."""
    if len(taps) < 2:
        return taps[0] if taps else None
    first, second = taps

    def tap(data: bytes) -> None:
        first(data)
        second(data)
    return tap


def audit_object(root: Location, obj: SessionObject,
                 context: RunContext | None = None,
                 watch: EndpointWatch | None = None,
                 ahead: ReadAhead | None = None) -> SessionAudit:
    """Audit one session object (:func:`read_object`, nothing spooled), the cyclic
    collector paused meanwhile (:func:`~pipeline.run.collector.cyclic_gc_paused`)."""
    with cyclic_gc_paused():
        return read_object(root, obj, context or RunContext(), watch=watch,
                           ahead=ahead).audit


def audit_batch(root: Location, index: int, batch: list[SessionObject],
                context: RunContext | None = None) -> BatchResult:
    """Audit a batch of whole sessions; the unit of work of one Dask task.

    Parameters
    ----------
    root:
        The archive root (rebuilt into a filesystem on the worker).
    index:
        The batch's position in the run's plan; it names the output part.
    batch:
        The sessions to audit, in path order.
    context:
        The run's context (its line limit); default that of a run with no options.

    Once :data:`MAX_CONNECTION_FAILURES` objects in a row could not reach the storage
    endpoint, the rest of the batch is reported not read without a request
    (:func:`not_attempted`): a dead endpoint ends the task in bounded time. The small
    objects of an object store are opened ahead, once the endpoint answered
    (:class:`~pipeline.io.storage.ReadAhead`).
    """
    watch = EndpointWatch()
    audits = []
    with ReadAhead(root, batch, watch.reachable) as ahead:
        for obj in batch:
            audits.append(not_attempted(obj, watch) if watch.dead
                          else audit_object(root, obj, context, watch, ahead))
    return audit_batch_result(index, batch, audits)


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
