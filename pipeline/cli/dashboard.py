"""``vakpipe dashboard``: the fleet dashboard of a nightly output or a run, one HTML page."""

from __future__ import annotations

import click

from pipeline.cli._options import prices_option, storage_option
from pipeline.cli._output import json_option, json_output


@click.command()
@click.argument("out")
@click.option("--html", "html_path", default=None, metavar="FILE",
              help="Where the page goes (any fsspec URL); default OUT/dashboard.html.")
@prices_option
@storage_option
@json_option
def dashboard(out: str, html_path: str | None, prices_path: str | None,
              storage_options: tuple[str, ...], as_json: bool) -> None:
    """Write the fleet dashboard of OUT: a nightly output (one point per date=
    partition) or one run's output. One self-contained page (opens offline):
    integrity findings per night, history breaks, sessions needing packets and the
    tokens they would save, window saturation by model, cost billed / effective / wasted
    by project and day, the top sessions by waste."""
    from jobs.dashboard import dashboard_job, print_dashboard
    from pipeline.io.storage import parse_storage_options, resolve

    with json_output("dashboard", as_json) as doc:
        options = parse_storage_options(storage_options)
        outcome = dashboard_job(
            resolve(out, options),
            html=resolve(html_path, options) if html_path is not None else None,
            prices=prices_path)
        print_dashboard(outcome)
        doc.set(outcome.as_dict())
