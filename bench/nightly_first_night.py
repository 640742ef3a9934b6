"""The nightly's first night against the project at an earlier revision (issue 21's
target: >= 1.7x faster than ``209306a``, the tree before it, on the 536 MB fleet).

A first night reads, audits and replays the whole archive and commits every table: it
is the nightly's slowest run and the one bound by the per-line work and the replay's
counting. Both trees run it as users do, ``vakpipe nightly ROOT --out OUT --workers N
--no-progress --date 2026-12-01``, each in a process of its own (its own cluster, its
own imports), in interleaved pairs: the tree at ``--baseline`` (extracted with ``git
archive`` and made ready as ``make`` makes this one: :func:`bench.common.baseline_tree`)
and this one. Printed per pair: wall and CPU seconds of each (CPU: the command and its
workers, as the children's resource usage) and their ratio; then the median of the
pair ratios and the ratio of the medians.

Run: ``.venv/bin/python bench/nightly_first_night.py [--baseline 209306a] [--pairs 5]
[--mb 500] [--workers 2]``; ``--quick`` (a test runs it): 20 small sessions in the
command's own process, one pair against HEAD. The figures are printed, never judged.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import MB, REPO, baseline_tree, corpus_bytes, fleet, sized_fleet, vakpipe_of


@dataclass(frozen=True)
class Night:
    """One first night: wall and CPU seconds (the command and its workers)."""

    wall: float
    cpu: float


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def first_night(tree: Path, root: Path, workers: int) -> Night:
    """``vakpipe nightly`` of ``tree`` on ``root`` into a new OUT, timed; a night that
    does not end in success stops the benchmark with its last line of output."""
    out = Path(tempfile.mkdtemp(prefix="vakpipe-bench-night-"))
    try:
        cpu0, t0 = children_cpu(), time.perf_counter()
        vakpipe_of(tree, ["nightly", str(root), "--out", str(out), "--workers", str(workers),
                          "--no-progress", "--date", "2026-12-01"])
        return Night(time.perf_counter() - t0, children_cpu() - cpu0)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", metavar="REV", default="209306a")
    ap.add_argument("--pairs", type=int, default=5, help="interleaved pairs of first nights")
    ap.add_argument("--mb", type=int, default=500, help="the fleet's size (MB)")
    ap.add_argument("--workers", type=int, default=2, help="the nightly's --workers")
    ap.add_argument("--quick", action="store_true",
                    help="for make test: 20 sessions in process, one pair against HEAD")
    args = ap.parse_args()
    if args.quick:
        args.baseline, args.pairs, args.workers = "HEAD", 1, 0
        root = fleet("fleet-quick-nightly", sessions=20, seed=2026)
    else:
        root = sized_fleet(args.mb)
    size = corpus_bytes(root)
    print(f"fleet: {root} {size / MB:,.1f} MB in {sum(1 for _ in root.rglob('*.jsonl'))} "
          f"sessions; --workers {args.workers}")
    with tempfile.TemporaryDirectory(prefix="vakpipe-bench-baseline-") as scratch:
        tree = baseline_tree(args.baseline, Path(scratch))
        if isinstance(tree, str):
            print(f"first night against {args.baseline}: skipped ({tree})")
            return
        before: list[Night] = []
        after: list[Night] = []
        for _ in range(args.pairs):
            before.append(first_night(tree, root, args.workers))
            after.append(first_night(REPO, root, args.workers))
            old, new = before[-1], after[-1]
            print(f"first night, {args.baseline}: {old.wall:6.2f} s wall, {old.cpu:6.2f} s CPU;"
                  f" this tree: {new.wall:6.2f} s wall, {new.cpu:6.2f} s CPU "
                  f"= {old.wall / new.wall:.2f} x")
    ratios = [o.wall / n.wall for o, n in zip(before, after, strict=True)]
    medians = (statistics.median(n.wall for n in before)
               / statistics.median(n.wall for n in after))
    cpu = statistics.median(n.cpu for n in before) / statistics.median(n.cpu for n in after)
    print(f"first night against {args.baseline}: median {statistics.median(ratios):.2f} x over "
          f"{args.pairs} pairs, {medians:.2f} x of the medians, CPU {cpu:.2f} x "
          f"(target >= 1.7 against 209306a)")


if __name__ == "__main__":
    main()
