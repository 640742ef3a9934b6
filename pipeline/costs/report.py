"""What a fleet's usage cost: the ``usage`` dataset priced, grouped and split into billed,
effective and wasted US dollars. Pure (pyarrow only).

The audit flags every usage record (``pipeline.audit.session``: billed, effective, waste); this
module prices the billed ones with :mod:`pipeline.costs.pricing` and sums them by any of day,
week, month, project (:mod:`pipeline.costs.periods`), agent, model, provider and session.
The rules are in ``docs/cost-rules.md``.

A long-context tier is decided per request, so rows are never priced on sums across
requests: each row is first marked over or under its model's tier threshold (vectorised),
then rows are summed per (group, provider, model, over tier, category) with Arrow's
``group_by``, and only those buckets are priced, exactly, with :func:`price`. Within a
bucket every row has the same rates, so the price of the sum is the sum of the prices.
A million rows are a few Arrow passes and a few thousand :func:`price` calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.costs.periods import PERIOD_COLUMNS, PROJECT_COLUMN, with_periods, with_projects
from pipeline.costs.pricing import Cost, Price, PriceTable, TokenUsage, price
from pipeline.errors import UsageError
from pipeline.ledger.text import spreadsheet_safe, terminal_safe

#: ``--by`` names -> the ``usage`` columns they group on.
GROUP_KEYS: dict[str, tuple[str, ...]] = {
    "day": ("day",),
    "week": ("week",),
    "month": ("month",),
    "project": ("project",),
    "agent": ("agent",),
    "model": ("model",),
    "provider": ("provider",),
    "session": ("session_path", "session_id"),
    "source": ("source",),
    "subagent": ("subagent",),
    "speed": ("speed",),
}
#: Columns later runs added to ``usage``: null when pricing an older run's table.
_ADDED_COLUMNS = {"source": pa.string(), "parent_session_path": pa.string(),
                  "subagent": pa.string(), "cache_write_1h_tokens": pa.int64(),
                  "speed": pa.string()}
#: A request's speed while pricing: the ``usage`` column's null (none stated) is the
#: standard speed; ``fast`` is priced at its rule's fast rates (:attr:`Price.fast`).
STANDARD_SPEED, FAST_SPEED = "standard", "fast"
TOKEN_COLUMNS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                 "cache_write_1h_tokens")
_KINDS = ("input", "output", "cache_read", "cache_write")
#: How a billed record counts: effective, or wasted on an abandoned branch or a retry.
CATEGORIES = ("effective", "abandoned", "retry")
#: Measures of a cost row, each with ``_tokens`` and ``_usd`` columns.
MEASURES = ("billed", "effective", "wasted", "wasted_abandoned", "wasted_retry")
_OF_MEASURE = {"billed": CATEGORIES, "effective": ("effective",),
               "wasted": ("abandoned", "retry"), "wasted_abandoned": ("abandoned",),
               "wasted_retry": ("retry",)}

_VALUE_FIELDS = [
    ("records", pa.int64()),
    ("requests", pa.int64()),
    *[(f"{m}_{unit}", t) for m in MEASURES
      for unit, t in (("tokens", pa.int64()), ("usd", pa.float64()))],
    *[(f"billed_{k}_tokens", pa.int64()) for k in _KINDS],
    *[(f"billed_{k}_usd", pa.float64()) for k in _KINDS],
    ("tiered_records", pa.int64()),
    ("unknown_model", pa.bool_()),
    ("unknown_tokens", pa.int64()),
]
_KEY_TYPES = {"day": pa.date32(), "week": pa.date32()}
_NAMES = ("provider", "model")  # null in the usage table, "" while grouping


def parse_by(text: str) -> tuple[str, ...]:
    """The grouping keys of ``--by`` (``"day,model"``), checked, in the order given.

    Raises
    ------
    UsageError
        An unknown or repeated key.
    """
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in GROUP_KEYS]
    if bad or len(set(names)) != len(names):
        raise UsageError(f"--by {text!r}: expected distinct names among "
                         f"{', '.join(GROUP_KEYS)}")
    return names


def key_columns(by: Sequence[str]) -> list[str]:
    """The ``usage`` columns that grouping ``by`` keys on (and the cost table starts with)."""
    return [c for name in by for c in GROUP_KEYS[name]]


def cost_schema(by: Sequence[str]) -> pa.Schema:
    """The schema of a cost table grouped ``by`` those keys."""
    keys = [(c, _KEY_TYPES.get(c, pa.string())) for c in key_columns(by)]
    return pa.schema([*keys, *_VALUE_FIELDS])


def check_window(since: date | None, until: date | None) -> None:
    """Refuse a window whose first day is after its last.

    Raises
    ------
    UsageError
        ``since`` is after ``until`` (a window of no day would report nothing, as if the
        run held no usage).
    """
    if since is not None and until is not None and since > until:
        raise UsageError(f"--since {since} is after --until {until}")


def in_window(usage: pa.Table, since: date | None = None,
              until: date | None = None) -> pa.Table:
    """The rows of ``usage`` whose ``day`` is within [since, until] (both inclusive)."""
    mask = None
    if since is not None:
        mask = pc.greater_equal(usage["day"], pa.scalar(since, pa.date32()))
    if until is not None:
        upper = pc.less_equal(usage["day"], pa.scalar(until, pa.date32()))
        mask = upper if mask is None else pc.and_(mask, upper)
    return usage if mask is None else usage.filter(pc.fill_null(mask, False))


@dataclass(frozen=True)
class UnknownModel:
    """Billed usage that no price rule matched: reported, never silently left out."""

    provider: str | None
    model: str | None
    records: int
    tokens: int


@dataclass
class _Sums:
    """One output group's running totals (exact decimals until the table is built)."""

    cost: dict[str, Cost] = field(default_factory=lambda: {c: Cost() for c in CATEGORIES})
    usage: dict[str, TokenUsage] = field(
        default_factory=lambda: {c: TokenUsage() for c in CATEGORIES})
    records: int = 0
    requests: int = 0
    tiered: int = 0
    unknown: bool = False
    unknown_tokens: int = 0


def _tokens(u: TokenUsage) -> int:
    return u.input + u.output + u.cache_read + u.cache_write


@dataclass(frozen=True)
class CostReport:
    """Priced usage: the cost table grouped as asked, the exact totals of every measure
    (:data:`MEASURES`: ``billed``, ``effective``, ``wasted``...), and the models left
    unpriced."""

    table: pa.Table
    totals: dict[str, Cost]
    unknown: tuple[UnknownModel, ...]


class _Rules:
    """Price rules per (provider, model), and flat rules per (provider, model, over)."""

    def __init__(self, prices: PriceTable) -> None:
        self.prices = prices
        self.rules: dict[tuple[str, str], Price | None] = {}
        self.flat: dict[tuple[str, str, bool, str], Price | None] = {}

    def rule(self, provider: str, model: str) -> Price | None:
        key = (provider, model)
        if key not in self.rules:
            self.rules[key] = self.prices.lookup(provider or None, model or None)
        return self.rules[key]

    def flat_rule(self, provider: str, model: str, over: bool,
                  speed: str = STANDARD_SPEED) -> Price | None:
        """The rule with the rates a request over (or under) its tier pays, untiered: so
        :func:`price` applies them to a bucket's summed usage as it would to each row. A
        fast request pays the rule's fast rates (no tier applies to them); ``None`` when
        the rule has none, or for a speed no rule prices: unpriced, never priced at the
        standard rates."""
        key = (provider, model, over, speed)
        if key not in self.flat:
            rule = self.rule(provider, model)
            if rule is not None and speed != STANDARD_SPEED:
                fast = rule.fast if speed == FAST_SPEED else None
                rule = None if fast is None else replace(rule, base=fast, tier=None, fast=None)
            elif rule is not None:
                rates = rule.tier.rates if over and rule.tier is not None else rule.base
                rule = replace(rule, base=rates, tier=None, fast=None)
            self.flat[key] = rule
        return self.flat[key]


def _over_tier(billed: pa.Table, rules: _Rules) -> pa.Array:
    """Per row: whether its prompt is strictly above its model's tier threshold (never
    for a request at another speed than the standard: no tier applies to it)."""
    pairs = billed.group_by(["provider", "model"], use_threads=False).aggregate([])
    tiers = [(p, m, r.tier.above) for p, m in zip(pairs["provider"].to_pylist(),
                                                  pairs["model"].to_pylist(), strict=True)
             if (r := rules.rule(p, m)) is not None and r.tier is not None]
    over = pa.nulls(billed.num_rows, pa.bool_()).fill_null(False)
    if not tiers:
        return over
    prompt = pc.add(pc.add(billed["input_tokens"], billed["cache_read_tokens"]),
                    billed["cache_write_tokens"])
    # Few models have a tier: one vectorised pass each.
    for provider, model, above in tiers:
        mine = pc.and_(pc.equal(billed["provider"], provider), pc.equal(billed["model"], model))
        over = pc.or_(over, pc.and_(mine, pc.greater(prompt, above)))
    return pc.and_(over, pc.equal(billed["speed"], STANDARD_SPEED))


def with_added_columns(usage: pa.Table) -> pa.Table:
    """``usage`` with the columns later versions added (null in an older run's table)."""
    for name, kind in _ADDED_COLUMNS.items():
        if name not in usage.column_names:
            usage = usage.append_column(pa.field(name, kind), pa.nulls(usage.num_rows, kind))
    return usage


def drop_copies(usage: pa.Table) -> tuple[pa.Table, int]:
    """``usage`` without the copies of a provider request that several files hold, and
    how many were dropped (docs/cost-rules.md, "Copies of one request").

    A resumed Claude Code session and a forked Codex rollout start with a copy of the
    history they continue: the same requests, under the same ``request_id``
    (``message.id:requestId``; Codex: the event's time and totals). Such a request is
    counted once, in the file whose copy has the earliest ``ts``, then the first path.
    vak's rows are never merged: its ids are per entry and its attempts share one.
    """
    usage = with_added_columns(usage)
    source = pc.fill_null(usage["source"], "vak")
    foreign = pc.and_(pc.not_equal(source, "vak"), pc.is_valid(usage["request_id"]))
    foreign = pc.fill_null(foreign, False)
    if not pc.any(foreign).as_py():
        return usage, 0
    # Only the columns that choose a copy are filtered and sorted, not the whole table
    # (those steps ~3x faster on 10^5 rows): the others move once, in the last take.
    rows = usage.select(["source", "request_id", "ts", "session_path"]).append_column(
        "_row", pa.array(range(usage.num_rows), pa.int64()))
    theirs = rows.filter(foreign).sort_by([("ts", "ascending"), ("session_path", "ascending")])
    first = theirs.group_by(["source", "request_id"], use_threads=False).aggregate(
        [("_row", "first")])["_row_first"]
    dropped = theirs.num_rows - len(first)
    if not dropped:
        return usage, 0
    kept = pa.concat_arrays([rows.filter(pc.invert(foreign))["_row"].combine_chunks(),
                             first.combine_chunks()])
    kept = kept.take(pc.sort_indices(kept))  # the table's own order
    return usage.take(kept), dropped


def _prepared(usage: pa.Table, keys: Sequence[str] = ()) -> pa.Table:
    """The billed rows, with null provider/model as ``""`` (so they group and compare), a
    ``category`` column, and a subagent's usage under its parent session's path."""
    usage = with_added_columns(usage)
    # Weeks and months (UTC, as the audit's days) and projects only when grouped on and
    # not added by the caller (cost_job adds them on --timezone's clock, with projects).
    if any(c in keys and c not in usage.column_names for c in PERIOD_COLUMNS):
        usage = with_periods(usage)
    if PROJECT_COLUMN in keys and PROJECT_COLUMN not in usage.column_names:
        usage = with_projects(usage, None)
    usage = usage.set_column(
        usage.schema.get_field_index("session_path"), "session_path",
        pc.coalesce(usage["parent_session_path"], usage["session_path"]))
    billed = usage.filter(pc.fill_null(usage["billed"], False))
    for name in _NAMES:
        i = billed.schema.get_field_index(name)
        billed = billed.set_column(i, name, pc.fill_null(billed[name], ""))
    billed = billed.set_column(billed.schema.get_field_index("speed"), "speed",
                               pc.fill_null(billed["speed"], STANDARD_SPEED))
    category = pc.fill_null(billed["waste"], "effective")
    return billed.append_column("category", category)


def price_usage(usage: pa.Table, prices: PriceTable, by: Sequence[str] = ()) -> CostReport:
    """Price the billed rows of a ``usage`` table and sum them by ``by``.

    Parameters
    ----------
    usage : pyarrow.Table
        Rows of the ``usage`` dataset (``pipeline.tables.schemas.USAGE_SCHEMA``), already cut
        to the window wanted (:func:`in_window`).
    prices : PriceTable
        The price table (:func:`pipeline.costs.pricing.load_prices`).
    by : sequence of str
        Grouping keys among :data:`GROUP_KEYS`; empty for one total row.

    Returns
    -------
    CostReport
        The cost table (:func:`cost_schema`, sorted by its keys) and the unknown models,
        largest token volume first.
    """
    keys = key_columns(by)
    billed = _prepared(usage, keys)
    rules = _Rules(prices)
    billed = billed.append_column("over", _over_tier(billed, rules))
    bucket_keys = list(dict.fromkeys([*keys, "provider", "model", "speed", "over",
                                      "category"]))
    buckets = billed.group_by(bucket_keys, use_threads=False).aggregate(
        [(c, "sum") for c in TOKEN_COLUMNS] + [("category", "count")])
    cols = {name: buckets[name].to_pylist() for name in buckets.column_names}
    groups: dict[tuple[Any, ...], _Sums] = {}
    unknown: dict[tuple[str, str], list[int]] = {}
    for i in range(buckets.num_rows):
        provider, model, over = cols["provider"][i], cols["model"][i], cols["over"][i]
        speed = cols["speed"][i]
        category, n = cols["category"][i], cols["category_count"][i]
        u = TokenUsage(*(cols[f"{c}_sum"][i] or 0 for c in TOKEN_COLUMNS))
        key = tuple(cols[k][i] or None if k in _NAMES else cols[k][i] for k in keys)
        sums = groups.setdefault(key, _Sums())
        rule = rules.flat_rule(provider, model, over, speed)
        sums.cost[category] += price(u, rule)
        sums.usage[category] += u
        sums.records += n
        sums.requests += n if category == "effective" else 0
        sums.tiered += n if over else 0
        if rule is None:
            sums.unknown = True
            sums.unknown_tokens += _tokens(u)
            # A model priced at its standard speed but not at this one: named with it.
            shown = model if speed == STANDARD_SPEED or not model else f"{model} ({speed})"
            seen = unknown.setdefault((provider, shown), [0, 0])
            seen[0] += n
            seen[1] += _tokens(u)
    table = _cost_table(by, keys, groups)
    totals = {m: sum((_measure(g, m)[0] for g in groups.values()), Cost()) for m in MEASURES}
    listed = sorted((UnknownModel(p or None, m or None, n, t)
                     for (p, m), (n, t) in unknown.items()),
                    key=lambda x: (-x.tokens, x.provider or "", x.model or ""))
    return CostReport(table, totals, tuple(listed))


def _measure(sums: _Sums, measure: str) -> tuple[Cost, TokenUsage]:
    cost, use = Cost(), TokenUsage()
    for c in _OF_MEASURE[measure]:
        cost, use = cost + sums.cost[c], use + sums.usage[c]
    return cost, use


def _cost_table(by: Sequence[str], keys: list[str],
                groups: dict[tuple[Any, ...], _Sums]) -> pa.Table:
    schema = cost_schema(by)
    rows: list[dict[str, Any]] = []
    for key in sorted(groups, key=lambda k: tuple((v is None, v) for v in k)):
        sums = groups[key]
        row: dict[str, Any] = dict(zip(keys, key, strict=True))
        row.update(records=sums.records, requests=sums.requests, tiered_records=sums.tiered,
                   unknown_model=sums.unknown, unknown_tokens=sums.unknown_tokens)
        for m in MEASURES:
            cost, use = _measure(sums, m)
            row[f"{m}_tokens"], row[f"{m}_usd"] = _tokens(use), float(cost.total)
            if m == "billed":
                amounts = cost.as_floats()
                for k in _KINDS:
                    row[f"billed_{k}_tokens"] = getattr(use, k)
                    row[f"billed_{k}_usd"] = amounts[k]
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


def unknown_lines(unknown: Iterable[UnknownModel]) -> list[str]:
    """One warning line per unpriced provider/model: its token volume and records (the
    names are the ledgers' text, printed to a terminal: escaped)."""
    return [f"unknown model {terminal_safe(u.provider or '(no provider)')}/"
            f"{terminal_safe(u.model or '(no model)')}: "
            f"{u.tokens:,} billed tokens in {u.records:,} records NOT PRICED "
            "(add a rule in a --prices file)" for u in unknown]


def spreadsheet_table(table: pa.Table) -> pa.Table:
    """``table`` for a CSV file: every string cell that a spreadsheet would evaluate
    (``=HYPERLINK(...)``, ``@SUM``, ``+1``, ``-2+3`` from a model name or a path) prefixed
    with ``'`` (:func:`pipeline.ledger.text.spreadsheet_safe`). Numbers are left as they are;
    only the CSV gets this, the Parquet table keeps the values."""
    columns = []
    for column in table.columns:
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            values = column.to_pylist()
            safe = [v if v is None else spreadsheet_safe(v) for v in values]
            if safe != values:
                column = pa.chunked_array([pa.array(safe, column.type)], column.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=table.schema)
