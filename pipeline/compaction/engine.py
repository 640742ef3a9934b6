"""Compaction planning: the packets a capacity budget needs, per session. Pure.

The context engine compacts incrementally: a packet over a contiguous range of whole
closed turns is written only when the working-set plan for the bound model names a
packet range that no stored packet covers. :class:`CompactionEngine` replays a session
under planner v1 for one capacity profile and, at each such request, plans the packet:

1. the range starts where the planner's does (the oldest closed turn after any reset)
   and ends at its last packed turn; while the summary cannot fit the tokens the plan
   leaves (the budget minus what the Full and Card turns spend, plus what the packed
   turns free), the range grows by the next newer closed turn (never splitting one);
2. the summary is written by a :class:`~pipeline.compaction.summaries.Summariser` from the covered
   turns' cards, seeded from the newest stored (ledger) or planned packet over the same
   first turn;
3. the packet is stored in the engine as if it had been written, so the requests after
   it are counted with it and plan no packet again until the range has to grow.

Planned packets over the same first turn form a chain of ever broader ranges; at the
end, seed 001's ``supersede-summaries`` keeps the ones no broader or newer packet
covers (coverage is never lost). Decisions are documented in ``docs/compaction.md``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.compaction.summaries import Summariser, Summary, SummarySeed, request_from_turns
from pipeline.ledger.layout import SessionKey
from pipeline.ledger.reader import Entry
from pipeline.ledger.redact import redact
from pipeline.ledger.wire import RawEntry, rfc3339_ns, serialize, uuid7
from pipeline.replay.catalog import Capacity, ModelCatalog
from pipeline.replay.closed import Plan
from pipeline.replay.engine import ReplayEngine
from pipeline.replay.projection import RuleSet
from pipeline.replay.scopes import turn_range
from pipeline.replay.tokens import Tokenizer
from pipeline.replay.turns import Turn

#: A summary gets at most this many tokens (``--summary-tokens``).
DEFAULT_SUMMARY_TOKENS = 2_000
#: Below this many tokens left for a summary, the range grows before anything is written.
MIN_SUMMARY_TOKENS = 48


@dataclass(frozen=True, slots=True)
class CapacityProfile:
    """The capacity a compaction plans for, and how the run named it."""

    label: str  # "bound", "window=128000", "model=gpt-4.1"
    capacity: Capacity


@dataclass(frozen=True, slots=True)
class PlannedPacket:
    """One packet the budget needs.

    Attributes
    ----------
    first_turn, last_turn, first_turn_id, last_turn_id:
        The covered range (numbers and directive entry ids), both ends included.
    tokens_before:
        The covered turns' tokens at Full fidelity under the rule set.
    tokens_after:
        The packet's tokens in the request (its ``<context_summary>`` message).
    summary:
        The summary and how it was made.
    needed_by, needed_by_entry:
        Scope (``tN/iM``) and entry id of the first request whose plan needed it.
    fits:
        Whether that request fits the budget with the packet in place.
    seeded_from:
        ``"ledger"`` or ``"planned"`` when seeded from a packet over the same first
        turn, else ``""``.
    """

    first_turn: int
    last_turn: int
    first_turn_id: str
    last_turn_id: str
    tokens_before: int
    tokens_after: int
    summary: Summary
    needed_by: str
    needed_by_entry: str
    fits: bool
    seeded_from: str = ""
    model: str = ""  # the packet's ``model`` field: the capacity's model

    @property
    def turns(self) -> range:
        """The covered turn numbers."""
        return range(self.first_turn, self.last_turn + 1)

    @property
    def label(self) -> str:
        """The range as ``pretty-scopes`` writes it (``t3-t7/*``)."""
        return f"{turn_range(self.first_turn, self.last_turn)}/*"

    def packet_id(self, session: str) -> str:
        """A stable id: the same packet of the same session gets the same id every run."""
        text = "\x00".join((session, self.first_turn_id, self.last_turn_id,
                            self.summary.summariser, self.summary.version))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CompactionOptions:
    """What a compaction run plans for (picklable: it travels with every task).

    The capacity profile is the session's bound model from the catalog, unless
    ``model`` names another one or ``window`` gives every model that input window;
    ``scale`` then shrinks the profile's window (the demo's "half of it").
    """

    summariser: Summariser
    window: int | None = None
    model: str | None = None
    scale: float = 1.0
    summary_tokens: int = DEFAULT_SUMMARY_TOKENS

    def profile(self, catalog: ModelCatalog, bound_model: str | None) -> CapacityProfile | None:
        """The capacity to plan a session for, or ``None`` when its model is unknown."""
        if self.model is not None:
            label, cap = f"model={self.model}", catalog.lookup(self.model)
        elif self.window is not None:
            label = f"window={self.window}"
            cap = catalog.with_window(self.window).lookup(bound_model or self.model or "*")
        else:
            label, cap = "bound", catalog.lookup(bound_model)
        if cap is None:
            return None
        if self.scale != 1.0:
            label = f"{label}x{self.scale:g}"
            cap = replace(cap, input_limit=int(cap.input_limit * self.scale),
                          output_reserve=int(cap.output_reserve * self.scale))
        return CapacityProfile(label, cap)


class CompactionEngine(ReplayEngine):
    """Replay under planner v1 for one capacity, planning the packets it needs."""

    def __init__(self, rules: RuleSet, tokenizer: Tokenizer, *, capacity: Capacity,
                 summariser: Summariser, session_id: str,
                 summary_tokens: int = DEFAULT_SUMMARY_TOKENS) -> None:
        super().__init__(rules, tokenizer, planner=capacity)
        self.summariser = summariser
        self.session_id = session_id
        self.summary_tokens = summary_tokens
        self.planned: list[PlannedPacket] = []
        # The newest packet over each first turn: what a new packet over it is seeded from.
        self._seeds: dict[str, tuple[SummarySeed, str]] = {}
        self._requesting: Entry | None = None
        self._card_wrapper: int | None = None  # tokens of the <turns> message around cards

    def on_request(self, entry: Entry) -> None:
        """Remember the request a packet planned now is needed by."""
        self._requesting = entry

    def on_compaction(self, entry: Entry) -> None:
        """A packet of the ledger seeds the next one over its first turn; a reset drops
        every seed."""
        data = entry.data
        if data.get("reset_all") is True:
            self._seeds.clear()
            return
        first, last, summary = (data.get("first_turn_id"), data.get("last_turn_id"),
                                data.get("summary"))
        if isinstance(first, str) and isinstance(last, str) and isinstance(summary, str):
            self._seeds[first] = (SummarySeed(summary, last), "ledger")

    def plan_request(self, closed: list[Turn]) -> Plan:
        """Planner v1's plan, with the packet it names planned (and stored) when no
        stored packet covers it."""
        wsp = self.working_set(closed)
        if wsp.packet_range is None or wsp.packet_range in self.packets:
            return Plan(wsp.modes, wsp.packet_range, "planner-v1")
        modes = dict(wsp.modes)
        left = wsp.budget - wsp.spent - self._unbudgeted(modes)
        first = next(i for i, t in enumerate(closed) if t.number == wsp.packet_turns[0])
        last = first + len(wsp.packet_turns) - 1
        # A stored packet over the same first turn that reaches at least as far covers
        # the range: its extra turns go into it too, and no packet is written.
        stored = self._seeds.get(closed[first].id)
        reach = next((i for i, t in enumerate(closed) if stored and t.id == stored[0].last_turn_id),
                     None)
        if reach is not None and reach >= last:
            for i in range(last + 1, reach + 1):
                left += self._free(closed[i], modes)
            last = reach
            packet = self.packets.get((closed[first].id, closed[last].id))
            if packet is not None and packet[0] <= left:
                return Plan(modes, (closed[first].id, closed[last].id), "planner-v1")
        packet_tokens, summary, seeded_from, last, left = self._plan_packet(
            closed, first, last, left, modes)
        requesting = self._requesting
        turn = self.index.current
        n = len(turn.iterations) + 1 if turn is not None else 0
        self.planned.append(PlannedPacket(
            closed[first].number, closed[last].number, closed[first].id, closed[last].id,
            sum(self.costs[t.number - 1].full.tokens for t in closed[first:last + 1]),
            packet_tokens, summary,
            f"t{turn.number}/i{n}" if turn is not None else "",
            requesting.id if requesting is not None else "",
            packet_tokens <= left, seeded_from, self.planner.model if self.planner else "",
        ))
        self._seeds[closed[first].id] = (SummarySeed(summary.text, closed[last].id), "planned")
        return Plan(modes, (closed[first].id, closed[last].id), "planner-v1+compaction")

    def _unbudgeted(self, modes: dict[str, str]) -> int:
        """Tokens the request sends besides its turns that planner v1's budget leaves out:
        the newest reset's summary, and the ``<turns>`` message around Card lines.

        Without them a packet could "fit" the plan's budget while the request it was
        planned for is over the capacity (by ~100 tokens after a reset).
        """
        extra = self.reset[0] if self.reset is not None else 0
        if "Card" in modes.values():  # an upper bound: growing the range may absorb them
            if self._card_wrapper is None:
                self._card_wrapper = self.rules.message_overhead + self.turns_wrapper()[0]
            extra += self._card_wrapper
        return extra

    def _plan_packet(self, closed: list[Turn], first: int, last: int, left: int,
                     modes: dict[str, str]) -> tuple[int, Summary, str, int, int]:
        """Summarise ``closed[first..last]``, growing the range until the packet fits the
        ``left`` tokens (or no closed turn is left to add); store it.

        Returns the packet's tokens, its summary and seed origin, the final last index
        and the tokens left for the packet.
        """
        overhead = self.rules.message_overhead + self.count(self.rules.summary(""))
        while True:
            target = min(self.summary_tokens, left - overhead)
            if target < MIN_SUMMARY_TOKENS and last + 1 < len(closed):
                last += 1
                left += self._free(closed[last], modes)
                continue
            summary, seeded_from = self._summarise(closed[first:last + 1], max(1, target))
            tokens = self.store_packet(closed[first].id, closed[last].id, summary.text)
            if tokens <= left or last + 1 >= len(closed):
                return tokens, summary, seeded_from, last, left
            # The summariser could not meet its target: a broader range frees more.
            self.drop_packet(closed[first].id, closed[last].id)
            last += 1
            left += self._free(closed[last], modes)

    def _free(self, turn: Turn, modes: dict[str, str]) -> int:
        """Move ``turn`` into the packet; return the tokens its Full or Card form spent."""
        costs = self.costs[turn.number - 1]
        mode = modes.get(turn.id)
        modes[turn.id] = "Packet"
        if mode == "Full":
            return costs.full.tokens
        if mode == "Card" and costs.card_tokens is not None:
            return costs.card_tokens
        return 0

    def _summarise(self, turns: list[Turn], target: int) -> tuple[Summary, str]:
        seed, origin = self._seeds.get(turns[0].id, (None, ""))
        request = request_from_turns(self.session_id, turns, target_tokens=target,
                                     model=self.planner.model if self.planner else "",
                                     seed=seed)
        summary = self.summariser.summarise(request)
        return summary, origin if summary.seeded else ""


@dataclass
class SessionCompaction:
    """A session's planned packets and which of them survive supersession."""

    packets: list[PlannedPacket] = field(default_factory=list)
    superseded: frozenset[int] = frozenset()

    @property
    def survivors(self) -> list[PlannedPacket]:
        """The packets a compacted archive gets, in planning order."""
        return [p for i, p in enumerate(self.packets) if i not in self.superseded]


def supersede(packets: list[PlannedPacket]) -> SessionCompaction:
    """Apply seed 001's ``supersede-summaries`` to planned packets (by covered turns).

    A packet is superseded when another covers its turns: a broader range, or the same
    range planned later. Packets cover contiguous ranges, so this is one sweep over them
    sorted by first turn (broadest, then newest first): a packet is covered exactly when
    one sorted before it reaches at least as far. The same result as
    :func:`pipeline.replay.scopes.supersede_summaries` (a property test checks it), in
    O(n log n): that function compares every pair of live summaries again after each
    drop (cubic), and a long session under a tight window plans thousands of packets.

    Parameters
    ----------
    packets:
        The planned packets, in planning order.

    Returns
    -------
    SessionCompaction
        The packets and the indices of the superseded ones.
    """
    order = sorted(range(len(packets)),
                   key=lambda i: (packets[i].first_turn, -packets[i].last_turn, -i))
    superseded = set()
    reach = 0  # the furthest last turn of the packets sorted before
    for i in order:
        if packets[i].last_turn <= reach:
            superseded.add(i)
        reach = max(reach, packets[i].last_turn)
    return SessionCompaction(list(packets), frozenset(superseded))


def compaction_rows(key: SessionKey, session_id: str, result: SessionCompaction,
                    profile: CapacityProfile) -> list[dict[str, Any]]:
    """Rows of the ``compaction`` table for one session."""
    rows = []
    for i, p in enumerate(result.packets):
        rows.append({
            "session_path": key.path,
            "session_id": session_id,
            "packet_id": p.packet_id(session_id or key.path),
            "scope": p.label,
            "first_turn": p.first_turn,
            "last_turn": p.last_turn,
            "first_turn_id": p.first_turn_id,
            "last_turn_id": p.last_turn_id,
            "turns_covered": p.last_turn - p.first_turn + 1,
            "tokens_before": p.tokens_before,
            "tokens_after": p.tokens_after,
            "summary": p.summary.text,
            "summary_tokens": p.summary.tokens,
            "summary_detail": p.summary.detail.value,
            "summariser": p.summary.summariser,
            "summariser_version": p.summary.version,
            "seeded_from": p.seeded_from or None,
            "needed_by_scope": p.needed_by,
            "needed_by_entry_id": p.needed_by_entry,
            "fits": p.fits,
            "superseded": i in result.superseded,
            # Set when a compacted copy with this packet is written (``--write-archive``);
            # a copy that is skipped (torn tail) or not asked for leaves it false.
            "archived": False,
            "profile": profile.label,
            "model": profile.capacity.model,
            "model_input_limit": profile.capacity.input_limit,
        })
    return rows


def packet_lines(packets: list[PlannedPacket], session: str, *, head_id: str,
                 head_hash: str, now_ns: int) -> list[bytes]:
    """The ``compaction`` entries a compacted ledger gets appended, as vak writes them.

    Each is chained to the one before (the first to the head), has a fresh UUIDv7-shaped
    id (the run's time, random bits from the packet id, so a rerun at the same instant
    writes the same bytes), ``parent_id`` = the entry before it and ``ts`` = the run time.

    Parameters
    ----------
    packets:
        The surviving packets, in planning order.
    session:
        The session id (or path), for the packet ids.
    head_id, head_hash:
        Id and digest of the ledger's head (its last valid entry).
    now_ns:
        The run time, nanoseconds since the epoch.
    """
    lines = []
    parent, prev_hash = head_id, head_hash
    ts = rfc3339_ns(now_ns)
    for p in packets:
        eid = uuid7(now_ns // 1_000_000, int(p.packet_id(session), 16))
        line = serialize(RawEntry(eid, parent, ts, None, "compaction", {
            "summary": p.summary.text, "first_turn_id": p.first_turn_id,
            # The model name is the ledger's own text: held to the rule like the summary.
            "last_turn_id": p.last_turn_id, "model": redact(p.model),
            "tokens_before": p.tokens_before, "reset_all": False,
        }), prev_hash)
        lines.append(line)
        parent, prev_hash = eid, hashlib.sha256(line[:-1]).hexdigest()
    return lines
