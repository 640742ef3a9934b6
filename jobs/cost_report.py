"""The cost report job (``vakpipe cost``): price a run's committed ``usage`` table, write
the cost tables (Parquet, CSV) and a self-contained HTML report.

Thin: pricing and grouping are :mod:`pipeline.costs.report`, the page :mod:`pipeline.costs.html`;
this module reads the run, writes the files and prints.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import click
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from pipeline.costs.budgets import (
    Budget,
    BudgetStatus,
    evaluate,
    load_budgets,
    window_periods,
)
from pipeline.costs.html import CostPage, hint_counts, packet_summary, render, saturation_bins
from pipeline.costs.periods import day_range, with_periods, with_projects
from pipeline.costs.pricing import LayeredPriceTable, load_prices
from pipeline.costs.report import (
    CostReport,
    check_window,
    drop_copies,
    in_window,
    price_usage,
    spreadsheet_table,
    unknown_lines,
)
from pipeline.costs.terminal import budget_table, cost_table
from pipeline.errors import PipelineError, UsageError
from pipeline.io.commit import (
    MANIFEST,
    CommittedRun,
    check_reader_output,
    check_report_folder,
    open_run,
    special_file,
    write_small_file,
)
from pipeline.io.storage import Location, storage_error, storage_errors
from pipeline.ledger.text import terminal_safe
from pipeline.tables.partial import InputRun

#: Where the report goes under the run's output by default.
REPORT_DIR = "cost"
COSTS_PARQUET, COSTS_CSV, REPORT_HTML = "costs.parquet", "costs.csv", "report.html"
#: The files a cost report writes (its manifest names them).
REPORT_FILES = (COSTS_PARQUET, COSTS_CSV, REPORT_HTML)
#: The ``kind`` of a cost report's ``_manifest.json`` (a run's has none).
REPORT_KIND = "cost-report"


@dataclass(frozen=True)
class CostOutcome:
    """What a cost report priced and where it wrote."""

    where: str
    files: tuple[str, ...]
    run_id: str | None
    rows: int
    totals: CostReport
    grouped: CostReport
    #: Usage records dropped as copies of a request another file holds (resumed, forked).
    copies: int = 0
    #: The priced run and how complete it is (a partial one prices only what was read).
    input: InputRun | None = None
    #: A --since/--until window holding no usage: the line saying which days the run has.
    empty_window: str | None = None
    #: The ``--by`` names, the window and the clock of the days (``None``: UTC).
    by: tuple[str, ...] = ()
    since: date | None = None
    until: date | None = None
    timezone: str | None = None
    #: The first and last day of the priced run's usage (the window's, if it has any).
    data_days: tuple[date | None, date | None] = (None, None)
    #: ``--breakdown``: the same usage grouped by ``by`` and ``model``.
    breakdown: CostReport | None = None
    #: ``--budgets``: each budget in each period of the window.
    budgets: tuple[BudgetStatus, ...] = ()
    #: Segment ledgers whose content is sealed (no key): their usage could not be read,
    #: so it is not priced, and the summary says so (docs/segments.md).
    sealed: int = 0

    @property
    def partial(self) -> bool:
        """Whether the priced run is partial."""
        return self.input is not None and self.input.partial

    @property
    def breaches(self) -> tuple[BudgetStatus, ...]:
        """The budget periods whose spend is over their limit."""
        return tuple(s for s in self.budgets if s.breached)


def _optional(out: Location, run: CommittedRun, dataset: str) -> pa.Table | None:
    """A dataset of the run, or ``None`` when the run did not write it."""
    try:
        return run.read_optional(dataset)
    except storage_errors() as err:
        raise storage_error(err, out.url) from err


def usage_run(out: Location) -> tuple[CommittedRun, pa.Table]:
    """The run a reader of ``out``'s usage reads (:func:`~pipeline.io.commit.open_run`:
    ``out``'s own, or a nightly output's newest night) and its usage table, both of one
    commit.

    Raises
    ------
    UsageError
        ``out`` holds no committed run (an archive, most often: the message says how to
        audit and price one), or its run has no usage table.
    """
    try:
        run = open_run(out)
        if run is None:
            missing = "" if out.filesystem().exists(out.path) else "nothing is there, so "
            raise UsageError(
                f"{out.url}: {missing}no committed run (an output of `vakpipe audit --out` or "
                f"`vakpipe nightly --out`); an archive is audited first: `vakpipe audit "
                f"{out.url} --out OUT`, or audited and priced in one step: `vakpipe cost "
                f"{out.url} --out OUT`")
        if "usage" not in run.datasets:
            from jobs.regression_check import replays_hint  # only on this error's way

            hint = replays_hint(out, run.datasets)
            raise UsageError(
                f"{out.url}: its run has no usage table" + (hint or (
                    " (runs before the cost report did not write one); audit its archive "
                    f"again: `vakpipe audit ROOT --out {out.url}`")))
        return run, run.read("usage")
    except storage_errors() as err:
        raise storage_error(err, out.url) from err


def publish(dest: Location, files: dict[str, bytes], *, run_id: str | None = None,
            source: str | None = None, base: Location | None = None) -> list[str]:
    """Commit a report's ``files`` under ``dest`` with a manifest of their own.

    Every path is checked first (a link refused before anything is written); then each
    file is written under a temporary name and renamed onto its own
    (:func:`~pipeline.io.commit.write_small_file`: no link followed, a reader never sees
    half a file), the previous report's manifest removed first (a failure between two
    files leaves no manifest vouching for a mix of two reports), then
    ``dest/_manifest.json`` names the files and the ``run_id`` they
    describe (the report in force), then the files the previous report's manifest named
    and this one does not are removed. ``base`` is the output every path must lie below
    (``OUT`` for the default ``OUT/cost``; ``dest`` itself for ``--report-dir``). A
    ``dest`` without a report's manifest that holds other files than a report's (a
    run's output and its ``_manifest.json``, a nightly's nights) is refused (``--force``
    of the runs does not apply: choose another ``--report-dir``).

    Raises
    ------
    UnsafeOutputError
        ``dest`` holds files of something else, or a link lies on the way.
    StorageError
        The storage failed; the previous manifest stays in force.
    """
    base = base or dest
    previous = read_report_manifest(dest)
    if previous is None:  # not a report's folder yet: nothing but a report's files
        check_report_folder(dest, REPORT_FILES)
    # Every path checked before the first write: a link found at the third file must not
    # leave the first two replaced beside the previous report's manifest.
    for name in (*files, MANIFEST):
        base.check_inside(dest.join(name))
    written = []
    try:
        if previous is not None:
            # Its files are about to be replaced one by one: a failure between two (a
            # full disk at report.html) must not leave the old manifest vouching for a
            # mix of two reports. Without one, the files say they describe no known run.
            with contextlib.suppress(FileNotFoundError):
                dest.filesystem().rm_file(dest.join(MANIFEST))
        for name, data in files.items():
            write_small_file(base, dest.join(name), data)
            # The URL as the user gave it (an S3 path without its s3:// is no address).
            written.append(f"{dest.url.rstrip('/')}/{name}")
        manifest = {"kind": REPORT_KIND, "run_id": run_id, "source": source,
                    "written_at": datetime.now(UTC).isoformat(), "files": sorted(files)}
        write_small_file(base, dest.join(MANIFEST),
                         json.dumps(manifest, indent=1, sort_keys=True).encode())
        for name in sorted(set((previous or {}).get("files", ())) - set(files)):
            base.check_inside(dest.join(name), leaf=False)
            with contextlib.suppress(FileNotFoundError):
                dest.filesystem().rm_file(dest.join(name))
    except storage_errors() as err:
        if isinstance(err, PipelineError):
            raise
        raise storage_error(err, dest.url) from err
    return written


def read_report_manifest(dest: Location) -> dict[str, Any] | None:
    """The manifest of the cost report under ``dest`` (``OUT/cost``), or ``None`` when
    there is none or it is not one (a report of an older vakpipe, a damaged file)."""
    failures: tuple[type[BaseException], ...] = (*storage_errors(), ValueError)
    if special_file(dest, dest.join(MANIFEST)) is not None:
        return None  # a device or FIFO is no report's (the report's write refuses it)
    try:
        raw = dest.filesystem().cat_file(dest.join(MANIFEST))
        manifest = json.loads(raw)
    except failures:
        return None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (not isinstance(manifest, dict) or manifest.get("kind") != REPORT_KIND
            or not isinstance(files, list)
            or not all(isinstance(f, str) and f in REPORT_FILES for f in files)):
        return None
    return manifest


def stale_report_line(out: Location, dest: Location | None = None) -> str | None:
    """``None`` when the cost report under ``dest`` (default ``OUT/cost``) describes the
    run in force under ``out``; else the line saying it does not (a report of an older
    run, or one with no manifest, sits beside a rerun). For readers of ``OUT/cost``.

    Raises
    ------
    CorruptManifestError
        The run's own manifest is not one vakpipe writes.
    """
    dest = dest or _default_dest(out)
    run = open_run(out)
    report = read_report_manifest(dest)
    run_id = run.manifest.get("run_id") if run is not None else None
    if report is None:
        return f"{dest.url}: no cost report manifest; its files describe no known run"
    if report.get("run_id") != run_id:
        return (f"{dest.url}: the cost report describes run {report.get('run_id')}, not "
                f"the run in force {run_id}: rerun `vakpipe cost {out.url}`")
    return None


def _default_dest(out: Location) -> Location:
    return out.child(REPORT_DIR)


def _table_bytes(table: pa.Table) -> tuple[bytes, bytes]:
    parquet, csv = io.BytesIO(), io.BytesIO()
    pq.write_table(table, parquet, compression="zstd")
    pacsv.write_csv(spreadsheet_table(table), csv)  # cells a spreadsheet would evaluate
    return parquet.getvalue(), csv.getvalue()


def empty_window_line(usage: pa.Table, since: date | None, until: date | None) -> str:
    """The line saying that the window [since, until] holds no usage, and which days the
    run's usage covers (so an empty window is not mistaken for a free month)."""
    span = pc.min_max(usage["day"])  # nulls skipped: a record with no ts has no day
    low, high = span["min"].as_py(), span["max"].as_py()
    covers = (f"the data covers {low} to {high}" if low is not None
              else "the run has no dated usage records")
    return f"no usage between {since or '…'} and {until or '…'}; {covers}"


def _window(since: date | None, until: date | None) -> str:
    if since is None and until is None:
        return "all"
    return f"{since or '…'} to {until or '…'}"


def _prices_text(prices: LayeredPriceTable) -> str:
    # Names each layer and its version, so a report can be traced to the prices it used.
    return (f"prices: {prices.source}; list prices as of {prices.as_of}, never checked "
            "against an invoice (your own rates: --prices FILE)")


def unpriced_failure(outcome: CostOutcome) -> str | None:
    """The line ``--fail-on unpriced`` exits with: the models no price layer knows, or
    ``None`` when every billed record was priced."""
    if not outcome.grouped.unknown:
        return None
    names = ", ".join(terminal_safe(f"{u.provider or '(no provider)'}/{u.model or '(no model)'}")
                      for u in outcome.grouped.unknown)
    return (f"--fail-on unpriced: {len(outcome.grouped.unknown)} unpriced model(s): {names} "
            "(add a rule in a --prices file)")


def read_budget_file(path: str, storage_options: dict[str, Any] | None = None
                     ) -> tuple[Budget, ...]:
    """The budgets of the TOML file at ``path`` (any fsspec URL).

    Raises
    ------
    UsageError
        The file cannot be read.
    BudgetFileError
        It is no budget file (:func:`pipeline.costs.budgets.load_budgets`).
    """
    from pipeline.io.storage import read_user_file

    return load_budgets(read_user_file(path, f"--budgets {path}", storage_options),
                        f"--budgets {path}")


def cost_job(out: Location, *, by: Sequence[str], since: date | None = None,
             until: date | None = None, prices_path: str | None = None,
             report_dir: Location | None = None, timezone: str | None = None,
             breakdown: bool = False, budgets: Sequence[Budget] = (),
             as_of: datetime | None = None) -> CostOutcome:
    """Price the ``usage`` table of the run committed under ``out`` and write the report.

    Parameters
    ----------
    out : Location
        A run's output (``vakpipe audit --out``), any fsspec URL.
    by : sequence of str
        Grouping keys of the cost table (:data:`pipeline.costs.report.GROUP_KEYS`).
    since, until : date or None
        Only days in [since, until] (days of the records' ``ts`` on ``timezone``'s clock).
    prices_path : str or None
        A price file whose rules come before the shipped ones.
    report_dir : Location or None
        Where to write; default ``OUT/cost``.
    timezone : str or None
        The IANA zone whose days, weeks and months group the records (default UTC).
    breakdown : bool
        Also group by ``by`` and ``model`` (the table's per-model rows).
    budgets : sequence of Budget
        Budgets to evaluate on the window (:mod:`pipeline.costs.budgets`).
    as_of : datetime or None
        The instant whose period is still running, for the projections (default now).

    Returns
    -------
    CostOutcome
        The totals, the grouped table and the files written.

    Raises
    ------
    UsageError
        No committed usage table, a bad price file, ``since`` after ``until``.
    """
    check_window(since, until)
    prices = load_prices(prices_path)
    run, usage = usage_run(out)
    dest = report_dir or _default_dest(out)
    # Before any work: a report lands neither in the archive read nor on a run's files.
    check_reader_output(run, out, dest, folder=True)
    requests = _optional(out, run, "requests")
    compaction = _optional(out, run, "compaction")
    source = InputRun.of(out.url, run.manifest)
    run_id = source.run_id
    sealed = pc.sum(pc.equal(usage["kind"], "sealed")).as_py() or 0
    usage, copies = drop_copies(usage)
    if timezone is not None or {"week", "month"} & set(by):  # else the audit's UTC days
        usage = with_periods(usage, timezone)
    if "project" in by or any(b.project is not None for b in budgets):
        sessions = _optional(out, run, "integrity/sessions")
        usage = with_projects(usage, sessions)
    everything = usage
    usage = in_window(usage, since, until)
    empty = (empty_window_line(everything, since, until)
             if usage.num_rows == 0 and (since is not None or until is not None) else None)
    if requests is not None and (since is not None or until is not None):
        # A request's day is its message's: keep the requests the window's usage names.
        requests = requests.filter(pc.is_in(requests["entry_id"],
                                            value_set=usage["request_id"].drop_null()))
    priced: dict[tuple[str, ...], CostReport] = {}

    def by_(*keys: str) -> CostReport:  # the page's groupings may repeat --by's
        if keys not in priced:
            priced[keys] = price_usage(usage, prices, keys)
        return priced[keys]

    totals, grouped = by_(), by_(*by)
    # With model among --by, each row is one model already: nothing to break down.
    split = by_(*by, "model") if breakdown and "model" not in by else None
    first, last = day_range(usage if usage.num_rows else everything)
    statuses: tuple[BudgetStatus, ...] = ()
    if budgets:
        periods = window_periods(since or day_range(usage)[0], until or day_range(usage)[1])
        statuses = tuple(evaluate(budgets, by_("day", "project", "agent").table.to_pylist(),
                                  as_of=as_of or datetime.now(UTC), zone=timezone,
                                  periods=periods))
    page = CostPage(
        source=out.url, run_id=run_id, window=_window(since, until),
        prices=_prices_text(prices), by=by, totals=totals, grouped=grouped,
        daily_by_model=by_("day", "model"), daily=by_("day"),
        saturation=saturation_bins(requests) if requests is not None else None,
        hints=hint_counts(requests) if requests is not None else None,
        packets=packet_summary(compaction) if compaction is not None else None,
        partial=source.line() if source.partial else None, budgets=statuses,
        timezone=timezone)
    prices.save_cache()  # the models priced: the next report need not import genai-prices
    parquet, csv = _table_bytes(grouped.table)
    files = publish(dest, {COSTS_PARQUET: parquet, COSTS_CSV: csv,
                           REPORT_HTML: render(page).encode()},
                    run_id=run_id, source=out.url, base=out if report_dir is None else dest)
    return CostOutcome(dest.url, tuple(files), run_id, usage.num_rows, totals, grouped, copies,
                       source, empty, tuple(by), since, until, timezone, (first, last),
                       split, statuses, sealed)


def print_cost_summary(outcome: CostOutcome) -> None:
    """The cost table (and the budgets), then the totals, on stdout; one warning line per
    unpriced model, when the run is partial, and per budget over a level, on stderr."""
    if outcome.input is not None and outcome.input.partial:
        click.echo(f"vakpipe: warning: {outcome.input.line()}", err=True)
    for line in unknown_lines(outcome.grouped.unknown):
        click.echo(f"vakpipe: warning: {line}", err=True)
    for status in outcome.budgets:
        if status.level.value != "ok":
            word = "OVER LIMIT" if status.breached else "over warning level"
            click.echo(f"vakpipe: warning: {word}: {terminal_safe(status.line())}", err=True)
    if outcome.empty_window is not None:
        click.echo(f"vakpipe: {outcome.empty_window}", err=True)
    if outcome.sealed:
        click.echo(f"vakpipe: warning: {outcome.sealed:,} segment ledgers are sealed (no key "
                   "for their scope): their usage is not read, so not priced (--keys)",
                   err=True)
    if outcome.grouped.table.num_rows:
        tz = f", days in {outcome.timezone}" if outcome.timezone else ""
        click.echo(f"cost by {', '.join(outcome.by) or 'nothing (one total)'}{tz}:")
        for line in cost_table(outcome.grouped.table.to_pylist(), outcome.by,
                               breakdown=(outcome.breakdown.table.to_pylist()
                                          if outcome.breakdown is not None else None),
                               budgets=outcome.budgets):
            click.echo(f"  {line}")
    elif outcome.empty_window is not None:
        click.echo(outcome.empty_window)  # on stdout too: the table's place is not blank
    if outcome.budgets:
        click.echo("budgets:")
        for line in budget_table(outcome.budgets):
            click.echo(f"  {line}")
    t = outcome.totals.totals
    click.echo(f"run {outcome.run_id}: {outcome.rows:,} usage records")
    if outcome.copies:
        click.echo(f"  {outcome.copies:,} copies of requests another file holds too (a "
                   "subagent's in its parent, a resumed or forked session) counted once")
    for name, label in (("billed", "billed"), ("effective", "effective"),
                        ("wasted", "wasted"), ("wasted_abandoned", "  abandoned branches"),
                        ("wasted_retry", "  failed/retried")):
        click.echo(f"  {label:<20} ${float(t[name].total):>14,.4f}")
    if outcome.grouped.unknown:
        click.echo(f"  NOT PRICED: {len(outcome.grouped.unknown)} unknown model(s), see stderr")
    if outcome.sealed:
        click.echo(f"  NOT PRICED: {outcome.sealed:,} sealed segment ledgers (no key), "
                   "see stderr")
    click.echo(f"  report: {', '.join(outcome.files)}")


def budget_failure(outcome: CostOutcome) -> str | None:
    """The line a limit breach exits with (every budget period over its limit, named),
    or ``None`` when no budget is over its limit."""
    breaches = outcome.breaches
    if not breaches:
        return None
    named = "; ".join(terminal_safe(s.line()) for s in breaches)
    return f"budget limit exceeded: {named}"


def _json_value(v: Any) -> Any:
    return v.isoformat() if isinstance(v, date) else v


def _json_rows(report: CostReport) -> list[dict[str, Any]]:
    return [{k: _json_value(v) for k, v in row.items()} for row in report.table.to_pylist()]


def cost_json(outcome: CostOutcome) -> dict[str, Any]:
    """The ``vakpipe.cost/1`` document (docs/json-output.md): the rows of the cost table
    grouped as asked (the columns of costs.csv), the totals, the per-model breakdown, the
    unpriced models and the budgets."""
    first, last = outcome.data_days
    return {
        "run_id": outcome.run_id,
        "by": list(outcome.by),
        "window": {"since": _json_value(outcome.since), "until": _json_value(outcome.until),
                   "timezone": outcome.timezone or "UTC"},
        "data_days": {"first": _json_value(first), "last": _json_value(last)},
        "empty_window": outcome.empty_window,
        "records": outcome.rows,
        "copies": outcome.copies,
        "partial": outcome.partial,
        "totals": {f"{m}_usd": float(c.total) for m, c in outcome.totals.totals.items()},
        "rows": _json_rows(outcome.grouped),
        "breakdown": (_json_rows(outcome.breakdown) if outcome.breakdown is not None
                      else None),
        "unknown_models": [{"provider": u.provider, "model": u.model, "records": u.records,
                            "tokens": u.tokens} for u in outcome.grouped.unknown],
        "budgets": [s.as_dict() for s in outcome.budgets],
        "budget_breaches": [s.as_dict() for s in outcome.breaches],
        "files": list(outcome.files),
    }
