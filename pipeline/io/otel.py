"""OpenTelemetry's SDK at the IO edge: the ``otel`` rows (:mod:`pipeline.costs.otel`) as
spans, sent over OTLP/HTTP or written as OTLP JSON or Parquet.

The spans are the SDK's own :class:`~opentelemetry.sdk.trace.ReadableSpan` objects
(ids, times and attributes given, not generated), encoded by the OTLP exporter's encoder:
the file written and the request sent hold the same ``ExportTraceServiceRequest``.
The SDK is imported when an export runs, never by the audit.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.costs.otel import SCHEMA_URL
from pipeline.errors import TelemetryExportError, UsageError
from pipeline.io.files import write_file
from pipeline.io.storage import Location, printable, shown_url

__all__ = ["BATCH", "otlp_json", "send_otlp", "spans", "traces_url", "write_parquet"]

#: Spans per OTLP request: well under a collector's default 4 MiB message limit.
BATCH = 512
#: The instrumentation scope the spans are under.
SCOPE = "vakpipe.export.otel"
_SPAN_COLUMNS = ("trace_id", "span_id", "name", "start_time_unix_nano", "end_time_unix_nano")


@functools.cache
def _vakpipe_version() -> str:
    try:
        return version("vakpipe")
    except PackageNotFoundError:
        return "unknown"


def _sdk() -> Any:
    try:
        from opentelemetry.sdk import trace
    except ImportError as err:
        raise UsageError("the OpenTelemetry export needs opentelemetry-sdk and "
                         "opentelemetry-exporter-otlp-proto-http: pip install "
                         "'opentelemetry-sdk>=1.27' 'opentelemetry-exporter-otlp-proto-http"
                         ">=1.27'") from err
    return trace


@functools.cache
def _base_resource() -> Any:
    """The process's resource (the SDK's detectors run once: ``telemetry.sdk.*``,
    ``service.instance.id``), with ``service.name=vakpipe`` and its version."""
    _sdk()
    from opentelemetry.sdk.resources import Resource

    return Resource.create({"service.name": "vakpipe", "service.version": _vakpipe_version()},
                           schema_url=SCHEMA_URL)


def _resource(extra: Mapping[str, str] | None) -> Any:
    from opentelemetry.sdk.resources import Resource

    base = _base_resource()
    return base.merge(Resource(dict(extra), SCHEMA_URL)) if extra else base


def spans(table: pa.Table, resource: Mapping[str, str] | None = None) -> list[Any]:
    """The rows of an ``otel`` table as SDK spans (kind CLIENT, status unset).

    Parameters
    ----------
    table : pyarrow.Table
        :data:`pipeline.costs.otel.OTEL_SCHEMA` rows.
    resource : mapping, optional
        Extra resource attributes (``service.name`` is ``vakpipe``).
    """
    sdk_trace = _sdk()
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

    res = _resource(resource)
    scope = InstrumentationScope(SCOPE, _vakpipe_version(), SCHEMA_URL)
    out = []
    for row in table.to_pylist():
        context = SpanContext(int(row["trace_id"], 16), int(row["span_id"], 16),
                              is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        # An attribute with no value is left out (OTLP has no null).
        attributes = {k: v for k, v in row.items() if k not in _SPAN_COLUMNS and v is not None}
        out.append(sdk_trace.ReadableSpan(
            name=row["name"], context=context, resource=res, attributes=attributes,
            kind=SpanKind.CLIENT, instrumentation_scope=scope,
            start_time=row["start_time_unix_nano"], end_time=row["end_time_unix_nano"]))
    return out


def _any_value(v: Any) -> dict[str, Any]:
    """An OTLP JSON ``AnyValue`` (64-bit integers as strings, as protobuf's JSON)."""
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": str(v)}


def _key_values(items: Iterable[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in items if v is not None]


def otlp_json(table: pa.Table, resource: Mapping[str, str] | None = None) -> bytes:
    """The spans as one OTLP JSON ``ExportTraceServiceRequest`` (the OTLP/HTTP JSON body:
    ids in hex, enums as numbers, 64-bit integers as strings).

    Written straight from the rows: the same document as the SDK's protobuf request
    (:func:`spans` through the OTLP encoder) turned into JSON, which
    tests/integration/test_otel_export.py checks, at a fraction of the time (protobuf's JSON
    writer was most of an export to a file).
    """
    res = _resource(resource)
    out = []
    for row in table.to_pylist():
        out.append({
            "traceId": row["trace_id"], "spanId": row["span_id"], "name": row["name"],
            "kind": 3,  # SPAN_KIND_CLIENT
            "startTimeUnixNano": str(row["start_time_unix_nano"]),
            "endTimeUnixNano": str(row["end_time_unix_nano"]),
            "attributes": _key_values((k, v) for k, v in row.items()
                                      if k not in _SPAN_COLUMNS),
            "status": {},
            # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK: the parent is known not remote
            "flags": 256})
    doc: dict[str, Any] = {"resourceSpans": [{
        "resource": {"attributes": _key_values(res.attributes.items())},
        "scopeSpans": [{"scope": {"name": SCOPE, "version": _vakpipe_version()},
                        "spans": out, "schemaUrl": SCHEMA_URL}],
        "schemaUrl": SCHEMA_URL}] if out else []}
    return (json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8")


def traces_url(endpoint: str) -> str:
    """``endpoint`` as the traces URL: a base URL (no path, as
    ``OTEL_EXPORTER_OTLP_ENDPOINT``) gets ``/v1/traces``; a URL with a path is kept.

    Raises
    ------
    UsageError
        Not an http(s) URL with a host.
    """
    try:  # urlsplit refuses a broken [IPv6] host; .port an out-of-range or non-number one
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError as err:
        raise UsageError(f"--endpoint '{printable(shown_url(endpoint))}': {err}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise UsageError(f"--endpoint '{printable(shown_url(endpoint))}': not an http(s) URL")
    path = parts.path if parts.path not in ("", "/") else "/v1/traces"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


@contextmanager
def _quiet_sdk() -> Iterator[None]:
    """The exporter logs each failed attempt (a traceback at times): the command says
    what failed in one line instead."""
    log = logging.getLogger("opentelemetry")
    level, propagate = log.level, log.propagate
    log.setLevel(logging.CRITICAL + 1)
    log.propagate = False
    try:
        yield
    finally:
        log.setLevel(level)
        log.propagate = propagate


def send_otlp(table: pa.Table, endpoint: str, *, headers: Mapping[str, str] | None = None,
              timeout: float = 10.0, resource: Mapping[str, str] | None = None,
              batch: int | None = None) -> int:
    """Send the rows as spans to an OTLP/HTTP (protobuf) endpoint, ``batch`` per request.

    Parameters
    ----------
    table : pyarrow.Table
        ``otel`` rows.
    endpoint : str
        The collector's base URL (``http://127.0.0.1:4318``) or its traces URL.
    headers : mapping, optional
        Request headers (an API key: never printed); default: the SDK's
        ``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS``.
    timeout : float
        Seconds the exporter may spend on one request, its retries included.
    batch : int, optional
        Spans per request (default :data:`BATCH`).

    Returns
    -------
    int
        Spans delivered.

    Raises
    ------
    TelemetryExportError
        A request was not taken; the spans of the earlier requests were delivered.
    """
    _sdk()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    url = traces_url(endpoint)
    exporter: Any = OTLPSpanExporter(endpoint=url, headers=dict(headers) if headers else None,
                                timeout=timeout)
    batch = batch or BATCH
    sent = 0
    try:
        with _quiet_sdk():
            for start in range(0, table.num_rows, batch):
                part = spans(table.slice(start, batch), resource)
                if exporter.export(part) is not SpanExportResult.SUCCESS:
                    raise TelemetryExportError(
                        f"OTLP endpoint {printable(shown_url(url))} did not take the spans "
                        f"({sent:,} of {table.num_rows:,} delivered before): unreachable, "
                        "or it answered an error status")
                sent += len(part)
    finally:
        exporter.shutdown()
    return sent


def write_parquet(dest: Location, table: pa.Table) -> None:
    """Write the ``otel`` table as one Parquet file (the semconv version in its
    metadata, kept from the schema)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    write_file(dest, sink.getvalue().to_pybytes())
