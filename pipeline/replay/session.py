"""Replay one session into ``turns`` and ``requests`` rows, with utilization. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipeline.ledger.entry import ts_nanos
from pipeline.ledger.layout import SessionKey
from pipeline.ledger.reader import Entry
from pipeline.ledger.types import token_count
from pipeline.replay.catalog import Capacity, ModelCatalog
from pipeline.replay.engine import ReplayEngine, RequestReplay
from pipeline.replay.projection import RuleSet
from pipeline.replay.scopes import turn_range
from pipeline.replay.tokens import Tokenizer
from pipeline.replay.utilization import (
    HintLevel,
    HintState,
    hint_text,
    limit_columns,
    utilization,
)


@dataclass
class SessionReplay:
    """A session's replay: one row per turn and one per request."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: Rows of the ``compaction`` table and the packets a compacted copy gets appended.
    compaction: list[dict[str, Any]] = field(default_factory=list)
    packets: list[Any] = field(default_factory=list)


def _turn_runs(numbers: list[int]) -> str:
    """Whole turns as the ledger grammar writes them: ``t1-t3/*, t6/*``."""
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return _format_runs(runs)


def _format_runs(runs: list[tuple[int, int]]) -> str:
    return ", ".join(f"t{a}/*" if a == b else f"t{a}-t{b}/*" for a, b in runs)


def _runs_without(last: int, excluded: set[int]) -> list[tuple[int, int]]:
    """Runs of the turns ``1..last`` that are not in ``excluded``: O(excluded), not O(last)."""
    runs, prev = [], 0
    for x in [*sorted(e for e in excluded if e <= last), last + 1]:
        if x > prev + 1:
            runs.append((prev + 1, x - 1))
        prev = x
    return runs


#: Whole turns in the ledger grammar, for callers outside this module (``vakpipe show``).
turn_runs = _turn_runs


class NowLine:
    """Builds seed 001's ``folds-view`` "now" line for each request, incrementally.

    ``context U% · saved C/T (P%, ~N tok) · live <scopes>``: the wire is every iteration
    before the request; the saved ones are those of Card and packet turns, priced as
    their Full tokens minus what replaces them. Folding works on whole turns, so the
    closed-turn part is computed once per change of the projection (a new turn, a card,
    packet, reset or plan) and each request adds only its own turn. That computation
    touches the folded turns only (running sums of the closed turns' iterations; the
    live runs are the gaps between folded or empty turns), where walking every closed
    turn per change made a session with a plan per turn quadratic in its turns.
    """

    def __init__(self, engine: ReplayEngine) -> None:
        self.engine = engine
        self._key: tuple[object, ...] | None = None
        self._closed: tuple[int, int, int, list[tuple[int, int]]] = (0, 0, 0, [])
        self._iterations = [0]  # running sum of the closed turns' iterations
        self._empty: set[int] = set()  # closed turns without an iteration

    def _closed_part(self, req: RequestReplay) -> tuple[int, int, int, list[tuple[int, int]]]:
        key = (req.turn, req.plan_card_turns, req.plan_packet_turns)
        if key == self._key:
            return self._closed
        engine, sums = self.engine, self._iterations
        for t in engine.index.turns[len(sums) - 1: req.turn - 1]:
            sums.append(sums[-1] + len(t.iterations))
            if not t.iterations:
                self._empty.add(t.number)
        cards = set(req.plan_card_turns)
        folded_turns = cards.union(req.plan_packet_turns)
        folded = saved = 0
        for n in folded_turns:
            folded += sums[n] - sums[n - 1]
            c = engine.costs[n - 1]
            saved += c.full.tokens - ((c.card_tokens or 0) if n in cards else 0)
        live = _runs_without(req.turn - 1, folded_turns | self._empty)
        self._key, self._closed = key, (sums[req.turn - 1], folded, saved, live)
        return self._closed

    def line(self, req: RequestReplay, saturation: int | None) -> str:
        """The now line of ``req``."""
        total, folded, saved, live = self._closed_part(req)
        total += req.iteration - 1
        if req.iteration > 1:  # the request's own turn is live from its second iteration
            if live and live[-1][1] == req.turn - 1:
                live = [*live[:-1], (live[-1][0], req.turn)]
            else:
                live = [*live, (req.turn, req.turn)]
        live_text = "t*" if total and not folded else _format_runs(live) or "-"
        pct = round(100 * folded / total) if total else 0
        ctx = f"{saturation}%" if saturation is not None else "?%"
        return (f"context {ctx} · saved {folded}/{total} ({pct}%, ~{saved} tok) · "
                f"live {live_text}")


def packet_label(req: RequestReplay) -> str | None:
    """The packet range of a request's plan in the ledger grammar (``t3-t7/*``)."""
    return _turn_runs(sorted(req.plan_packet_turns)) or None


def replay_session(
    key: SessionKey,
    entries: Iterable[Entry],
    *,
    rules: RuleSet,
    tokenizer: Tokenizer,
    catalog: ModelCatalog,
    planner: Capacity | None = None,
    selected: set[str] | None = None,
    engine: ReplayEngine | None = None,
) -> SessionReplay:
    """Replay the active chain ``entries`` (root first) of one session.

    Parameters
    ----------
    key:
        The session's place in the archive.
    entries:
        The active chain, root first.
    rules, tokenizer, catalog:
        Rule set, token counter, model capacities.
    planner:
        Project every request under planner v1 for this capacity instead of the recorded
        plan in force.
    selected:
        Only emit requests whose ``tN/iM`` scope is in this set (all when ``None``).
    engine:
        A fresh engine to replay with (a compaction engine plans packets on the way);
        by default one made of ``rules``, ``tokenizer`` and ``planner``.
    """
    engine = engine if engine is not None else ReplayEngine(rules, tokenizer, planner=planner)
    out = SessionReplay()
    hint = HintState()
    now = NowLine(engine)
    turn_total: dict[int, int] = {}

    def emit(req: RequestReplay) -> None:
        size = req.reported_input if req.reported_input is not None else req.replayed_tokens
        turn_total[req.turn] = turn_total.get(req.turn, 0) + size
        cap = catalog.lookup(req.model)
        util = utilization(size, cap.input_limit if cap else None, turn_total[req.turn])
        level = hint.update(util)
        if selected is not None and req.scope not in selected:
            return
        # every turn before the request's own is closed (or interrupted): settled
        settled = turn_range(1, req.turn - 1) if req.turn > 1 else None
        out.requests.append({
            "session_path": key.path,
            "scope": req.scope,
            "turn": req.turn,
            "iteration": req.iteration,
            "entry_id": req.entry_id,
            "model": req.model,
            "provider": req.provider,
            "model_known": cap is not None,
            "rules": rules.name,
            "replayed_tokens": req.replayed_tokens,
            "reported_input_tokens": req.reported_input,
            "reported_output_tokens": req.reported_output,
            "drift_tokens": (req.reported_input - req.replayed_tokens
                             if req.reported_input is not None else None),
            "recorded_prefix_digest": req.recorded_prefix_digest,
            "replayed_prefix_digest": req.prefix_digest,
            "prefix_digest_match": (req.recorded_prefix_digest == req.prefix_digest
                                    if req.recorded_prefix_digest else None),
            "recorded_prefix_tokens": req.recorded_prefix_tokens,
            "replayed_prefix_tokens": req.prefix_tokens,
            "plan_source": req.plan_source or "none",
            "plan_full": req.plan_full,
            "plan_card": len(req.plan_card_turns),
            "plan_packet_range": packet_label(req),
            "request_digest": req.request_digest,
            "last_request_tokens": size,
            **limit_columns(util),
            "turn_total_tokens": turn_total[req.turn],
            "hint_level": level.label,
            "hint_text": (hint_text(level, util, settled=settled, open_scope=f"t{req.turn}")
                          if util is not None and level is not HintLevel.NONE else None),
            "now_line": now.line(req, util.saturation if util else None),
        })

    for entry in entries:
        for req in engine.feed(entry):
            emit(req)
    for req in engine.finish():
        emit(req)
    for t in engine.index.turns:
        c = engine.costs[t.number - 1]
        card = t.card or {}
        inputs = [i.reported_input for i in t.iterations if i.reported_input is not None]
        outputs = [i.reported_output for i in t.iterations if i.reported_output is not None]
        out.turns.append({
            "session_path": key.path,
            "turn": t.number,
            "scope": t.scope,
            "turn_id": t.id,
            "state": t.state.value,
            "iterations": len(t.iterations),
            "forms": t.forms,
            "has_card": t.card is not None,
            "tokens_full": c.full.tokens,
            "tokens_card": c.card_tokens,
            "recorded_tokens_full": token_count(card.get("tokens_full")),
            "recorded_tokens_card": token_count(card.get("tokens_card")),
            "reported_input_tokens": sum(inputs) if inputs else None,
            "reported_output_tokens": sum(outputs) if outputs else None,
            # A timestamp like every other ts column (a text that is none: null).
            "first_ts": ts_nanos(t.first_ts),
        })
    return out
