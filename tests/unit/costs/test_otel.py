"""The ``usage`` rows as GenAI spans (:mod:`pipeline.costs.otel`): the conventions'
names and their token arithmetic, vakpipe's own attributes, stable ids."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.costs.otel import (
    GENAI_ATTRIBUTES,
    OTEL_SCHEMA,
    SEMCONV_VERSION,
    otel_table,
    provider_name,
)
from pipeline.costs.pricing import Price, Rates, TomlPriceTable
from pipeline.tables.schemas import USAGE_SCHEMA

PRICES = TomlPriceTable((Price("anthropic", "claude-*", Rates(
    Decimal(3), Decimal(15), Decimal("0.3"), Decimal("3.75"), Decimal(6))),))


def row(i: int = 0, **kw: Any) -> dict[str, Any]:
    base = {"session_path": "s/a.jsonl", "session_id": "sid-a", "agent": "vak",
            "entry_id": f"e{i}", "request_id": f"e{i}", "kind": "message", "ordinal": 0,
            "winning": True, "ts": 1_790_000_000_123_456_789 + i, "day": None,
            "provider": "anthropic", "model": "claude-x", "on_active_chain": True,
            "input_tokens": 100, "output_tokens": 10, "cache_read_tokens": 1000,
            "cache_write_tokens": 50, "cache_write_1h_tokens": 20, "billed": True,
            "effective": True, "waste": None, "source": "claude-code"}
    base.update(kw)
    return base


def usage(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=USAGE_SCHEMA)


def test_input_tokens_include_the_cache_as_the_convention_says() -> None:
    [span] = otel_table(usage([row()]), PRICES).to_pylist()
    assert span["gen_ai.usage.input_tokens"] == 100 + 1000 + 50
    assert span["gen_ai.usage.cache_read.input_tokens"] == 1000
    assert span["gen_ai.usage.cache_creation.input_tokens"] == 50
    assert span["gen_ai.usage.output_tokens"] == 10
    assert span["vakpipe.usage.uncached_input_tokens"] == 100
    assert (span["vakpipe.usage.cache_creation.5m.input_tokens"],
            span["vakpipe.usage.cache_creation.1h.input_tokens"]) == (30, 20)
    assert (span["gen_ai.provider.name"], span["gen_ai.request.model"],
            span["gen_ai.conversation.id"], span["gen_ai.operation.name"]) == \
        ("anthropic", "claude-x", "sid-a", "chat")
    # $3 in, $15 out, $0.3 read, $3.75 5-minute and $6 one-hour writes, per million
    want = (100 * 3 + 10 * 15 + 1000 * 0.3 + 30 * 3.75 + 20 * 6) / 1e6
    assert span["vakpipe.cost.usd"] == pytest.approx(want)
    assert span["vakpipe.cost.priced"] is True
    assert span["start_time_unix_nano"] == 1_790_000_000_123_456_789  # to the nanosecond
    assert span["name"] == "chat claude-x"


def test_unbilled_rows_are_no_spans_and_unknown_models_are_unpriced() -> None:
    rows = [row(0), row(1, billed=False, kind="mirror"), row(2, model="mystery-1"),
            row(3, waste="retry", effective=False)]
    spans = otel_table(usage(rows), PRICES).to_pylist()
    assert [s["vakpipe.entry_id"] for s in spans] == ["e0", "e2", "e3"]
    assert spans[1]["vakpipe.cost.priced"] is False and spans[1]["vakpipe.cost.usd"] == 0
    assert spans[2]["vakpipe.waste"] == "retry" and spans[2]["vakpipe.effective"] is False


def test_ids_are_stable_and_a_session_is_one_trace() -> None:
    rows = [row(0), row(1), row(2, session_path="s/b.jsonl", session_id="sid-b")]
    one, two = (otel_table(usage(rows), PRICES).to_pylist() for _ in range(2))
    assert [s["span_id"] for s in one] == [s["span_id"] for s in two]
    assert len({s["span_id"] for s in one}) == 3
    assert one[0]["trace_id"] == one[1]["trace_id"] != one[2]["trace_id"]
    assert all(len(s["trace_id"]) == 32 and len(s["span_id"]) == 16 for s in one)


def test_the_schema_names_the_semconv_version() -> None:
    table = otel_table(usage([]), PRICES)
    assert table.num_rows == 0 and table.schema == OTEL_SCHEMA
    assert table.schema.metadata[b"otel.semconv.version"] == SEMCONV_VERSION.encode()


def test_the_names_are_the_conventions_own() -> None:
    gen_ai = pytest.importorskip(
        "opentelemetry.semconv._incubating.attributes.gen_ai_attributes")
    theirs = {getattr(gen_ai, n) for n in dir(gen_ai) if n.startswith("GEN_AI_")}
    assert set(GENAI_ATTRIBUTES) <= theirs
    assert provider_name("anthropic") == gen_ai.GenAiProviderNameValues.ANTHROPIC.value
    assert provider_name("google") == gen_ai.GenAiProviderNameValues.GCP_GEMINI.value
    assert provider_name(None) == "_OTHER"


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(*(st.one_of(st.none(), st.integers(-5, 10**9)) for _ in range(5))),
                max_size=8))
def test_any_counts_make_consistent_spans(counts: list[tuple[int | None, ...]]) -> None:
    rows = [row(i, input_tokens=a, output_tokens=b, cache_read_tokens=c, cache_write_tokens=d,
                cache_write_1h_tokens=e) for i, (a, b, c, d, e) in enumerate(counts)]
    for s in otel_table(usage(rows), PRICES).to_pylist():
        assert s["gen_ai.usage.input_tokens"] == (
            s["vakpipe.usage.uncached_input_tokens"] + s["gen_ai.usage.cache_read.input_tokens"]
            + s["gen_ai.usage.cache_creation.input_tokens"])
        assert s["gen_ai.usage.cache_creation.input_tokens"] == (
            s["vakpipe.usage.cache_creation.5m.input_tokens"]
            + s["vakpipe.usage.cache_creation.1h.input_tokens"])
        assert min(v for k, v in s.items() if k.endswith("tokens")) >= 0
