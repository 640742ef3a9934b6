"""The replay's tokenizers: ``bpe-openai``'s counts equal tiktoken's ``encode_ordinary``
on every text a replay of generated sessions counts, on every string of the real
transcripts, on hostile texts and on fuzzed ones; nothing is downloaded; the count cache
returns what the encoder says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.audit.session import audit_session
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import Entry
from pipeline.replay.catalog import load_catalog
from pipeline.replay.projection import get_rule_set
from pipeline.replay.session import replay_session
from pipeline.replay.tokens import (
    BpeTokenizer,
    CountCache,
    TiktokenTokenizer,
    _encoding,
    bpe_available,
    get_tokenizer,
)
from pipeline.synth.generator import generate_session
from tests.helpers.data_paths import REAL

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not bpe_available(), reason="bpe-openai does not import")


def reference(text: str) -> int:
    """tiktoken's count, uncached: what the replay counted before ``bpe-openai``."""
    return len(_encoding("cl100k_base").encode_ordinary(text))


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


def mismatches(texts: set[str]) -> list[tuple[str, int, int]]:
    return [(t[:80], a, b) for t in texts if (a := bpe(t)) != (b := reference(t))]


def test_equal_on_every_text_a_replay_of_generated_sessions_counts() -> None:
    texts = replayed_texts(range(1, 13))
    assert len(texts) > 300
    assert mismatches(texts) == []


def test_equal_on_every_string_of_the_real_transcripts() -> None:
    texts = real_strings()
    assert sum(map(len, texts)) > 1_000_000
    assert mismatches(texts) == []


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
def test_equal_on_hostile_texts(text: str) -> None:
    assert bpe(text) == reference(text)


def test_equal_on_texts_above_the_wrappers_200k_token_limit() -> None:
    # The package's tiktoken-like Encoding refuses more than ~200k tokens per call; the
    # bindings vakpipe calls take any length, so nothing is chunked.
    source = (REPO / "pipeline" / "replay" / "engine.py").read_text(encoding="utf-8")
    huge = "\n".join([source] * 45 + ["<|endoftext|> 日本 🙂 " * 5000])
    n = bpe(huge)
    assert n > 250_000
    assert n == reference(huge)


ALPHABET = st.sampled_from([
    " ", "  ", "\n", "\r\n", "\r", "\t", "a", "Z", "é", "1", "123", "'s", "'LL", "’", ".",
    "!?", "日本", "🙂", "\u0301", "\u00a0", "\u2028", "<|endoftext|>", "x_y", "\x00", "{\"",
])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ALPHABET, max_size=60).map("".join))
def test_equal_on_fuzzed_pieces(text: str) -> None:
    assert bpe(text) == reference(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_equal_on_arbitrary_unicode(text: str) -> None:
    assert bpe(text) == reference(text)


def test_get_tokenizer_prefers_bpe_and_tiktoken_on_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(get_tokenizer(), BpeTokenizer)
    monkeypatch.setenv("VAKPIPE_TOKENIZER", "tiktoken")
    get_tokenizer.cache_clear()
    try:
        assert isinstance(get_tokenizer(), TiktokenTokenizer)
    finally:
        get_tokenizer.cache_clear()


def test_unknown_encodings_are_refused() -> None:
    with pytest.raises(ValueError, match="no offline vocabulary"):
        BpeTokenizer("r50k_base")


def test_count_cache_keys_long_texts_by_content() -> None:
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return reference(text)

    cache = CountCache(count, short=4, long=2)
    a, b, c = "alpha " * 200, "beta " * 200, "gamma " * 200
    assert [cache(t) for t in (a, "".join(list(a)), b, a)] == [reference(t) for t in (a, a, b, a)]
    assert seen == [a, b] and cache.hits == 2  # an equal text, not the same object
    cache(c)  # the oldest (a) goes: at most two long texts kept
    assert cache(a) == reference(a) and seen == [a, b, c, a]
    assert cache("") == 0 and cache("hi") == reference("hi")


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
    assert done.stdout.split() == ["BpeTokenizer", "8", "8", "False"]
    assert list(home.rglob("*")) == []


def test_tokenizers_travel_by_name() -> None:
    # A worker gets the name and loads its own copy once (the cache stays behind).
    import pickle

    for tok in (BpeTokenizer(), TiktokenTokenizer()):
        tok.count("warm " * 200)
        copy = pickle.loads(pickle.dumps(tok))
        assert type(copy) is type(tok) and copy.name == tok.name
        assert copy.cache.hits == 0 and copy.count("warm " * 200) == tok.count("warm " * 200)
