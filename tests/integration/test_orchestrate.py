"""Tests of pipeline.run.orchestrate (and the per-batch functions of pipeline.run.batches).

The end-to-end audits read a generated fleet with injected faults from moto's S3 server
over real HTTP, on Dask clusters of worker processes: a LocalCluster, and a scheduler
and workers started as separate ``dask`` processes.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import dask
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client
from fsspec.implementations.memory import MemoryFileSystem

import pipeline.run.orchestrate as orchestrate
from pipeline.errors import ClusterError, OutputInsideArchiveError, UsageError
from pipeline.io.commit import read_dataset, read_manifest
from pipeline.io.storage import Listing, Location, SessionObject, enumerate_sessions, resolve
from pipeline.ledger.layout import SessionKey
from pipeline.run.batches import audit_batch
from pipeline.run.orchestrate import (
    LOCAL_MAX_AUDIT_BYTES,
    LOCAL_MAX_SESSIONS,
    MAX_BATCH_BYTES,
    MAX_BATCH_FILES,
    MIN_BATCH_BYTES,
    TAIL_SPLIT,
    TASKS_PER_WORKER,
    PackedBatch,
    RunSummary,
    cut_batches,
    last_wave,
    plan_batches,
    redacted,
    run_audit,
    runs_in_process,
    shipped,
)
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from pipeline.tables.schemas import OUTPUT_DATASETS
from tests.helpers.ledgers import sample_session, session_key
from tests.helpers.storage import BUCKET, plain_rows

SESSIONS, FINDINGS = "integrity/sessions", "integrity/findings"
MB = 2**20


# --- plan_batches -------------------------------------------------------------------------


def objects(sizes: list[int]) -> list[SessionObject]:
    out = []
    for i, size in enumerate(sizes):
        key = SessionKey(f"agents/vak/sessions/h/{i:06d}.jsonl", "vak", "h", f"{i:06d}")
        out.append(SessionObject(key, f"root/{key.path}", size))
    return out


def check_cut(batches: list[list[SessionObject]], most_bytes: int, most_files: int) -> None:
    """A cut within its limits, each batch closed only because the next session did not
    fit."""
    for i, b in enumerate(batches):
        size = sum(s.size for s in b)
        assert b and len(b) <= most_files
        # No batch is over the limit, unless it is one session larger than it.
        assert size <= most_bytes or len(b) == 1, (i, size, most_bytes)
        if i + 1 < len(batches) and len(b) < most_files:
            assert size + batches[i + 1][0].size > most_bytes


def expected_target(total: int, workers: int) -> int:
    """The batch target the plan's rule gives (stated here, not read from the code under
    test): ``TASKS_PER_WORKER`` batches a worker, clamped to the batch size limits."""
    per_task = total // max(1, workers * TASKS_PER_WORKER)
    return min(MAX_BATCH_BYTES, max(MIN_BATCH_BYTES, per_task))


def check_plan(sessions: list[SessionObject], workers: int) -> list[list[SessionObject]]:
    """Invariants of every plan; returns it."""
    batches = plan_batches(sessions, workers)
    total = sum(s.size for s in sessions)
    target = expected_target(total, workers)
    # Whole sessions, each exactly once, in path order: nothing split, lost or doubled.
    assert [s for b in batches for s in b] == sessions
    # An even cut, whose last wave (the batches ending in the last target's worth of
    # bytes a worker) is cut finer with several workers.
    even = cut_batches(sessions, target, MAX_BATCH_FILES)
    kept = last_wave(even, total - workers * target) if workers > 1 else len(even)
    check_cut(batches[:kept + 1], target, MAX_BATCH_FILES)
    check_cut(batches[kept:], max(MIN_BATCH_BYTES, target // TAIL_SPLIT),
              MAX_BATCH_FILES // TAIL_SPLIT)
    return batches


def test_plan_batches_empty_and_tiny() -> None:
    assert plan_batches([], 4) == []
    small = objects([1000] * 10)
    assert check_plan(small, 4) == [small]  # below MIN_BATCH_BYTES: one task
    assert check_plan(small, 0) == [small]


@pytest.mark.parametrize("seed", range(6))
def test_plan_batches_never_splits_and_balances_bytes(seed: int) -> None:
    rng = random.Random(seed)
    workers = rng.choice([1, 2, 4, 16])
    # Heavy-tailed sizes, as session sizes are, a few larger than any target.
    sizes = [int(rng.lognormvariate(13, 1.5)) for _ in range(rng.randrange(50, 3000))]
    sizes += [MAX_BATCH_BYTES + 1] * rng.randrange(0, 3)
    rng.shuffle(sizes)
    sessions = objects(sizes)
    batches = check_plan(sessions, workers)
    total = sum(sizes)
    target = expected_target(total, workers)
    small = max(MIN_BATCH_BYTES, target // TAIL_SPLIT)
    # Balanced: two neighbours always hold more than their limit, so the batch count
    # stays within twice the ideal (the last wave's at its finer size, plus one each).
    # The last wave: a target's worth a worker, and the batch that ends in it.
    wave = min(total, (workers + 1) * target) if workers > 1 else 0
    assert len(batches) <= 2 * total // target + 2 * wave // small + 2


def test_plan_batches_uniform_sessions_make_even_batches() -> None:
    sessions = objects([MB] * 400)  # 400 MB over 2 workers: target 50 MB
    batches = check_plan(sessions, 2)
    # The last wave (100 MB, one target a worker) in batches a quarter the size.
    assert [len(b) for b in batches] == [50] * 6 + [12] * 8 + [4]
    # A remainder is in the last wave, which still holds a target's worth a worker.
    batches = check_plan(sessions + objects([MB // 2]), 2)
    assert [len(b) for b in batches] == [50] * 6 + [12] * 8 + [5]
    # One worker waits for nobody: even batches to the end.
    assert [len(b) for b in check_plan(sessions, 1)] == [100] * TASKS_PER_WORKER


def test_plan_batches_last_wave_is_finer_in_files_too() -> None:
    # Small sessions: the file count binds, in the last wave at a quarter of it. 24 MB
    # over 2 workers: a target of MIN_BATCH_BYTES, the last 16 MiB the last wave.
    sessions = objects([1024] * 24_000)
    batches = check_plan(sessions, 2)
    quarter = MAX_BATCH_FILES // TAIL_SPLIT
    assert [len(b) for b in batches] == [MAX_BATCH_FILES] * 3 + [quarter] * 36
    # An archive smaller than a wave is all last wave.
    assert [len(b) for b in check_plan(objects([10] * 3000), 2)] == [quarter] * 6


def test_plan_batches_file_count_limit() -> None:
    sessions = objects([10] * (2 * MAX_BATCH_FILES + 5))
    batches = check_plan(sessions, 1)
    assert [len(b) for b in batches] == [MAX_BATCH_FILES, MAX_BATCH_FILES, 5]


def test_plan_batches_giant_sessions_travel_alone() -> None:
    sessions = objects([10, MAX_BATCH_BYTES * 2, 10, MAX_BATCH_BYTES * 3, 10])
    batches = check_plan(sessions, 2)
    assert [len(b) for b in batches] == [1, 1, 1, 1, 1]


def test_a_batch_travels_packed_and_arrives_whole() -> None:
    # Pickled once by the runner: Dask (re)pickles only the bytes, never the objects.
    batch = objects([10, 20, 30])
    packed = PackedBatch.of(batch)
    travelled = pickle.loads(pickle.dumps(packed))
    assert travelled == packed and travelled.objects() == batch
    assert len(pickle.dumps(packed)) < len(packed.data) + 100


# --- runs_in_process ----------------------------------------------------------------------


@pytest.mark.parametrize(("mb", "replays", "local"), [
    (1, True, True), (32, True, True), (33, True, False), (33, False, True),
    (128, False, True), (129, False, False), (129, True, False)])
def test_a_small_run_executes_in_process_by_what_it_does(
        mb: int, replays: bool, local: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # On many cores a run that only audits stays in process up to 128 MiB, one that
    # replays up to 32 MiB (docs/reliability.md, "Small archives in process").
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.setattr(orchestrate, "local_cores", lambda: 10_000)
    listing = Listing(objects([mb * MB // 4] * 4), 0)
    assert runs_in_process(listing, None, None, replays) is local
    assert runs_in_process(listing, None, 0, replays)  # --workers 0: always
    assert not runs_in_process(listing, None, 2, replays)  # --workers N: never
    many = Listing(objects([1] * (LOCAL_MAX_SESSIONS + 1)), 0)
    assert not runs_in_process(many, None, None, replays)
    assert orchestrate.LOCAL_MAX_BYTES == 32 * MB and LOCAL_MAX_AUDIT_BYTES == 128 * MB


def test_workers_beyond_the_sessions_are_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    # `--workers 100` over 3 sessions: 3 workers, each with a task; the others would
    # cost a process start each and do nothing (threads here: the count is the point).
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    with orchestrate.executor_for(Listing(objects([MB] * 3), 0), None, 100,
                                  threads=True) as executor:
        assert isinstance(executor, orchestrate.DaskExecutor) and executor.workers == 3


@pytest.mark.parametrize(("cores", "audit_mb", "replay_mb"), [
    (1, 384, 96), (2, 288, 72), (4, 177, 44), (16, 137, 34)])
def test_on_fewer_cores_a_bigger_run_stays_in_process(
        cores: int, audit_mb: int, replay_mb: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fewer the cores, the less a cluster gains and the more work it needs to catch
    # up with its start: 2.25x the limits on two cores (measured there: the in-process
    # audit finishes first up to ~550 MB, the replay up to ~88 MB), never more than 3x.
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.setattr(orchestrate, "local_cores", lambda: cores)
    for mb, replays in ((audit_mb, False), (replay_mb, True)):
        assert runs_in_process(Listing(objects([mb * MB]), 0), None, None, replays, True)
        assert not runs_in_process(Listing(objects([(mb + 1) * MB]), 0), None, None, replays,
                                   True)
        # An object store's archive keeps the limits of many cores: its reads wait on
        # the network, which a cluster's workers do side by side.
        base = LOCAL_MAX_AUDIT_BYTES if not replays else orchestrate.LOCAL_MAX_BYTES
        assert runs_in_process(Listing(objects([base]), 0), None, None, replays)
        assert not runs_in_process(Listing(objects([base + 1]), 0), None, None, replays)
    # and thousands of small sessions, whose count is work as bytes are
    sessions = int(LOCAL_MAX_SESSIONS * orchestrate.core_factor(cores))
    assert runs_in_process(Listing(objects([1] * sessions), 0), None, None, False, True)
    assert not runs_in_process(Listing(objects([1] * (sessions + 1)), 0), None, None, False,
                               True)
    assert not runs_in_process(Listing(objects([1] * (LOCAL_MAX_SESSIONS + 1)), 0), None,
                               None, False)
    assert orchestrate.core_factor(cores) <= orchestrate.MAX_CORE_FACTOR


def test_the_cores_are_the_ones_this_process_may_run_on() -> None:
    # Under taskset or a cpuset, not the machine's: the cluster's workers too.
    assert 1 <= orchestrate.local_cores() <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert orchestrate.local_cores() == len(os.sched_getaffinity(0))


@pytest.mark.skipif(shutil.which("taskset") is None, reason="no taskset here (util-linux)")
def test_a_process_started_under_taskset_counts_its_one_core() -> None:
    done = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c",
         "from pipeline.run.orchestrate import core_factor, local_cores\n"
         "print(local_cores(), core_factor(local_cores()))"],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.split() == ["1", "3.0"]


def _cpu_cgroup(tmp_name: str) -> Path | None:
    """A new cgroup v1 ``cpu`` group where this machine lets the test make one."""
    mount = Path("/sys/fs/cgroup/cpu")
    try:
        if "cpu" not in Path("/proc/self/cgroup").read_text() or not mount.is_dir():
            return None
        folder = mount / tmp_name
        folder.mkdir()
    except OSError:
        return None
    return folder


def test_a_process_in_a_cgroup_with_half_a_cpu_counts_one_core() -> None:
    # A real group with a CFS quota (a container's --cpus 0.5), the process put in it by
    # its pid: the LocalCluster it would start has one worker, and in-process limits
    # are one core's.
    folder = _cpu_cgroup(f"vakpipe-test-{os.getpid()}")
    if folder is None:
        pytest.skip("no cgroup v1 cpu controller this test may add a group to")
    try:
        (folder / "cpu.cfs_period_us").write_text("100000")
        (folder / "cpu.cfs_quota_us").write_text("50000")
        done = subprocess.run(
            ["sh", "-c", f'echo $$ > {folder}/cgroup.procs && exec "$0" -c "$1"',
             sys.executable,
             "from pipeline.run.orchestrate import cgroup_cpu_quota, local_cores\n"
             "print(cgroup_cpu_quota(), local_cores())"],
            capture_output=True, text=True, check=True,
            cwd=Path(__file__).resolve().parents[2])
        assert done.stdout.split() == ["0.5", "1"]
    finally:
        folder.rmdir()


def test_a_run_asks_by_whether_it_replays(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.run.replay_batches import ReplayOptions

    asked: list[tuple[bool, bool]] = []
    real = orchestrate.runs_in_process

    def spy(listing: Listing, scheduler: str | None, workers: int | None,
            replays: bool = True, local: bool = False) -> bool:
        asked.append((replays, local))
        return real(listing, scheduler, 0, replays, local)  # run here whatever it answers

    monkeypatch.setattr(orchestrate, "runs_in_process", spy)
    root = tmp_path / "archive"
    (root / "agents/vak/sessions/h").mkdir(parents=True)
    (root / "agents/vak/sessions/h/s.jsonl").write_bytes(sample_session().to_bytes())
    run_audit(resolve(str(root)), resolve(str(tmp_path / "out")), progress=False)
    run_audit(resolve(str(root)), resolve(str(tmp_path / "replayed")), progress=False,
              replay=ReplayOptions())
    assert asked == [(False, True), (True, True)]  # and a folder is a local archive


# --- run_audit on a faulty fleet in S3 ----------------------------------------------------


def truth_of(archive: Location) -> dict[str, dict[str, Any]]:
    fs = archive.filesystem()
    return json.loads(fs.cat_file(archive.join("ground-truth.json")))  # type: ignore[no-any-return]


@pytest.fixture
def faulty_archive(s3: LocalS3) -> Location:
    """60 generated sessions (every fault kind at least once) in the test bucket."""
    archive = resolve(f"s3://{BUCKET}/archive")
    write_fleet(archive, sessions=60, seed=3, faults=True, size_scale=0.5)
    return archive


def check_against_truth(archive: Location, out: Location, summary: orchestrate.RunSummary) -> None:
    truth = truth_of(archive)
    sessions = {r["session_path"]: r for r in plain_rows(read_dataset(out, SESSIONS))}
    findings = plain_rows(read_dataset(out, FINDINGS))
    assert set(sessions) == set(truth)
    reported = {(r["session_path"], r["line"], r["code"]) for r in findings}
    expected = {(p, f["line"], f["code"]) for p, t in truth.items() for f in t["findings"]}
    assert expected and expected <= reported, sorted(expected - reported)
    faults = {t["fault"] for t in truth.values()} - {None}
    assert len(faults) >= 15  # the fleet really exercises most fault kinds
    for path, t in truth.items():
        row = sessions[path]
        assert (row["lines"], row["bytes"]) == (t["lines"], t["bytes"]), path
        if t["fault"] is None:  # clean sessions stay clean (info findings only)
            assert row["status"] == "ok", (path, row)
        else:
            assert row["status"] in ("warning", "error"), (path, t["fault"])
    # The summary and the manifest agree with the tables.
    assert summary.sessions == len(truth) and summary.skipped_objects == 1
    assert summary.bytes == sum(t["bytes"] for t in truth.values())
    assert summary.codes == Counter(r["code"] for r in findings)
    assert summary.statuses == Counter(r["status"] for r in sessions.values())
    manifest = read_manifest(out)
    assert manifest is not None and manifest["run_id"] == summary.run_id
    assert manifest["datasets"][FINDINGS]["rows"] == len(findings)


@pytest.mark.slow
def test_run_audit_on_a_local_cluster_reports_every_injected_fault(
    faulty_archive: Location, tmp_path: Path
) -> None:
    out = resolve(f"s3://{BUCKET}/audit")
    summary = run_audit(faulty_archive, out, workers=2, progress=False)  # its own cluster
    check_against_truth(faulty_archive, out, summary)


def test_a_run_on_a_cluster_does_not_hold_the_listing(
    faulty_archive: Location, scheduler: str
) -> None:
    # The workers read with their own filesystems: the listing s3fs cached in this
    # process (~1.4 KiB a session) is dropped once the run is on the cluster.
    run_audit(faulty_archive, resolve(f"s3://{BUCKET}/audit"), scheduler=scheduler,
              progress=False)
    cached = faulty_archive.filesystem().dircache
    assert not [path for path in cached if path.startswith(faulty_archive.path)]


@pytest.mark.slow
def test_separate_process_cluster_gives_identical_rows(
    faulty_archive: Location, scheduler: str, separate_cluster: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local_out = resolve(f"s3://{BUCKET}/on-local-cluster")
    remote_out = resolve(f"s3://{BUCKET}/on-separate-processes")
    local = run_audit(faulty_archive, local_out, scheduler=scheduler, progress=False)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", separate_cluster)
    with Client(separate_cluster, set_as_default=False) as client:
        before = client.scheduler_info()["workers"]
        assert len(before) == 2
        remote = run_audit(faulty_archive, remote_out, progress=False)  # env var only
        tasks = client.run_on_scheduler(
            lambda dask_scheduler: len(dask_scheduler.transition_log))
    assert tasks > 0  # the work went through the separate scheduler
    check_against_truth(faulty_archive, remote_out, remote)
    for dataset in (SESSIONS, FINDINGS, "usage", "subagents"):
        assert plain_rows(read_dataset(remote_out, dataset)) == \
            plain_rows(read_dataset(local_out, dataset))
    assert (remote.codes, remote.statuses) == (local.codes, local.statuses)


def test_run_audit_refuses_an_output_inside_the_archive(s3: LocalS3) -> None:
    archive = resolve(f"s3://{BUCKET}/archive")
    with pytest.raises(OutputInsideArchiveError):
        run_audit(archive, resolve(f"s3://{BUCKET}/archive/out"))


def test_memory_archive_cannot_go_to_a_remote_cluster(
    memfs: fsspec.AbstractFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, out = resolve("memory://mem/archive"), resolve(str(tmp_path / "out"))
    with pytest.raises(UsageError, match="memory://"):
        run_audit(archive, out, scheduler="tcp://127.0.0.1:1")
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:1")
    with pytest.raises(UsageError, match="memory://"):
        run_audit(archive, out)


# --- objects that cannot be read ----------------------------------------------------------


@pytest.mark.slow
def test_object_deleted_between_listing_and_reading(
    faulty_archive: Location, scheduler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone: list[str] = []

    def list_then_delete(root: Location) -> Listing:
        listing = enumerate_sessions(root)
        victim = listing.sessions[7]
        root.filesystem().rm(victim.full_path)
        gone.append(victim.key.path)
        return listing

    monkeypatch.setattr(orchestrate, "enumerate_sessions", list_then_delete)
    out = resolve(f"s3://{BUCKET}/audit")
    summary = run_audit(faulty_archive, out, scheduler=scheduler, progress=False)
    assert summary.sessions == 60 and summary.codes["unreadable_object"] == 1
    (finding,) = [r for r in plain_rows(read_dataset(out, FINDINGS))
                  if r["code"] == "unreadable_object"]
    assert finding["session_path"] == gone[0] and finding["severity"] == "error"
    assert finding["line"] is None and "FileNotFoundError" in finding["detail"]
    row = next(r for r in plain_rows(read_dataset(out, SESSIONS))
               if r["session_path"] == gone[0])
    assert (row["status"], row["errors"]) == ("error", 1)
    assert len(plain_rows(read_dataset(out, SESSIONS))) == 60


class _FailingRead(io.RawIOBase):
    """A file that gives a few bytes, then fails like a dropped connection."""

    def __init__(self, data: bytes, error: Exception) -> None:
        self._data = data[:100]
        self._error = error

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._data:
            raise self._error
        n = min(len(buffer), len(self._data))
        buffer[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


class FlakyMemoryFileSystem(MemoryFileSystem):
    """fsspec's memory filesystem, but reading some objects fails, by name.

    ``denied*`` cannot be opened; ``reset*`` and ``cut*`` fail after 100 bytes, the first
    like a reset connection, the second like s3fs once its retries of a body cut short
    are spent (aiohttp's ``ClientPayloadError``, which is not an ``OSError``).
    """

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        name = path.rsplit("/", 1)[-1]
        if "r" not in mode:
            pass
        elif name.startswith("denied"):
            raise PermissionError(f"{path}: permission denied (simulated)")
        elif name.startswith("reset"):
            return _FailingRead(self.cat_file(path), ConnectionResetError("connection reset"))
        elif name.startswith("cut"):
            error = aiohttp.ClientPayloadError("Response payload is not completed")
            return _FailingRead(self.cat_file(path), error)
        return super()._open(path, mode, **kwargs)


@pytest.fixture
def flaky_memory(
    memfs: fsspec.AbstractFileSystem, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """``memory://`` served by :class:`FlakyMemoryFileSystem` for this test."""
    registry = importlib.import_module("fsspec.registry")  # the module, not its proxy
    monkeypatch.setitem(registry._registry, "memory", FlakyMemoryFileSystem)
    FlakyMemoryFileSystem.clear_instance_cache()
    yield
    FlakyMemoryFileSystem.clear_instance_cache()


def test_unreadable_objects_become_findings_and_the_run_completes(
    flaky_memory: None, tmp_path: Path
) -> None:
    archive = resolve("memory://flaky/archive")
    fs = archive.filesystem()
    assert isinstance(fs, FlakyMemoryFileSystem)
    data = sample_session().to_bytes()
    base = session_key().path.rsplit("/", 1)[0]
    names = ["denied-1", "fine-1", "reset-1", "cut-1", "fine-2"]
    for name in names:
        fs.pipe_file(archive.join(base, f"{name}.jsonl"), data)
    out = resolve(str(tmp_path / "out"))
    summary = run_audit(archive, out, workers=1, progress=False)
    assert summary.sessions == 5 and summary.codes["unreadable_object"] == 3
    rows = {r["session_path"].rsplit("/", 1)[-1]: r
            for r in plain_rows(read_dataset(out, SESSIONS))}
    assert rows["fine-1.jsonl"]["lines"] == rows["fine-2.jsonl"]["lines"] == len(data.splitlines())
    for name in ("denied-1.jsonl", "reset-1.jsonl", "cut-1.jsonl"):
        assert rows[name]["status"] == "error" and rows[name]["bytes"] == len(data)
    details = {r["session_path"].rsplit("/", 1)[-1]: r["detail"]
               for r in plain_rows(read_dataset(out, FINDINGS)) if r["code"] == "unreadable_object"}
    assert details["denied-1.jsonl"].startswith("PermissionError:")
    assert details["reset-1.jsonl"].startswith("ConnectionResetError:")
    assert details["cut-1.jsonl"].startswith("ClientPayloadError:")


def test_audit_batch_keeps_going_past_an_unreadable_object(
    flaky_memory: None,
) -> None:
    root = resolve("memory://batch")
    fs = root.filesystem()
    data = sample_session().to_bytes()
    base = session_key().path.rsplit("/", 1)[0]
    for name in ("a", "denied", "z"):
        fs.pipe_file(root.join(base, f"{name}.jsonl"), data)
    listing = enumerate_sessions(root)
    result = audit_batch(root, 5, listing.sessions)
    assert result.index == 5 and result.sessions.num_rows == 3
    assert result.codes["unreadable_object"] == 1
    assert result.statuses["error"] == 1 and sum(result.statuses.values()) == 3
    assert result.bytes_read == 3 * len(data)


def test_a_task_ships_its_tables_encoded_and_the_summary_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every task runs :func:`shipped`: each table the redacted task made, encoded as
    the runner's part, and what the run's summary reads of them, for the audit and the
    replay alike; the runner's summary of the shipped batches is that of the tables."""
    from pipeline.run.replay_batches import ReplayOptions, replay_batch

    examples = 2  # fewer than the sessions of a status: the cut is exercised
    monkeypatch.setattr(orchestrate, "EXAMPLES", examples)
    root = resolve(str(tmp_path))
    write_fleet(root, sessions=12, seed=3, faults=True)
    batch = enumerate_sessions(root).sessions
    for task, args in ((audit_batch, ()), (replay_batch, (ReplayOptions(),))):
        plain = redacted(task, root, 0, batch, *args)
        sent = shipped(task, root, 0, PackedBatch.of(batch), *args)
        tables = {SESSIONS: plain.sessions, FINDINGS: plain.findings, **plain.extra}
        assert sent.parts.keys() == tables.keys() >= {SESSIONS, FINDINGS, "usage"}
        for name, part in sent.parts.items():
            assert part.rows == tables[name].num_rows
            assert pq.read_table(pa.BufferReader(part.data)).equals(
                tables[name].cast(OUTPUT_DATASETS[name]))
        assert (sent.statuses, sent.codes) == (plain.statuses, plain.codes)
        columns = ["session_path", "status", "storage"]
        rows = plain.sessions.select(columns).to_pylist()
        findings = plain.findings.select(["severity", "code"]).to_pylist()
        assert sent.severity_codes == Counter((f["severity"], f["code"]) for f in findings)
        assert sent.storages == Counter(r["storage"] for r in rows)
        assert sent.status_examples == {
            status: sorted(r["session_path"] for r in rows if r["status"] == status)[:examples]
            for status in {r["status"] for r in rows}}
    # Batches merged: the first sessions of each status over the run, sorted.
    summary = RunSummary("r", "root", "out")
    for index in range(0, len(batch), 5):
        summary.note(shipped(audit_batch, root, index,
                             PackedBatch.of(batch[index:index + 5])))
    whole = redacted(audit_batch, root, 0, batch).sessions.select(columns).to_pylist()
    assert summary.status_examples == {
        status: sorted(r["session_path"] for r in whole if r["status"] == status)[:examples]
        for status in {r["status"] for r in whole}}
    assert sum(summary.statuses.values()) == len(batch)


def test_a_scheduler_whose_workers_run_other_vakpipe_code_is_refused(
    scheduler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session cluster's workers run this checkout; the command is made to run
    "another" (its digest patched here only): refused at connect, one line."""
    assert orchestrate.code_digest() == orchestrate.code_digest()  # cached, same
    with orchestrate.dask_client(scheduler) as client:  # same code: accepted
        assert set(client.run(orchestrate._workers_code_digest).values()) == {
            orchestrate.code_digest()}
    monkeypatch.setattr(orchestrate, "code_digest", lambda: "0" * 16)
    other = (r"^2 of 2 workers of tcp://\S+ run other vakpipe code than this command "
             r"\(tcp://\S+: [0-9a-f]{16}, here: 0{16}\): install this vakpipe on the workers")
    with pytest.raises(ClusterError, match=other), orchestrate.dask_client(scheduler):
        pass

    def unknown_to_the_workers() -> str:
        raise ImportError("No module named 'pipeline.run.newer'")

    monkeypatch.setattr(orchestrate, "_workers_code_digest", unknown_to_the_workers)
    with (pytest.raises(ClusterError, match=r"cannot run this vakpipe's code \(ImportError"),
          orchestrate.dask_client(scheduler)):
        pass


def test_a_worker_that_joins_with_other_code_runs_no_task(
    scheduler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connect check sees the workers there at the start; one that joins later is
    refused by its first task. Simulated as the connect test is: the command's digest is
    patched here only, and the client is made without the connect check."""
    root = tmp_path / "archive"
    write_fleet(resolve(str(root)), sessions=4, seed=5, size_scale=0.2)
    listing = enumerate_sessions(resolve(str(root)))
    monkeypatch.setattr(orchestrate, "code_digest", lambda: "0" * 16)
    refused = (r"^worker tcp://\S+ runs other vakpipe code than this command "
               r"\([0-9a-f]{16}, here: 0{16}\): install this vakpipe on the workers, or run "
               r"without --scheduler$")
    with (Client(scheduler, set_as_default=False) as client,
          pytest.raises(ClusterError, match=refused)):
        orchestrate.run_batches(client, resolve(str(root)), listing, lambda _: None,
                                progress=False)
    with pytest.raises(ClusterError, match=r"^a worker runs other vakpipe code"):
        shipped(audit_batch, resolve(str(root)), 0, PackedBatch.of(listing.sessions),
                code="1" * 16)  # in a process that is no worker


def test_dask_client_uses_the_configured_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    monkeypatch.setenv("DASK_TEMPORARY_DIRECTORY", str(scratch))
    with orchestrate.dask_client(workers=1, processes=False) as client:
        assert client.submit(sum, [1, 2], pure=False).result() == 3
    assert scratch.exists()


def test_local_workers_keep_glibc_own_trim_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    # distributed's default (65536) makes a worker parse JSON 20-30% slower
    # (orchestrate.WORKER_CONFIG); a LocalCluster's workers must not inherit it.
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with orchestrate.dask_client(workers=1) as client:
        seen = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
    assert list(seen.values()) == [None]


def test_local_workers_run_without_the_statistical_profiler() -> None:
    # A stack walk every 10 ms for a dashboard vakpipe does not serve (WORKER_CONFIG).
    with orchestrate.dask_client(workers=1) as client:
        seen = client.run(lambda: dask.config.get("distributed.worker.profile.enabled"))
    assert list(seen.values()) == [False]
