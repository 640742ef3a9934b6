"""Read one ledger's bytes line by line into entries and line/chain findings. Pure.

The reader implements spec section 2.1: envelope validation, 1-based physical line
numbers, the hash chain (``prev_hash`` is the SHA-256 of the previous *valid entry*'s
stored bytes), classification of bad lines by the next valid entry, and vak's two
quirks (torn merge, duplicate ``kind`` in ``work`` lines). It never raises on input:
every oddity becomes a :class:`~pipeline.ledger.types.Finding`.

Only the current line is held in memory, so a caller that streams the file keeps
memory bounded by the largest line; the IO layer bounds that too, handing a line over
the limit (``--max-line-bytes``) in as an :class:`~pipeline.ledger.types.OversizeLine`, which
is reported as a line that is not a valid entry.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date
from typing import Any, NamedTuple, TypeGuard

import orjson

from pipeline.ledger.kernel import chained_c as _chained_c
from pipeline.ledger.kernel import configure_c as _configure_c
from pipeline.ledger.kernel import entry_c as _entry_c
from pipeline.ledger.kernel import lazy_c as _lazy_c
from pipeline.ledger.kernel import pushback_c as _pushback_c
from pipeline.ledger.kernel import scan as _scan
from pipeline.ledger.kernel import work_quirk_c as _work_quirk_c
from pipeline.ledger.kernel import worth_it as _worth_it
from pipeline.ledger.kernel import worth_it_c as _WORTH_IT_C
from pipeline.ledger.nesting import nested_deeper_than
from pipeline.ledger.redact import quote, redact
from pipeline.ledger.types import Code, Finding, OversizeLine

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
#: How vak starts every entry, and so where a merged entry can start: ``{"id":"…",
#: "parent_id":…,"ts":"…`` (serde field order, compact). Matching the whole envelope
#: prefix rather than ``{"id":`` alone skips the many nested ``{"id":…}`` objects a torn
#: payload can hold (serde_json sorts map keys, so ``id`` often comes first in tool
#: inputs), which would otherwise use up the probes before the merged entry is reached.
#: Linear to scan: a run of ``[^"\\]`` stops at the next quote, and every candidate
#: start holds quotes.
ENTRY_START = re.compile(rb'\{"id":"[^"\\]*","parent_id":(?:null|"[^"\\]*"),"ts":"')
#: A torn fragment is searched for a complete trailing entry at most this many times,
#: so a hostile line full of ``{"id":`` cannot make recovery quadratic.
MAX_MERGE_PROBES = 64
#: Findings quote at most this much of anything taken from the input.
MAX_DETAIL_CHARS = 200
#: A run of consecutive lines that are not valid entries is reported line by line up to
#: this many; the rest of the run as one finding (its first line, how many, where it
#: ends), so a run costs the same memory and output whatever its length.
MAX_LISTED_BAD_LINES = 10
#: The detail of a blank line.
BLANK_LINE = "blank line: not a JSON object"


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
        ``prev_hash`` must equal); empty where no chain exists (the built-in transcript
        adapters hash only their head entry, for the row's ``head_hash``).
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
_sha256 = hashlib.sha256


class _Payload:
    """The payload of a :class:`LazyEntry`: its stored bytes until a stage asks for the
    data (parsed by orjson then, once), and what the audit reads of a message (a dict),
    or of a receipt or a header the C kernel read (the receipt's node info; the header's
    five fields, :func:`header_view`: docs/audit.md, "Receipts", "Headers")."""

    __slots__ = ("body", "data", "mapper", "view")

    def __init__(self, body: bytes | None, data: dict[str, Any] | None,
                 view: Any,
                 mapper: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        # Only stores the four: the C kernel makes payloads without this call (its
        # allocator and the slots' descriptors), and a test holds the two alike.
        self.body, self.data, self.view, self.mapper = body, data, view, mapper

    def value(self) -> dict[str, Any]:
        """The whole payload, parsed on the first call (the bytes are dropped then);
        ``mapper`` (a transcript adapter's) turns the parsed line into the entry's data."""
        data = self.data
        if data is None:
            data = orjson.loads(self.body or b"")
            if self.mapper is not None:
                data = self.mapper(data)
            self.data = data
            self.body = None
        return data

    def __eq__(self, other: object) -> bool:
        # An entry equals the same entry read without the kernel (tuples compare items).
        if isinstance(other, _Payload):
            other = other.value()
        return self.value() == other

    __hash__ = None  # type: ignore[assignment]  # like the dict it stands for

    def __repr__(self) -> str:
        return repr(self.value())

    def __reduce__(self) -> tuple[Any, ...]:
        return _Payload, (self.body, self.data, self.view, self.mapper)


class LazyEntry(Entry):
    """An :class:`Entry` read by the kernel: ``data`` is parsed when first read.

    The audit reads only the envelope and :func:`audit_view`; the replay, the
    compaction and everything else read ``data`` as from any entry.
    """

    __slots__ = ()

    @property
    def data(self) -> dict[str, Any]:
        """The whole parsed object (parsed on the first read)."""
        payload: Any = tuple.__getitem__(self, 8)
        data: dict[str, Any] | None = payload.data
        return data if data is not None else payload.value()


def lazy_entry(line: int, ident: str, parent: str | None, kind: str, ts: str, digest: str,
               body: bytes, view: dict[str, Any] | None,
               mapper: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Entry:
    """An entry whose ``data`` stays as the stored ``body`` until read (then parsed by
    orjson and passed through ``mapper``, a module-level function so that the entry
    pickles); :func:`audit_view` gives ``view`` without parsing. For a transcript
    adapter whose own scan read the fields the audit needs (:mod:`pipeline.formats`)."""
    return _new_entry(LazyEntry, (line, ident, parent, kind, ts, None, None, digest,
                                  _Payload(body, None, view, mapper)))


#: :func:`lazy_entry` in Python: the reference the C one is tested against.
lazy_entry_py = lazy_entry

if _configure_c is not None and _lazy_c is not None:
    _configure_c(LazyEntry, _Payload, hashlib.sha256, Entry)
    # The same entry from C, without lazy_entry's frame and _Payload.__init__'s: once a
    # line of a transcript (pipeline/formats).
    lazy_entry = _lazy_c


def audit_view(entry: Entry) -> dict[str, Any]:
    """What the audit reads of an entry's payload: its ``data``, or for a message line
    the kernel read, its ``message`` (``role``; ``content`` blocks cut to their
    ``type``, an assistant's to none) and ``meta`` (docs/audit.md, "The per-line
    kernel"). Never parses a message line's content."""
    payload: Any = tuple.__getitem__(entry, 8)
    if type(payload) is _Payload:
        view = payload.view
        # (a receipt or a header the C kernel read keeps no dict there)
        return view if type(view) is dict else payload.value()
    return payload  # type: ignore[no-any-return]


def header_view(entry: Entry) -> tuple[str | None, ...] | None:
    """What the C kernel kept of a header it read (docs/audit.md, "Headers"):
    ``(session_id, cwd, contract.model, contract.provider, contract.app_version)``, each
    the string the payload holds there or ``None`` (absent, or of another type); ``None``
    for an entry read otherwise (then read its ``data``)."""
    payload: Any = tuple.__getitem__(entry, 8)
    if type(payload) is _Payload and type(payload.view) is tuple:
        return payload.view
    return None


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
    return quote(redact(text), MAX_DETAIL_CHARS)


class _Pairs(dict[str, Any]):
    """A dict that remembers every value of a repeated key (for the ``kind`` quirk)."""

    kinds: list[Any]


def _pairs_hook(pairs: list[tuple[str, Any]]) -> _Pairs:
    d = _Pairs(pairs)
    d.kinds = [v for k, v in pairs if k == "kind"]
    return d


def _work_quirk(body: bytes) -> bool:
    """Whether ``body`` is a ``work`` line written with two ``kind`` keys, as vak does.

    Told by the C kernel's grammar where it reads the keys as stored (``work_quirk_c``:
    ~0.5 us a line against ~12 us for Python's json with a pairs hook), else by the
    pairs hook (docs/audit.md, "Lines and the chain").
    """
    if _work_quirk_c is not None and (told := _work_quirk_c(body)) is not None:
        return told
    try:
        top = json.loads(body, object_pairs_hook=_pairs_hook)
    except (ValueError, RecursionError):
        return False
    if nested_deeper_than(body):  # as json fails on 3.11, on every Python
        return False
    kinds = getattr(top, "kinds", [])
    return len(kinds) == 2 and kinds[0] == "work" and isinstance(kinds[1], dict)


def parse_entry(body: bytes, line: int) -> tuple[Entry | None, bool, str]:
    """Parse one stored line (without its newline) into an :class:`Entry`.

    The per-line kernel (:mod:`pipeline.ledger.kernel`) validates the line and reads its
    envelope without building the payload (the entry is a :class:`LazyEntry`); a line it
    does not vouch for is read with orjson as a whole, which decides and says why. Either
    way the verdict, the envelope and the payload are the same (docs/audit.md).

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
    if _worth_it is _WORTH_IT_C and _entry_c is not None:
        # The C kernel: the steps below (worth_it, scan, the timestamp, SHA-256, the
        # entry) in one call; a receipt or a header read into what the audit reads of
        # it (docs/audit.md, "Receipts", "Headers"), else parse_entry_orjson's common
        # path; None where parse_entry_orjson must read the line and decide.
        entry = _entry_c(body, line)
        return (entry, False, "") if entry is not None else parse_entry_orjson(body, line)
    found = _scan(body) if _worth_it(body) else None
    if found is not None:
        ident, parent, kind, ts, prev, at_turn, view = found
        # valid_ts inlined: its shape, then the date's cached calendar check
        if (shape := _TS_MATCH(ts)) is not None and (_DAYS.get(shape[1]) or valid_ts(ts)):
            digest = _sha256(body).hexdigest()
            payload = _Payload(body, None, view)
            return _new_entry(LazyEntry, (line, ident, parent, kind, ts, prev, at_turn, digest,
                                          payload)), False, ""
    return parse_entry_orjson(body, line)


def parse_entry_orjson(body: bytes, line: int) -> tuple[Entry | None, bool, str]:
    """:func:`parse_entry` without the kernel: the whole line parsed by orjson (the
    reference the kernel is tested against, and its fallback)."""
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
        digest = _sha256(body).hexdigest()
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


def _recover_merged(body: bytes, line: int) -> tuple[list[tuple[Entry, bool]], int]:
    """Recover the complete entries of a torn line (vak's torn merge), and where the
    bytes before them end (0 when none are left over).

    The complete entry is the earliest suffix that parses. When the part before it is
    itself a complete entry, the crash cut only the newline between two appends
    (``{A}{B}``): both are recovered, so a lost newline does not cost an entry.
    """
    for probes, match in enumerate(ENTRY_START.finditer(body, 1)):
        if probes >= MAX_MERGE_PROBES:
            break
        entry, dup, _ = parse_entry(body[match.start():], line)
        if entry is not None:
            first, first_dup, _ = parse_entry(body[: match.start()], line)
            if first is not None and entry.prev_hash == first.digest:
                return [(first, first_dup), (entry, dup)], 0
            return [(entry, dup)], match.start()
    return [], 0


#: How every line vak writes starts (serde's field order, compact): a torn fragment, the
#: start of an append cut short, starts so too, or is a shorter piece of it.
_LINE_START = b'{"id":"'
_BOM = b"\xef\xbb\xbf"


def foreign_prefix(fragment: bytes) -> str | None:
    """Why the bytes before an entry recovered from inside a line cannot be a torn
    fragment vak left (``None`` when they can).

    vak's torn merge leaves the *start* of an append before the next one, so a fragment
    starts like every line vak writes. Anything else there (a byte order mark an editor
    added, text) was put there after the line was written: the stored bytes changed,
    which spec 2.1 calls ``damaged_entry``.
    """
    head = fragment[:len(_LINE_START)]
    if _LINE_START.startswith(head):
        return None
    what = ("a UTF-8 byte order mark" if fragment.startswith(_BOM)
            else f"{len(fragment):,} bytes that do not start like any line vak writes")
    return (f"{what} before the entry: the line was changed after it was written "
            "(no torn fragment); the entry after them recovered")


class _Roles(dict[str, Any]):
    """A dict that remembers every value of its ``role`` keys (duplicates included)."""

    roles: list[Any]


def _roles_hook(pairs: list[tuple[str, Any]]) -> _Roles:
    d = _Roles(pairs)
    d.roles = [v for k, v in pairs if k == "role"]
    return d


def duplicate_role(body: bytes, entry: Entry) -> Finding | None:
    """``duplicate_key`` when the ``message`` object of a message line holds two
    ``role`` keys of different values, else ``None``.

    vak writes one; JSON readers disagree on which of two wins (orjson, like Python's
    and JavaScript's, keeps the last; serde refuses the line), so the message's role,
    which decides whether it is a request or a turn, is in doubt. Read as the last.
    """
    try:
        top = json.loads(body, object_pairs_hook=_roles_hook)
    except (ValueError, RecursionError):
        return None
    if nested_deeper_than(body):  # as json fails on 3.11, on every Python
        return None
    roles = getattr(top.get("message") if isinstance(top, dict) else None, "roles", [])
    if len(roles) < 2 or all(r == roles[0] for r in roles):
        return None
    shown = ", ".join(r if r in ("user", "assistant") else "another value" for r in roles)
    return Finding(Code.DUPLICATE_KEY, entry.line, entry.id,
                   f'message has {len(roles)} "role" keys of different values ({shown}); '
                   "read as the last, as JSON readers mostly do")


#: A ``role`` key as vak writes it (compact), and the values it writes after it.
_ROLE_KEY = b'"role":'
_ROLE_VALUES = {"user": b'"user"', "assistant": b'"assistant"'}


def _role_in_doubt(body: bytes, entry: Entry) -> bool:
    """Whether a message line's first ``role`` key disagrees with the role read (the
    last one): only then is the line parsed again for duplicates (:func:`duplicate_role`).

    vak writes the message right after the envelope, ``role`` first, so the first
    ``"role":`` is a few hundred bytes in: one short search per message line, where
    counting the key over the whole line cost ~6% of the read.
    """
    payload: Any = tuple.__getitem__(entry, 8)
    if type(payload) is _Payload and payload.view is not None:
        # A kernel's view is only made of a message object without a repeated key
        # (both kernels defer, or give no view, otherwise): no second role.
        return False
    at = body.find(_ROLE_KEY)
    if at < 0:
        return False
    message = audit_view(entry).get("message")
    role = message.get("role") if type(message) is dict else None
    wanted = _ROLE_VALUES.get(role) if type(role) is str else None
    return wanted is None or not body.startswith(wanted, at + len(_ROLE_KEY))


@dataclass(slots=True)
class _BadRun:
    """Consecutive lines that are not valid entries, waiting for the next valid entry to
    classify them (they are always consecutive: any valid entry classifies the run
    before it). The first :data:`MAX_LISTED_BAD_LINES` are kept line by line; of the
    rest only the first and last, so a run costs O(1) memory however long it is
    (5 million blank lines are 11 findings, not 5 million)."""

    listed: list[tuple[int, str]] = field(default_factory=list)
    rest_first: int = 0  # the first line past the listed ones (0: none yet)
    rest_reason: str = ""
    last: int = 0
    last_reason: str = ""

    def add(self, line: int, reason: str) -> None:
        """Extend the run by the next physical line."""
        if len(self.listed) < MAX_LISTED_BAD_LINES:
            self.listed.append((line, reason))
        elif not self.rest_first:
            self.rest_first, self.rest_reason = line, reason
        self.last, self.last_reason = line, reason

    def findings(self, code: Code, until: int | None = None) -> Iterator[Finding]:
        """The run's findings up to line ``until`` (default: its last): one per listed
        line, then one for all the others, on the first of them, saying how many."""
        until = self.last if until is None else until
        for line, reason in self.listed:
            if line <= until:
                yield Finding(code, line, None, reason)
        first = self.rest_first
        if not first or first > until:
            return
        if first == until:
            yield Finding(code, first, None, self.rest_reason)
            return
        detail = (f"{until - first + 1:,} more consecutive lines ({first}-{until}) are not "
                  f"valid entries; line {first}: {self.rest_reason}")
        if until == self.last and self.last_reason != self.rest_reason:
            detail += f"; line {until}: {self.last_reason}"
        yield Finding(code, first, None, quote(detail, MAX_DETAIL_CHARS))


@dataclass(slots=True)
class LineStats:
    """Physical lines and bytes a :func:`read_ledger` call has consumed so far."""

    lines: int = 0
    bytes: int = 0


def read_ledger(
    lines: Iterable[bytes], stats: LineStats | None = None,
    run: Callable[[Iterator[bytes], int, str], tuple[int, int, str]] | None = None,
) -> Iterator[Entry | Finding]:
    """Stream a ledger's physical lines into entries and line/chain findings.

    Parameters
    ----------
    lines:
        The file's physical lines as bytes, each with its trailing ``b"\\n"`` except
        possibly the last (what iterating a binary file yields); a line the IO layer
        skipped as too long is an :class:`~pipeline.ledger.types.OversizeLine`.
    stats:
        Filled with the number of physical lines and bytes read, once the stream ends.
    run:
        Takes the common lines that follow a common line off the reader's hands (a
        :meth:`TreeIndex.runner <pipeline.ledger.tree.TreeIndex.runner>`, the audit's):
        called after that line's entry is yielded (or the entries of a line the general
        path read: a header), as ``run(lines, number, digest)``
        with the lines' iterator (one the C kernel's ``pushback`` made), the line's
        number and the entry's digest, it consumes the lines that follow while each is
        another common line of a kind other than a header, gives back the first it does
        not take, and answers how many it took, their bytes and the last digest. Those
        entries are never yielded. Ignored where the C kernel did not build.

    Yields
    ------
    Entry | Finding
        Valid entries in file order, interleaved with the findings of spec 2.1
        (``damaged_entry``, ``hash_mismatch``, ``torn_tail``, ``torn_write_recovered``,
        ``torn_merge``, ``unchained``, ``duplicate_kind_key``). A finding about a bad
        line is yielded once the next valid entry has classified it.
    """
    prev_digest: str | None = None
    pending: _BadRun | None = None  # bad lines waiting for the next valid entry
    number = nbytes = 0
    raw = b""
    # The C kernel's whole common line (a valid entry chained to the one before, a
    # message with no repeated role), where it reads the lines: None elsewhere, and the
    # loop below takes every line (docs/audit.md, "The per-line kernel").
    chained = _chained_c if _worth_it is _WORTH_IT_C else None
    if chained is None or _pushback_c is None:
        run = None
    it: Iterator[bytes] = (_pushback_c(lines) if run is not None and _pushback_c is not None
                           else iter(lines))
    for raw in it:
        number += 1
        nbytes += len(raw)
        if chained is not None and prev_digest is not None and pending is None:
            entry = chained(raw, number, prev_digest)
            if entry is not None:
                prev_digest = entry.digest
                yield entry
                if run is not None:
                    # The lines after it while they are common ones, in C (docs/audit.md).
                    taken, used, prev_digest = run(it, number, prev_digest)
                    number += taken
                    nbytes += used
                continue
        last_terminated = raw[-1:] == b"\n"
        body = raw[:-1] if last_terminated else raw
        if not body and type(raw) is not OversizeLine:
            # A blank line is not a JSON object (vak skips blank lines when it reads): a
            # bad line like any other, without the parse and quoted error of one, since a
            # file may hold millions of them.
            if pending is None:
                pending = _BadRun()
            pending.add(number, BLANK_LINE)
            continue
        entry, duplicate_kind, reason = parse_entry(body, number)
        if (entry is not None and not pending and not duplicate_kind
                and entry.prev_hash == prev_digest and prev_digest is not None):
            # The common case, a chained entry after a valid one, without the
            # general path's bookkeeping (this loop runs once per line).
            prev_digest = entry.digest
            if entry.kind == "message" and _role_in_doubt(body, entry):
                dup = duplicate_role(body, entry)
                if dup is not None:
                    yield dup
            yield entry
            continue
        if entry is not None:
            found, start = [(entry, duplicate_kind)], 0
        elif type(raw) is OversizeLine:
            # Never a valid entry (its bytes were not read): classified like any bad line.
            nbytes += raw.size - len(raw)
            if pending is None:
                pending = _BadRun()
            pending.add(number, raw.reason)
            continue
        else:
            found, start = _recover_merged(body, number)
            if not found:
                if pending is None:
                    pending = _BadRun()
                pending.add(number, reason)
                continue
            foreign = foreign_prefix(body[:start]) if start else None
            if foreign is not None:
                # Bytes vak never wrote before the entry (spec 2.1: stored bytes changed).
                yield Finding(Code.DAMAGED_ENTRY, number, found[-1][0].id, foreign)
            else:
                yield Finding(
                    Code.TORN_MERGE, number, found[-1][0].id,
                    "a torn fragment precedes a complete entry on this line; entry recovered"
                    if len(found) == 1 else
                    "two complete entries share this line (the newline between them was "
                    "lost); both recovered",
                )
        for entry, duplicate_kind in found:
            if entry.kind == "message" and len(found) == 1 and not start \
                    and _role_in_doubt(body, entry):
                dup = duplicate_role(body, entry)
                if dup is not None:
                    yield dup
            if duplicate_kind:
                yield Finding(
                    Code.DUPLICATE_KIND_KEY, number, entry.id,
                    "work entry written with two kind keys (vak quirk); event read from the second",
                )
            classified = pending is not None
            if pending is not None:
                # Sealed only when the successor *names* the previous valid entry: with no
                # prev_hash, or no previous valid entry (a bad line before the header),
                # nothing shows the bad line was a torn write, so it counts as damage.
                sealed = entry.prev_hash is not None and entry.prev_hash == prev_digest
                code = Code.TORN_WRITE_RECOVERED if sealed else Code.DAMAGED_ENTRY
                yield from pending.findings(code)
                pending = None
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
        if run is not None and prev_digest is not None:
            # The common lines after it in C too (a header's second line onwards).
            taken, used, prev_digest = run(it, number, prev_digest)
            number += taken
            nbytes += used
    if stats is not None:
        stats.lines, stats.bytes = number, nbytes
    if pending is not None:
        # Nothing valid follows: the last physical line is the torn tail; bad lines
        # before it cannot be classified by a successor, so they count as damaged.
        yield from pending.findings(Code.DAMAGED_ENTRY, pending.last - 1)
        yield Finding(Code.TORN_TAIL, pending.last, None,
                      _detail(f"last line unreadable: {pending.last_reason}"))
    elif number and raw[-1:] != b"\n":
        yield Finding(
            Code.TORN_TAIL, number, None,
            "last line has no newline: the append was cut short (the next append would merge)",
        )
