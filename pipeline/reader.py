"""Read one ledger's bytes line by line into entries and line/chain findings. Pure.

The reader implements spec section 2.1: envelope validation, 1-based physical line
numbers, the hash chain (``prev_hash`` is the SHA-256 of the previous *valid entry*'s
stored bytes), classification of bad lines by the next valid entry, and vak's two
quirks (torn merge, duplicate ``kind`` in ``work`` lines). It never raises on input:
every oddity becomes a :class:`~pipeline.types.Finding`.

Only the current line is held in memory, so a caller that streams the file keeps
memory bounded by the largest line; the IO layer bounds that too, handing a line over
the limit (``--max-line-bytes``) in as an :class:`~pipeline.types.OversizeLine`, which
is reported as a line that is not a valid entry.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date
from typing import Any, NamedTuple, TypeGuard

import orjson

from pipeline.redact import bounded, redact
from pipeline.types import Code, Finding, OversizeLine

#: Kinds vak writes: the 13 of the seed (T13) and the later ones (T14-T17).
KNOWN_KINDS: frozenset[str] = frozenset(
    {
        "header", "message", "compaction", "receipt", "goal", "goal_update", "activity",
        "work", "intent", "child_run", "turn_capabilities_bound", "presentation",
        "turn_card", "evidence_body", "context_selection", "turn_capabilities_ref",
        "call_effect",
    }
)

# RFC 3339 as chrono writes it: Z, and 0, 3, 6 or 9 fractional digits. ASCII digits
# only (``\d`` alone would accept any Unicode decimal digit, e.g. Arabic-Indic ones).
_TS_STR = re.compile(
    r"(\d{4}-\d\d-\d\d)T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{3}|\.\d{6}|\.\d{9})?Z\Z",
    re.ASCII,
)
#: Calendar validity of the dates seen (bounded: cleared when full).
_DAYS: dict[str, bool] = {}
_TS_MATCH = _TS_STR.match
_MAX_DAYS = 4096
#: Where a merged entry can start: vak writes every entry as ``{"id":"…","parent_id":…,
#: "ts":"…`` (serde field order, compact). Matching the whole envelope prefix rather than
#: ``{"id":`` alone skips the many nested ``{"id":…}`` objects a torn payload can hold
#: (serde_json sorts map keys, so ``id`` often comes first in tool inputs), which would
#: otherwise use up the probes before the merged entry is reached. Linear to scan: a run
#: of ``[^"\\]`` stops at the next quote, and every candidate start holds quotes.
_ENTRY_START = re.compile(rb'\{"id":"[^"\\]*","parent_id":(?:null|"[^"\\]*"),"ts":"')
#: A torn fragment is searched for a complete trailing entry at most this many times,
#: so a hostile line full of ``{"id":`` cannot make recovery quadratic.
MAX_MERGE_PROBES = 64
#: Findings quote at most this much of anything taken from the input.
MAX_DETAIL_CHARS = 200


class Entry(NamedTuple):
    """One valid ledger entry (immutable; a named tuple because one is built per line
    and a frozen dataclass costs several times more to construct).

    Attributes
    ----------
    line:
        1-based physical line the entry was read from.
    id, parent_id, kind, ts, prev_hash, at_turn:
        The envelope (``kind`` is ``"work"`` for vak's duplicate-``kind`` lines).
    digest:
        Lower-case hex SHA-256 of the entry's stored bytes (what the next entry's
        ``prev_hash`` must equal).
    data:
        The whole parsed object; payload fields are at the top level, as written.
    """

    line: int
    id: str
    parent_id: str | None
    kind: str
    ts: str
    prev_hash: str | None
    at_turn: str | None
    digest: str
    data: dict[str, Any]

    @property
    def is_header(self) -> bool:
        """Whether this is a ``header`` entry."""
        return self.kind == "header"

    @property
    def message(self) -> dict[str, Any] | None:
        """The ``message`` object of a message entry, if well-formed."""
        m = self.data.get("message")
        return m if self.kind == "message" and isinstance(m, dict) else None

    @property
    def role(self) -> str | None:
        """``"user"`` or ``"assistant"`` for message entries, else ``None``."""
        m = self.message
        role = m.get("role") if m else None
        return role if isinstance(role, str) else None

    @property
    def meta(self) -> dict[str, Any]:
        """The message ``meta`` object (empty when absent or malformed)."""
        meta = self.data.get("meta")
        return meta if isinstance(meta, dict) else {}

    @property
    def content(self) -> list[dict[str, Any]]:
        """Content blocks of a message (malformed blocks dropped)."""
        m = self.message
        blocks = m.get("content") if m else None
        if not isinstance(blocks, list):
            return []
        return [b for b in blocks if isinstance(b, dict)]

    @property
    def work_event(self) -> dict[str, Any] | None:
        """The event of a ``work`` entry (the second ``kind`` value vak writes)."""
        ev = self.data.get("kind")
        return ev if self.kind == "work" and isinstance(ev, dict) else None


_new_entry = tuple.__new__


def valid_ts(ts: object) -> TypeGuard[str]:
    """Whether ``ts`` is an RFC 3339 UTC timestamp as vak writes it (spec section 2).

    The text must match chrono's shape (``Z``, 0/3/6/9 fractional digits) *and* name a
    real instant: ``2026-13-45T25:61:00Z`` has the shape but is no time at all. A leap
    second (``:60``) is refused too: ``Utc::now()`` never yields one.
    """
    # This runs once per line: the regex checks the shape and the time-of-day ranges,
    # and the calendar check of the date (the only part a regex cannot do) is cached,
    # since a session's entries share a handful of dates.
    if type(ts) is not str:
        return False
    match = _TS_STR.match(ts)
    if match is None:
        return False
    day = match.group(1)
    known = _DAYS.get(day)
    if known is None:
        if len(_DAYS) >= _MAX_DAYS:
            _DAYS.clear()
        try:
            date.fromisoformat(day)
            known = True
        except ValueError:
            known = False
        _DAYS[day] = known
    return known


def _detail(text: str) -> str:
    # Redacted before the cut, so that a cut can never leave part of a secret behind.
    return bounded(redact(text), MAX_DETAIL_CHARS)


class _Pairs(dict[str, Any]):
    """A dict that remembers every value of a repeated key (for the ``kind`` quirk)."""

    kinds: list[Any]


def _pairs_hook(pairs: list[tuple[str, Any]]) -> _Pairs:
    d = _Pairs(pairs)
    d.kinds = [v for k, v in pairs if k == "kind"]
    return d


def _work_quirk(body: bytes) -> bool:
    """Whether ``body`` is a ``work`` line written with two ``kind`` keys, as vak does."""
    try:
        top = json.loads(body, object_pairs_hook=_pairs_hook)
    except (ValueError, RecursionError):
        return False
    kinds = getattr(top, "kinds", [])
    return len(kinds) == 2 and kinds[0] == "work" and isinstance(kinds[1], dict)


def parse_entry(body: bytes, line: int) -> tuple[Entry | None, bool, str]:
    """Parse one stored line (without its newline) into an :class:`Entry`.

    Parameters
    ----------
    body:
        The line's exact stored bytes, newline removed.
    line:
        Its 1-based physical line number.

    Returns
    -------
    (entry, duplicate_kind, reason)
        ``entry`` is ``None`` when the line is not a valid entry, ``reason`` then says
        why; ``duplicate_kind`` is true for vak's ``work`` quirk.
    """
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        return None, False, _detail(f"not valid JSON: {err}")
    if type(obj) is not dict:
        return None, False, f"not a JSON object but {type(obj).__name__}"
    # The common case in one pass (orjson yields exact ``str``/``dict`` types, so
    # ``type() is`` is exact); optional fields are omitted when absent, never null, so a
    # ``None`` from ``get`` is checked against presence only on that rare path.
    ident = obj.get("id")
    parent = obj.get("parent_id", _ABSENT)
    kind = obj.get("kind")
    prev = obj.get("prev_hash")
    at_turn = obj.get("at_turn")
    ts = obj.get("ts")
    if (
        type(ident) is str and ident
        and (parent is None or type(parent) is str)
        and type(kind) is str and kind
        and (type(prev) is str or (prev is None and "prev_hash" not in obj))
        and (type(at_turn) is str or (at_turn is None and "at_turn" not in obj))
        # valid_ts inlined: its shape, then the date's cached calendar check
        and type(ts) is str and (shape := _TS_MATCH(ts)) is not None
        and (_DAYS.get(shape[1]) or valid_ts(ts))
    ):
        digest = hashlib.sha256(body).hexdigest()
        # Entry(...) without the Python frame of a named tuple's ``__new__``.
        return _new_entry(Entry, (line, ident, parent, kind, ts, prev, at_turn, digest, obj)), \
            False, ""
    return _parse_slow(body, line, obj)


_ABSENT: Any = object()


def reread_entry(body: bytes, line: int) -> Entry:
    """The entry :func:`parse_entry` found valid on ``line``, parsed again from the same
    bytes for a second pass (the replay's) that needs no digest: its ``digest`` is
    empty, and nothing is checked again.

    Raises
    ------
    ValueError, KeyError
        ``body`` is not what :func:`parse_entry` accepted (a caller's bug).
    """
    obj = orjson.loads(body)
    kind = obj["kind"]
    # A dict ``kind`` is vak's duplicate-kind work line (the only one parse_entry takes).
    return _new_entry(Entry, (line, obj["id"], obj["parent_id"],
                              kind if type(kind) is str else "work", obj["ts"],
                              obj.get("prev_hash"), obj.get("at_turn"), "", obj))


def _parse_slow(body: bytes, line: int, obj: dict[str, Any]) -> tuple[Entry | None, bool, str]:
    """:func:`parse_entry` for an envelope the fast path refused: say why, or accept
    vak's duplicate-``kind`` ``work`` line."""
    ident = obj.get("id")
    if not isinstance(ident, str) or not ident:
        return None, False, "envelope: id missing or not a string"
    if "parent_id" not in obj:
        return None, False, "envelope: parent_id missing"
    parent = obj["parent_id"]
    if parent is not None and not isinstance(parent, str):
        return None, False, "envelope: parent_id is neither a string nor null"
    ts = obj.get("ts")
    if not valid_ts(ts):
        return None, False, "envelope: ts missing or not RFC 3339 UTC"
    prev = obj.get("prev_hash")
    if "prev_hash" in obj and not isinstance(prev, str):
        return None, False, "envelope: prev_hash is not a string"
    at_turn = obj.get("at_turn")
    if "at_turn" in obj and not isinstance(at_turn, str):
        return None, False, "envelope: at_turn is not a string"
    kind = obj.get("kind")
    if isinstance(kind, dict) and _work_quirk(body):
        digest = hashlib.sha256(body).hexdigest()
        return Entry(line, ident, parent, "work", ts, prev, at_turn, digest, obj), True, ""
    return None, False, "envelope: kind missing or not a string"


def _recover_merged(body: bytes, line: int) -> list[tuple[Entry, bool]]:
    """Recover the complete entries of a torn line (vak's torn merge).

    The complete entry is the earliest suffix that parses. When the part before it is
    itself a complete entry, the crash cut only the newline between two appends
    (``{A}{B}``): both are recovered, so a lost newline does not cost an entry.
    """
    for probes, match in enumerate(_ENTRY_START.finditer(body, 1)):
        if probes >= MAX_MERGE_PROBES:
            break
        entry, dup, _ = parse_entry(body[match.start():], line)
        if entry is not None:
            first, first_dup, _ = parse_entry(body[: match.start()], line)
            if first is not None and entry.prev_hash == first.digest:
                return [(first, first_dup), (entry, dup)]
            return [(entry, dup)]
    return []


@dataclass(slots=True)
class LineStats:
    """Physical lines and bytes a :func:`read_ledger` call has consumed so far."""

    lines: int = 0
    bytes: int = 0


def read_ledger(
    lines: Iterable[bytes], stats: LineStats | None = None
) -> Iterator[Entry | Finding]:
    """Stream a ledger's physical lines into entries and line/chain findings.

    Parameters
    ----------
    lines:
        The file's physical lines as bytes, each with its trailing ``b"\\n"`` except
        possibly the last (what iterating a binary file yields); a line the IO layer
        skipped as too long is an :class:`~pipeline.types.OversizeLine`.
    stats:
        Filled with the number of physical lines and bytes read, once the stream ends.

    Yields
    ------
    Entry | Finding
        Valid entries in file order, interleaved with the findings of spec 2.1
        (``damaged_entry``, ``hash_mismatch``, ``torn_tail``, ``torn_write_recovered``,
        ``torn_merge``, ``unchained``, ``duplicate_kind_key``). A finding about a bad
        line is yielded once the next valid entry has classified it.
    """
    prev_digest: str | None = None
    pending: list[tuple[int, str]] = []  # bad lines waiting for the next valid entry
    number = nbytes = 0
    last_terminated = True
    for number, raw in enumerate(lines, 1):
        nbytes += len(raw)
        last_terminated = raw[-1:] == b"\n"
        body = raw[:-1] if last_terminated else raw
        entry, duplicate_kind, reason = parse_entry(body, number)
        if (entry is not None and not pending and not duplicate_kind
                and entry.prev_hash == prev_digest and prev_digest is not None):
            # The common case, a chained entry after a valid one, without the
            # general path's bookkeeping (this loop runs once per line).
            prev_digest = entry.digest
            yield entry
            continue
        if entry is not None:
            found = [(entry, duplicate_kind)]
        elif type(raw) is OversizeLine:
            # Never a valid entry (its bytes were not read): classified like any bad line.
            nbytes += raw.size - len(raw)
            pending.append((number, raw.reason))
            continue
        else:
            found = _recover_merged(body, number)
            if not found:
                pending.append((number, reason))
                continue
            yield Finding(
                Code.TORN_MERGE, number, found[-1][0].id,
                "a torn fragment precedes a complete entry on this line; entry recovered"
                if len(found) == 1 else
                "two complete entries share this line (the newline between them was lost); "
                "both recovered",
            )
        for entry, duplicate_kind in found:
            if duplicate_kind:
                yield Finding(
                    Code.DUPLICATE_KIND_KEY, number, entry.id,
                    "work entry written with two kind keys (vak quirk); event read from the second",
                )
            classified = bool(pending)
            if pending:
                # Sealed only when the successor *names* the previous valid entry: with no
                # prev_hash, or no previous valid entry (a bad line before the header),
                # nothing shows the bad line was a torn write, so it counts as damage.
                sealed = entry.prev_hash is not None and entry.prev_hash == prev_digest
                code = Code.TORN_WRITE_RECOVERED if sealed else Code.DAMAGED_ENTRY
                for bad_line, why in pending:
                    yield Finding(code, bad_line, None, why)
                pending.clear()
            if entry.prev_hash is None:
                if not entry.is_header:
                    yield Finding(
                        Code.UNCHAINED, number, entry.id,
                        "no prev_hash: written before hash chaining, cannot be verified",
                    )
            elif not classified and entry.prev_hash != prev_digest:
                expected = prev_digest[:16] if prev_digest else "nothing (no earlier entry)"
                yield Finding(
                    Code.HASH_MISMATCH, number, entry.id,
                    f"prev_hash {redact(entry.prev_hash)[:16]}… does not match the previous "
                    f"entry ({expected}…): an edit, insertion, deletion or reordering",
                )
            prev_digest = entry.digest
            yield entry
    if stats is not None:
        stats.lines, stats.bytes = number, nbytes
    if pending:
        # Nothing valid follows: the last physical line is the torn tail; bad lines
        # before it cannot be classified by a successor, so they count as damaged.
        *earlier, (last_bad, why) = pending
        for bad_line, reason in earlier:
            yield Finding(Code.DAMAGED_ENTRY, bad_line, None, reason)
        yield Finding(Code.TORN_TAIL, last_bad, None, _detail(f"last line unreadable: {why}"))
    elif number and not last_terminated:
        yield Finding(
            Code.TORN_TAIL, number, None,
            "last line has no newline: the append was cut short (the next append would merge)",
        )
