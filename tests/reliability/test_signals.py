"""SIGINT and SIGTERM stop a run cleanly; logs a scheduler can read.

The real CLI runs in its own process group (as a shell job would); the signal goes to
the whole group (``os.killpg``, as a terminal's Ctrl-C or a container runtime does), at
cluster start, mid-run and mid-commit. ``VAKPIPE_TEST_PAUSE_AT=<stage>`` (read only for
tests) holds the run inside a stage so the signal lands there. Expected: exit 130/143,
one line ``vakpipe: interrupted (SIG...) during <stage>; ...``, no traceback, no staging
left, the previous output untouched (mid-commit: the commit finishes and the line says
so), no process of the run left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.io.storage import resolve
from pipeline.run import lifecycle
from pipeline.synth.fleet import write_fleet
from tests.helpers.storage import vakpipe_exe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet")
    write_fleet(resolve(str(root)), sessions=60, seed=5)
    return root


def start(args: list[str], pause: str = "") -> subprocess.Popen[str]:
    env = dict(os.environ, **{lifecycle.PAUSE_ENV: pause})
    return subprocess.Popen(
        [vakpipe_exe(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, start_new_session=True,
        # A background process of a non-interactive shell starts with SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def left_in_group(pgid: int) -> list[str]:
    """Processes of the run's session still alive a few seconds after it ended."""
    for _ in range(20):
        found = subprocess.run(["ps", "-o", "pid=", "--sid", str(pgid)], capture_output=True,
                               text=True, check=False).stdout.split()
        if not found:
            return []
        time.sleep(0.5)
    return found


CASES = [(sig, stage, pause) for sig in (signal.SIGINT, signal.SIGTERM)
         for stage, pause in ((lifecycle.STARTING_CLUSTER, lifecycle.STARTING_CLUSTER),
                              (lifecycle.READING, lifecycle.READING),
                              (lifecycle.COMMITTING, lifecycle.COMMITTING))]


@pytest.mark.parametrize(("sig", "stage", "pause"), CASES,
                         ids=[f"{s.name}-{st.replace(' ', '-')}" for s, st, _ in CASES])
def test_a_signal_stops_the_run_cleanly(fleet: Path, tmp_path: Path, sig: signal.Signals,
                                        stage: str, pause: str) -> None:
    out = tmp_path / "out"
    first = subprocess.run([vakpipe_exe(), "audit", str(fleet), "--out", str(out),
                            "--workers", "0"], capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    before = (out / "_manifest.json").read_bytes()
    proc = start(["audit", str(fleet), "--out", str(out), "--workers", "2",
                  "--log-format", "json", "--heartbeat", "1"], pause)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("{") and json.loads(line)["stage"] == stage:
            time.sleep(0.3)
            os.killpg(proc.pid, sig)
            break
    rest = proc.stderr.read()
    proc.wait(timeout=120)
    stderr = "".join(seen) + rest
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr and "Exception" not in stderr, stderr
    plain = [x for x in stderr.splitlines() if not x.startswith("{")]
    committed = stage == lifecycle.COMMITTING
    after = ("the run was committed before stopping" if committed
             else "previous output intact")
    assert plain == [f"vakpipe: interrupted ({sig.name}) during {stage}; {after}"], stderr
    last = json.loads([x for x in stderr.splitlines() if x.startswith("{")][-1])
    assert (last["event"], last["exit"], last["error"]) == (
        "failed", 128 + sig, f"interrupted ({sig.name}) during {stage}; {after}")
    assert not list((out / "_staging").glob("*")) if (out / "_staging").exists() else True
    if committed:
        assert (out / "_manifest.json").read_bytes() != before
    else:
        assert (out / "_manifest.json").read_bytes() == before
    assert (out / "_SUCCESS").exists()
    assert left_in_group(proc.pid) == []


def test_heartbeats_as_json_lines_and_no_dask_noise(fleet: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [vakpipe_exe(), "audit", str(fleet), "--out", str(tmp_path / "out"), "--workers", "2",
         "--log-format", "json", "--heartbeat", "0.05"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    # stderr is a pipe: every line is a JSON record; none of Dask's warnings got through.
    events = [json.loads(line) for line in done.stderr.splitlines()]
    stages = [e["stage"] for e in events if e["event"] == "stage"]
    assert stages == [lifecycle.SETUP, lifecycle.LISTING, lifecycle.STARTING_CLUSTER,
                      lifecycle.READING, lifecycle.COMMITTING]
    # A heartbeat every 50 ms: starting two worker processes alone takes longer (with
    # "1", a run whose bytecode was cached could end before its first heartbeat).
    assert any(e["event"] == "heartbeat" for e in events)
    last = events[-1]
    assert (last["event"], last["exit"]) == ("done", 0) and "error" not in last
    assert last["sessions_done"] == last["sessions_total"] == 60
    assert last["bytes_done"] > 0 and last["bytes_done"] == last["bytes_total"]
    for e in events:
        assert {"ts", "elapsed_s", "rate_bytes_per_s", "eta_s"} <= e.keys()


def test_the_last_json_line_says_how_the_command_ended(tmp_path: Path) -> None:
    # A collector reading only the JSON lines once saw "done" after a run that failed.
    gone = subprocess.run(
        [vakpipe_exe(), "audit", str(tmp_path / "gone"), "--out", str(tmp_path / "o"),
         "--log-format", "json"], capture_output=True, text=True, timeout=120, check=False)
    assert gone.returncode == 2, gone.stderr
    *_, said, last = gone.stderr.splitlines()
    assert said == f"vakpipe: error: root {tmp_path / 'gone'} does not exist"
    event = json.loads(last)
    assert (event["event"], event["exit"], event["error"]) == (
        "failed", 2, said.removeprefix("vakpipe: error: "))
    # A completed run's own exit code (1: --fail-on matched) is in its done line.
    faulty = tmp_path / "faulty"
    write_fleet(resolve(str(faulty)), sessions=12, seed=5, faults=True, size_scale=0.2)
    matched = subprocess.run(
        [vakpipe_exe(), "audit", str(faulty), "--out", str(tmp_path / "m"), "--workers", "0",
         "--log-format", "json", "--fail-on", "error"],
        capture_output=True, text=True, timeout=300, check=False)
    assert matched.returncode == 1, matched.stderr
    event = json.loads(matched.stderr.splitlines()[-1])
    assert (event["event"], event["exit"]) == ("done", 1) and "error" not in event
