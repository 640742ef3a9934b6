"""Replay throughput against the tokenizer's own, and replay linearity.

Prints, measured in the same run:

* the floors: tiktoken's ``encode_ordinary`` and the default counter's (toktok's where it
  imports, else ``bpe-openai``'s) over every
  distinct text segment of a generated fleet (message texts, thinking, tool inputs and
  results, system prompts, tool schemas, summaries);
* full replay runs (``vakpipe audit --replay``: all requests, all tables) on one
  worker counting with tiktoken (``VAKPIPE_TOKENIZER=tiktoken``: the replay before issue
  21) and on another counting with the default counter, interleaved, as MB/s,
  as a ratio of the tiktoken floor (target >= 0.50) and the one against the other
  (target >= 2.0), wall and CPU (the worker's and this process's: the steadier figure
  on a shared machine); each run starts from an empty count cache (a worker that loaded
  the code but never saw these texts), the first run on each fresh worker apart;
* with ``--baseline REV``: the same full replay by the project as it was at git revision
  REV (extracted with ``git archive``, run in a process and a cluster of its own: each
  tree's own code end to end), in interleaved pairs against this tree, and the median
  ratio of the ledger MB/s (issue 21's target: >= 2.0 against ``209306a``, the replay
  before it); ``--quick`` runs it once against HEAD so it never rots;
* linearity: the replay time of sessions of 250, 500, 1000 and 2000 iterations (four of
  each, summed), the ratio of each doubling of their length in iterations (target <=
  2.2), in tokens and in bytes, the same for the replay engine alone and for the
  tokenizer floor, the time per unit of their own tokenizer floor, and the engine's
  Python calls per entry (a count, free of noise);
* long-session linearity: plain sessions (no reset, packet or plan: every closed turn
  stays in every request) of 5k, 10k, 20k and 40k turns, replayed by the engine alone,
  and the ratio of each doubling (target <= 2.2; before the closed part kept its running
  hash it was ~2.8 and rising, 10k/20k/41k turns in 9.4/26.2/112 s);
* ``--big``: one plain session of about 1 GB (``--big-mb``), audited and replayed in a
  fresh process (as one worker's task, the default tokenizer counting), printing MB/s and the peak
  resident memory. Slow (minutes): not part of the default run.

Run: ``.venv/bin/python bench/replay_throughput.py [--sessions 300] [--long-turns 40000]``,
``.venv/bin/python bench/replay_throughput.py --big [--big-mb 1000]``,
``--only-long`` for the long-session part alone, ``--fleet-only`` for the full replay
runs alone (``--fleet-only --sessions 200 --baseline 209306a``: issue 21's replay
target), ``--quick`` (for ``make test``: a few small sessions, one run of each; prints
the same lines, asserts nothing).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import math
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    BENCH_DIR,
    baseline_tree,
    best_of,
    cluster,
    corpus_bytes,
    cpu_seconds,
    fleet,
    timed,
)
from bench.rss import peak_rss_bytes
from pipeline.audit.session import audit_session
from pipeline.io.storage import resolve
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import Entry, LineStats, read_ledger
from pipeline.replay.catalog import load_catalog
from pipeline.replay.projection import canonical_json, get_rule_set
from pipeline.replay.session import replay_session
from pipeline.replay.tokens import ExactTokenizer, _encoding, get_tokenizer
from pipeline.run.collector import cyclic_gc_paused
from pipeline.run.orchestrate import run_audit
from pipeline.run.replay_batches import ReplayOptions
from pipeline.synth.generator import generate_session

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


def tiktoken_count(text: str) -> int:
    """tiktoken's ``encode_ordinary`` count, uncached (the replay's tokenizer before)."""
    return len(_encoding("cl100k_base").encode_ordinary(text))


def default_count() -> Callable[[str], int]:
    """The default tokenizer's count, uncached (toktok's where it imports)."""
    tok = get_tokenizer()
    assert isinstance(tok, ExactTokenizer)
    return tok._encoded_length


def fresh_tokenizer() -> ExactTokenizer:
    """A new instance of the default tokenizer: an empty count cache."""
    tok = get_tokenizer()
    assert isinstance(tok, ExactTokenizer)
    return type(tok)(tok.name)


def tokenizer_floor(texts: set[str], count: Callable[[str], int] = tiktoken_count) -> float:
    t0 = time.perf_counter()
    for t in texts:
        count(t)
    return time.perf_counter() - t0


def forget_counts() -> None:
    """In a worker: drop the tokenizer and its count cache (the library stays loaded)."""
    get_tokenizer.cache_clear()


@contextmanager
def replay_worker(tokenizer: str) -> Iterator[tuple[str, Any]]:
    """A single-worker cluster whose worker counts with ``tokenizer`` (``default`` or
    ``tiktoken``: ``VAKPIPE_TOKENIZER`` as the worker process starts)."""
    before = os.environ.get("VAKPIPE_TOKENIZER")
    os.environ["VAKPIPE_TOKENIZER"] = tokenizer
    try:
        with cluster(1) as (address, client):
            yield address, client
    finally:
        if before is None:
            os.environ.pop("VAKPIPE_TOKENIZER", None)
        else:
            os.environ["VAKPIPE_TOKENIZER"] = before


@dataclass(frozen=True)
class Run:
    """One full replay run: wall seconds, and the CPU seconds of its worker process and of
    this one (listing, commit: ``run_audit``'s client side), the steadier figure on a
    shared machine, where another's load stretches wall time."""

    wall: float
    cpu: float


def worker_cpu(client: Any) -> float:
    """CPU seconds used so far by the worker processes of ``client``'s cluster."""
    return float(sum(client.run(cpu_seconds).values()))


#: Times the full replay of one tree of vakpipe (on its ``PYTHONPATH``) on a warm
#: single-worker cluster of its own: best wall and worker CPU of ``REPEAT`` runs after
#: a first, each from an empty count cache, as JSON. Written with what every tree since
#: the replay has (``run_audit``, ``ReplayOptions``, ``get_tokenizer``), so it times
#: the tree before issue 21 as well as this one.
BASELINE_RUNNER = """
import json, shutil, sys, tempfile, time
import dask
from distributed import Client, LocalCluster
import pipeline.run.orchestrate as orchestrate
from pipeline.io.storage import resolve
from pipeline.replay.tokens import get_tokenizer
from pipeline.run.replay_batches import ReplayOptions

def forget():
    get_tokenizer.cache_clear()

def main():
    root, repeat = sys.argv[1], int(sys.argv[2])
    scratch = tempfile.mkdtemp(prefix="vakpipe-bench-dask-")
    walls, cpus = [], []
    try:
        with dask.config.set(getattr(orchestrate, "WORKER_CONFIG", {})), \\
                LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                             dashboard_address="127.0.0.1:0", local_directory=scratch) as lc, \\
                Client(lc, set_as_default=False) as client:
            for i in range(repeat + 1):
                client.run(forget)
                out = tempfile.mkdtemp(prefix="vakpipe-bench-replay-")
                cpu0 = sum(client.run(time.process_time).values())
                t0 = time.perf_counter()
                orchestrate.run_audit(resolve(root), resolve(out), scheduler=lc.scheduler_address,
                                      progress=False, replay=ReplayOptions())
                wall = time.perf_counter() - t0
                cpu = sum(client.run(time.process_time).values()) - cpu0
                shutil.rmtree(out, ignore_errors=True)
                if i:
                    walls.append(wall)
                    cpus.append(cpu)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps({"wall": min(walls), "cpu": min(cpus)}))

if __name__ == "__main__":
    main()
"""


def tree_replay(tree: Path, root: Path, repeat: int, runner: Path) -> Run:
    """:data:`BASELINE_RUNNER`'s figures for ``tree``, in a process of its own."""
    done = subprocess.run([sys.executable, str(runner), str(root), str(repeat)],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return Run(found["wall"], found["cpu"])


def against_baseline(rev: str, root: Path, size: int, pairs: int, repeat: int) -> None:
    """Print this tree's full replay against the tree at ``rev`` (issue 21's target:
    twice the ledger MB/s of the replay before it, ``209306a``), in ``pairs`` interleaved
    pairs of runs, each side in a process and cluster of its own."""
    with tempfile.TemporaryDirectory(prefix="vakpipe-bench-baseline-") as scratch:
        tree = baseline_tree(rev, Path(scratch))
        if isinstance(tree, str):
            print(f"full replay against {rev}: skipped ({tree})")
            return
        runner = Path(scratch) / "runner.py"
        runner.write_text(BASELINE_RUNNER)
        here = Path(__file__).resolve().parents[1]
        ratios: list[float] = []
        for _ in range(pairs):
            old, new = (tree_replay(t, root, repeat, runner) for t in (tree, here))
            ratios.append(old.wall / new.wall)
            print(f"full replay, 1 worker, {rev} against this tree: {size / MB / old.wall:6.1f}"
                  f" against {size / MB / new.wall:6.1f} MB/s (CPU {old.cpu:.2f} against "
                  f"{new.cpu:.2f} s) = {old.wall / new.wall:.2f} x")
        print(f"full replay against {rev}: median {statistics.median(ratios):.2f} x the ledger "
              f"MB/s over {pairs} pairs (target >= 2.0)")


def replay_runs(root: Path, repeat: int, between: Callable[[], object],
                tokenizers: tuple[str, ...] = ("tiktoken", "default")) -> list[list[Run]]:
    """Per tokenizer, ``repeat`` full replay runs on a fresh single-worker cluster of its
    own, interleaved (one run of each in turn); the first also loads the code and the
    vocabulary into the worker, and each starts from an empty count cache (else every
    text would be counted once for all runs). ``between`` runs before each round (to
    interleave the floor with the runs)."""
    runs: list[list[Run]] = [[] for _ in tokenizers]
    with ExitStack() as stack:
        workers = [stack.enter_context(replay_worker(t)) for t in tokenizers]
        for _ in range(repeat):
            between()
            for (address, client), mine in zip(workers, runs, strict=True):
                client.run(forget_counts)
                out = Path(tempfile.mkdtemp(prefix="vakpipe-bench-replay-"))
                try:
                    cpu0 = worker_cpu(client) + cpu_seconds()
                    _, wall = timed(partial(
                        run_audit, resolve(str(root)), resolve(str(out)), scheduler=address,
                        progress=False, replay=ReplayOptions()))
                    mine.append(Run(wall, worker_cpu(client) + cpu_seconds() - cpu0))
                finally:
                    shutil.rmtree(out, ignore_errors=True)
    return runs


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
    tokens: int  # of the distinct text segments
    replay: float  # the default tokenizer (toktok's where it imports)
    engine: float  # a tokenizer that costs nothing
    floor: float  # the default tokenizer over each session's distinct segments
    calls_per_entry: float  # Python calls of the engine alone, per active-chain entry


@dataclass(frozen=True)
class LinearitySession:
    """One generated session's active chain, ready to replay."""

    turns: int
    size: int
    tokens: int
    iterations: int
    key: Any
    chain: list[Entry]
    texts: set[str]


def linearity_session(turns: int, seed: int) -> LinearitySession:
    """The active chain of one generated session of ``turns`` turns."""
    s = generate_session(seed, turns=turns, consistent=False)
    key = parse_session_path(s.path)
    assert key is not None
    entries: list[Entry] = []
    active = audit_session(key, s.lines(), keep=entries).active
    chain = [e for e in entries if (e.line, e.id) in active]
    texts: set[str] = set()
    add_segments(chain, texts)
    iterations = sum(1 for e in chain if e.kind == "message" and e.role == "assistant")
    count = default_count()
    tokens = sum(count(t) for t in texts)
    return LinearitySession(turns, sum(len(line) for line in s.lines()), tokens, iterations,
                            key, chain, texts)


def replay_cold(s: LinearitySession, rules: Any, catalog: Any) -> object:
    """Replay ``s`` with a tokenizer of its own, as a worker's first session: its cache of
    short texts' counts would otherwise carry over from the runs before, more of it for
    small sessions than for large ones."""
    return replay_session(s.key, s.chain, rules=rules, tokenizer=fresh_tokenizer(),
                          catalog=catalog)


def linearity_points(lengths: Iterable[int], seeds: Iterable[int],
                     rounds: int) -> list[LinearityPoint]:
    """Per length, the sessions of every seed summed; each session's time is its best of
    ``rounds`` runs, and the rounds go over every length in turn, so a slower minute of
    a noisy machine falls on every length alike."""
    sessions = [linearity_session(t, seed) for t in lengths for seed in seeds]
    catalog, rules = load_catalog(), get_rule_set("v1")
    kinds = ("replay", "engine", "floor")
    runs = [run for s in sessions for run in (
        partial(replay_cold, s, rules, catalog),
        partial(replay_session, s.key, s.chain, rules=rules, tokenizer=LengthTokenizer(),
                catalog=catalog),
        partial(tokenizer_floor, s.texts, default_count()))]
    with cyclic_gc_paused():  # as a worker replays an object
        timings = iter(best_of(rounds, *runs))
    best = {(i, kind): next(timings).wall for i in range(len(sessions)) for kind in kinds}
    calls = []
    for s in sessions:
        profile = cProfile.Profile()
        profile.runcall(replay_session, s.key, s.chain, rules=rules,
                        tokenizer=LengthTokenizer(), catalog=catalog)
        calls.append(pstats.Stats(profile).total_calls)
    points = []
    for length in dict.fromkeys(lengths):
        mine = [i for i, s in enumerate(sessions) if s.turns == length]
        points.append(LinearityPoint(
            sum(sessions[i].iterations for i in mine), sum(sessions[i].size for i in mine),
            sum(sessions[i].tokens for i in mine),
            *(sum(best[i, kind] for i in mine) for kind in kinds),
            sum(calls[i] for i in mine) / sum(len(sessions[i].chain) for i in mine)))
    return points


def per_doubling(now: float, before: float, length: int, length_before: int) -> float:
    """``now / before`` scaled to one doubling of the length: 2 ** (log ratio / log
    length ratio) (generated sessions do not double exactly)."""
    return float(2 ** (math.log(now / before) / math.log(length / length_before)))


#: The session every plain session is written as (its key: cwd ``/home/me/proj``).
PLAIN_PATH = ("agents/vak/sessions/2d872b17b24e117e/"
              "0199a1f2-5f00-7000-8000-00000000abcd.jsonl")


def plain_session(turns: int, *, text_bytes: int = 40) -> Iterable[bytes]:
    """The lines of a chained ledger of ``turns`` turns with neither reset, packet nor
    plan, so every closed turn stays in every request (the replay's worst case): each
    turn a directive, an assistant call, its result and a final answer, short texts of
    about ``text_bytes`` bytes (longer ones make a 1 GB session)."""
    prev: str | None = None
    parent: str | None = None
    pad = "x" * max(0, text_bytes - 30)

    def line(n: int, kind: str, payload: dict[str, Any]) -> bytes:
        nonlocal prev, parent
        ident = f"0199a1f2-5f00-7000-8000-{n:012x}"
        obj: dict[str, Any] = {"id": ident, "parent_id": parent,
                               "ts": f"2026-09-21T{n // 3_600_000 % 24:02d}:"
                                     f"{n // 60_000 % 60:02d}:{n // 1000 % 60:02d}."
                                     f"{n % 1000:03d}Z"}
        if prev is not None:
            obj["prev_hash"] = prev
        obj["kind"] = kind
        obj.update(payload)
        body = orjson.dumps(obj)
        prev, parent = hashlib.sha256(body).hexdigest(), ident
        return body + b"\n"

    def message(role: str, content: list[dict[str, Any]]) -> dict[str, Any]:
        meta = {"model": "gpt-4o", "stop_reason": "end_turn"} if role == "assistant" else None
        return {"message": {"role": role, "content": content},
                **({"meta": meta} if meta else {})}

    yield line(0, "header", {
        "session_id": "0199a1f2-5f00-7000-8000-00000000abcd",
        "created_at": "2026-09-21T00:00:00Z", "cwd": "/home/me/proj",
        "contract": {"app_version": "3.5.0", "provider": "openai", "model": "gpt-4o",
                     "route_ladder": [], "route_objective": "balanced",
                     "route_annotations": [], "system_prompt": "You are vak.",
                     "permission_mode": "workspace-write", "capabilities": [],
                     "prompt_layers": []}})
    n = 0
    for t in range(1, turns + 1):
        call = f"call_{t}"
        yield line(n := n + 1, "message", message("user", [
            {"type": "text", "text": f"turn {t}: list the files {pad}"}]))
        yield line(n := n + 1, "message", message("assistant", [
            {"type": "text", "text": f"listing {pad}"},
            {"type": "tool_use", "id": call, "name": "bash", "input": {"cmd": "ls"}}]))
        yield line(n := n + 1, "message", message("user", [
            {"type": "tool_result", "tool_use_id": call, "content": f"a.txt b.txt {pad}",
             "is_error": False}]))
        yield line(n := n + 1, "message", message("assistant", [
            {"type": "text", "text": f"two files {pad}"}]))


def plain_chain(turns: int) -> tuple[Any, list[Entry]]:
    """The key and the active chain of :func:`plain_session` (every entry is on it)."""
    key = parse_session_path(PLAIN_PATH)
    entries = [i for i in read_ledger(plain_session(turns)) if isinstance(i, Entry)]
    return key, entries


def long_linearity(lengths: Iterable[int], rounds: int) -> None:
    """Print the engine's replay time of plain sessions of each length in turns, and the
    ratio of each doubling: flat at ~2 when a request's work does not grow with the
    closed turns before it."""
    catalog, rules = load_catalog(), get_rule_set("v1")
    prev: tuple[int, float] | None = None
    for turns in lengths:
        key, chain = plain_chain(turns)
        run = partial(replay_session, key, chain, rules=rules, tokenizer=LengthTokenizer(),
                      catalog=catalog)
        # As a worker replays an object: the cyclic collector paused (else its full
        # collections rescan the engine's growing state, and this chain, ever longer).
        with cyclic_gc_paused():
            seconds = min(t.wall for t in best_of(rounds, run))
        ratio = ""
        if prev is not None:
            ratio = (f", per doubling of turns {per_doubling(seconds, prev[1], turns, prev[0]):.2f}"
                     " x (target <= 2.2)")
        print(f"long linearity: {turns:7,} turns ({len(chain):,} entries, "
              f"{turns * 2:,} requests) replayed by the engine alone in {seconds:6.2f} s "
              f"({seconds / len(chain) * 1e6:.1f} us per entry){ratio}")
        prev = (turns, seconds)
        del chain


def measure_big(path: str) -> dict[str, Any]:
    """Audit and replay (the default tokenizer) the one session at ``path`` as one
    worker's task does (lines streamed, the active chain re-read from the file); time and
    peak memory."""
    key = parse_session_path(PLAIN_PATH)
    assert key is not None
    with cyclic_gc_paused():  # as a worker reads an object
        return _measure_big(key, path)


def _measure_big(key: Any, path: str) -> dict[str, Any]:
    from pipeline.io.storage import guarded_lines

    before = peak_rss_bytes()
    t0 = time.perf_counter()
    stats = LineStats()
    with open(path, "rb", buffering=2**20) as f:
        audit = audit_session(key, guarded_lines(f))
    active = audit.active
    catalog, rules = load_catalog(), get_rule_set("v1")

    def chain() -> Iterable[Entry]:
        with open(path, "rb", buffering=2**20) as f:
            for item in read_ledger(guarded_lines(f), stats):
                if isinstance(item, Entry) and (item.line, item.id) in active:
                    yield item

    t1 = time.perf_counter()
    result = replay_session(key, chain(), rules=rules, tokenizer=fresh_tokenizer(),
                            catalog=catalog)
    t2 = time.perf_counter()
    return {"bytes": stats.bytes, "entries": audit.row["entries"],
            "turns": audit.row["turns"], "requests": len(getattr(result, "requests", ())),
            "audit_s": t1 - t0, "replay_s": t2 - t1, "rss_before": before,
            "rss_peak": peak_rss_bytes()}


def big(mb: int) -> None:
    """Write (once) a plain session of about ``mb`` MB and measure it in a fresh process."""
    path = BENCH_DIR / f"plain-session-{mb}mb.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # texts of ~1 KB: ~5.6 KB a turn, so ~180,000 turns and 720,000 entries a GB
        per_turn = sum(map(len, plain_session(100, text_bytes=1000))) / 100
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for b in plain_session(max(1, round(mb * MB / per_turn)), text_bytes=1000):
                f.write(b)
        tmp.rename(path)
    done = subprocess.run([sys.executable, __file__, "--measure-big", str(path)],
                          capture_output=True, text=True, check=True)
    r = json.loads(done.stdout.splitlines()[-1])
    grown = (r["rss_peak"] - r["rss_before"]) / 2**20
    print(f"big session: {r['bytes'] / MB:,.0f} MB, {r['entries']:,} entries, "
          f"{r['turns']:,} turns: audit {r['audit_s']:.1f} s "
          f"({r['bytes'] / MB / r['audit_s']:.1f} MB/s), replay {r['replay_s']:.1f} s "
          f"({r['bytes'] / MB / r['replay_s']:.1f} MB/s); peak RSS "
          f"{r['rss_peak'] / 2**20:,.0f} MiB (+{grown:,.0f} MiB over the "
          f"{r['rss_before'] / 2**20:,.0f} MiB before it)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3, help="runs after the first (best kept)")
    ap.add_argument("--linearity-seeds", type=int, default=4,
                    help="sessions summed per length in the linearity part")
    ap.add_argument("--long-turns", type=int, default=40_000,
                    help="longest plain session of the long-session linearity part")
    ap.add_argument("--only-long", action="store_true",
                    help="run the long-session linearity part alone")
    ap.add_argument("--big", action="store_true",
                    help="only: replay one plain session of --big-mb MB (slow)")
    ap.add_argument("--big-mb", type=int, default=1000)
    ap.add_argument("--fleet-only", action="store_true",
                    help="only the full replay runs on the fleet (no linearity parts)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny inputs, one run of each (for make test): the same lines")
    ap.add_argument("--baseline", metavar="REV", default=None,
                    help="also time the full replay of the project at git revision REV "
                         "(209306a: before issue 21) against this tree, in interleaved "
                         "pairs (--quick: HEAD, once)")
    ap.add_argument("--pairs", type=int, default=3, help="pairs of runs against --baseline")
    ap.add_argument("--measure-big", metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure_big:
        print(json.dumps(measure_big(args.measure_big)))
        return
    if args.big:
        big(args.big_mb)
        return
    # --quick: every part on inputs small enough for the test suite (a few seconds
    # each), so that a change that breaks this script fails a test, not the next person
    # who runs it. Its figures are printed, never judged.
    sessions, repeat = (6, 1) if args.quick else (args.sessions, args.repeat)
    lengths, rounds = ((8, 16), 1) if args.quick else ((93, 186, 372, 744), 7)
    seeds = range(3, 3 + (1 if args.quick else args.linearity_seeds))
    longest = 200 if args.quick else max(1, args.long_turns)
    long_lengths = sorted({max(1, longest >> k) for k in range(3, -1, -1)})
    long_rounds = 1 if args.quick else 2
    if args.only_long:
        long_linearity(long_lengths, rounds=long_rounds)
        return
    root = fleet(f"replay-fleet-{sessions}", sessions=sessions, seed=99)
    size = corpus_bytes(root)
    texts = segments(root)
    seg_mb = sum(len(t.encode()) for t in texts) / MB
    mine = type(get_tokenizer()).__name__
    # The machines are noisy (+-25% between minutes): the floors are measured before
    # each round of runs and the best of each kept. The first run on a fresh worker also
    # imports the code and loads the vocabulary (once per worker, ~0.2 s for tiktoken,
    # less for the Rust counters, their vocabularies compiled in): printed apart, the
    # targets are for the runs after it (a fleet run's steady state).
    floors: list[float] = []
    default_floors: list[float] = []

    def floors_now() -> None:
        floors.append(tokenizer_floor(texts))
        default_floors.append(tokenizer_floor(texts, default_count()))

    before, after = replay_runs(root, repeat + 1, between=floors_now)
    floor_s, default_floor_s = min(floors), min(default_floors)
    print(f"fleet: {size / MB:,.1f} MB, {len(texts):,} distinct segments ({seg_mb:,.1f} MB)")
    print(f"tokenizer floor, tiktoken encode_ordinary (distinct segments): {floor_s:6.2f} s "
          f"= {size / MB / floor_s:6.1f} MB/s of ledger")
    print(f"tokenizer floor, {mine} (distinct segments):{' ' * max(0, 25 - len(mine))}"
          f"{default_floor_s:6.2f} s = {size / MB / default_floor_s:6.1f} MB/s of ledger "
          f"= {floor_s / default_floor_s:.2f} x tiktoken's")
    best: dict[str, tuple[float, float]] = {}
    for label, runs in (("tiktoken (before)", before), (f"{mine} (default)", after)):
        steady = runs[1:] or runs
        cold_s = runs[0].wall
        run_s, cpu_s = min(r.wall for r in steady), min(r.cpu for r in steady)
        best[label] = (run_s, cpu_s)
        print(f"full replay, 1 worker, {label}, first run (cold worker): {cold_s:6.2f} s "
              f"= {size / MB / cold_s:6.1f} MB/s = {floor_s / cold_s:.2f} x tiktoken floor")
        print(f"full replay, 1 worker, {label} (audit --replay, all tables): {run_s:6.2f} s "
              f"= {size / MB / run_s:6.1f} MB/s = {floor_s / run_s:.2f} x tiktoken floor "
              f"(target >= 0.50); CPU {cpu_s:6.2f} s = {size / MB / cpu_s:6.1f} MB/s")
    (b_wall, b_cpu), (a_wall, a_cpu) = best.values()
    print(f"full replay, {mine} against tiktoken: {b_wall / a_wall:.2f} x the ledger MB/s "
          f"(wall; target >= 2.0), {b_cpu / a_cpu:.2f} x by CPU (worker and client)")
    baseline = "HEAD" if args.quick and args.baseline is None else args.baseline
    if baseline is not None:
        against_baseline(baseline, root, size, 1 if args.quick else args.pairs, repeat)
    if args.fleet_only:
        return
    # Linearity. A session's length is its iterations (model requests): what the
    # engine's per-entry work follows, which is most of a replay since the tokenizer
    # became cheap (toktok). Its tokens (what the replay counts, and what the
    # tokenizer's time follows: the measure while the tokenizer dominated) and its bytes
    # are printed too; bytes are the poorest measure: code and logs cost ~2.5 times
    # prose per byte, and a generated session's bytes are dominated by a few
    # heavy-tailed tool results, so a doubling of bytes measured the content mix as
    # much as the replay. Each length sums four sessions (seeds),
    # and more figures separate the replay from the tokenizer and from the machine's
    # noise: the engine alone (a tokenizer that costs nothing), the replay's time per
    # unit of its own tokenizer floor, and the engine's Python calls per entry (both
    # flat when the replay is linear; the calls are a count, free of noise).
    get_tokenizer().count("load the vocabulary before timing")
    prev: LinearityPoint | None = None
    # ~250, 500, 1000, 2000 iterations per session
    for p in linearity_points(lengths, seeds, rounds=rounds):
        print(f"linearity: {p.iterations / len(seeds):5.0f} iterations per session, "
              f"{p.tokens / 1e6:5.2f} M tokens, {p.size / MB:5.1f} MB in {p.replay:6.3f} s "
              f"({p.replay / p.floor:.2f} x its tokenizer floor; engine alone "
              f"{p.engine:.3f} s, {p.calls_per_entry:.0f} Python calls per entry)")
        if prev:
            for unit, now, before_n in (("iterations", p.iterations, prev.iterations),
                                        ("tokens", p.tokens, prev.tokens),
                                        ("bytes", p.size, prev.size)):
                replay, engine, floor = (per_doubling(getattr(p, k), getattr(prev, k),
                                                      now, before_n)
                                         for k in ("replay", "engine", "floor"))
                target = " (target <= 2.2)" if unit == "iterations" else ""
                print(f"           per doubling of {unit:10s}: replay {replay:.2f} x{target}, "
                      f"engine alone {engine:.2f} x, tokenizer floor {floor:.2f} x")
        prev = p
    long_linearity(long_lengths, rounds=long_rounds)


if __name__ == "__main__":
    main()
