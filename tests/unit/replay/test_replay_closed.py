"""The closed part of a request and the now line's closed part, against their plain
definitions: a walk over every closed turn, as the replay did before it kept running
sums (the shortcuts must give the same tokens, turns and digests on any plan)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.replay.closed import Folding, Plan, SealedTurns, closed_part
from pipeline.replay.session import _runs_without, _turn_runs
from pipeline.replay.turns import Turn


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


@st.composite
def _growing_cases(draw: st.DrawFn) -> tuple[Any, ...]:
    """A session's closed parts rebuilt turn after turn, as the engine does: each step
    may bring a new plan, packet or reset (or keep them), so a running state is extended,
    reused, or refused when what it hashed is no longer what the request carries."""
    turns, costs, _, packets, _ = draw(_closed_cases())
    n = len(turns)
    known = [t.id for t in turns] + ["absent"]
    plans = [None, *draw(st.lists(st.builds(
        Plan,
        st.dictionaries(st.sampled_from(known), st.sampled_from(["Full", "Card", "Packet"])),
        st.none() | st.tuples(st.sampled_from(known), st.sampled_from(known)),
        st.just("plan")), max_size=3))]
    steps = [(draw(st.sampled_from(plans)),
              draw(st.none() | st.integers(0, k - 1).map(lambda r: (11, _sha(f"r{r}"), r, ""))),
              draw(st.sampled_from(["", "x", "y"])))
             for k in range(1, n + 1)]
    return turns, costs, packets, steps


@settings(max_examples=300, deadline=None)
@given(_growing_cases())
def test_closed_parts_built_turn_after_turn_are_the_walk(case: tuple[Any, ...]) -> None:
    turns, costs, packets, steps = case
    sealed = SealedTurns()
    numbers: dict[str, tuple[int, ...]] = {}
    for k, (plan, reset, prefix) in enumerate(steps, 1):
        if k > 1:  # the previous turn closed when this one started
            c = costs[k - 2]
            sealed.seal(c["verbatim"], c["full"])
        t = turns[k - 1]
        numbers[t.id] = (*numbers.get(t.id, ()), t.number)
        folding = Folding(turns[:k], dict(numbers), lambda n: costs[n - 1]["card"], packets,
                          reset, (5, "<turns>\n\n</turns>"))
        # twice: the second build of the same part reuses the running state whole
        for _ in range(2):
            got = closed_part(sealed, folding, plan, f"prefix{prefix}")
            want = _by_definition(turns[:k], costs, folding, plan, f"prefix{prefix}", "open",
                                  "tail")
            assert (got.tokens, got.n_full, got.card_turns, got.packet_turns,
                    got.request_digest("open", "tail")) == want
    # a fork's copy builds the same parts, and never changes the original's
    fork = sealed.copy()
    c = costs[-1]
    fork.seal(c["verbatim"], c["full"])
    plan, reset, prefix = steps[-1]
    folding = Folding(turns, numbers, lambda n: costs[n - 1]["card"], packets, reset,
                      (5, "<turns>\n\n</turns>"))
    assert closed_part(fork, folding, plan, prefix).request_digest("o", "t") \
        == closed_part(sealed, folding, plan, prefix).request_digest("o", "t")


class _CountingHashes:
    """Stands for :mod:`hashlib` in :mod:`pipeline.replay.closed`: counts the bytes hashed."""

    def __init__(self) -> None:
        self.bytes = 0

    def sha256(self, data: bytes = b"") -> Any:
        return _CountingHash(self, hashlib.sha256(data), len(data))


class _CountingHash:
    def __init__(self, counter: _CountingHashes, h: Any, n: int) -> None:
        self.counter, self.h = counter, h
        counter.bytes += n

    def update(self, data: bytes) -> None:
        self.counter.bytes += len(data)
        self.h.update(data)

    def copy(self) -> _CountingHash:
        return _CountingHash(self.counter, self.h.copy(), 0)

    def hexdigest(self) -> str:
        return str(self.h.hexdigest())


def _bytes_hashed_per_turn(monkeypatch: Any, closed: int, plan: Plan | None) -> int:
    """Bytes the closed part hashes when one more turn closes after ``closed`` turns
    (the work of the requests of a new turn: the rest is O(1) per request)."""
    import pipeline.replay.closed as rc

    counter = _CountingHashes()
    monkeypatch.setattr(rc, "hashlib", counter)
    sealed = SealedTurns()
    turns = [Turn(i + 1, f"u{i + 1}", "", "") for i in range(closed + 2)]
    numbers = {t.id: (t.number,) for t in turns}
    packets = {("u2", "u3"): (7, _sha("p"), "")}
    for n in range(1, closed + 3):
        if n > 1:
            sealed.seal((3, _sha(f"v{n - 1}")), (2, _sha(f"f{n - 1}")))
        folding = Folding(turns[:n], numbers, lambda k: (1, _sha(f"c{k}")), packets, None,
                          (5, "<turns>\n\n</turns>"))
        before = counter.bytes
        part = closed_part(sealed, folding, plan, "prefix")
        part.request_digest("open", "tail")
    assert part.n_full == closed + 1 - len(part.card_turns) - len(part.packet_turns)
    return counter.bytes - before


@pytest.mark.parametrize("plan", [None, Plan({"u5": "Card", "u9": "Packet"}, ("u2", "u3"),
                                             "plan")])
def test_a_new_turn_hashes_the_same_whatever_the_closed_turns_before_it(
        monkeypatch: Any, plan: Plan | None) -> None:
    """The work a turn adds to the closed part (bytes hashed, a count free of noise) is
    the same after 1,000 closed turns as after 5,000: the running state is extended by
    the turn that closed, where rebuilding it hashed every closed turn's digest again
    (~65 bytes each: 325 KB per turn at 5,000, quadratic over a session)."""
    small = _bytes_hashed_per_turn(monkeypatch, 1_000, plan)
    large = _bytes_hashed_per_turn(monkeypatch, 5_000, plan)
    assert small == large
    assert large < 1_000  # one digest and the request's own open turn and tail
