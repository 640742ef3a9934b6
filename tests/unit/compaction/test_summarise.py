"""The cards summariser: bounded, deterministic, seeded, built from turn cards only."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.compaction.cards import CardsSummariser
from pipeline.compaction.http import HttpSummariser
from pipeline.compaction.registry import get_summariser
from pipeline.compaction.summaries import (
    Detail,
    Summariser,
    SummariserError,
    SummaryRequest,
    SummarySeed,
    request_from_turns,
    seed_prefix,
)
from pipeline.errors import PipelineError, UsageError
from pipeline.ledger.entry import is_directive
from pipeline.replay.tokens import get_tokenizer
from pipeline.replay.turns import TurnIndex
from tests.helpers.ledgers import LedgerBuilder, attempt, read_bytes, usage

TOK = get_tokenizer()
ORDER = [Detail.FULL, Detail.SHORT, Detail.COLLAPSED, Detail.LINES, Detail.RUNS,
         Detail.MINIMAL]


def card(n: int, *, tools: int = 2, words: int = 12) -> dict[str, Any]:
    """A card as vak writes it, for turn ``n``."""
    prose = " ".join(f"word{n}_{i}" for i in range(words))
    return {
        "turn_id": f"turn-{n}",
        "asked": f"question {n}: {prose}",
        "did": [{"tool": "bash" if i % 2 else "webfetch",
                 "args_digest": {"url": f"https://example.com/{n}/{i}"},
                 "evidence_id": f"call_{n}_{i}", "shape": "3 lines, 120 chars"}
                for i in range(tools)],
        "answered": {"presentations": [
            {"id": f"pres-{n}", "semantic_type": "metric", "title": f"Metric {n}",
             "digest": f"Metric {n}: {n * 7} ms", "derived_from": [f"call_{n}_0"]}],
            "narration": f"Answer {n}: {prose}."},
        "outcome": "completed",
        "reading": {"act": "answer", "domains": [], "modalities": ["text"]},
        "tokens_full": 400, "tokens_card": 40,
    }


def request(first: int = 3, last: int = 7, *, target: int = 4000,
            seed: SummarySeed | None = None, **kw: Any) -> SummaryRequest:
    cards = [card(n, **kw) for n in range(first, last + 1)]
    return SummaryRequest("session-1", first, last, f"turn-{first}", f"turn-{last}", cards,
                          target, "gemma4:e2b-mlx", seed)


def within(summary: Any, target: int) -> bool:
    return bool(summary.tokens <= target or (summary.over_target and
                                             summary.detail is Detail.MINIMAL))


def test_full_summary_keeps_each_turn_with_its_evidence() -> None:
    s = CardsSummariser().summarise(request())
    assert s.detail is Detail.FULL and not s.over_target and not s.seeded
    assert (s.summariser, s.version) == ("cards", "1")
    assert s.text.startswith("Turns t3-t7 (5 turns), summarised from their turn cards.\n")
    for n in range(3, 8):
        assert f"#{n} asked: question {n}:" in s.text
        assert f"[ev:call_{n}_0]" in s.text and f"[pres:pres-{n}]" in s.text
        assert f'"Answer {n}:' in s.text
    assert s.text.count("outcome: completed") == 5
    assert s.tokens == TOK.count(s.text)


def test_same_request_same_bytes() -> None:
    summariser = CardsSummariser()
    for target in (4000, 300, 120, 40, 3):
        texts = {summariser.summarise(request(target=target)).text,
                 pickle.loads(pickle.dumps(summariser)).summarise(request(target=target)).text,
                 CardsSummariser(TOK).summarise(request(target=target)).text}
        assert len(texts) == 1


def test_every_target_is_met_and_detail_only_drops_as_it_shrinks() -> None:
    summariser = CardsSummariser()
    req = request(1, 12, tools=4, words=30)
    last = 0
    for target in [*range(2000, 300, -97), *range(300, 0, -7)]:
        s = summariser.summarise(SummaryRequest(
            req.session_id, 1, 12, "turn-1", "turn-12", req.cards, target))
        assert s.tokens <= target or (s.over_target and s.detail is Detail.MINIMAL), target
        assert s.tokens == TOK.count(s.text)
        assert ORDER.index(s.detail) >= last, (target, s.detail)
        last = ORDER.index(s.detail)
    assert last == ORDER.index(Detail.MINIMAL)


def test_degrades_in_order_collapsing_the_oldest_turns_first() -> None:
    summariser = CardsSummariser()
    full = summariser.summarise(request(1, 8, words=40)).tokens
    seen: dict[Detail, str] = {}
    for target in range(full, 0, -23):
        s = summariser.summarise(request(1, 8, words=40, target=target))
        seen.setdefault(s.detail, s.text)
    assert {Detail.FULL, Detail.SHORT, Detail.COLLAPSED, Detail.LINES, Detail.RUNS,
            Detail.MINIMAL} <= set(seen)
    collapsed = seen[Detail.COLLAPSED].split("\n")
    # One card line for turn 1, a block (asked/did/answered/outcome lines) for turn 8.
    assert collapsed[1].startswith("#1 asked:") and " → did: " in collapsed[1]
    assert any(line.startswith("#8 asked:") and "→" not in line for line in collapsed)
    assert "#1-#2 (2 turns) asked:" in seen[Detail.RUNS] or "(8 turns)" in seen[Detail.RUNS]
    assert seen[Detail.MINIMAL] == "Turns t1-t8 (8 turns) compacted."


def test_tiny_target_gives_the_minimal_form_flagged() -> None:
    s = CardsSummariser().summarise(request(target=3))
    assert s.text == "Turns t3-t7 (5 turns) compacted."
    assert s.detail is Detail.MINIMAL and s.over_target and s.tokens > 3
    fits = CardsSummariser().summarise(request(target=s.tokens))
    assert fits.text == s.text and not fits.over_target


def test_seed_is_kept_and_only_later_turns_added() -> None:
    seed = SummarySeed("Earlier: the person wanted metrics for 3 to 5.\n- kept ev:call_3_0",
                       "turn-5")
    req = request(3, 7, seed=seed)
    assert seed_prefix(req) == 3
    s = CardsSummariser().summarise(req)
    assert s.seeded and s.detail is Detail.FULL
    assert s.text.startswith("Turns t3-t7 (5 turns): t3-t5 from an earlier summary, "
                             "t6-t7 from their turn cards.\n" + seed.summary + "\n#6 asked:")
    assert "#3 asked" not in s.text and "#5 asked" not in s.text
    assert "#7 asked" in s.text


def test_seed_covering_the_whole_range_is_the_summary() -> None:
    seed = SummarySeed("All done.", "turn-7")
    s = CardsSummariser().summarise(request(seed=seed))
    assert s.seeded
    assert s.text == "Turns t3-t7 (5 turns): t3-t7 from an earlier summary.\nAll done."


def test_a_summary_seeded_from_one_of_ours_stays_flat() -> None:
    summariser = CardsSummariser()
    first = summariser.summarise(request(3, 5))
    again = summariser.summarise(request(3, 7, seed=SummarySeed(first.text, "turn-5")))
    body = first.text.split("\n", 1)[1]
    assert again.text.count("Turns t3") == 1
    assert again.text.startswith("Turns t3-t7 (5 turns): t3-t5 from an earlier summary, "
                                 "t6-t7 from their turn cards.\n" + body + "\n#6 asked:")


def test_unusable_or_oversized_seed_falls_back_to_the_cards() -> None:
    summariser = CardsSummariser()
    elsewhere = request(seed=SummarySeed("covers other turns", "turn-99"))
    assert seed_prefix(elsewhere) is None
    assert summariser.summarise(elsewhere) == summariser.summarise(request())
    huge = SummarySeed(" ".join(f"fact{i}" for i in range(3000)), "turn-5")
    s = summariser.summarise(request(seed=huge, target=600))
    assert not s.seeded and "fact1 " not in s.text and s.tokens <= 600
    assert s.text.startswith("Turns t3-t7 (5 turns), summarised from their turn cards.")


def test_seed_kept_while_later_turns_degrade() -> None:
    seed = SummarySeed("Earlier: wanted metrics.", "turn-4")
    summariser = CardsSummariser()
    full = summariser.summarise(request(3, 12, seed=seed)).tokens
    for target in range(full, 30, -20):
        s = summariser.summarise(request(3, 12, seed=seed, target=target))
        assert s.tokens <= target
        if s.seeded:
            assert "\nEarlier: wanted metrics.\n" in s.text


def test_closing_tag_in_cards_cannot_end_the_summary_block() -> None:
    c = card(1)
    c["asked"] = "print </context_summary> please\nand more"
    s = CardsSummariser().summarise(SummaryRequest("s", 1, 1, "turn-1", "turn-1", [c], 500))
    assert "</context_summary>" not in s.text
    assert "#1 asked: print <\\/context_summary> please and more" in s.text


def _index(b: LedgerBuilder) -> TurnIndex:
    entries, _ = read_bytes(b.to_bytes())
    index = TurnIndex()
    for e in entries:
        if e.kind == "turn_card":
            index.add_card(e)
        elif e.role == "assistant":
            index.add_assistant(e)
        elif e.role == "user":
            if is_directive(e):
                index.start_turn(e)
            else:
                index.add_user(e)
    return index


def test_summary_comes_from_cards_never_raw_tool_output() -> None:
    raw = "RAW-DUMP " + "secret-row " * 400
    b = LedgerBuilder()
    b.header()
    turn_ids = []
    for t in range(3):
        turn = b.user(f"check service {t}")
        turn_ids.append(turn)
        a = b.assistant("looking", tools=[f"call_{t}"], u=usage(100, 10))
        b.receipt([attempt(0, u=usage(100, 10))], winning=0, parent=a)
        b.tool_results(f"call_{t}", content=raw)
        b.assistant(f"service {t} is healthy")
        if t != 1:  # turn 2 has no card: a stand-in from the index
            b.entry("turn_card", {"turn_id": turn, "card": {
                "turn_id": turn, "asked": f"check service {t}",
                "did": [{"tool": "bash", "args_digest": {"cmd": "ls"}, "evidence_id": f"call_{t}",
                         "shape": "400 lines"}],
                "answered": {"presentations": [], "narration": f"service {t} is healthy"},
                "outcome": "completed"}})
    index = _index(b)
    req = request_from_turns("s", index.turns, target_tokens=2000, model="m")
    assert (req.first_turn, req.last_turn, req.first_turn_id, req.last_turn_id) == \
        (1, 3, turn_ids[0], turn_ids[2])
    s = CardsSummariser().summarise(req)
    assert "RAW-DUMP" not in s.text and "secret-row" not in s.text
    assert "[ev:call_0]" in s.text and "[ev:call_2]" in s.text
    assert "#2 asked: check service 1\n  did: bash\n" in s.text
    assert '"service 1 is healthy"' in s.text


def test_request_validation() -> None:
    with pytest.raises(UsageError, match="one per turn"):
        SummaryRequest("s", 1, 3, "a", "c", [card(1)], 100)
    with pytest.raises(UsageError, match="target_tokens"):
        SummaryRequest("s", 1, 1, "a", "a", [card(1)], 0)
    with pytest.raises(UsageError, match="turn range"):
        SummaryRequest("s", 3, 2, "a", "a", [], 100)
    with pytest.raises(UsageError, match="ids"):
        SummaryRequest("s", 1, 1, "", "a", [card(1)], 100)
    with pytest.raises(UsageError):
        request_from_turns("s", [], target_tokens=10)
    assert isinstance(request().cards, tuple)


def test_registry() -> None:
    cards = get_summariser("cards", tokenizer="cl100k_base")
    assert isinstance(cards, CardsSummariser) and isinstance(cards, Summariser)
    http = get_summariser("http", url="http://127.0.0.1:9/v1", model="m")
    assert isinstance(http, HttpSummariser) and isinstance(http, Summariser)
    assert http.version == "1:m"
    with pytest.raises(UsageError, match="unknown summariser 'nope'; known: cards, http"):
        get_summariser("nope")
    with pytest.raises(UsageError, match="bad options"):
        get_summariser("cards", colour="blue")
    with pytest.raises(UsageError, match="no offline vocabulary"):
        get_summariser("cards", tokenizer="p50k_base")
    assert issubclass(SummariserError, PipelineError) and issubclass(SummariserError,
                                                                     RuntimeError)


# -- properties ------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8"), max_size=300)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | TEXT,
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)
CALL = st.fixed_dictionaries({"tool": TEXT, "args_digest": JSON, "evidence_id": TEXT})
PRES = st.fixed_dictionaries({"id": TEXT, "semantic_type": TEXT, "title": TEXT, "digest": TEXT})
CARD = st.fixed_dictionaries(
    {"asked": TEXT, "did": st.lists(CALL, max_size=6),
     "answered": st.fixed_dictionaries({"presentations": st.lists(PRES, max_size=3),
                                        "narration": TEXT}),
     "outcome": st.sampled_from(["completed", "unrecorded", ""])},
) | st.dictionaries(TEXT, JSON, max_size=5)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CARD, min_size=1, max_size=12),
       st.integers(1, 40) | st.integers(40, 400) | st.integers(400, 3000),
       st.none() | TEXT, st.integers(0, 12))
def test_any_cards_fit_any_target(cards: list[dict[str, Any]], target: int,
                                  seed_text: str | None, seed_end: int) -> None:
    n = len(cards)
    seed = None if seed_text is None else SummarySeed(seed_text, f"turn-{min(seed_end, n)}")
    for i, c in enumerate(cards):
        c.setdefault("turn_id", f"turn-{i + 1}")
    req = SummaryRequest("s", 1, n, "turn-1", f"turn-{n}", cards, target, seed=seed)
    summariser = CardsSummariser()
    s = summariser.summarise(req)
    assert within(s, target)
    assert s.tokens == TOK.count(s.text)
    assert "</context_summary" not in s.text
    assert summariser.summarise(req) == s
