"""OpenTelemetry export of a synthetic ``usage`` table, against the cost report's pricing.

Builds ``--rows`` receipt attempts as Arrow (six models, one unknown, ~8% abandoned,
~5% failed, a third of the cache writes one-hour ones) and times, best of ``--repeat``,
interleaved:

* baseline: ``price_usage`` by day and model (the cost report's vectorised pricing);
* ``otel_table``: every billed row priced alone, as the GenAI span rows;
* ``otlp_json``: those rows as one OTLP JSON document (in memory);
* ``send_otlp``: the spans sent over OTLP/HTTP to a receiver on 127.0.0.1 that accepts
  and drops each request (the SDK's exporter, 512 spans per request).

Prints each as a ratio to the baseline and as spans per second. ``--quick``: 2,000 rows,
one round (tests/project/test_bench_otel_quick.py runs it).

Run: ``.venv/bin/python bench/otel_export.py [--rows 100000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import best_of
from pipeline.costs.otel import otel_table
from pipeline.costs.pricing import load_prices
from pipeline.costs.report import price_usage
from pipeline.io.otel import otlp_json, send_otlp
from pipeline.tables.schemas import USAGE_SCHEMA

MODELS = [("anthropic", "claude-sonnet-4-5"), ("anthropic", "claude-opus-4-1"),
          ("anthropic", "claude-haiku-4-5"), ("openai", "gpt-5"), ("openai", "gpt-5-mini"),
          ("acme", "mystery-1")]
DAY_NS = 86_400 * 10**9
START_NS = 1_790_000_000 * 10**9


def synthetic(n: int, seed: int = 2026) -> pa.Table:
    """``n`` attempt rows of the ``usage`` schema: 10,000 sessions over 30 days, six models
    (one unknown), ~8% on abandoned branches, ~5% failed attempts."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        s = rng.randrange(10_000)
        provider, model = MODELS[min(int(rng.expovariate(0.9)), len(MODELS) - 1)]
        failed = rng.random() < 0.05
        abandoned = not failed and rng.random() < 0.08
        ts = START_NS + rng.randrange(30) * DAY_NS + rng.randrange(DAY_NS)
        write = rng.randrange(0, 8_000)
        rows.append({
            "session_path": f"agents/vak/sessions/{s % 97:016x}/s{s:06d}.jsonl",
            "session_id": f"s{s:06d}", "agent": "vak", "entry_id": f"r{i:08d}",
            "request_id": f"m{i:08d}", "kind": "attempt", "ordinal": 0, "ts": ts,
            "day": ts // DAY_NS, "provider": provider, "model": model,
            "on_active_chain": not abandoned, "input_tokens": rng.randrange(50, 5_000),
            "output_tokens": rng.randrange(10, 3_000),
            "cache_read_tokens": rng.randrange(0, 60_000), "cache_write_tokens": write,
            "cache_write_1h_tokens": write // 3, "billed": True,
            "effective": not failed and not abandoned,
            "waste": "retry" if failed else "abandoned" if abandoned else None})
    return pa.Table.from_pylist(rows, schema=USAGE_SCHEMA)


class _Drop(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows, repeat = (2_000, 1) if args.quick else (args.rows, args.repeat)
    usage = synthetic(rows)
    prices = load_prices()
    spans = otel_table(usage, prices)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Drop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        # Warm-up on a few rows: the SDK's and protobuf's imports are not what is measured.
        few = spans.slice(0, 10)
        otlp_json(few)
        send_otlp(few, url)
        price_usage(usage.slice(0, 10), prices, ["day", "model"])
        base, table, encode, send = best_of(
            repeat,
            lambda: price_usage(usage, prices, ["day", "model"]),
            lambda: otel_table(usage, prices),
            lambda: otlp_json(spans),
            lambda: send_otlp(spans, url))
    finally:
        server.shutdown()
        server.server_close()
    n = spans.num_rows
    print(f"otel export of {rows:,} usage rows ({n:,} billed spans), best of {repeat}:")
    print(f"  baseline price_usage by day,model  {base.wall:8.3f} s   1.0x")
    for label, t in (("otel_table (rows priced alone)", table),
                     ("otlp_json (OTLP JSON, in memory)", encode),
                     ("send_otlp (OTLP/HTTP, 127.0.0.1)", send)):
        print(f"  {label:<34} {t.wall:8.3f} s  {t.wall / base.wall:5.1f}x   "
              f"{n / t.wall:>10,.0f} spans/s")


if __name__ == "__main__":
    main()
