"""Incremental nightly audit: the night after 1% of the sessions grew, against the first.

Prints, measured in the same run on one cluster (as in production, the nightly job joins
a running cluster: its start is in neither figure):

* the first night (``vakpipe nightly``: every session read, audited and replayed);
* the second night after growing 1% of the sessions by a few valid entries each
  (:func:`pipeline.synth.fleet.grow_session`): only those are read, every other session's
  rows are carried forward from the first night's partition;
* both times, the bytes each read, and the ratio second / first (target <= 0.10);
* where the second night's time goes: listing the archive, the tasks, and carrying the
  rows forward (reading the first partition, writing the second).

The fleet is the audit benchmark's (``fleet-<mb>``, cached under ``VAKPIPE_BENCH_DIR``);
the nights run on a scratch copy, so the cached corpus is never modified.

Run: ``.venv/bin/python bench/nightly_incremental.py [--mb 500] [--workers 2] [--quick]``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jobs.nightly_audit as nightly
from bench.common import cluster, corpus_bytes, fleet, timed
from jobs.nightly_audit import NightlySummary, run_nightly
from pipeline.io.storage import enumerate_sessions, resolve
from pipeline.run.replay_batches import ReplayOptions
from pipeline.synth.fleet import grow_session

MB = 1_000_000


def _warm() -> None:
    """Load what every replay task needs (a running cluster has it loaded already)."""
    from pipeline.replay.catalog import load_catalog
    from pipeline.replay.tokens import get_tokenizer

    get_tokenizer().count("warm")
    load_catalog()


def grow(root: Path, fraction: float, entries: int, seed: int) -> tuple[int, int]:
    """Grow ``fraction`` of the sessions under ``root`` by ``entries`` each; return the
    sessions grown and the bytes appended."""
    paths = sorted(str(p.relative_to(root)) for p in root.rglob("*.jsonl"))
    chosen = random.Random(seed).sample(paths, max(1, round(len(paths) * fraction)))
    loc, grown, added = resolve(str(root)), 0, 0
    for i, path in enumerate(sorted(chosen)):
        try:
            added += grow_session(loc, path, entries=entries, seed=seed + i)
        except ValueError:  # a torn last line: vak would not append cleanly either
            continue
        grown += 1
    return grown, added


class Phases:
    """Wall time spent in the carry-forward step of a nightly run (wraps ``_carry``)."""

    def __init__(self) -> None:
        self.carry = 0.0
        self._inner = nightly._carry

    def __enter__(self) -> Phases:
        def timed_carry(*args: Any, **kwargs: Any) -> None:
            t0 = time.perf_counter()
            try:
                self._inner(*args, **kwargs)
            finally:
                self.carry += time.perf_counter() - t0

        nightly._carry = timed_carry
        return self

    def __exit__(self, *exc: object) -> None:
        nightly._carry = self._inner


def report(name: str, summary: NightlySummary, seconds: float) -> None:
    changes = Counter({k: v for k, v in summary.changes.items() if v})
    print(f"{name}: {seconds:8.2f} s, read {summary.bytes_read / MB:9.1f} MB of "
          f"{summary.run.bytes / MB:,.1f} MB; " + ", ".join(f"{k} {v:,}"
                                                         for k, v in sorted(changes.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=500, help="size of the fleet corpus (MB)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of the cluster")
    ap.add_argument("--grow", type=float, default=0.01, help="fraction of sessions grown")
    ap.add_argument("--entries", type=int, default=3, help="entries appended to each")
    ap.add_argument("--quick", action="store_true",
                    help="tiny inputs, one run (for make test): the same lines, nothing judged")
    args = ap.parse_args()
    if args.quick:  # a test runs it (make test): 50 small sessions, one worker
        args.mb, args.workers, args.grow = 1, 1, 0.04

    sessions = max(50, args.mb * 10)  # as bench/audit_throughput.py: the same corpus
    cached = fleet(f"fleet-{args.mb}", sessions=sessions, seed=2026)
    scratch = Path(tempfile.mkdtemp(prefix="vakpipe-bench-nightly-"))
    try:
        archive, out = scratch / "archive", scratch / "out"
        shutil.copytree(cached, archive)
        size = corpus_bytes(archive)
        print(f"corpus: {size / MB:,.0f} MB in {sum(1 for _ in archive.rglob('*.jsonl')):,} "
              f"sessions (copy of {cached}); {args.workers} workers")
        root, dest, options = resolve(str(archive)), resolve(str(out)), ReplayOptions()
        with cluster(args.workers) as (address, client):
            client.run(_warm)
            first, first_s = timed(lambda: run_nightly(
                root, dest, options, day=date(2026, 12, 1), scheduler=address,
                progress=False))
            grown, added = grow(archive, args.grow, args.entries, seed=7)
            with Phases() as phases:
                second, second_s = timed(lambda: run_nightly(
                    root, dest, options, day=date(2026, 12, 2), scheduler=address,
                    progress=False))
        _, list_s = timed(lambda: enumerate_sessions(root))
        report("first night ", first, first_s)
        print(f"grew {grown:,} sessions by {args.entries} entries ({added / 1e3:,.1f} kB)")
        report("second night", second, second_s)
        print(f"  of which: listing {list_s:.2f} s, carrying rows forward {phases.carry:.2f} s, "
              f"tasks and commit {second_s - list_s - phases.carry:.2f} s")
        ratio = second_s / first_s
        print(f"second / first: {ratio:.3f} (target <= 0.10) "
              f"{'OK' if ratio <= 0.10 else 'MISSED'}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
