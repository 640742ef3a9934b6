"""Cost report on a million requests, against DuckDB reading the same data as raw JSONL.

Builds (once, cached under the bench folder) a synthetic ``usage`` table of ``--rows``
receipt attempts straight as Arrow (no ledgers: the audit is not what is measured), 10,000
sessions over 30 days, six models (one with a long-context tier, one the price table does
not know), ~8% of requests on abandoned branches and ~5% failed attempts; and the same
attempts as raw JSONL receipts. Then prints:

* ``price_usage`` by day and model on the in-memory table (the pricing itself);
* the whole ``vakpipe cost`` job on that table committed as a run (read Parquet, price
  totals, grouped, per day, per day and model (each grouping once), write Parquet, CSV
  and the HTML page);
* DuckDB computing the same billed dollars per day and model straight from the JSONL
  (``read_json`` + unnest + a rates table), when duckdb is installed (``.[bench]``);
* whether both agree (tokens exactly, dollars to 1e-9 relative).

Run: ``.venv/bin/python bench/cost_report.py [--rows 1000000] [--quick]``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import BENCH_DIR, timed
from jobs.cost_report import cost_job
from pipeline.costs.pricing import load_prices
from pipeline.costs.report import price_usage
from pipeline.io.commit import StagedRun
from pipeline.io.storage import resolve
from pipeline.tables.schemas import DATASETS, USAGE_SCHEMA

MODELS = [("anthropic", "claude-sonnet-4-5"), ("anthropic", "claude-opus-4-1"),
          ("anthropic", "claude-haiku-4-5"), ("openai", "gpt-5"), ("openai", "gpt-5-mini"),
          ("acme", "mystery-1")]
SESSIONS, DAYS = 10_000, 30
START = date(2026, 10, 1)


def synthetic(n: int, seed: int = 2026) -> tuple[pa.Table, list[bytes]]:
    """``n`` attempt rows of the ``usage`` schema, and the same as JSONL receipt lines."""
    rng = random.Random(seed)
    cols: dict[str, list[Any]] = {name: [] for name in USAGE_SCHEMA.names}
    lines: list[bytes] = []
    for i in range(n):
        s = rng.randrange(SESSIONS)
        provider, model = MODELS[min(int(rng.expovariate(0.9)), len(MODELS) - 1)]
        day = START + timedelta(days=rng.randrange(DAYS))
        ts = f"{day.isoformat()}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00Z"
        big = rng.random() < 0.02  # some prompts past a 200K tier
        inp = rng.randrange(50, 5_000)
        read = rng.randrange(150_000, 400_000) if big else rng.randrange(0, 60_000)
        write = rng.randrange(0, 8_000)
        out = rng.randrange(10, 3_000)
        failed = rng.random() < 0.05
        abandoned = not failed and rng.random() < 0.08
        row = {"session_path": f"agents/vak/sessions/{s % 97:016x}/s{s:06d}.jsonl",
               "session_id": f"s{s:06d}", "agent": "vak", "entry_id": f"r{i:08d}",
               "request_id": f"m{i:08d}", "kind": "attempt", "purpose": "execute",
               "ordinal": 0, "settlement": "failed" if failed else "ok",
               "winning": not failed, "ts": ts, "day": day, "provider": provider,
               "model": model, "on_active_chain": not abandoned, "input_tokens": inp,
               "output_tokens": out, "cache_read_tokens": read, "cache_write_tokens": write,
               "billed": True, "effective": not failed and not abandoned,
               "waste": "retry" if failed else "abandoned" if abandoned else None,
               # vak receipts say neither a write's TTL nor a speed (Claude Code's columns)
               "cache_write_1h_tokens": None, "speed": None, "source": "vak",
               "parent_session_path": None, "subagent": None}
        for k, v in row.items():
            cols[k].append(v)
        attempt = {"ordinal": 0, "reason": "initial", "domain": "provider",
                   "settlement": row["settlement"], "latency_ms": 900,
                   "usage": {"input_tokens": inp, "output_tokens": out,
                             "cache_read_input_tokens": read,
                             "cache_creation_input_tokens": write}}
        lines.append(orjson.dumps({
            "id": row["entry_id"], "parent_id": row["request_id"], "ts": ts, "kind": "receipt",
            "purpose": "execute", "provider": provider, "model": model,
            **({} if failed else {"winning_attempt": 0}), "attempts": [attempt],
            "prefix_digest": ""}) + b"\n")
    # A column the schema grows without this function knowing would otherwise fail here
    # far from its cause (how this bench rotted once): name it.
    missing = [name for name, values in cols.items() if len(values) != n]
    if missing:
        raise SystemExit(f"synthetic(): no values for usage columns {missing}")
    cols["ts"] = pa.array(cols["ts"], pa.string()).cast(USAGE_SCHEMA.field("ts").type)
    return pa.table(cols, schema=USAGE_SCHEMA), lines


def corpus(n: int) -> tuple[Path, Path]:
    """The cached Parquet usage table and JSONL receipts of ``n`` rows."""
    folder = BENCH_DIR / f"cost-{n}"
    table_path, jsonl = folder / "usage.parquet", folder / "receipts.jsonl"
    if not (folder / ".complete").exists():
        folder.mkdir(parents=True, exist_ok=True)
        table, lines = synthetic(n)
        pq.write_table(table, table_path)
        with open(jsonl, "wb") as f:
            f.writelines(lines)
        (folder / ".complete").write_text("ok")
    return table_path, jsonl


def duckdb_billed(jsonl: Path) -> dict[tuple[date, str], tuple[float, int]] | None:
    """Billed USD and tokens per (day, model) straight from the JSONL, or None."""
    try:
        import duckdb
    except ImportError:
        return None
    prices = load_prices()
    con = duckdb.connect()
    con.execute("CREATE TABLE rates (provider VARCHAR, model VARCHAR, above BIGINT, "
                "bi DOUBLE, bo DOUBLE, br DOUBLE, bw DOUBLE, ti DOUBLE, t_o DOUBLE, "
                "tr DOUBLE, tw DOUBLE)")
    for provider, model in MODELS:
        rule = prices.lookup(provider, model)
        if rule is None:
            continue
        tier = rule.tier.rates if rule.tier else rule.base
        con.execute("INSERT INTO rates VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
            provider, model, rule.tier.above if rule.tier else None,
            *(float(getattr(rule.base, k)) for k in ("input", "output", "cache_read",
                                                     "cache_write")),
            *(float(getattr(tier, k)) for k in ("input", "output", "cache_read",
                                                "cache_write"))])
    rows = con.execute(f"""
        WITH receipts AS (
            SELECT CAST(CAST(ts AS TIMESTAMPTZ) AT TIME ZONE 'UTC' AS DATE) AS day, provider,
                   model, unnest(attempts) AS att
            FROM read_json('{jsonl}', format = 'newline_delimited')
            WHERE kind = 'receipt'),
        u AS (
            SELECT day, provider, model, att.usage.input_tokens AS i,
                   att.usage.output_tokens AS o,
                   coalesce(att.usage.cache_read_input_tokens, 0) AS r,
                   coalesce(att.usage.cache_creation_input_tokens, 0) AS w
            FROM receipts WHERE att.usage IS NOT NULL)
        SELECT u.day, u.model,
               coalesce(sum(CASE WHEN p.above IS NOT NULL AND i + r + w > p.above
                            THEN i * p.ti + o * p.t_o + r * p.tr + w * p.tw
                            ELSE i * p.bi + o * p.bo + r * p.br + w * p.bw END) / 1e6, 0),
               sum(i + o + r + w)
        FROM u LEFT JOIN rates p ON u.provider = p.provider AND u.model = p.model
        GROUP BY ALL ORDER BY ALL""").fetchall()
    return {(d, m): (usd, int(tokens)) for d, m, usd, tokens in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true",
                    help="tiny inputs, one run (for make test): the same lines, nothing judged")
    args = ap.parse_args()
    if args.quick:  # a test runs it (make test): 2,000 rows
        args.rows = 2_000
    (table_path, jsonl), made_s = timed(lambda: corpus(args.rows))
    table = pq.read_table(table_path)
    print(f"corpus: {args.rows:,} usage rows ({table_path.stat().st_size / 1e6:,.0f} MB "
          f"Parquet), the same as {jsonl.stat().st_size / 1e6:,.0f} MB of JSONL receipts "
          f"(ready in {made_s:.1f} s)")
    prices = load_prices()

    report, price_s = timed(lambda: price_usage(table, prices, ("day", "model")))
    print(f"price_usage by day,model (in memory):      {price_s:6.2f} s")

    out = Path(tempfile.mkdtemp(prefix="vakpipe-bench-cost-"))
    try:
        run = StagedRun(resolve(str(out)), "bench", DATASETS)
        run.write_part("usage", 0, table)
        run.commit({})
        job, job_s = timed(lambda: cost_job(resolve(str(out)), by=("day", "model")))
        print(f"vakpipe cost job (read, price, write):     {job_s:6.2f} s  "
              f"(billed ${float(job.totals.totals['billed'].total):,.2f}, "
              f"{len(job.grouped.unknown)} unknown model)")
    finally:
        shutil.rmtree(out, ignore_errors=True)

    duck, duck_s = timed(lambda: duckdb_billed(jsonl))
    if duck is None:
        print("duckdb: not installed (pip install -e '.[bench]'); no comparison")
        return
    print(f"duckdb, billed per day,model from JSONL:   {duck_s:6.2f} s  "
          f"= {duck_s / job_s:.1f} x the cost job")
    mine = {(r["day"], r["model"]): (r["billed_usd"], r["billed_tokens"])
            for r in report.table.to_pylist()}
    worst = max(abs(mine[k][0] - duck[k][0]) / max(abs(duck[k][0]), 1e-12) for k in duck)
    same_keys = mine.keys() == duck.keys()
    same_tokens = all(mine[k][1] == duck[k][1] for k in duck)
    print(f"results agree: groups {same_keys}, tokens {same_tokens}, "
          f"dollars max relative difference {worst:.1e}")
    if not (same_keys and same_tokens and worst <= 1e-9):
        sys.exit("vakpipe's cost job and DuckDB disagree")


if __name__ == "__main__":
    main()
