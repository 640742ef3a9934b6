"""The closed part of a replayed request: every turn before the open one. Pure.

After its prefix (system prompt and tools), a request carries the turns before its open
turn as the plan in force renders them: a reset summary, a packet summary, a
``<turns>`` block of Card lines, then the Full turns in order. That part changes only
when a turn starts or a card, packet, reset or plan arrives. It is rebuilt then from
what each turn left when it closed (its tokens and digests, kept in
:class:`SealedTurns`): set and list operations whose Python-level work is the plan's
size, plus one C-level slice, join and hash over the closed turns' 64-character
digests. Each request then costs O(1) on top: it copies the hash state of its closed
part and adds its open turn and tail, where hashing the joined parts per request would
make a session's replay quadratic in its turns.

A rebuild does not hash every closed turn again either: :class:`SealedTurns` keeps the
hash state of the last closed parts it built (:class:`_Running`), and a rebuild with the
same prefix, head parts (reset, packet, ``<turns>`` block) and folded turns among those
already hashed copies it and hashes only the turns closed since. So a session without
resets, packets or plan changes costs O(1) per new turn, where hashing the joined
digests per turn made it quadratic (41k turns: 112 s). A change of the head or of the
folded turns among those hashed rehashes the closed turns once (the digest covers them
in order after the head).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.replay.turns import Turn


def sha_hex(text: str) -> str:
    """Hex SHA-256 of a replayed text (lone surrogates kept, as the ledger's JSON allows)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class Plan:
    """The working-set plan in force (a recorded ``context_selection``)."""

    modes: dict[str, str]
    packet_range: tuple[str, str] | None
    entry_id: str


@dataclass(frozen=True, slots=True)
class _Running:
    """The hash state of a closed part built before, to extend instead of rebuilding."""

    #: (prefix digest, head parts, first closed turn's index, which renderings)
    key: tuple[Any, ...]
    folded: tuple[int, ...]  # the folded turn numbers among those hashed
    pos: int  # digests[:pos] are hashed (but the folded ones and those before ``start``)
    state: Any  # sha256 over ``prefix|head...|full...|``; never updated in place


#: Running states kept per :class:`SealedTurns` (a planner may alternate a few heads).
MAX_RUNNING = 8


@dataclass(slots=True)
class SealedTurns:
    """Tokens and digests of each closed turn's two renderings, turn 1 first.

    ``verbatim`` is a closed turn without a plan (verbatim minus control messages);
    ``full`` is its Full rendering under a plan. Token lists are running sums from 0, so
    any run of turns costs O(1) to total.
    """

    verbatim_digests: list[str] = field(default_factory=list)
    full_digests: list[str] = field(default_factory=list)
    verbatim_sums: list[int] = field(default_factory=lambda: [0])
    full_sums: list[int] = field(default_factory=lambda: [0])
    #: The hash states of the last closed parts built, by key (see :class:`_Running`).
    running: dict[tuple[Any, ...], _Running] = field(default_factory=dict)

    def seal(self, verbatim: tuple[int, str], full: tuple[int, str]) -> None:
        """Record the next turn, closed: (tokens, digest) of each rendering."""
        self.verbatim_digests.append(verbatim[1])
        self.full_digests.append(full[1])
        self.verbatim_sums.append(self.verbatim_sums[-1] + verbatim[0])
        self.full_sums.append(self.full_sums[-1] + full[0])

    def copy(self) -> SealedTurns:
        """An independent copy (for a forked engine)."""
        # The running states are shared: they are never updated in place.
        return SealedTurns(list(self.verbatim_digests), list(self.full_digests),
                           list(self.verbatim_sums), list(self.full_sums),
                           dict(self.running))


@dataclass(frozen=True, slots=True)
class ClosedPart:
    """What a request carries between its prefix and its open turn."""

    tokens: int
    n_full: int
    card_turns: tuple[int, ...]
    packet_turns: tuple[int, ...]
    source: str
    #: sha256 over ``prefix|part|...|part|``; copied per request, never updated in place
    #: (a forked engine shares it).
    digest_state: Any

    def request_digest(self, open_digest: str, tail_digest: str) -> str:
        """Digest of the whole request: sha256 of ``prefix|parts...|open|tail``."""
        h = self.digest_state.copy()
        h.update(f"{open_digest}|{tail_digest}".encode())
        return str(h.hexdigest())


@dataclass(frozen=True, slots=True)
class Folding:
    """What the closed part is built from, besides the sealed turns."""

    turns: Sequence[Turn]
    numbers: Mapping[str, tuple[int, ...]]  # turn id -> its turn numbers (ascending)
    card_costs: Callable[[int], tuple[int, str] | None]  # turn number -> card line's
    packets: Mapping[tuple[str, str], tuple[int, str, str]]  # tokens, digest, text
    reset: tuple[int, str, int, str] | None  # tokens, digest, turns replaced, text
    turns_wrapper: tuple[int, str]  # tokens (overhead included) and text of ``<turns>``


def folded_turns(plan: Plan, folding: Folding, lo: int, hi: int,
                 ) -> tuple[list[int], list[int]]:
    """Card and packet turn numbers, ascending, among the closed turns ``lo..hi``.

    A packet range runs from an occurrence of its first turn id to the next occurrence
    of its last (to ``hi`` when there is none); a Card turn without a card stays Full.
    """
    numbers = folding.numbers

    def within(turn_id: str) -> list[int]:
        return [n for n in numbers.get(turn_id, ()) if lo <= n <= hi]

    packet: set[int] = set()
    if plan.packet_range is not None:
        firsts, lasts = within(plan.packet_range[0]), within(plan.packet_range[1])
        pos = lo
        for first in firsts:
            if first < pos:
                continue
            end = next((n for n in lasts if n >= first), None)
            packet.update(range(first, (hi if end is None else end) + 1))
            if end is None:
                break
            pos = end + 1
    cards: set[int] = set()
    for turn_id, mode in plan.modes.items():
        if mode == "Packet":
            packet.update(within(turn_id))
        elif mode == "Card":
            cards.update(n for n in within(turn_id) if folding.card_costs(n) is not None)
    return sorted(cards - packet), sorted(packet)


def closed_part(sealed: SealedTurns, folding: Folding, plan: Plan | None,
                prefix_digest: str) -> ClosedPart:
    """The closed part of a request whose open turn is the last of ``folding.turns``."""
    turns = folding.turns
    tokens, parts = 0, []
    start = 0
    if folding.reset is not None:
        tokens += folding.reset[0]
        parts.append(folding.reset[1])
        start = folding.reset[2]
    end = len(turns) - 1  # closed turns are numbers start+1..end, indexes start..end-1
    if plan is None:
        sums, digests = sealed.verbatim_sums, sealed.verbatim_digests
        cards: list[int] = []
        packet: list[int] = []
    else:
        sums, digests = sealed.full_sums, sealed.full_digests
        cards, packet = folded_turns(plan, folding, start + 1, end)
    full_tokens = sums[end] - sums[start] if end > start else 0
    if packet:
        for n in packet:
            full_tokens -= sums[n] - sums[n - 1]
        cost = folding.packets.get((turns[packet[0] - 1].id, turns[packet[-1] - 1].id))
        if cost is not None:
            tokens += cost[0]
            parts.append(cost[1])
    if cards:
        card_digests = []
        for n in cards:
            full_tokens -= sums[n] - sums[n - 1]
            card = folding.card_costs(n)
            assert card is not None
            tokens += card[0]
            card_digests.append(card[1])
        tokens += folding.turns_wrapper[0]
        parts.append(sha_hex(folding.turns_wrapper[1] + "".join(card_digests)))
    folded = sorted({*cards, *packet})
    state = _full_state(sealed, (prefix_digest, tuple(parts), start, plan is None),
                        digests, folded, start, end)
    return ClosedPart(tokens + full_tokens, max(0, end - start) - len(folded), tuple(cards),
                      tuple(packet), plan.entry_id if plan is not None else "", state)


def _full_state(sealed: SealedTurns, key: tuple[Any, ...], digests: list[str],
                folded: list[int], start: int, end: int) -> Any:
    """sha256 over ``prefix|head...|`` (in ``key``) and the Full turns' digests
    ``digests[start:end]`` but the ``folded`` turn numbers, each followed by ``|``.

    Extends the running state of the same ``key`` when the turns it hashed are still
    Full and folded alike (it then hashes only the turns closed since), else hashes
    them all; either way it becomes the running state of ``key``.
    """
    running = sealed.running.get(key)
    if running is not None and running.pos <= end:
        pos = running.pos
        done = tuple(n for n in folded if n <= pos)  # O(folded): the plan's size
        if done != running.folded:
            running = None
    else:
        running = None
    if running is None:
        pos, done = start, ()
        state = hashlib.sha256(f"{key[0]}|".encode())
        for part in key[1]:
            state.update(f"{part}|".encode())
    elif pos == end:
        return running.state  # nothing closed since: the same state, shared
    else:
        state = running.state.copy()
    parts: list[str] = []
    for n in folded:  # the Full turns between folded ones, as slices: no Python per turn
        if n > pos:
            parts.extend(digests[pos:n - 1])
            pos = n
    parts.extend(digests[pos:end])
    if parts:
        parts.append("")
        state.update("|".join(parts).encode())
    if len(sealed.running) >= MAX_RUNNING and key not in sealed.running:
        sealed.running.clear()
    sealed.running[key] = _Running(key, tuple(folded), end, state)
    return state
