"""The audit job's report: what a run of :func:`pipeline.run.orchestrate.run_audit`
prints (``vakpipe audit``, ``replay``, ``compact``, ``nightly`` and the demo all print it).

The run itself is :func:`~pipeline.run.orchestrate.run_audit`, called directly: a job
function here would only pass its arguments through.
"""

from __future__ import annotations

import click

from pipeline.io.storage import printable
from pipeline.run.orchestrate import RunSummary


def print_summary(summary: RunSummary) -> None:
    """Print a run's summary table: sessions, bytes, statuses, findings by code."""
    echo = click.echo
    echo(f"run {summary.run_id}: {summary.sessions} sessions, {summary.bytes:,} bytes "
         f"({summary.skipped_objects} other objects skipped)")
    if summary.skipped_examples:
        # Keys are data: escaped, so a hostile one cannot garble or spoof the terminal.
        echo("  skipped, e.g.: " + ", ".join(printable(k, 120)
                                             for k in sorted(summary.skipped_examples)))
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(summary.statuses.items()))
    echo(f"  status: {statuses}")
    segments = summary.storages.get("segments", 0)
    if segments:
        # Segment ledgers (docs/segments.md): how many, and whether their content was read.
        contents = ", ".join(f"{c} {summary.storages.get(f'segments:{c}', 0)}"
                             for c in ("plain", "opened", "sealed"))
        echo(f"  segment ledgers: {segments} ({contents})")
    if summary.codes:
        echo("  findings by code:")
        width = max(len(c) for c in summary.codes)
        for code, n in sorted(summary.codes.items(), key=lambda kv: (-kv[1], kv[0])):
            echo(f"    {code:<{width}}  {n:>8,}")
    else:
        echo("  findings: none")
    if summary.failed_batches:
        echo(f"  WARNING: {summary.failed_batches} tasks lost every worker that ran them; "
             "they were split and run again")
    if summary.partial:
        shown = sorted(summary.unread)[:5]
        echo(f"  WARNING: the run is partial: {len(summary.unread):,} sessions not read "
             "(see their findings), e.g.:")
        for path in shown:
            echo(f"    {printable(path, 160)}")
    echo(f"  tables: {summary.out}/integrity/sessions, {summary.out}/integrity/findings")
