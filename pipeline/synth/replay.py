"""Consistent token figures for generated sessions: a replay engine run alongside the
generator. Pure (the tokenizer loads its bundled vocabulary, nothing else).

With ``consistent=True`` (the default of :func:`pipeline.synth.generator.generate_session`) the
generator keeps one incremental :class:`~pipeline.replay.engine.ReplayEngine` (rule set ``v1``)
per session and feeds it every entry of the session's *active chain* as it is built.
The figures vak measures are then taken from the engine instead of being drawn:

* an assistant message is fed with an empty ``meta.usage``; the request the engine
  rebuilds for it (:attr:`ReplayEngine.pending`, set as soon as the message is fed) gives
  the provider-reported input (``input + cache read + cache creation``), the receipt's
  ``prefix_digest`` and its ``prefix_tokens``; the usage object is filled in afterwards,
  before the entry is serialised (the engine reads usage only to report it, never to
  count);
* a ``turn_card`` is fed with zero ``tokens_full``/``tokens_card``: the Card line does not
  depend on them, so the engine's ``costs[n-1].full.tokens`` and ``card_tokens`` are read
  back and written into the card.

Replaying a generated (unfaulted) session under ``v1`` therefore reproduces every one of
these figures exactly, unless ``noise`` asks for provider-like drift in ``usage``.

**Branches.** The generator's only branch is a *re-ask*: a directive whose parent is the
entry before the previous turn's directive, which abandons that whole turn. The
generator knows the structure of the next turn before writing the current one, so when
the next turn re-asks, the engine is forked
(:meth:`~pipeline.replay.engine.ReplayEngine.fork`) before the current turn's directive
is fed; the turn is written with the live engine (its figures are
those a replay of *its* chain would give: abandoned work was paid for too), and the
re-ask restores the fork. No entry of an abandoned branch ever reaches the engine that
continues along the active chain.
"""

from __future__ import annotations

from typing import Any

from pipeline.ledger.reader import Entry
from pipeline.ledger.wire import LongText, RawEntry
from pipeline.replay.engine import ReplayEngine, RequestReplay
from pipeline.replay.projection import get_rule_set
from pipeline.replay.tokens import get_tokenizer

#: Rule set the generated figures follow.
RULE_SET = "v1"


def _plain(block: dict[str, Any]) -> dict[str, Any]:
    if not any(isinstance(v, LongText) for v in block.values()):
        return block
    return {k: v.text if isinstance(v, LongText) else v for k, v in block.items()}


def as_entry(e: RawEntry) -> Entry:
    """The :class:`~pipeline.ledger.reader.Entry` a reader gets back from ``e``'s line.

    ``data`` shares ``e``'s payload objects (a usage or card dict filled in after the
    entry is fed is what gets serialised); long texts are unwrapped.
    """
    data: dict[str, Any] = {"id": e.id, "parent_id": e.parent_id, "ts": e.ts}
    if e.at_turn is not None:
        data["at_turn"] = e.at_turn
    data["kind"] = e.kind
    data.update(e.payload)
    if e.kind == "message":
        msg = e.payload["message"]
        data["message"] = {**msg, "content": [_plain(b) for b in msg["content"]]}
    return Entry(line=0, id=e.id, parent_id=e.parent_id, kind=e.kind, ts=e.ts, prev_hash=None,
                 at_turn=e.at_turn, digest="", data=data)


class GeneratedReplay:
    """The engine that follows one generated session's active chain, and its fork."""

    def __init__(self) -> None:
        self.engine = ReplayEngine(get_rule_set(RULE_SET), get_tokenizer())
        self._saved: ReplayEngine | None = None

    def feed(self, e: RawEntry) -> None:
        """Feed one entry of the chain being written."""
        for _ in self.engine.feed(as_entry(e)):
            pass  # completed requests are not needed: pending is read when it is set

    def request(self) -> RequestReplay:
        """The request rebuilt for the assistant message fed last."""
        req = self.engine.pending
        assert req is not None, "no assistant message fed"
        return req

    def card_tokens(self, turn_id: str) -> tuple[int, int]:
        """``(tokens_full, tokens_card)`` of the turn whose card was fed last."""
        turn = self.engine.index.current
        assert turn is not None and turn.id == turn_id, "card of another turn"
        costs = self.engine.costs[turn.number - 1]
        assert costs.card_tokens is not None
        return costs.full.tokens, costs.card_tokens

    def checkpoint(self) -> None:
        """Remember the current state: the next turn will be abandoned."""
        self._saved = self.engine.fork()

    def rewind(self) -> None:
        """Go back to the checkpoint (a re-ask branches from there)."""
        assert self._saved is not None, "rewind without a checkpoint"
        self.engine, self._saved = self._saved, None
