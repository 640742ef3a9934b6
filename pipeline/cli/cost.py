"""``vakpipe cost``: the usage of a committed run (or of an archive, audited first) priced."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime

import click

from pipeline.cli._exits import EXIT_BUDGET, EXIT_FINDINGS, EXIT_PARTIAL
from pipeline.cli._options import (
    cluster_options,
    force_option,
    keys_option,
    max_line_option,
    prices_option,
    progress_option,
)
from pipeline.cli._output import JsonDocument, json_option, json_output
from pipeline.errors import UsageError
from pipeline.io.storage import check_output, parse_storage_options, resolve

#: The audit's options that change what runs, which only ``--out`` (an archive audited
#: first) uses. The reporter's (--progress, --heartbeat, --log-format) are accepted
#: without it: a display preference, with nothing to show.
_AUDIT_OPTIONS = {"scheduler": "--scheduler", "workers": "--workers",
                  "max_line_bytes": "--max-line-bytes", "force": "--force"}


@dataclass(frozen=True)
class AuditOptions:
    """How the one-step cost audits its archive (``vakpipe audit``'s options)."""

    scheduler: str | None
    workers: int | None
    progress: bool | None
    max_line_bytes: int


@click.command()
@click.argument("source", metavar="OUT|ROOT")
@click.option("--out", "run_out", default=None,
              help="SOURCE is an archive: audit it into this output first (in this process "
                   "when small), then price that run (its report under OUT/cost).")
@click.option("--since", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="First day (inclusive; on --timezone's clock) to price.")
@click.option("--until", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="Last day (inclusive; on --timezone's clock) to price.")
@click.option("--by", "by_texts", multiple=True, default=("day,model",),
              show_default=True,
              help="Group the cost table by these, comma-separated: day, week, month, "
                   "session, project, model, agent, source, provider, subagent, speed "
                   "(e.g. month,project); repeated, the lists join (--by month --by "
                   "project is --by month,project).")
@click.option("--timezone", "timezone", default=None, metavar="ZONE",
              help="IANA time zone of the days, weeks and months (default UTC), e.g. "
                   "Europe/Berlin.")
@click.option("--breakdown", is_flag=True,
              help="Under each row of the table, one row per model.")
@click.option("--budgets", "budgets_path", default=None, metavar="FILE",
              help="Budget file (TOML): spend per project/agent and day/month against warn "
                   "and limit levels; exit 4 when a limit is exceeded.")
@click.option("--as-of", "as_of", type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S",
                                                       "%Y-%m-%dT%H:%M"]),
              default=None, metavar="WHEN",
              help="The instant the budgets' running period is projected from (on "
                   "--timezone's clock; default now).")
@prices_option
@click.option("--report-dir", default=None,
              help="Where the tables and report.html go (default: OUT/cost).")
@click.option("--fail-on", "fail_on", type=click.Choice(["unpriced"]), default=None,
              help="Exit 1 when a billed model has no price (the line names them).")
@click.option("--allow-partial", is_flag=True,
              help="Exit 0 when the priced run is partial (still said; default: exit 3).")
@cluster_options
@progress_option
@max_line_option
@force_option
@json_option
@keys_option
def cost(source: str, run_out: str | None, since: datetime | None, until: datetime | None,
         by_texts: tuple[str, ...], timezone: str | None, breakdown: bool,
         budgets_path: str | None, as_of: datetime | None, prices_path: str | None,
         report_dir: str | None,
         fail_on: str | None, allow_partial: bool, scheduler: str | None,
         workers: int | None, storage_options: tuple[str, ...], progress: bool | None,
         max_line_bytes: int, as_json: bool) -> None:
    """Price the usage of the run committed under OUT: billed, effective and wasted USD.

    Writes costs.parquet and costs.csv (grouped by --by) and report.html (charts, one
    self-contained file) under OUT/cost or --report-dir. Models the price table does not
    know are named on stderr and never priced silently; --fail-on unpriced makes them
    exit 1.

    \b
    In one step from an archive: vakpipe cost ROOT --out OUT audits ROOT into OUT (as
    vakpipe audit ROOT --out OUT does, with the same --scheduler, --workers, --progress,
    --max-line-bytes and --force), then prices that run.

    \b
    Prints the cost table (a row per --by group, totals; --breakdown: per model). With
    --budgets FILE, each budget's spend per period, its projection to the period's end,
    and exit 4 when a spend is over its limit (before exit 3 and 1).
    """
    with json_output("cost", as_json) as doc:
        if run_out is None:
            _refuse_audit_options(click.get_current_context())
        _cost(doc, source, run_out, since, until, ",".join(by_texts), timezone, breakdown,
              budgets_path, as_of, prices_path, report_dir, fail_on, allow_partial,
              storage_options,
              AuditOptions(scheduler, workers, progress, max_line_bytes))


def _refuse_audit_options(ctx: click.Context) -> None:
    """A usage error for an audit option given on the command line without ``--out``:
    pricing a committed run starts no audit, so the option would be silently ignored.
    (``DASK_SCHEDULER_ADDRESS`` in the environment is no such request.)"""
    given = [flag for name, flag in _AUDIT_OPTIONS.items()
             if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE]
    if given:
        raise UsageError(f"{', '.join(given)}: options of the audit, only with --out (which "
                         "audits an archive before pricing it)")


def _cost(doc: JsonDocument, source: str, run_out: str | None, since: datetime | None,
          until: datetime | None, by_text: str, timezone: str | None, breakdown: bool,
          budgets_path: str | None, as_of: datetime | None, prices_path: str | None,
          report_dir: str | None, fail_on: str | None, allow_partial: bool,
          storage_options: tuple[str, ...], audit: AuditOptions) -> None:
    from zoneinfo import ZoneInfo

    from jobs.cost_report import (
        budget_failure,
        cost_job,
        cost_json,
        print_cost_summary,
        read_budget_file,
        unpriced_failure,
    )
    from pipeline.costs.periods import check_timezone
    from pipeline.costs.report import check_window, parse_by

    options = parse_storage_options(storage_options)
    out = resolve(source, options)
    by = parse_by(by_text)
    timezone = check_timezone(timezone)
    budgets = read_budget_file(budgets_path, options) if budgets_path is not None else ()
    when = as_of.replace(tzinfo=ZoneInfo(timezone or "UTC")) if as_of is not None else None
    audit_doc = None
    if run_out is not None:
        from jobs.audit import audit_job, print_summary, summary_json
        from pipeline.io.commit import read_manifest

        check_window(since and since.date(), until and until.date())  # before the audit
        if read_manifest(out) is not None:
            raise UsageError(f"{source} is a run's output, not an archive: price it with "
                             f"`vakpipe cost {source}` (--out is for an archive)")
        out = resolve(run_out, options)
        if report_dir:  # refused before the audit, not after it (cost_job checks too)
            check_output(resolve(source, options), resolve(report_dir, options))
        summary = audit_job(resolve(source, options), out, scheduler=audit.scheduler,
                            workers=audit.workers, progress=audit.progress,
                            max_line_bytes=audit.max_line_bytes)
        print_summary(summary)
        audit_doc = summary_json(summary)
    outcome = cost_job(out, by=by, since=since.date() if since else None,
                       until=until.date() if until else None, prices_path=prices_path,
                       report_dir=resolve(report_dir, options) if report_dir else None,
                       timezone=timezone, breakdown=breakdown, budgets=budgets, as_of=when)
    print_cost_summary(outcome)
    doc.set({"source": out.url, **cost_json(outcome), "audit": audit_doc})
    breach = budget_failure(outcome)
    if breach is not None:
        click.echo(f"vakpipe: {breach}", err=True)
        sys.exit(EXIT_BUDGET)  # a breach on a partial run is real: its spend is a floor
    if outcome.partial and not allow_partial:
        sys.exit(EXIT_PARTIAL)  # before --fail-on: figures of a partial run prove nothing
    unpriced = unpriced_failure(outcome) if fail_on == "unpriced" else None
    if unpriced is not None:
        click.echo(f"vakpipe: {unpriced}", err=True)
        sys.exit(EXIT_FINDINGS)
