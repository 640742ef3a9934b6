"""Rows 8 and 9: workers killed by signals, once and every time.

Both run on a scheduler and workers started as separate ``dask`` processes (each worker
under a nanny, as ``dask worker --nworkers 2`` deploys them), so a worker process
SIGKILLed is restarted by its nanny and Dask reschedules what it held.

* Row 8: one worker is killed while it is inside a task (held in the middle of a read by
  the fault proxy); the run's tables are identical to an undisturbed run's.
* Row 9: no real input crashes a worker (that is the point of the reader), so the test
  workers get a poison: a worker preload (written by the test, given to the test's
  workers only through ``DASK_DISTRIBUTED__WORKER__PRELOAD``) wraps the audit so that
  the worker SIGKILLs itself when it starts on the session named by
  ``VAKPIPE_TEST_POISON``. Nothing of it is in vakpipe. The session is quarantined
  (``worker_crashed``) after Dask's allowed failures; the rest of its batch, and of the
  run, is audited; the run is partial.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from distributed import Client

import pipeline.run.orchestrate as orchestrate
from pipeline.cli import EXIT_OK, EXIT_PARTIAL, run
from pipeline.io.commit import read_manifest
from pipeline.io.storage import Location, enumerate_sessions, resolve
from pipeline.run.replay_batches import ReplayOptions
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from pipeline.tables.schemas import DATASETS, REPLAY_DATASETS
from tests.helpers.fault_proxy import FaultProxy, Rule
from tests.helpers.storage import BUCKET, committed_rows

ARCHIVE = f"s3://{BUCKET}/archive"
TABLES = sorted({*DATASETS, *REPLAY_DATASETS})
#: Each worker holds one task at a time (the default, 1.1, lets a single-threaded worker
#: hold a second one queued, which a death would count as failed too).
ONE_TASK = {"DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0"}


@pytest.fixture
def many_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small sessions still make several tasks (two per worker, of about two sessions,
    the last wave no finer: a batch to bisect holds more than one)."""
    monkeypatch.setattr(orchestrate, "MIN_BATCH_BYTES", 1)
    monkeypatch.setattr(orchestrate, "TASKS_PER_WORKER", 2)
    monkeypatch.setattr(orchestrate, "TAIL_SPLIT", 1)


def tables(out: Location, names: list[str] = TABLES) -> dict[str, list[dict[str, Any]]]:
    return {d: committed_rows(out, d) for d in names}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """Poll ``condition`` (a guard against a hang, not a measure of time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.05)


# --- row 8: a worker killed mid-task ------------------------------------------------------


@pytest.mark.slow
def test_a_worker_killed_mid_task_changes_nothing_in_the_results(
    s3: LocalS3, proxy: FaultProxy, many_batches: None, scheduler: str,
    start_separate_cluster: Callable[..., Any],
) -> None:
    write_fleet(resolve(ARCHIVE), sessions=8, seed=40, faults=True, size_scale=0.2)
    root = resolve(ARCHIVE, {"endpoint_url": proxy.endpoint})
    options = ReplayOptions()
    undisturbed = resolve(f"s3://{BUCKET}/undisturbed")
    orchestrate.run_audit(root, undisturbed, scheduler=scheduler, progress=False,
                          replay=options)
    proxy.clear()

    # Every read of a ledger waits at the proxy until a worker has been killed, so both
    # workers are inside a task when the signal comes.
    go = threading.Event()
    proxy.add(Rule("call", r"^archive/agents/", "GET", times=None,
                   callback=lambda key: go.wait(timeout=120) and None))
    cluster = start_separate_cluster(nworkers=2, env=ONE_TASK)
    out = resolve(f"s3://{BUCKET}/disturbed")
    done: list[Any] = []
    runner = threading.Thread(target=lambda: done.append(orchestrate.run_audit(
        root, out, scheduler=cluster.address, progress=False, replay=options)))
    def held() -> list[Any]:  # reads of ledgers (not the listing's GETs) held
        return [r for r in proxy.requests(method="GET") if r.key.startswith("archive/")]

    with Client(cluster.address, set_as_default=False) as client:
        runner.start()
        try:
            wait_for(lambda: len(held()) >= 2, "both workers in a read")
            before = set(client.run(os.getpid).values())
            # The worker process whose read is held at the proxy: its socket's owner.
            port = held()[0].peer[1]
            (victim,) = {c.pid for c in psutil.net_connections("tcp")
                         if c.laddr and c.laddr.port == port and c.pid in before}
            os.kill(victim, signal.SIGKILL)
        finally:
            go.set()
        runner.join(timeout=300)
        assert done, "the run did not finish"
        after = set(client.run(os.getpid).values())
    assert victim in before and victim not in after  # it died; its nanny restarted it
    # The killed task was run again: some ledger was read twice.
    reads = [r.key for r in proxy.requests(method="GET") if r.key.startswith("archive/")]
    assert len(reads) > len(set(reads)) == 8
    assert tables(out) == tables(undisturbed)
    assert done[0].failed_batches == 0 and not done[0].partial


# --- row 9: an input that kills every worker that touches it ------------------------------

POISON_PRELOAD = '''
"""Test-only worker preload (tests/reliability/test_cluster_faults.py): the worker
SIGKILLs itself when it starts auditing the session named by VAKPIPE_TEST_POISON."""
import os
import signal

import pipeline.run.batches as batches

POISON = os.environ["VAKPIPE_TEST_POISON"]


def poisoned(audit_session):
    def audit(key, lines, size=None, **options):
        if POISON in key.path:
            os.kill(os.getpid(), signal.SIGKILL)
        return audit_session(key, lines, size=size, **options)
    return audit


# The one per-object pipeline (read_object) audits for the audit and the replay tasks.
batches.audit_lines = poisoned(batches.audit_lines)
'''


@pytest.mark.slow
def test_a_poison_session_is_quarantined_and_the_rest_of_its_batch_audited(
    s3: LocalS3, many_batches: None, scheduler: str, tmp_path: Path,
    start_separate_cluster: Callable[..., Any], capsys: pytest.CaptureFixture[str],
) -> None:
    write_fleet(resolve(ARCHIVE), sessions=8, seed=41, faults=True, size_scale=0.2)
    paths = [o.key.path for o in enumerate_sessions(resolve(ARCHIVE)).sessions]
    poison = paths[3]
    preload = tmp_path / "poison_preload.py"
    preload.write_text(POISON_PRELOAD)
    # One allowed failure (Dask's default is 3) keeps the test short: the poison's batch
    # kills two workers, then the half that holds it two more.
    cluster = start_separate_cluster(nworkers=2, env={
        **ONE_TASK, "DASK_DISTRIBUTED__WORKER__PRELOAD": f'["{preload}"]',
        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1",
        "VAKPIPE_TEST_POISON": poison.rsplit("/", 1)[-1]})
    common = ["--no-progress", "--replay"]
    assert run(["audit", ARCHIVE, "--out", f"s3://{BUCKET}/reference", "--scheduler",
                scheduler, *common]) == EXIT_OK
    capsys.readouterr()
    code = run(["audit", ARCHIVE, "--out", f"s3://{BUCKET}/out", "--scheduler",
                cluster.address, *common, "--fail-on", "error"])
    printed = capsys.readouterr().out
    assert code == EXIT_PARTIAL
    assert "lost every worker that ran them" in printed and "1 sessions not read" in printed

    got = tables(resolve(f"s3://{BUCKET}/out"))
    reference = tables(resolve(f"s3://{BUCKET}/reference"))
    for d in TABLES:  # every other session: exactly the undisturbed rows
        assert [r for r in got[d] if r["session_path"] != poison] == \
            [r for r in reference[d] if r["session_path"] != poison], d
    (finding,) = [r for r in got["integrity/findings"] if r["session_path"] == poison]
    assert (finding["code"], finding["severity"], finding["line"]) == \
        ("worker_crashed", "error", None)
    assert "died (2 times)" in finding["detail"]
    (row,) = [r for r in got["integrity/sessions"] if r["session_path"] == poison]
    assert row["status"] == "error" and row["lines"] is None
    manifest = read_manifest(resolve(f"s3://{BUCKET}/out"))
    assert manifest is not None and manifest["partial"] is True
    assert manifest["unread_examples"] == [poison]
    # Bisected: the batch, then each half down to the poison alone, lost their workers.
    assert manifest["failed_batches"] >= 2
    assert manifest["datasets"]["integrity/sessions"]["rows"] == 8


def test_too_many_killed_tasks_is_a_cluster_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers that die under every task are the cluster's failure, not one input's: the
    run stops (exit 2) instead of bisecting the whole archive."""
    from distributed import KilledWorker

    from pipeline.errors import ClusterError
    from pipeline.io.storage import Listing, SessionObject
    from pipeline.ledger.layout import SessionKey

    class DeadFuture:
        key = "k"

        def result(self) -> Any:
            raise KilledWorker("k", type("W", (), {"address": "tcp://x"})(), 3)

        def release(self) -> None:
            pass

    class FakeClient:
        loop = None

        def scheduler_info(self) -> dict[str, Any]:
            return {"workers": {"a": {}}}

        def submit(self, *args: Any, **kwargs: Any) -> DeadFuture:
            f = DeadFuture()
            f.key = f"k{id(f)}"
            return f

    class Queue:
        def __init__(self, futures: list[Any], **_: Any) -> None:
            self.items = list(futures)

        def add(self, f: Any) -> None:
            self.items.append(f)

        def __iter__(self) -> Iterator[Any]:
            while self.items:
                yield self.items.pop(0)

    monkeypatch.setattr(orchestrate, "as_completed", Queue)
    sessions = [SessionObject(SessionKey(f"agents/a/sessions/h/{i:03d}.jsonl", "a", "h",
                                         f"{i:03d}"), f"r/{i:03d}", 10) for i in range(40)]
    seen: list[Any] = []
    with pytest.raises(ClusterError, match="the cluster is failing"):
        orchestrate.run_batches(FakeClient(), resolve("memory://x"),  # type: ignore[arg-type]
                                Listing(sessions, 0), seen.append, progress=False)
    # Some single sessions were quarantined on the way, never more than the bound allows.
    assert 0 < len(seen) <= orchestrate.MAX_KILLED_TASKS


def test_a_quarantined_session_keeps_its_checkpoint_to_be_read_again() -> None:
    """Nightly: the quarantined session's previous checkpoint is kept without its ETag,
    so the next night reads it again instead of carrying the ``worker_crashed`` row."""
    from distributed import KilledWorker

    from pipeline.audit.checkpoint import Checkpoint
    from pipeline.io.storage import SessionObject
    from pipeline.ledger.layout import SessionKey

    key = SessionKey("agents/a/sessions/h/s.jsonl", "a", "h", "s")
    obj = SessionObject(key, f"r/{key.path}", 10, "etag-now")
    before = Checkpoint(key.path, 8, "ab" * 32, 2, "h1", "etag-then", 8)
    err = KilledWorker("k", type("W", (), {"address": "tcp://x"})(), 3)
    result = orchestrate.quarantine(7, obj, err, {key.path: before})
    assert result.index == 7 and result.codes == {"worker_crashed": 1}
    assert result.findings.to_pylist()[0]["detail"].startswith(
        "every worker that ran it died (4 times)")
    (row,) = result.extra["checkpoints"].to_pylist()
    assert row == {**before.as_row(), "etag": None}
    # A session new tonight has no checkpoint to keep.
    fresh = orchestrate.quarantine(8, obj, err, {key.path: None})
    assert fresh.extra["checkpoints"].num_rows == 0
    assert "checkpoints" not in orchestrate.quarantine(9, obj, err, None).extra
