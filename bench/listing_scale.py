"""How listing, planning, scheduling and committing grow towards 10^6 sessions.

Measures, on this machine, and prints what each figure extrapolates to at 10^6
sessions (docs/scaling.md reads these numbers):

* **listing**: ``--keys`` session keys (default 50,000; 200,000 takes ~15 min to create)
  put on moto's S3 server (a separate process) from 32 threads, then listed the way a
  run lists them (:func:`pipeline.io.storage.enumerate_sessions`: one recursive ``find``
  plus filtering): seconds, keys per second, and the memory the listing holds;
* **planning**: :func:`pipeline.run.orchestrate.plan_batches` on 10^6 synthetic sessions
  (heavy-tailed sizes, 100 KB mean): seconds and the tasks it makes for 8 to 256 workers,
  and each plan's run simulated (task times spread as measured here) against the ideal
  and against the same plan without its finer last wave;
* **scheduler overhead**: ``--tasks`` trivial tasks submitted to a LocalCluster of two
  worker processes the way :func:`pipeline.run.orchestrate.run_batches` submits batches
  (one ``submit`` each, ``as_completed``): milliseconds per task;
* **commit**: a staged run of ``--parts`` tiny parts in each of four datasets committed
  to moto: milliseconds per part (one server-side copy and one delete each);
* **tables**: ``vakpipe nightly`` on ``--sessions`` generated sessions: rows and bytes
  per session of each table (the job runner reads the previous night's tables whole to
  carry unchanged rows forward).

moto is much slower per request than S3 (~6 ms of server time each), so the S3 figures
are extrapolations, and say so. Run:
``.venv/bin/python bench/listing_scale.py [--keys 50000] [--tasks 2000] [--parts 400]
[--quick]``.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa

from bench.common import cluster, timed
from pipeline.io.commit import StagedRun, new_run_id
from pipeline.io.storage import SessionObject, enumerate_sessions, forget_listing, resolve
from pipeline.ledger.layout import SessionKey
from pipeline.run.orchestrate import MAX_BATCH_FILES, batch_target, cut_batches, plan_batches
from pipeline.synth.local_s3 import local_s3

MILLION = 1_000_000
BUCKET = "vakpipe-scale"
#: Sessions per agent directory and per working-directory hash, as a fleet spreads them.
AGENTS, DIRS = 8, 500


def key_of(i: int) -> str:
    agent, cwd = i % AGENTS, (i // AGENTS) % DIRS
    stem = f"0199{i:012x}-7000-8000-000000000000"
    return f"archive/agents/agent{agent}/sessions/{cwd:016x}/{stem}.jsonl"


def put_keys(client: object, n: int, threads: int = 32) -> float:
    """Put ``n`` one-line objects; return the seconds it took."""
    body = b'{"id":"x"}\n'

    def put(i: int) -> None:
        client.put_object(Bucket=BUCKET, Key=key_of(i), Body=body)  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for done, _ in enumerate(pool.map(put, range(n)), 1):
            if done % 10_000 == 0:
                print(f"  ... {done:,} keys put", flush=True)
    return time.perf_counter() - t0


def measure_listing(n: int) -> None:
    print(f"listing: {n:,} keys on moto's server (separate process)")
    with local_s3() as server:
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=server.endpoint,
                              config=Config(max_pool_connections=64))
        client.create_bucket(Bucket=BUCKET)
        seconds = put_keys(client, n)
        print(f"  put {n:,} keys in {seconds:.1f} s ({n / seconds:,.0f} puts/s, 32 threads)")
        import s3fs

        def listed(plain: bool) -> tuple[float, float]:
            """Wall and CPU seconds of a command's listing: its location resolved as a
            command resolves it (its client made, the timestamps parsed by the standard
            library), or ``plain``: an s3fs instance as made elsewhere (botocore's own
            timestamp parser), its client made before the clock starts too."""
            s3fs.S3FileSystem.clear_instance_cache()
            root = resolve(f"s3://{BUCKET}/archive")
            if plain:
                s3fs.S3FileSystem.clear_instance_cache()
                root.filesystem().connect()
            cpu0 = time.process_time()
            listing, seconds = timed(lambda: enumerate_sessions(root))
            assert len(listing.sessions) == n, (len(listing.sessions), n)
            return seconds, time.process_time() - cpu0

        plain_seconds, plain_cpu = listed(plain=True)  # the baseline, in the same run
        seconds, cpu = listed(plain=False)
        root = resolve(f"s3://{BUCKET}/archive")
        pages = -(-n // 1000)  # ListObjectsV2 returns at most 1,000 keys a page
        print(f"  enumerate_sessions: {seconds:.1f} s wall = {seconds / pages * 1000:.0f} ms "
              f"per 1,000-key page; this process's CPU {cpu / n * 1e6:.0f} us per key "
              "(s3fs's XML parsing, our filtering)")
        print(f"  with botocore's own timestamp parser: {plain_cpu / n * 1e6:.0f} us per key "
              f"({plain_seconds:.1f} s wall): {plain_cpu / cpu:.2f}x the CPU")
        # Is a page's cost moto's per-request cost, or does it grow with the bucket?
        # One agent's prefix (1/8 of the keys) against the whole listing says.
        s3fs.S3FileSystem.clear_instance_cache()
        fs = root.filesystem()
        sub, sub_seconds = timed(lambda: fs.find(f"{BUCKET}/archive/agents/agent0"))
        sub_pages = -(-len(sub) // 1000)
        print(f"  one agent's prefix ({len(sub):,} keys): "
              f"{sub_seconds / sub_pages * 1000:.0f} ms per page")
        del sub
        # Memory: what the listing holds, and what s3fs's listings cache holds besides.
        import gc

        s3fs.S3FileSystem.clear_instance_cache()
        gc.collect()
        tracemalloc.start()
        listing = enumerate_sessions(root)
        total, peak = tracemalloc.get_traced_memory()
        del listing
        gc.collect()
        cache_only = tracemalloc.get_traced_memory()[0]
        # What a run on a cluster, and a night, drop once the listing is classified.
        forget_listing(root)
        gc.collect()
        forgotten = tracemalloc.get_traced_memory()[0]
        s3fs.S3FileSystem.clear_instance_cache()
        gc.collect()
        baseline = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        alone, with_cache = total - cache_only, total - baseline
        print(f"  memory per session: {alone / n:,.0f} B in the Listing, "
              f"{(with_cache - alone) / n:,.0f} B more in s3fs's listings cache "
              f"({(forgotten - baseline) / n:,.0f} B once forget_listing dropped it), "
              f"peak {peak / n:,.0f} B")
        s3_minutes = (MILLION / 1000 * 0.1 + cpu / n * MILLION) / 60
        print(f"  at 10^6 sessions: {alone * MILLION / n / 2**30:.2f} GiB (Listing) + "
              f"{(with_cache - alone) * MILLION / n / 2**30:.2f} GiB (s3fs cache) in the job "
              f"runner; ~{s3_minutes:.1f} min on S3 assuming 100 ms per page "
              f"({cpu / n * MILLION / 60:.1f} min of it client CPU, measured)")


def synthetic_sessions(n: int, seed: int = 1) -> list[SessionObject]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        path = key_of(i)[len("archive/"):]
        parts = path.split("/")
        key = SessionKey(path, parts[1], parts[3], parts[4][:-len(".jsonl")])
        # Heavy-tailed like real sessions: lognormal, mean ~100 KB (exp(10.8 + 1.2²/2)).
        size = int(rng.lognormvariate(10.8, 1.2))
        out.append(SessionObject(key, f"{BUCKET}/archive/{path}", size))
    return out


#: The simulated tasks' speed (the replay's, a worker) and cost a task (the scheduler's
#: ~6 ms and the task's own tables, redaction and encoding, ~9 ms: docs/scaling.md).
SIM_MB_S, SIM_TASK_S = 7.0, 0.015
#: The spread of a task's time about its bytes' share (lognormal sigma): the same
#: batches took 5-18% apart (coefficient of variation) in Dask's task stream here.
SIM_SPREAD = 0.15


def simulated_run(batches: list[list[SessionObject]], workers: int,
                  seed: int = 0) -> tuple[float, float]:
    """The wall time of ``batches`` on ``workers``, each taking the next batch in plan
    order as it frees (as Dask's queue hands them out), each batch's time its bytes at
    :data:`SIM_MB_S` times a random spread, plus :data:`SIM_TASK_S`: returns the run's
    time against the ideal (all the work spread evenly) and the workers' idle seconds at
    the end, on average."""
    rng = random.Random(seed)
    free = [0.0] * workers
    heapq.heapify(free)
    work = 0.0
    for batch in batches:
        seconds = (sum(s.size for s in batch) / 1e6 / SIM_MB_S
                   * rng.lognormvariate(0, SIM_SPREAD) + SIM_TASK_S)
        work += seconds
        heapq.heappush(free, heapq.heappop(free) + seconds)
    end = max(free)
    return end / (work / workers), sum(end - f for f in free) / workers


def measure_planning(n: int = MILLION) -> None:
    sessions = synthetic_sessions(n)
    total = sum(s.size for s in sessions)
    print(f"planning: {n:,} sessions, {total / 1e9:.0f} GB (lognormal sizes, "
          f"mean {total / n / 1e3:.0f} KB); a simulated run of each plan at {SIM_MB_S:g} "
          f"MB/s a worker, task times spread by {SIM_SPREAD:.0%}, against the ideal")
    for workers in (8, 32, 128, 256):
        batches, seconds = timed(lambda w=workers: plan_batches(sessions, w))  # type: ignore[misc]
        sizes = sorted(sum(s.size for s in b) for b in batches)
        files = max(len(b) for b in batches)
        print(f"  {workers:>3} workers: {len(batches):>5} tasks in {seconds:.2f} s; "
              f"median task {sizes[len(sizes) // 2] / 2**20:.0f} MiB, "
              f"largest {sizes[-1] / 2**20:.0f} MiB, most files in one task {files}")
        # The same plan without its finer last wave (the even cut), simulated alike.
        even = cut_batches(sessions, batch_target(total, workers), MAX_BATCH_FILES)
        runs = [[simulated_run(plan, workers, seed) for seed in range(5)]
                for plan in (even, batches)]
        (even_x, even_idle), (plan_x, plan_idle) = (
            (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
            for rs in runs)
        print(f"       simulated: {plan_x:.3f} x the ideal, {plan_idle:.1f} s idle a "
              f"worker at the end; even batches to the end ({len(even)} tasks): "
              f"{even_x:.3f} x, {even_idle:.1f} s")


def _noop(i: int) -> int:
    return i


def measure_scheduler(tasks: int) -> None:
    from distributed import as_completed

    print(f"scheduler: {tasks:,} trivial tasks on a LocalCluster of 2 worker processes")
    with cluster(2) as (_, client):
        client.submit(_noop, -1, pure=False).result()  # warm up

        def run() -> None:
            futures = [client.submit(_noop, i, pure=False) for i in range(tasks)]
            for future in as_completed(futures, loop=client.loop):
                future.result()
                future.release()

        _, seconds = timed(run)
    print(f"  {seconds:.2f} s = {seconds / tasks * 1000:.2f} ms per task "
          f"({tasks / seconds:,.0f} tasks/s through one scheduler)")


def measure_commit(parts: int) -> None:
    datasets = ["integrity/sessions", "integrity/findings", "turns", "requests"]
    schema = pa.schema([("session_path", pa.string()), ("n", pa.int64())])
    print(f"commit: {parts:,} parts in each of {len(datasets)} datasets on moto, then a "
          "second run's as many in their place")
    with local_s3() as server:
        import boto3
        import s3fs

        # An s3fs instance cached by an earlier block still points at that server.
        s3fs.S3FileSystem.clear_instance_cache()
        boto3.client("s3", endpoint_url=server.endpoint).create_bucket(Bucket=BUCKET)
        out = resolve(f"s3://{BUCKET}/reports/scale")
        table = pa.table({"session_path": ["a"], "n": [1]}, schema=schema)
        n = parts * len(datasets)
        for run in ("first", "second"):
            staged = StagedRun(out, new_run_id(), dict.fromkeys(datasets, schema))

            def stage(staged: StagedRun = staged) -> None:
                for name in datasets:
                    for i in range(parts):
                        staged.write_part(name, i, table)

            _, staging = timed(stage)
            _, seconds = timed(lambda staged=staged: staged.commit({}))  # type: ignore[misc]
            deletes = ", the first run's parts deleted" if run == "second" else ""
            print(f"  {run} run: staging {n:,} parts {staging:.1f} s; commit {seconds:.1f} s "
                  f"= {seconds / n * 1000:.1f} ms per part (moved{deletes})")


def measure_tables(sessions: int) -> None:
    """What one session weighs in each table of a nightly partition: the job runner
    holds the previous night's tables while it carries unchanged rows forward."""
    import os
    import subprocess

    import s3fs

    from pipeline.io.commit import read_dataset, read_manifest
    from pipeline.synth.fleet import write_fleet

    print(f"tables: `vakpipe nightly` on {sessions} generated sessions (moto)")
    with local_s3() as server:
        s3fs.S3FileSystem.clear_instance_cache()
        import boto3

        boto3.client("s3", endpoint_url=server.endpoint).create_bucket(Bucket=BUCKET)
        archive = resolve(f"s3://{BUCKET}/archive")
        written = write_fleet(archive, sessions=sessions, seed=11)
        exe = Path(sys.executable).with_name("vakpipe")
        subprocess.run([str(exe), "nightly", archive.url, "--out", f"s3://{BUCKET}/reports/n",
                        "--date", "2026-12-03", "--workers", "2", "--no-progress"],
                       check=True, capture_output=True, env=os.environ)
        part = resolve(f"s3://{BUCKET}/reports/n/date=2026-12-03")
        manifest = read_manifest(part)
        assert manifest is not None
        fs = part.filesystem()
        arrow_total = parquet_total = 0
        for name in sorted(manifest["datasets"]):
            table = read_dataset(part, name)
            parquet = sum(fs.size(part.join(name, f)) for f in manifest["datasets"][name]["files"])
            arrow_total += table.nbytes
            parquet_total += parquet
            print(f"  {name:<20} {table.num_rows / sessions:6.1f} rows, "
                  f"{table.nbytes / sessions:8,.0f} B in Arrow, {parquet / sessions:7,.0f} B "
                  "of Parquet per session")
        print(f"  all tables: {arrow_total / sessions / 1e3:,.1f} KB in Arrow, "
              f"{parquet_total / sessions / 1e3:,.1f} KB of Parquet per session "
              f"(ledgers: {written.bytes / sessions / 1e3:,.0f} KB per session)")
        print(f"  at 10^6 sessions: {arrow_total * MILLION / sessions / 2**30:.1f} GiB in Arrow, "
              f"{parquet_total * MILLION / sessions / 2**30:.1f} GiB of Parquet per night")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--parts", type=int, default=400)
    ap.add_argument("--sessions", type=int, default=200,
                    help="generated sessions the table sizes are measured on")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["listing", "planning", "scheduler", "commit", "tables"])
    ap.add_argument("--quick", action="store_true",
                    help="tiny inputs, one run (for make test): the same lines, nothing judged")
    args = ap.parse_args()
    if args.quick:  # a test runs it (make test): every part, on inputs of seconds
        args.keys, args.tasks, args.parts, args.sessions = 300, 50, 10, 8
    planned = 20_000 if args.quick else MILLION
    if "listing" not in args.skip:
        measure_listing(args.keys)
    if "planning" not in args.skip:
        measure_planning(planned)
    if "scheduler" not in args.skip:
        measure_scheduler(args.tasks)
    if "commit" not in args.skip:
        measure_commit(args.parts)
    if "tables" not in args.skip:
        measure_tables(args.sessions)


if __name__ == "__main__":
    main()
