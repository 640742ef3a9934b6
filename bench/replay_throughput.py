"""Replay throughput against the tokenizer's own, and replay linearity.

Prints, measured in the same run:

* the floor: tiktoken's ``encode_ordinary`` over every distinct text segment of a
  generated fleet (message texts, thinking, tool inputs and results, system prompts,
  tool schemas, summaries);
* a full replay run (``vakpipe audit --replay``: all requests, all tables) on one
  worker, as MB/s and as a ratio of the floor (target >= 0.50);
* linearity: one session's replay time at 250, 500, 1000 and 2000 iterations, and the
  ratio of each doubling (target <= 2.2).

Run: ``.venv/bin/python bench/replay_throughput.py [--sessions 300]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
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
            for item in read_ledger(f):
                if not isinstance(item, Entry):
                    continue
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
    return out


def tokenizer_floor(texts: set[str]) -> float:
    enc = _encoding("cl100k_base")
    t0 = time.perf_counter()
    for t in texts:
        enc.encode_ordinary(t)
    return time.perf_counter() - t0


def replay_run(root: Path) -> float:
    out = Path(tempfile.mkdtemp(prefix="vakpipe-bench-replay-"))
    try:
        with cluster(1) as (address, _client):
            _, seconds = timed(lambda: run_audit(
                resolve(str(root)), resolve(str(out)), scheduler=address, progress=False,
                replay=ReplayOptions()))
        return seconds
    finally:
        shutil.rmtree(out, ignore_errors=True)


def session_replay_seconds(turns: int) -> tuple[int, int, float]:
    """Iterations, bytes and best-of-3 replay seconds of one generated session."""
    s = generate_session(3, turns=turns, consistent=False)
    entries = [e for e in read_ledger(s.lines()) if isinstance(e, Entry)]
    tree = TreeIndex()
    for e in entries:
        tree.add(e)
    tree.finish()
    active = {n.id for n in tree.nodes if n.on_active_chain}
    chain = [e for e in entries if e.id in active]
    from pipeline.layout import parse_session_path

    key = parse_session_path(s.path)
    assert key is not None
    best = float("inf")
    n = 0
    for _ in range(3):
        t0 = time.perf_counter()
        r = replay_session(key, chain, rules=get_rule_set("v1"), tokenizer=get_tokenizer(),
                           catalog=load_catalog())
        best = min(best, time.perf_counter() - t0)
        n = len(r.requests)
    return n, sum(len(line) for line in s.lines()), best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=300)
    args = ap.parse_args()
    root = fleet(f"replay-fleet-{args.sessions}", sessions=args.sessions, seed=99)
    size = corpus_bytes(root)
    texts = segments(root)
    floor_s = tokenizer_floor(texts)
    seg_mb = sum(len(t.encode()) for t in texts) / MB
    run_s = replay_run(root)
    print(f"fleet: {size / MB:,.1f} MB, {len(texts):,} distinct segments ({seg_mb:,.1f} MB)")
    print(f"tokenizer floor (encode_ordinary, distinct segments): {floor_s:6.2f} s "
          f"= {size / MB / floor_s:6.1f} MB/s of ledger")
    print(f"full replay, 1 worker (audit --replay, all tables):  {run_s:6.2f} s "
          f"= {size / MB / run_s:6.1f} MB/s = {floor_s / run_s:.2f} x floor (target >= 0.50)")
    prev: tuple[int, int, float] | None = None
    _encoding("cl100k_base")  # load the vocabulary before timing
    for turns in (93, 186, 372, 744):  # ~250, 500, 1000, 2000 iterations
        n, size, secs = session_replay_seconds(turns)
        ratio = ""
        if prev:
            ratio = (f"time {secs / prev[2]:.2f} x for {n / prev[0]:.2f} x iterations, "
                     f"{size / prev[1]:.2f} x bytes (target <= 2.2 x per doubling)")
        print(f"linearity: {n:5d} iterations, {size / MB:6.1f} MB in {secs:7.3f} s  {ratio}")
        prev = (n, size, secs)


if __name__ == "__main__":
    main()
