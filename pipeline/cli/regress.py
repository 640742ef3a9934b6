"""``vakpipe regress``: two rule sets' replays compared request by request."""

from __future__ import annotations

import sys

import click

from pipeline.cli._exits import EXIT_FINDINGS, EXIT_PARTIAL
from pipeline.cli._options import (
    build_replay_options,
    cluster_options,
    force_option,
    keys_option,
    max_line_option,
    progress_option,
    session_option,
    what_if_options,
)
from pipeline.cli._output import JsonDocument, json_option, json_output
from pipeline.errors import UsageError
from pipeline.io.storage import parse_storage_options, resolve


@click.command()
@click.argument("root")
@click.option("--out", required=True, help="Output location (any fsspec URL or folder).")
@click.option("--baseline", default=None,
              help="Rule set of the baseline replay (default: v1).")
@click.option("--candidate", required=True, help="Rule set of the candidate replay.")
@click.option("--baseline-run", default=None, metavar="PATH",
              help="Compare with this run's committed requests table instead of replaying "
                   "a baseline.")
@click.option("--max-changed", default=None, metavar="N|P%",
              help="Exit 1 when more requests changed (a number, or a percentage of the "
                   "requests compared).")
@click.option("--max-new-overflows", type=click.IntRange(min=0), default=None, metavar="N",
              help="Exit 1 when more requests are newly over their model's window.")
@click.option("--allow-partial", is_flag=True,
              help="Exit 0 when a run compared is partial (still said; default: exit 3).")
@session_option
@what_if_options
@cluster_options
@progress_option
@max_line_option
@force_option
@json_option
@keys_option
def regress(root: str, out: str, baseline: str | None, candidate: str,
            baseline_run: str | None, max_changed: str | None, max_new_overflows: int | None,
            allow_partial: bool,
            session_ids: tuple[str, ...], planner: bool, catalog_path: str | None,
            window: int | None, scheduler: str | None, workers: int | None,
            storage_options: tuple[str, ...], progress: bool | None,
            max_line_bytes: int, as_json: bool) -> None:
    """Replay ROOT under two projection rule sets and compare every request.

    Writes OUT/baseline and OUT/candidate (the two replays), the regression dataset (one
    row per request pair) and OUT/regression-summary.json. Exit 1 when a threshold is
    exceeded.
    """
    with json_output("regress", as_json) as doc:
        _regress(doc, root, out, baseline, candidate, baseline_run, max_changed,
                 max_new_overflows, allow_partial, session_ids, planner, catalog_path, window,
                 scheduler, workers, storage_options, progress, max_line_bytes)


def _regress(doc: JsonDocument, root: str, out: str, baseline: str | None, candidate: str,
             baseline_run: str | None, max_changed: str | None,
             max_new_overflows: int | None, allow_partial: bool,
             session_ids: tuple[str, ...], planner: bool, catalog_path: str | None,
             window: int | None, scheduler: str | None, workers: int | None,
             storage_options: tuple[str, ...], progress: bool | None,
             max_line_bytes: int) -> None:
    from jobs.regression_check import print_regression, regression_job
    from pipeline.replay.regress import Thresholds, parse_change_limit

    if baseline is not None and baseline_run is not None:
        raise UsageError("--baseline and --baseline-run name two baselines: give one")
    options = parse_storage_options(storage_options)
    thresholds = Thresholds(
        parse_change_limit(max_changed) if max_changed is not None else None,
        max_new_overflows)
    base_opts = (None if baseline_run is not None
                 else build_replay_options(baseline or "v1", planner, catalog_path, window, None))
    report = regression_job(
        resolve(root, options), resolve(out, options),
        build_replay_options(candidate, planner, catalog_path, window, None),
        baseline=base_opts,
        baseline_run=resolve(baseline_run, options) if baseline_run is not None else None,
        thresholds=thresholds, sessions=frozenset(session_ids) or None,
        scheduler=scheduler, workers=workers, progress=progress,
        max_line_bytes=max_line_bytes)
    print_regression(report)
    doc.set({"out": report.out, **report.as_dict()})
    if report.partial and not allow_partial:
        sys.exit(EXIT_PARTIAL)  # before the thresholds: a partial comparison proves nothing
    if report.breaches:
        sys.exit(EXIT_FINDINGS)
