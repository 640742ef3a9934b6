"""Dask orchestration: plan batches of whole sessions, run them, commit the output.

Always ``dask.distributed``: a LocalCluster of processes sized to the machine by
default, or an existing scheduler (``--scheduler`` / ``DASK_SCHEDULER_ADDRESS``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import dask
import pyarrow as pa
import pyarrow.compute as pc
from distributed import Client, KilledWorker, LocalCluster, as_completed
from tqdm import tqdm

from pipeline.checkpoint import Checkpoint
from pipeline.errors import ClusterError, UsageError
from pipeline.io.archive import ARCHIVE
from pipeline.io.commit import StagedRun, new_run_id
from pipeline.io.storage import (
    MAX_LINE_BYTES,
    Listing,
    Location,
    SessionObject,
    check_output,
    enumerate_sessions,
    printable,
)
from pipeline.io.tables import (
    CHECKPOINTS_SCHEMA,
    COMPACTION_DATASETS,
    DATASETS,
    REPLAY_DATASETS,
    compaction_counts,
)
from pipeline.partitions import NOT_READ_CODES, BatchResult, audit_batch, quarantined
from pipeline.reader import MAX_DETAIL_CHARS
from pipeline.redact import redact_table
from pipeline.replay_partitions import ReplayOptions, replay_batch

#: A task carries at least this many bytes, or this many files, whichever comes first;
#: a trivial task costs ~5 ms here, so small sessions travel in batches.
MIN_BATCH_BYTES = 8 * 2**20
MAX_BATCH_BYTES = 256 * 2**20
MAX_BATCH_FILES = 2000
TASKS_PER_WORKER = 4
#: Tasks that may lose their workers (Dask's ``KilledWorker``: every worker that ran it
#: died, ``allowed-failures`` + 1 times) in one run. Each is split in two and run again,
#: down to the single session that kills workers, which is quarantined: one poison
#: session in a batch of 2,000 costs 12. More means the cluster itself is failing.
MAX_KILLED_TASKS = 64
#: Names of objects not read, and of skipped objects, quoted in a run's manifest.
EXAMPLES = 20
#: Dask settings of the LocalCluster's workers (``deploy/dask/dask.yaml`` sets the same).
#: distributed starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536`` so that glibc
#: hands freed memory back sooner; here that makes a worker parse JSON 20-30% slower
#: than the same code in a plain process (every parsed line allocates and frees its
#: payload), so the workers keep glibc's own, adaptive threshold. docs/scaling.md has
#: the measurements.
WORKER_CONFIG: dict[str, Any] = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}


def plan_batches(sessions: list[SessionObject], workers: int) -> list[list[SessionObject]]:
    """Cut sessions (in path order) into batches balanced by bytes; never split one.

    The target is ``TASKS_PER_WORKER`` batches per worker, clamped to
    [``MIN_BATCH_BYTES``, ``MAX_BATCH_BYTES``], so every worker stays busy to the end
    while each task is large enough to hide the scheduler's per-task cost. A session
    larger than the target is a batch of its own.
    """
    total = sum(s.size for s in sessions)
    target = total // max(1, workers * TASKS_PER_WORKER)
    target = min(MAX_BATCH_BYTES, max(MIN_BATCH_BYTES, target))
    batches: list[list[SessionObject]] = []
    current: list[SessionObject] = []
    size = 0
    for s in sessions:
        if current and (size + s.size > target or len(current) >= MAX_BATCH_FILES):
            batches.append(current)
            current, size = [], 0
        current.append(s)
        size += s.size
    if current:
        batches.append(current)
    return batches


def select_sessions(listing: Listing, ids: frozenset[str], root_url: str) -> Listing:
    """The sessions of ``listing`` whose id (the file's stem) is in ``ids``.

    Parameters
    ----------
    listing:
        What enumerating the root found.
    ids:
        Session ids asked for (``--session``); every one must name a session.
    root_url:
        The root, for the error message.

    Raises
    ------
    UsageError
        An id names no session under the root (a typo must not pass for "nothing to do").
    """
    chosen = [s for s in listing.sessions if s.key.session_id in ids]
    missing = sorted(ids - {s.key.session_id for s in chosen})
    if missing:
        names = ", ".join(repr(m) for m in missing)
        raise UsageError(f"no session with id {names} under {root_url} "
                         "(a session's id is its file name without .jsonl)")
    return Listing(chosen, listing.skipped, listing.skipped_examples)


def scheduler_address(scheduler: str | None = None) -> str | None:
    """The scheduler to join: ``scheduler``, else ``DASK_SCHEDULER_ADDRESS``, else none."""
    dask.config.refresh()
    address: str | None = scheduler or dask.config.get("scheduler-address", None)
    return address


@contextmanager
def dask_client(
    scheduler: str | None = None, workers: int | None = None, processes: bool = True
) -> Iterator[Client]:
    """A client on ``scheduler``, on ``DASK_SCHEDULER_ADDRESS``, or on a new LocalCluster.

    The LocalCluster has one single-threaded worker process per core (the work is
    CPU-bound Python, so threads would only share the GIL) and keeps its scratch
    files in Dask's ``temporary-directory`` when one is configured, else in the
    system's temporary directory.
    """
    address = scheduler_address(scheduler)
    if address:
        try:
            remote = Client(address, set_as_default=False)
        except OSError as err:  # distributed's connect timeout is an OSError too
            text = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ClusterError(f"cannot reach the Dask scheduler {address}: {text}") from err
        with remote as client:
            yield client
        return
    n = workers or os.cpu_count() or 1
    scratch = (dask.config.get("temporary-directory", None)
               or os.path.join(tempfile.gettempdir(), "vakpipe-dask"))
    with dask.config.set({"temporary-directory": scratch, "distributed.worker.daemon": True,
                          **WORKER_CONFIG}):
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=processes,
            dashboard_address=None,
            local_directory=scratch,
        )
        try:
            with Client(cluster, set_as_default=False) as client:
                yield client
                _quiet_shutdown(client)
        finally:
            cluster.close()


def _mute_worker_logs() -> None:
    logging.getLogger("distributed").setLevel(logging.CRITICAL)


def _quiet_shutdown(client: Client) -> None:
    """Mute the workers' logs before their own cluster closes: a worker's heartbeat
    racing the scheduler's close is logged as an error with a traceback (distributed
    does this on every close), which reads as a failure of a run that succeeded."""
    with suppress(Exception):  # dead workers have nothing left to say
        client.run(_mute_worker_logs)


@dataclass
class RunSummary:
    """What a run did, for the console and for the manifest."""

    run_id: str
    root: str
    out: str
    sessions: int = 0
    bytes: int = 0
    skipped_objects: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    #: Tasks that lost their workers and were split (see :data:`MAX_KILLED_TASKS`).
    failed_batches: int = 0
    #: Sessions listed but not audited (``unreadable_object``, ``changed_during_audit``,
    #: ``worker_crashed``, ``audit_failed``): any makes the run partial.
    unread: list[str] = field(default_factory=list)
    #: A few of the objects that are not sessions (their keys as listed).
    skipped_examples: tuple[str, ...] = ()
    #: Compaction runs: sessions needing packets, packets planned and superseded, copies.
    compaction: Counter[str] = field(default_factory=Counter)
    #: More keys for the manifest (a nightly run's options fingerprint and changes).
    manifest_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        """Whether some listed session was not audited (its row says why)."""
        return bool(self.unread)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (for the manifest). Keys are quoted escaped
        (:func:`~pipeline.io.storage.printable`); the exact ones of the sessions not
        read are the ``session_path`` of their findings."""
        return {
            "root": self.root,
            "sessions": self.sessions,
            "bytes": self.bytes,
            "skipped_objects": self.skipped_objects,
            "skipped_examples": [printable(k) for k in sorted(self.skipped_examples)],
            "statuses": dict(sorted(self.statuses.items())),
            "findings_by_code": dict(sorted(self.codes.items())),
            "failed_batches": self.failed_batches,
            "partial": self.partial,
            "unread_objects": len(self.unread),
            "unread_examples": [printable(k) for k in sorted(self.unread)[:EXAMPLES]],
            **({"compaction": dict(sorted(self.compaction.items()))} if self.compaction else {}),
            **self.manifest_extra,
        }


def _progress(total: int, enabled: bool | None) -> tqdm:
    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, unit="B", unit_scale=True, desc="audit", disable=not enabled,
                file=sys.stderr)


def redacted(task: Callable[..., BatchResult], *args: Any, **kwargs: Any) -> BatchResult:
    """Run a batch task and redact every table it returns (see :mod:`pipeline.redact`).

    Wraps every task of a run, on the worker: whatever a task copies from the
    transcripts (ids, models, details, summaries) reaches the output only redacted, and
    a finding's detail and entry id at most :data:`~pipeline.reader.MAX_DETAIL_CHARS`
    long, whichever module wrote the row.
    """
    return redact_result(task(*args, **kwargs))


def redact_result(result: BatchResult) -> BatchResult:
    """``result`` with every table redacted (see :func:`redacted`)."""
    result.sessions = redact_table(result.sessions)
    result.findings = redact_table(result.findings, limits={
        "detail": MAX_DETAIL_CHARS, "entry_id": MAX_DETAIL_CHARS})
    result.extra = {name: redact_table(table) for name, table in result.extra.items()}
    return result


def quarantine(index: int, obj: SessionObject, err: KilledWorker,
               previous: Mapping[str, Checkpoint | None] | None) -> BatchResult:
    """The result of a session whose task killed every worker that ran it: a
    ``worker_crashed`` row, and (nightly) its previous checkpoint kept, to be read
    again the next night."""
    result = quarantined(index, obj, f"every worker that ran it died "
                         f"({err.allowed_failures + 1} times): quarantined, not audited")
    before = previous.get(obj.key.path) if previous is not None else None
    if previous is not None:
        rows = [before.reread().as_row()] if before is not None else []
        result.extra["checkpoints"] = pa.Table.from_pylist(rows, schema=CHECKPOINTS_SCHEMA)
    return redact_result(result)


def run_batches(
    client: Client,
    root: Location,
    listing: Listing,
    on_result: Callable[[BatchResult], None],
    *,
    progress: bool | None = None,
    replay: ReplayOptions | None = None,
    previous: Mapping[str, Checkpoint | None] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> int:
    """Submit one task per batch (audit, or audit and replay) and hand each result over
    as it arrives; with ``previous``, each task gets its objects' checkpoints. An audit
    reads lines up to ``max_line_bytes``; a replay, up to its options'.

    A worker that dies under a task is Dask's business: the task runs again elsewhere.
    A task whose workers all died (``KilledWorker``, after Dask's ``allowed-failures``)
    is split in two halves, run again, and so on down to the one session that kills
    them, which is quarantined (``worker_crashed``); the rest of its batch is audited.
    Returns the number of tasks split so.

    Raises
    ------
    ClusterError
        More than :data:`MAX_KILLED_TASKS` tasks lost their workers.
    """
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    batches = plan_batches(listing.sessions, workers)
    # Only a limit other than the default travels with the tasks.
    limit = {} if max_line_bytes == MAX_LINE_BYTES else {"max_line_bytes": max_line_bytes}
    planned: dict[Any, tuple[int, list[SessionObject]]] = {}

    def submit(index: int, batch: list[SessionObject]) -> Any:
        if replay is None:
            future = client.submit(redacted, audit_batch, root, index, batch, pure=False,
                                   **limit)
        else:
            future = client.submit(redacted, replay_batch, root, index, batch, replay,
                                   None if previous is None else
                                   {o.key.path: previous.get(o.key.path) for o in batch},
                                   pure=False)
        planned[future.key] = (index, batch)
        return future

    futures = [submit(i, batch) for i, batch in enumerate(batches)]
    # Parts of split batches are numbered after the plan's, so every part name is unique.
    next_index = len(batches)
    killed = 0
    with _progress(listing.total_bytes, progress) as bar:
        queue = as_completed(futures, loop=client.loop)
        for future in queue:
            index, batch = planned.pop(future.key)
            try:
                result: BatchResult = future.result()
            except KilledWorker as err:
                future.release()
                killed += 1
                if killed > MAX_KILLED_TASKS:
                    raise ClusterError(
                        f"{killed} tasks lost every worker that ran them (the last on "
                        f"{err.last_worker.address}): the cluster is failing, not one "
                        "input; see the workers' logs") from err
                if len(batch) > 1:
                    half = len(batch) // 2
                    for part in (batch[:half], batch[half:]):
                        queue.add(submit(next_index, part))
                        next_index += 1
                    continue
                result = quarantine(index, batch[0], err, previous)
            on_result(result)
            bar.update(result.bytes_read)
            future.release()
    return killed


def run_audit(
    root: Location,
    out: Location,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    replay: ReplayOptions | None = None,
    sessions: frozenset[str] | None = None,
    max_line_bytes: int | None = None,
) -> RunSummary:
    """Audit every session under ``root`` and commit the integrity tables under ``out``.

    With ``replay``, each object is also replayed (read from storage once) and the
    ``turns`` and ``requests`` tables are committed with the integrity ones.

    Parameters
    ----------
    root, out:
        Archive to read and output location (never inside the archive).
    scheduler:
        Address of an existing Dask scheduler; default a LocalCluster.
    workers:
        LocalCluster size (default: one per core).
    progress:
        Show a progress bar (default: when stderr is a terminal).
    sessions:
        Only the sessions with these ids (see :func:`select_sessions`); default all.
    max_line_bytes:
        The longest line read (``--max-line-bytes``); a longer one is reported, never
        read into memory. Default: the replay options', else
        :data:`~pipeline.io.storage.MAX_LINE_BYTES`.

    Returns
    -------
    RunSummary
        Counts of sessions, bytes, statuses and finding codes.
    """
    in_process = check_locations(root, out, scheduler)
    listing = enumerate_sessions(root)
    if sessions is not None:
        listing = select_sessions(listing, sessions, root.url)
    summary = RunSummary(new_run_id(), root.url, out.url, len(listing.sessions),
                         listing.total_bytes, listing.skipped)
    return execute_run(root, out, listing, summary, scheduler=scheduler, workers=workers,
                       progress=progress, replay=replay, in_process=in_process,
                       max_line_bytes=max_line_bytes)


def check_locations(root: Location, out: Location, scheduler: str | None) -> bool:
    """Refuse an output inside the archive, and memory:// with a remote cluster; return
    whether the run must stay in this process (memory://)."""
    check_output(root, out)
    # memory:// lives in this process only: its workers must be threads here, never the
    # workers of a scheduler (given, or found in DASK_SCHEDULER_ADDRESS).
    if root.protocol == "memory" and scheduler_address(scheduler):
        raise UsageError(
            "memory:// exists only inside this process; a remote cluster cannot read it"
        )
    return "memory" in (root.protocol, out.protocol)


def execute_run(
    root: Location,
    out: Location,
    listing: Listing,
    summary: RunSummary,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    replay: ReplayOptions | None = None,
    in_process: bool = False,
    previous: Mapping[str, Checkpoint | None] | None = None,
    before_commit: Callable[[StagedRun], None] | None = None,
    max_line_bytes: int | None = None,
) -> RunSummary:
    """Run the tasks of ``listing`` and commit everything under ``out`` in one commit.

    ``previous`` (a nightly run) checks each object against its checkpoint and adds the
    ``checkpoints`` table; ``before_commit`` may stage more parts (rows carried
    forward) once every task is in. ``max_line_bytes``, when given, overrides the
    replay options' line limit.
    """
    if replay is not None and max_line_bytes is not None:
        replay = dataclasses.replace(replay, max_line_bytes=max_line_bytes)
    schemas = {**DATASETS, **(REPLAY_DATASETS if replay is not None else {}),
               **(COMPACTION_DATASETS if replay is not None and replay.compaction else {}),
               **({"checkpoints": CHECKPOINTS_SCHEMA} if previous is not None else {})}
    staged = StagedRun(out, summary.run_id, schemas)
    write_archive = replay is not None and replay.compaction is not None and replay.write_archive
    # Before any task: a corrupt previous manifest, a link under OUT or a path of the
    # commit resolving into the archive stops the run here, with nothing written.
    staged.preflight(root, (ARCHIVE,) if write_archive else ())
    summary.skipped_examples = summary.skipped_examples or listing.skipped_examples
    if replay is not None and write_archive:
        # Workers write the compacted copies into this run's staging folder; the commit
        # publishes them under OUT/archive with the rest, or not at all.
        replay = dataclasses.replace(
            replay, run_ns=time.time_ns(),
            archive_to=dataclasses.replace(out, path=staged.stage_dir(ARCHIVE)))

    def collect(result: BatchResult) -> None:
        staged.write_part("integrity/sessions", result.index, result.sessions)
        staged.write_part("integrity/findings", result.index, result.findings)
        for name, table in result.extra.items():
            staged.write_part(name, result.index, table)
        for name, paths in result.files.items():
            staged.add_files(name, paths)
            summary.compaction[f"{name}_sessions"] += len(paths)
        if "compaction" in result.extra:
            summary.compaction.update(compaction_counts(result.extra["compaction"]))
        summary.statuses.update(result.statuses)
        summary.codes.update(result.codes)
        if any(result.codes.get(code) for code in NOT_READ_CODES):
            findings = result.findings
            not_read = pc.is_in(findings["code"], value_set=pa.array(sorted(NOT_READ_CODES)))
            summary.unread.extend(findings.filter(not_read)["session_path"].to_pylist())

    try:
        if listing.sessions:
            with dask_client(scheduler, workers, processes=not in_process) as client:
                summary.failed_batches += run_batches(
                    client, root, listing, collect, progress=progress, replay=replay,
                    previous=previous, max_line_bytes=max_line_bytes or MAX_LINE_BYTES)
        if before_commit is not None:
            before_commit(staged)
        staged.commit(summary.as_dict())
    except BaseException:
        staged.abort()
        raise
    return summary
