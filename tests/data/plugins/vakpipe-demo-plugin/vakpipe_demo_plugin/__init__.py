"""A demo vakpipe plug-in: a rule set, a summariser, a price source, a transcript format.

Each is as small as its kind allows; the tests use them by name (``regress --candidate
demo-bare-cards``, ``cost --prices demo-flat``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pipeline.compaction.cards import CardsSummariser
from pipeline.costs.pricing import Price, Rates
from pipeline.replay.projection import RuleSetV1


@dataclass(frozen=True)
class BareCards(RuleSetV1):
    """``v1`` whose Card lines keep only the turn number and what was asked."""

    name: str = "demo-bare-cards"

    def card_line(self, n: int, card: dict[str, Any] | None, *, asked: str,
                  tools: Sequence[str], narration: str) -> str:
        return f"#{n} asked: {asked}"


def cards_summariser(**options: Any) -> CardsSummariser:
    """vakpipe's cards summariser, reached through a plug-in name."""
    return CardsSummariser(**options)


class FlatPrices:
    """Every model at $1 per million tokens of any kind."""

    def lookup(self, provider: str | None, model: str | None) -> Price | None:
        one = Decimal(1)
        return Price(provider or "", "*", Rates(one, one, one, one))


class DemoLines:
    """Files whose first line is ``{"demo_transcript": 1}``: claimed, read as nothing."""

    name = "demo-lines"

    def sniff(self, obj: dict[str, Any]) -> bool:
        return obj.get("demo_transcript") == 1

    def read(self, lines: Iterable[bytes], stats: Any, header: dict[str, Any]
             ) -> Iterator[Any]:
        yield from ()
