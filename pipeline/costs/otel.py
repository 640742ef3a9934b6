"""The ``usage`` table as OpenTelemetry GenAI spans: one row per model request, its
attributes under the GenAI semantic conventions' names. Pure (pyarrow only).

The conventions (``open-telemetry/semantic-conventions-genai``, status Development, as of
:data:`SEMCONV_VERSION`) name the usage attributes; they have no cost attribute and no
5-minute / 1-hour cache-write split, so vakpipe's own are kept beside them under the
``vakpipe.`` prefix (:data:`VAKPIPE_ATTRIBUTES`, documented as non-standard in
docs/otel.md). The IO edge (:mod:`pipeline.io.otel`) turns the rows into SDK spans and
sends them (OTLP/HTTP) or writes them (OTLP JSON, Parquet).

Conventions followed:

- ``gen_ai.usage.input_tokens`` *includes* the cached tokens (read and written), as the
  convention says; vakpipe's ledgers keep them apart (``docs/cost-rules.md``), so it is
  ``input + cache_read + cache_write`` here, and the uncached part is
  ``vakpipe.usage.uncached_input_tokens``.
- One span per billed usage record (every attempt a provider charged, a retry's too),
  copies of one provider request in several files counted once (as ``vakpipe cost``).
- A session is a trace (its id derived from the session's path) and
  ``gen_ai.conversation.id`` its session id; span ids are derived from the record, so an
  export run twice sends the same ids (a backend can deduplicate).
- The ledger has a request's time, not its duration: start and end are that time.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.costs.pricing import PriceTable, TokenUsage, price
from pipeline.costs.report import FAST_SPEED, drop_copies

__all__ = ["GENAI_ATTRIBUTES", "OTEL_SCHEMA", "SEMCONV_VERSION", "VAKPIPE_ATTRIBUTES",
           "otel_table", "provider_name"]

#: The semantic conventions' version the names follow (Parquet metadata, schema URL).
SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

#: The GenAI attributes each span carries, with their Arrow types.
GENAI_ATTRIBUTES: dict[str, pa.DataType] = {
    "gen_ai.operation.name": pa.string(),
    "gen_ai.provider.name": pa.string(),
    "gen_ai.request.model": pa.string(),
    "gen_ai.conversation.id": pa.string(),
    "gen_ai.usage.input_tokens": pa.int64(),
    "gen_ai.usage.output_tokens": pa.int64(),
    "gen_ai.usage.cache_read.input_tokens": pa.int64(),
    "gen_ai.usage.cache_creation.input_tokens": pa.int64(),
}
#: vakpipe's own attributes (not in the conventions): cost, the cache-write split, and
#: where the record comes from.
VAKPIPE_ATTRIBUTES: dict[str, pa.DataType] = {
    "vakpipe.usage.uncached_input_tokens": pa.int64(),
    "vakpipe.usage.cache_creation.5m.input_tokens": pa.int64(),
    "vakpipe.usage.cache_creation.1h.input_tokens": pa.int64(),
    "vakpipe.cost.usd": pa.float64(),
    "vakpipe.cost.input_usd": pa.float64(),
    "vakpipe.cost.output_usd": pa.float64(),
    "vakpipe.cost.cache_read_usd": pa.float64(),
    "vakpipe.cost.cache_creation_usd": pa.float64(),
    "vakpipe.cost.priced": pa.bool_(),
    "vakpipe.cost.long_context_tier": pa.bool_(),
    "vakpipe.request.speed": pa.string(),
    "vakpipe.waste": pa.string(),
    "vakpipe.effective": pa.bool_(),
    "vakpipe.record.kind": pa.string(),
    "vakpipe.agent": pa.string(),
    "vakpipe.source": pa.string(),
    "vakpipe.session_path": pa.string(),
    "vakpipe.entry_id": pa.string(),
    "vakpipe.subagent": pa.string(),
}
#: The span's own fields before the attributes.
_SPAN_FIELDS: list[tuple[str, pa.DataType]] = [
    ("trace_id", pa.string()),  # 32 hex digits
    ("span_id", pa.string()),  # 16 hex digits
    ("name", pa.string()),
    ("start_time_unix_nano", pa.int64()),
    ("end_time_unix_nano", pa.int64()),
]
OTEL_SCHEMA = pa.schema(
    [*_SPAN_FIELDS, *GENAI_ATTRIBUTES.items(), *VAKPIPE_ATTRIBUTES.items()],
    metadata={"otel.semconv.version": SEMCONV_VERSION, "otel.schema_url": SCHEMA_URL,
              "vakpipe.dataset": "otel"})

#: vak's / the transcripts' provider names -> the conventions' well-known values.
_PROVIDERS = {"google": "gcp.gemini", "gemini": "gcp.gemini", "vertex": "gcp.vertex_ai",
              "bedrock": "aws.bedrock", "azure": "azure.ai.openai", "xai": "x_ai",
              "mistral": "mistral_ai"}


def provider_name(provider: str | None) -> str:
    """``gen_ai.provider.name`` of a ledger's provider (``anthropic``, ``openai`` as they
    are; a few renamed to the conventions' values; ``_OTHER`` when unknown)."""
    if not provider:
        return "_OTHER"
    key = provider.strip().lower()
    return _PROVIDERS.get(key, key)


def _digest_hex(*parts: str | None, size: int) -> str:
    h = hashlib.sha256("\x1f".join(p or "" for p in parts).encode("utf-8", "surrogatepass"))
    text = h.hexdigest()[: size * 2]
    # an all-zero id is invalid in OTLP: astronomically unlikely, still never sent
    return text if text.strip("0") else "1".rjust(size * 2, "0")


def otel_table(usage: pa.Table, prices: PriceTable) -> pa.Table:
    """The billed rows of ``usage`` as spans (:data:`OTEL_SCHEMA`), each priced alone.

    Parameters
    ----------
    usage : pyarrow.Table
        Rows of the ``usage`` dataset.
    prices : PriceTable
        Prices each request on its own (a long-context tier is judged per request).

    Returns
    -------
    pyarrow.Table
        One row per billed record, in the table's order; the schema's metadata names the
        semantic conventions' version.
    """
    usage, _ = drop_copies(usage)
    usage = usage.filter(pc.fill_null(usage["billed"], False))
    # Nanoseconds as integers: a datetime has microseconds only.
    usage = usage.set_column(usage.schema.get_field_index("ts"), "ts",
                             usage["ts"].cast(pa.int64()))
    rules: dict[tuple[str | None, str | None], Any] = {}
    out: dict[str, list[Any]] = {name: [] for name in OTEL_SCHEMA.names}
    for r in usage.to_pylist():
        # Negative counts (a damaged ledger) as zero, as the cost report reads them.
        inp, outp, read, write = (max(0, int(r[c] or 0)) for c in (
            "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"))
        one_hour = min(max(0, int(r.get("cache_write_1h_tokens") or 0)), write)
        tokens = TokenUsage(inp, outp, read, write, one_hour)
        key = (r["provider"], r["model"])
        if key not in rules:
            rules[key] = prices.lookup(*key)
        speed = r.get("speed")
        # As the cost report prices it: fast at the rule's fast rates; another speed no
        # rule prices is unpriced, never priced at the standard rates.
        cost = (price(tokens, rules[key]) if speed is None
                else price(tokens, rules[key] if speed == FAST_SPEED else None, fast=True))
        nanos = r["ts"] or 0
        trace = _digest_hex(r["parent_session_path"] or r["session_path"], size=16)
        span = _digest_hex(r["session_path"], r["entry_id"], r["request_id"], r["kind"],
                           str(r["ordinal"]), size=8)
        values: dict[str, Any] = {
            "trace_id": trace, "span_id": span, "name": f"chat {r['model'] or 'unknown'}",
            "start_time_unix_nano": nanos, "end_time_unix_nano": nanos,
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_name(r["provider"]),
            "gen_ai.request.model": r["model"],
            "gen_ai.conversation.id": r["session_id"],
            "gen_ai.usage.input_tokens": tokens.input + tokens.cache_read + tokens.cache_write,
            "gen_ai.usage.output_tokens": tokens.output,
            "gen_ai.usage.cache_read.input_tokens": tokens.cache_read,
            "gen_ai.usage.cache_creation.input_tokens": tokens.cache_write,
            "vakpipe.usage.uncached_input_tokens": tokens.input,
            "vakpipe.usage.cache_creation.5m.input_tokens":
                tokens.cache_write - tokens.cache_write_1h,
            "vakpipe.usage.cache_creation.1h.input_tokens": tokens.cache_write_1h,
            "vakpipe.cost.usd": float(cost.total),
            "vakpipe.cost.input_usd": float(cost.input),
            "vakpipe.cost.output_usd": float(cost.output),
            "vakpipe.cost.cache_read_usd": float(cost.cache_read),
            "vakpipe.cost.cache_creation_usd": float(cost.cache_write),
            "vakpipe.cost.priced": not cost.unknown_model,
            "vakpipe.cost.long_context_tier": cost.tiered,
            "vakpipe.request.speed": speed,
            "vakpipe.waste": r["waste"], "vakpipe.effective": bool(r["effective"]),
            "vakpipe.record.kind": r["kind"], "vakpipe.agent": r["agent"],
            "vakpipe.source": r.get("source") or "vak",
            "vakpipe.session_path": r["session_path"], "vakpipe.entry_id": r["entry_id"],
            "vakpipe.subagent": r.get("subagent"),
        }
        for name, column in out.items():
            column.append(values[name])
    return pa.table({name: pa.array(v, OTEL_SCHEMA.field(name).type)
                     for name, v in out.items()}, schema=OTEL_SCHEMA)
