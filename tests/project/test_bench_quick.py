"""Every ``bench/`` script runs in its ``--quick`` mode (tiny inputs) and prints the lines
that carry its figures and ratios: a benchmark nothing runs rots (``bench/cost_report.py``
once crashed for months on a column the usage schema grew). Times and ratios are printed,
never asserted: they belong to the machine, not to the code.

Each script runs in a fresh process with ``VAKPIPE_BENCH_DIR`` in the test's temporary
folder, so no corpus is cached or left behind; ccusage is never installed (no network):
``bench/ccusage_compare.py`` uses one already installed, or says in one line it skipped it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
#: Modules of bench/ that are helpers, not benchmarks.
HELPERS = {"__init__", "common", "rss"}

#: script -> patterns that must each match a line of its --quick output.
EXPECTED: dict[str, list[str]] = {
    "small_archive": [r"vakpipe audit \+ cost: best", r"vakpipe cost ROOT --out: +best"],
    "replay_throughput": [
        r"^fleet: [\d.]+ MB",
        r"tokenizer floor, \w+Tokenizer .* = [\d.]+ x tiktoken's",
        r"full replay, 1 worker, tiktoken \(before\) \(audit --replay, all tables\):.* x "
        r"tiktoken floor",
        r"full replay, \w+Tokenizer against tiktoken: [\d.]+ x the ledger MB/s .* x by CPU",
        r"^full replay against HEAD: (median [\d.]+ x the ledger MB/s|skipped)",
        r"per doubling of iterations: replay [\d.]+ x \(target",
        r"per doubling of tokens +: replay [\d.]+ x",
        r"long linearity: .* per doubling of turns [\d.]+ x",
    ],
    "ccusage_compare": [
        r"^vakpipe − recount per file",
        r"^copies: 2 id-rewritten copies",
        r"ratio (vakpipe audit \+ cost|recount) / .*: wall [\d.]+ x, CPU [\d.]+ x; "
        r"wall by round .*, median [\d.]+",
        r"ratio vakpipe cost ROOT --out / .*: wall [\d.]+ x, CPU [\d.]+ x; "
        r"wall by round .*, median [\d.]+",
        r"totals on the copies, recount: .* = N x one copy",
        r"totals on the copies, vakpipe: .* = N x one copy",
        r"totals on the copies, vakpipe one step: .* = N x one copy",
        r"^ccusage: no binary found .*: skipped$|"
        r"totals on the copies, ccusage .* = N x one copy",
    ],
    "cost_report": [
        r"^corpus: 2,000 usage rows",
        r"vakpipe cost job \(read, price, write\): +[\d.]+ s",
        r"= [\d.]+ x the cost job|duckdb: not installed",
    ],
    "big_session": [r"MB session \([\d,]+ entries\): [\d.]+ MB/s, status ok; audit peak RSS"],
    "nightly_incremental": [r"partitions: second / first night bytes written",
                            r"delta: second / first night bytes written",
                            r"runner peak RSS slope", r"extrapolated to 1,000,000"],
    "nightly_first_night": [r"^fleet: .* MB in 20 sessions",
                            r"^first night against HEAD: (median [\d.]+ x over 1 pairs|skipped)"],
    "object_store_latency": [
        r"^fleet: .* MB in 12 sessions on moto behind 20 ms round trips",
        *(rf"^({way} on 20 ms round trips against HEAD: median [\d.]+ x over 1 rounds|"
          r"against HEAD: skipped)"
          for way in ("audit in process", "second night", "cost of that output",
                      "dashboard of its nights"))],
    "otel_export": [r"baseline price_usage by day,model", r"spans/s"],
    "segment_audit": [r"plain: 6 ledgers", r"sealed: 6 ledgers", r"x floor"],
    "segment_nightly": [r"keyless: .* night 2 / night 1 bytes read = [\d.]+",
                        r"with keys: .* night 2 / night 1 bytes read = [\d.]+",
                        r"keyless night 1: .* x night 1"],
    "audit_throughput": [r"^raw floor \(read\+sha256\+orjson",
                         r"vakpipe audit, 1 worker: .* x floor",
                         r"vakpipe audit, 2 workers: .* x 1 worker",
                         r"ceiling for that ratio: the floor in 2 processes = [\d.]+ x 1 process",
                         r"round by round: 1 worker x floor .*, median [\d.]+; "
                         r"2 workers x 1 worker .*, median [\d.]+",
                         r"whole audit of each session: .* x floor's time",
                         r"MB session, 1 worker: .* peak worker RSS"],
    "compaction_overhead": [r"sessions need packets",
                            r"^run_audit, 1 worker, all tables: .* = [\d.]+ x \(target <= 1\.20",
                            r"MB session, .* peak worker"],
    "listing_scale": [r"keys", r"at 10\^6 sessions",
                      r"simulated: [\d.]+ x the ideal, .* even batches to the end .*: [\d.]+ x",
                      r"second run: .* ms per part"],
}


def scripts() -> list[str]:
    return sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in HELPERS)


def test_every_bench_script_has_a_quick_run_here() -> None:
    assert sorted(EXPECTED) == scripts()


def run_quick(name: str, tmp_path: Path) -> str:
    env = {**os.environ, "VAKPIPE_BENCH_DIR": str(tmp_path / "bench"),
           "PYTHONPATH": str(REPO)}
    env.pop("VAKPIPE_TOKENIZER", None)
    done = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--quick"],
                          capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
                          env=env)
    assert done.returncode == 0, f"{name} --quick exited {done.returncode}:\n" \
        f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_run_prints_its_figures(name: str, tmp_path: Path) -> None:
    out = run_quick(name, tmp_path)
    missing = [p for p in EXPECTED[name] if not re.search(p, out, re.MULTILINE)]
    assert missing == [], f"{name} --quick printed:\n{out}"
