"""Budgets: billed spend per project and/or agent, per day or month, against a warning
level and a limit (``vakpipe cost --budgets FILE``). Pure.

A budget file is TOML, one ``[[budget]]`` table per budget::

    [[budget]]
    name = "spotter, monthly"            # optional: named from its scope otherwise
    project = "-home-marco-projects-spotter"  # optional: a project (--by project's value)
    agent = "claude-code"                # optional: an agent (--by agent's value)
    period = "month"                     # "month" or "day"
    warn = 25.0                          # USD, optional
    limit = 40.0                         # USD, optional (at least one of warn, limit)

A budget with neither ``project`` nor ``agent`` covers all spend. Spend is the billed
USD (what the provider charges, wasted included) of the records in the budget's scope,
per period of the cost report's window on the report's clock (``--timezone``). Over a
level means strictly above it. The period holding the ``as of`` instant (now, unless
``--as-of``) is still running: its spend is projected to the period's end at the rate
so far (spend / elapsed × length); a closed period's projection is its spend.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from enum import Enum
from typing import Any
from zoneinfo import ZoneInfo

from pipeline.errors import PipelineError

#: The periods a budget may cover.
PERIODS = ("month", "day")
_FIELDS = frozenset({"name", "project", "agent", "period", "warn", "limit"})


class BudgetFileError(PipelineError, ValueError):
    """A budget file that cannot be read or does not say what the module docstring asks."""


class Level(Enum):
    """Where a period's spend stands against its budget."""

    OK = "ok"
    WARN = "warn"
    LIMIT = "limit"


@dataclass(frozen=True)
class Budget:
    """One budget of the file."""

    name: str
    period: str
    warn: float | None = None
    limit: float | None = None
    project: str | None = None
    agent: str | None = None

    @property
    def scope(self) -> dict[str, str]:
        """The cost table columns this budget narrows to, and their values."""
        return {k: v for k, v in (("project", self.project), ("agent", self.agent))
                if v is not None}


@dataclass(frozen=True)
class BudgetStatus:
    """One budget in one period: spend, levels, projection, verdict."""

    budget: Budget
    #: ``YYYY-MM`` or ``YYYY-MM-DD``.
    period: str
    spend: float
    #: The spend projected to the period's end (the spend itself once it is over).
    projected: float
    #: Whether the period holds the ``as of`` instant (so is still running).
    running: bool
    level: Level
    #: The projection goes over the limit (or warning level) by the period's end.
    projected_level: Level

    @property
    def breached(self) -> bool:
        """Spend over the limit."""
        return self.level is Level.LIMIT

    def line(self) -> str:
        """The budget, period and figures in one line (for stderr and exit messages)."""
        levels = ", ".join(f"{k} ${v:,.2f}" for k, v in (("warn", self.budget.warn),
                                                          ("limit", self.budget.limit))
                           if v is not None)
        proj = (f"; projected ${self.projected:,.2f} by the period's end"
                if self.running else "")
        return (f"budget {self.budget.name!r} {self.period}: spent ${self.spend:,.2f} "
                f"({levels}){proj}")

    def as_dict(self) -> dict[str, Any]:
        """The status as JSON values."""
        return {"budget": self.budget.name, "period_kind": self.budget.period,
                "project": self.budget.project, "agent": self.budget.agent,
                "period": self.period, "warn_usd": self.budget.warn,
                "limit_usd": self.budget.limit, "spend_usd": round(self.spend, 10),
                "projected_usd": round(self.projected, 10), "running": self.running,
                "level": self.level.value, "projected_level": self.projected_level.value}


def _number(raw: Any, where: str) -> float | None:
    if raw is None:
        return None
    # 0 <= raw also refuses nan (a level no spend is ever over, silently); inf is no
    # level at all: a budget leaves that level out instead.
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw < math.inf:
        raise BudgetFileError(f"{where}: expected a finite non-negative number of USD, "
                              f"got {raw!r}")
    return float(raw)


def _text(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw:
        raise BudgetFileError(f"{where}: expected a non-empty string, got {raw!r}")
    return raw


def parse_budgets(data: Mapping[str, Any], source: str = "budget file") -> tuple[Budget, ...]:
    """The budgets of a parsed budget file (module docstring).

    Raises
    ------
    BudgetFileError
        No ``[[budget]]``, an unknown key, a bad period or level, warn above limit, two
        budgets of one name.
    """
    tables = data.get("budget")
    unknown = sorted(set(data) - {"budget"})
    if unknown:
        raise BudgetFileError(f"{source}: unknown key(s) {', '.join(unknown)} "
                              "(expected [[budget]] tables)")
    if not isinstance(tables, list) or not tables:
        raise BudgetFileError(f"{source}: no [[budget]] table")
    budgets: list[Budget] = []
    for i, table in enumerate(tables, 1):
        where = f"{source}: budget {i}"
        if not isinstance(table, dict):
            raise BudgetFileError(f"{where}: not a table")
        extra = sorted(set(table) - _FIELDS)
        if extra:
            raise BudgetFileError(f"{where}: unknown key(s) {', '.join(extra)} "
                                  f"(expected {', '.join(sorted(_FIELDS))})")
        period = table.get("period")
        if period not in PERIODS:
            raise BudgetFileError(f"{where}: period must be one of {', '.join(PERIODS)}, "
                                  f"got {period!r}")
        warn, limit = _number(table.get("warn"), f"{where} warn"), \
            _number(table.get("limit"), f"{where} limit")
        if warn is None and limit is None:
            raise BudgetFileError(f"{where}: give warn, limit or both")
        if warn is not None and limit is not None and warn > limit:
            raise BudgetFileError(f"{where}: warn ${warn:,.2f} is above limit ${limit:,.2f}")
        project, agent = _text(table.get("project"), f"{where} project"), \
            _text(table.get("agent"), f"{where} agent")
        scope = " ".join(f"{k}={v}" for k, v in (("project", project), ("agent", agent))
                         if v is not None) or "all"
        name = _text(table.get("name"), f"{where} name") or f"{scope} per {period}"
        budgets.append(Budget(name, str(period), warn, limit, project, agent))
    names = [b.name for b in budgets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BudgetFileError(f"{source}: budget name(s) given twice: {', '.join(twice)}")
    return tuple(budgets)


def load_budgets(text: bytes, source: str) -> tuple[Budget, ...]:
    """Parse a budget file's bytes (TOML).

    Raises
    ------
    BudgetFileError
        Not UTF-8 TOML, or not a budget file (:func:`parse_budgets`).
    """
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise BudgetFileError(f"{source}: not a TOML file: {err}") from err
    return parse_budgets(data, source)


def period_bounds(period: str, zone: str | None) -> tuple[datetime, datetime]:
    """The first instant of ``period`` (``YYYY-MM`` or ``YYYY-MM-DD``) and of the next
    one, on ``zone``'s clock (UTC when ``None``)."""
    tz = ZoneInfo(zone or "UTC")
    if len(period) == 7:
        first = date.fromisoformat(period + "-01")
        after = date(first.year + first.month // 12, first.month % 12 + 1, 1)
    else:
        first = date.fromisoformat(period)
        after = first + timedelta(days=1)
    return (datetime.combine(first, time(), tz), datetime.combine(after, time(), tz))


def _level(amount: float, budget: Budget) -> Level:
    if budget.limit is not None and amount > budget.limit:
        return Level.LIMIT
    if budget.warn is not None and amount > budget.warn:
        return Level.WARN
    return Level.OK


def _period_of(row: Mapping[str, Any], kind: str) -> str | None:
    day = row.get("day")
    if day is None:
        return None
    text = day.isoformat() if isinstance(day, date) else str(day)
    return text[:7] if kind == "month" else text


def evaluate(budgets: Sequence[Budget], rows: Iterable[Mapping[str, Any]], *,
             as_of: datetime, zone: str | None = None,
             periods: Mapping[str, Sequence[str]] | None = None) -> list[BudgetStatus]:
    """Each budget's spend in each period, against its levels.

    Parameters
    ----------
    budgets : sequence of Budget
        The budget file's budgets.
    rows : iterable of mapping
        Cost rows grouped by at least ``day``, ``project`` and ``agent`` (a cost table
        grouped ``day,project,agent``), ``billed_usd`` each; days on ``zone``'s clock.
    as_of : datetime
        The instant whose period is still running (aware).
    zone : str or None
        The report's time zone (UTC when ``None``).
    periods : mapping or None
        For ``month`` and ``day``, the periods to report even when nothing was spent in
        them (:func:`window_periods`).

    Returns
    -------
    list of BudgetStatus
        By budget (file order), then period.
    """
    rows = list(rows)
    out: list[BudgetStatus] = []
    for budget in budgets:
        spent: dict[str, float] = {p: 0.0 for p in (periods or {}).get(budget.period, ())}
        for row in rows:
            if any(row.get(k) != v for k, v in budget.scope.items()):
                continue
            period = _period_of(row, budget.period)
            if period is not None:
                spent[period] = spent.get(period, 0.0) + float(row["billed_usd"] or 0.0)
        for period in sorted(spent):
            spend = spent[period]
            start, end = period_bounds(period, zone)
            running = start <= as_of < end
            projected = spend
            if running:
                elapsed = (as_of - start).total_seconds()
                length = (end - start).total_seconds()
                projected = spend * length / elapsed if elapsed > 0 else spend
            out.append(BudgetStatus(budget, period, spend, projected, running,
                                    _level(spend, budget), _level(projected, budget)))
    return out


def window_periods(first: date | None, last: date | None) -> dict[str, list[str]]:
    """The months and days from ``first`` to ``last`` (both inclusive): the periods a
    budget reports even with no spend (an empty day under a daily budget is a day at $0,
    not a missing one). Days are listed only for windows of at most 366 days."""
    if first is None or last is None:
        return {}
    days: list[str] = []
    months: set[str] = set()
    d = first
    while d <= last:
        months.add(d.isoformat()[:7])
        if (last - first).days <= 366:
            days.append(d.isoformat())
        d += timedelta(days=1)
    return {"month": sorted(months), "day": days}


def row_level(row: Mapping[str, Any], statuses: Sequence[BudgetStatus]) -> Level:
    """The worst level of the budget periods a cost row falls in: those whose period
    (``month`` or ``day``) and scope (``project``, ``agent``) the row's columns hold and
    match. A row grouped by neither period, or not by a budget's scope, falls in none of
    that budget's periods."""
    worst = Level.OK
    for status in statuses:
        if status.level is Level.OK:
            continue
        column = status.budget.period
        value = row.get(column)
        text = value.isoformat() if isinstance(value, date) else value
        if column not in row or text != status.period:
            continue
        if any(k not in row or row[k] != v for k, v in status.budget.scope.items()):
            continue
        if status.level is Level.LIMIT:
            return Level.LIMIT
        worst = Level.WARN
    return worst
