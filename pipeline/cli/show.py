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
from pipeline.cli._output import json_option, json_output
from pipeline.io.storage import parse_storage_options


@click.command()
@click.argument("session")
@click.option("--scope", required=True, help="The request to show: an iteration tN/iM.")
@replay_options
@storage_option
@click.option("--full", is_flag=True, help="Print every text whole (default: cut long ones).")
@max_line_option
@json_option
@keys_option
def show(session: str, scope: str, rules: str, planner: bool, catalog_path: str | None,
         window: int | None, storage_options: tuple[str, ...], full: bool,
         max_line_bytes: int, as_json: bool) -> None:
    """Print the request at --scope of the ledger SESSION (one file's URL).

    The request as the model received it: its figures, the plan, the prefix and every
    message with its tokens.
    """
    from typing import Any

    from jobs.show import show_job

    with json_output("show", as_json) as doc:
        record: dict[str, Any] = {}
        text = show_job(session, scope,
                        build_replay_options(rules, planner, catalog_path, window, None),
                        storage_options=parse_storage_options(storage_options), full=full,
                        max_line_bytes=max_line_bytes, record=record)
        if as_json:
            # The text printed without --json, a line each, in the document; not twice.
            doc.set({"url": session, "scope": scope, **record, "text": text.split("\n")})
        else:
            click.echo(text)
