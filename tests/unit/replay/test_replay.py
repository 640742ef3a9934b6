"""Turns, projection and replay of single sessions (pure layer)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.replay.catalog import Capacity, load_catalog
from pipeline.replay.engine import ReplayEngine, RequestReplay
from pipeline.replay.projection import card_line, digest_result, get_rule_set
from pipeline.replay.turns import TurnState
from tests.helpers.ledgers import LedgerBuilder, read_bytes, tool_result_block


class CountingTokenizer:
    """A whitespace tokenizer that counts how often it is asked (for linearity)."""

    name = "words"

    def __init__(self) -> None:
        self.calls = 0
        self.chars = 0

    def count(self, text: str) -> int:
        self.calls += 1
        self.chars += len(text)
        return len(text.split())


def session(turns: int, iters: int = 2, *, result: str = "line one\nline two") -> bytes:
    b = LedgerBuilder()
    b.header()
    for t in range(turns):
        b.user(f"directive number {t}")
        for i in range(iters):
            b.assistant(f"step {i}", tools=[f"call_{t}_{i}"])
            b.message("user", [tool_result_block(f"call_{t}_{i}", result)])
        b.assistant(f"answer {t}")
    return b.to_bytes()


def replay(data: bytes, tok: Any = None, **kw: Any) -> tuple[ReplayEngine, list[RequestReplay]]:
    entries, _ = read_bytes(data)
    engine = ReplayEngine(get_rule_set("v1"), tok or CountingTokenizer(), **kw)
    out: list[RequestReplay] = []
    for e in entries:
        out.extend(engine.feed(e))
    out.extend(engine.finish())
    return engine, out


def test_turns_iterations_and_forms() -> None:
    engine, reqs = replay(session(3, iters=2))
    assert [r.scope for r in reqs][:4] == ["t1/i1", "t1/i2", "t1/i3", "t2/i1"]
    assert len(reqs) == 9
    turns = engine.index.turns
    assert [t.state for t in turns] == [TurnState.CLOSED] * 3
    assert [t.forms for t in turns] == [2, 2, 2]


def test_interrupted_turn_and_control_messages() -> None:
    b = LedgerBuilder()
    b.header()
    b.user("first")
    b.assistant("working", tools=["c1"])
    b.user("second, never mind")  # a new directive before any final answer
    b.control()
    b.assistant("ok")
    engine, reqs = replay(b.to_bytes())
    assert [t.state for t in engine.index.turns] == [TurnState.INTERRUPTED, TurnState.CLOSED]
    assert [r.scope for r in reqs] == ["t1/i1", "t2/i1"]


def test_request_grows_with_history_and_reuses_counts() -> None:
    tok = CountingTokenizer()
    _, reqs = replay(session(4), tok)
    sizes = [r.replayed_tokens for r in reqs]
    assert sizes == sorted(sizes) and sizes[0] > 0
    # Every segment is tokenized once, however many requests include it.
    calls_small = tok.calls
    tok2 = CountingTokenizer()
    replay(session(8), tok2)
    assert tok2.calls <= 2.2 * calls_small


def test_replay_cost_is_linear_in_session_length() -> None:
    counts = []
    for turns in (50, 100, 200):
        tok = CountingTokenizer()
        replay(session(turns), tok)
        counts.append(tok.chars)
    assert counts[1] <= 2.1 * counts[0] and counts[2] <= 2.1 * counts[1]


@pytest.mark.parametrize("seed", [3, 4])
def test_replay_work_per_entry_does_not_grow_with_the_session(seed: int) -> None:
    """Python calls per entry, a count free of the machine's noise, are flat from 40 to
    640 turns of a generated session with a plan, cards and packets every few turns.
    (When each plan change walked every closed turn, they grew 1.7-1.9 times.)"""
    import cProfile
    import pstats

    from pipeline.audit.session import audit_session
    from pipeline.ledger.layout import parse_session_path
    from pipeline.ledger.reader import Entry
    from pipeline.replay.session import replay_session
    from pipeline.synth.generator import generate_session

    per_entry = []
    for turns in (40, 640):
        s = generate_session(seed, turns=turns, consistent=False, size_scale=0.05)
        key = parse_session_path(s.path)
        assert key is not None
        entries: list[Entry] = []
        active = audit_session(key, s.lines(), keep=entries).active
        chain = [e for e in entries if (e.line, e.id) in active]
        profile = cProfile.Profile()
        profile.runcall(replay_session, key, chain, rules=get_rule_set("v1"),
                        tokenizer=CountingTokenizer(), catalog=load_catalog())
        per_entry.append(pstats.Stats(profile).total_calls / len(chain))
    assert per_entry[1] <= 1.25 * per_entry[0], per_entry


def test_plan_card_and_digest_rendering() -> None:
    card = {"asked": "what is the weather", "did": [{"tool": "web", "evidence_id": "a"},
                                                    {"tool": "web", "evidence_id": "b"},
                                                    {"tool": "x"}],
            "answered": {"presentations": [{"id": "p1", "semantic_type": "metric",
                                            "title": "Delhi"}], "narration": "31C"}}
    line = card_line(3, card, asked="", tools=[], narration="")
    assert line == ('#3 asked: what is the weather → did: web×2, x → metric "Delhi" '
                    "[pres:p1; ev:a,b]")
    plain = card_line(1, None, asked="q", tools=["bash"], narration=" ".join(["w"] * 20))
    assert plain.endswith('"w w w w w w w w w w w w…"')
    terse = get_rule_set("v1-terse-cards").card_line(3, card, asked="", tools=[], narration="")
    assert terse == '#3 asked: what is the weather → did: web×2, x → metric "Delhi"'
    links = '[{"title": "A", "url": "http://a"}, {"title": "B", "url": "http://b"}]'
    d = digest_result(links, tool="web", is_error=False, evidence_id="e1")
    assert d.startswith("2 results:\n- A (http://a)") and d.endswith("call recall to expand]")
    bash = "exit code: 0\n" + "\n".join(f"l{i}" for i in range(50))
    db = digest_result(bash, tool="bash", is_error=False, evidence_id="e2")
    assert "l0" in db and "l49" in db and "l25" not in db
    assert digest_result("boom", tool="bash", is_error=True, evidence_id="e") == "boom"


def test_recorded_plan_cards_shrink_the_request() -> None:
    b = LedgerBuilder()
    b.header()
    ids = []
    for t in range(3):
        ids.append(b.user(f"directive {t}"))
        b.assistant("s", tools=[f"c{t}"])
        b.message("user", [tool_result_block(f"c{t}", "x " * 200)])
        b.assistant(f"answer {t}")
        b.entry("turn_card", {"turn_id": ids[-1], "card": {
            "turn_id": ids[-1], "asked": f"directive {t}", "did": [{"tool": "bash"}],
            "answered": {"presentations": [], "narration": f"answer {t}"},
            "outcome": "completed", "tokens_full": 0, "tokens_card": 0}})
    b.entry("context_selection", {"policy_version": 3, "leaf_id": ids[-1], "plan": {
        "per_turn": [[ids[0], "Card"], [ids[1], "Card"], [ids[2], "Full"]],
        "selected_records": None, "packet_range": None, "retrieved": [], "links": {},
        "budget": 100, "spent": 10}})
    b.user("directive 3")
    b.assistant("final")
    _, reqs = replay(b.to_bytes())
    last = reqs[-1]
    assert last.plan_card_turns == (1, 2) and last.plan_full == 1
    assert last.replayed_tokens < reqs[-2].replayed_tokens + 50


def test_planner_packs_what_does_not_fit() -> None:
    small = Capacity("m", input_limit=900, output_reserve=100)
    engine, reqs = replay(session(12, result="word " * 60), planner=small)
    last = reqs[-1]
    assert last.plan_packet_turns and last.plan_packet_turns[0] == 1
    assert last.plan_source == "planner-v1"
    assert engine.index.turns[-1].number == 12


def test_prefix_from_header_then_bound_capabilities() -> None:
    b = LedgerBuilder()
    b.header()
    b.user("go")
    b.assistant("a", tools=["c1"])
    b.entry("turn_capabilities_bound", {"epoch": 2, "capability_ids": [], "excluded_ids": [],
                                        "system_prompt": "a much longer system prompt " * 5,
                                        "tool_schemas": [{"name": "bash"}],
                                        "core_tool_names": [], "deferred_tool_names": [],
                                        "tool_index": "", "tool_domains": {}})
    b.message("user", [tool_result_block("c1")])
    b.assistant("b")
    _, reqs = replay(b.to_bytes())
    assert reqs[0].prefix_digest != reqs[1].prefix_digest
    assert reqs[1].prefix_tokens > reqs[0].prefix_tokens


def test_catalog_lookup_and_override(tmp_path: Any) -> None:
    cat = load_catalog()
    assert cat.lookup("claude-sonnet-4-5") is not None
    assert cat.lookup("no-such-model") is None
    f = tmp_path / "mine.toml"
    f.write_text('[[model]]\npattern = "claude-*"\ninput_limit = 1000\n')
    mine = load_catalog(f).lookup("claude-sonnet-4-5")
    assert mine is not None and mine.input_limit == 1000
    assert cat.with_window(128_000).lookup("anything-at-all") is not None


@pytest.mark.parametrize(("bad", "names"), [
    ("[[model]]\npattern = 1\n", "[[model]] #1"),
    ("not toml [", "cannot read model catalog"),
    # misspelt: read as no rule or as the default, silently, until 2026-12-07
    ('[[model]]\npattern = "x"\ninput_limit = 1\noutput_reserv = 5\n', "'output_reserv'"),
    ('[models.x]\ninput_limit = 1\n', "unknown key 'models'"),
    ('version = "mine"\n', "no [[model]] rule"),
    # read as 1, as a window of nothing, or as cl100k_base
    ('[[model]]\npattern = "x"\ninput_limit = 1.5\n', "'input_limit' must be an integer"),
    ('[[model]]\npattern = "x"\ninput_limit = 0\n', "'input_limit' must be an integer"),
    ('[[model]]\npattern = "x"\ninput_limit = 9223372036854775807\n', "from 1 to 2^62"),
    ('[[model]]\npattern = "x"\ninput_limit = 9\noutput_reserve = -1\n', "'output_reserve'"),
    ('[[model]]\npattern = "x"\ninput_limit = 9\ntokenizer = "o200k_base"\n',
     "'tokenizer' must be one the replay counts with (cl100k_base)"),
    ('[[model]]\npattern = "x"\ninput_limit = 9\ntokenizer = ["cl100k_base"]\n',
     "got ['cl100k_base']"),
    ("", "no [[model]] rule"),
])
def test_catalog_override_errors_are_usage_errors(tmp_path: Any, bad: str,
                                                  names: str) -> None:
    from pipeline.errors import UsageError

    f = tmp_path / "bad.toml"
    f.write_text(bad)
    with pytest.raises(UsageError, match=re.escape(names)) as info:
        load_catalog(f).lookup("x")
    assert str(info.value).startswith(("bad.toml", str(f), "cannot read")), info.value


def test_turn_runs_speak_the_scope_grammar() -> None:
    from pipeline.replay.scopes import pretty_scopes
    from pipeline.replay.session import _turn_runs

    iters = {1: 2, 2: 1, 3: 3, 6: 1, 7: 2}
    universe = [f"t{t}/i{i}" for t, n in {**iters, 4: 1, 5: 2}.items() for i in range(1, n + 1)]
    live = [f"t{t}/i{i}" for t, n in iters.items() for i in range(1, n + 1)]
    assert _turn_runs(sorted(iters)) == pretty_scopes(live, universe) == "t1-t3/*, t6-t7/*"


def _text_digest_by_definition(content: str) -> str:
    """docs/projection-rules.md's text digest, computed the plain way (every line, every
    word), to check the shortcuts of pipeline.replay.projection._text_digest against."""
    lines = content.split("\n")
    headings = [ln for ln in lines if ln.lstrip().startswith("#")][:5]
    flat = " ".join(content.split())
    end = flat.find(". ")
    sentence = flat[: end + 1] if 0 <= end < 300 else flat[:300]
    return "\n".join([*headings, sentence, f"({len(lines)} lines, {len(content.encode())} bytes)"])


_PIECES = st.sampled_from(["# Title", "  ## sub", "\u3000# wide", ". ", ".", " ", "\n", "\t",
                           "\r\n", "\x0b", "\u2028", "word", "x" * 700, " " * 900, "#"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=40)), max_size=60))
def test_text_digest_is_the_plain_definition(pieces: list[str]) -> None:
    from pipeline.replay.projection import _text_digest

    content = "".join(pieces)
    try:
        expected = _text_digest_by_definition(content)
    except UnicodeEncodeError:  # a lone surrogate: both refuse it
        with pytest.raises(UnicodeEncodeError):
            _text_digest(content)
        return
    assert _text_digest(content) == expected


def test_an_unknown_rule_set_names_the_known_ones_as_a_summariser_does() -> None:
    with pytest.raises(ValueError, match=r"^unknown projection rule set 'nope'; known: "
                       r"v1, v1-terse-cards"):
        get_rule_set("nope")
