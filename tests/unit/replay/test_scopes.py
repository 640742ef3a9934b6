"""The scope grammar of seed 001 (pipeline.replay.scopes): docstring examples and properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.replay.scopes import (
    FOLD_KEY_GRAMMAR,
    FoldKey,
    FoldRefusal,
    Scope,
    compress_scopes,
    expand_through,
    fold_key,
    folds_view_now,
    intent_ranges,
    join_scopes,
    parse_fold_key_to_scopes,
    parse_scope,
    pretty_scopes,
    scope_key,
    supersede_summaries,
    turn_key,
)


def wire(**turns: int) -> list[str]:
    """``wire(t1=2, t3=1)`` -> ``["t1/i1", "t1/i2", "t3/i1"]``."""
    return [f"{t}/i{i}" for t, n in turns.items() for i in range(1, n + 1)]


U = wire(t1=2, t2=1, t3=8, t5=1)


def intent(key: str) -> dict[str, Any]:
    parsed = fold_key(key)
    assert isinstance(parsed, FoldKey), parsed
    return parsed.intent


def resolve(key: str, universe: list[str], turns: list[int] | None = None) -> dict[str, Any]:
    return expand_through([intent(key)], universe, turns)[0]


def selected(key: str, universe: list[str]) -> set[str]:
    return set(resolve(key, universe)["scopes"])


# --- scope parsing ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "scope"),
    [("t3", Scope(3)), ("t1/i2", Scope(1, 2)), ("t1/i2/f3", Scope(1, 2, 3)),
     ("t0", None), ("t01/i2", None), ("t1/i", None), ("t1/f2", None), (" t1", None),
     ("t1/i2/f3/x", None), ("T1", None), ("t١", None), (7, None), ("t" + "9" * 19, None)],
)
def test_parse_scope(text: object, scope: Scope | None) -> None:
    assert parse_scope(text) == scope
    if scope is not None:
        assert str(scope) == text


def test_scope_key_and_turn_key() -> None:
    assert scope_key("t1/i2") == scope_key("t1/i2/f3") == scope_key(Scope(1, 2, 9)) == (1, 2)
    assert scope_key("t1") is None and scope_key("junk") is None
    assert turn_key("t1") == 1
    assert turn_key("t1/i2") is None and turn_key("x") is None


# --- compress / pretty ----------------------------------------------------------------


def test_compress_scopes_seed_rules() -> None:
    sel = ["t1/i1", "t1/i2", "t2/i1", "t3/i3", "t3/i4", "t3/i7", "t3/i8", "t5/i1", "bad"]
    assert compress_scopes(sel, [*U, "nonsense"]) == [
        "t1-t2/*", "t3/i3-i4", "t3/i7-i8", "t5/*"]
    assert compress_scopes(U, U) == ["t*"]
    assert compress_scopes(["t3/i2"], U) == ["t3/i2"]
    assert compress_scopes(["t5/i1", "t1/i1", "t1/i2"], U) == ["t1/*", "t5/*"]
    assert compress_scopes([], U) == []
    assert compress_scopes(["t1/i1", "t1/i2"], None) == ["t1/i1-i2"]
    # a scope outside the universe keeps its turn explicit instead of vanishing in t1/*
    assert compress_scopes(["t1/i1", "t1/i2", "t1/i3"], U) == ["t1/i1-i3"]


def test_pretty_scopes_seed_examples() -> None:
    sel = ["t3/i3", "t3/i4", "t3/i7", "t3/i8"]
    assert pretty_scopes(sel, U) == "t3/i3-i4,i7-i8"
    assert pretty_scopes(wire(t3=1, t4=1, t5=1, t6=1, t7=1),
                         wire(t1=1, t3=1, t4=1, t5=1, t6=1, t7=1)) == "t3-t7/*"
    assert pretty_scopes(["t1/i1", "t1/i2", *sel, "t5/i1"], U) == "t1/*, t3/i3-i4,i7-i8, t5/*"
    assert pretty_scopes(U, U) == "t*"
    assert pretty_scopes(U, None) == pretty_scopes(U, []) == "t1/i1-i2, t2/i1, t3/i1-i8, t5/i1"
    assert pretty_scopes([], U) is None and pretty_scopes(["x", "t3"], U) is None
    assert join_scopes([]) is None
    assert join_scopes(["t1/*", "t2/i1", "t2/i3-i4", "t3/i1"]) == "t1/*, t2/i1,i3-i4, t3/i1"


# --- fold_key -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected", "label"),
    [
        ("t2", {"scopes": ["t2"]}, "t2"),
        ("t2/i5", {"scopes": ["t2/i5"]}, "t2/i5"),
        ("t2/i5/f3", {"scopes": ["t2/i5"]}, "t2/i5"),
        ("t2/i1-i56", {"from": "t2/i1", "to": "t2/i56"}, "t2/i1-i56"),
        ("t2/i1..t2/i56", {"from": "t2/i1", "to": "t2/i56"}, "t2/i1-i56"),
        ("t1/i3-t4", {"from": "t1/i3", "to": "t4"}, "t1/i3-t4"),
        ("-t2/i56", {"through": "t2/i56"}, "-t2/i56"),
        ("t2/i5-", {"since": "t2/i5"}, "t2/i5-"),
        ("t2/i5..", {"since": "t2/i5"}, "t2/i5-"),
        ("t1, t2/i1-i3", {"scopes": ["t1"], "from": "t2/i1", "to": "t2/i3"}, "t1, t2/i1-i3"),
        ("t1/i61-i98, t3/i111-i135",
         {"from": "t1/i61", "to": "t1/i98", "ranges": [{"from": "t3/i111", "to": "t3/i135"}]},
         "t1/i61-i98, t3/i111-i135"),
        ("t4/i2 t1 t4/i2", {"scopes": ["t1", "t4/i2"]}, "t4/i2, t1"),
        ("t*", {"since": "t1"}, "t*"),
        ("t3-t7/*", {"from": "t3", "to": "t7"}, "t3-t7"),
        ("t3/i3-i4,i7-i8", {"from": "t3/i3", "to": "t3/i4",
                            "ranges": [{"from": "t3/i7", "to": "t3/i8"}]}, "t3/i3-i4, t3/i7-i8"),
        ("t3/i3,i5", {"scopes": ["t3/i3", "t3/i5"]}, "t3/i3, t3/i5"),
    ],
)
def test_fold_key_seed_grammar(key: str, expected: dict[str, Any], label: str) -> None:
    assert fold_key(key) == FoldKey(expected, label)


@pytest.mark.parametrize("key", ["", "  ", ", ,", "\n"])
def test_fold_key_naming_nothing_is_none(key: str) -> None:
    assert fold_key(key) is None


@pytest.mark.parametrize(
    "key",
    ["junk", "t0", "i3", "t2/i5-i3", "t4-t3", "-", "t1--t2", "t1/i2-t3-t4", "t2/i5/*",
     "t1/x", "t1, nope", "t*/i2", "t1/i3...t4", 42, None, ["t1"]],
)
def test_fold_key_refusals_carry_the_grammar_line(key: object) -> None:
    refused = fold_key(key)
    assert isinstance(refused, FoldRefusal)
    assert refused.error.endswith(FOLD_KEY_GRAMMAR)
    assert len(refused.error.splitlines()) == 1
    with pytest.raises(ValueError, match="fold key"):
        parse_fold_key_to_scopes(key, U)  # type: ignore[arg-type]


KEY_TEXT = st.text(alphabet="ti/f*0123456789-., \n", max_size=30) | st.text(max_size=30)


@given(KEY_TEXT)
def test_fold_key_never_raises(key: str) -> None:
    parsed = fold_key(key)
    if isinstance(parsed, FoldRefusal):
        assert FOLD_KEY_GRAMMAR in parsed.error
        assert len(parsed.error.splitlines()) == 1
    elif parsed is not None:
        assert parsed.label and "\n" not in parsed.label
        assert fold_key(parsed.label) == parsed  # the label is a canonical key
        expand_through([parsed.intent], U, [4])
        intent_ranges(parsed.intent)


# --- expand_through / intent_ranges ---------------------------------------------------


def test_intent_ranges_flat_and_nested_read_the_same() -> None:
    one = intent("t1/i1-i2, t3/i2-")
    assert intent_ranges(one) == [{"from": "t1/i1", "to": "t1/i2"}, {"since": "t3/i2"}]
    flat_only = {"through": "t2", "since": "t3/i1"}
    assert intent_ranges(flat_only) == [{"through": "t2"}, {"since": "t3/i1"}]
    assert intent_ranges({"scopes": ["t1"], "from": None}) == []
    assert intent_ranges({"ranges": [{"to": "t1/i1"}, "junk"]}) == [{"to": "t1/i1"}]


def test_expand_through_selectors() -> None:
    assert resolve("t3", U) == {"scopes": wire(t3=8), "turns": [3]}
    assert resolve("-t1/i2", U) == {"scopes": ["t1/i1", "t1/i2"], "turns": [1]}
    assert resolve("-t2", U)["scopes"] == wire(t1=2, t2=1)
    assert resolve("t3/i7-", U) == {"scopes": ["t3/i7", "t3/i8", "t5/i1"], "turns": [5]}
    assert resolve("t3-", U)["turns"] == [3, 5]
    assert resolve("t1/i2-t3", U) == {"scopes": ["t1/i2", "t2/i1", *wire(t3=8)], "turns": [2, 3]}
    assert resolve("t9/i4", U) == {"scopes": ["t9/i4"]}  # an explicit id is kept verbatim
    assert resolve("t1/i1-i1, t5/i1-", U) == {"scopes": ["t1/i1", "t5/i1"], "turns": [5]}


def test_enumerated_list_never_yields_whole_turn_intent() -> None:
    assert resolve("t1/i1, t1/i2", U) == {"scopes": ["t1/i1", "t1/i2"]}
    assert "turns" not in expand_through([{"scopes": U}], U)[0]


def test_iteration_less_turns() -> None:
    # turn 4 is persisted but has no iteration on the wire
    assert resolve("t4", U)["turns"] == [4]
    assert resolve("t3/i2-t5", U, [4])["turns"] == [4, 5]
    assert resolve("t3/i2-t5", U)["turns"] == [5]  # turn 4 unknown without `turns`
    assert resolve("-t4", U, [4])["turns"] == [1, 2, 3, 4]
    assert 4 not in resolve("t4/i1-t5", U, [4])["turns"]  # a cursor inside is no evidence
    assert 4 not in resolve("-t4/i9", U, [4])["turns"]


def test_expand_through_passthrough_and_idempotence() -> None:
    plain = {"gist": "x", "turns": [2]}
    assert expand_through([plain], U) == [plain]
    first = expand_through([{**intent("t1, t3/i2-i4"), "gist": "g"}], U)
    assert first[0]["gist"] == "g" and first[0]["turns"] == [1]
    assert expand_through(first, U) == first
    assert expand_through([{"scopes": ["nope", "t1/i1/f2"], "through": "bad"}], U) == [
        {"scopes": ["t1/i1"]}]


# --- supersede_summaries --------------------------------------------------------------


def test_supersede_seed_semantics() -> None:
    fine = {"id": "a", "scopes": ["t1/i1"], "turns": []}
    broad = {"id": "b", "scopes": ["t1/i1", "t1/i2"]}
    assert supersede_summaries([fine, broad]) == [broad]
    same_old, same_new = {"id": "c", "scopes": ["t2/i1"], "turns": [2]}, {
        "id": "d", "scopes": ["t2/i1"]}
    assert supersede_summaries([same_old, same_new]) == [{**same_new, "turns": [2]}]
    recap = {"id": "r", "scopes": [], "turns": [4]}
    unrelated = {"id": "u", "scopes": ["t5/i1"]}
    assert supersede_summaries([recap, unrelated]) == [recap, unrelated]
    assert supersede_summaries([recap, {"id": "w", "scopes": [], "turns": [4, 6]}]) == [
        {"id": "w", "scopes": [], "turns": [4, 6]}]
    disjoint = [{"scopes": ["t1/i1"]}, {"scopes": ["t1/i2"]}]
    assert supersede_summaries(disjoint) == disjoint


UNIVERSE = st.dictionaries(st.integers(1, 6), st.integers(1, 5), min_size=1).map(
    lambda d: [f"t{t}/i{i}" for t, n in sorted(d.items()) for i in range(1, n + 1)])


@st.composite
def universe_and_subset(draw: st.DrawFn) -> tuple[list[str], set[str]]:
    universe = draw(UNIVERSE)
    return universe, draw(st.sets(st.sampled_from(universe)))


SUMMARIES = st.lists(
    st.fixed_dictionaries({
        "scopes": st.lists(st.sampled_from(wire(t1=3, t2=2, t3=3)), max_size=6),
        "turns": st.lists(st.integers(1, 4), max_size=2),
    }),
    max_size=7,
).map(lambda ss: [{**s, "id": n} for n, s in enumerate(ss)])


def union(summaries: list[dict[str, Any]], key: str) -> set[Any]:
    return {x for s in summaries for x in s.get(key, ())}


@given(SUMMARIES)
def test_supersede_never_loses_coverage_and_is_idempotent(ss: list[dict[str, Any]]) -> None:
    out = supersede_summaries(ss)
    assert union(out, "scopes") == union(ss, "scopes")
    assert union(out, "turns") == union(ss, "turns")
    ids = [s["id"] for s in out]
    assert ids == sorted(ids)  # order-stable: survivors keep their recorded order
    for s in ss:  # every scope set sits inside one survivor
        assert any(set(s["scopes"]) <= set(o["scopes"]) for o in out)
    assert supersede_summaries(out) == out
    assert ss == [dict(s) for s in ss]  # inputs untouched


# --- round trips ----------------------------------------------------------------------


def expand_tokens(tokens: list[str], universe: list[str]) -> set[str]:
    return set().union(*(selected(tok, universe) for tok in tokens))


@given(universe_and_subset())
def test_compress_then_expand_is_identity(case: tuple[list[str], set[str]]) -> None:
    universe, chosen = case
    tokens = compress_scopes(chosen, universe)
    assert expand_tokens(tokens, universe) == chosen
    assert compress_scopes(reversed(sorted(chosen)), universe) == tokens  # order-free, pure


@given(universe_and_subset())
def test_pretty_parses_back(case: tuple[list[str], set[str]]) -> None:
    universe, chosen = case
    text = pretty_scopes(chosen, universe)
    if not chosen:
        assert text is None
        return
    assert text is not None
    assert selected(text, universe) == chosen
    assert {str(s) for s in parse_fold_key_to_scopes(text, universe)} == chosen
    bare = pretty_scopes(chosen, None)
    assert bare is not None and "*" not in bare
    assert selected(bare, sorted(chosen)) == chosen


# --- folds_view_now / CLI helper -------------------------------------------------------


def test_folds_view_now() -> None:
    folds = [intent("t1-t2"), intent("t1/i1")]
    weights = {s: 100 for s in U}
    assert folds_view_now(folds, None) is None and folds_view_now(folds, []) is None
    assert folds_view_now(folds, U, weights, 42.4, {1: 10, 2: 5}) == (
        "context 42% · saved 3/12 (25%, ~315 tok) · live t3/*, t5/*")
    assert folds_view_now(folds, U) == "saved 3/12 (25%) · live t3/*, t5/*"
    unweighed = {"t1/i1": 100}
    assert folds_view_now(folds, U, unweighed, 7) == (
        "context 7% · saved 3/12 (25%) · live t3/*, t5/*")
    assert folds_view_now([], U, weights, 3) == "context 3% · saved 0/12 (0%, ~0 tok) · live t*"
    assert folds_view_now([intent("t*")], U) == "saved 12/12 (100%) · live none"
    # a fold that scrolled off the wire never inflates the count
    assert folds_view_now([intent("t9/i1, t3/i1")], U) == (
        "saved 1/12 (8%) · live t1-t2/*, t3/i2-i8, t5/*")


def test_parse_fold_key_to_scopes() -> None:
    assert parse_fold_key_to_scopes("t3/i7-t5", U) == {Scope(3, 7), Scope(3, 8), Scope(5, 1)}
    assert parse_fold_key_to_scopes("t9/i1, t2", U) == {Scope(2, 1)}
    assert parse_fold_key_to_scopes("", U) == set()
