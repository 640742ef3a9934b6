"""Planner v1: vak's working-set planner (``vak-wire-format.md`` section 6). Pure.

Budget = input limit − prefix − tail − output reserve − open turn. Each closed turn is
valued at max(recency 1/(1+age), normalised BM25 relevance of its card to the directive,
1.0 for the previous turn); turns go Full in descending value while ``tokens_full``
fits, then the rest become Cards from newest to oldest while ``tokens_card`` fits; the
first card that does not fit and every turn older than it form the packet range.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_WORD = re.compile(r"\w+")
K1, B = 1.2, 0.75


@dataclass(frozen=True, slots=True)
class Candidate:
    """A closed turn as the planner sees it."""

    number: int
    id: str
    tokens_full: int
    tokens_card: int
    text: str  # what relevance is scored on: the card (asked, narration, titles)


@dataclass(frozen=True, slots=True)
class WorkingSetPlan:
    """Per closed turn ``Full``/``Card``/``Packet``, the packet range, and accounting."""

    modes: dict[str, str]
    packet_range: tuple[str, str] | None
    packet_turns: tuple[int, ...]
    retrieved: tuple[str, ...]
    budget: int
    spent: int


def words(text: str) -> list[str]:
    """Lower-case word tokens for BM25."""
    return _WORD.findall(text.lower())


def bm25(query: str, docs: Sequence[str]) -> list[float]:
    """Okapi BM25 of ``query`` against each document, normalised to [0, 1]."""
    if not docs:
        return []
    bags = [Counter(words(d)) for d in docs]
    lengths = [sum(b.values()) for b in bags]
    avg = (sum(lengths) / len(lengths)) or 1.0
    df: Counter[str] = Counter()
    for bag in bags:
        df.update(bag.keys())
    n = len(docs)
    terms = set(words(query))
    scores = []
    for bag, length in zip(bags, lengths, strict=True):
        s = 0.0
        for t in terms:
            f = bag.get(t, 0)
            if f:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * f * (K1 + 1) / (f + K1 * (1 - B + B * length / avg))
        scores.append(s)
    top = max(scores)
    return [s / top if top > 0 else 0.0 for s in scores]


def plan_v1(turns: Sequence[Candidate], directive: str, budget: int) -> WorkingSetPlan:
    """Plan the closed ``turns`` (oldest first) into ``budget`` tokens.

    Parameters
    ----------
    turns:
        Closed turns, oldest first.
    directive:
        The open turn's directive (relevance is scored against it).
    budget:
        Tokens available for the closed turns.
    """
    if not turns:
        return WorkingSetPlan({}, None, (), (), budget, 0)
    newest = turns[-1].number
    relevance = bm25(directive, [t.text for t in turns])
    values = []
    for t, rel in zip(turns, relevance, strict=True):
        recency = 1.0 / (1 + (newest - t.number))
        values.append((max(recency, rel, 1.0 if t.number == newest else 0.0), rel > recency, t))
    modes: dict[str, str] = {}
    retrieved = []
    left = budget
    for _value, by_relevance, t in sorted(values, key=lambda v: (-v[0], -v[2].number)):
        if t.tokens_full <= left:
            modes[t.id] = "Full"
            left -= t.tokens_full
            if by_relevance:
                retrieved.append(t.id)
    packet_from: int | None = None
    for t in reversed(turns):
        if t.id in modes:
            continue
        if t.tokens_card <= left:
            modes[t.id] = "Card"
            left -= t.tokens_card
        else:
            packet_from = t.number
            break
    packet: tuple[int, ...] = ()
    rng = None
    if packet_from is not None:
        # Everything older than the first card that does not fit is packed, Full turns
        # included: a packet covers a contiguous range and a turn is never split.
        packed = [t for t in turns if t.number <= packet_from]
        for t in packed:
            if modes.get(t.id) == "Full":
                left += t.tokens_full
            elif modes.get(t.id) == "Card":
                left += t.tokens_card
            modes[t.id] = "Packet"
        packet = tuple(t.number for t in packed)
        rng = (packed[0].id, packed[-1].id)
    return WorkingSetPlan(modes, rng, packet, tuple(r for r in retrieved if modes[r] == "Full"),
                          budget, budget - left)
