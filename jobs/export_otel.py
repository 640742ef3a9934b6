"""The OpenTelemetry export job (``vakpipe export otel``): a run's committed ``usage``
table as GenAI spans, sent to an OTLP/HTTP endpoint or written as OTLP JSON / Parquet.

Thin: the rows are :func:`pipeline.costs.otel.otel_table`, the SDK and the writes
:mod:`pipeline.io.otel`; this module reads the run and prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

import click
import pyarrow as pa
import pyarrow.compute as pc

from jobs.cost_report import usage_run
from pipeline.costs.otel import SEMCONV_VERSION, otel_table
from pipeline.costs.pricing import load_prices
from pipeline.costs.report import check_window, in_window
from pipeline.errors import UsageError
from pipeline.io.commit import check_reader_output
from pipeline.io.files import write_file
from pipeline.io.otel import otlp_json, send_otlp, traces_url, write_parquet
from pipeline.io.storage import Location, shown_url
from pipeline.tables.partial import InputRun

#: The ``--json`` document's schema (docs/otel.md).
SCHEMA = "vakpipe.export-otel/1"


@dataclass(frozen=True)
class OtelExport:
    """What an export sent or wrote."""

    source: InputRun
    spans: int
    sessions: int
    unpriced_spans: int
    #: ``otlp-http``, ``otlp-json`` or ``parquet``.
    format: str
    destination: str

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {"schema": SCHEMA, "semconv_version": SEMCONV_VERSION,
                "input": self.source.as_dict(), "spans": self.spans,
                "sessions": self.sessions, "unpriced_spans": self.unpriced_spans,
                "format": self.format, "destination": self.destination}


def export_otel(out: Location, *, endpoint: str | None = None, dest: Location | None = None,
                headers: Mapping[str, str] | None = None, timeout: float = 10.0,
                since: date | None = None, until: date | None = None,
                prices: str | None = None) -> OtelExport:
    """Export the usage of the run committed under ``out`` as spans.

    Parameters
    ----------
    out : Location
        A run's output (``vakpipe audit --out``, a nightly partition).
    endpoint : str, optional
        An OTLP/HTTP collector (base or traces URL); or ``dest``.
    dest : Location, optional
        A file: Parquet when its name ends ``.parquet``, else OTLP JSON.
    headers : mapping, optional
        Request headers for the endpoint.
    timeout : float
        Seconds per OTLP request, retries included.
    since, until : date, optional
        The days exported (inclusive, UTC).
    prices : str, optional
        A price file or price-source plug-in (as ``vakpipe cost --prices``).

    Raises
    ------
    UsageError
        Neither or both of ``endpoint`` and ``dest``; no usage table.
    TelemetryExportError
        The endpoint did not take the spans.
    """
    if (endpoint is None) == (dest is None):
        raise UsageError("give one of --endpoint URL and --file PATH")
    check_window(since, until)
    if endpoint is not None:
        traces_url(endpoint)  # a malformed URL is refused before anything is read
    run, usage = usage_run(out)
    if dest is not None:  # neither in the archive the run read nor on a run's files
        check_reader_output(run, out, dest, folder=False)
    source = InputRun.of(out.url, run.manifest)
    table = otel_table(in_window(usage, since, until), load_prices(prices))
    resource = {"vakpipe.run_id": source.run_id or ""}
    sessions = len(pc.unique(table["trace_id"])) if table.num_rows else 0
    unpriced = table.num_rows - (pc.sum(table["vakpipe.cost.priced"].cast(pa.int64())).as_py()
                                 or 0)
    if endpoint is not None:
        send_otlp(table, endpoint, headers=headers, timeout=timeout, resource=resource)
        kind, where = "otlp-http", shown_url(traces_url(endpoint))
    else:
        assert dest is not None
        if dest.path.endswith(".parquet"):
            write_parquet(dest, table)
            kind = "parquet"
        else:
            write_file(dest, otlp_json(table, resource))
            kind = "otlp-json"
        where = dest.url
    return OtelExport(source, table.num_rows, sessions, unpriced, kind, where)


def print_export(result: OtelExport) -> None:
    """One line saying what went where (and the warnings of a partial or unpriced run)."""
    if result.source.partial:
        click.echo(f"vakpipe: warning: {result.source.line()}", err=True)
    if result.unpriced_spans:
        click.echo(f"vakpipe: warning: {result.unpriced_spans:,} spans are of models the "
                   "price table does not know: vakpipe.cost.priced=false, cost 0", err=True)
    click.echo(f"otel: {result.spans:,} spans ({result.sessions:,} sessions, GenAI semconv "
               f"{SEMCONV_VERSION}) → {result.destination} ({result.format})")
