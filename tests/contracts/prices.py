"""The contract of a price source (:class:`pipeline.costs.pricing.PriceTable`).

A subclass gives ``table`` (the implementation), ``known`` (a ``(provider, model)`` it
prices) and may widen ``unknown``.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from pipeline.costs.pricing import Price, PriceTable, Rates, TokenUsage, price

UNKNOWN = [("anthropic", "no-such-model-xyz"), ("no-such-provider", "claude-sonnet-4-5"),
           (None, "no-such-model-xyz"), ("anthropic", None), ("anthropic", ""),
           (None, None)]


def _rates(r: Rates) -> list[Decimal | None]:
    return [r.input, r.output, r.cache_read, r.cache_write, r.cache_write_1h]


class PriceSourceContract:
    """What every price source promises: a known model priced with non-negative Decimal
    rates, an unknown one ``None`` (never an exception), the same answer twice."""

    @pytest.fixture
    def table(self) -> PriceTable:
        raise NotImplementedError

    @pytest.fixture
    def known(self) -> tuple[str, str]:
        raise NotImplementedError

    def test_known_model_is_priced(self, table: PriceTable, known: tuple[str, str]) -> None:
        rule = table.lookup(*known)
        assert isinstance(rule, Price)

    def test_rates_are_non_negative_decimals(self, table: PriceTable,
                                             known: tuple[str, str]) -> None:
        rule = table.lookup(*known)
        assert rule is not None
        tiers = [rule.base] + ([rule.tier.rates] if rule.tier is not None else []) \
            + ([rule.fast] if rule.fast is not None else [])  # fast mode's, where it has one
        for rates in tiers:
            for r in _rates(rates):
                assert r is None or (isinstance(r, Decimal) and r >= 0 and r.is_finite()), r
        assert rule.base.input > 0 or rule.base.output > 0

    @pytest.mark.parametrize("provider, model", UNKNOWN)
    def test_unknown_model_is_none(self, table: PriceTable, provider: str | None,
                                   model: str | None) -> None:
        assert table.lookup(provider, model) is None

    def test_lookup_is_stable(self, table: PriceTable, known: tuple[str, str]) -> None:
        assert table.lookup(*known) == table.lookup(*known)

    def test_a_priced_request_costs_a_non_negative_decimal(self, table: PriceTable,
                                                           known: tuple[str, str]) -> None:
        usage = TokenUsage(1000, 200, 3000, 400)
        cost = price(usage, table.lookup(*known))
        assert isinstance(cost.total, Decimal) and cost.total > 0
