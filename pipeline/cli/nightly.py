"""``vakpipe nightly``: the nightly audit of what changed since the last night."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import click

from pipeline.cli._exits import exit_on
from pipeline.cli._options import (
    build_replay_options,
    cluster_options,
    force_option,
    keys_option,
    max_line_option,
    progress_option,
    replay_options,
)
from pipeline.cli._output import json_option, json_output
from pipeline.io.storage import parse_storage_options, resolve

if TYPE_CHECKING:
    from jobs.nightly_audit import NightlySummary


@click.command()
@click.argument("root")
@click.option("--out", required=True,
              help="Output location; each night commits OUT/date=YYYY-MM-DD/.")
@click.option("--date", "day", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="The partition to write (default: today, UTC).")
@click.option("--compaction", is_flag=True,
              help="Also plan the packets each session's bound model needs (compaction table).")
@click.option("--baseline", "baseline_day", type=click.DateTime(["%Y-%m-%d"]), default=None,
              metavar="YYYY-MM-DD",
              help="Start from this committed partition instead of the newest (when the "
                   "newest lost its manifest or cannot be read).")
@click.option("--rebaseline", is_flag=True,
              help="Start over from no baseline (everything read as new; no history break "
                   "can be reported tonight); recorded in the summary.")
@click.option("--format", "layout", type=click.Choice(["partitions", "delta"]),
              default="partitions", show_default=True,
              help="partitions: one complete OUT/date=YYYY-MM-DD/ per night; delta: Delta "
                   "Lake tables under OUT, each night adding only the rows of the sessions "
                   "it read (docs/nightly.md, Delta tables).")
@click.option("--allow-other-root", is_flag=True,
              help="Accept an archive other than the one the baseline night audited.")
# At most a century: delta-rs takes the retention in hours as a 64-bit count.
@click.option("--keep-days", type=click.IntRange(min=0, max=36_500), default=None, metavar="N",
              help="With --format delta: after the commit, expire versions older than N "
                   "days (never the newest).")
@replay_options
@cluster_options
@progress_option
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default=None,
              help="Exit 1 when any session has a finding of this severity or worse "
                   "(a partial run exits 3 first).")
@max_line_option
@force_option
@json_option
@keys_option
def nightly(root: str, out: str, day: datetime | None, compaction: bool,
            baseline_day: datetime | None, rebaseline: bool, layout: str,
            allow_other_root: bool, keep_days: int | None, rules: str,
            planner: bool, catalog_path: str | None, window: int | None,
            scheduler: str | None, workers: int | None, storage_options: tuple[str, ...],
            progress: bool | None, fail_on: str | None, max_line_bytes: int,
            as_json: bool) -> None:
    """The nightly audit: read only what changed under ROOT since the last night.

    Writes the integrity, usage, turns, requests (and with --compaction, compaction)
    tables of every session into OUT/date=YYYY-MM-DD/, with the checkpoints the next
    night starts from and summary.json. Unchanged objects are not read: their rows are
    carried forward. History that no longer extends what was verified is reported
    (history_truncated, history_rewritten, session_missing).
    """
    with json_output("nightly", as_json) as doc:
        summary = _nightly(root, out, day, compaction, baseline_day, rebaseline, layout,
                           allow_other_root, keep_days, rules, planner, catalog_path, window,
                           scheduler, workers, storage_options, progress, max_line_bytes)
        doc.set({"day": summary.day.isoformat(), "baseline": summary.baseline,
                 "out": summary.run.out, **summary.as_dict()})
        exit_on(fail_on, summary.run)


def _nightly(root: str, out: str, day: datetime | None, compaction: bool,
             baseline_day: datetime | None, rebaseline: bool, layout: str,
             allow_other_root: bool, keep_days: int | None, rules: str,
             planner: bool, catalog_path: str | None, window: int | None,
             scheduler: str | None, workers: int | None, storage_options: tuple[str, ...],
             progress: bool | None, max_line_bytes: int) -> NightlySummary:
    import dataclasses

    from jobs.nightly_audit import print_nightly_summary, run_nightly
    from pipeline.compaction.engine import CompactionOptions
    from pipeline.compaction.registry import get_summariser

    options = parse_storage_options(storage_options)
    replay_opts = build_replay_options(rules, planner, catalog_path, window, None)
    if compaction:
        replay_opts = dataclasses.replace(
            replay_opts, compaction=CompactionOptions(get_summariser("cards")))
    if layout == "delta":
        from jobs.nightly_tables import run_nightly_tables
        from pipeline.errors import UsageError

        if baseline_day is not None:
            raise UsageError("--baseline is for --format partitions; a Delta night's "
                             "baseline is the last night committed (--rebaseline: none)")
        summary = run_nightly_tables(resolve(root, options), resolve(out, options),
                                     replay_opts, day=day.date() if day else None,
                                     scheduler=scheduler, workers=workers, progress=progress,
                                     rebaseline=rebaseline, allow_other_root=allow_other_root,
                                     keep_days=keep_days, max_line_bytes=max_line_bytes)
    else:
        if keep_days is not None:
            from pipeline.errors import UsageError

            raise UsageError("--keep-days is for --format delta (expire old partitions "
                             "with a lifecycle rule on date= prefixes)")
        summary = run_nightly(resolve(root, options), resolve(out, options), replay_opts,
                              day=day.date() if day else None, scheduler=scheduler,
                              workers=workers, progress=progress,
                              baseline_day=baseline_day.date() if baseline_day else None,
                              rebaseline=rebaseline, allow_other_root=allow_other_root,
                              max_line_bytes=max_line_bytes)
    print_nightly_summary(summary)
    return summary
