"""Replay one session into ``turns`` and ``requests`` rows, with utilization. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipeline.catalog import Capacity, ModelCatalog
from pipeline.layout import SessionKey
from pipeline.projection import RuleSet
from pipeline.reader import Entry
from pipeline.replay import ReplayEngine, RequestReplay
from pipeline.scopes import pretty_scopes
from pipeline.tokens import Tokenizer
from pipeline.turns import Turn
from pipeline.utilization import HintLevel, HintState, hint_text, utilization


@dataclass
class SessionReplay:
    """A session's replay: one row per turn and one per request."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)


def _iteration_scopes(turns: Iterable[Turn], upto: tuple[int, int] | None = None) -> list[str]:
    out: list[str] = []
    for t in turns:
        for it in t.iterations:
            if upto is not None and (t.number, it.number) >= upto:
                return out
            out.append(f"t{t.number}/i{it.number}")
    return out


def now_line(req: RequestReplay, engine: ReplayEngine, saturation: int | None) -> str:
    """The ``folds-view`` "now" line for one request.

    ``context U% · saved C/T (P%, ~N tok) · live <scopes>``: the wire is every
    iteration before this request; saved are those behind a Card or a packet, priced in
    the tokens their Full rendering would have cost beyond what replaces it.
    """
    turns = engine.index.turns
    universe = _iteration_scopes(turns, (req.turn, req.iteration))
    folded_turns = set(req.plan_card_turns) | set(req.plan_packet_turns)
    folded = [s for s in universe if int(s[1:s.index("/")]) in folded_turns]
    live = [s for s in universe if s not in set(folded)]
    saved_tokens = 0
    for n in folded_turns:
        c = engine.costs[n - 1]
        saved_tokens += c.full.tokens - (c.card_tokens or 0 if n in req.plan_card_turns else 0)
    total = len(universe)
    pct = round(100 * len(folded) / total) if total else 0
    ctx = f"{saturation}%" if saturation is not None else "?%"
    return (f"context {ctx} · saved {len(folded)}/{total} ({pct}%, ~{saved_tokens} tok) · "
            f"live {pretty_scopes(live, universe) or '-'}")


def packet_label(req: RequestReplay, engine: ReplayEngine) -> str | None:
    """The packet range of a request's plan as a pretty scope (``t3-t7/*``)."""
    if not req.plan_packet_turns:
        return None
    packed = set(req.plan_packet_turns)
    turns = engine.index.turns
    universe = _iteration_scopes(turns, (req.turn, req.iteration))
    scopes = [s for s in universe if int(s[1:s.index("/")]) in packed]
    return pretty_scopes(scopes, universe) or ", ".join(f"t{n}" for n in sorted(packed))


def replay_session(
    key: SessionKey,
    entries: Iterable[Entry],
    *,
    rules: RuleSet,
    tokenizer: Tokenizer,
    catalog: ModelCatalog,
    planner: Capacity | None = None,
    selected: set[str] | None = None,
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
    """
    engine = ReplayEngine(rules, tokenizer, planner=planner)
    out = SessionReplay()
    hint = HintState()
    turn_total: dict[int, int] = {}

    def emit(req: RequestReplay) -> None:
        size = req.reported_input if req.reported_input is not None else req.replayed_tokens
        turn_total[req.turn] = turn_total.get(req.turn, 0) + size
        cap = catalog.lookup(req.model)
        util = utilization(size, cap.input_limit if cap else None, turn_total[req.turn])
        level = hint.update(util)
        if selected is not None and req.scope not in selected:
            return
        closed = [t.number for t in engine.index.turns if t.number < req.turn]
        settled = f"t{closed[0]}-t{closed[-1]}" if closed else None
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
            "plan_packet_range": packet_label(req, engine),
            "request_digest": req.request_digest,
            "last_request_tokens": size,
            "model_input_limit": util.model_input_limit if util else None,
            "saturation": util.saturation if util else None,
            "headroom_tokens": util.headroom_tokens if util else None,
            "auto_compress_above": util.auto_compress_above if util else None,
            "turn_total_tokens": turn_total[req.turn],
            "hint_level": level.label,
            "hint_text": (hint_text(level, util, settled=settled, open_scope=f"t{req.turn}")
                          if util is not None and level is not HintLevel.NONE else None),
            "now_line": now_line(req, engine, util.saturation if util else None),
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
            "recorded_tokens_full": card.get("tokens_full") if isinstance(
                card.get("tokens_full"), int) else None,
            "recorded_tokens_card": card.get("tokens_card") if isinstance(
                card.get("tokens_card"), int) else None,
            "reported_input_tokens": sum(inputs) if inputs else None,
            "reported_output_tokens": sum(outputs) if outputs else None,
            "first_ts": t.first_ts,
        })
    return out
