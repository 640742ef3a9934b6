"""The dashboard's figures (:mod:`pipeline.costs.dashboard`) from small tables, and the
page's escaping."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa

from pipeline.costs.dashboard import (
    DashboardPage,
    Night,
    by_day_and_session,
    cost_by_project_day,
    night_of,
    packet_savings,
    render_dashboard,
    saturation_by_model,
    top_waste,
)
from pipeline.costs.pricing import Price, Rates, TomlPriceTable
from pipeline.tables.schemas import (
    COMPACTION_SCHEMA,
    FINDINGS_SCHEMA,
    REQUESTS_SCHEMA,
    SESSIONS_SCHEMA,
    USAGE_SCHEMA,
)

ONE = Decimal(1)
PRICES = TomlPriceTable((Price("anthropic", "*", Rates(ONE, ONE, ONE, ONE)),))
DAY = 1_790_000_000_000_000_000


def table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def usage_row(path: str, i: int, *, waste: str | None = None, day: int = 0,
              parent: str | None = None, tokens: int = 1_000_000) -> dict[str, Any]:
    ts = DAY + day * 86_400 * 10**9 + i
    return {"session_path": path, "session_id": path, "agent": "vak", "entry_id": f"e{i}",
            "request_id": f"{path}-{i}", "kind": "message", "ordinal": 0, "winning": True,
            "ts": ts, "day": ts // (86_400 * 10**9), "provider": "anthropic", "model": "m",
            "on_active_chain": waste is None, "input_tokens": tokens, "output_tokens": 0,
            "cache_read_tokens": 0, "cache_write_tokens": 0, "billed": True,
            "effective": waste is None, "waste": waste, "parent_session_path": parent}


def test_a_night_counts_findings_by_severity_and_code() -> None:
    findings = table([{"session_path": "a", "code": "history_truncated", "severity": "error"},
                      {"session_path": "a", "code": "torn_tail", "severity": "warning"},
                      {"session_path": "b", "code": "torn_tail", "severity": "warning"}],
                     FINDINGS_SCHEMA)
    night = night_of("2026-12-01", table([{"session_path": "a"}, {"session_path": "b"}],
                                          SESSIONS_SCHEMA), findings)
    assert night == Night("2026-12-01", 2, {"error": 1, "warning": 2},
                          {"history_truncated": 1, "torn_tail": 2})
    empty = night_of("x", table([], SESSIONS_SCHEMA), table([], FINDINGS_SCHEMA))
    assert (empty.sessions, empty.severities, empty.codes) == (0, {}, {})


def test_cost_goes_to_the_project_a_subagent_under_its_parent() -> None:
    sessions = table([
        {"session_path": "p1/a.jsonl", "agent": "claude-code", "cwd_hash": "-home-x-proj"},
        {"session_path": "p1/a/subagents/agent-1.jsonl", "agent": "claude-code",
         "cwd_hash": "-home-x-proj"},
        {"session_path": "agents/vak/sessions/abc/b.jsonl", "agent": "vak", "cwd_hash": "abc"},
    ], SESSIONS_SCHEMA)
    usage = table([usage_row("p1/a.jsonl", 0),
                   usage_row("p1/a/subagents/agent-1.jsonl", 1, parent="p1/a.jsonl"),
                   usage_row("agents/vak/sessions/abc/b.jsonl", 2, waste="retry"),
                   usage_row("agents/vak/sessions/abc/b.jsonl", 3, day=1)], USAGE_SCHEMA)
    per = by_day_and_session(usage, PRICES).table
    rows = cost_by_project_day(per, sessions)
    got = {(r["day"], r["project"]): (r["billed_usd"], r["wasted_usd"]) for r in rows}
    first, second = sorted({r["day"] for r in rows})
    assert got == {(first, "claude-code: -home-x-proj"): (2.0, 0.0),
                   (first, "vak: abc"): (1.0, 1.0), (second, "vak: abc"): (1.0, 0.0)}
    top = top_waste(per)
    assert [(r["session"], r["wasted_usd"]) for r in top] == \
        [("agents/vak/sessions/abc/b.jsonl", 1.0)]


def test_saturation_bands_per_model() -> None:
    rows = [{"session_path": "a", "model": "m", "saturation": s}
            for s in (10, 49, 50, 79, 80, 99, 100, 180)]
    rows += [{"session_path": "a", "model": "n", "saturation": None}]
    [m] = saturation_by_model(table(rows, REQUESTS_SCHEMA))
    assert m == {"model": "m", "requests": 8, "under 50%": 2, "50–80%": 2, "80–100%": 2,
                 "over 100%": 2, "median %": 80, "max %": 180}


def test_packet_savings_leave_superseded_packets_out() -> None:
    rows = [{"session_path": "a", "packet_id": "p1", "tokens_before": 100,
             "tokens_after": 30, "superseded": False, "model": "m"},
            {"session_path": "a", "packet_id": "p0", "tokens_before": 999,
             "tokens_after": 1, "superseded": True, "model": "m"},
            {"session_path": "b", "packet_id": "p2", "tokens_before": 50, "tokens_after": 40,
             "superseded": None, "model": "m"}]
    p = packet_savings(table(rows, COMPACTION_SCHEMA))
    assert (p.sessions, p.packets, p.tokens_saved) == (2, 2, 80)
    assert [r["session"] for r in p.top] == ["a", "b"]


def test_names_from_the_ledgers_are_escaped() -> None:
    evil = "<img src=x onerror=alert(1)>"
    page = render_dashboard(DashboardPage(
        source="s3://b/n", run_id="r", nights=[Night(evil, 1, {"error": 1}, {evil: 1})],
        cost=[{"day": "2026-12-01", "project": evil, "billed_usd": 1.0, "effective_usd": 1.0,
               "wasted_usd": 0.0, "billed_tokens": 1, "wasted_tokens": 0}],
        top_waste=[{"session": evil, "wasted_usd": 1.0, "wasted_tokens": 1,
                    "wasted_abandoned_usd": 1.0, "wasted_retry_usd": 0.0, "billed_usd": 2.0}],
        saturation=[{"model": evil, "requests": 1, "under 50%": 1, "50–80%": 0,
                     "80–100%": 0, "over 100%": 0, "median %": 1, "max %": 1}],
        packets=None, prices="p", unpriced=[evil]))
    assert "<img src=x" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
