"""Compaction planning overhead against a planner replay, and the memory of a copy.

The issue's target: planning packets must add at most 20% to a replay run. Prints,
measured in the same run (best of ``--repeat``, the two sides interleaved so both see
the same machine):

* in-process, over a generated fleet (entries parsed beforehand): ``replay_session``
  under planner v1 (``planner=capacity``) against ``replay_session`` with a
  :class:`~pipeline.compaction.engine.CompactionEngine` for the same capacity
  (``engine=...``), at a ``--window`` tight enough that many sessions need packets
  (how many, and how many packets, are printed); ratio (target <= 1.20);
* the same on the longest session of the fleet alone (the summariser's share grows
  with the ranges it summarises);
* a full ``run_audit`` on a 1-worker cluster: ``ReplayOptions(planner=True)`` against
  ``ReplayOptions(planner=True, compaction=CompactionOptions(cards, window))``; ratio
  (target <= 1.20);
* the peak RSS of the worker that writes the compacted archive of one big session
  (``--big-mb``), next to its peak for a planner replay of it without compaction:
  the copy streams (spool on disk past 64 MiB, 1 MiB copy buffer), so the two stay
  close whatever the session's size.

Run: ``.venv/bin/python bench/compaction_overhead.py [--sessions 300] [--window 8000]
[--repeat 3] [--big-mb 256] [--profile] [--big-only] [--quick]``. ``--profile`` adds a cProfile
of the in-process compaction side (top functions by cumulative time); ``--big-only``
runs the big session alone (~6 minutes at 256 MB).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    BENCH_DIR,
    Timing,
    best_of,
    cluster,
    corpus_bytes,
    cpu_seconds,
    fleet,
    one_session,
    worker_peaks,
)
from pipeline.audit.session import audit_session
from pipeline.compaction.cards import CardsSummariser
from pipeline.compaction.engine import CompactionEngine, CompactionOptions
from pipeline.io.commit import read_manifest
from pipeline.io.storage import resolve
from pipeline.ledger.layout import SessionKey, parse_session_path
from pipeline.ledger.reader import Entry, read_ledger
from pipeline.replay.catalog import Capacity, ModelCatalog, load_catalog
from pipeline.replay.projection import get_rule_set
from pipeline.replay.session import replay_session
from pipeline.replay.tokens import get_tokenizer
from pipeline.run.orchestrate import run_audit
from pipeline.run.replay_batches import ReplayOptions

MB = 1_000_000
TARGET = 1.20


@dataclass(frozen=True)
class Session:
    """One session's active chain, parsed, and the capacity it is planned for."""

    key: SessionKey
    session_id: str
    entries: list[Entry]
    capacity: Capacity | None
    requests: int


def load(root: Path, catalog: ModelCatalog) -> list[Session]:
    """Every session under ``root`` as its active chain (read and audited once, here)."""
    out = []
    for path in sorted(root.rglob("*.jsonl")):
        rel = path.relative_to(root).as_posix()
        key = parse_session_path(rel)
        if key is None:
            continue
        data = path.read_bytes()
        audit = audit_session(key, io.BytesIO(data), size=len(data))
        entries = [e for e in read_ledger(io.BytesIO(data))
                   if isinstance(e, Entry) and (e.line, e.id) in audit.active]
        out.append(Session(key, str(audit.row.get("session_id") or key.session_id), entries,
                           catalog.lookup(audit.row.get("model")),
                           int(audit.row.get("requests") or 0)))
    return out


def replay_planner(sessions: list[Session], catalog: ModelCatalog) -> tuple[int, int]:
    """Replay every session under planner v1 for its capacity."""
    rules, tok = get_rule_set("v1"), get_tokenizer()
    for s in sessions:
        replay_session(s.key, s.entries, rules=rules, tokenizer=tok, catalog=catalog,
                       planner=s.capacity)
    return 0, 0


def replay_compaction(sessions: list[Session], catalog: ModelCatalog) -> tuple[int, int]:
    """Replay every session with a compaction engine; return sessions needing packets
    and packets planned."""
    rules, tok = get_rule_set("v1"), get_tokenizer()
    summariser = CardsSummariser()
    needing = packets = 0
    for s in sessions:
        if s.capacity is None:  # no plan for an unknown model: as the batch code does
            replay_session(s.key, s.entries, rules=rules, tokenizer=tok, catalog=catalog)
            continue
        engine = CompactionEngine(rules, tok, capacity=s.capacity, summariser=summariser,
                                  session_id=s.session_id)
        replay_session(s.key, s.entries, rules=rules, tokenizer=tok, catalog=catalog,
                       planner=s.capacity, engine=engine)
        needing += bool(engine.planned)
        packets += len(engine.planned)
    return needing, packets


def ratio_line(label: str, base: Timing, with_compaction: Timing) -> str:
    # CPU time is what the comparison rests on: the machines are shared, and wall time
    # moves with the load of others (both are printed).
    ratio = with_compaction.cpu / base.cpu
    verdict = "ok" if ratio <= TARGET else "MISSED"
    return (f"{label}: CPU {base.cpu:7.2f} s planner, {with_compaction.cpu:7.2f} s with "
            f"compaction = {ratio:.2f} x (target <= {TARGET:.2f}: {verdict}); wall "
            f"{base.wall:.2f} s / {with_compaction.wall:.2f} s = "
            f"{with_compaction.wall / base.wall:.2f} x")


def full_runs(root: Path, window: int, repeat: int) -> tuple[Timing, Timing]:
    """Best times of a planner replay run and of a compaction run on 1 worker (CPU:
    the worker process's)."""
    catalog = load_catalog().with_window(window)
    planner = ReplayOptions(catalog=catalog, planner=True)
    compaction = ReplayOptions(catalog=catalog, planner=True,
                               compaction=CompactionOptions(CardsSummariser(), window=window))
    out = Path(tempfile.mkdtemp(prefix="vakpipe-bench-compaction-"))
    try:
        with cluster(1) as (address, client):
            def run(options: ReplayOptions) -> Callable[[], object]:
                return lambda: run_audit(resolve(str(root)), resolve(str(out)),
                                         scheduler=address, progress=False, replay=options)

            def worker_cpu() -> float:
                return sum(client.run(cpu_seconds).values())

            plain, compact = best_of(repeat, run(planner), run(compaction), cpu=worker_cpu)
        return plain, compact
    finally:
        shutil.rmtree(out, ignore_errors=True)


def big_copy(mb: int, window: int) -> None:
    """Peak worker RSS writing one big session's compacted copy, against a planner
    replay of it (each on a fresh 1-worker cluster, so each peak is its own)."""
    root = one_session(BENCH_DIR / f"big-{mb}", mb)
    size = corpus_bytes(root)
    catalog = load_catalog().with_window(window)
    runs = {
        "planner replay": ReplayOptions(catalog=catalog, planner=True),
        "compact --write-archive": ReplayOptions(
            catalog=catalog, planner=True, write_archive=True,
            compaction=CompactionOptions(CardsSummariser(), window=window)),
    }
    for label, options in runs.items():
        out = Path(tempfile.mkdtemp(prefix="vakpipe-bench-big-"))
        try:
            with cluster(1) as (address, client):
                t0 = time.perf_counter()
                run_audit(resolve(str(root)), resolve(str(out)), scheduler=address,
                          progress=False, replay=options)
                seconds = time.perf_counter() - t0
                peak = max(worker_peaks(client).values())
            manifest = read_manifest(resolve(str(out))) or {}
            copied = sum(p.stat().st_size for p in (out / "archive").rglob("*.jsonl")) \
                if (out / "archive").exists() else 0
            packets = manifest.get("compaction", {}).get("packets")
            extra = (f", {packets:,} packets planned, copy {copied / MB:,.1f} MB"
                     if packets is not None else "")
            print(f"one {size / MB:,.0f} MB session, {label:<24} {seconds:7.1f} s, peak worker "
                  f"RSS {peak / 2**20:,.0f} MiB{extra}")
        finally:
            shutil.rmtree(out, ignore_errors=True)


def profile(sessions: list[Session], catalog: ModelCatalog) -> None:
    prof = cProfile.Profile()
    prof.enable()
    replay_compaction(sessions, catalog)
    prof.disable()
    pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=300, help="sessions of the fleet")
    ap.add_argument("--window", type=int, default=8000,
                    help="what-if input window (tight: many sessions need packets)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement (best kept)")
    ap.add_argument("--big-mb", type=int, default=256, help="size of the one big session (MB)")
    ap.add_argument("--profile", action="store_true", help="cProfile the compaction side")
    ap.add_argument("--big-only", action="store_true", help="only the big session's copy")
    ap.add_argument("--quick", action="store_true",
                    help="tiny inputs, one run (for make test): the same lines, nothing judged")
    args = ap.parse_args()
    if args.quick:  # a test runs it (make test): every part, on inputs of seconds
        args.sessions, args.repeat, args.big_mb = 6, 1, 2
    if args.big_only:
        big_copy(args.big_mb, args.window)
        return

    root = fleet(f"replay-fleet-{args.sessions}", sessions=args.sessions, seed=99)
    catalog = load_catalog().with_window(args.window)
    t0 = time.perf_counter()
    sessions = load(root, catalog)
    loaded = time.perf_counter() - t0
    needing, packets = replay_compaction(sessions, catalog)  # also warms the tokenizer
    print(f"fleet: {corpus_bytes(root) / MB:,.1f} MB, {len(sessions)} sessions, "
          f"{sum(s.requests for s in sessions):,} requests (read and parsed in {loaded:.1f} s)")
    print(f"window {args.window:,}: {needing} of {len(sessions)} sessions need packets, "
          f"{packets:,} packets planned")

    base, comp = best_of(args.repeat, lambda: replay_planner(sessions, catalog),
                         lambda: replay_compaction(sessions, catalog))
    print(ratio_line("in-process replay, whole fleet", base, comp))
    longest = [max(sessions, key=lambda s: s.requests)]
    _, k = replay_compaction(longest, catalog)
    base, comp = best_of(args.repeat, lambda: replay_planner(longest, catalog),
                         lambda: replay_compaction(longest, catalog))
    print(ratio_line(f"in-process, its longest session ({longest[0].requests:,} requests, "
                     f"{k:,} packets)", base, comp))
    base, comp = full_runs(root, args.window, args.repeat)
    print(ratio_line("run_audit, 1 worker, all tables", base, comp))
    if args.profile:
        profile(sessions, catalog)
    big_copy(args.big_mb, args.window)


if __name__ == "__main__":
    main()
