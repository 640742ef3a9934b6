"""Periods, projects, budgets and the terminal table of ``vakpipe cost`` (issue 23):
:mod:`pipeline.costs.periods`, :mod:`pipeline.costs.budgets`,
:mod:`pipeline.costs.terminal`. In process, on small Arrow tables."""

from __future__ import annotations

import contextlib
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.costs.budgets import (
    Budget,
    BudgetFileError,
    Level,
    evaluate,
    load_budgets,
    period_bounds,
    row_level,
    window_periods,
)
from pipeline.costs.periods import check_timezone, with_periods, with_projects
from pipeline.costs.pricing import load_prices
from pipeline.costs.report import parse_by, price_usage
from pipeline.costs.terminal import BRANCH, budget_table, cost_table
from pipeline.errors import UsageError
from pipeline.tables.schemas import USAGE_SCHEMA


def _usage(rows: list[dict[str, Any]]) -> pa.Table:
    full = []
    for i, r in enumerate(rows):
        ts = r.get("ts")
        full.append({"session_path": r.get("session_path", "agents/a/sessions/h/s.jsonl"),
                     "session_id": "s", "agent": r.get("agent", "a"), "entry_id": f"e{i}",
                     "request_id": f"e{i}", "kind": "message", "ts": ts,
                     "day": ts.date() if ts is not None else None,
                     "provider": "anthropic", "model": r.get("model", "claude-sonnet-4-0"),
                     "input_tokens": r.get("input", 1_000_000), "output_tokens": 0,
                     "cache_read_tokens": 0, "cache_write_tokens": 0, "billed": True,
                     "effective": True, "waste": None, "source": r.get("source", "vak")})
    return pa.Table.from_pylist(full, schema=USAGE_SCHEMA)


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_days_follow_the_time_zone_and_weeks_start_on_monday() -> None:
    usage = _usage([{"ts": _ts("2026-02-28T23:30:00")}, {"ts": _ts("2026-03-01T05:00:00")},
                    {"ts": None}])
    utc = with_periods(usage)
    assert utc["day"].to_pylist() == [date(2026, 2, 28), date(2026, 3, 1), None]
    assert utc["month"].to_pylist() == ["2026-02", "2026-03", None]
    assert utc["week"].to_pylist() == [date(2026, 2, 23), date(2026, 2, 23), None]
    berlin = with_periods(usage, "Europe/Berlin")  # 00:30 and 06:00 on March 1st
    assert berlin["day"].to_pylist() == [date(2026, 3, 1), date(2026, 3, 1), None]
    assert berlin["month"].to_pylist() == ["2026-03", "2026-03", None]
    la = with_periods(usage, "America/Los_Angeles")  # 15:30 and 21:00 on Feb 28th
    assert la["day"].to_pylist() == [date(2026, 2, 28), date(2026, 2, 28), None]


@pytest.mark.parametrize("name", [
    "Mars/Olympus",
    # zoneinfo takes these, Arrow (which computes the days) does not: were tracebacks
    "posixrules", "right/UTC", "posix/Europe/Berlin", "Factory",
])
def test_an_unknown_zone_is_a_usage_error(name: str) -> None:
    assert check_timezone("Asia/Tokyo") == "Asia/Tokyo"
    assert check_timezone(None) is None
    with pytest.raises(UsageError, match="not a time zone"):
        check_timezone(name)


def test_projects_come_from_the_sessions_table_and_codex_has_none() -> None:
    usage = _usage([
        {"ts": _ts("2026-02-01T00:00:00"), "session_path": "projects/-home-me-p/a.jsonl",
         "source": "claude-code"},
        {"ts": _ts("2026-02-01T00:00:00"),
         "session_path": "projects/-home-me-p/a/subagents/agent-x.jsonl",
         "source": "claude-code"},
        {"ts": _ts("2026-02-01T00:00:00"), "session_path": "sessions/2026/02/01/rollout-x.jsonl",
         "source": "codex"},
        {"ts": _ts("2026-02-01T00:00:00"), "session_path": "agents/vak/sessions/ab12/s.jsonl"},
        {"ts": _ts("2026-02-01T00:00:00"), "session_path": "not/in/the/table.jsonl"},
    ])
    sessions = pa.table({
        "session_path": ["projects/-home-me-p/a.jsonl",
                         "projects/-home-me-p/a/subagents/agent-x.jsonl",
                         "sessions/2026/02/01/rollout-x.jsonl", "agents/vak/sessions/ab12/s.jsonl"],
        "cwd_hash": ["-home-me-p", "-home-me-p", "2026-02-01", "ab12"],
        "source": ["claude-code", "claude-code", "codex", "vak"]})
    got = with_projects(usage, sessions)["project"].to_pylist()
    assert got == ["-home-me-p", "-home-me-p", None, "ab12", None]
    assert with_projects(usage, None)["project"].to_pylist() == [None] * 5


def test_grouping_by_month_and_project_sums_what_by_day_does() -> None:
    usage = with_projects(with_periods(_usage([
        {"ts": _ts("2026-02-10T10:00:00")}, {"ts": _ts("2026-02-11T10:00:00")},
        {"ts": _ts("2026-03-02T10:00:00")}])), None)
    prices = load_prices()
    by_month = price_usage(usage, prices, parse_by("month,project")).table.to_pylist()
    by_day = price_usage(usage, prices, ("day",)).table.to_pylist()
    assert [(r["month"], r["project"], r["records"]) for r in by_month] == [
        ("2026-02", None, 2), ("2026-03", None, 1)]
    assert sum(r["billed_usd"] for r in by_month) == pytest.approx(
        sum(r["billed_usd"] for r in by_day))
    weeks = price_usage(usage, prices, ("week",)).table
    assert weeks.schema.field("week").type == pa.date32()


def test_parse_by_accepts_the_new_names_and_refuses_others() -> None:
    assert parse_by("month, project") == ("month", "project")
    assert parse_by("week") == ("week",)
    with pytest.raises(UsageError):
        parse_by("year")


BUDGETS = b"""
[[budget]]
name = "p monthly"
project = "p"
period = "month"
warn = 10
limit = 20

[[budget]]
agent = "claude-code"
period = "day"
limit = 5.5
"""


def test_a_budget_file_parses_and_names_unnamed_budgets() -> None:
    one, two = load_budgets(BUDGETS, "b.toml")
    assert one == Budget("p monthly", "month", 10.0, 20.0, "p", None)
    assert two == Budget("agent=claude-code per day", "day", None, 5.5, None, "claude-code")
    assert two.scope == {"agent": "claude-code"}


@pytest.mark.parametrize(("text", "error"), [
    (b"", "no \\[\\[budget\\]\\]"),
    (b"[[budget]]\nperiod = 'year'\nlimit = 1\n", "period must be one of"),
    (b"[[budget]]\nperiod = 'day'\n", "give warn, limit or both"),
    (b"[[budget]]\nperiod = 'day'\nwarn = 3\nlimit = 2\n", "warn \\$3.00 is above limit"),
    (b"[[budget]]\nperiod = 'day'\nlimit = -1\n", "non-negative number"),
    (b"[[budget]]\nperiod = 'day'\nlimit = true\n", "non-negative number"),
    # nan was a limit never reached, silently; inf a limit that is none
    (b"[[budget]]\nperiod = 'day'\nlimit = nan\n", "finite non-negative number"),
    (b"[[budget]]\nperiod = 'day'\nwarn = inf\n", "finite non-negative number"),
    (b"[[budget]]\nperiod = 'day'\nlimit = 1\nteam = 'x'\n", "unknown key"),
    (b"[[budget]]\nname='a'\nperiod = 'day'\nlimit = 1\n[[budget]]\nname='a'\nperiod='month'\n"
     b"limit=2\n", "given twice"),
    (b"[budget\n", "not a TOML file"),
    (b"\xff\xfe", "not a TOML file"),
])
def test_a_bad_budget_file_is_one_error_naming_what_is_wrong(text: bytes, error: str) -> None:
    with pytest.raises(BudgetFileError, match=error):
        load_budgets(text, "b.toml")


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_budget_file_or_one_budget_file_error(data: bytes) -> None:
    with contextlib.suppress(BudgetFileError):
        load_budgets(data, "b.toml")


def test_budgets_sum_their_scope_per_period_and_project_the_running_one() -> None:
    budgets = load_budgets(BUDGETS, "b.toml")
    rows = [
        {"day": date(2026, 2, 1), "project": "p", "agent": "claude-code", "billed_usd": 6.0},
        {"day": date(2026, 2, 2), "project": "p", "agent": "vak", "billed_usd": 9.0},
        {"day": date(2026, 2, 2), "project": "q", "agent": "claude-code", "billed_usd": 1.0},
        {"day": date(2026, 3, 1), "project": "p", "agent": "vak", "billed_usd": 2.0},
    ]
    as_of = datetime(2026, 3, 1, 6, tzinfo=UTC)  # a quarter of March 1st, 1/124 of March
    got = evaluate(budgets, rows, as_of=as_of,
                   periods=window_periods(date(2026, 2, 1), date(2026, 3, 1)))
    monthly = [s for s in got if s.budget.name == "p monthly"]
    assert [(s.period, s.spend, s.level, s.running) for s in monthly] == [
        ("2026-02", 15.0, Level.WARN, False), ("2026-03", 2.0, Level.OK, True)]
    assert monthly[1].projected == pytest.approx(2.0 * 31 * 4)
    assert monthly[1].projected_level is Level.LIMIT
    daily = {s.period: s for s in got if s.budget.period == "day"}
    assert len(daily) == 29  # every day of the window, spent or not
    assert daily["2026-02-01"].level is Level.LIMIT and daily["2026-02-01"].breached
    assert daily["2026-02-02"].spend == 1.0 and daily["2026-02-02"].level is Level.OK
    assert daily["2026-02-15"].spend == 0.0
    assert daily["2026-03-01"].spend == 0.0 and daily["2026-03-01"].running
    assert daily["2026-02-01"].line() \
        == "budget 'agent=claude-code per day' 2026-02-01: spent $6.00 (limit $5.50)"


def test_period_bounds_follow_the_zone() -> None:
    start, end = period_bounds("2026-12", "Asia/Tokyo")
    assert (start.isoformat(), end.isoformat()) == ("2026-12-01T00:00:00+09:00",
                                                    "2027-01-01T00:00:00+09:00")


def test_rows_inside_a_breached_period_are_marked_in_the_table() -> None:
    (budget,) = load_budgets(b"[[budget]]\nproject='p'\nperiod='month'\nwarn=1\nlimit=2\n", "b")
    statuses = evaluate([budget], [{"day": date(2026, 2, 1), "project": "p",
                                    "agent": "a", "billed_usd": 3.0}],
                        as_of=datetime(2027, 1, 1, tzinfo=UTC))
    assert row_level({"month": "2026-02", "project": "p"}, statuses) is Level.LIMIT
    assert row_level({"month": "2026-02", "project": "q"}, statuses) is Level.OK
    assert row_level({"month": "2026-02"}, statuses) is Level.OK  # not by project
    assert row_level({"day": date(2026, 2, 1), "project": "p"}, statuses) is Level.OK
    rows = [{"month": "2026-02", "project": "p", "billed_tokens": 10, "billed_usd": 3.0,
             "wasted_usd": 0.0}]
    lines = cost_table(rows, ("month", "project"), budgets=statuses)
    assert lines[0].split()[-1] == "budget" and lines[2].split()[-1] == "LIMIT"
    assert "OVER LIMIT" in "\n".join(budget_table(statuses))


def test_the_terminal_table_is_aligned_escaped_and_breaks_down_by_model() -> None:
    rows = [{"day": date(2026, 2, 10), "billed_input_tokens": 1, "billed_tokens": 1,
             "billed_usd": 0.5, "wasted_usd": 0.0},
            {"day": date(2026, 2, 11), "billed_input_tokens": 1_000_000,
             "billed_tokens": 1_000_000, "billed_usd": 12.25, "wasted_usd": 1.0}]
    split = [{"day": date(2026, 2, 11), "model": "m\x1b[31m", "billed_usd": 12.25,
              "billed_tokens": 1_000_000}]
    lines = cost_table(rows, ("day",), breakdown=split)
    assert lines[0].startswith("day") and set(lines[1]) == {"-"}
    assert lines[2].startswith("2026-02-10") and lines[3].startswith("2026-02-11")
    assert lines[4].startswith(BRANCH + "m\\x1b[31m")  # the name escaped, never raw
    assert lines[-1].startswith("total") and "$12.7500" in lines[-1]
    assert "1,000,001" in lines[-1]
    # Figures are right-aligned: the billed column ends at the same offset on every row.
    ends = {line.index("$") + len(line.split("$")[1].split()[0]) for line in lines[2:4]}
    assert len(ends) == 1
