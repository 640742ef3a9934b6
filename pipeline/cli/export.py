"""``vakpipe export``: a run's tables in other tools' formats (``otel``: OpenTelemetry)."""

from __future__ import annotations

import re
from datetime import datetime

import click

from pipeline.cli._options import Seconds, prices_option, storage_option
from pipeline.cli._output import json_option, json_output
from pipeline.errors import UsageError


@click.group()
def export() -> None:
    """Export a run's tables in other tools' formats."""


#: An HTTP field name (RFC 9110 token) and a value of visible characters, spaces and tabs.
_FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\U0010ffff]*")


def _header(pairs: tuple[str, ...]) -> dict[str, str] | None:
    from pipeline.io.storage import printable

    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--header wants KEY=VALUE, got '{printable(key)}'…")
        # Refused here, where the message can name it: the exporter would fail each
        # attempt and say only that the endpoint did not take the spans. The value is
        # never shown (a token, often).
        if not _FIELD_NAME.fullmatch(key):
            raise UsageError(f"--header '{printable(key)}': not an HTTP header name")
        if not _FIELD_VALUE.fullmatch(value):
            raise UsageError(f"--header {key}: its value holds a line break or control "
                             "character")
        headers[key] = value
    return headers or None


@export.command()
@click.argument("out")
@click.option("--endpoint", default=None, metavar="URL",
              help="OTLP/HTTP collector: its base URL (http://127.0.0.1:4318; /v1/traces is "
                   "added) or its traces URL.")
@click.option("--file", "file_", default=None, metavar="PATH",
              help="Write the spans instead: OTLP JSON, or Parquet when PATH ends .parquet.")
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE",
              help="A request header for the endpoint (repeatable; default: the SDK's "
                   "OTEL_EXPORTER_OTLP_HEADERS). Never printed.")
@click.option("--timeout", type=Seconds(min=0.1, max=86_400), default=10.0, show_default=True,
              help="Seconds per OTLP request, retries included.")
@click.option("--since", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="First day exported (UTC).")
@click.option("--until", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="Last day exported (UTC).")
@prices_option
@storage_option
@json_option
def otel(out: str, endpoint: str | None, file_: str | None, headers: tuple[str, ...],
         timeout: float, since: datetime | None, until: datetime | None,
         prices_path: str | None, storage_options: tuple[str, ...], as_json: bool) -> None:
    """Export the usage of the run under OUT as OpenTelemetry GenAI spans: one span per
    billed model request, with the gen_ai.usage.* attributes (input tokens inclusive of
    cache) and vakpipe's own vakpipe.cost.* and cache-write split (non-standard).

    Exit 2 when the endpoint does not take them (one line; the spans of earlier
    requests were delivered)."""
    from jobs.export_otel import export_otel, print_export
    from pipeline.io.storage import parse_storage_options, resolve

    with json_output("export-otel", as_json) as doc:
        options = parse_storage_options(storage_options)
        result = export_otel(
            resolve(out, options), endpoint=endpoint,
            dest=resolve(file_, options) if file_ is not None else None,
            headers=_header(headers), timeout=timeout,
            since=since.date() if since else None, until=until.date() if until else None,
            prices=prices_path)
        print_export(result)
        doc.set(result.as_dict())
