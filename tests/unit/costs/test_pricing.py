"""The price table and the pricing of token usage (docs/cost-rules.md)."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.costs.pricing import (
    Cost,
    Price,
    PriceTable,
    Rates,
    Tier,
    TokenUsage,
    load_prices,
    load_toml_prices,
    price,
)
from pipeline.errors import PipelineError, UsageError

#: What a report uses: vakpipe's rules over genai-prices (tests/integration/test_price_sources.py).
SHIPPED = load_prices()
#: vakpipe's own rules alone: the overrides genai-prices lacks or gets wrong.
OWN = load_toml_prices()
D = Decimal


def _rates(i: str, o: str, r: str, w: str) -> Rates:
    return Rates(D(i), D(o), D(r), D(w))


FLAT = Price("test", "flat", _rates("3", "15", "0.3", "3.75"))
TIERED = Price("test", "tiered", _rates("3", "15", "0.3", "3.75"),
               Tier(1000, _rates("6", "22.5", "0.6", "7.5")))


def _write(tmp_path: Path, text: str, name: str = "mine.toml") -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


# ---- the shipped table


def test_shipped_table_is_versioned_and_dated() -> None:
    assert SHIPPED.version and isinstance(SHIPPED.as_of, date)
    assert OWN.version and OWN.as_of == SHIPPED.as_of
    # only overrides: a row genai-prices prices the same way is not kept by hand
    assert 0 < len(OWN.rules) < 10


def test_every_generated_model_is_priced() -> None:
    from pipeline.synth.generator import _MODELS

    for provider, model in _MODELS:
        assert SHIPPED.lookup(provider, model) is not None, (provider, model)


@pytest.mark.parametrize(("provider", "model", "input_rate", "tiered"), [
    ("anthropic", "claude-sonnet-4-5", "3", True),
    ("anthropic", "claude-sonnet-4-5-20250929", "3", True),
    ("anthropic", "claude-sonnet-4-20250514", "3", True),
    ("anthropic", "claude-sonnet-4-6", "3", False),
    ("anthropic", "claude-opus-4-1-20250805", "15", False),
    ("anthropic", "claude-opus-4-5", "5", False),
    ("anthropic", "claude-opus-5-5", "4", False),
    ("anthropic", "claude-haiku-4-5-20251001", "1", False),
    ("anthropic", "Claude-Sonnet-4-5", "3", True),  # case-insensitive
    ("anthropic", "claude-opus-4-6", "5", False),
    ("anthropic", "claude-haiku-5-5", "0.1", True),
    ("openai", "gpt-5.3-codex", "1.75", False),
    ("openai", "gpt-5.5", "5", True),              # above 272K prompt tokens
    ("openai", "gpt-5", "1.25", False),
    ("openai", "gpt-5-2025-08-07", "1.25", False),
    ("openai", "gpt-5-mini", "0.25", False),
    ("openai", "gpt-4o-mini", "0.15", False),
    ("openai", "gpt-4o-2024-05-13", "5", False),
    ("ollama", "gemma4:e2b-mlx", "0", False),
])
def test_shipped_rules_for_known_ids(provider: str, model: str, input_rate: str,
                                     tiered: bool) -> None:
    rule = SHIPPED.lookup(provider, model)
    assert rule is not None
    assert rule.base.input == D(input_rate)
    assert (rule.tier is not None) is tiered


def test_openai_rules_charge_no_cache_write_surcharge() -> None:
    rule = SHIPPED.lookup("openai", "gpt-5")
    assert rule is not None
    assert rule.base.cache_write == rule.base.input
    assert rule.base.cache_read == D("0.125")


@pytest.mark.parametrize(("provider", "model"), [
    ("openai", "gpt-5.5-mini"),            # a variant the table does not name
    ("anthropic", "gpt-5"),                # the model, from another provider
    ("openrouter", "anthropic/claude-nonexistent-9"),
    (None, "gpt-5"),                       # no provider: only provider "*" rules match
    ("anthropic", ""),
    ("anthropic", None),
])
def test_unknown_models_are_not_priced(provider: str | None, model: str | None) -> None:
    assert SHIPPED.lookup(provider, model) is None


# ---- files: override, precedence, validation


def test_override_rules_come_first(tmp_path: Path) -> None:
    f = _write(tmp_path, '[[model]]\nprovider = "anthropic"\npattern = "claude-*"\n'
                         'input = 1\noutput = 2\n')
    mine = load_prices(f)
    rule = mine.lookup("anthropic", "claude-sonnet-4-5")
    assert rule is not None and rule.base.input == D(1) and rule.tier is None
    assert mine.lookup("openai", "gpt-5") == SHIPPED.lookup("openai", "gpt-5")
    assert mine.version == f"{SHIPPED.version}+mine.toml"
    assert mine.as_of == SHIPPED.as_of


def test_first_matching_rule_wins_and_provider_must_match(tmp_path: Path) -> None:
    f = _write(tmp_path, """
[[model]]
provider = "acme"
pattern = "m-large*"
input = 9
output = 9
[[model]]
provider = "acme"
pattern = "m-*"
input = 1
output = 1
[[model]]
provider = "*"
pattern = "m-*"
input = 5
output = 5
""")
    t = load_toml_prices(f)
    assert [t.lookup("acme", m).base.input for m in ("m-large-2", "m-small")] == [9, 1]  # type: ignore[union-attr]
    other = t.lookup("other", "m-large-2")
    assert other is not None and other.base.input == 5
    no_provider = t.lookup(None, "m-small")
    assert no_provider is not None and no_provider.base.input == 5


def test_omitted_cache_rates_are_the_input_rate(tmp_path: Path) -> None:
    f = _write(tmp_path, '[[model]]\nprovider = "p"\npattern = "m"\ninput = 2.5\noutput = 10\n')
    rule = load_prices(f).lookup("p", "m")
    assert rule is not None
    assert rule.base == _rates("2.5", "10", "2.5", "2.5")


_GOOD = 'provider = "p"\npattern = "m"\ninput = 3\noutput = 15\n'


@pytest.mark.parametrize(("text", "names"), [
    ('[[model]]\nprovider = "p"\npattern = "m"\noutput = 15\n', "missing key 'input'"),
    ('[[model]]\npattern = "m"\ninput = 3\noutput = 15\n', "missing key 'provider'"),
    (f'[[model]]\n{_GOOD}cache_read = "cheap"\n', "'cache_read'"),
    (f'[[model]]\n{_GOOD}cache_write = -1\n', "'cache_write'"),
    (f'[[model]]\n{_GOOD}cache_read = nan\n', "'cache_read'"),
    (f'[[model]]\n{_GOOD}cache_read = true\n', "'cache_read'"),
    (f'[[model]]\n{_GOOD}cache_raed = 0.3\n', "'cache_raed'"),
    ('[[model]]\nprovider = "p"\npattern = ""\ninput = 3\noutput = 15\n', "'pattern'"),
    (f'[[model]]\n{_GOOD}[model.tier]\ninput = 6\noutput = 30\n', "'tier.above'"),
    (f'[[model]]\n{_GOOD}[model.tier]\nabove = 0\ninput = 6\noutput = 30\n', "'tier.above'"),
    (f'[[model]]\n{_GOOD}[model.tier]\nabove = 10\ninput = 1\noutput = 30\n', "'tier.input'"),
    (f'[[model]]\n{_GOOD}[model.tier]\nabove = 10\ninput = 6\noutput = 30\nextra = 1\n',
     "'tier.extra'"),
    (f'[[model]]\n{_GOOD}tier = 5\n', "'tier'"),
    ("model = 3\n", "'model'"),
    ("model = [1]\n", "#1"),
    ("not toml [", "cannot read price table"),
])
def test_bad_files_raise_usage_errors_naming_file_and_key(tmp_path: Path, text: str,
                                                          names: str) -> None:
    f = _write(tmp_path, f'[[model]]\n{_GOOD}\n{text}' if text.startswith("[[") else text,
               "bad-prices.toml")
    with pytest.raises(UsageError) as info:
        load_prices(f)
    assert isinstance(info.value, PipelineError) and isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "bad-prices.toml" in msg and names in msg, msg
    if text.startswith("[["):
        assert "[[model]] #2" in msg  # the bad entry, not the good one before it


def test_missing_override_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"nope\.toml"):
        load_prices(tmp_path / "nope.toml")


# ---- pricing


def test_each_token_kind_has_its_own_rate() -> None:
    c = price(TokenUsage(100, 10, 200, 40), FLAT)
    # 100 * 3/M, 10 * 15/M, 200 * 0.3/M, 40 * 3.75/M
    assert (c.input, c.output, c.cache_read, c.cache_write) == (
        D("0.0003"), D("0.00015"), D("0.00006"), D("0.00015"))
    assert c.total == D("0.00066") and not c.unknown_model and not c.tiered
    assert price(TokenUsage(cache_read=1_000_000), FLAT).total == D("0.3")
    assert price(TokenUsage(cache_write=1_000_000), FLAT).total == D("3.75")


def test_tier_applies_strictly_above_the_threshold_to_the_whole_request() -> None:
    at = price(TokenUsage(400, 1000, 500, 100), TIERED)      # prompt = 1000 exactly
    above = price(TokenUsage(401, 1000, 500, 100), TIERED)   # prompt = 1001
    assert not at.tiered and at.output == D("0.015")
    assert above.tiered
    assert (above.input, above.output, above.cache_read, above.cache_write) == (
        D("0.002406"), D("0.0225"), D("0.0003"), D("0.00075"))


def test_tier_threshold_counts_cache_tokens_not_output() -> None:
    assert price(TokenUsage(1, 0, 1000, 0), TIERED).tiered
    assert not price(TokenUsage(1, 10_000, 0, 0), TIERED).tiered


def test_unknown_model_is_flagged_with_zero_amounts() -> None:
    c = price(TokenUsage(10, 10, 10, 10), None)
    assert c.unknown_model and c.total == 0
    total = price(TokenUsage(10, 10), FLAT) + c
    assert total.unknown_model and total.total == price(TokenUsage(10, 10), FLAT).total


def test_sums_are_exact_decimals() -> None:
    one = price(TokenUsage(cache_read=1), FLAT)  # 0.3 micro-dollars
    total = sum((one for _ in range(10)), Cost())
    assert total.total == D("0.000003")
    assert total.as_floats()["total"] == pytest.approx(3e-6)


def test_usage_from_ledger_and_audit_tuples() -> None:
    u = TokenUsage.from_ledger({"input_tokens": 5, "output_tokens": 7,
                                "cache_read_input_tokens": 100,
                                "cache_creation_input_tokens": 20})
    assert u == TokenUsage(5, 7, 100, 20) and u.prompt == 125
    assert TokenUsage.from_ledger({"input_tokens": 5, "output_tokens": 7}) == TokenUsage(5, 7)
    assert TokenUsage.from_ledger({"input_tokens": -1}) is None
    assert TokenUsage.from_ledger("x") is None
    assert TokenUsage.of(u.as_tuple()) == u
    with pytest.raises(UsageError):
        TokenUsage(-1)


def test_any_price_table_will_do() -> None:
    class OnePrice:
        def lookup(self, provider: str | None, model: str | None) -> Price | None:
            return FLAT if model == "flat" else None

    table: PriceTable = OnePrice()
    assert price(TokenUsage(1_000_000), table.lookup("test", "flat")).total == 3
    assert price(TokenUsage(1), table.lookup("test", "other")).unknown_model


# ---- properties

_counts = st.integers(0, 3_000_000)
_usages = st.builds(TokenUsage, _counts, _counts, _counts, _counts)


@given(_usages, st.sampled_from(["input", "output", "cache_read", "cache_write"]),
       st.integers(0, 3_000_000))
def test_cost_is_monotone_in_every_token_count(u: TokenUsage, kind: str, more: int) -> None:
    bigger = TokenUsage(**{k: getattr(u, k) + (more if k == kind else 0)
                           for k in ("input", "output", "cache_read", "cache_write")})
    for rule in (FLAT, TIERED):  # TIERED's threshold is crossed often at these sizes
        assert price(bigger, rule).total >= price(u, rule).total


@given(_usages, _usages)
def test_cost_is_additive_within_one_rate_set(a: TokenUsage, b: TokenUsage) -> None:
    assert price(a + b, FLAT) == price(a, FLAT) + price(b, FLAT)


def test_a_tier_is_judged_per_request_not_on_sums() -> None:
    a = TokenUsage(600)
    assert price(a, TIERED) + price(a, TIERED) != price(a + a, TIERED)
