"""The closed part of a request and the now line's closed part, against their plain
definitions: a walk over every closed turn, as the replay did before it kept running
sums (the shortcuts must give the same tokens, turns and digests on any plan)."""

from __future__ import annotations

import hashlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.replay_closed import Folding, Plan, SealedTurns, closed_part
from pipeline.session_replay import _runs_without, _turn_runs
from pipeline.turns import Turn


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _by_definition(turns: list[Turn], costs: list[dict[str, Any]], folding: Folding,
                   plan: Plan | None, prefix: str, open_digest: str, tail: str,
                   ) -> tuple[int, int, tuple[int, ...], tuple[int, ...], str]:
    """Every closed turn walked in order, the packet range opened and closed on the way."""
    tokens, parts, start = 0, [], 0
    if folding.reset is not None:
        tokens, parts, start = folding.reset[0], [folding.reset[1]], folding.reset[2]
    n_full, cards, packet, card_tokens, card_parts, full_parts = 0, [], [], 0, [], []
    packet_open = None
    for turn in turns[start:-1]:
        c = costs[turn.number - 1]
        if plan is None:
            tokens += c["verbatim"][0]
            full_parts.append(c["verbatim"][1])
            n_full += 1
            continue
        mode = plan.modes.get(turn.id, "Full")
        if plan.packet_range and turn.id == plan.packet_range[0]:
            packet_open = plan.packet_range[1]
        if packet_open is not None or mode == "Packet":
            packet.append(turn.number)
            if packet_open is not None and turn.id == packet_open:
                packet_open = None
            continue
        if mode == "Card" and c["card"] is not None:
            card_tokens += c["card"][0]
            card_parts.append(c["card"][1])
            cards.append(turn.number)
        else:
            tokens += c["full"][0]
            full_parts.append(c["full"][1])
            n_full += 1
    head = []
    if packet:
        cost = folding.packets.get((turns[packet[0] - 1].id, turns[packet[-1] - 1].id))
        if cost is not None:
            tokens += cost[0]
            head.append(cost[1])
    if card_parts:
        tokens += folding.turns_wrapper[0] + card_tokens
        head.append(_sha(folding.turns_wrapper[1] + "".join(card_parts)))
    digest = _sha("|".join([prefix, *parts, *head, *full_parts, open_digest, tail]))
    return tokens, n_full, tuple(cards), tuple(packet), digest


@st.composite
def _closed_cases(draw: st.DrawFn) -> tuple[Any, ...]:
    n = draw(st.integers(1, 14))
    # a few repeated ids: the ledger's ids are unique, hostile input's need not be
    ids = [draw(st.sampled_from([f"u{i}", f"u{i}", "dup", "u0"])) for i in range(n)]
    turns = [Turn(i + 1, ids[i], "", "") for i in range(n)]
    costs = [{"verbatim": (draw(st.integers(0, 50)), _sha(f"v{i}")),
              "full": (draw(st.integers(0, 50)), _sha(f"f{i}")),
              "card": draw(st.none() | st.just((3 + i, _sha(f"c{i}"))))} for i in range(n)]
    known = [*ids, "absent"]
    plan = draw(st.none() | st.builds(
        Plan,
        st.dictionaries(st.sampled_from(known), st.sampled_from(["Full", "Card", "Packet", "?"])),
        st.none() | st.tuples(st.sampled_from(known), st.sampled_from(known)),
        st.just("plan")))
    packets = {(a, b): (7, _sha(f"p{a}{b}"), "") for a in known for b in known
               if draw(st.booleans())}
    reset = draw(st.none() | st.integers(0, n).map(lambda r: (11, _sha("reset"), r, "")))
    return turns, costs, plan, packets, reset


@settings(max_examples=500, deadline=None)
@given(_closed_cases())
def test_closed_part_is_the_walk_over_every_closed_turn(case: tuple[Any, ...]) -> None:
    turns, costs, plan, packets, reset = case
    sealed = SealedTurns()
    numbers: dict[str, tuple[int, ...]] = {}
    for t, c in zip(turns, costs, strict=True):
        sealed.seal(c["verbatim"], c["full"])
        numbers[t.id] = (*numbers.get(t.id, ()), t.number)
    folding = Folding(turns, numbers, lambda n: costs[n - 1]["card"], packets, reset,
                      (5, "<turns>\n\n</turns>"))
    got = closed_part(sealed, folding, plan, "prefix")
    want = _by_definition(turns, costs, folding, plan, "prefix", "open", "tail")
    assert (got.tokens, got.n_full, got.card_turns, got.packet_turns,
            got.request_digest("open", "tail")) == want


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 40), st.sets(st.integers(1, 45)))
def test_live_runs_are_the_gaps_between_excluded_turns(last: int, excluded: set[int]) -> None:
    want = _turn_runs([n for n in range(1, last + 1) if n not in excluded])
    assert ", ".join(f"t{a}/*" if a == b else f"t{a}-t{b}/*"
                     for a, b in _runs_without(last, excluded)) == want
