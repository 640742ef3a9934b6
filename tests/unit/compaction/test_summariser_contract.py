"""Every summariser of ``pipeline.compaction`` runs the summariser contract
(``tests/contracts/summarisers.py``): cards offline, http against the local scripted
server of ``tests.helpers.http``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipeline.compaction.cards import CardsSummariser
from pipeline.compaction.http import HttpSummariser
from pipeline.compaction.registry import get_summariser
from pipeline.compaction.summaries import Summariser
from tests.contracts.summarisers import SummariserContract
from tests.helpers.http import Server


class TestCardsContract(SummariserContract):
    deterministic = True

    @pytest.fixture
    def summariser(self) -> Summariser:
        return get_summariser("cards")

    def test_is_the_cards_summariser(self, summariser: Summariser) -> None:
        assert isinstance(summariser, CardsSummariser)


class TestHttpContract(SummariserContract):
    @pytest.fixture
    def summariser(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[Summariser]:
        monkeypatch.delenv("VAKPIPE_SUMMARISER_API_KEY", raising=False)
        server = Server()
        try:
            yield HttpSummariser(server.base, "test-model", connect_timeout=1.0,
                                 read_timeout=2.0, retries=0, backoff=0.01, backoff_max=0.05)
        finally:
            server.close()
