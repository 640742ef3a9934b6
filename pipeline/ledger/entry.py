"""What an entry means, the semantics every stage reads the same way. Pure.

Whether a message starts a turn (:func:`is_directive`), the usage of a message or a
receipt's winning attempt (:func:`usage_of`, :func:`winning_usage`), a request's input
and output (:func:`input_and_output`) and timestamps (:func:`ts_nanos`). The audit, the
turns, the replay and the pricing all import these from here, down, never from each other.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Any

from pipeline.ledger.reader import Entry
from pipeline.ledger.types import MAX_TOKEN_COUNT, as_list, token_count

__all__ = ["USAGE_KEYS", "ZERO_USAGE", "Usage", "add_usage", "input_and_output", "is_directive",
           "starts_turn", "ts_nanos", "usage_of", "winning_usage"]

Usage = tuple[int, int, int, int]  # input, output, cache read, cache write
ZERO_USAGE: Usage = (0, 0, 0, 0)

#: The token counts of a ``usage`` object, in :data:`Usage` order.
USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens",
               "cache_creation_input_tokens")


def usage_of(obj: Any) -> Usage | None:
    """Read a ``usage`` object; ``None`` unless its token counts are integers from 0 to
    :data:`~pipeline.ledger.types.MAX_TOKEN_COUNT` (absent or null: 0)."""
    if not isinstance(obj, dict):
        return None
    get = obj.get
    # Once per request and attempt: the usual in-range integers, an absent one read as
    # 0, in one test (vak leaves the cache counts out of most usages; a null takes the
    # loop below). ``type() is int`` also refuses bool (a subclass of int). The keys are
    # USAGE_KEYS spelled out (no tuple look-ups here); a property test holds them alike.
    i, o = get("input_tokens", 0), get("output_tokens", 0)
    r, c = get("cache_read_input_tokens", 0), get("cache_creation_input_tokens", 0)
    if (type(i) is int and type(o) is int and type(r) is int and type(c) is int
            and 0 <= i <= MAX_TOKEN_COUNT and 0 <= o <= MAX_TOKEN_COUNT
            and 0 <= r <= MAX_TOKEN_COUNT and 0 <= c <= MAX_TOKEN_COUNT):
        return (i, o, r, c)
    for v in (i, o, r, c):
        if v is not None and token_count(v) is None:
            return None
    return (i or 0, o or 0, r or 0, c or 0)


def add_usage(a: Usage, b: Usage) -> Usage:
    """The sum of two usages, kind by kind."""
    return a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]


def is_directive(entry: Entry) -> bool:
    """Whether a message starts a turn: user role, no control tag, text, no tool_result.

    A block whose ``type`` is not a string (no block vak writes) is ignored.
    """
    message = entry.message
    return (message is not None and message.get("role") == "user"
            and starts_turn(message, entry.data.get("meta")))


def starts_turn(message: dict[str, Any], meta: Any) -> bool:
    """:func:`is_directive` of a user message object and its entry's ``meta``."""
    # Once per user message, on plain dicts: a control tag, else a text block and no
    # tool_result (a ``type`` that is not a string equals neither).
    if isinstance(meta, dict) and meta.get("control"):
        return False
    blocks = message.get("content")
    if not isinstance(blocks, list):
        return False
    text = False
    for block in blocks:
        if isinstance(block, dict):
            kind = block.get("type")
            if kind == "tool_result":
                return False
            text = text or kind == "text"
    return text


def input_and_output(u: Usage | None) -> tuple[int | None, int | None]:
    """A request's provider-reported input (input + cache read + cache creation) and
    output tokens, or ``(None, None)`` without usage."""
    return (u[0] + u[2] + u[3], u[1]) if u is not None else (None, None)


def winning_usage(receipt: dict[str, Any]) -> Usage | None:
    """Usage of a receipt's winning attempt; ``None`` unless ``winning_attempt`` is set."""
    ordinal = receipt.get("winning_attempt")
    if ordinal is None:
        return None
    for att in as_list(receipt.get("attempts")):
        if type(att) is dict and att.get("ordinal") == ordinal:
            return usage_of(att.get("usage"))
    return None


#: RFC 3339 ``date-time`` (section 5.6): ``T``/``t`` (or, as its note allows, a space)
#: between date and time, any number of fractional digits, ``Z``/``z`` or an offset.
#: ASCII digits only. Ranges and the calendar are checked after the match.
_RFC3339 = re.compile(
    r"(\d{4}-\d\d-\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:[Zz]|([+-])(\d\d):(\d\d))\Z",
    re.ASCII,
)
_rfc3339 = _RFC3339.match
_EPOCH_DAY = date(1970, 1, 1).toordinal()
#: Days since the epoch of the dates seen (``None``: no such date); bounded, cleared when full.
_EPOCH_DAYS: dict[str, int | None] = {}
_MAX_EPOCH_DAYS = 4096


def _epoch_day(day: str) -> int | None:
    """Days since the epoch of an ISO date (``None``: no such date), kept for next time."""
    known: int | None
    try:
        known = date.fromisoformat(day).toordinal() - _EPOCH_DAY
    except ValueError:
        known = None
    if len(_EPOCH_DAYS) >= _MAX_EPOCH_DAYS:
        _EPOCH_DAYS.clear()
    _EPOCH_DAYS[day] = known
    return known


def ts_nanos(ts: object) -> int | None:
    """Nanoseconds since the epoch (UTC) of an RFC 3339 timestamp, or ``None``.

    Accepts what vak writes (``...Z``, 0/3/6/9 fractional digits) and what other agents
    do: a lower-case ``z``, a numeric offset (``+00:00``, ``-05:00``: normalised to UTC),
    any number of fractional digits (past nine, cut to nanoseconds). A leap second
    (``:60``) is the instant after ``:59``. Anything else (not a string, not that shape,
    no such date or time of day) is ``None``.
    """
    # Per call one regex match and integer arithmetic; the date's day number is cached,
    # since a session's timestamps share a handful of dates.
    if type(ts) is not str:
        return None
    m = _rfc3339(ts)
    if m is None:
        return None
    day, hh, mm, ss, frac, sign, oh, om = m.groups()
    days = _EPOCH_DAYS.get(day)
    if days is None:
        days = _epoch_day(day)
        if days is None:
            return None
    h, mi, sec = int(hh), int(mm), int(ss)
    if h > 23 or mi > 59 or sec > 60:
        return None
    secs = days * 86_400 + h * 3_600 + mi * 60 + sec
    if sign is not None:
        off_h, off_m = int(oh), int(om)
        if off_h > 23 or off_m > 59:
            return None
        off = off_h * 3_600 + off_m * 60
        secs = secs - off if sign == "+" else secs + off
    if frac is None:
        return secs * 1_000_000_000
    return secs * 1_000_000_000 + int(frac[:9].ljust(9, "0"))
