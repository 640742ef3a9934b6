"""Incremental nightly audit at two archive sizes: what the night after 1% growth costs.

For each layout (``partitions``: one complete partition per night; ``delta``: Delta
tables, a night writes only the rows of the sessions it read) and each archive size (N
sessions and 4N), prints side by side, measured in the same run on one cluster (as in
production the nightly runner joins a running cluster; its workers are not counted):

* the first night and the night after 1% of the sessions grew by a few valid entries
  (:func:`pipeline.synth.fleet.grow_session`);
* bytes of the archive read; bytes the runner wrote (``wchar`` of its process: the
  workers write nothing, the runner commits every table); the runner's peak RSS
  (``VmHWM``, :mod:`bench.rss`): each night runs in a fresh runner process;
* per layout: second / first night bytes written (target <= 0.10), and the slope of the
  runner's peak RSS per session between N and 4N, extrapolated to 10^6 sessions
  (target < 4 GiB).

Run: ``.venv/bin/python bench/nightly_incremental.py [--sessions 500] [--workers 2]
[--repeat 3]`` (figures: medians over the repeats);
``--quick`` (a test runs it): 20 and 80 small sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import cluster, fleet  # noqa: E402
from bench.rss import peak_rss_bytes  # noqa: E402

MB = 1_000_000
MiB = 1 << 20
FLEET = 1_000_000
LAYOUTS = ("partitions", "delta")
CAPPED = "VAKPIPE_BENCH_CAPPED"
CAPPED_RUN = True
#: The tasks' batch cap (ledger bytes per task) of a capped run: the first night, and
#: the night after growth (which reads ~1% of the bytes).
BATCH_CAP = {"first": 8 << 20, "grown": 512 << 10}


def _io() -> dict[str, int]:
    """This process's ``rchar``/``wchar`` (every thread's: delta-rs writes from Rust)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                found[key] = int(value)
    except OSError:
        pass
    return found


def one_night(layout: str, root: str, out: str, day: str, scheduler: str) -> None:
    """Run one night in this (fresh) process; print its figures as one JSON line."""
    from jobs.nightly_audit import run_nightly
    from jobs.nightly_tables import run_nightly_tables
    from pipeline.io.storage import resolve
    from pipeline.run.replay_batches import ReplayOptions

    job = run_nightly_tables if layout == "delta" else run_nightly
    if os.environ.get(CAPPED):
        # At 10^6 sessions every task's batch is at MAX_BATCH_BYTES and a whole Delta
        # write is cut in WHOLE_COMMIT_BYTES commits: both caps bound the runner's memory
        # whatever the archive. At bench sizes neither is reached (8 tasks, whatever the
        # archive): set both to their floor so the two sizes run in the 10^6 regime and
        # the slope is that of what grows with the number of sessions.
        import jobs.nightly_tables as tables
        import pipeline.run.orchestrate as orchestrate

        # A night after 1% growth reads 10 and 40 sessions here (0.8 and 2.7 MB), less
        # than one batch of 8 MiB: the one result the runner receives would grow with the
        # archive as no such night of 10^6 sessions (10^4 sessions read, in batches at
        # their cap) does. Its batches are capped at 512 KiB instead (2 and 6 tasks).
        tables.WHOLE_COMMIT_BYTES = orchestrate.MIN_BATCH_BYTES
        cap = int(os.environ[CAPPED])
        orchestrate.MIN_BATCH_BYTES = min(orchestrate.MIN_BATCH_BYTES, cap)
        orchestrate.MAX_BATCH_BYTES = cap
    before = _io()
    t0 = time.perf_counter()
    summary = job(resolve(root), resolve(out), ReplayOptions(),
                  day=date.fromisoformat(day), scheduler=scheduler, progress=False)
    seconds = time.perf_counter() - t0
    after = _io()
    print(json.dumps({
        "bytes_read": summary.bytes_read, "bytes": summary.run.bytes,
        "sessions": summary.run.sessions, "seconds": seconds,
        "written": after.get("wchar", 0) - before.get("wchar", 0),
        "peak_rss": peak_rss_bytes(), "changes": dict(summary.changes)}))


def night(layout: str, root: Path, out: Path, day: str, scheduler: str, which: str
          ) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--night", layout, str(root), str(out), day, scheduler],
        capture_output=True, text=True, check=False, cwd=REPO,
        env={**os.environ, **({CAPPED: str(BATCH_CAP[which])} if CAPPED_RUN else {})})
    if done.returncode != 0:
        raise SystemExit(f"night {layout} {day} failed:\n{done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one night over repeated runs: the median peak RSS and seconds (and
    the peak's range), the bytes of the first run (the same in every run)."""
    peaks = [r["peak_rss"] for r in runs]
    return {**runs[0], "peak_rss": statistics.median(peaks), "peak_min": min(peaks),
            "peak_max": max(peaks), "seconds": statistics.median(r["seconds"] for r in runs)}


def grow(root: Path, fraction: float, entries: int, seed: int, *, anywhere: bool = False
         ) -> int:
    """Grow ``fraction`` of the sessions under ``root`` by ``entries`` each: the newest
    ones (their UUIDv7 names sort by creation), as in an archive where the sessions
    that grow are the recent ones; ``anywhere``: drawn at random (the worst case for a
    layout partitioned by creation day)."""
    from pipeline.io.storage import resolve
    from pipeline.synth.fleet import grow_session

    paths = sorted((str(p.relative_to(root)) for p in root.rglob("*.jsonl")),
                   key=lambda p: (Path(p).name, p))
    count = max(1, round(len(paths) * fraction))
    chosen = random.Random(seed).sample(paths, count) if anywhere else paths[-count:]
    loc, grown = resolve(str(root)), 0
    for i, path in enumerate(sorted(chosen)):
        try:
            grow_session(loc, path, entries=entries, seed=seed + i)
        except ValueError:  # a torn last line: vak would not append cleanly either
            continue
        grown += 1
    return grown


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sessions", type=int, default=500, help="the smaller archive (N)")
    ap.add_argument("--factor", type=int, default=4, help="the larger archive is N x this")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of the cluster")
    ap.add_argument("--grow", type=float, default=0.01, help="fraction of sessions grown")
    ap.add_argument("--entries", type=int, default=3, help="entries appended to each")
    ap.add_argument("--anywhere", action="store_true",
                    help="grow sessions drawn at random, not the newest")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="layouts to run")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="size of the generated sessions (1.0: ~110 kB each); the runner's "
                         "memory follows the number of sessions")
    ap.add_argument("--uncapped", action="store_true",
                    help="batches and whole commits as sized for these archives (default: "
                         "at their 8 MiB floor, the regime of a 10^6-session archive)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each pair of nights this many times; figures are the medians "
                         "(a runner's peak RSS varies by ~10 MiB from run to run: 3 or more "
                         "for a slope)")
    ap.add_argument("--quick", action="store_true", help="20 and 80 small sessions")
    ap.add_argument("--night", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.night:
        one_night(*args.night)
        return
    small, scale = (20, 0.2) if args.quick else (args.sessions, args.scale)
    sizes = (small, small * args.factor)
    layouts = [name for name in args.layouts.split(",") if name in LAYOUTS]
    global CAPPED_RUN
    CAPPED_RUN = not args.uncapped
    if CAPPED_RUN:
        print("tasks' batches and Delta whole-write commits at their 8 MiB floor (the "
              "night after growth: batches of 512 KiB), as at 10^6 sessions, where both "
              "are at their cap; --uncapped: as sized here")
    print(f"grown between the nights: {args.grow:.0%} of the sessions, "
          f"{'drawn at random' if args.anywhere else 'the newest'}, {args.entries} entries "
          f"each; {args.workers} workers")
    scratch = Path(tempfile.mkdtemp(prefix="vakpipe-bench-nightly-"))
    results: dict[tuple[str, int], tuple[dict[str, Any], dict[str, Any]]] = {}
    try:
        with cluster(args.workers) as (address, _client):
            for n in sizes:
                cached = fleet(f"nightly-{n}-{scale}", sessions=n, seed=2026, size_scale=scale)
                for layout in layouts:
                    runs = []
                    for r in range(args.repeat):
                        archive = scratch / f"archive-{layout}-{n}-{r}"
                        out = scratch / f"out-{layout}-{n}-{r}"
                        shutil.copytree(cached, archive)
                        first = night(layout, archive, out, "2026-12-01", address, "first")
                        grow(archive, args.grow, args.entries, seed=7, anywhere=args.anywhere)
                        second = night(layout, archive, out, "2026-12-02", address, "grown")
                        runs.append((first, second))
                        shutil.rmtree(archive)
                        shutil.rmtree(out)
                    results[(layout, n)] = (_median([a for a, _ in runs]),
                                            _median([b for _, b in runs]))
        print(f"{'layout':<11}{'sessions':>9}  {'night':<7}{'read MB':>10}{'written MB':>12}"
              f"{'runner peak MiB':>17}{'(min-max)':>14}{'seconds':>9}")
        for (layout, n), pair in results.items():
            for name, f in zip(("first", "+1%"), pair, strict=True):
                spread = f"{f['peak_min'] / MiB:.0f}-{f['peak_max'] / MiB:.0f}"
                print(f"{layout:<11}{n:>9,}  {name:<7}{f['bytes_read'] / MB:>10.2f}"
                      f"{f['written'] / MB:>12.2f}{f['peak_rss'] / MiB:>17.1f}"
                      f"{spread:>14}{f['seconds']:>9.2f}")
        for layout in layouts:
            ratios = [results[(layout, n)][1]["written"] / max(1, results[(layout, n)][0][
                "written"]) for n in sizes]
            print(f"{layout}: second / first night bytes written "
                  + ", ".join(f"{r:.3f} at {n:,}" for r, n in zip(ratios, sizes, strict=True))
                  + f" (target <= 0.10) {'OK' if max(ratios) <= 0.10 else 'MISSED'}")
            for i, name in enumerate(("first night", "+1% night")):
                low, high = (results[(layout, n)][i]["peak_rss"] for n in sizes)
                slope = (high - low) / (sizes[1] - sizes[0])
                at_fleet = high + slope * (FLEET - sizes[1])
                print(f"  {name}: runner peak RSS slope {slope / 1024:,.2f} KiB/session, "
                      f"extrapolated to {FLEET:,} sessions {at_fleet / (1 << 30):,.2f} GiB "
                      f"(target < 4 GiB) {'OK' if at_fleet < 4 * (1 << 30) else 'MISSED'}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
