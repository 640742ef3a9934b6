"""Utilization fields and the stateful over-budget hint (seed 001)."""

from __future__ import annotations

from pipeline.replay.tokens import get_tokenizer
from pipeline.replay.utilization import HintLevel, HintState, hint_text, pressure, utilization


def test_fields() -> None:
    u = utilization(150_000, 272_000, 300_000)
    assert u is not None
    assert (u.model_input_limit, u.saturation, u.headroom_tokens) == (272_000, 55, 122_000)
    assert u.auto_compress_above == 200_000 and u.turn_total_tokens == 300_000
    small = utilization(10_000, 32_768, 10_000)
    assert small is not None and small.auto_compress_above == 32_768


def test_nothing_before_a_measured_request_and_unknown_models() -> None:
    assert utilization(0, 200_000, 0) is None
    u = utilization(5, None, 5)
    assert u is not None and u.saturation is None and u.auto_compress_above is None
    assert pressure(u) is HintLevel.NONE


def test_levels_and_hysteresis() -> None:
    limit = 100_000
    seq = [70_000, 76_000, 91_000, 80_000, 101_000, 76_000, 50_000, 80_000]
    state = HintState()
    levels = [state.update(utilization(n, limit, n)) for n in seq]
    assert levels == [HintLevel.NONE, HintLevel.ADVISORY, HintLevel.ESCALATED,
                      HintLevel.ESCALATED, HintLevel.MANDATORY, HintLevel.MANDATORY,
                      HintLevel.NONE, HintLevel.ADVISORY]


def test_hint_text_names_the_fold_and_what_to_keep() -> None:
    u = utilization(95_000, 100_000, 95_000)
    assert u is not None
    text = hint_text(HintLevel.ESCALATED, u, settled="t1-t4", open_scope="t5")
    assert 'fold_session("t1-t4")' in text and "t5" in text and text.startswith("escalated")


def test_offline_tokenizer_counts_without_network() -> None:
    tok = get_tokenizer("cl100k_base")
    assert tok.count("hello world") == 2
    assert tok.count("") == 0


def test_cached_counts_of_short_texts_are_the_encoders() -> None:
    from pipeline.replay.tokens import SHORT_TEXT_CHARS, TiktokenTokenizer, _encoding

    tok, enc = TiktokenTokenizer(), _encoding("cl100k_base")
    texts = ["<turns>\n\n</turns>", "x" * SHORT_TEXT_CHARS, "y " * SHORT_TEXT_CHARS, "é🙂"]
    for text in texts + texts:  # the second time from the cache (short ones)
        assert tok.count(text) == len(enc.encode_ordinary(text))
    assert tok.cache._short.cache_info().hits == 3
    assert tok.cache.hits == 1  # "y " * 512: a long text, cached by its digest
