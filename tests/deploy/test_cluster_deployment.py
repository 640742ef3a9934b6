"""The deployment on one machine: moto's S3 server, ``dask scheduler`` and
``dask worker --nworkers 2`` as separate processes reading deploy/dask/dask.yaml (as the
pods do), and the nightly job as its own process joining the scheduler through
``DASK_SCHEDULER_ADDRESS`` only, as the operator's job runner does. Then the same
with one worker process killed (SIGKILL) while it runs a task: the tables are the same.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

from jobs.nightly_tables import STATE
from pipeline.io.delta import night_versions, read_night
from pipeline.io.storage import Location, resolve
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from tests.deploy.deploy_helpers import DASK_CONFIG, DASKJOB, load
from tests.helpers.storage import BUCKET, plain_rows, vakpipe_exe

#: What the DaskJob's runner runs (deploy/k8s/daskjob-nightly.yaml), after ROOT (its
#: --out and --no-progress given here); checked equal to the manifest's below.
NIGHTLY = ["nightly", "--format", "delta", "--keep-days", "90"]
NIGHT = "2026-12-03"
#: Enough sessions that the run has several tasks of seconds each (~16 MB replayed),
#: so a task is still running when the kill lands.
SESSIONS = 200
#: Columns that differ between two runs of the same input by design.
RUN_COLUMNS = {"run_id", "committed_at"}


@pytest.fixture
def fleet(s3: LocalS3) -> Location:
    archive = resolve(f"s3://{BUCKET}/archive")
    write_fleet(archive, sessions=SESSIONS, seed=7, faults=True)
    return archive


@pytest.fixture
def dask_config_dir(tmp_path: Path) -> Path:
    """deploy/dask/dask.yaml in a folder of its own, as the ConfigMap mounts it.

    Not the repo's folder: Dask plugins copy their default config files into
    ``DASK_CONFIG`` when they are imported (dask-kubernetes, installed for the checks,
    is one), which a read-only mount refuses but a repo checkout would take.
    """
    folder = tmp_path / "etc-dask"
    folder.mkdir()
    shutil.copy(DASK_CONFIG, folder / DASK_CONFIG.name)
    return folder


def start_nightly(archive: Location, out: str, address: str,
                  config: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "DASK_SCHEDULER_ADDRESS": address, "DASK_CONFIG": str(config)}
    return subprocess.Popen([vakpipe_exe(), NIGHTLY[0], archive.url, "--out", out,
                             *NIGHTLY[1:], "--date", NIGHT, "--no-progress"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> None:
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, (stdout[-2000:], stderr[-4000:])


def tables(out: str) -> dict[str, list[dict[str, Any]]]:
    """Every state table the night committed, as sorted rows without run-specific
    columns."""
    loc = resolve(out)
    versions = night_versions(loc, date.fromisoformat(NIGHT))
    out_rows = {}
    for name in sorted(set(versions) & set(STATE)):
        table = read_night(loc, name, date.fromisoformat(NIGHT))
        keep = [c for c in table.column_names if c not in RUN_COLUMNS]
        out_rows[name] = plain_rows(table.select(keep))
    return out_rows


def test_the_runs_here_are_the_daskjobs() -> None:
    """The flags run here are the DaskJob runner's (deploy/k8s/daskjob-nightly.yaml)."""
    job = load(DASKJOB)
    (runner,) = job["spec"]["job"]["spec"]["containers"]
    args = list(runner["args"][1:])  # after "vakpipe"
    at = args.index("--out")
    del args[at:at + 2]
    args.remove("--no-progress")
    assert [args[0], *args[2:]] == NIGHTLY  # args[1] is ROOT


def first_running_task(client: Client, proc: subprocess.Popen[str],
                       timeout: float = 300) -> tuple[str, str]:
    """(worker address, task key) of the first task seen running on a worker."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker, keys in client.processing().items():
            if keys:
                return worker, str(keys[0])
        assert proc.poll() is None, "the run ended before any task was seen running"
        time.sleep(0.02)
    raise AssertionError("no task started")


def times_started(client: Client, key: str) -> int:
    """How many times the scheduler sent ``key`` to a worker (its transition log)."""
    def count(dask_scheduler: Any) -> int:
        return sum(1 for t in dask_scheduler.transition_log
                   if t[0] == key and t[2] == "processing")
    return int(client.run_on_scheduler(count))


@pytest.mark.slow
def test_nightly_on_a_separate_cluster_survives_a_killed_worker(
    fleet: Location, start_separate_cluster: Callable[..., Any], dask_config_dir: Path
) -> None:
    pods = {"DASK_CONFIG": str(dask_config_dir)}  # what the ConfigMap mount gives
    calm, rough = f"s3://{BUCKET}/reports/calm", f"s3://{BUCKET}/reports/rough"

    cluster = start_separate_cluster(nworkers=2, env=pods)
    with Client(cluster.address, set_as_default=False) as client:
        # The processes run with deploy/dask/dask.yaml, not Dask's defaults.
        assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.allowed_failures) == 5
        port = client.scheduler_info()["services"]["dashboard"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.read() == b"ok"  # the probes' endpoint, without bokeh in the image

        finish(start_nightly(fleet, calm, cluster.address, dask_config_dir))

        # The same again, on the same cluster, killing the worker process that runs the
        # first task as soon as it starts.
        pids = client.run(os.getpid)
        proc = start_nightly(fleet, rough, cluster.address, dask_config_dir)
        victim, key = first_running_task(client, proc)
        os.kill(pids[victim], signal.SIGKILL)
        assert proc.poll() is None  # the kill landed mid-run
        finish(proc)
        # The victim's task ran again elsewhere, and the victim left the cluster (its
        # nanny started a fresh worker process, as Kubernetes restarts a container).
        assert times_started(client, key) >= 2
        assert victim not in client.scheduler_info()["workers"]

    expected = tables(calm)
    assert set(expected) >= {"integrity/sessions", "integrity/findings", "turns", "requests",
                             "checkpoints"}
    assert len(expected["integrity/sessions"]) == SESSIONS
    assert tables(rough) == expected
