"""``vakpipe show``: one replayed request as a person reads it. Pure.

The batch replay keeps only token counts and digests. To print a request, the
session is replayed once, by the batch replay itself, with a :class:`RenderingEngine`:
its costs also keep the text they account (:class:`TextCost`), and when it rebuilds the
chosen request :func:`render_request` reads the engine's state at that point. What is
printed is exactly what was counted, and the header figures (utilization, hint, drift)
are the ``requests`` row that same replay emitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import UsageError
from pipeline.ledger.entry import is_directive
from pipeline.ledger.reader import Entry
from pipeline.ledger.redact import redact
from pipeline.ledger.text import terminal_safe
from pipeline.replay.catalog import Capacity
from pipeline.replay.engine import Prefix, RenderedTokens, ReplayEngine, RequestReplay, TurnCosts
from pipeline.replay.projection import RuleSet, canonical_json
from pipeline.replay.scopes import Scope, parse_scope, pretty_scopes, scope_key
from pipeline.replay.session import turn_runs
from pipeline.replay.tokens import Tokenizer

#: Characters of one text printed before it is cut (``--full`` prints everything).
TEXT_LIMIT = 400


@dataclass(frozen=True, slots=True)
class Part:
    """One accounted segment of a message: a block's text, a digest, a card line..."""

    tokens: int
    text: str


@dataclass(slots=True)
class _Recorded:
    """A message as a :class:`TextCost` records it (mutable while its turn grows)."""

    role: str
    overhead: int
    parts: list[Part] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a rendered request and where in the projection it comes from."""

    role: str
    tokens: int
    source: str
    parts: tuple[Part, ...]


@dataclass(slots=True)
class TextCost(RenderedTokens):
    """A :class:`~pipeline.replay.engine.RenderedTokens` that also keeps what it accounts,
    by message."""

    messages: list[_Recorded] = field(default_factory=list)

    def message(self, tokens: int, role: str) -> None:
        """Start a message of ``role`` costing ``tokens`` beyond its content."""
        RenderedTokens.add(self, tokens, role)  # zero-argument super() fails in slots dataclasses
        self.messages.append(_Recorded(role, tokens))

    def add(self, tokens: int, text: str) -> None:
        """Account one segment of the current message."""
        RenderedTokens.add(self, tokens, text)
        if not tokens and not text:
            return  # a block the rule set does not render (an unknown type)
        if not self.messages:
            self.messages.append(_Recorded("?", 0))
        self.messages[-1].parts.append(Part(tokens, text))


class RenderingEngine(ReplayEngine):
    """A :class:`~pipeline.replay.engine.ReplayEngine` whose turns keep their rendered
    text, and which renders the request at ``scope`` (``tN/iM``; a form ``tN/iM/fK``
    names its iteration) as it rebuilds it: ``vakpipe show`` prints from the replay that
    made the request's row, never from a second derivation."""

    def __init__(self, rules: RuleSet, tokenizer: Tokenizer, *,
                 planner: Capacity | None = None, scope: str | None = None) -> None:
        super().__init__(rules, tokenizer, planner=planner)
        parsed = parse_scope(scope) if scope is not None else None
        self.wanted = ((parsed.turn, parsed.iter)
                       if parsed is not None and parsed.iter is not None else None)
        #: The request at ``scope``, once the replay has rebuilt it.
        self.rendered: RenderedRequest | None = None
        self._rendering = False

    def new_turn_costs(self) -> TurnCosts:
        """Costs that record their text (see :class:`TextCost`)."""
        return TurnCosts(TextCost(), TextCost(), TextCost())

    def on_request(self, entry: Entry) -> None:
        """Render the wanted request from the state it is rebuilt from (the scope it gets
        is the replay's own: its turn, and its iteration within it)."""
        turn = self.index.current
        if (self.wanted is None or self.rendered is not None or self._rendering
                or turn is None or (turn.number, len(turn.iterations) + 1) != self.wanted):
            return
        self._rendering = True  # render_request peeks: it calls this hook again
        try:
            self.rendered = render_request(self, entry)
        finally:
            self._rendering = False


@dataclass(frozen=True, slots=True)
class RenderedRequest:
    """A request rebuilt with its text: prefix, plan and messages in wire order."""

    request: RequestReplay
    prefix: Prefix
    system_tokens: int
    tools: tuple[tuple[str, int], ...]
    messages: tuple[Message, ...]
    full_turns: tuple[int, ...]
    card_turns: tuple[int, ...]
    packet_turns: tuple[int, ...]
    packet_found: bool
    reset_turns: int
    request_overhead: int

    @property
    def total(self) -> int:
        """Request overhead + prefix + messages: equals the replayed token count."""
        return self.request_overhead + self.prefix.tokens + sum(m.tokens for m in self.messages)


def _messages(cost: RenderedTokens, turn: int, label: str) -> list[Message]:
    """The recorded messages of one rendering of a turn, assistant ones as ``tN/iM``."""
    assert isinstance(cost, TextCost), "render with a RenderingEngine"
    out, iteration = [], 0
    for m in cost.messages:
        where = f"t{turn}"
        if m.role == "assistant":
            iteration += 1
            where = f"t{turn}/i{iteration}"
        tokens = m.overhead + sum(p.tokens for p in m.parts)
        out.append(Message(m.role, tokens, f"{where} {label}", tuple(m.parts)))
    return out


def _summary(tokens: int, text: str, source: str, overhead: int) -> Message:
    return Message("user", tokens, source, (Part(tokens - overhead, text),))


def render_request(engine: RenderingEngine, entry: Entry) -> RenderedRequest | None:
    """The request the assistant message ``entry`` completes, with its text.

    Parameters
    ----------
    engine : RenderingEngine
        Fed with the active chain up to, not including, ``entry``.
    entry : Entry
        The assistant message of the request.

    Returns
    -------
    RenderedRequest or None
        None when ``entry`` is not replayed (see :meth:`ReplayEngine.peek`).
    """
    req = engine.peek(entry)
    if req is None:
        return None
    rules, turns, overhead = engine.rules, engine.index.turns, engine.rules.message_overhead
    messages: list[Message] = []
    start = 0
    if engine.reset is not None:
        tokens, _, start, text = engine.reset
        messages.append(_summary(tokens, text, f"reset summary (replaces {start} turns)",
                                 overhead))
    packet = None
    if req.plan_packet_turns:
        ids = (turns[req.plan_packet_turns[0] - 1].id, turns[req.plan_packet_turns[-1] - 1].id)
        packet = engine.packets.get(ids)
        if packet is not None:
            messages.append(_summary(packet[0], packet[2],
                                     f"packet {turn_runs(list(req.plan_packet_turns))}",
                                     overhead))
    if req.plan_card_turns:
        wrapper_tokens = engine.turns_wrapper()[0]
        costs = [engine.costs[n - 1] for n in req.plan_card_turns]
        text = "\n".join([rules.turns_open(), *(c.card_line for c in costs), rules.turns_close()])
        tokens = wrapper_tokens + sum(c.card_tokens or 0 for c in costs)
        messages.append(Message("user", overhead + tokens,
                                f"Card {turn_runs(list(req.plan_card_turns))}",
                                (Part(tokens, text),)))
    folded = set(req.plan_card_turns) | set(req.plan_packet_turns)
    full = tuple(t.number for t in turns[start:-1] if t.number not in folded)
    planned = bool(req.plan_source)
    for n in full:
        c = engine.costs[n - 1]
        cost, label = (c.full, "Full") if planned else (c.verbatim, "verbatim")
        messages += _messages(cost, n, label)
    messages += _messages(engine.costs[-1].open, req.turn, "open")
    if engine.tail[0]:
        messages.append(_summary(engine.tail[0], engine.tail[2], "tail (newest intent)",
                                 overhead))
    prefix = engine.prefix
    tools = tuple((str(t.get("name", "?")) if isinstance(t, dict) else "?",
                   rules.tool_overhead + engine.count(canonical_json(t))) for t in prefix.tools)
    return RenderedRequest(req, prefix, engine.count(prefix.system), tools, tuple(messages),
                           full, req.plan_card_turns, req.plan_packet_turns,
                           packet is not None, start, rules.request_overhead)


def find_request(rows: list[dict[str, Any]], scope: str, session: str) -> dict[str, Any]:
    """The ``requests`` row of iteration ``scope`` (a form ``tN/iM/fK`` names its
    iteration).

    Parameters
    ----------
    rows : list of dict
        Every ``requests`` row of the session, in order.
    scope : str
        ``tN/iM`` (or ``tN/iM/fK``).
    session : str
        The session, for the messages.

    Raises
    ------
    UsageError
        The scope does not parse, is a bare turn, or has no request; the message names
        the nearest scopes that have one.
    """
    parsed = parse_scope(scope)
    if parsed is None:
        raise UsageError(f"--scope {scope!r} is not a request scope: expected tN/iM (e.g. t1/i1)")
    keys = sorted(k for r in rows if (k := scope_key(r["scope"])) is not None)
    if not keys:
        raise UsageError(f"{session} has no request to show (no assistant message after a "
                         "directive on its active chain)")
    wanted = (parsed.turn, parsed.iter if parsed.iter is not None else 0)
    if parsed.iter is not None:
        for r in rows:
            if scope_key(r["scope"]) == wanted:
                return r
    before = [k for k in keys if k < wanted][-1:]
    after = [k for k in keys if k > wanted][:1]
    nearest = ", ".join(str(Scope(*k)) for k in before + after)
    in_turn = pretty_scopes([Scope(*k) for k in keys if k[0] == parsed.turn], None)
    if parsed.iter is not None:
        what = f"no request at {scope} in {session}"
    elif in_turn:
        what = f"{scope} is a turn, not a request"
    else:
        # Not "a turn": the session may have no such turn at all.
        what = f"no request in {scope} of {session}"
    where = f"; t{parsed.turn} has {in_turn}" if in_turn else ""
    raise UsageError(f"{what}; nearest: {nearest}{where}")


def _cut(text: str, full: bool) -> str:
    # Redacted before the cut (a cut must not leave part of a secret behind), escaped
    # after it (a cut must not leave half an escape). A text's lines are meant.
    text = redact(text)
    if not full and len(text) > TEXT_LIMIT:
        text = f"{text[:TEXT_LIMIT]}… ({len(text) - TEXT_LIMIT} more chars)"
    return terminal_safe(text, multiline=True)


def _f(value: object) -> str:
    """One field of a line quoted from the ledger (a model name, an id): its control
    characters and line breaks escaped, so that it stays in its line."""
    return terminal_safe(str(value))


def _gutter(tokens: int | None, text: str) -> list[str]:
    """A text under a token gutter: the count on its first line, ``|`` on the next."""
    lines = text.split("\n")
    head = f"{tokens:>8,} | " if tokens is not None else f"{'':>8} | "
    return [head + lines[0], *(f"{'':>8} | {ln}" for ln in lines[1:])]


def _n(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def _header(row: Mapping[str, Any], r: RenderedRequest, capacity: Capacity | None,
            session: str, audit: Mapping[str, Any]) -> list[str]:
    req = r.request
    model = f"{_f(row['model'] or '?')} ({_f(row['provider'] or '?')})"
    window = (f"window {_n(capacity.input_limit)} input tokens, output reserve "
              f"{_n(capacity.output_reserve)}" if capacity else "unknown model: no window")
    reported = row["reported_input_tokens"]
    tokens = f"replayed {_n(row['replayed_tokens'])} · provider-reported " + (
        f"{_n(reported)} (drift {row['drift_tokens']:+,}) · output "
        f"{_n(row['reported_output_tokens'])}" if reported is not None else "none")
    sat, size = row["saturation"], _n(row["last_request_tokens"])
    context = (f"{size} of {_n(row['model_input_limit'])} = saturation {sat}% · headroom "
               f"{_n(row['headroom_tokens'])}" if sat is not None else f"{size}, no window")
    lines = [
        f"session   {_f(session)}",
        f"audit     {audit.get('status')} · {audit.get('errors', 0)} errors, "
        f"{audit.get('warnings', 0)} warnings · active chain {_n(audit.get('active_chain_len'))}"
        f" of {_n(audit.get('entries'))} entries",
        f"request   {req.scope} · entry {_f(req.entry_id)} · {_f(req.ts)}",
        f"model     {model} · {window}",
        f"tokens    {tokens}",
        f"context   {context} · turn total {_n(row['turn_total_tokens'])} · "
        f"hint {row['hint_level']}",
    ]
    if row["hint_text"]:
        lines.append(f"hint      {row['hint_text']}")
    lines += [f"now       {row['now_line']}", f"rules     {row['rules']}"]
    return lines


def _plan(r: RenderedRequest) -> list[str]:
    req = r.request
    source = req.plan_source
    if not source:
        lines = ["plan      none: closed turns verbatim (derive_messages)"]
    elif source == "planner-v1":
        lines = ["plan      planner v1 for the model's window (--planner)"]
    else:
        lines = [f"plan      recorded context_selection {_f(source)}"]
    kind = "Full" if source else "verbatim"
    lines.append(f"  {kind:<9} {turn_runs(list(r.full_turns)) or '-'}")
    if r.card_turns:
        lines.append(f"  {'Card':<9} {turn_runs(list(r.card_turns))}")
    if r.packet_turns:
        found = "summary sent" if r.packet_found else "omitted: no stored packet for the range"
        lines.append(f"  {'packet':<9} {turn_runs(list(r.packet_turns))} ({found})")
    if r.reset_turns:
        lines.append(f"  {'reset':<9} {turn_runs(list(range(1, r.reset_turns + 1)))} "
                     "replaced by the newest reset's summary")
    lines.append(f"  {'open':<9} t{req.turn}")
    return lines


def _prefix(row: Mapping[str, Any], r: RenderedRequest, full: bool) -> list[str]:
    p = r.prefix
    origin = ("header contract" if p.source == "header"
              else f"turn_capabilities_bound {_f(p.source)}")
    match = row["prefix_digest_match"]
    recorded = ("none recorded" if match is None else "matches the receipt's" if match
                else f"receipt recorded {_f(row['recorded_prefix_digest'][:12])}…")
    lines = [f"prefix    {_n(p.tokens)} tok from the {origin} · digest {p.digest[:12]}… "
             f"({recorded})",
             f"system    {_n(r.system_tokens)} tok"]
    lines += _gutter(None, _cut(p.system, full))
    tools = ", ".join(f"{_f(name)} {_n(n)}" for name, n in r.tools) or "none"
    lines.append(f"tools     {len(r.tools)} · {_n(sum(n for _, n in r.tools))} tok: {tools}")
    return lines


def format_request(row: Mapping[str, Any], rendered: RenderedRequest, *, session: str,
                   audit: Mapping[str, Any], capacity: Capacity | None = None,
                   full: bool = False, note: str | None = None) -> str:
    """The text ``vakpipe show`` prints for one request.

    Parameters
    ----------
    row : mapping
        The request's row of the ``requests`` table (utilization, hint, drift).
    rendered : RenderedRequest
        The request with its text (:attr:`RenderingEngine.rendered`).
    session : str
        The session's URL, for the header.
    audit : mapping
        The session's ``integrity/sessions`` row.
    capacity : Capacity, optional
        The model's capacity in the catalog in use.
    full : bool
        Print every text whole instead of cutting it at :data:`TEXT_LIMIT` characters.
    note : str, optional
        A line printed under the header (how the scope was read).

    Returns
    -------
    str
        Header, plan, prefix and messages, one line each (no trailing newline), with
        every credential redacted (:func:`pipeline.ledger.redact.redact`) and every control
        character escaped (:func:`pipeline.ledger.text.terminal_safe`).
    """
    lines = _header(row, rendered, capacity, session, audit)
    if note:
        lines.append(f"note      {_f(note)}")
    lines += ["", *_plan(rendered), "", *_prefix(row, rendered, full), ""]
    msgs = rendered.messages
    total = rendered.total
    lines.append(f"messages  {len(msgs)} · {_n(sum(m.tokens for m in msgs))} tok · request "
                 f"{_n(total)} = {rendered.request_overhead} + prefix "
                 f"{_n(rendered.prefix.tokens)} + messages")
    if total != rendered.request.replayed_tokens:  # a bug in the rendering: say so
        lines.append(f"WARNING   rendered total {total:,} != replayed "
                     f"{rendered.request.replayed_tokens:,}")
    for i, m in enumerate(msgs, 1):
        lines += ["", f"[{i}] {_f(m.role)} · {_n(m.tokens)} tok · {_f(m.source.strip())}"]
        for part in m.parts:
            lines += _gutter(part.tokens, _cut(part.text, full))
    # The texts were redacted before they were cut; the header quotes ids and names from
    # the ledger too, so the whole is redacted once more (and, a net for a field missed
    # above, escaped once more: every line break left is one of the lines above).
    return terminal_safe(redact("\n".join(lines)), multiline=True)


def _block_text(block: Mapping[str, Any]) -> str:
    """One content block of a transcript's message as text: its text, a tool call's name
    and input, a tool result's content, a thinking block's thought."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "tool_use":
        args = block.get("input")
        args = args if isinstance(args, str) else canonical_json(args)
        return f"tool_use {block.get('name', '?')} {args}"
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            content = "\n".join(str(b.get("text", "")) for b in content
                                if isinstance(b, dict) and b.get("type") == "text")
        return f"tool_result {content if isinstance(content, str) else canonical_json(content)}"
    if kind == "thinking":
        return f"thinking {block.get('thinking', '')}"
    return f"{kind if isinstance(kind, str) else '?'} block"


def _turn_messages(entries: Iterable[Entry], entry_id: str) -> tuple[list[Entry], Entry | None]:
    """The messages of the turn of the request carried by ``entry_id``, from its prompt
    to that line, and the line (``None`` if not on the chain)."""
    messages: list[Entry] = []
    for entry in entries:
        if entry.kind != "message" or entry.meta.get("mirror") is not None:
            continue
        if is_directive(entry):
            messages = []
        messages.append(entry)
        if entry.id == entry_id:
            return messages, entry
    return messages, None


def format_reported_request(row: Mapping[str, Any], entries: Iterable[Entry], *,
                            session: str, audit: Mapping[str, Any],
                            full: bool = False) -> str:
    """The text ``vakpipe show`` prints for a request of another agent's transcript.

    Such a transcript records no contract or projection, so the request cannot be
    rebuilt: what is printed is what the transcript holds for it, its reported usage
    and utilization (the ``requests`` row) and the messages of its turn, from the
    prompt to the request's line, as the transcript wrote them.

    Parameters
    ----------
    row : mapping
        The request's row of the ``requests`` table (``rules`` ``reported``).
    entries : iterable of Entry
        The transcript's active chain as its adapter reads it, root first.
    session : str
        The session's URL, for the header.
    audit : mapping
        The session's ``integrity/sessions`` row.
    full : bool
        Print every text whole instead of cutting it at :data:`TEXT_LIMIT` characters.

    Returns
    -------
    str
        Header and messages, credentials redacted and control characters escaped.
    """
    messages, carrier = _turn_messages(entries, row["entry_id"])
    usage = carrier.meta.get("usage") if carrier is not None else None
    parts = ""
    if isinstance(usage, dict):
        parts = (f" (input {_n(usage.get('input_tokens'))} · cache read "
                 f"{_n(usage.get('cache_read_input_tokens'))} · cache write "
                 f"{_n(usage.get('cache_creation_input_tokens'))})")
    sat, size = row["saturation"], _n(row["last_request_tokens"])
    window = (f"window {_n(row['model_input_limit'])} input tokens"
              if row["model_input_limit"] is not None else "unknown model: no window")
    context = (f"{size} of {_n(row['model_input_limit'])} = saturation {sat}% · headroom "
               f"{_n(row['headroom_tokens'])}" if sat is not None else f"{size}, no window")
    lines = [
        f"session   {_f(session)}",
        f"source    {_f(audit.get('source'))} transcript",
        f"audit     {audit.get('status')} · {audit.get('errors', 0)} errors, "
        f"{audit.get('warnings', 0)} warnings · active chain {_n(audit.get('active_chain_len'))}"
        f" of {_n(audit.get('entries'))} entries",
        f"request   {_f(row['scope'])} · entry {_f(row['entry_id'])} · "
        f"{_f(carrier.ts if carrier is not None else '?')}",
        f"model     {_f(row['model'] or '?')} ({_f(row['provider'] or '?')}) · {window}",
        f"tokens    provider-reported {_n(row['reported_input_tokens'])}{parts} · output "
        f"{_n(row['reported_output_tokens'])}",
        f"context   {context} · turn total {_n(row['turn_total_tokens'])} · "
        f"hint {row['hint_level']}",
    ]
    if row.get("hint_text"):
        lines.append(f"hint      {row['hint_text']}")
    lines += [f"rules     {row['rules']}: the transcript records no contract or projection; "
              "shown is what it holds, not a rebuilt request", "",
              f"messages  {len(messages)} of turn t{row['turn']}, from its prompt to this "
              "request"]
    for i, m in enumerate(messages, 1):
        lines += ["", f"[{i}] {_f(m.role or '?')} · entry {_f(m.id)} · {_f(m.ts)}"]
        for block in m.content:
            lines += _gutter(None, _cut(_block_text(block), full))
    return terminal_safe(redact("\n".join(lines)), multiline=True)
