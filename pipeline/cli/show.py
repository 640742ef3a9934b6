"""``vakpipe show``: one request of one ledger, as the model received it."""

from __future__ import annotations

import click

from pipeline.cli._options import (
    build_replay_options,
    keys_option,
    max_line_option,
    replay_options,
    storage_option,
)
from pipeline.io.storage import parse_storage_options


@click.command()
@click.argument("session")
@click.option("--scope", required=True, help="The request to show: an iteration tN/iM.")
@replay_options
@storage_option
@click.option("--full", is_flag=True, help="Print every text whole (default: cut long ones).")
@max_line_option
@keys_option
def show(session: str, scope: str, rules: str, planner: bool, catalog_path: str | None,
         window: int | None, storage_options: tuple[str, ...], full: bool,
         max_line_bytes: int) -> None:
    """Print the request at --scope of the ledger SESSION (one file's URL).

    The request as the model received it: its figures, the plan, the prefix and every
    message with its tokens.
    """
    from jobs.replay import show_job

    text = show_job(session, scope,
                    build_replay_options(rules, planner, catalog_path, window, None,
                                    max_line_bytes),
                    storage_options=parse_storage_options(storage_options), full=full)
    click.echo(text)
