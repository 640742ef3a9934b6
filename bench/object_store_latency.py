"""Reading many small sessions, and a run's tables, on an object store whose round trips
take time.

Against S3 every read of an object waits a round trip or two (a HEAD where the listing is
not cached, then the GET), ~20-40 ms from a machine in the bucket's region, far more than
the audit of a 100 KB session takes. Here moto's S3 server on 127.0.0.1 sits behind a
TCP proxy that holds every chunk of bytes ``--rtt-ms / 2`` in each direction (so each
request and its answer take one ``--rtt-ms`` round trip more). Both trees run, as users
do, each command in a process of its own, in interleaved rounds: the tree at
``--baseline`` (extracted with ``git archive``, made ready as ``make`` makes this one:
:func:`bench.common.baseline_tree`) and this one. Five ways:

* ``vakpipe audit s3://... --out OUT`` (a local OUT) in the command's own process (the
  default for an archive this small), and
* on a LocalCluster of ``--workers`` worker processes (each audit's summary is checked:
  every session read);
* the second of two ``vakpipe nightly s3://... --out s3://...`` (nothing changed: every
  table carried from the first night's partition on S3);
* ``vakpipe cost`` of that nightly output (its tables read from S3);
* ``vakpipe dashboard`` of it (both nights' manifests and integrity tables);
* ``vakpipe audit`` of ``--segment-ledgers`` of vak's record-segment ledgers (each a
  directory of a ``KEY``, a ``seals.log`` and three segments; opened with their keys) in
  the command's own process, and
* the same on the LocalCluster.

Printed per round: wall seconds of each tree and the baseline / this tree ratio; then
the median ratio per way.

Run: ``.venv/bin/python bench/object_store_latency.py [--baseline 5a1d80d]
[--sessions 300] [--segment-ledgers 100] [--rtt-ms 20] [--rounds 3] [--workers 2]``.
``--quick`` (a test runs it): 12 small sessions, 4 segment ledgers, one round, no
cluster, against HEAD. The figures are printed, never judged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import s3fs

from bench.common import MB, REPO, baseline_tree, corpus_bytes, fleet, vakpipe_of
from pipeline.io.storage import resolve
from pipeline.synth.local_s3 import local_s3
from pipeline.synth.segments import write_segment_fleet

BUCKET = "latency"


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk written ``delay`` seconds after it was
    read (in order: a link of that one-way latency, not a slow one)."""
    chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await chunks.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    sender = asyncio.ensure_future(send())
    try:
        with suppress(OSError):
            while data := await reader.read(1 << 16):
                chunks.put_nowait((time.monotonic() + delay, data))
        chunks.put_nowait((0.0, b""))
        with suppress(OSError):
            await sender
    finally:
        if not sender.done():  # this side was cancelled: its sender goes too
            sender.cancel()
            with suppress(asyncio.CancelledError, OSError):
                await sender


@contextmanager
def latency_proxy(upstream: str, rtt_ms: float) -> Iterator[str]:
    """A TCP proxy to ``upstream`` (``http://host:port``) on 127.0.0.1 that adds
    ``rtt_ms`` to every round trip; its endpoint for the block."""
    target = urllib.parse.urlsplit(upstream)
    delay = rtt_ms / 2000
    loop = asyncio.new_event_loop()
    started = threading.Event()
    servers: list[asyncio.Server] = []
    stopping: list[asyncio.Event] = []
    connections: set[asyncio.Task[None]] = set()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(target.hostname, target.port)
        except OSError:
            client_w.close()
            return
        for w in (client_w, up_w):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Held here: asyncio keeps only a weak reference to a connection's task.
        this = asyncio.current_task()
        assert this is not None
        connections.add(this)
        ways = {asyncio.ensure_future(_forward(client_r, up_w, delay)),
                asyncio.ensure_future(_forward(up_r, client_w, delay))}
        try:
            # One side closed: so is the other (moto keeps its connections open).
            _, rest = await asyncio.wait(ways, return_when=asyncio.FIRST_COMPLETED)
            for way in rest:
                way.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
        finally:
            client_w.close()
            up_w.close()
            connections.discard(this)

    async def serve() -> None:
        servers.append(await asyncio.start_server(handle, "127.0.0.1", 0))
        stopping.append(asyncio.Event())
        started.set()
        await stopping[0].wait()
        servers[0].close()
        # The connections still open (pooled by the clients): ended, not left pending.
        while open_ := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            for task in open_:
                task.cancel()
            await asyncio.gather(*open_, return_exceptions=True)

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    started.wait()
    try:
        yield f"http://127.0.0.1:{servers[0].sockets[0].getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(stopping[0].set)
        thread.join(timeout=10)
        loop.close()


def audit(tree: Path, url: str, env: dict[str, str], workers: int | None,
          keys: Path | None = None) -> float:
    """Wall seconds of ``vakpipe audit URL`` of ``tree`` into a new local OUT (``keys``:
    its ``--keys``); an audit that does not read every session stops the benchmark."""
    out = Path(tempfile.mkdtemp(prefix="vakpipe-bench-latency-"))
    try:
        t0 = time.perf_counter()
        done = vakpipe_of(tree, ["audit", url, "--out", str(out / "out"), "--no-progress",
                                 "--json",
                                 *([] if workers is None else ["--workers", str(workers)]),
                                 *([] if keys is None else ["--keys", str(keys)])], env)
        wall = time.perf_counter() - t0
        summary = json.loads(done.stdout)
        if summary.get("unread_objects"):
            sys.exit(f"the audit of {tree} left {summary['unread_objects']} objects unread")
        return wall
    finally:
        shutil.rmtree(out, ignore_errors=True)


def timed(tree: Path, args: list[str], env: dict[str, str]) -> float:
    """Wall seconds of ``vakpipe ARGS`` of ``tree``."""
    t0 = time.perf_counter()
    vakpipe_of(tree, args, env)
    return time.perf_counter() - t0


def second_night(tree: Path, url: str, env: dict[str, str], out: str) -> float:
    """Wall seconds of the second of two ``vakpipe nightly URL --out OUT`` of ``tree``
    (nothing changed: every table carried from the first night's partition, on S3)."""
    nights = [timed(tree, ["nightly", url, "--out", out, "--no-progress", "--date", day], env)
              for day in ("2026-12-01", "2026-12-02")]
    return nights[-1]


def cost(tree: Path, out: str, env: dict[str, str]) -> float:
    """Wall seconds of ``vakpipe cost OUT`` of ``tree`` (a nightly output on S3, its
    report in a local folder)."""
    with tempfile.TemporaryDirectory(prefix="vakpipe-bench-latency-report-") as report:
        return timed(tree, ["cost", out, "--report-dir", report], env)


def dashboard(tree: Path, out: str, env: dict[str, str]) -> float:
    """Wall seconds of ``vakpipe dashboard OUT`` of ``tree`` (its page in a local file)."""
    with tempfile.TemporaryDirectory(prefix="vakpipe-bench-latency-page-") as page:
        return timed(tree, ["dashboard", out, "--html", f"{page}/dashboard.html"], env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", metavar="REV", default="5a1d80d")
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--segment-ledgers", type=int, default=100,
                    help="vak record-segment ledgers audited (0: not)")
    ap.add_argument("--rtt-ms", type=float, default=20.0, help="round trip added (ms)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="the cluster's --workers")
    ap.add_argument("--quick", action="store_true",
                    help="for make test: 12 sessions, 4 segment ledgers, one round, no "
                         "cluster, against HEAD")
    args = ap.parse_args()
    if args.quick:
        args.baseline, args.sessions, args.segment_ledgers, args.rounds = "HEAD", 12, 4, 1
    root = fleet(f"fleet-latency-{args.sessions}", sessions=args.sessions, seed=7)
    print(f"fleet: {corpus_bytes(root) / MB:,.1f} MB in {args.sessions} sessions on moto "
          f"behind {args.rtt_ms:g} ms round trips")
    with tempfile.TemporaryDirectory(prefix="vakpipe-bench-baseline-") as scratch, \
            local_s3() as server:
        s3fs.S3FileSystem(skip_instance_cache=True).put(
            f"{root}/", f"{BUCKET}/archive/", recursive=True)
        keys = Path(scratch) / "segment-keys.json"
        if args.segment_ledgers:
            made, key_bytes = write_segment_fleet(resolve(f"s3://{BUCKET}/segments"),
                                                  args.segment_ledgers, seed=7)
            keys.write_bytes(key_bytes)
            print(f"and {args.segment_ledgers} segment ledgers "
                  f"({sum(len(d) for m in made for d in m.files.values()) / MB:,.1f} MB)")
        tree = baseline_tree(args.baseline, Path(scratch))
        if isinstance(tree, str):
            print(f"against {args.baseline}: skipped ({tree})")
            return
        with latency_proxy(server.endpoint, args.rtt_ms) as endpoint:
            env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}
            url = f"s3://{BUCKET}/archive"

            def nights(t: Path, round_: int) -> str:
                return f"s3://{BUCKET}/nights-{'this' if t == REPO else 'base'}-{round_}"

            ways: dict[str, Callable[[Path, int], float]] = {
                "audit in process": lambda t, r: audit(t, url, env, None),
                f"audit --workers {args.workers}": lambda t, r: audit(t, url, env, args.workers),
                "second night": lambda t, r: second_night(t, url, env, nights(t, r)),
                "cost of that output": lambda t, r: cost(t, nights(t, r), env),
                "dashboard of its nights": lambda t, r: dashboard(t, nights(t, r), env),
            }
            if args.segment_ledgers:
                ledgers = f"s3://{BUCKET}/segments"
                ways["segment ledgers, audit in process"] = \
                    lambda t, r: audit(t, ledgers, env, None, keys)
                ways[f"segment ledgers, audit --workers {args.workers}"] = \
                    lambda t, r: audit(t, ledgers, env, args.workers, keys)
            if args.quick:
                for way in [w for w in ways if f"--workers {args.workers}" in w]:
                    del ways[way]
            ratios: dict[str, list[float]] = {way: [] for way in ways}
            for round_ in range(1, args.rounds + 1):
                for way, timed in ways.items():
                    old, new = timed(tree, round_), timed(REPO, round_)
                    ratios[way].append(old / new)
                    print(f"round {round_}, {way}: {args.baseline} {old:6.2f} s, "
                          f"this tree {new:6.2f} s = {old / new:.2f} x")
    for way, values in ratios.items():
        print(f"{way} on {args.rtt_ms:g} ms round trips against {args.baseline}: "
              f"median {statistics.median(values):.2f} x over {len(values)} rounds")


if __name__ == "__main__":
    main()
