"""The audit job (``vakpipe audit``, ``vakpipe replay``): an archive into integrity (and
replay) tables, and the summary every run prints (``compact``, ``nightly`` and the demo
print it too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pipeline.io.storage import MAX_LINE_BYTES, Location, printable
from pipeline.run.orchestrate import RunSummary, run_audit

if TYPE_CHECKING:
    # Only a replay needs its engine imported (see pipeline.run.orchestrate).
    from pipeline.run.replay_batches import ReplayOptions


def audit_job(root: Location, out: Location, replay: ReplayOptions | None = None, *,
              sessions: frozenset[str] | None = None, scheduler: str | None = None,
              workers: int | None = None, progress: bool | None = None,
              max_line_bytes: int = MAX_LINE_BYTES) -> RunSummary:
    """Audit the sessions under ``root`` (all, or those with the ids in ``sessions``)
    and commit the integrity tables under ``out``; with ``replay``, replay them too
    (``turns``, ``requests``), each object read once.

    The one place a CLI command (or a scheduled job) turns these options into a run:
    :func:`pipeline.run.orchestrate.run_audit`.
    """
    return run_audit(root, out, scheduler=scheduler, workers=workers, progress=progress,
                     replay=replay, sessions=sessions, max_line_bytes=max_line_bytes)


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


def print_replay_summary(summary: RunSummary) -> None:
    """Print a replay run's summary: the audit's, and where the replay tables are."""
    print_summary(summary)
    click.echo(f"  replay: {summary.out}/turns, {summary.out}/requests")


def summary_json(summary: RunSummary) -> dict[str, Any]:
    """A run's summary as JSON values (the body of ``vakpipe.audit/1``,
    docs/json-output.md): the manifest's summary (:meth:`RunSummary.as_dict`: keys
    escaped as the manifest escapes them), the run's id and output, and findings by
    severity and code."""
    by_severity: dict[str, dict[str, int]] = {}
    for (severity, code), n in sorted(summary.severity_codes.items()):
        by_severity.setdefault(severity, {})[code] = n
    return {"run_id": summary.run_id, "out": summary.out, **summary.as_dict(),
            "findings_by_severity": by_severity}
