"""The replay's tokenizers: ``toktok``'s and ``bpe-openai``'s counts equal tiktoken's
``encode_ordinary`` on every text a replay of generated sessions counts, on every string
of the real transcripts, on hostile texts, on fuzzed ones, and (toktok's, through its
guard) around every code point; nothing is downloaded; the count cache returns what the
encoder says."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.audit.session import audit_session
from pipeline.ledger.kernel import any_in_c
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import Entry
from pipeline.replay import tokens
from pipeline.replay.catalog import load_catalog
from pipeline.replay.projection import get_rule_set
from pipeline.replay.session import replay_session
from pipeline.replay.tokens import (
    NEWER_LETTERS,
    BpeTokenizer,
    CountCache,
    ExactTokenizer,
    TiktokenTokenizer,
    ToktokTokenizer,
    _encoding,
    _toktok,
    bpe_available,
    get_tokenizer,
    toktok_available,
)
from pipeline.synth.generator import generate_session
from tests.helpers.data_paths import REAL

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not bpe_available(), reason="bpe-openai does not import")


def reference(text: str) -> int:
    """tiktoken's count, uncached: what the replay counted before ``bpe-openai``."""
    return len(_encoding("cl100k_base").encode_ordinary(text))


#: The fast counters held to tiktoken, each where it imports here.
COUNTERS = [
    pytest.param(ToktokTokenizer, id="toktok", marks=pytest.mark.skipif(
        not toktok_available(), reason="toktok-rs or the C kernel is missing")),
    pytest.param(BpeTokenizer, id="bpe-openai"),
]


@pytest.fixture(params=COUNTERS)
def counter(request: pytest.FixtureRequest) -> ExactTokenizer:
    """A fast counter (one instance per test: its counts uncached through
    ``_encoded_length``)."""
    made: ExactTokenizer = request.param()
    return made


def bpe(text: str) -> int:
    """``bpe-openai``'s count, uncached."""
    return BpeTokenizer()._encoded_length(text)


class Recorder:
    """A tokenizer that records every text the replay asks it to count."""

    name = "cl100k_base"

    def __init__(self) -> None:
        self.texts: set[str] = set()

    def count(self, text: str) -> int:
        self.texts.add(text)
        return len(text) // 4


def replayed_texts(seeds: range) -> set[str]:
    """Every text the replay counts in the generated sessions of ``seeds``."""
    rec, catalog, rules = Recorder(), load_catalog(), get_rule_set("v1")
    for seed in seeds:
        session = generate_session(seed, consistent=False)
        key = parse_session_path(session.path)
        assert key is not None
        kept: list[Entry] = []
        active = audit_session(key, session.lines(), keep=kept).active
        chain = [e for e in kept if (e.line, e.id) in active]
        replay_session(key, chain, rules=rules, tokenizer=rec, catalog=catalog)
    return rec.texts


def strings(value: Any) -> Iterator[str]:
    """Every string (keys too) in a parsed JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def real_strings() -> set[str]:
    """Every string of the real Claude Code and Codex transcripts (message texts, tool
    inputs and results, system reminders: what their reported replay would count)."""
    out: set[str] = set()
    for path in sorted(REAL.rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.update(strings(json.loads(line)))
            except ValueError:
                continue
    return out


def mismatches(counter: ExactTokenizer, texts: set[str]) -> list[tuple[str, int, int]]:
    count = counter._encoded_length
    return [(t[:80], a, b) for t in texts if (a := count(t)) != (b := reference(t))]


def test_equal_on_every_text_a_replay_of_generated_sessions_counts(
        counter: ExactTokenizer) -> None:
    texts = replayed_texts(range(1, 13))
    assert len(texts) > 300
    assert mismatches(counter, texts) == []


def test_equal_on_every_string_of_the_real_transcripts(counter: ExactTokenizer) -> None:
    texts = real_strings()
    assert sum(map(len, texts)) > 1_000_000
    assert mismatches(counter, texts) == []


HOSTILE = [
    "", " ", "\n", "\r\n\r\n", "\t \n \t", " " * 5000, "\n" * 3000, "\u00a0" * 50,
    # special tokens are plain text under encode_ordinary
    "<|endoftext|>", "a<|endoftext|>b", "<|fim_prefix|><|fim_middle|><|fim_suffix|>",
    "<|endofprompt|>", "<|im_start|>system<|im_end|>",
    # unicode: combining marks, scripts, emoji with joiners and flags, bidi, BOM, NUL
    "é" * 700, "e\u0301" * 400, "日本語のテキスト、そして中文。" * 80, "🙂👩‍👩‍👧‍👦🇫🇷" * 100,
    "\u202etext\u202c\ufeff\x00\x0b\x0c\u2028\u2029\u3000\u200b", "İıſǅⅫ٣߀" * 50,
    "'s 'S 'll 'LL ’s n't" * 40, "1234567890" * 300, "x_y-z.w/v\\u" * 200,
    # a single piece far longer than any token (quadratic merges in naive BPE)
    "a" * 120_000, "ab" * 60_000, "\U0001f600" * 20_000,
    # lone surrogates (counted as U+FFFD, as tiktoken does)
    "\ud800", "a\udfffb", "\udbff\udc00 split pair",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_equal_on_hostile_texts(counter: ExactTokenizer, text: str) -> None:
    assert counter._encoded_length(text) == reference(text)


def test_equal_on_texts_above_the_wrappers_200k_token_limit(counter: ExactTokenizer) -> None:
    # bpe-openai's tiktoken-like Encoding refuses more than ~200k tokens per call; the
    # bindings vakpipe calls take any length, as toktok's counter does: nothing is chunked.
    source = (REPO / "pipeline" / "replay" / "engine.py").read_text(encoding="utf-8")
    huge = "\n".join([source] * 45 + ["<|endoftext|> 日本 🙂 " * 5000])
    n = counter._encoded_length(huge)
    assert n > 250_000
    assert n == reference(huge)


ALPHABET = st.sampled_from([
    " ", "  ", "\n", "\r\n", "\r", "\t", "a", "Z", "é", "1", "123", "'s", "'LL", "’", ".",
    "!?", "日本", "🙂", "\u0301", "\u00a0", "\u2028", "<|endoftext|>", "x_y", "\x00", "{\"",
])


# (The fixture is the same counter for every example: hypothesis wants it function-scoped
# only when it carries state between examples, and these counters keep none uncached.)
@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=st.lists(ALPHABET, max_size=60).map("".join))
def test_equal_on_fuzzed_pieces(counter: ExactTokenizer, text: str) -> None:
    assert counter._encoded_length(text) == reference(text)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_equal_on_arbitrary_unicode(counter: ExactTokenizer, text: str) -> None:
    assert counter._encoded_length(text) == reference(text)


#: Each code point is counted in these texts: alone, and where its class (letter,
#: digit, space, other) decides how the text splits into pieces.
CONTEXTS = ("{}", "a{}b", "{}:A", " {}{}", "1{}2", "{} x", "x\n{}", "{}'s", ".{}.")


def _code_points() -> Iterator[int]:
    return (c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)


def _guarded(c: int) -> bool:
    return any(first <= c <= last for first, last in NEWER_LETTERS)


@pytest.mark.skipif(not toktok_available(), reason="toktok-rs or the C kernel is missing")
def test_toktok_splits_as_tiktoken_around_every_code_point_but_the_guarded_ones() -> None:
    # Every code point, in every context, one line each: toktok's raw tokens equal
    # tiktoken's unless the code point is one of NEWER_LETTERS (the guard sends those
    # texts to bpe-openai); and each guarded range holds code points on which they differ
    # (the guard is not wider than it must be). Lines are joined in batches (a newline
    # ends every piece of both), a differing batch is searched line by line.
    raw, ref = _toktok("cl100k_base"), _encoding("cl100k_base")

    def lines(points: list[int]) -> list[str]:
        return [ctx.format(*[chr(c)] * ctx.count("{}")) for c in points for ctx in CONTEXTS]

    def differ(texts: list[str]) -> list[str]:
        joined = "\n".join(texts)
        if raw.encode(joined) == ref.encode_ordinary(joined):
            return []
        return [t for t in texts if raw.encode(t) != ref.encode_ordinary(t)]

    points = list(_code_points())
    unguarded = [c for c in points if not _guarded(c)]
    assert len(points) - len(unguarded) == 4657
    batch = 8192
    assert [t for i in range(0, len(unguarded), batch)
            for t in differ(lines(unguarded[i:i + batch]))] == []
    for first, last in NEWER_LETTERS:
        assert differ(lines(list(range(first, last + 1)))), hex(first)


@pytest.mark.skipif(not toktok_available(), reason="toktok-rs or the C kernel is missing")
def test_a_text_with_a_newer_letter_is_counted_by_bpe_openai(
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = "CJK extension J: \U000323b0:A"  # U+323B0: a letter to toktok, not to tiktoken
    assert _toktok("cl100k_base").count(text) != reference(text)
    assert ToktokTokenizer()._encoded_length(text) == reference(text) == bpe(text)
    # Where bpe-openai does not import, tiktoken counts it.
    monkeypatch.setattr(tokens, "bpe_available", lambda: False)
    tokens._other_counter.cache_clear()
    try:
        assert isinstance(tokens._other_counter("cl100k_base"), TiktokenTokenizer)
        assert ToktokTokenizer()._encoded_length(text) == reference(text)
    finally:
        tokens._other_counter.cache_clear()


@pytest.mark.skipif(any_in_c is None, reason="the C kernel did not build")
@settings(max_examples=500, deadline=None)
@given(text=st.text(st.characters(codec="utf-8"), max_size=40),
       more=st.lists(st.integers(0, 0x10FFFF).filter(lambda c: not 0xD800 <= c <= 0xDFFF)
                     .map(chr), max_size=3),
       ranges=st.lists(st.tuples(st.integers(0, 0x10FFFF), st.integers(0, 64)), max_size=6))
def test_any_in_finds_what_python_finds(text: str, more: list[str],
                                        ranges: list[tuple[int, int]]) -> None:
    # Sorted disjoint (first, last) pairs from arbitrary starts and widths.
    pairs: list[tuple[int, int]] = []
    for first, width in sorted(ranges):
        if pairs and first <= pairs[-1][1]:
            continue
        pairs.append((first, min(first + width, 0x10FFFF)))
    table = array("I", [c for p in pairs for c in p]).tobytes()
    for t in (text, text + "".join(more), "".join(more) + text):
        expected = any(first <= ord(ch) <= last for ch in t for first, last in pairs)
        assert any_in_c is not None and any_in_c(t, table) is expected


@pytest.mark.skipif(any_in_c is None, reason="the C kernel did not build")
def test_any_in_refuses_what_is_not_text_and_pairs() -> None:
    assert any_in_c is not None
    for args in (("x", b"\0" * 7), (b"x", b"\0" * 8), ("x", "ranges")):
        with pytest.raises(TypeError, match="any_in"):
            any_in_c(*args)
    assert any_in_c("anything", b"") is False


def test_get_tokenizer_prefers_toktok_then_bpe_and_any_on_request(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def chosen() -> type:
        get_tokenizer.cache_clear()
        return type(get_tokenizer())

    try:
        assert chosen() is (ToktokTokenizer if toktok_available() else BpeTokenizer)
        for name, kind in (("tiktoken", TiktokenTokenizer), ("BPE-OPENAI", BpeTokenizer)):
            monkeypatch.setenv("VAKPIPE_TOKENIZER", name)
            assert chosen() is kind
        monkeypatch.delenv("VAKPIPE_TOKENIZER")
        # No C kernel (a machine without a compiler): no guard, so no toktok, even
        # when asked for (a warning says so; the counts are the same).
        monkeypatch.setattr(tokens, "any_in_c", None)
        assert not toktok_available() and chosen() is BpeTokenizer
        with pytest.raises(ImportError, match="C kernel"):
            ToktokTokenizer()
        monkeypatch.setenv("VAKPIPE_TOKENIZER", "toktok")
        with caplog.at_level(logging.WARNING, logger="pipeline.replay.tokens"):
            assert chosen() is BpeTokenizer
        assert "VAKPIPE_TOKENIZER=toktok cannot count here" in caplog.text
        # Nor bpe-openai's wheel: tiktoken counts.
        monkeypatch.delenv("VAKPIPE_TOKENIZER")

        def no_wheel(name: str) -> None:
            raise ImportError("no bpe-openai wheel here")

        monkeypatch.setattr(tokens, "_bpe", no_wheel)
        assert chosen() is TiktokenTokenizer
    finally:
        get_tokenizer.cache_clear()


def test_unknown_encodings_are_refused() -> None:
    for kind in (ToktokTokenizer, BpeTokenizer, TiktokenTokenizer):
        with pytest.raises(ValueError, match="no offline vocabulary"):
            kind("r50k_base")


def recorded(seen: list[str]) -> Callable[[str], int]:
    """tiktoken's count, every text it is asked to count appended to ``seen``."""
    def count(text: str) -> int:
        seen.append(text)
        return reference(text)
    return count


def test_count_cache_keys_long_texts_by_content() -> None:
    seen: list[str] = []
    cache = CountCache(recorded(seen), short=4, long=2)
    a, b, c = "alpha " * 200, "beta " * 200, "gamma " * 200
    assert [cache(t) for t in (a, "".join(list(a)), b, a)] == [reference(t) for t in (a, a, b, a)]
    assert seen == [a, b] and cache.hits == 2  # an equal text, not the same object
    cache(c)  # the oldest (a) goes: at most two long texts kept
    assert cache(a) == reference(a) and seen == [a, b, c, a]
    assert cache("") == 0 and cache("hi") == reference("hi")


def test_count_cache_without_long_texts_counts_them_every_time() -> None:
    # toktok's way (long_texts = 0): hashing a long text would cost most of counting it.
    seen: list[str] = []
    cache = CountCache(recorded(seen), short=4, long=0)
    a = "alpha " * 200
    counts = [cache(a), cache(a), cache("hi"), cache("hi")]
    assert counts == [reference(a)] * 2 + [reference("hi")] * 2
    assert seen == [a, a, "hi"] and cache.hits == 0 and cache._long == {}
    assert ToktokTokenizer.long_texts == 0 and BpeTokenizer.long_texts > 0


def test_counts_from_many_threads_are_the_same(counter: ExactTokenizer) -> None:
    # A memory:// run's workers are threads of one process sharing one counter (and the
    # Rust counters release the GIL while they count).
    texts = sorted(replayed_texts(range(1, 4))) + HOSTILE[:24]
    alone = [counter.count(t) for t in texts]
    fresh = type(counter)()
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(fresh.count, texts * 3)) == alone * 3


def test_nothing_downloads_or_writes_a_cache(tmp_path: Path) -> None:
    # A process with an empty HOME and caches, and a proxy that refuses every
    # connection: counting must not reach the network nor leave a file behind.
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIKTOKEN")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), TMPDIR=str(home),
               HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
               NO_PROXY="", PYTHONPATH=str(REPO))
    # The extension alone is loaded: not the package, whose import decodes every
    # vocabulary in Python (and warns, which -W error turns into a failure).
    code = ("import sys\n"
            "from pipeline.replay.tokens import get_tokenizer, TiktokenTokenizer\n"
            "t = get_tokenizer(); r = TiktokenTokenizer()\n"
            "print(type(t).__name__, t.count('hello world <|endoftext|>'),"
            " r.count('hello world <|endoftext|>'), 'bpe_openai' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    default = "ToktokTokenizer" if toktok_available() else "BpeTokenizer"
    assert done.stdout.split() == [default, "8", "8", "False"]
    assert list(home.rglob("*")) == []


def test_tokenizers_travel_by_name() -> None:
    # A worker gets the name and loads its own copy once (the cache stays behind).
    import pickle

    kinds = [BpeTokenizer, TiktokenTokenizer, *([ToktokTokenizer] if toktok_available() else [])]
    for tok in (kind() for kind in kinds):
        tok.count("warm " * 200)
        copy = pickle.loads(pickle.dumps(tok))
        assert type(copy) is type(tok) and copy.name == tok.name
        assert copy.cache.hits == 0 and copy.count("warm " * 200) == tok.count("warm " * 200)
