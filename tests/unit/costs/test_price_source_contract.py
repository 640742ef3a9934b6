"""Every price source of ``pipeline.costs.pricing`` runs the price-source contract
(``tests/contracts/prices.py``): the shipped TOML table, genai-prices' bundled data, and
the layered table a report uses."""

from __future__ import annotations

from datetime import date

import pytest

from pipeline.costs.pricing import (
    PriceTable,
    load_genai_prices,
    load_prices,
    load_toml_prices,
)
from tests.contracts.prices import PriceSourceContract


class TestTomlContract(PriceSourceContract):
    @pytest.fixture
    def table(self) -> PriceTable:
        return load_toml_prices()

    @pytest.fixture
    def known(self) -> tuple[str, str]:
        return ("anthropic", "claude-sonnet-4-0")


class TestGenaiContract(PriceSourceContract):
    @pytest.fixture
    def table(self) -> PriceTable:
        return load_genai_prices(date(2026, 1, 1), cache_dir=None)

    @pytest.fixture
    def known(self) -> tuple[str, str]:
        return ("openai", "gpt-4o")


class TestLayeredContract(PriceSourceContract):
    @pytest.fixture
    def table(self) -> PriceTable:
        return load_prices(cache=False)

    @pytest.fixture
    def known(self) -> tuple[str, str]:
        return ("anthropic", "claude-sonnet-4-0")
