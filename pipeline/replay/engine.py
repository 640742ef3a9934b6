"""Replay: rebuild, for every assistant message on the active chain, the request that
produced it, and count it. Pure.

:class:`ReplayEngine` is fed the active chain one entry at a time. Every segment (a
text, a tool input, a result and its digest, a card line, a summary, a system prompt)
is tokenized once, when its entry arrives, and only its count and digest are kept: the
cost of replaying a session grows linearly with its size, and memory with its number of
turns, never with its bytes.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.ledger.entry import input_and_output, is_directive, usage_of, winning_usage
from pipeline.ledger.reader import Entry
from pipeline.ledger.types import as_list, token_count
from pipeline.replay.catalog import Capacity
from pipeline.replay.closed import (
    ClosedPart,
    Folding,
    Plan,
    SealedTurns,
    closed_part,
    sha_hex,
)
from pipeline.replay.plan import Candidate, WorkingSetPlan, plan_v1
from pipeline.replay.projection import CARD_TOOL_PREFIX, RuleSet, canonical_json
from pipeline.replay.tokens import Tokenizer
from pipeline.replay.turns import Turn, TurnIndex, is_control

_EMPTY = hashlib.sha256(b"").hexdigest()


def _text(v: Any) -> str | None:
    """A name (model, provider) as vak writes it: a string; anything else is none."""
    return v if isinstance(v, str) else None


@dataclass(slots=True)
class RenderedTokens:
    """Tokens and a running digest of a rendering."""

    tokens: int = 0
    digest: Any = field(default_factory=hashlib.sha256)

    def add(self, tokens: int, text: str) -> None:
        """Account one rendered segment."""
        self.tokens += tokens
        self.digest.update(text.encode("utf-8", "surrogatepass"))
        self.digest.update(b"\x00")

    # The start of a message (its overhead, its role) is accounted like any segment; the
    # alias only lets a recording subclass (``vakpipe show``) see where messages begin.
    message = add

    def hexdigest(self) -> str:
        """Digest of everything added so far."""
        return str(self.digest.hexdigest())

def _copy_cost(c: RenderedTokens) -> RenderedTokens:
    """An independent copy of a count and its running digest (plain, not recording)."""
    return RenderedTokens(c.tokens, c.digest.copy())


@dataclass(slots=True)
class TurnCosts:
    """A turn's three renderings, built as its messages arrive."""

    #: closed, no plan: verbatim minus control
    verbatim: RenderedTokens = field(default_factory=RenderedTokens)
    #: plan Full: digests, thinking dropped
    full: RenderedTokens = field(default_factory=RenderedTokens)
    #: open turn: verbatim, control included
    open: RenderedTokens = field(default_factory=RenderedTokens)
    card_tokens: int | None = None
    card_digest: str = ""
    card_line: str = ""


@dataclass(frozen=True, slots=True)
class Prefix:
    """System prompt and tools of a request."""

    tokens: int
    digest: str
    source: str  # "header" or the turn_capabilities_bound entry id
    system: str = ""
    tools: Sequence[Any] = ()


@dataclass(slots=True)
class RequestReplay:
    """One replayed request, before utilization is added."""

    entry_id: str
    turn: int
    iteration: int
    scope: str
    model: str | None
    ts: str
    replayed_tokens: int
    prefix_tokens: int
    prefix_digest: str
    request_digest: str
    plan_full: int
    plan_card_turns: tuple[int, ...]
    plan_packet_turns: tuple[int, ...]
    plan_source: str
    reported_input: int | None = None
    reported_output: int | None = None
    provider: str | None = None
    recorded_prefix_digest: str | None = None
    recorded_prefix_tokens: int | None = None


class ReplayEngine:
    """Incremental replay of one session's active chain under a rule set.

    Extension points (a subclass or helper needs nothing ``_``-prefixed):

    * :meth:`fork`: an independent copy (the generator's re-ask branches);
    * :meth:`new_turn_costs`: the costs a turn records into (``vakpipe show``);
    * :meth:`on_request` and :meth:`on_compaction`: observers, called when a request is
      about to be rebuilt and after a ``compaction`` entry was taken in;
    * :meth:`plan_request`: the plan of a request under the planner, built on
      :meth:`working_set`; :meth:`store_packet` holds a packet as if it had been written
      and :meth:`drop_packet` forgets it (the compaction engine plans packets this way).
    """

    # State a fork copies (mutable) or shares (immutable values, or a cache whose content
    # does not depend on the chain). Anything else is refused by :meth:`fork`, so a change
    # to the engine cannot silently leak state from an abandoned branch into the active
    # chain.
    _FORK_COPIED = frozenset({"index", "costs", "packets", "pending", "_tools", "_sealed",
                              "_turn_numbers"})
    _FORK_SHARED = frozenset({"rules", "planner", "tok", "prefix", "header_model",
                              "header_provider", "plan", "reset", "tail", "_prefix_cache",
                              "_version", "_closed_cache"})

    def __init__(self, rules: RuleSet, tokenizer: Tokenizer, *,
                 planner: Capacity | None = None) -> None:
        """Replay under ``rules`` counting with ``tokenizer``.

        With ``planner`` (a capacity profile), every request is projected under the plan
        planner v1 makes for that capacity instead of the recorded plan in force.
        """
        self.rules = rules
        self.planner = planner
        self.tok = tokenizer
        self.index = TurnIndex()
        self.costs: list[TurnCosts] = []
        self.prefix = Prefix(0, _EMPTY, "none")
        self.header_model: str | None = None
        self.header_provider: str | None = None
        self.plan: Plan | None = None
        # The texts are kept (references, not copies) for ``vakpipe show`` to print.
        self.packets: dict[tuple[str, str], tuple[int, str, str]] = {}  # tokens, digest, text
        self.reset: tuple[int, str, int, str] | None = None  # tokens, digest, replaced, text
        self.tail: tuple[int, str, str] = (0, _EMPTY, "")  # tokens, digest, text
        self.pending: RequestReplay | None = None
        self._prefix_cache: dict[str, int] = {}
        self._tools: dict[str, str] = {}  # tool_use id -> tool name, for result digests
        self._sealed = SealedTurns()  # what each turn left when it closed
        self._turn_numbers: dict[str, tuple[int, ...]] = {}  # turn id -> its numbers
        self._version = 0  # bumped by whatever changes the closed part of a request
        self._closed_cache: tuple[tuple[int, int, str], ClosedPart] | None = None

    # -- counting -------------------------------------------------------------------
    def count(self, text: str) -> int:
        """Tokens of one segment."""
        return self.tok.count(text)

    def turns_wrapper(self) -> tuple[int, str]:
        """Tokens and text of what surrounds a message's Card lines (``<turns>\\n\\n</turns>``
        under v1), the message's overhead not included: the closed part, the
        compaction planner's budget and ``show`` all count it here."""
        text = f"{self.rules.turns_open()}\n\n{self.rules.turns_close()}"
        return self.count(text), text

    def _block_tokens(self, block: dict[str, Any], *, thinking: bool) -> tuple[int, str]:
        kind = block.get("type")
        if kind == "text":
            text = str(block.get("text", ""))
            return self.count(text), text
        if kind == "thinking":
            if not thinking:
                return 0, ""
            text = str(block.get("text", ""))
            return self.count(text), text
        if kind == "tool_use":
            text = f"{block.get('name', '')}\n{canonical_json(block.get('input'))}"
            return self.rules.tool_use_overhead + self.count(text), text
        if kind == "tool_result":
            text = str(block.get("content", ""))
            return self.count(text), text
        if kind == "image":
            return self.rules.image_tokens, canonical_json(block.get("source"))
        return 0, ""

    def _set_prefix(self, system: str, tools: list[Any], source: str) -> None:
        tools_text = canonical_json(tools)
        digest = sha_hex(f"{system}\n{tools_text}")
        tokens = self._prefix_cache.get(digest)
        if tokens is None:
            tokens = self.count(system) + sum(
                self.rules.tool_overhead + self.count(canonical_json(t)) for t in tools
            )
            self._prefix_cache[digest] = tokens
        self.prefix = Prefix(tokens, digest, source, system, tools)

    # -- feeding --------------------------------------------------------------------
    def feed(self, entry: Entry) -> Iterator[RequestReplay]:
        """Feed one active-chain entry; yield the requests completed by it."""
        kind = entry.kind
        if kind == "message":
            yield from self._message(entry)
        elif kind == "receipt":
            self._receipt(entry)
        elif kind == "header":
            contract = entry.data.get("contract")
            if type(contract) is dict:
                self.header_model = _text(contract.get("model"))
                self.header_provider = _text(contract.get("provider"))
                caps = contract.get("capabilities")
                self._set_prefix(str(contract.get("system_prompt", "")),
                                 caps if isinstance(caps, list) else [], "header")
        elif kind == "turn_capabilities_bound":
            schemas = entry.data.get("tool_schemas")
            self._set_prefix(str(entry.data.get("system_prompt", "")),
                             schemas if isinstance(schemas, list) else [], entry.id)
        elif kind == "turn_card":
            self.index.add_card(entry)
            turn = self.index.current
            if turn is not None and turn.card is not None:
                self._card(turn)
        elif kind == "compaction":
            self._compaction(entry)
        elif kind == "intent":
            text = entry.data.get("model_visible")
            text = text if isinstance(text, str) else ""
            self.tail = ((self.rules.message_overhead + self.count(text), sha_hex(text), text)
                         if text else (0, _EMPTY, ""))
        elif kind == "context_selection":
            self._selection(entry)

    def finish(self) -> Iterator[RequestReplay]:
        """Flush the last request."""
        if self.pending is not None:
            yield self.pending
            self.pending = None

    def new_turn_costs(self) -> TurnCosts:
        """The costs of a turn that starts (a subclass may record what they render)."""
        return TurnCosts()

    def on_request(self, entry: Entry) -> None:
        """Called with the assistant message whose request is about to be rebuilt (fed or
        peeked), before its plan is made. Does nothing here."""

    def on_compaction(self, entry: Entry) -> None:
        """Called after a ``compaction`` entry was taken in (its packet stored, or the
        reset applied). Does nothing here."""

    def fork(self) -> ReplayEngine:
        """An independent copy: feeding either never changes the other.

        Costs O(turns) pointer copies. Closed turns are never mutated once a later
        directive has been fed, but the last turn (and its costs) can be, so those are
        copied; so are the engine's own mutable containers. An engine holding state this
        method does not know (a subclass's) is refused: such a subclass overrides it.
        """
        unknown = set(vars(self)) - self._FORK_COPIED - self._FORK_SHARED
        if unknown:
            raise RuntimeError(f"{type(self).__name__}.fork does not know its state "
                               f"{sorted(unknown)}")
        f = copy.copy(self)
        turns = list(self.index.turns)
        if turns:
            t = turns[-1]
            turns[-1] = dataclasses.replace(t, iterations=list(t.iterations),
                                            tools=list(t.tools))
        f.index = TurnIndex(turns)
        f.costs = list(self.costs)
        if f.costs:
            c = f.costs[-1]
            f.costs[-1] = dataclasses.replace(c, verbatim=_copy_cost(c.verbatim),
                                              full=_copy_cost(c.full),
                                              open=_copy_cost(c.open))
        f.packets = dict(self.packets)
        f.pending = copy.copy(self.pending)
        f._tools = dict(self._tools)
        f._sealed = self._sealed.copy()
        f._turn_numbers = dict(self._turn_numbers)
        return f

    def peek(self, entry: Entry) -> RequestReplay | None:
        """The request the assistant message ``entry`` would complete, without feeding it.

        For ``vakpipe show``, which reads the engine's state at that point; ``None`` when
        ``entry`` would not be replayed (not an assistant message, or before any turn).
        """
        if entry.kind != "message" or entry.role != "assistant" or self.index.current is None:
            return None
        return self._replay(entry)

    def _message(self, entry: Entry) -> Iterator[RequestReplay]:
        role = entry.role
        blocks = entry.content
        if role == "assistant":
            if self.index.current is None:
                return
            request = self._replay(entry)
            if self.pending is not None:
                yield self.pending
            self.pending = request
            self.index.add_assistant(entry)
            self._account_assistant(blocks)
            return
        if role != "user":
            return
        if is_control(entry):
            self.index.add_user(entry)
            if self.costs:
                open_cost = self.costs[-1].open
                open_cost.message(self.rules.message_overhead, "user")
                for b in blocks:
                    t, text = self._block_tokens(b, thinking=True)
                    open_cost.add(t, text)
            return
        if is_directive(entry):
            if self.costs:
                last = self.costs[-1]
                self._sealed.seal((last.verbatim.tokens, last.verbatim.hexdigest()),
                                  (last.full.tokens, last.full.hexdigest()))
            turn = self.index.start_turn(entry)
            self._turn_numbers[turn.id] = (*self._turn_numbers.get(turn.id, ()), turn.number)
            self.costs.append(self.new_turn_costs())
            c = self.costs[-1]
            for cost in (c.verbatim, c.full, c.open):
                cost.message(self.rules.message_overhead, "user")
            for b in blocks:
                t, text = self._block_tokens(b, thinking=True)
                for cost in (c.verbatim, c.full, c.open):
                    cost.add(t, text)
            return
        self.index.add_user(entry)
        if not self.costs:
            return
        c = self.costs[-1]
        for cost in (c.verbatim, c.full, c.open):
            cost.message(self.rules.message_overhead, "user")
        tools = self._tools
        for b in blocks:
            t, text = self._block_tokens(b, thinking=True)
            c.verbatim.add(t, text)
            c.open.add(t, text)
            if b.get("type") == "tool_result":
                use_id = str(b.get("tool_use_id", ""))
                tool = tools.get(use_id, "")
                if tool.startswith(CARD_TOOL_PREFIX):
                    ack = canonical_json({"presentation": use_id, "ok": True})
                    c.full.add(self.count(ack), ack)
                else:
                    digest = self.rules.digest_result(
                        text, tool=tool, is_error=bool(b.get("is_error")), evidence_id=use_id)
                    c.full.add(self.count(digest), digest)
            else:
                c.full.add(t, text)

    def _account_assistant(self, blocks: list[dict[str, Any]]) -> None:
        c = self.costs[-1]
        for cost in (c.verbatim, c.full, c.open):
            cost.message(self.rules.message_overhead, "assistant")
        for b in blocks:
            if b.get("type") == "tool_use":
                self._tools[str(b.get("id", ""))] = str(b.get("name", ""))
            t, text = self._block_tokens(b, thinking=True)
            c.verbatim.add(t, text)
            c.open.add(t, text)
            if b.get("type") != "thinking":
                c.full.add(t, text)

    def _card(self, turn: Turn) -> None:
        costs = self.costs[turn.number - 1]
        line = self.rules.card_line(turn.number, turn.card, asked=turn.asked,
                                    tools=turn.tools, narration=turn.narration)
        costs.card_tokens = self.count(line) + 1  # the line and its newline
        costs.card_digest = sha_hex(line)
        costs.card_line = line
        self._version += 1

    def _compaction(self, entry: Entry) -> None:
        summary = entry.data.get("summary")
        summary = summary if isinstance(summary, str) else ""
        if entry.data.get("reset_all") is True:
            text = self.rules.summary(summary)
            keep_open = entry.data.get("keeps_open_turn") is True
            turn = self.index.current
            replaced = len(self.index.turns) - (1 if keep_open and turn and not turn.closed
                                                 else 0)
            self.reset = (self.rules.message_overhead + self.count(text), sha_hex(text), replaced,
                          text)
            self._version += 1
            self.packets.clear()
            self.plan = None
        else:
            first, last = entry.data.get("first_turn_id"), entry.data.get("last_turn_id")
            if isinstance(first, str) and isinstance(last, str):
                self.store_packet(first, last, summary)
        self.on_compaction(entry)

    def store_packet(self, first: str, last: str, summary: str) -> int:
        """Hold a packet over turns ``first``..``last``; return its tokens in a request."""
        text = self.rules.summary(summary)
        tokens = self.rules.message_overhead + self.count(text)
        self.packets[(first, last)] = (tokens, sha_hex(text), text)
        self._version += 1
        return tokens

    def drop_packet(self, first: str, last: str) -> None:
        """Forget the packet held over turns ``first``..``last`` (:meth:`store_packet`)."""
        del self.packets[(first, last)]
        self._version += 1

    def _selection(self, entry: Entry) -> None:
        plan = entry.data.get("plan")
        if not isinstance(plan, dict):
            return
        modes: dict[str, str] = {}
        for item in as_list(plan.get("per_turn")):
            if type(item) is list and len(item) == 2:
                modes[str(item[0])] = str(item[1])
        rng = plan.get("packet_range")
        packet = (str(rng[0]), str(rng[1])) if isinstance(rng, list) and len(rng) == 2 else None
        self.plan = Plan(modes, packet, entry.id)
        self._version += 1

    def _receipt(self, entry: Entry) -> None:
        req = self.pending
        if req is None or entry.parent_id != req.entry_id:
            return
        req.provider = _text(entry.data.get("provider")) or req.provider
        digest = entry.data.get("prefix_digest")
        req.recorded_prefix_digest = digest if isinstance(digest, str) and digest else None
        req.recorded_prefix_tokens = token_count(entry.data.get("prefix_tokens"))
        if req.reported_input is None:
            req.reported_input, req.reported_output = input_and_output(winning_usage(entry.data))

    # -- the request ----------------------------------------------------------------
    def _closed_parts(self) -> ClosedPart:
        """Everything before the open turn, under the plan (see :mod:`pipeline.replay.closed`).

        Cached until something it depends on changes (a turn starts, a card, packet,
        reset, plan or prefix arrives), so the iterations of one turn cost O(1) each.
        Under the planner the plan depends on the open turn's size: no cache then.
        """
        key = (len(self.index.turns), self._version, self.prefix.digest)
        if self.planner is None and self._closed_cache is not None \
                and self._closed_cache[0] == key:
            return self._closed_cache[1]
        turns = self.index.turns
        start = self.reset[2] if self.reset is not None else 0
        plan = self.plan_request(turns[start:-1]) if self.planner is not None else self.plan
        wrapper_tokens, wrapper = self.turns_wrapper()
        folding = Folding(turns, self._turn_numbers, self._card_cost, self.packets,
                          self.reset, (self.rules.message_overhead + wrapper_tokens, wrapper))
        result = closed_part(self._sealed, folding, plan, self.prefix.digest)
        self._closed_cache = (key, result)
        return result

    def _card_cost(self, number: int) -> tuple[int, str] | None:
        costs = self.costs[number - 1]
        return None if costs.card_tokens is None else (costs.card_tokens, costs.card_digest)

    def plan_request(self, closed: list[Turn]) -> Plan:
        """The plan for the request about to be sent, under the planner, given the
        ``closed`` turns it may fold (those after any reset): planner v1's here.

        Called only when the engine has a planner; a subclass may plan otherwise (the
        compaction engine adds the packets the plan needs)."""
        wsp = self.working_set(closed)
        return Plan(wsp.modes, wsp.packet_range, "planner-v1")

    def working_set(self, closed: list[Turn]) -> WorkingSetPlan:
        """Planner v1's working set for the ``closed`` turns of the request about to be sent."""
        cap = self.planner
        assert cap is not None
        candidates = []
        for turn in closed:
            c = self.costs[turn.number - 1]
            card = c.card_tokens if c.card_tokens is not None else c.full.tokens
            candidates.append(Candidate(turn.number, turn.id, c.full.tokens, card,
                                        c.card_line or turn.asked))
        open_turn = self.index.turns[-1]
        budget = max(0, cap.input_limit - cap.output_reserve - self.rules.request_overhead
                     - self.prefix.tokens - self.tail[0] - self.costs[-1].open.tokens)
        return plan_v1(candidates, open_turn.asked, budget)

    def _replay(self, entry: Entry) -> RequestReplay:
        turn = self.index.current
        assert turn is not None
        self.on_request(entry)
        closed = self._closed_parts()
        open_cost = self.costs[-1].open
        tokens = (self.rules.request_overhead + self.prefix.tokens + closed.tokens
                  + open_cost.tokens + self.tail[0])
        digest = closed.request_digest(open_cost.hexdigest(), self.tail[1])
        reported_input, reported_output = input_and_output(usage_of(entry.meta.get("usage")))
        model = entry.meta.get("model")
        n = len(turn.iterations) + 1
        return RequestReplay(
            entry.id, turn.number, n, f"t{turn.number}/i{n}",
            model if isinstance(model, str) else self.header_model, entry.ts,
            tokens, self.prefix.tokens, self.prefix.digest, digest,
            closed.n_full, closed.card_turns, closed.packet_turns,
            closed.source,
            reported_input, reported_output, self.header_provider,
        )
