"""ccusage-style reading of costs (issue 23): ``vakpipe cost`` as a separate process on
the real Claude Code transcripts, its ``--json`` against ccusage 20.0.24's own reports of
the same files (``tests/data/ccusage``), ``--timezone``, ``--breakdown``, the line for an
empty window, and budgets (``--budgets``: the table, the JSON, the HTML, exit 4)."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import EXIT_BUDGET, EXIT_OK, EXIT_UNUSABLE
from tests.helpers.data_paths import CCUSAGE, REAL
from tests.helpers.storage import run_vakpipe

PROJECT = "-home-marco-projects-spotter"
#: ccusage's token fields -> the cost table's billed columns.
TOKENS = {"inputTokens": "billed_input_tokens", "outputTokens": "billed_output_tokens",
          "cacheCreationTokens": "billed_cache_write_tokens",
          "cacheReadTokens": "billed_cache_read_tokens"}


_vakpipe = functools.partial(run_vakpipe, timeout=600)


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``real/claude-code`` audited by the CLI, in its own process (no cluster)."""
    root = tmp_path_factory.mktemp("claude-archive")
    shutil.copytree(REAL / "claude-code", root / "claude-code")
    out = tmp_path_factory.mktemp("claude-out")
    done = _vakpipe("audit", str(root), "--out", str(out), "--workers", "0", "--no-progress")
    assert done.returncode == EXIT_OK, done.stderr
    return out


def _cost_json(out: Path, report: Path, *args: str,
               code: int = EXIT_OK) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    done = _vakpipe("cost", str(out), "--report-dir", str(report), "--json", *args)
    assert done.returncode == code, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # one document, nothing else on stdout
    doc = json.loads(lines[0])
    assert doc["schema"] == "vakpipe.cost/1" and doc["exit"] == code
    return doc, done


def _same_figures(ours: dict[str, Any], theirs: dict[str, Any], cost: str) -> None:
    for field, column in TOKENS.items():
        assert ours[column] == theirs[field], (field, ours, theirs)
    assert ours["billed_usd"] == pytest.approx(theirs[cost], abs=1e-9)


def test_by_month_and_project_equals_ccusage_monthly(audited: Path, tmp_path: Path) -> None:
    ccusage = json.loads((CCUSAGE / "monthly-utc.json").read_text("utf-8"))
    doc, done = _cost_json(audited, tmp_path / "r", "--by", "month,project", "--breakdown")
    assert doc["by"] == ["month", "project"] and doc["window"]["timezone"] == "UTC"
    assert [(r["month"], r["project"]) for r in doc["rows"]] == [
        (m["period"], PROJECT) for m in ccusage["monthly"]]
    for ours, theirs in zip(doc["rows"], ccusage["monthly"], strict=True):
        _same_figures(ours, theirs, "totalCost")
        assert ours["billed_tokens"] == theirs["totalTokens"]
        mine = {r["model"]: r for r in doc["breakdown"] if r["month"] == theirs["period"]}
        assert set(mine) == {b["modelName"] for b in theirs["modelBreakdowns"]}
        for b in theirs["modelBreakdowns"]:
            _same_figures(mine[b["modelName"]], b, "cost")
    assert doc["totals"]["billed_usd"] == pytest.approx(ccusage["totals"]["totalCost"],
                                                        abs=1e-9)
    # Without --json the same rows are the terminal table, on stdout.
    text = _vakpipe("cost", str(audited), "--report-dir", str(tmp_path / "t"), "--by",
                    "month,project", "--breakdown").stdout
    assert f"2026-02  {PROJECT}" in text and "$34.9326" in text
    assert "  └ claude-opus-4-6" in text and "$34.1231" in text
    # the human text went to stderr under --json, whole
    assert "cost by month, project:" in done.stderr


def test_days_in_a_time_zone_equal_ccusage_daily_in_it(audited: Path, tmp_path: Path) -> None:
    ccusage = json.loads((CCUSAGE / "daily-asia-tokyo.json").read_text("utf-8"))
    doc, _ = _cost_json(audited, tmp_path / "r", "--by", "day", "--timezone", "Asia/Tokyo")
    assert [r["day"] for r in doc["rows"]] == [d["period"] for d in ccusage["daily"]] == [
        "2026-02-11", "2026-02-12", "2026-02-13"]
    for ours, theirs in zip(doc["rows"], ccusage["daily"], strict=True):
        _same_figures(ours, theirs, "totalCost")
    # --since/--until are days on the same clock: 2026-02-13 in Tokyo is the UTC 02-12.
    late, _ = _cost_json(audited, tmp_path / "late", "--by", "day", "--timezone",
                         "Asia/Tokyo", "--since", "2026-02-13")
    assert [r["day"] for r in late["rows"]] == ["2026-02-13"]
    assert late["totals"]["billed_usd"] == pytest.approx(ccusage["daily"][2]["totalCost"])


def test_weeks_group_monday_to_sunday(audited: Path, tmp_path: Path) -> None:
    doc, _ = _cost_json(audited, tmp_path / "r", "--by", "week,model")
    assert {r["week"] for r in doc["rows"]} == {"2026-02-09"}  # Tuesday to Thursday
    assert len(doc["rows"]) == 3


def test_an_empty_window_says_so_with_the_datas_days(audited: Path, tmp_path: Path) -> None:
    doc, _done = _cost_json(audited, tmp_path / "r", "--since", "2026-03-01")
    line = "no usage between 2026-03-01 and …; the data covers 2026-02-10 to 2026-02-12"
    assert doc["rows"] == [] and doc["empty_window"] == line
    assert doc["data_days"] == {"first": "2026-02-10", "last": "2026-02-12"}
    plain = _vakpipe("cost", str(audited), "--report-dir", str(tmp_path / "p"), "--since",
                     "2026-03-01")
    assert plain.returncode == EXIT_OK
    assert line in plain.stdout and line in plain.stderr


def test_an_unknown_time_zone_is_exit_2_and_an_error_document(audited: Path,
                                                              tmp_path: Path) -> None:
    done = _vakpipe("cost", str(audited), "--report-dir", str(tmp_path / "r"), "--timezone",
                    "Mars/Olympus", "--json")
    assert done.returncode == EXIT_UNUSABLE
    doc = json.loads(done.stdout)
    assert doc["schema"] == "vakpipe.error/1" and doc["command"] == "cost"
    assert "Mars/Olympus" in doc["error"] and doc["exit"] == EXIT_UNUSABLE
    assert done.stderr.startswith("vakpipe: error: --timezone 'Mars/Olympus'")


BUDGETS = f"""
[[budget]]
name = "spotter monthly"
project = "{PROJECT}"
period = "month"
warn = 20
limit = 30

[[budget]]
agent = "claude-code"
period = "day"
warn = 15
limit = 100
"""


def test_a_limit_breach_exits_4_naming_it_in_the_table_json_and_html(
        audited: Path, tmp_path: Path) -> None:
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(BUDGETS, "utf-8")
    report = tmp_path / "r"
    doc, done = _cost_json(audited, report, "--by", "month,project", "--budgets",
                           str(budgets), "--as-of", "2026-02-12T12:00", code=EXIT_BUDGET)
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("vakpipe: budget limit exceeded: budget 'spotter monthly' 2026-02: spent "
                    "$34.93 (warn $20.00, limit $30.00); projected $85.05 by the period's "
                    "end")
    (breach,) = doc["budget_breaches"]
    assert breach["budget"] == "spotter monthly" and breach["level"] == "limit"
    assert breach["spend_usd"] == pytest.approx(34.93263875)
    assert breach["running"] and breach["projected_usd"] == pytest.approx(
        34.93263875 * 28 / 11.5)
    daily = {s["period"]: s for s in doc["budgets"] if s["period_kind"] == "day"}
    assert [daily[d]["level"] for d in sorted(daily)] == ["ok", "warn", "ok"]
    assert daily["2026-02-12"]["projected_level"] == "warn"  # $10.11 by noon: $20.23
    # The table marks the breached month's row; the budgets' table says which.
    plain = _vakpipe("cost", str(audited), "--report-dir", str(tmp_path / "p"), "--by",
                     "month,project", "--budgets", str(budgets), "--as-of",
                     "2026-02-12T12:00")
    assert plain.returncode == EXIT_BUDGET
    row = next(line for line in plain.stdout.splitlines() if "2026-02  " in line)
    assert row.rstrip().endswith("LIMIT")
    assert "OVER LIMIT" in plain.stdout and "ok, projected over warn" in plain.stdout
    page = (report / "report.html").read_text("utf-8")
    assert "BUDGET LIMIT EXCEEDED" in page and "id=budgets" in page
    assert "<tr class=limit>" in page


def test_under_every_limit_exits_0_and_a_bad_budget_file_is_exit_2(
        audited: Path, tmp_path: Path) -> None:
    loose = tmp_path / "loose.toml"
    loose.write_text('[[budget]]\nperiod = "month"\nlimit = 1000\n', "utf-8")
    doc, _ = _cost_json(audited, tmp_path / "r", "--budgets", str(loose))
    assert doc["budget_breaches"] == [] and doc["budgets"][0]["level"] == "ok"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[budget]]\nperiod = "year"\nlimit = 1\n', "utf-8")
    done = _vakpipe("cost", str(audited), "--report-dir", str(tmp_path / "b"), "--budgets",
                    str(bad))
    assert done.returncode == EXIT_UNUSABLE
    assert "period must be one of month, day" in done.stderr and "Traceback" not in done.stderr
    missing = _vakpipe("cost", str(audited), "--report-dir", str(tmp_path / "m"),
                       "--budgets", str(tmp_path / "nope.toml"))
    assert missing.returncode == EXIT_UNUSABLE
    assert f"cannot read --budgets {tmp_path / 'nope.toml'}: FileNotFoundError" in missing.stderr


def test_the_dashboard_bills_what_cost_bills(audited: Path, tmp_path: Path) -> None:
    """The dashboard prices a run as ``vakpipe cost`` does: a request that several files
    hold (a subagent's, mirrored in its parent) once."""
    cost, _ = _cost_json(audited, tmp_path / "report")
    assert cost["copies"] > 0  # the transcripts hold such copies: the case is exercised
    done = _vakpipe("dashboard", str(audited), "--html", str(tmp_path / "page.html"), "--json")
    assert done.returncode == EXIT_OK, done.stderr
    page = json.loads(done.stdout)
    assert page["billed_usd"] == pytest.approx(cost["totals"]["billed_usd"], abs=1e-9)
    assert page["wasted_usd"] == pytest.approx(cost["totals"]["wasted_usd"], abs=1e-9)
