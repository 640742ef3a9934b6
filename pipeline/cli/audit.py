"""``vakpipe audit`` and ``vakpipe replay``: an archive into integrity (and replay) tables."""

from __future__ import annotations

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
    scope_option,
    session_option,
)
from pipeline.cli._output import json_option, json_output
from pipeline.io.storage import parse_storage_options, resolve


@click.command()
@click.argument("root")
@click.option("--out", required=True, help="Output location (any fsspec URL or folder).")
@cluster_options
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default=None,
              help="Exit 1 when any session has a finding of this severity or worse "
                   "(a partial run exits 3 first).")
@progress_option
@click.option("--replay", is_flag=True,
              help="Also replay every request (turns and requests tables), one read per file.")
@replay_options
@scope_option
@max_line_option
@force_option
@json_option
@keys_option
def audit(root: str, out: str, scheduler: str | None, workers: int | None,
          storage_options: tuple[str, ...], fail_on: str | None, progress: bool | None,
          replay: bool, rules: str, planner: bool, catalog_path: str | None,
          window: int | None, scope: str | None, max_line_bytes: int, as_json: bool) -> None:
    """Verify every session ledger under ROOT and write integrity tables under OUT."""
    from jobs.audit import audit_job, print_summary, summary_json

    with json_output("audit", as_json) as doc:
        options = parse_storage_options(storage_options)
        replay_opts = None
        if replay or planner or scope or window or catalog_path or rules != "v1":
            replay_opts = build_replay_options(rules, planner, catalog_path, window, scope)
        summary = audit_job(resolve(root, options), resolve(out, options), replay_opts,
                            scheduler=scheduler, workers=workers, progress=progress,
                            max_line_bytes=max_line_bytes)
        print_summary(summary)
        doc.set(summary_json(summary))
        exit_on(fail_on, summary)



@click.command()
@click.argument("root")
@click.option("--out", required=True, help="Output location (any fsspec URL or folder).")
@session_option
@replay_options
@scope_option
@cluster_options
@progress_option
@max_line_option
@force_option
@json_option
@keys_option
def replay(root: str, out: str, session_ids: tuple[str, ...], rules: str, planner: bool,
           catalog_path: str | None, window: int | None, scope: str | None,
           scheduler: str | None, workers: int | None, storage_options: tuple[str, ...],
           progress: bool | None, max_line_bytes: int, as_json: bool) -> None:
    """Replay every session under ROOT (or --session ones) into tables under OUT.

    Writes what `audit --replay` writes: integrity/sessions, integrity/findings, turns
    and requests.
    """
    from jobs.audit import audit_job, print_replay_summary, summary_json

    with json_output("replay", as_json) as doc:
        options = parse_storage_options(storage_options)
        summary = audit_job(resolve(root, options), resolve(out, options),
                            build_replay_options(rules, planner, catalog_path, window, scope),
                            sessions=frozenset(session_ids) or None, scheduler=scheduler,
                            workers=workers, progress=progress, max_line_bytes=max_line_bytes)
        print_replay_summary(summary)
        doc.set(summary_json(summary))
        exit_on(None, summary)
