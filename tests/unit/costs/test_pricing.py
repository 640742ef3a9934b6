"""The price table and the pricing of token usage (docs/cost-rules.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.costs import pricing
from pipeline.costs.pricing import (
    Cost,
    Price,
    PriceCache,
    PriceTable,
    Rates,
    Tier,
    TokenUsage,
    load_genai_prices,
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
#: Claude Opus 4.8's rates (genai-prices), with a tier to show a fast request ignores it.
FAST = Price("test", "fast", Rates(D(5), D(25), D("0.5"), D("6.25"), D(10)),
             Tier(1000, Rates(D(10), D("37.5"), D(1), D("12.5"), D(20))),
             Rates(D(10), D(50), D(1), D("12.5"), D(20)))


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
    (f'[[model]]\n{_GOOD}[model.fast]\noutput = 30\n', "missing key 'fast.input'"),
    (f'[[model]]\n{_GOOD}[model.fast]\ninput = 6\noutput = 30\nabove = 10\n', "'fast.above'"),
    (f'[[model]]\n{_GOOD}[model.fast]\ninput = 6\noutput = 30\ncache_raed = 1\n',
     "'fast.cache_raed'"),
    (f'[[model]]\n{_GOOD}[model.fast]\ninput = 6\noutput = 30\ncache_read = -1\n',
     "'fast.cache_read'"),
    (f'[[model]]\n{_GOOD}fast = 5\n', "'fast'"),
    (f'[[model]]\n{_GOOD}[model.fast]\ninput = 2\noutput = 30\n', "'fast.input'"),
    (f'[[model]]\n{_GOOD}[model.fast]\ninput = 6\noutput = 14\n', "'fast.output'"),
    (f'[[model]]\n{_GOOD}cache_read = 0.3\n[model.fast]\ninput = 6\noutput = 30\n'
     'cache_read = 0.2\n', "'fast.cache_read'"),
    (f'[[model]]\n{_GOOD}cache_write_1h = 6\n[model.fast]\ninput = 6\noutput = 30\n'
     'cache_write_1h = 5\n', "'fast.cache_write_1h'"),
    ("model = 3\n", "'model'"),
    # a misspelt table or an empty file: read as no rule, silently, until 2026-12-07
    ('[models.x]\ninput = 1\n', "unknown key 'models'"),
    ('version = "mine"\n[[modle]]\npattern = "x"\n', "unknown key 'modle'"),
    ('as_of = 2026-01-01\n', "no [[model]] rule"),
    ("", "no [[model]] rule"),
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


def test_a_fast_table_gives_the_rules_fast_rates(tmp_path: Path) -> None:
    f = _write(tmp_path, f"""[[model]]
{_GOOD}cache_read = 0.3
cache_write = 3.75
cache_write_1h = 6
[model.tier]
above = 200000
input = 6
output = 22.5
[model.fast]
input = 18
output = 90
cache_read = 1.8
cache_write = 22.5
cache_write_1h = 36
""")
    rule = load_toml_prices(f).lookup("p", "m")
    assert rule is not None and rule.tier is not None
    assert rule.fast == Rates(D(18), D(90), D("1.8"), D("22.5"), D(36))
    assert rule.base == Rates(D(3), D(15), D("0.3"), D("3.75"), D(6))


def test_omitted_fast_rates_default_as_the_base_ones_do(tmp_path: Path) -> None:
    f = _write(tmp_path, f"[[model]]\n{_GOOD}cache_read = 0.3\n[model.fast]\n"
                         "input = 6\noutput = 30\n")
    rule = load_toml_prices(f).lookup("p", "m")
    # cache rates from the fast input, as the base's come from the base input
    assert rule is not None and rule.fast == Rates(D(6), D(30), D(6), D(6), None)
    plain = load_toml_prices(_write(tmp_path, f"[[model]]\n{_GOOD}", "plain.toml"))
    assert plain.lookup("p", "m").fast is None  # type: ignore[union-attr]


def test_a_cheaper_fast_rate_says_why(tmp_path: Path) -> None:
    f = _write(tmp_path, f"[[model]]\n{_GOOD}cache_write_1h = 6\n[model.fast]\n"
                         "input = 4\noutput = 30\n", "cheap.toml")
    # the fast one-hour rate is omitted: the fast write rate, 4, below the base's 6
    with pytest.raises(UsageError, match=r"'fast\.cache_write_1h' \(4\) \(omitted: the fast "
                                         r"cache_write rate\) is below 'cache_write_1h' \(6\): "
                                         r"a fast rate may not be cheaper"):
        load_toml_prices(f)


def test_the_shipped_fast_rates() -> None:
    opus_48 = SHIPPED.lookup("anthropic", "claude-opus-4-8")
    assert opus_48 is not None  # genai-prices' `speed: fast` variant
    assert opus_48.fast == Rates(D(10), D(50), D(1), D("12.5"), D(20))
    assert opus_48.base == Rates(D(5), D(25), D("0.5"), D("6.25"), D(10))
    sonnet = SHIPPED.lookup("anthropic", "claude-sonnet-4-6")
    assert sonnet is not None and sonnet.fast is None  # no fast mode


@pytest.mark.parametrize("model", ["claude-opus-4-6", "claude-opus-4-6-20260205"])
def test_opus_4_6_fast_is_6x_and_its_standard_rates_are_genai_prices(model: str) -> None:
    rule = SHIPPED.lookup("anthropic", model)
    assert rule is not None and rule == OWN.lookup("anthropic", model)  # vakpipe's rule
    assert rule.fast == Rates(D(30), D(150), D(3), D("37.5"), D(60))
    assert OWN.as_of is not None
    genai = load_genai_prices(OWN.as_of).lookup("anthropic", model)
    assert genai is not None and genai.fast is None  # why the rule is kept here
    assert (rule.base, rule.tier) == (genai.base, genai.tier)
    assert rule.base == Rates(D(5), D(25), D("0.5"), D("6.25"), D(10)) and rule.tier is None


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


def test_a_fast_request_is_priced_at_the_fast_rates_whatever_its_prompt() -> None:
    u = TokenUsage(100, 10, 200, 40, 16)  # prompt 340: below the tier
    c = price(u, FAST, fast=True)
    # 100 * 10/M, 10 * 50/M, 200 * 1/M, 24 * 12.5/M + 16 * 20/M (one-hour writes)
    assert (c.input, c.output, c.cache_read, c.cache_write) == (
        D("0.001"), D("0.0005"), D("0.0002"), D("0.00062"))
    assert c.total == D("0.00232") and not c.unknown_model and not c.tiered
    big = TokenUsage(2000, 10, 0, 0)  # above the tier: still the fast rates, not tiered
    assert price(big, FAST).tiered
    c = price(big, FAST, fast=True)
    assert (c.input, c.output, c.tiered) == (D("0.02"), D("0.0005"), False)
    # one-hour writes without a fast one-hour rate: the fast write rate
    no_hour = replace(FAST, fast=_rates("10", "50", "1", "12.5"))
    assert price(TokenUsage(cache_write=40, cache_write_1h=16), no_hour,
                 fast=True).cache_write == D("0.0005")


def test_a_fast_request_without_fast_rates_is_unpriced_not_standard() -> None:
    for rule in (FLAT, TIERED, None):
        c = price(TokenUsage(10, 10, 10, 10), rule, fast=True)
        assert c.unknown_model and c.total == 0 and not c.tiered


def test_fast_false_is_the_standard_price() -> None:
    u = TokenUsage(2000, 10, 300, 40, 16)
    standard = replace(FAST, fast=None)
    assert price(u, FAST) == price(u, FAST, fast=False) == price(u, standard)
    assert price(u, FLAT, fast=False) == price(u, FLAT)


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


# ---- the cache of genai-prices' resolved rules


def _cache(folder: Path) -> PriceCache:
    assert OWN.as_of is not None
    return PriceCache.open(folder, OWN.as_of)


def test_the_price_cache_keeps_fast_rates(tmp_path: Path) -> None:
    rules = {"flat": FLAT, "tiered": TIERED, "fast": FAST, "none": None,
             "shipped": SHIPPED.lookup("anthropic", "claude-opus-4-8")}
    assert rules["shipped"] is not None and rules["shipped"].fast is not None
    cache = _cache(tmp_path)
    for model, rule in rules.items():
        cache.put("test", model, rule)
    cache.save("0.2.3")
    again = _cache(tmp_path)
    assert again.path == cache.path and again.version == "0.2.3"
    for model, rule in rules.items():
        assert again.get("test", model) == (True, rule), model
    raw = json.loads(again.path.read_text())  # type: ignore[union-attr]
    assert raw["prices"]["test\tflat"]["fast"] is None
    assert raw["prices"]["test\tfast"]["fast"]["cache_write_1h"] == "20"


def test_a_cache_of_the_schema_before_fast_rates_is_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert pricing._CACHE_SCHEMA == "2"
    monkeypatch.setattr(pricing, "_CACHE_SCHEMA", "1")
    old = _cache(tmp_path)
    # what schema 1 wrote: no "fast" key (a stale file says genai-prices has no fast rate)
    old.entries["anthropic\tclaude-opus-4-8"] = {
        "provider": "anthropic", "pattern": "claude-opus-4-8", "tier": None,
        "base": {"input": "5", "output": "25", "cache_read": "0.5", "cache_write": "6.25",
                 "cache_write_1h": "10"}}
    old.dirty = True
    old.save("0.2.3")
    monkeypatch.undo()
    new = _cache(tmp_path)
    assert old.path is not None and old.path.exists() and new.path != old.path
    assert new.version is None and new.entries == {}  # a new file: nothing is read
    assert OWN.as_of is not None
    rule = load_genai_prices(OWN.as_of, tmp_path).lookup("anthropic", "claude-opus-4-8")
    assert rule is not None and rule.fast is not None
    # and an entry of that shape in a current file is looked up again, not an error
    new.entries = dict(old.entries)
    assert new.get("anthropic", "claude-opus-4-8") == (False, None)


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
    assert price(a + b, FAST, fast=True) == price(a, FAST, fast=True) + price(b, FAST, fast=True)


@given(_usages)
def test_fast_rates_never_change_a_standard_price(u: TokenUsage) -> None:
    assert price(u, FAST) == price(u, replace(FAST, fast=None))
    assert not price(u, FAST, fast=True).tiered


def test_a_tier_is_judged_per_request_not_on_sums() -> None:
    a = TokenUsage(600)
    assert price(a, TIERED) + price(a, TIERED) != price(a + a, TIERED)
