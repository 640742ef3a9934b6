"""Smoke test of bench/ccusage_compare.py's independent recount on one real Claude Code
transcript. No npm, no network, no ccusage: only the pure-Python pass over the JSONL."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.data_paths import REAL

REPO = Path(__file__).resolve().parents[2]
ROOT = REAL / "claude-code"
SHORT = ROOT / "projects" / "-home-marco-projects-spotter" / "short.jsonl"

sys.path.insert(0, str(REPO))
try:
    from bench import ccusage_compare as cc
except ImportError as err:  # pragma: no cover - the bench is optional for the suite
    pytest.skip(f"bench.ccusage_compare does not import: {err}", allow_module_level=True)


def test_recount_keeps_the_final_streamed_line_of_one_request() -> None:
    rc = cc.recount_files([SHORT], ROOT)

    # Five assistant lines, one per content block, all one message.id + requestId.
    assert rc.files == ["projects/-home-marco-projects-spotter/short.jsonl"]
    assert len(rc.requests) == 1 and rc.progress_only == [] and rc.unusable == 0
    (r,) = rc.requests
    assert r.key == ("msg_01MKH1ccEGrZGNPvu8pYiiQa", "req_011CY15QS2LGwAeBxdfa6e1V")
    assert r.lines == 5 and r.source == "session" and not r.sidechain
    assert (r.day, r.model) == ("2026-02-10", "claude-opus-4-6")
    # input, output, cache creation, cache read; the whole cache write has a 1-hour TTL
    assert r.tokens == (3, 13, 13835, 11515) and r.cache_1h == 13835
    assert cc.day_totals(cc.by_day(rc.requests)) == {"2026-02-10": (3, 13, 13835, 11515)}


def test_recount_final_first_and_biggest_lines(tmp_path: Path) -> None:
    lines = [json.dumps({
        "type": "assistant", "timestamp": "2026-01-01T10:00:00Z", "requestId": "r1",
        "message": {"id": "m1", "model": "claude-opus-4-6", "usage": {
            "input_tokens": 2, "output_tokens": out, "cache_creation_input_tokens": 5,
            "cache_read_input_tokens": 7}}}) for out in (4, 900, 30)]
    f = tmp_path / "projects" / "p" / "s.jsonl"
    f.parent.mkdir(parents=True)
    f.write_text("\n".join(lines) + "\n")

    assert cc.transcript_files(tmp_path) == [f]
    (r,) = cc.recount(tmp_path).requests
    assert (r.first, r.biggest, r.tokens) == ((2, 4, 5, 7), (2, 900, 5, 7), (2, 30, 5, 7))


def test_recount_prices_one_hour_writes_as_vakpipe_does() -> None:
    from decimal import Decimal

    from pipeline.costs.pricing import TokenUsage, load_prices, price

    (r,) = cc.recount_files([SHORT], ROOT).requests
    rule = load_prices().lookup(cc.PROVIDER, r.model)
    usage = TokenUsage(input=3, output=13, cache_read=11515, cache_write=13835,
                       cache_write_1h=13835)
    at_1h, _ = cc.priced([r], one_hour=True)
    at_5m, _ = cc.priced([r], one_hour=False)
    assert at_1h == {"2026-02-10": float(price(usage, rule).total)}
    # opus 4.6: one-hour writes at $10/M instead of the 5-minute $6.25/M
    assert Decimal(str(at_1h["2026-02-10"] - at_5m["2026-02-10"])).quantize(
        Decimal("1e-8")) == Decimal("0.05188125")
