"""Entries as vak writes them: compact JSON in vak's key order, ids and times. Pure.

Shared by the generator (which writes whole synthetic ledgers) and the compacted
archive writer (which appends packets to real ones), so both write the same bytes.
"""

from __future__ import annotations

import time
from json.encoder import encode_basestring as _escape
from typing import Any, NamedTuple

import orjson


class RawEntry(NamedTuple):
    """One clean entry before serialisation (a tuple: cheap to build millions of)."""

    id: str
    parent_id: str | None
    ts: str
    at_turn: str | None
    kind: str
    payload: dict[str, Any]
    #: A ``work`` entry's event, written as a second ``kind`` key (vak's quirk).
    event: dict[str, Any] | None = None


class LongText:
    """A long string value, serialised outside orjson.

    orjson reserves several times a string's length for its output and keeps that
    reservation in the returned ``bytes``; for a megabyte tool result that is ~8 MB per
    line. The C string escaper of :mod:`json` (``ensure_ascii=False``) escapes exactly
    as orjson and serde_json do for this text (quote, backslash, control characters).
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_SPLICE = b'"\\u0000"'  # how orjson writes the placeholder "\0" a LongText stands in for


def _dumps(d: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # a LongText: rare, only on big lines
        pass
    texts: list[str] = []

    def spill(obj: Any) -> str:
        if not isinstance(obj, LongText):
            raise TypeError(f"not serialisable: {type(obj).__name__}")
        texts.append(obj.text)
        return "\0"

    parts = orjson.dumps(d, default=spill, option=orjson.OPT_APPEND_NEWLINE).split(_SPLICE)
    out = [parts[0]]
    for text, part in zip(texts, parts[1:], strict=True):
        out += [_escape(text).encode(), part]
    return b"".join(out)


def serialize(e: RawEntry, prev_hash: str | None) -> bytes:
    """One entry as vak writes it: envelope in field order, payload flattened, ``\\n``."""
    d: dict[str, Any] = {"id": e.id, "parent_id": e.parent_id, "ts": e.ts}
    if prev_hash is not None:
        d["prev_hash"] = prev_hash
    if e.at_turn is not None:
        d["at_turn"] = e.at_turn
    d["kind"] = e.kind
    d.update(e.payload)
    if e.event is None:
        return _dumps(d)
    # No JSON serializer emits a duplicate key, so the second "kind" is spliced in by hand
    # exactly where serde's flatten puts it: after the payload fields.
    return _dumps(d)[:-2] + b',"kind":' + orjson.dumps(e.event) + b"}\n"


def rfc3339_ns(ns: int) -> str:
    s, frac = divmod(ns, 1_000_000_000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(s))}.{frac:09d}Z"


def uuid7(ms: int, r: int) -> str:
    """A UUIDv7-shaped id: 48-bit milliseconds, version 7, variant 10, 74 random bits."""
    x = ((ms & 0xFFFFFFFFFFFF) << 80 | 0x7 << 76 | (r >> 62 & 0xFFF) << 64 | 0x2 << 62
         | r & 0x3FFFFFFFFFFFFFFF)
    h = f"{x:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
