"""Replay throughput against the tokenizer's own, and replay linearity.

Prints, measured in the same run:

* the floor: tiktoken's ``encode_ordinary`` over every distinct text segment of a
  generated fleet (message texts, thinking, tool inputs and results, system prompts,
  tool schemas, summaries);
* full replay runs (``vakpipe audit --replay``: all requests, all tables) on one
  worker, as MB/s and as a ratio of the floor (target >= 0.50), the first run on the
  fresh worker apart;
* linearity: the replay time of sessions of 250, 500, 1000 and 2000 iterations (four of
  each, summed), the ratio of each doubling of their bytes (target <= 2.2), the same
  for the replay engine alone, and the time per unit of their own tokenizer floor.

Run: ``.venv/bin/python bench/replay_throughput.py [--sessions 300]``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cluster, corpus_bytes, fleet, timed
from pipeline.catalog import load_catalog
from pipeline.generate import generate_session
from pipeline.io.storage import resolve
from pipeline.orchestrate import run_audit
from pipeline.projection import canonical_json, get_rule_set
from pipeline.reader import Entry, read_ledger
from pipeline.replay_partitions import ReplayOptions
from pipeline.session_replay import replay_session
from pipeline.tokens import _encoding, get_tokenizer
from pipeline.tree import TreeIndex

MB = 1_000_000


def segments(root: Path) -> set[str]:
    """Every distinct text segment a replay tokenizes, over the whole fleet."""
    out: set[str] = set()
    for path in sorted(root.rglob("*.jsonl")):
        with open(path, "rb") as f:
            add_segments((i for i in read_ledger(f) if isinstance(i, Entry)), out)
    return out


def add_segments(entries: Iterable[Entry], out: set[str]) -> None:
    """Add the distinct text segments of ``entries`` to ``out``."""
    for item in entries:
        d: dict[str, Any] = item.data
        for b in item.content:
            for key in ("text", "content"):
                if isinstance(b.get(key), str):
                    out.add(b[key])
            if b.get("type") == "tool_use":
                out.add(canonical_json(b.get("input")))
        for key in ("system_prompt", "summary", "model_visible"):
            if isinstance(d.get(key), str):
                out.add(d[key])


def tokenizer_floor(texts: set[str]) -> float:
    enc = _encoding("cl100k_base")
    t0 = time.perf_counter()
    for t in texts:
        enc.encode_ordinary(t)
    return time.perf_counter() - t0


def replay_runs(root: Path, repeat: int, between: Callable[[], object]) -> list[float]:
    """Seconds of ``repeat`` full replay runs on one fresh single-worker cluster, the
    first of which also loads the code and the vocabulary into the worker; ``between``
    runs before each (to interleave the floor with the runs)."""
    seconds: list[float] = []
    with cluster(1) as (address, _client):
        for _ in range(repeat):
            between()
            out = Path(tempfile.mkdtemp(prefix="vakpipe-bench-replay-"))
            try:
                seconds.append(timed(partial(
                    run_audit, resolve(str(root)), resolve(str(out)), scheduler=address,
                    progress=False, replay=ReplayOptions()))[1])
            finally:
                shutil.rmtree(out, ignore_errors=True)
    return seconds


class LengthTokenizer:
    """A tokenizer that costs nothing (characters / 4): times the replay engine alone."""

    name = "chars/4"

    def count(self, text: str) -> int:
        return len(text) // 4


@dataclass(frozen=True)
class LinearityPoint:
    """Sessions of one length, summed over the seeds: what they are and what they cost."""

    iterations: int
    size: int
    replay: float  # best of 5 per session, tiktoken
    engine: float  # best of 5 per session, a tokenizer that costs nothing
    floor: float  # best of 5 per session, encode_ordinary over its distinct segments


def linearity_point(turns: int, seeds: Iterable[int]) -> LinearityPoint:
    """Replay the active chain of one generated session of ``turns`` turns per seed."""
    from pipeline.layout import parse_session_path

    total = LinearityPoint(0, 0, 0.0, 0.0, 0.0)
    catalog, rules = load_catalog(), get_rule_set("v1")
    for seed in seeds:
        s = generate_session(seed, turns=turns, consistent=False)
        entries = [e for e in read_ledger(s.lines()) if isinstance(e, Entry)]
        tree = TreeIndex()
        for e in entries:
            tree.add(e)
        tree.finish()
        active = {n.id for n in tree.nodes if n.on_active_chain}
        chain = [e for e in entries if e.id in active]
        key = parse_session_path(s.path)
        assert key is not None

        def best(tokenizer: Callable[[], Any], chain: list[Entry] = chain,
                 key: Any = key) -> tuple[float, int]:
            seconds, n = float("inf"), 0
            for _ in range(5):
                t0 = time.perf_counter()
                r = replay_session(key, chain, rules=rules, tokenizer=tokenizer(),
                                   catalog=catalog)
                seconds, n = min(seconds, time.perf_counter() - t0), len(r.requests)
            return seconds, n

        replay, n = best(get_tokenizer)
        engine, _ = best(LengthTokenizer)
        texts: set[str] = set()
        add_segments(chain, texts)
        total = LinearityPoint(
            total.iterations + n, total.size + sum(len(line) for line in s.lines()),
            total.replay + replay, total.engine + engine,
            total.floor + min(tokenizer_floor(texts) for _ in range(5)))
    return total


def per_doubling(now: float, before: float, size: int, size_before: int) -> float:
    """``now / before`` scaled to one doubling of the bytes: 2 ** (log ratio / log bytes
    ratio) (generated sessions do not double exactly)."""
    return float(2 ** (math.log(now / before) / math.log(size / size_before)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3, help="runs after the first (best kept)")
    ap.add_argument("--linearity-seeds", type=int, default=4,
                    help="sessions summed per length in the linearity part")
    args = ap.parse_args()
    root = fleet(f"replay-fleet-{args.sessions}", sessions=args.sessions, seed=99)
    size = corpus_bytes(root)
    texts = segments(root)
    seg_mb = sum(len(t.encode()) for t in texts) / MB
    # The machines are noisy (+-25% between minutes): the floor is measured before each
    # run and the best of each kept. The first run on a fresh worker also imports the
    # code and loads the vocabulary (once per worker, ~0.6 s): printed apart, the
    # target is for the runs after it (a fleet run's steady state).
    floors: list[float] = []
    runs = replay_runs(root, args.repeat + 1,
                       between=lambda: floors.append(tokenizer_floor(texts)))
    floor_s, cold_s, run_s = min(floors), runs[0], min(runs[1:])
    print(f"fleet: {size / MB:,.1f} MB, {len(texts):,} distinct segments ({seg_mb:,.1f} MB)")
    print(f"tokenizer floor (encode_ordinary, distinct segments): {floor_s:6.2f} s "
          f"= {size / MB / floor_s:6.1f} MB/s of ledger")
    print(f"full replay, 1 worker, first run (cold worker):       {cold_s:6.2f} s "
          f"= {size / MB / cold_s:6.1f} MB/s = {floor_s / cold_s:.2f} x floor")
    print(f"full replay, 1 worker (audit --replay, all tables):  {run_s:6.2f} s "
          f"= {size / MB / run_s:6.1f} MB/s = {floor_s / run_s:.2f} x floor (target >= 0.50)")
    # Linearity. The tokenizer's cost per byte depends on what the bytes are (code and
    # logs cost ~2.5 times prose), and a generated session's bytes are dominated by a
    # few heavy-tailed tool results: one session's doubling measures its content mix as
    # much as the replay. So each length sums four sessions (seeds), and two more
    # figures separate the replay from tiktoken: the engine alone (a tokenizer that
    # costs nothing), and the replay's time per unit of its own tokenizer floor (flat
    # when the replay is linear, whatever the mix).
    _encoding("cl100k_base")  # load the vocabulary before timing
    prev: LinearityPoint | None = None
    for turns in (93, 186, 372, 744):  # ~250, 500, 1000, 2000 iterations per session
        p = linearity_point(turns, seeds=range(3, 3 + args.linearity_seeds))
        ratio = ""
        if prev:
            ratio = (f"; per doubling of bytes: replay "
                     f"{per_doubling(p.replay, prev.replay, p.size, prev.size):.2f} x "
                     "(target <= 2.2), engine alone "
                     f"{per_doubling(p.engine, prev.engine, p.size, prev.size):.2f} x, "
                     "tokenizer floor "
                     f"{per_doubling(p.floor, prev.floor, p.size, prev.size):.2f} x")
        print(f"linearity: {p.iterations / args.linearity_seeds:5.0f} iterations per session, "
              f"{p.size / MB:5.1f} MB in {p.replay:6.3f} s ({p.replay / p.floor:.2f} x its "
              f"tokenizer floor; engine alone {p.engine:.3f} s){ratio}")
        prev = p


if __name__ == "__main__":
    main()
