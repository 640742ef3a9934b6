"""``vakpipe cost``: the usage of a committed run (or of an archive, audited first) priced."""

from __future__ import annotations

import sys
from datetime import datetime

import click

from pipeline.cli._exits import EXIT_FINDINGS, EXIT_PARTIAL
from pipeline.cli._options import (
    keys_option,
    storage_option,
)
from pipeline.errors import UsageError
from pipeline.io.storage import parse_storage_options, resolve


@click.command()
@click.argument("source", metavar="OUT|ROOT")
@click.option("--out", "run_out", default=None,
              help="SOURCE is an archive: audit it into this output first (in this process "
                   "when small), then price that run (its report under OUT/cost).")
@click.option("--since", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="First day (UTC, inclusive) to price.")
@click.option("--until", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="Last day (UTC, inclusive) to price.")
@click.option("--by", "by_text", default="day,model", show_default=True,
              help="Group the cost table by these, comma-separated: day, agent, model, "
                   "provider, session.")
@click.option("--prices", "prices_path", default=None, type=click.Path(dir_okay=False),
              help="Your own price table (TOML); its rules come first.")
@click.option("--report-dir", default=None,
              help="Where the tables and report.html go (default: OUT/cost).")
@click.option("--fail-on", "fail_on", type=click.Choice(["unpriced"]), default=None,
              help="Exit 1 when a billed model has no price (the line names them).")
@click.option("--allow-partial", is_flag=True,
              help="Exit 0 when the priced run is partial (still said; default: exit 3).")
@storage_option
@keys_option
def cost(source: str, run_out: str | None, since: datetime | None, until: datetime | None,
         by_text: str, prices_path: str | None, report_dir: str | None, fail_on: str | None,
         allow_partial: bool, storage_options: tuple[str, ...]) -> None:
    """Price the usage of the run committed under OUT: billed, effective and wasted USD.

    Writes costs.parquet and costs.csv (grouped by --by) and report.html (charts, one
    self-contained file) under OUT/cost or --report-dir. Models the price table does not
    know are named on stderr and never priced silently; --fail-on unpriced makes them
    exit 1.

    \b
    In one step from an archive: vakpipe cost ROOT --out OUT audits ROOT into OUT (as
    vakpipe audit ROOT --out OUT does), then prices that run.
    """
    from jobs.cost_report import cost_job, print_cost_summary, unpriced_failure
    from pipeline.costs.report import parse_by

    options = parse_storage_options(storage_options)
    out = resolve(source, options)
    by = parse_by(by_text)
    if run_out is not None:
        from jobs.audit import print_summary
        from pipeline.io.commit import read_manifest
        from pipeline.run.orchestrate import run_audit

        if since is not None and until is not None and since > until:  # before the audit
            raise UsageError(f"--since {since.date()} is after --until {until.date()}")
        if read_manifest(out) is not None:
            raise UsageError(f"{source} is a run's output, not an archive: price it with "
                             f"`vakpipe cost {source}` (--out is for an archive)")
        out = resolve(run_out, options)
        print_summary(run_audit(resolve(source, options), out))
    outcome = cost_job(out, by=by, since=since.date() if since else None,
                       until=until.date() if until else None, prices_path=prices_path,
                       report_dir=resolve(report_dir, options) if report_dir else None)
    print_cost_summary(outcome)
    if outcome.partial and not allow_partial:
        sys.exit(EXIT_PARTIAL)  # before --fail-on: figures of a partial run prove nothing
    unpriced = unpriced_failure(outcome) if fail_on == "unpriced" else None
    if unpriced is not None:
        click.echo(f"vakpipe: {unpriced}", err=True)
        sys.exit(EXIT_FINDINGS)
