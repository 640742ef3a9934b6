"""The cost table as aligned plain text, for a terminal or a log (``vakpipe cost``). Pure.

One row per group of ``--by`` (as ccusage's daily/monthly tables: the period, then
input, output, cache write, cache read, total tokens and dollars), a total row, and
with ``--breakdown`` one indented row per model under each group. Plain text rather than
``rich``: vakpipe does not depend on it, and the same bytes go to a terminal, a pipe and
a cron mail. Every text cell comes from the ledgers and is escaped
(:func:`~pipeline.ledger.text.terminal_safe`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import date
from typing import Any

from pipeline.costs.budgets import BudgetStatus, Level, row_level
from pipeline.costs.report import GROUP_KEYS
from pipeline.ledger.text import terminal_safe

#: Figures of a row: header, column, how it is written.
_FIGURES: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("input", "billed_input_tokens", lambda v: f"{v or 0:,}"),
    ("output", "billed_output_tokens", lambda v: f"{v or 0:,}"),
    ("cache write", "billed_cache_write_tokens", lambda v: f"{v or 0:,}"),
    ("cache read", "billed_cache_read_tokens", lambda v: f"{v or 0:,}"),
    ("total tokens", "billed_tokens", lambda v: f"{v or 0:,}"),
    ("billed USD", "billed_usd", lambda v: f"${v or 0:,.4f}"),
    ("wasted USD", "wasted_usd", lambda v: f"${v or 0:,.4f}"),
)
#: The columns a ``--by`` name shows (a session by its path: its id is in the path).
_SHOWN = {"session": "session_path"}
#: How a row inside a period over a budget's level is marked.
_MARKS = {Level.OK: "", Level.WARN: "warn", Level.LIMIT: "LIMIT"}
#: The breakdown's prefix before a model's name.
BRANCH = "  └ "


def _key_text(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, date):
        return value.isoformat()
    return terminal_safe(str(value))


def shown_columns(by: Sequence[str]) -> list[str]:
    """The key columns the table shows for ``by`` (one per name)."""
    return [_SHOWN.get(name, GROUP_KEYS[name][0]) for name in by]


def _sum(rows: Sequence[Mapping[str, Any]], column: str) -> Any:
    return sum(r.get(column) or 0 for r in rows)


def _align(lines: list[list[str]], left: int) -> list[str]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for line in lines:
        cells = [c.ljust(w) if i < left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return out


def cost_table(rows: Sequence[Mapping[str, Any]], by: Sequence[str], *,
               breakdown: Sequence[Mapping[str, Any]] | None = None,
               budgets: Sequence[BudgetStatus] = ()) -> list[str]:
    """The lines of the cost table.

    Parameters
    ----------
    rows : sequence of mapping
        The cost table grouped ``by`` (rows of :func:`pipeline.costs.report.cost_schema`),
        in its order.
    by : sequence of str
        The ``--by`` names.
    breakdown : sequence of mapping or None
        The same usage grouped by ``by`` and ``model``: shown as one indented row per
        model under its group (``--breakdown``).
    budgets : sequence of BudgetStatus
        Budgets evaluated on the same window: a row inside a period over a budget's level
        is marked ``warn`` or ``LIMIT`` in a last column.
    """
    keys = shown_columns(by) or ["total"]
    marks = [_MARKS[row_level(r, budgets)] for r in rows]
    mark_column = any(marks)
    head = [*keys, *(h for h, _, _ in _FIGURES), *(["budget"] if mark_column else [])]
    lines: list[list[str]] = [head]
    blank = [""] * len(keys)
    by_group: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in breakdown or ():
        by_group.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    for r, mark in zip(rows, marks, strict=True):
        cells = [_key_text(r.get(k)) for k in keys] if by else ["all"]
        lines.append([*cells, *(fmt(r.get(col)) for _, col, fmt in _FIGURES),
                      *([mark] if mark_column else [])])
        if breakdown is not None:
            for m in sorted(by_group.get(tuple(r.get(k) for k in keys), []),
                            key=lambda x: -(x.get("billed_usd") or 0)):
                # In the last key column (the widest, often), under the group's value.
                name = BRANCH + _key_text(m.get("model"))
                lines.append([*blank[:-1], name, *(fmt(m.get(col)) for _, col, fmt in _FIGURES),
                              *([""] if mark_column else [])])
    total = ["total", *blank[1:], *(fmt(_sum(rows, col)) for _, col, fmt in _FIGURES),
             *([""] if mark_column else [])]
    rule = [["-" * len(c) for c in head]]
    aligned = _align([*lines, *rule, total], left=len(keys))
    width = max(len(line) for line in aligned)
    return [aligned[0], "-" * width, *aligned[1:len(lines)], "-" * width, aligned[-1]]


def budget_table(statuses: Sequence[BudgetStatus]) -> list[str]:
    """The budgets against their spend, one line each: budget, period, spend, levels,
    projection to the period's end (a running period), and the verdict."""
    if not statuses:
        return []

    def usd(v: float | None) -> str:
        return "" if v is None else f"${v:,.2f}"

    head = ["budget", "period", "spent", "warn", "limit", "% of limit", "projected", "status"]
    lines = [head]
    for s in statuses:
        share = (f"{100 * s.spend / s.budget.limit:,.0f}%" if s.budget.limit else "")
        verdict = {Level.LIMIT: "OVER LIMIT", Level.WARN: "over warn", Level.OK: "ok"}[s.level]
        if s.running and s.projected_level is not Level.OK and s.level is Level.OK:
            verdict = f"ok, projected over {s.projected_level.value}"
        lines.append([terminal_safe(s.budget.name), s.period, usd(s.spend), usd(s.budget.warn),
                      usd(s.budget.limit), share,
                      usd(s.projected) + (" (running)" if s.running else ""), verdict])
    aligned = _align(lines, left=2)
    width = max(len(line) for line in aligned)
    return [aligned[0], "-" * width, *aligned[1:]]
