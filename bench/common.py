"""Shared helpers of the benchmarks: corpora on local disk, timers, a private cluster."""

from __future__ import annotations

import io
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import dask
from distributed import Client, LocalCluster

from bench.rss import peak_rss_bytes
from pipeline.io.storage import resolve
from pipeline.run.orchestrate import WORKER_CONFIG
from pipeline.synth.fleet import write_fleet
from pipeline.synth.generator import generate_session

T = TypeVar("T")
MB = 1_000_000
BENCH_DIR = Path(os.environ.get("VAKPIPE_BENCH_DIR", Path(tempfile.gettempdir()) / "vakpipe-bench"))


#: The project's root (a git checkout where the baseline benchmarks run).
REPO = Path(__file__).resolve().parents[1]


def baseline_tree(rev: str, into: Path) -> Path | str:
    """The project as it was at git revision ``rev``, extracted under ``into`` with
    ``git archive`` (nothing of this checkout is touched) and made ready as ``make``
    makes this one: its modules compiled to bytecode (processes here do not write it:
    ``PYTHONDONTWRITEBYTECODE``, docs/ccusage-comparison.md round 5) and its C kernel, if
    it has one, built in place (a tree where that fails runs without it, as after a
    ``pip install`` without a compiler). Or why it could not be extracted."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev], capture_output=True,
                             cwd=REPO, check=False)
    if archive.returncode != 0:
        return " ".join(archive.stderr.decode(errors="replace").split())[:200] or "git failed"
    tree = into / "tree"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    if (tree / "setup.py").exists():
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                       capture_output=True, check=False)
    packages = [str(tree / name) for name in ("pipeline", "jobs") if (tree / name).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages],
                   capture_output=True, check=False)
    return tree


#: The CLI's entry point, run from whichever tree ``PYTHONPATH`` names first.
CLI = "import sys; sys.argv[0] = 'vakpipe'; from pipeline.cli import main; main()"


def vakpipe_of(tree: Path, args: list[str], env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """``vakpipe ARGS`` of the project at ``tree`` (a :func:`baseline_tree`, or
    :data:`REPO`) in a process of its own, in ``env`` (default this one's); one that
    exits non-zero stops the benchmark with its last line of output."""
    done = subprocess.run([sys.executable, "-c", CLI, *args], cwd=tree,
                          env={**(os.environ if env is None else env), "PYTHONPATH": str(tree)},
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        sys.exit(f"vakpipe {args[0]} of {tree} exited {done.returncode}: {last}")
    return done


def fleet(name: str, *, sessions: int, seed: int, size_scale: float = 1.0) -> Path:
    """A generated fleet on local disk, reused across runs when already there."""
    root = BENCH_DIR / name
    marker = root / ".complete"
    if not marker.exists():
        # consistent=False: drawn usage figures, no tokenizer (60-80 MB/s, not 10).
        write_fleet(resolve(str(root)), sessions=sessions, seed=seed, size_scale=size_scale,
                    consistent=False)
        marker.write_text("ok")
    return root


def sized_fleet(mb: int) -> Path:
    """The generated fleet of about ``mb`` MB (``fleet-<mb>``: ~100 KB per session on
    average, heavy-tailed) that the audit and nightly benchmarks share, reused when it is
    already there."""
    return fleet(f"fleet-{mb}", sessions=max(50, mb * 10), seed=2026)


def one_session(root: Path, mb: int, *, seed: int = 11, scale: float = 1.0) -> Path:
    """``root``, an archive holding one generated session of about ``mb`` MB (tool
    results, answers and prompts ``scale`` times their usual size: fewer, longer lines),
    streamed to disk; reused across runs when already there."""
    marker = root / f".complete-{mb}-{seed}-{scale}"
    if not marker.exists():
        # drawn usage figures (consistent=False): no tokenizer, ~70 MB/s
        session = generate_session(seed, target_bytes=mb * MB, consistent=False,
                                   size_scale=scale)
        path = root / session.path
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for line in session.lines():
                f.write(line)
        marker.write_text("ok")
    return root


def corpus_bytes(root: Path) -> int:
    """Bytes of the ledgers under ``root``."""
    return sum(p.stat().st_size for p in root.rglob("*.jsonl"))


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """Run ``fn`` once; return its result and the wall time in seconds."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def cpu_seconds() -> float:
    """CPU time (user + system) of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Timing:
    """Best wall and best CPU seconds of one side of a comparison."""

    wall: float
    cpu: float


def rounds_of(repeat: int, *fns: Callable[[], object],
              cpu: Callable[[], float] = cpu_seconds) -> list[list[Timing]]:
    """Wall and CPU time of each of ``fns`` in each of ``repeat`` rounds, interleaved:
    each round runs every one of ``fns``, so a slower minute of a shared machine falls
    on all of them alike. ``cpu`` reads the CPU seconds to count (this process's, or
    the workers').
    """
    out = []
    for _ in range(repeat):
        row = []
        for fn in fns:
            c0, t0 = cpu(), time.perf_counter()
            fn()
            row.append(Timing(time.perf_counter() - t0, cpu() - c0))
        out.append(row)
    return out


def best_of(repeat: int, *fns: Callable[[], object],
            cpu: Callable[[], float] = cpu_seconds) -> list[Timing]:
    """Best wall and CPU time of each of ``fns`` over ``repeat`` rounds
    (:func:`rounds_of`)."""
    return best(rounds_of(repeat, *fns, cpu=cpu))


def best(rounds: list[list[Timing]]) -> list[Timing]:
    """The best wall and the best CPU time of each column of ``rounds``."""
    return [Timing(min(t.wall for t in column), min(t.cpu for t in column))
            for column in zip(*rounds, strict=True)]


def spread(ratios: list[float]) -> str:
    """Each round's ratio and their median, as a report's clause: machines here move
    a figure between minutes, and the best of each side may come from different ones."""
    return (" / ".join(f"{r:.2f}" for r in ratios)
            + f", median {statistics.median(ratios):.2f}")


@contextmanager
def cluster(workers: int) -> Iterator[tuple[str, Client]]:
    """A private LocalCluster of single-threaded worker processes; yields its address."""
    scratch = tempfile.mkdtemp(prefix="vakpipe-bench-dask-")
    try:
        # The workers vakpipe's own LocalCluster starts (orchestrate.dask_client).
        with dask.config.set(WORKER_CONFIG), \
                LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                             dashboard_address="127.0.0.1:0", local_directory=scratch) as lc, \
                Client(lc, set_as_default=False) as client:
            yield lc.scheduler_address, client
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the workers' spill folders


def worker_peaks(client: Client) -> dict[str, Any]:
    """Peak RSS of every worker process, in bytes."""
    return dict(client.run(peak_rss_bytes))
