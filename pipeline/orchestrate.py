"""Dask orchestration: plan batches of whole sessions, run them, commit the output.

Always ``dask.distributed``: a LocalCluster of processes sized to the machine by
default, or an existing scheduler (``--scheduler`` / ``DASK_SCHEDULER_ADDRESS``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import dask
from distributed import Client, LocalCluster, as_completed
from tqdm import tqdm

from pipeline.errors import ClusterError, UsageError
from pipeline.io.archive import ARCHIVE
from pipeline.io.commit import StagedRun, new_run_id
from pipeline.io.storage import Listing, Location, SessionObject, check_output, enumerate_sessions
from pipeline.io.tables import COMPACTION_DATASETS, DATASETS, REPLAY_DATASETS, compaction_counts
from pipeline.partitions import BatchResult, audit_batch
from pipeline.replay_partitions import ReplayOptions, replay_batch

#: A task carries at least this many bytes, or this many files, whichever comes first;
#: a trivial task costs ~5 ms here, so small sessions travel in batches.
MIN_BATCH_BYTES = 8 * 2**20
MAX_BATCH_BYTES = 256 * 2**20
MAX_BATCH_FILES = 2000
TASKS_PER_WORKER = 4


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
    with dask.config.set({"temporary-directory": scratch, "distributed.worker.daemon": True}):
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
        finally:
            cluster.close()


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
    failed_batches: int = 0
    #: Compaction runs: sessions needing packets, packets planned and superseded, copies.
    compaction: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (for the manifest)."""
        return {
            "root": self.root,
            "sessions": self.sessions,
            "bytes": self.bytes,
            "skipped_objects": self.skipped_objects,
            "statuses": dict(sorted(self.statuses.items())),
            "findings_by_code": dict(sorted(self.codes.items())),
            "failed_batches": self.failed_batches,
            **({"compaction": dict(sorted(self.compaction.items()))} if self.compaction else {}),
        }


def _progress(total: int, enabled: bool | None) -> tqdm:
    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, unit="B", unit_scale=True, desc="audit", disable=not enabled,
                file=sys.stderr)


def run_batches(
    client: Client,
    root: Location,
    listing: Listing,
    on_result: Callable[[BatchResult], None],
    *,
    progress: bool | None = None,
    replay: ReplayOptions | None = None,
) -> None:
    """Submit one task per batch (audit, or audit and replay) and hand each result over
    as it arrives."""
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    batches = plan_batches(listing.sessions, workers)
    if replay is None:
        futures = [client.submit(audit_batch, root, i, batch, pure=False)
                   for i, batch in enumerate(batches)]
    else:
        futures = [client.submit(replay_batch, root, i, batch, replay, pure=False)
                   for i, batch in enumerate(batches)]
    with _progress(listing.total_bytes, progress) as bar:
        for future in as_completed(futures, loop=client.loop):
            result: BatchResult = future.result()
            on_result(result)
            bar.update(result.bytes_read)
            future.release()


def run_audit(
    root: Location,
    out: Location,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    replay: ReplayOptions | None = None,
    sessions: frozenset[str] | None = None,
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

    Returns
    -------
    RunSummary
        Counts of sessions, bytes, statuses and finding codes.
    """
    check_output(root, out)
    # memory:// lives in this process only: its workers must be threads here, never the
    # workers of a scheduler (given, or found in DASK_SCHEDULER_ADDRESS).
    in_process = "memory" in (root.protocol, out.protocol)
    if root.protocol == "memory" and scheduler_address(scheduler):
        raise UsageError(
            "memory:// exists only inside this process; a remote cluster cannot read it"
        )
    listing = enumerate_sessions(root)
    if sessions is not None:
        listing = select_sessions(listing, sessions, root.url)
    summary = RunSummary(new_run_id(), root.url, out.url, len(listing.sessions),
                         listing.total_bytes, listing.skipped)
    schemas = {**DATASETS, **(REPLAY_DATASETS if replay is not None else {}),
               **(COMPACTION_DATASETS if replay is not None and replay.compaction else {})}
    staged = StagedRun(out, summary.run_id, schemas)
    if replay is not None and replay.compaction is not None and replay.write_archive:
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

    try:
        with dask_client(scheduler, workers, processes=not in_process) as client:
            run_batches(client, root, listing, collect, progress=progress, replay=replay)
        staged.commit(summary.as_dict())
    except BaseException:
        staged.abort()
        raise
    return summary
