"""The TurnIndex (spec section 4): turns, iterations and forms over the active chain.
Pure.

A *directive* (a user message without ``meta.control``, with text and no
``tool_result``) starts turn ``tN``; every assistant message is iteration ``tN/iM``;
every ``tool_use`` block in it is form ``tN/iM/fK``. Only the last turn can be open; a
turn is closed once its last message is an assistant message without ``tool_use`` (vak
T17), and a turn followed by another directive without that is closed as
*interrupted*.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from pipeline.ledger.entry import input_and_output, usage_of
from pipeline.ledger.reader import Entry


class TurnState(enum.Enum):
    """Where a turn stands."""

    OPEN = "open"
    CLOSED = "closed"
    INTERRUPTED = "interrupted"


@dataclass(slots=True)
class Iteration:
    """One provider request of a turn: an assistant message and what answered it."""

    number: int
    entry_id: str
    forms: int
    reported_input: int | None = None
    reported_output: int | None = None


@dataclass(slots=True)
class Turn:
    """One turn of the index, with what the projection needs of it."""

    number: int
    id: str
    asked: str
    first_ts: str
    iterations: list[Iteration] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    narration: str = ""
    card: dict[str, Any] | None = None
    state: TurnState = TurnState.OPEN
    last_is_final: bool = False

    @property
    def scope(self) -> str:
        """``tN``."""
        return f"t{self.number}"

    @property
    def forms(self) -> int:
        """``tool_use`` blocks over all iterations."""
        return sum(i.forms for i in self.iterations)

    @property
    def closed(self) -> bool:
        """Closed or interrupted: it projects as a closed turn."""
        return self.state is not TurnState.OPEN


def is_control(entry: Entry) -> bool:
    """A runtime-authored nudge (``meta.control``): never a turn, never an iteration."""
    return bool(entry.meta.get("control"))


def text_of(blocks: list[dict[str, Any]]) -> str:
    """The text blocks of a message, joined."""
    return "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")


def tool_uses(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``tool_use`` blocks of a message."""
    return [b for b in blocks if b.get("type") == "tool_use"]


@dataclass
class TurnIndex:
    """Turns of one session's active chain, built one entry at a time."""

    turns: list[Turn] = field(default_factory=list)

    @property
    def current(self) -> Turn | None:
        """The last turn (the only one that can be open)."""
        return self.turns[-1] if self.turns else None

    def start_turn(self, entry: Entry) -> Turn:
        """A directive: close the previous turn (interrupted if it had no answer)."""
        prev = self.current
        if prev is not None and prev.state is TurnState.OPEN:
            prev.state = TurnState.CLOSED if prev.last_is_final else TurnState.INTERRUPTED
        turn = Turn(len(self.turns) + 1, entry.id, text_of(entry.content), entry.ts)
        self.turns.append(turn)
        return turn

    def add_assistant(self, entry: Entry) -> Iteration | None:
        """An assistant message: a new iteration of the current turn (``None`` if none)."""
        turn = self.current
        if turn is None:
            return None
        blocks = entry.content
        uses = tool_uses(blocks)
        it = Iteration(len(turn.iterations) + 1, entry.id, len(uses),
                       *input_and_output(usage_of(entry.meta.get("usage"))))
        turn.iterations.append(it)
        turn.tools.extend(str(b.get("name", "?")) for b in uses)
        turn.last_is_final = not uses
        if not uses:
            turn.narration = text_of(blocks)
        turn.state = TurnState.CLOSED if not uses else TurnState.OPEN
        return it

    def add_part(self, entry: Entry, it: Iteration) -> None:
        """Another line of a request streamed over several (another agent's transcript:
        one line per content block), already iteration ``it`` of the current turn: its
        tool calls are forms of that iteration."""
        turn = self.current
        if turn is None:
            return
        blocks = entry.content
        uses = tool_uses(blocks)
        it.forms += len(uses)
        turn.tools.extend(str(b.get("name", "?")) for b in uses)
        if uses:
            turn.last_is_final = False
            turn.state = TurnState.OPEN
        elif it.forms == 0:
            turn.last_is_final = True
            turn.state = TurnState.CLOSED
            turn.narration = "\n".join(t for t in (turn.narration, text_of(blocks)) if t)

    def add_user(self, entry: Entry) -> None:
        """A non-directive user message (tool results, control): the turn stays open."""
        turn = self.current
        if turn is not None:
            turn.last_is_final = False
            turn.state = TurnState.OPEN

    def add_card(self, entry: Entry) -> None:
        """A ``turn_card``: attach it to its turn."""
        card = entry.data.get("card")
        turn_id = entry.data.get("turn_id")
        for turn in reversed(self.turns):
            if turn.id == turn_id:
                turn.card = card if isinstance(card, dict) else None
                return
