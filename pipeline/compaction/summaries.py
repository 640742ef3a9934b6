"""Summarisers of compaction packets, behind a Protocol. Pure.

A packet ``{summary, first_turn_id, last_turn_id, model, tokens_before}`` stands for a
contiguous range of whole closed turns (spec section 5). Its summary is written from the
covered turns' ``turn_card`` entries, never from their raw tool output, and is seeded
from a stored packet over the same first turn when there is one: the seed covers a
prefix of the range, and only the turns after it are added.

:class:`~pipeline.compaction.cards.CardsSummariser` (``"cards"``) is the offline,
deterministic default; the HTTP one (``"http"``, :mod:`pipeline.compaction.http`)
asks a model. The format of the
cards summary is documented in ``docs/compaction.md`` (*Summaries*).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from pipeline.errors import PipelineError, UsageError
from pipeline.replay.projection import canonical_json
from pipeline.replay.scopes import turn_range
from pipeline.replay.turns import Turn

K = TypeVar("K")
V = TypeVar("V")


class SummariserError(PipelineError, RuntimeError):
    """A summariser could not produce a summary (an endpoint failed or answered nonsense)."""


class Detail(enum.Enum):
    """How much of the covered turns a summary kept."""

    FULL = "full"  # a block per turn with every field
    SHORT = "short"  # blocks with shortened fields
    COLLAPSED = "collapsed"  # the oldest turns one card line each, the rest short blocks
    LINES = "lines"  # every turn one terse card line
    RUNS = "runs"  # runs of consecutive turns merged into one line each
    MINIMAL = "minimal"  # the header line only
    MODEL = "model"  # written by a model
    MODEL_CUT = "model-cut"  # written by a model that stopped at its token limit


@dataclass(frozen=True)
class SummarySeed:
    """A stored packet over the same first turn: its summary and the last turn it covers."""

    summary: str
    last_turn_id: str


@dataclass(frozen=True)
class SummaryRequest:
    """What to summarise: turns ``first_turn``..``last_turn`` of one session.

    Parameters
    ----------
    session_id:
        The session the turns belong to.
    first_turn, last_turn, first_turn_id, last_turn_id:
        Numbers (``tN``) and directive entry ids of the range's ends, both included.
    cards:
        The ``card`` of each covered turn's ``turn_card``, oldest first, one per turn.
    target_tokens:
        Upper bound of the summary's tokens.
    model:
        The model the packet is written for (its ``model`` field).
    seed:
        A stored packet over the same first turn, if any.
    """

    session_id: str
    first_turn: int
    last_turn: int
    first_turn_id: str
    last_turn_id: str
    cards: Sequence[Mapping[str, Any]]
    target_tokens: int
    model: str = ""
    seed: SummarySeed | None = None

    def __post_init__(self) -> None:
        # Freeze the sequence too: a request is shipped to workers and hashed by nobody.
        object.__setattr__(self, "cards", tuple(self.cards))
        if not 1 <= self.first_turn <= self.last_turn:
            raise UsageError(f"bad turn range t{self.first_turn}-t{self.last_turn}")
        if len(self.cards) != self.last_turn - self.first_turn + 1:
            raise UsageError(f"{len(self.cards)} cards for turns "
                             f"t{self.first_turn}-t{self.last_turn}: one per turn expected")
        if not self.first_turn_id or not self.last_turn_id:
            raise UsageError("a packet needs its first and last turn ids")
        if self.target_tokens < 1:
            raise UsageError(f"target_tokens must be at least 1, not {self.target_tokens}")

    @property
    def span(self) -> str:
        """``tA-tB`` (``tA`` for one turn)."""
        return turn_range(self.first_turn, self.last_turn)


@dataclass(frozen=True)
class Summary:
    """A packet summary and how it was made."""

    text: str
    tokens: int
    summariser: str
    version: str
    detail: Detail = Detail.FULL
    over_target: bool = False  # even the minimal form is longer than the target
    seeded: bool = False  # the seed was kept and only later turns added


@runtime_checkable
class Summariser(Protocol):
    """Writes a packet summary for a :class:`SummaryRequest`."""

    @property
    def name(self) -> str:
        """Registry name (``cards``, ``http``)."""
        ...

    @property
    def version(self) -> str:
        """Changes whenever the same request could get another summary."""
        ...

    def summarise(self, request: SummaryRequest) -> Summary:
        """Summarise ``request``; raises :class:`SummariserError` when it cannot."""
        ...




def seed_prefix(request: SummaryRequest) -> int | None:
    """How many of the request's turns its seed covers, or ``None`` without a usable seed.

    A seed is usable when its last turn is one of the covered turns (by the card's
    ``turn_id``, or by the range's own ids); a seed that ends outside the range is not a
    prefix of it.
    """
    seed = request.seed
    if seed is None or not seed.summary.strip():
        return None
    if seed.last_turn_id == request.last_turn_id:
        return len(request.cards)
    if seed.last_turn_id == request.first_turn_id:
        return 1
    for i, card in enumerate(request.cards):
        if card.get("turn_id") == seed.last_turn_id:
            return i + 1
    return None


def compact_json(value: Any) -> str:
    """Canonical JSON (compact, sorted keys), with a lenient fallback for values orjson
    refuses (integers past 64 bits, which a ledger may hold)."""
    try:
        return canonical_json(value)
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          default=str)


def request_from_turns(session_id: str, turns: Sequence[Turn], *, target_tokens: int,
                       model: str = "", seed: SummarySeed | None = None) -> SummaryRequest:
    """A request over ``turns`` (consecutive, oldest first) of a
    :class:`~pipeline.replay.turns.TurnIndex`; other parameters as in :class:`SummaryRequest`.

    A turn without a card (vak writes one per closed turn) gets a stand-in made of what
    the index kept of it: the directive, the tool names and the final narration, still
    none of its tool output.
    """
    if not turns:
        raise UsageError("a packet covers at least one turn")
    if [t.number for t in turns] != list(range(turns[0].number, turns[-1].number + 1)):
        raise UsageError("a packet covers consecutive turns")
    cards = tuple(t.card if t.card is not None else {
        "turn_id": t.id, "asked": t.asked, "did": [{"tool": name} for name in t.tools],
        "answered": {"presentations": [], "narration": t.narration}} for t in turns)
    return SummaryRequest(session_id, turns[0].number, turns[-1].number, turns[0].id,
                          turns[-1].id, cards, target_tokens, model, seed)
