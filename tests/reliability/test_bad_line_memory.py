"""Row 4 (and the *Bounded memory* promise): bad lines cost O(1) each.

A run of consecutive lines that are not valid entries (blank lines, garbage) is reported
line by line up to ``MAX_LISTED_BAD_LINES``, then as one finding for the rest of the run
(its first line, how many, where it ends). Before, every bad line was a finding kept by
the worker and collected by the client: 2 MB of blank lines between two entries took
1.4 GiB in a worker and 1.3 GiB in the client, a 5 MB file of them 3.3 and 3.0 GiB.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from pipeline.audit.session import audit_session
from pipeline.io.commit import read_dataset
from pipeline.io.storage import guarded_lines, resolve
from pipeline.ledger.reader import BLANK_LINE, MAX_DETAIL_CHARS, MAX_LISTED_BAD_LINES
from pipeline.ledger.types import Code
from tests.helpers.ledgers import LedgerBuilder, read_bytes, sample_session, session_key

BENCH = Path(__file__).resolve().parents[2] / "bench" / "big_session.py"
MiB = 2**20


def blank_lines_between_two_entries(n: int) -> bytes:
    """A header, ``n`` blank lines, then an entry chained across them (lines 2..n+1)."""
    b = LedgerBuilder()
    b.header()
    head = b.to_bytes()
    b.lines.clear()
    b.user("hi")
    return head + b"\n" * n + b.to_bytes()


def test_a_run_of_blank_lines_is_the_listed_lines_and_one_finding_for_the_rest() -> None:
    n = 100_000
    entries, findings = read_bytes(blank_lines_between_two_entries(n))
    assert len(entries) == 2 and entries[1].line == n + 2
    assert [(f.line, f.code) for f in findings] == [
        (line, Code.TORN_WRITE_RECOVERED) for line in range(2, MAX_LISTED_BAD_LINES + 3)]
    assert all(f.detail == BLANK_LINE for f in findings[:-1])
    rest = findings[-1].detail
    first = MAX_LISTED_BAD_LINES + 2
    assert rest.startswith(f"{n - MAX_LISTED_BAD_LINES:,} more consecutive lines ({first}-{n + 1})")
    assert len(rest) <= MAX_DETAIL_CHARS


def test_a_file_of_blank_lines_is_damage_then_one_torn_tail() -> None:
    n = 50_000
    result = audit_session(session_key(), guarded_lines(io.BytesIO(b"\n" * n)))
    bad = [(f.line, f.code) for f in result.findings if f.code != Code.MISSING_HEADER]
    assert bad == [*((line, Code.DAMAGED_ENTRY) for line in range(1, MAX_LISTED_BAD_LINES + 2)),
                   (n, Code.TORN_TAIL)]
    assert f"({MAX_LISTED_BAD_LINES + 1}-{n - 1})" in result.findings[-2].detail
    assert result.row["lines"] == n and result.row["bytes"] == n and result.row["entries"] == 0


@pytest.mark.parametrize("extra", [0, 1, 2, 3])
def test_a_run_just_past_the_listed_lines_names_each_line_once(extra: int) -> None:
    """Every line of a run is covered exactly once, whatever its length: the listed
    ones, then the rest (a rest of one line is reported as that line)."""
    b = sample_session(turns=1)
    first = len(b.lines) + 1
    for i in range(MAX_LISTED_BAD_LINES + extra):
        b.raw(b"garbage %d" % i if i % 2 else b"")
    b.user("and then?")
    _, findings = read_bytes(b.to_bytes())
    lines = [f.line for f in findings]
    assert lines == list(range(first, first + min(MAX_LISTED_BAD_LINES + 1,
                                                  MAX_LISTED_BAD_LINES + extra)))
    assert {f.code for f in findings} == {Code.TORN_WRITE_RECOVERED}
    if extra > 1:
        # the rest's first line (blank) and its last, when its reason differs (garbage)
        rest = findings[-1].detail
        assert "blank line" in rest
        assert ("not valid JSON" in rest) == ((MAX_LISTED_BAD_LINES + extra - 1) % 2 == 1)


def test_blank_lines_cost_no_memory_per_line() -> None:
    """The audit's traced memory for 300,000 blank lines stays that of a few lines."""
    data = blank_lines_between_two_entries(300_000)
    tracemalloc.start()
    try:
        result = audit_session(session_key(), guarded_lines(io.BytesIO(data)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(result.findings) == MAX_LISTED_BAD_LINES + 1
    assert peak < 2 * MiB  # was ~65 MB: ~220 bytes per line (a finding and its reason)


def archive_with_blank_lines(root: Path, n: int) -> Path:
    path = root / session_key().path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(blank_lines_between_two_entries(n))
    return root


@pytest.mark.slow
def test_a_worker_auditing_2_mb_of_blank_lines_stays_small(tmp_path: Path) -> None:
    """One audit task in a fresh process (``bench/big_session.py --measure``: read,
    audit, tables, redaction), as a worker runs it."""
    root = archive_with_blank_lines(tmp_path, 2_000_000)
    done = subprocess.run([sys.executable, str(BENCH), "--measure", str(root)],
                          capture_output=True, text=True, check=True, timeout=600)
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["lines"] == 2_000_002 and figures["entries"] == 2
    assert len(figures["findings"]) == MAX_LISTED_BAD_LINES + 1
    assert figures["rss_peak"] < 300 * MiB  # was 1.5 GiB
    assert figures["rss_peak"] - figures["rss_before"] < 32 * MiB


# The CLI in a process of its own, reporting its own peak memory (its workers are the
# session cluster's, so the figure is the client's alone).
CLIENT = """
import sys
from bench.rss import peak_rss_bytes
from pipeline.cli import main
try:
    code = main(sys.argv[1:])
finally:
    print("peak", peak_rss_bytes(), file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.slow
def test_the_client_of_a_run_over_2_mb_of_blank_lines_stays_small(
        tmp_path: Path, dask_scheduler: str) -> None:
    root = archive_with_blank_lines(tmp_path / "archive", 2_000_000)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, "audit", str(root), "--out", str(out), "--replay",
         "--scheduler", dask_scheduler, "--no-progress"],
        capture_output=True, text=True, timeout=600, cwd=BENCH.parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(done.stderr.rsplit("peak ", 1)[1].split()[0])
    assert peak < 300 * MiB, peak  # was 1.3 GiB
    findings = read_dataset(resolve(str(out)), "integrity/findings").to_pylist()
    assert [f["line"] for f in findings] == list(range(2, MAX_LISTED_BAD_LINES + 3))
    assert {f["code"] for f in findings} == {"torn_write_recovered"}
    assert read_dataset(resolve(str(out)), "requests").num_rows == 0  # no assistant turn
