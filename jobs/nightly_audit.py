"""The nightly audit (``vakpipe nightly``): one incremental pass over the archive.

Thin: :func:`pipeline.nightly.run_nightly` does the work; this module prints.
"""

from __future__ import annotations

from datetime import date

import click

from jobs.audit import print_summary
from pipeline.io.storage import Location
from pipeline.nightly import SUMMARY_FILE, NightlySummary, run_nightly
from pipeline.replay_partitions import ReplayOptions


def nightly_job(root: Location, out: Location, options: ReplayOptions, *,
                day: date | None = None, scheduler: str | None = None,
                workers: int | None = None, progress: bool | None = None,
                baseline_day: date | None = None, rebaseline: bool = False) -> NightlySummary:
    """Run the nightly audit of ``root`` into ``out``'s dated partition (``baseline_day``,
    ``rebaseline``: see :func:`pipeline.nightly.run_nightly`)."""
    return run_nightly(root, out, options, day=day, scheduler=scheduler, workers=workers,
                       progress=progress, baseline_day=baseline_day, rebaseline=rebaseline)


def print_nightly_summary(summary: NightlySummary) -> None:
    """Print what changed since the baseline, then the run's summary."""
    c = summary.changes
    if summary.rebaseline:
        base = "none (--rebaseline: started over, earlier partitions not compared)"
    elif summary.baseline is None:
        base = "none (first run)"
    else:
        base = summary.baseline + (" (--baseline)" if summary.baseline_pinned else "")
    click.echo(f"nightly {summary.day.isoformat()}: baseline {base}")
    reread = (f"{c['reread_options_changed']:,} re-read (options changed), "
              if c["reread_options_changed"] else "")
    click.echo(f"  objects: {c['new']:,} new, {c['changed']:,} changed, "
               f"{c['unchanged']:,} unchanged (carried forward), {reread}"
               f"{c['missing']:,} missing; "
               f"read {summary.bytes_read:,} of {summary.run.bytes:,} bytes")
    breaks = {k: c[k] for k in ("history_truncated", "history_rewritten", "missing") if c[k]}
    if breaks:
        click.echo("  history breaks: " + ", ".join(f"{k} {v}" for k, v in breaks.items()))
    print_summary(summary.run)
    click.echo(f"  summary: {summary.run.out}/{SUMMARY_FILE}")
