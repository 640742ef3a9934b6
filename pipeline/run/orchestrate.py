"""Orchestration: plan batches of whole sessions, run them, commit the output.

The batches run on an :class:`Executor`: ``dask.distributed`` (a LocalCluster of
processes, one per core this process may use, or an existing scheduler: ``--scheduler`` /
``DASK_SCHEDULER_ADDRESS``), or, for an archive small enough that starting a cluster
would cost more than it saves (:data:`LOCAL_MAX_BYTES` for a run that replays,
:data:`LOCAL_MAX_AUDIT_BYTES` for one that only audits), this process itself, through
the same per-batch functions. dask and distributed are imported only when a cluster is
used (~0.2 s to import, with bytecode).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pickle
import posixpath
import re
import sys
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.audit.checkpoint import Checkpoint
from pipeline.errors import ClusterError, UsageError
from pipeline.io.archive import ARCHIVE
from pipeline.io.commit import STAGING, EncodedPart, StagedRun, encode_part, new_run_id
from pipeline.io.storage import (
    MAX_LINE_BYTES,
    Listing,
    Location,
    SessionObject,
    check_output,
    enumerate_sessions,
    forget_listing,
    printable,
    reads_over_network,
    storage_error,
    storage_errors,
)
from pipeline.ledger.reader import MAX_DETAIL_CHARS
from pipeline.run import lifecycle
from pipeline.run.batches import (
    NOT_READ_CODES,
    BatchResult,
    RunContext,
    audit_batch,
    quarantined,
)
from pipeline.run.collector import cyclic_gc_paused
from pipeline.tables.redact import redact_table
from pipeline.tables.schemas import (
    CHECKPOINTS_SCHEMA,
    COMPACTION_DATASETS,
    DATASETS,
    OUTPUT_DATASETS,
    REPLAY_DATASETS,
    compaction_counts,
)

if TYPE_CHECKING:
    from distributed import Client, KilledWorker

    # Imported where a replay runs: the replay and compaction engines are a fifth of
    # what an audit's process imports (and compiles, without a bytecode cache).
    from pipeline.run.replay_batches import ReplayOptions

#: A task carries at least this many bytes, or this many files, whichever comes first;
#: a trivial task costs ~5 ms here, so small sessions travel in batches.
MIN_BATCH_BYTES = 8 * 2**20
MAX_BATCH_BYTES = 256 * 2**20
MAX_BATCH_FILES = 2000
TASKS_PER_WORKER = 4
#: How much finer the last wave's batches are cut (:func:`plan_batches`).
TAIL_SPLIT = 4
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
#: payload), so the workers keep glibc's own, adaptive threshold. Each worker's
#: statistical profiler (a walk of the running task's stack every 10 ms, for a
#: dashboard vakpipe does not serve) costs a replaying worker ~3% of its CPU: off.
#: docs/scaling.md has the measurements.
WORKER_CONFIG: dict[str, Any] = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.worker.profile.enabled": False,
}


def plan_batches(sessions: list[SessionObject], workers: int) -> list[list[SessionObject]]:
    """Cut sessions (in path order) into batches balanced by bytes; never split one.

    The target is ``TASKS_PER_WORKER`` batches per worker, clamped to
    [``MIN_BATCH_BYTES``, ``MAX_BATCH_BYTES``], so every worker stays busy to the end
    while each task is large enough to hide the scheduler's per-task cost. A session
    larger than the target is a batch of its own.

    With more than one worker, the last wave (the batches that end in the last
    ``workers`` targets' worth of bytes) is cut again :data:`TAIL_SPLIT` times finer, in
    bytes (down to ``MIN_BATCH_BYTES``) and in files: batches of the same size do not
    take the same time, and they run in plan order, so a worker that finishes its share
    early then waits for a small task, not a whole one (docs/scaling.md, "Task
    partitioning").
    """
    total = sum(s.size for s in sessions)
    target = batch_target(total, workers)
    batches = cut_batches(sessions, target, MAX_BATCH_FILES)
    if workers > 1:
        wave = last_wave(batches, total - workers * target)
        tail = [s for batch in batches[wave:] for s in batch]
        batches[wave:] = cut_batches(tail, max(MIN_BATCH_BYTES, target // TAIL_SPLIT),
                                     max(1, MAX_BATCH_FILES // TAIL_SPLIT))
    return batches


def batch_target(total: int, workers: int) -> int:
    """The bytes :func:`plan_batches` aims a batch at, for ``total`` bytes on
    ``workers``: ``TASKS_PER_WORKER`` batches a worker, clamped to
    [``MIN_BATCH_BYTES``, ``MAX_BATCH_BYTES``]."""
    return min(MAX_BATCH_BYTES,
               max(MIN_BATCH_BYTES, total // max(1, workers * TASKS_PER_WORKER)))


def last_wave(batches: list[list[SessionObject]], tail_from: int) -> int:
    """The index of the first of ``batches`` that ends more than ``tail_from`` bytes into
    them (``len(batches)`` when none does)."""
    end = 0
    for i, batch in enumerate(batches):
        end += sum(s.size for s in batch)
        if end > tail_from:
            return i
    return len(batches)


def cut_batches(sessions: list[SessionObject], most_bytes: int,
                most_files: int) -> list[list[SessionObject]]:
    """Sessions in order, in batches of at most ``most_bytes`` and ``most_files`` (a
    larger session alone), each closed only when the next session does not fit."""
    batches: list[list[SessionObject]] = []
    current: list[SessionObject] = []
    size = 0
    for s in sessions:
        if current and (size + s.size > most_bytes or len(current) >= most_files):
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
    """The scheduler to join: ``scheduler``, else ``DASK_SCHEDULER_ADDRESS``, else Dask's
    ``scheduler-address`` setting from its YAML files (dask is imported only then)."""
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None
    if address or not _dask_yaml_present():
        return address
    found: str | None = _dask_configured().config.get("scheduler-address", None)
    return found


#: Where a Dask configuration comes from, for the lines that ask to check it.
_DASK_CONFIG_PLACES = "check the Dask configuration (DASK_* variables, DASK_CONFIG, ~/.config/dask)"


def _dask_configured() -> Any:
    """dask, imported, its YAML files and ``DASK_*`` variables read again (they may have
    changed since it was imported: a long-lived process, a test's environment).

    Raises
    ------
    ClusterError
        A configuration file does not parse (dask reads them at its import: that was a
        traceback from the import, exit 1).
    """
    try:
        import dask

        dask.config.refresh()
    except ValueError as err:  # dask.config's own: "A dask config file at ... is malformed"
        said = str(err).partition("\n")[0].removesuffix(", original error message:")
        raise ClusterError(f"the Dask configuration does not read: "
                           f"{printable(said or type(err).__name__, 200)}; "
                           f"{_DASK_CONFIG_PLACES}") from err
    return dask


def _dask_yaml_present() -> bool:
    """Whether a Dask config file may set ``scheduler-address`` (then dask reads them).

    A file that does not name the key outside a comment cannot set it, so dask (~0.1 s
    to import) is not imported for it: a config folder of commented-out templates (as
    dask-kubernetes leaves) is the common case. A file that cannot be read is left to
    dask to judge.
    """
    places = [os.environ.get("DASK_CONFIG", ""), os.path.expanduser("~/.config/dask"),
              "/etc/dask", os.path.join(sys.prefix, "etc", "dask")]
    for place in places:
        if not place or not os.path.isdir(place):
            continue
        for name in os.listdir(place):
            if name.endswith((".yaml", ".yml", ".json")) and _may_set_address(
                    os.path.join(place, name)):
                return True
    return False


def _may_set_address(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return any(re.search(r"scheduler[-_]address", line.split("#", 1)[0])
                       for line in f)
    except OSError:
        return True


#: A run that replays (replay, nightly, compaction) whose listing holds at most this
#: many bytes and :data:`LOCAL_MAX_SESSIONS` sessions (both times :func:`core_factor`
#: for an archive in a folder or in memory, whose reads wait on no network: see
#: :func:`~pipeline.io.storage.reads_over_network`) runs in this process. Importing
#: distributed and starting and closing a LocalCluster cost ~0.7 s of the command's wall
#: on two cores (on a machine twice as fast as well) against an in-process replay of
#: ~40-55 MB/s on one core: the bytes a cluster needs to catch up are about that cost
#: times the in-process rate, times :func:`core_factor` for the share of the cluster's
#: speed-up that is left to catch up with (docs/reliability.md, "Small archives in
#: process", has the measurements).
LOCAL_MAX_BYTES = 32 * 2**20
#: The same for a run that only audits: ~175-390 MB/s in process (a vak fleet on the
#: slower 2-core machine, Claude Code transcripts on the faster one).
LOCAL_MAX_AUDIT_BYTES = 128 * 2**20
#: Each session costs ~0.2 ms in process besides its bytes (opening it, its rows):
#: thousands of small ones are work as bytes are.
LOCAL_MAX_SESSIONS = 2000
#: A LocalCluster of N single-threaded workers runs a large archive ~0.9 N times as fast
#: as one process (measured 1.6-1.8x on two cores).
WORKER_SPEEDUP = 0.9
#: At most this many times the limits above: on one core a cluster never catches up, and
#: past that a run keeps what only a cluster gives (a worker that dies is a finding).
MAX_CORE_FACTOR = 3.0
#: Seconds to wait for a scheduler given by address before giving up (distributed's
#: own default is 30 s, retried: a mistyped address cost a minute).
CONNECT_TIMEOUT_S = 10


class TaskHandle(Protocol):
    """A submitted batch: a Dask future, or a deferred call in this process."""

    @property
    def key(self) -> Any:
        """Unique name of the task."""

    def result(self) -> Any:
        """Its result (raising what the task raised)."""

    def release(self) -> None:
        """Forget the result once handed over."""


class Completion(Protocol):
    """Handles in the order they finish; more may be added while iterating."""

    def __iter__(self) -> Iterator[TaskHandle]:
        """Each handle once finished."""

    def add(self, handle: TaskHandle) -> None:
        """Another handle to wait for."""


class Executor(Protocol):
    """Where a run's batches execute (:class:`DaskExecutor`, :class:`LocalExecutor`)."""

    @property
    def workers(self) -> int:
        """How many batches run at once."""

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> TaskHandle:
        """Start (or schedule) ``fn(*args, **kwargs)``; return its handle."""

    def as_completed(self, handles: Iterable[TaskHandle]) -> Completion:
        """The handles as they finish."""


class DaskExecutor:
    """Batches as tasks of a ``distributed`` client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @property
    def workers(self) -> int:
        """Workers of the cluster now."""
        return max(1, len(self.client.scheduler_info().get("workers", {})))

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> TaskHandle:
        """``client.submit`` (never cached: a rerun reads the objects again)."""
        handle: TaskHandle = self.client.submit(fn, *args, pure=False, **kwargs)
        return handle

    def as_completed(self, handles: Iterable[TaskHandle]) -> Completion:
        """distributed's ``as_completed``."""
        return as_completed(list(handles), loop=self.client.loop)


def as_completed(futures: list[Any], loop: Any = None) -> Completion:
    """distributed's ``as_completed``, imported when first used (a seam for tests)."""
    from distributed import as_completed as dask_as_completed

    done: Completion = dask_as_completed(futures, loop=loop)
    return done


@dataclass
class _Deferred:
    key: int
    call: Callable[[], Any]

    def result(self) -> Any:
        return self.call()

    def release(self) -> None:
        self.call = _released


def _released() -> Any:
    raise RuntimeError("result already handed over")


class _InOrder:
    def __init__(self, handles: Iterable[TaskHandle]) -> None:
        self.queue: deque[TaskHandle] = deque(handles)

    def __iter__(self) -> Iterator[TaskHandle]:
        while self.queue:
            yield self.queue.popleft()

    def add(self, handle: TaskHandle) -> None:
        self.queue.append(handle)


class LocalExecutor:
    """Batches run one after the other in this process, when their result is asked for:
    the same functions a cluster's workers run, with no cluster to start."""

    workers = 1

    def __init__(self) -> None:
        self._next = 0

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> TaskHandle:
        """A deferred call of ``fn``."""
        self._next += 1
        return _Deferred(self._next, lambda: fn(*args, **kwargs))

    def as_completed(self, handles: Iterable[TaskHandle]) -> Completion:
        """The handles in submission order (each runs when its result is asked for)."""
        return _InOrder(handles)


def local_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system tells it (as
    under ``taskset`` or a cpuset; else all of the machine's), at most its cgroup's CPU
    quota rounded up (:func:`cgroup_cpu_quota`: a container's ``--cpus``, a Kubernetes
    CPU limit). The LocalCluster's default number of workers."""
    try:
        cores = len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def cgroup_cpu_quota(mounts: Path = Path("/sys/fs/cgroup"),
                     membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPUs' worth of time this process's cgroup may use (quota / period: 1.5 for a
    container run with ``--cpus 1.5``), the smallest along its group's path up to the
    hierarchy's root; ``None`` where none is set or there are no cgroups (not Linux).

    cgroup v2 (``0::/path`` in ``membership``) reads ``cpu.max``; v1 (a ``cpu``
    controller's line) reads ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` under the
    controller's mount (``cpu,cpuacct`` or ``cpu``). A group whose folder is not under
    the mount (a container that sees the host's path with its own group mounted as
    the root) is read from the nearest ancestor folder that is.
    """
    quotas: list[float] = []
    try:
        for line in membership.read_text().splitlines():
            # "hierarchy:controllers:path"; v2's controllers are empty
            controllers, _, path = line.partition(":")[2].partition(":")
            if not path.startswith("/"):
                continue
            if controllers == "":
                quotas += _quotas_along(mounts, path, _cpu_max)
            elif "cpu" in controllers.split(","):
                for name in (controllers, "cpu,cpuacct", "cpuacct,cpu", "cpu"):
                    if (mounts / name).is_dir():
                        quotas += _quotas_along(mounts / name, path, _cfs_quota)
                        break
    except OSError:  # a folder this process may not look into: what it found so far
        pass
    return min(quotas, default=None)


def _quotas_along(mount: Path, path: str, read: Callable[[Path], float | None],
                  ) -> list[float]:
    """The quotas ``read`` finds in the group folders from ``path`` up to ``mount``."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    found: list[float] = []
    for depth in range(len(parts), -1, -1):
        folder = mount.joinpath(*parts[:depth])
        if folder.is_dir():
            quota = read(folder)
            if quota is not None:
                found.append(quota)
    return found


def _cpu_max(folder: Path) -> float | None:
    """cgroup v2: ``cpu.max`` is ``"$MAX $PERIOD"``, ``max`` for no limit."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return _ratio(int(quota), int(period))
    except (OSError, ValueError):
        return None


def _cfs_quota(folder: Path) -> float | None:
    """cgroup v1: ``cpu.cfs_quota_us`` (-1 for no limit) over ``cpu.cfs_period_us``."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return _ratio(quota, period)


def _ratio(quota: int, period: int) -> float | None:
    """A quota over its period; ``None`` for what sets no limit (v1's -1)."""
    return quota / period if quota > 0 and period > 0 else None


def core_factor(cores: int) -> float:
    """How far past :data:`LOCAL_MAX_BYTES` / :data:`LOCAL_MAX_AUDIT_BYTES` a run on
    ``cores`` cores stays in process: the cluster's speed-up ``s`` (:data:`WORKER_SPEEDUP`
    per core) saves ``1 - 1/s`` of the in-process time, so it catches up with its fixed
    cost after ``s / (s - 1)`` times the bytes it would on many cores (2.25 on two cores,
    1.38 on four, 1.07 on sixteen); at most :data:`MAX_CORE_FACTOR`."""
    speedup = WORKER_SPEEDUP * cores
    if speedup * (MAX_CORE_FACTOR - 1) <= MAX_CORE_FACTOR:
        return MAX_CORE_FACTOR
    return speedup / (speedup - 1)


def runs_in_process(listing: Listing, scheduler: str | None, workers: int | None,
                    replays: bool = True, local: bool = False) -> bool:
    """Whether a run of ``listing`` executes in this process: ``workers == 0``
    (``--workers 0``), or no scheduler to join, no ``--workers`` asked for and a listing
    within :data:`LOCAL_MAX_SESSIONS` and :data:`LOCAL_MAX_BYTES` (a run that replays) or
    :data:`LOCAL_MAX_AUDIT_BYTES` (``replays=False``: one that only audits), each times
    :func:`core_factor` of :func:`local_cores` when the archive is ``local`` (a folder,
    memory://: what the factor was measured on; an object store's reads wait on the
    network, which a cluster's workers do side by side)."""
    if workers == 0:
        return True
    if workers is not None or scheduler_address(scheduler):
        return False
    factor = core_factor(local_cores()) if local else 1.0
    limit = (LOCAL_MAX_BYTES if replays else LOCAL_MAX_AUDIT_BYTES) * factor
    return (listing.total_bytes <= limit
            and len(listing.sessions) <= LOCAL_MAX_SESSIONS * factor)


class SharedCluster:
    """One LocalCluster for the runs of one command (a regression check's two replays),
    started by the first run that needs a cluster and closed with this context: a second
    cluster would cost seconds, and runs small enough for this process start none.

    The first run's worker count decides its size.
    """

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._client: Client | None = None

    def client(self, workers: int | None) -> Client:
        """The cluster's client, the cluster started on the first call."""
        if self._client is None:
            self._client = self._stack.enter_context(dask_client(None, workers))
        return self._client

    def __enter__(self) -> SharedCluster:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return bool(self._stack.__exit__(*exc))


@contextmanager
def executor_for(listing: Listing, scheduler: str | None = None, workers: int | None = None,
                 threads: bool = False, replays: bool = True,
                 local: bool = False, cluster: SharedCluster | None = None) -> Iterator[Executor]:
    """The executor a run of ``listing`` uses (see :func:`runs_in_process`, ``local``: an
    archive in a folder or in memory); ``threads`` (memory://) makes a LocalCluster's
    workers threads of this process; ``cluster`` is the LocalCluster to use (or start)
    when the run needs one and no scheduler is given."""
    if runs_in_process(listing, scheduler, workers, replays, local):
        yield LocalExecutor()
        return
    if workers is not None:
        # A worker beyond the sessions would get no task: `--workers 100` over 20
        # sessions started 100 processes (a minute here) for 20 to work.
        workers = min(workers, max(1, len(listing.sessions)))
    if cluster is not None and not threads and not scheduler_address(scheduler):
        yield DaskExecutor(cluster.client(workers))
        return
    with dask_client(scheduler, workers, processes=not threads) as client:
        yield DaskExecutor(client)


def _connect(address: str) -> Client:
    """A client of the scheduler at ``address`` that closes itself when it cannot start
    (a ``tls://`` address without Dask's TLS settings, say): a half-made client's
    finaliser waited out a 20 s timeout at exit, then printed its traceback."""
    from distributed import Client

    class ClosingClient(Client):
        def start(self, **kwargs: Any) -> Any:
            try:
                return super().start(**kwargs)
            except BaseException:
                with suppress(Exception):
                    self.close(timeout=2)
                raise

    return ClosingClient(address, set_as_default=False, timeout=CONNECT_TIMEOUT_S)


@contextmanager
def dask_client(
    scheduler: str | None = None, workers: int | None = None, processes: bool = True
) -> Iterator[Client]:
    """A client on ``scheduler``, on ``DASK_SCHEDULER_ADDRESS``, or on a new LocalCluster.

    The LocalCluster has one single-threaded worker process per core (the work is
    CPU-bound Python, so threads would only share the GIL), no dashboard, and keeps its
    scratch files in Dask's ``temporary-directory`` when one is configured, else in the
    system's temporary directory. A scheduler that does not answer within
    :data:`CONNECT_TIMEOUT_S` is a :class:`~pipeline.errors.ClusterError`.
    """
    dask = _dask_configured()
    from distributed import Client, LocalCluster

    address = scheduler_address(scheduler)
    if address:
        lifecycle.stage("connecting to the scheduler")
        from distributed.comm.addressing import parse_address, parse_host_port

        try:
            # A malformed address fails here, at once: given to a Client it waits out
            # its timeout and leaves a half-made client whose finaliser prints a
            # traceback at exit.
            parse_host_port(parse_address(address)[1])
        except (ValueError, TypeError) as err:
            raise ClusterError(f"bad Dask scheduler address {address!r}: {err} "
                               "(expected e.g. tcp://10.0.0.5:8786)") from err
        try:
            remote = _connect(address)
        except (OSError, TimeoutError, ValueError, TypeError) as err:
            # distributed's connect timeout is an OSError; a malformed address a
            # ValueError or TypeError from its address parser.
            text = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ClusterError(f"cannot reach the Dask scheduler {address!r}: {text}") from err
        with remote as client:
            check_workers_code(client, address)
            yield client
        return
    n = workers or local_cores()
    scratch = (dask.config.get("temporary-directory", None)
               or os.path.join(tempfile.gettempdir(), "vakpipe-dask"))
    lifecycle.stage(lifecycle.STARTING_CLUSTER)
    # Quiet while it starts: a failure is the one line below, not the nannies' log of it.
    _quiet_scheduler(logging.CRITICAL)
    with dask.config.set({"temporary-directory": scratch, "distributed.worker.daemon": True,
                          **WORKER_CONFIG}):
        try:
            with lifecycle.children_ignore_interrupt():
                cluster = LocalCluster(
                    n_workers=n,
                    threads_per_worker=1,
                    processes=processes,
                    # The scheduler's HTTP server (health, metrics) on a free loopback
                    # port: its default 8787 may be taken (a notebook's cluster, another
                    # run), and then Dask warns on stderr. No dashboard: bokeh is not
                    # installed.
                    dashboard_address="127.0.0.1:0",
                    local_directory=scratch,
                    **({"preload": [lifecycle.__name__]} if processes else {}),
                )
        except Exception as err:
            # A Dask configuration the workers cannot start with (a memory target that
            # is no number, in DASK_* or a YAML file): a traceback, exit 1, before.
            raise ClusterError(f"the local Dask cluster did not start: {_cause(err)}; "
                               f"{_DASK_CONFIG_PLACES}") from err
        _quiet_scheduler()
        stopped = True
        try:
            with Client(cluster, set_as_default=False) as client:
                yield client
                _quiet_shutdown(client)
            stopped = False
        finally:
            # A run stopped under a running task (a signal, an error it reports in one
            # line): the nannies' errors as the cluster is torn down (on Python 3.13 a
            # traceback from a nanny whose worker was killed) are not that line's.
            _quiet_scheduler(logging.CRITICAL if stopped else logging.ERROR)
            cluster.close()


@lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of the vakpipe code this process runs: its version and the source of
    every module of :mod:`pipeline` (read once, ~5 ms), 16 hex digits."""
    import hashlib

    import pipeline

    package = Path(pipeline.__file__).parent
    digest = hashlib.sha256(pipeline.__version__.encode())
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


#: What a refusal of workers that run other code advises.
_CODE_ADVICE = "install this vakpipe on the workers, or run without --scheduler"


def _workers_code_digest() -> str:
    # What a worker answers: its own module's code_digest (sent by reference, so the
    # worker imports its own vakpipe to run it).
    return code_digest()


def check_workers_code(client: Client, address: str) -> None:
    """Refuse a scheduler whose workers run other vakpipe code than this command.

    A laptop's newer vakpipe against a cluster's older image would mix two codes' rows
    in one run, or fail task by task into a partial run. Checked once, on the workers
    connected at the time (one call to each).

    Raises
    ------
    ClusterError
        A worker runs other code, or cannot run this check (it lacks the function: an
        older vakpipe, or none).
    """
    ours = code_digest()
    try:
        theirs = client.run(_workers_code_digest)
    except Exception as err:  # whatever the worker raised: its unpickling, its import
        raise ClusterError(f"the workers of {address} cannot run this vakpipe's code "
                           f"({printable(_said(err), 120)}): {_CODE_ADVICE}") from err
    other = sorted(worker for worker, digest in theirs.items() if digest != ours)
    if other:
        raise ClusterError(f"{len(other)} of {len(theirs)} workers of {address} run other "
                           f"vakpipe code than this command ({other[0]}: "
                           f"{printable(str(theirs[other[0]]), 40)}, here: {ours}): {_CODE_ADVICE}")


def check_own_code(expected: str) -> None:
    """On a worker, before its task: refuse to run when this process's vakpipe code is
    not the command's (``expected``, its :func:`code_digest`). The command checks the
    workers connected when it starts (:func:`check_workers_code`); this catches those
    that join later.

    Raises
    ------
    ClusterError
        This process runs other code (no row of it reaches the run).
    """
    ours = code_digest()
    if ours != expected:
        try:
            from distributed import get_worker

            where = f"worker {get_worker().address}"
        except (ImportError, ValueError):
            where = "a worker"
        raise ClusterError(f"{where} runs other vakpipe code than this command ({ours}, "
                           f"here: {expected}): {_CODE_ADVICE}")


def _said(err: BaseException) -> str:
    """``Type: the first line of its message`` (``Type`` alone when it has none)."""
    text = str(err)
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _cause(err: BaseException) -> str:
    """``err`` and the first cause it was raised from, on one line."""
    cause = err.__cause__ or err.__context__
    return printable(_said(err) + (f" (from {_said(cause)})" if cause is not None else ""),
                     200)


def _quiet_scheduler(level: int = logging.ERROR) -> None:
    """The LocalCluster's scheduler and nannies log in this process: their warnings
    ("Port ... already in use", a nanny killing a worker at close) are not a run's
    business; errors still show (``level``)."""
    for name in ("distributed", "distributed.nanny", "distributed.scheduler"):
        logging.getLogger(name).setLevel(level)


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
    #: Findings by (severity, code), and the first sessions of each status (their
    #: ``session_path``, sorted): what ``--fail-on`` names when it matches.
    severity_codes: Counter[tuple[str, str]] = field(default_factory=Counter)
    status_examples: dict[str, list[str]] = field(default_factory=dict)
    #: Sessions by storage (``jsonl``, ``segments``) and segment ledgers by content
    #: (``segments:plain``, ``segments:opened``, ``segments:sealed``; docs/segments.md).
    storages: Counter[str] = field(default_factory=Counter)
    #: The archive read, as a URL that names it from any folder
    #: (:attr:`~pipeline.io.storage.Location.absolute_url`; ``root`` is as given): the
    #: readers of the run keep what they write out of it (``CommittedRun.check_apart``).
    archive: str = ""

    def note(self, result: ShippedResult) -> None:
        """Add what a task's result says (:func:`ship`) to the run's counts, and keep
        the first :data:`EXAMPLES` sessions of each status."""
        self.statuses.update(result.statuses)
        self.codes.update(result.codes)
        self.severity_codes.update(result.severity_codes)
        self.storages.update(result.storages)
        self.unread.extend(result.unread)
        self.compaction.update(result.compaction)
        for name, paths in result.files.items():
            self.compaction[f"{name}_sessions"] += len(paths)
        for status, paths in result.status_examples.items():
            kept = self.status_examples.setdefault(status, [])
            kept.extend(paths)
            kept.sort()
            del kept[EXAMPLES:]

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
            **({"archive": self.archive} if self.archive else {}),
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


def redacted(task: Callable[..., BatchResult], *args: Any, **kwargs: Any) -> BatchResult:
    """Run a batch task and redact every table it returns (see :mod:`pipeline.ledger.redact`).

    Runs inside every task of a run, on the worker (:func:`shipped`), before anything
    is encoded: whatever a task copies from the
    transcripts (ids, models, details, summaries) reaches the output only redacted, and
    a finding's detail and entry id at most :data:`~pipeline.ledger.reader.MAX_DETAIL_CHARS`
    long, whichever module wrote the row.
    """
    return redact_result(task(*args, **kwargs))


@dataclass(frozen=True)
class ShippedResult:
    """What a task sends back to the runner (:func:`ship`): each of its datasets as the
    Parquet part the runner writes, and what the run's summary reads of its tables
    (:meth:`RunSummary.note`), so the runner reads no table at all."""

    index: int
    #: Every dataset of the batch, by name (``integrity/sessions``, ``usage``, ...).
    parts: dict[str, EncodedPart]
    #: Files the task wrote under the run's staging folder, by dataset.
    files: dict[str, list[str]]
    bytes_read: int
    statuses: Counter[str]
    codes: Counter[str]
    #: Findings by (severity, code).
    severity_codes: Counter[tuple[str, str]]
    #: Sessions by storage, and segment ledgers by content (``segments:sealed``).
    storages: Counter[str]
    #: The first :data:`EXAMPLES` sessions (``session_path``, sorted) of each status.
    status_examples: dict[str, list[str]]
    #: The sessions not read (a finding of :data:`NOT_READ_CODES`).
    unread: list[str]
    #: A compaction run's counts of the batch's packets.
    compaction: dict[str, int]


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """A task's batch of session objects as it travels to its worker: pickled once, by
    the runner. Dask's scheduler runs in the runner's process and would otherwise
    unpickle every object of every batch and pickle it again for the worker (three
    passes over thousands of objects a task, and the first task starts only once its
    batch has made them); bytes it passes as they are (docs/scaling.md)."""

    data: bytes

    @classmethod
    def of(cls, batch: list[SessionObject]) -> PackedBatch:
        """``batch``, packed."""
        return cls(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))

    def objects(self) -> list[SessionObject]:
        """The batch, unpacked (on the worker)."""
        # The runner's own bytes, as Dask's own pickles are.
        batch: list[SessionObject] = pickle.loads(self.data)
        return batch


def shipped(task: Callable[..., BatchResult], root: Location, index: int, batch: PackedBatch,
            *args: Any, code: str | None = None) -> ShippedResult:
    """``task(root, index, batch, *args)`` on its packed batch, :func:`redacted`, then
    :func:`ship`: what every task of a run runs on its worker, the cyclic collector
    paused for the whole task (its objects' blocks collecting the young generations as
    each ends: :mod:`pipeline.run.collector`). With ``code`` (the command's
    :func:`code_digest`), refused on a worker that runs other code
    (:func:`check_own_code`)."""
    if code is not None:
        check_own_code(code)
    with cyclic_gc_paused():
        return ship(redacted(task, root, index, batch.objects(), *args))


def ship(result: BatchResult) -> ShippedResult:
    """A redacted result as it travels to the runner: every table encoded as the
    Parquet part the runner writes (:func:`~pipeline.io.commit.encode_part`), and the
    run summary's counts and examples read from them here.

    The runner is one process collecting what every worker sends: the tables would
    cost it their transfer (on the benchmark fleet a part is 4-8x smaller than its
    table) and their encoding, and its CPU comes out of the workers' on a small
    machine (docs/scaling.md, "The runner's share"). A result made on the runner (a
    quarantined session) is shipped there the same way.
    """
    t, f = result.sessions, result.findings
    severity_codes: Counter[tuple[str, str]] = Counter()
    if f.num_rows and "severity" in f.column_names:
        # Counted in Python: a batch has few findings, and Arrow's group_by (Acero) costs
        # ~50 ms a call, plus its import.
        severity_codes.update(zip(f["severity"].to_pylist(), f["code"].to_pylist(),
                                  strict=True))
    storages: Counter[str] = Counter()
    if t.num_rows and "storage" in t.column_names:
        for storage, content in zip(t["storage"].to_pylist(), t["content"].to_pylist(),
                                    strict=True):
            storages[str(storage)] += 1
            if content is not None:
                storages[f"{storage}:{content}"] += 1
    examples: dict[str, list[str]] = {}
    if t.num_rows and "status" in t.column_names:
        for status, path in zip(t["status"].to_pylist(), t["session_path"].to_pylist(),
                                strict=True):
            examples.setdefault(str(status), []).append(str(path))
    unread: list[str] = []
    if any(result.codes.get(code) for code in NOT_READ_CODES):
        not_read = pc.is_in(f["code"], value_set=pa.array(sorted(NOT_READ_CODES)))
        unread = f.filter(not_read)["session_path"].to_pylist()
    packets = result.extra.get("compaction")
    compaction = compaction_counts(packets) if packets is not None else {}
    if packets is not None and t.num_rows and "source" in t.column_names:
        # Claude Code and Codex transcripts get no plan (docs/formats.md): counted, so
        # that "0 of 12 sessions need packets" is not read as a verdict on them.
        compaction["transcripts_not_planned"] = sum(
            source not in (None, "vak") for source in t["source"].to_pylist())
    tables = {"integrity/sessions": t, "integrity/findings": f, **result.extra}
    return ShippedResult(
        result.index,
        {name: encode_part(table, OUTPUT_DATASETS[name]) for name, table in tables.items()},
        result.files, result.bytes_read, result.statuses, result.codes, severity_codes,
        storages, {status: sorted(paths)[:EXAMPLES] for status, paths in examples.items()},
        unread, compaction)


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


def _killed_worker() -> tuple[type[BaseException], ...]:
    # Only a Dask run can lose a worker; distributed is imported by then.
    dist = sys.modules.get("distributed")
    return (dist.KilledWorker,) if dist is not None else ()


def run_batches(
    executor: Executor | Client,
    root: Location,
    listing: Listing,
    on_result: Callable[[ShippedResult], None],
    context: RunContext | None = None,
    *,
    progress: bool | None = None,
    replay: ReplayOptions | None = None,
    previous: Mapping[str, Checkpoint | None] | None = None,
) -> int:
    """Submit one task per batch (audit, or audit and replay) and hand each result over
    as it arrives; every task gets the run's ``context`` and, with ``previous``, its
    objects' checkpoints.

    ``executor`` is an :class:`Executor` or a ``distributed`` client. A worker that dies
    under a task is Dask's business: the task runs again elsewhere. A task whose workers
    all died (``KilledWorker``, after Dask's ``allowed-failures``) is split in two halves,
    run again, and so on down to the one session that kills them, which is quarantined
    (``worker_crashed``); the rest of its batch is audited. Returns the number of tasks
    split so.

    Raises
    ------
    ClusterError
        More than :data:`MAX_KILLED_TASKS` tasks lost their workers.
    """
    run: Executor = (executor if isinstance(executor, (LocalExecutor, DaskExecutor))
                     else DaskExecutor(cast("Client", executor)))
    batches = plan_batches(listing.sessions, run.workers)
    planned: dict[Any, tuple[int, list[SessionObject]]] = {}
    # Workers in other processes check they run this code (one may join mid-run).
    code = code_digest() if isinstance(run, DaskExecutor) else None

    def submit(index: int, batch: list[SessionObject]) -> Any:
        packed = PackedBatch.of(batch)
        if replay is None:
            handle = run.submit(shipped, audit_batch, root, index, packed, context,
                                code=code)
        else:
            from pipeline.run.replay_batches import replay_batch

            handle = run.submit(shipped, replay_batch, root, index, packed, replay,
                                None if previous is None else
                                {o.key.path: previous.get(o.key.path) for o in batch},
                                context, code=code)
        planned[handle.key] = (index, batch)
        return handle

    reporter = lifecycle.current()
    if progress is not None:
        reporter.progress = progress
    reporter.stage(lifecycle.READING, sessions=len(listing.sessions),
                   nbytes=listing.total_bytes)
    handles = [submit(i, batch) for i, batch in enumerate(batches)]
    # Parts of split batches are numbered after the plan's, so every part name is unique.
    next_index = len(batches)
    killed = 0
    queue = run.as_completed(handles)
    for handle in queue:
        index, batch = planned.pop(handle.key)
        try:
            result: ShippedResult = handle.result()
        except _killed_worker() as caught:
            err = cast("KilledWorker", caught)
            handle.release()
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
            result = ship(quarantine(index, batch[0], err, previous))
        on_result(result)
        reporter.advance(len(batch), result.bytes_read)
        handle.release()
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
    max_line_bytes: int = MAX_LINE_BYTES,
    cluster: SharedCluster | None = None,
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
        The longest line read (``--max-line-bytes``), by the audit and the replay; a
        longer one is reported, never read into memory.
    cluster:
        The LocalCluster this run shares with other runs of the command, used (started
        when none is yet) only when the run needs a cluster and no scheduler is given.

    Returns
    -------
    RunSummary
        Counts of sessions, bytes, statuses and finding codes.
    """
    in_process = check_locations(root, out, scheduler)
    listing = list_sessions(root)
    if sessions is not None:
        listing = select_sessions(listing, sessions, root.url)
    summary = RunSummary(new_run_id(), root.url, out.url, len(listing.sessions),
                         listing.total_bytes, listing.skipped, archive=root.absolute_url)
    return execute_run(root, out, listing, summary, scheduler=scheduler, workers=workers,
                       progress=progress, replay=replay, in_process=in_process,
                       max_line_bytes=max_line_bytes, cluster=cluster)


def check_locations(root: Location, out: Location, scheduler: str | None) -> bool:
    """Refuse an output inside the archive, and memory:// with a remote cluster; check
    that the output takes a write (:func:`probe_output`); return whether the run must
    stay in this process (memory://). Before any object is listed or read."""
    lifecycle.stage(lifecycle.SETUP)
    check_output(root, out)
    # memory:// lives in this process only: its workers must be threads here, never the
    # workers of a scheduler (given, or found in DASK_SCHEDULER_ADDRESS).
    if root.protocol == "memory" and scheduler_address(scheduler):
        raise UsageError(
            "memory:// exists only inside this process; a remote cluster cannot read it"
        )
    probe_output(out)
    return "memory" in (root.protocol, out.protocol)


PROBE_NAME = ".vakpipe-write-probe"


def probe_output(out: Location) -> None:
    """Write and delete one small object under ``OUT/_staging``: an output that cannot
    be written (no bucket, no endpoint, read-only, no credentials) is found before the
    archive is listed, not when the first part is written a minute later. Folders the
    probe had to make are removed again when they were not there before.

    Raises
    ------
    StorageError
        The probe could not be written or deleted.
    """
    fs = out.filesystem()
    staging = out.join(STAGING)
    path = posixpath.join(staging, f"{PROBE_NAME}-{uuid.uuid4().hex[:8]}")
    out.check_inside(path)
    local = out.protocol in ("file", "local")
    made = [p for p in (out.path, staging) if local and not os.path.isdir(p)]
    try:
        out.makedirs(staging)
        fs.pipe_file(path, b"vakpipe\n")
        fs.rm_file(path)
    except storage_errors() as err:
        raise storage_error(err, out.url) from err
    finally:
        for folder in reversed(made):
            with suppress(OSError):
                os.rmdir(folder)


def list_sessions(root: Location) -> Listing:
    """:func:`~pipeline.io.storage.enumerate_sessions` as the run's ``listing`` stage (a
    local root that does not exist and one that holds no ledger get different
    messages there)."""
    lifecycle.stage(lifecycle.LISTING)
    return enumerate_sessions(root)


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
    max_line_bytes: int = MAX_LINE_BYTES,
    cluster: SharedCluster | None = None,
) -> RunSummary:
    """Run the tasks of ``listing`` and commit everything under ``out`` in one commit.

    ``previous`` (a nightly run) checks each object against its checkpoint and adds the
    ``checkpoints`` table; ``before_commit`` may stage more parts (rows carried
    forward) once every task is in; ``cluster`` as for :func:`run_audit`. The run's
    context (its id, ``max_line_bytes``, the staging folder of compacted copies) is built
    here once and shipped with every task.
    """
    schemas = {**DATASETS, **(REPLAY_DATASETS if replay is not None else {}),
               **(COMPACTION_DATASETS if replay is not None and replay.compaction else {}),
               **({"checkpoints": CHECKPOINTS_SCHEMA} if previous is not None else {})}
    staged = StagedRun(out, summary.run_id, schemas)
    write_archive = replay is not None and replay.compaction is not None and replay.write_archive
    # Before any task: a corrupt previous manifest, a link under OUT or a path of the
    # commit resolving into the archive stops the run here, with nothing written.
    staged.preflight(root, (ARCHIVE,) if write_archive else ())
    summary.skipped_examples = summary.skipped_examples or listing.skipped_examples
    # What only the run knows, settled once and shipped with every task. Workers write
    # the compacted copies into this run's staging folder; the commit publishes them
    # under OUT/archive with the rest, or not at all.
    context = RunContext(
        summary.run_id, max_line_bytes,
        staging=(dataclasses.replace(out, path=staged.stage_dir(ARCHIVE))
                 if write_archive else None),
        run_ns=time.time_ns())

    def collect(result: ShippedResult) -> None:
        for name, part in result.parts.items():
            staged.write_part(name, result.index, part)
        for name, paths in result.files.items():
            staged.add_files(name, paths)
        summary.note(result)

    try:
        if listing.sessions:
            with executor_for(listing, scheduler, workers, threads=in_process,
                              replays=replay is not None,
                              local=not reads_over_network(root), cluster=cluster) as run:
                if isinstance(run, DaskExecutor):
                    # The workers read with filesystems of their own: what this process's
                    # s3fs cached of the listing (~1.4 KiB a session, 1.35 GiB at 10^6)
                    # would be held through the run for nothing.
                    forget_listing(root)
                summary.failed_batches += run_batches(
                    run, root, listing, collect, context, progress=progress,
                    replay=replay, previous=previous)
        if before_commit is not None:
            before_commit(staged)
        # A signal during the commit waits for its end: once the manifest is renamed the
        # run is committed, and before that the crash-safe commit needs no interruption.
        with lifecycle.deferred_signals():
            lifecycle.stage(lifecycle.COMMITTING)
            staged.commit(summary.as_dict())
    except lifecycle.Interrupted as stop:
        if not stop.committed:
            staged.abort()
        raise
    except BaseException:
        staged.abort()
        raise
    return summary
