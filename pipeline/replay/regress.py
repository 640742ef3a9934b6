"""The projection regression check: compare two ``requests`` tables request by request.
Pure (pyarrow only).

Two replays of the same archive (two rule sets, or a previous run and a new replay) are
joined on ``(session_path, entry_id)``: one assistant message on an active chain is one
request. A pair *changed* when its request digest differs (the projections are not
byte-identical); a request found on one side only is *added* or *removed*. The decisions
are in ``docs/regression.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import PipelineError, UsageError

#: One request: an assistant message of one session (ids are unique on an active chain).
KEY = ("session_path", "entry_id")
#: Where the request is; taken from the candidate, else (removed requests) the baseline.
_WHERE = ("scope", "turn", "iteration", "model")
#: What is compared, one column per side (``old_…``, ``new_…``).
_COMPARED = ("rules", "request_digest", "replayed_tokens", "model_input_limit", "hint_level")
_MANDATORY = "mandatory"

REGRESSION_SCHEMA = pa.schema(
    [
        ("session_path", pa.string()),
        ("entry_id", pa.string()),
        ("scope", pa.string()),
        ("turn", pa.int32()),
        ("iteration", pa.int32()),
        ("model", pa.string()),
        ("status", pa.string()),
        ("old_rules", pa.string()),
        ("new_rules", pa.string()),
        ("old_request_digest", pa.string()),
        ("new_request_digest", pa.string()),
        ("old_replayed_tokens", pa.int64()),
        ("new_replayed_tokens", pa.int64()),
        ("token_delta", pa.int64()),
        ("old_model_input_limit", pa.int64()),
        ("new_model_input_limit", pa.int64()),
        ("old_hint_level", pa.string()),
        ("new_hint_level", pa.string()),
        ("changed", pa.bool_()),
        ("newly_over_window", pa.bool_()),
        ("newly_mandatory", pa.bool_()),
    ]
)


class ComparisonError(PipelineError, ValueError):
    """A ``requests`` table cannot be compared (missing columns, repeated requests)."""


def _side(table: pa.Table, prefix: str, label: str) -> pa.Table:
    """The key, where-columns and compared columns of one side, prefixed, plus a marker."""
    wanted = (*KEY, *_WHERE, *_COMPARED)
    missing = [c for c in wanted if c not in table.column_names]
    if missing:
        raise ComparisonError(f"the {label}'s requests table lacks {', '.join(missing)}: "
                              "not a vakpipe requests table")
    repeated = table.num_rows - table.group_by(list(KEY)).aggregate([]).num_rows
    if repeated:
        # A join would multiply them: a request must be one row on each side.
        raise ComparisonError(f"the {label}'s requests table repeats {repeated} "
                              "(session_path, entry_id) pairs")
    columns = {k: table[k] for k in KEY}
    columns.update({f"{prefix}{c}": table[c] for c in (*_WHERE, *_COMPARED)})
    columns[f"{prefix}present"] = pa.array([True] * table.num_rows, pa.bool_())
    return pa.table(columns)


def _over(tokens: pa.ChunkedArray, limit: pa.ChunkedArray) -> pa.ChunkedArray:
    # An unknown model (null limit) is never over its window.
    return pc.fill_null(pc.greater(tokens, limit), False)


def compare_requests(old: pa.Table, new: pa.Table) -> pa.Table:
    """Pair the requests of two replays and flag what changed.

    Parameters
    ----------
    old, new:
        ``requests`` tables (:data:`pipeline.tables.schemas.REQUESTS_SCHEMA`) of the baseline
        and of the candidate.

    Returns
    -------
    pyarrow.Table
        One row per request of either side (:data:`REGRESSION_SCHEMA`), in session and
        request order. ``status`` is ``same``/``changed`` (digests differ) for pairs,
        ``added``/``removed`` for a request of one side only; ``token_delta`` is new
        minus old replayed tokens; ``newly_over_window`` and ``newly_mandatory`` flag
        pairs only.

    Raises
    ------
    ComparisonError
        A table lacks a column the comparison needs, or repeats a request.
    """
    joined = _side(old, "old_", "baseline").join(
        _side(new, "new_", "candidate"), keys=list(KEY), join_type="full outer")
    old_in = pc.fill_null(joined["old_present"], False)
    new_in = pc.fill_null(joined["new_present"], False)
    paired = pc.and_(old_in, new_in)
    changed = pc.and_(paired, pc.not_equal(pc.fill_null(joined["old_request_digest"], ""),
                                           pc.fill_null(joined["new_request_digest"], "")))
    status = pc.if_else(pc.invert(old_in), "added", pc.if_else(
        pc.invert(new_in), "removed", pc.if_else(changed, "changed", "same")))
    over_old = _over(joined["old_replayed_tokens"], joined["old_model_input_limit"])
    over_new = _over(joined["new_replayed_tokens"], joined["new_model_input_limit"])
    mandatory_old = pc.equal(pc.fill_null(joined["old_hint_level"], ""), _MANDATORY)
    mandatory_new = pc.equal(pc.fill_null(joined["new_hint_level"], ""), _MANDATORY)
    columns: dict[str, Any] = {k: joined[k] for k in KEY}
    columns.update({c: pc.coalesce(joined[f"new_{c}"], joined[f"old_{c}"]) for c in _WHERE})
    columns["status"] = status
    for c in _COMPARED:
        columns[f"old_{c}"] = joined[f"old_{c}"]
        columns[f"new_{c}"] = joined[f"new_{c}"]
    columns["token_delta"] = pc.subtract(joined["new_replayed_tokens"],
                                         joined["old_replayed_tokens"])
    columns["changed"] = changed
    columns["newly_over_window"] = pc.and_(paired, pc.and_not(over_new, over_old))
    columns["newly_mandatory"] = pc.and_(paired, pc.and_not(mandatory_new, mandatory_old))
    table = pa.table({name: columns[name] for name in REGRESSION_SCHEMA.names})
    table = table.sort_by([("session_path", "ascending"), ("turn", "ascending"),
                           ("iteration", "ascending"), ("entry_id", "ascending")])
    return table.cast(REGRESSION_SCHEMA)


@dataclass(frozen=True)
class DeltaStats:
    """The distribution of token deltas (new minus old replayed tokens) over some pairs.

    ``p50``/``p95`` interpolate linearly between ranks (numpy's default); every figure
    is ``None`` over no pair.
    """

    count: int
    min: int | None
    p50: float | None
    p95: float | None
    max: int | None
    sum: int

    @classmethod
    def of(cls, deltas: pa.ChunkedArray | pa.Array) -> DeltaStats:
        """The statistics of ``deltas`` (no nulls)."""
        if len(deltas) == 0:
            return cls(0, None, None, None, None, 0)
        p50, p95 = pc.quantile(deltas, q=[0.5, 0.95], interpolation="linear").to_pylist()
        extremes = pc.min_max(deltas).as_py()
        return cls(len(deltas), extremes["min"], p50, p95, extremes["max"],
                   pc.sum(deltas).as_py())


@dataclass(frozen=True)
class RegressionSummary:
    """What the comparison found, for the console, the exit code and the summary file."""

    requests_compared: int
    requests_changed: int
    requests_added: int
    requests_removed: int
    #: Pairs whose replayed tokens differ: a rule set that changes only the accounting
    #: (an overhead) changes tokens, not digests.
    requests_tokens_changed: int
    sessions_compared: int
    sessions_changed: int
    #: Over the changed pairs (an unchanged pair has delta 0).
    delta_changed: DeltaStats
    #: Over every pair.
    delta_all: DeltaStats
    newly_over_window: int
    newly_mandatory: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def _count(mask: pa.ChunkedArray) -> int:
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


def summarise(pairs: pa.Table) -> RegressionSummary:
    """Count what :func:`compare_requests` found.

    Parameters
    ----------
    pairs:
        Its result.

    Returns
    -------
    RegressionSummary
        Requests and sessions compared and changed, added and removed requests, the
        token delta distributions, new overflows and newly mandatory hints.
    """
    status = pairs["status"]
    paired = pairs.filter(pc.is_in(status, pa.array(["same", "changed"])))
    changed = paired.filter(paired["changed"])
    return RegressionSummary(
        requests_compared=paired.num_rows,
        requests_changed=changed.num_rows,
        requests_added=_count(pc.equal(status, "added")),
        requests_removed=_count(pc.equal(status, "removed")),
        requests_tokens_changed=_count(pc.not_equal(paired["token_delta"], 0)),
        sessions_compared=pc.count_distinct(paired["session_path"]).as_py(),
        sessions_changed=pc.count_distinct(changed["session_path"]).as_py(),
        delta_changed=DeltaStats.of(changed["token_delta"]),
        delta_all=DeltaStats.of(paired["token_delta"]),
        newly_over_window=_count(pairs["newly_over_window"]),
        newly_mandatory=_count(pairs["newly_mandatory"]),
    )


@dataclass(frozen=True)
class ChangeLimit:
    """``--max-changed``: a number of requests, or a percentage of the requests compared."""

    value: Fraction
    percent: bool = False

    def allowed(self, compared: int) -> Fraction:
        """How many changed requests pass, out of ``compared``."""
        return self.value * compared / 100 if self.percent else self.value

    def __str__(self) -> str:
        text = str(self.value) if self.value.denominator == 1 else str(float(self.value))
        return f"{text}%" if self.percent else text


def parse_change_limit(text: str) -> ChangeLimit:
    """``N`` (requests) or ``P%`` (of the requests compared; decimals allowed).

    Raises
    ------
    UsageError
        Not a non-negative whole number, nor a percentage between 0 and 100.
    """
    raw = text.strip()
    percent = raw.endswith("%")
    number = raw.removesuffix("%").strip()
    try:
        value = Fraction(number)
    except (ValueError, ZeroDivisionError):
        value = Fraction(-1)
    if "/" in number or value < 0 or (percent and value > 100) or (
            not percent and value.denominator != 1):
        raise UsageError(f"--max-changed wants a number of requests (N) or a percentage "
                         f"of them (P%), got {text!r}")
    return ChangeLimit(value, percent)


@dataclass(frozen=True)
class Thresholds:
    """What makes a regression check fail (``None``: no limit)."""

    max_changed: ChangeLimit | None = None
    max_new_overflows: int | None = None

    def breaches(self, summary: RegressionSummary) -> tuple[str, ...]:
        """One line per threshold ``summary`` exceeds (none: the check passes)."""
        out: list[str] = []
        limit = self.max_changed
        if limit is not None and summary.requests_changed > limit.allowed(
                summary.requests_compared):
            out.append(f"{summary.requests_changed} requests changed, more than "
                       f"--max-changed {limit}")
        if self.max_new_overflows is not None and \
                summary.newly_over_window > self.max_new_overflows:
            out.append(f"{summary.newly_over_window} requests newly over their window, more "
                       f"than --max-new-overflows {self.max_new_overflows}")
        return tuple(out)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (limits as given on the command line)."""
        return {"max_changed": None if self.max_changed is None else str(self.max_changed),
                "max_new_overflows": self.max_new_overflows}
