"""What every transcript format shares: the adapter protocol, detection and the line
loop. Pure: no IO imports.

Other agents' transcripts are read onto the model the vak reader produces: a stream of
:class:`~pipeline.ledger.reader.Entry` and :class:`~pipeline.ledger.types.Finding`, which
:func:`pipeline.audit.session.audit_session` turns into the same rows as a vak ledger's. The
mapping (docs/formats.md):

* every line with an id becomes an entry; lines without one (Claude Code's file
  snapshots and queue operations) are counted as lines and nothing else;
* these formats have no header line: the adapter yields a synthetic ``header`` entry
  (line 0, id :data:`ROOT_ID`) first, and every root of the transcript hangs from it;
* model requests are assistant ``message`` entries whose ``meta`` holds ``usage`` (in
  vak's, that is Anthropic's, token fields), ``model`` and a ``request_key`` that names
  the provider request; turns start at user ``message`` entries with text;
* compaction events are ``compaction`` entries; everything else is ``activity``.

No hash chain exists in these formats: the findings are the tree's, torn and damaged
lines, and duplicates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice
from typing import Any, Protocol

import orjson

from pipeline.ledger.kernel import pushback_c, valid_c
from pipeline.ledger.reader import ENTRY_START, MAX_DETAIL_CHARS, Entry, LineStats
from pipeline.ledger.redact import quote, redact
from pipeline.ledger.types import Code, Finding, OversizeLine, token_count

#: The ``source`` of a vak ledger.
VAK = "vak"
#: Id of the synthetic header entry a transcript without a header is rooted at.
ROOT_ID = "(transcript)"
#: Lines looked at to tell a file's format: the first of them that a format claims
#: decides. Claude Code opens files with metadata lines (file-history snapshots, titles,
#: modes) that carry no tree ids; 20 lines leave room for a few of them.
SNIFF_LINES = 20
#: The ``source`` of a file no adapter recognises and that is not a vak ledger.
UNKNOWN = "unknown"
#: The fields of a vak entry's envelope; a line with two of them is a vak entry (a
#: damaged one still has most of its envelope).
_VAK_ENVELOPE = frozenset({"id", "parent_id", "ts", "kind", "hash", "prev_hash"})


class TranscriptFormat(Protocol):
    """An adapter that reads one agent's transcript format as vak entries."""

    #: The ``source`` column's value for rows read by this adapter.
    name: str

    def sniff(self, obj: dict[str, Any]) -> bool:
        """Whether a parsed line (one of a file's first) is written in this format."""

    def read(self, lines: Iterable[bytes], stats: LineStats,
             header: dict[str, Any]) -> Iterator[Entry | Finding]:
        """Stream a file's physical lines as entries and findings, the synthetic header
        first; fill ``header`` (session_id, cwd, model, provider, app_version, and
        ``links`` for sessions it started) as the lines are read. An adapter that
        leaves its entries' digests empty sets ``header["head_hash"]`` (the head
        entry's SHA-256) once the file is read; else the last entry's digest is used."""


def root_entry() -> Entry:
    """The synthetic header every root of a transcript hangs from."""
    return Entry(0, ROOT_ID, None, "header", "", None, None, "", {})


def is_vak_entry(obj: dict[str, Any]) -> bool:
    """Whether a parsed line is a vak entry: two fields of vak's envelope or more."""
    return len(_VAK_ENVELOPE.intersection(obj)) >= 2


def _vak_line(raw: bytes) -> bool:
    """:func:`is_vak_entry` of a line as vak writes it, told without parsing it: it
    starts as vak starts every entry (``ENTRY_START``: ``id``, ``parent_id``, ``ts``) and
    the C kernel's grammar takes the whole line as one JSON value (the ``{`` makes it an
    object). ``False`` leaves the line to ``orjson``, so the answer is always the parsed
    line's: a vak header (~4 KB on the benchmark fleet) is then read by the reader alone
    (by its kernel, without orjson: docs/audit.md, "Headers"), not parsed twice."""
    if valid_c is None or ENTRY_START.match(raw) is None:
        return False
    return valid_c(raw[:-1] if raw[-1:] == b"\n" else raw)


class UnknownFormat:
    """A file nobody claims: its lines are counted, nothing in them is read as entries,
    and one ``unknown_format`` finding says so (never a damaged line per line)."""

    name = UNKNOWN

    def sniff(self, obj: dict[str, Any]) -> bool:
        """Claims nothing: it is chosen when nothing else is."""
        return False

    def read(self, lines: Iterable[bytes], stats: LineStats,
             header: dict[str, Any]) -> Iterator[Entry | Finding]:
        """The synthetic root, then one finding once every line has been counted."""
        header["links"] = []
        yield root_entry()
        for _ in json_lines(lines, stats):
            pass  # counted (lines, bytes); what they hold is no format we read
        yield Finding(Code.UNKNOWN_FORMAT, None, None,
                      f"none of its first {SNIFF_LINES} lines is a vak entry or a line of "
                      "a transcript format vakpipe reads (Claude Code, Codex): not audited")


def sniffed(formats: Iterable[TranscriptFormat],
            lines: Iterable[bytes]) -> tuple[TranscriptFormat | None, Iterator[bytes]]:
    """The format of a file by its content, and its lines (none consumed).

    Of the file's first :data:`SNIFF_LINES` lines, the first that a format claims
    decides: a vak entry (:func:`is_vak_entry`) gives ``None`` (a vak ledger), else the
    first adapter whose ``sniff`` accepts the line. Lines nobody claims (another agent's
    metadata, a line type no adapter knows) are passed over. When none of them is
    claimed: a file with a JSON object among them is :class:`UnknownFormat`; one without
    (empty, or every line broken) is read as a vak ledger, whose reader reports what is
    wrong with it.
    """
    formats = tuple(formats)
    it = iter(lines)
    head = list(islice(it, SNIFF_LINES))
    objects = False
    found: TranscriptFormat | None = None
    for raw in head:
        if _vak_line(raw):
            return None, chain(head, it)
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if type(obj) is not dict:
            continue
        objects = True
        if is_vak_entry(obj):
            return None, chain(head, it)
        found = next((f for f in formats if f.sniff(obj)), None)
        if found is not None:
            return found, chain(head, it)
    return (UnknownFormat() if objects else None), chain(head, it)


def _detail(text: str) -> str:
    return quote(redact(text), MAX_DETAIL_CHARS)


#: An adapter's reading of the lines after a line (:func:`json_lines`' ``run``).
LineRun = Callable[[Iterator[bytes], int], tuple[int, int]]


class Scanned(dict[str, Any]):
    """What an adapter's scan read of a valid line: only the fields it needs, heavy
    values cut down (its payload is parsed from the line's bytes when a stage asks)."""

    __slots__ = ()


def json_lines(lines: Iterable[bytes], stats: LineStats,
               scan: Callable[[bytes], Scanned | None] | None = None,
               min_bytes: int = 0, run: LineRun | None = None,
               ) -> Iterator[tuple[int, bytes, dict[str, Any]] | Finding]:
    """Parse a transcript's physical lines: ``(line, stored bytes, object)`` per JSON
    object line (the bytes without the newline: an adapter hashes those it needs), a
    finding per line that is not one.

    A bad line is ``damaged_entry``; the last line is ``torn_tail`` when it is bad or
    has no newline (an append cut short), as for vak ledgers. Blank lines are skipped.
    ``stats`` gets the lines and bytes read.

    ``scan``, when given, is tried first on lines of ``min_bytes`` or more: a
    :class:`Scanned` object is the line's (valid, read without orjson), ``None`` leaves
    the line to orjson, which decides and says why a bad line is bad. A scan only
    ever accepts lines orjson accepts (docs/formats.md).

    ``run``, when given (and the C kernel built), is called after each object line with
    a newline as ``run(lines, number)``: it may take the lines that follow off this
    loop, valid object lines with their newline all, which the adapter reads itself
    (:func:`pipeline.formats.claude_code.activity_run`), and answers how many it took and
    their bytes; those lines are counted here, never yielded.
    """
    number = nbytes = 0
    last_terminated = True
    bad: tuple[int, str] | None = None  # the newest bad line: a torn tail if nothing follows
    # With a run, the lines come through the kernel's pushback iterator, to which the
    # run gives back the first line it does not take.
    it = iter(lines)
    if run is not None and pushback_c is not None:
        it = pushback_c(it)
    else:
        run = None
    for raw in it:
        number += 1
        nbytes += len(raw)
        last_terminated = raw[-1:] == b"\n"
        if bad is not None:
            yield Finding(Code.DAMAGED_ENTRY, bad[0], None, bad[1])
            bad = None
        if type(raw) is OversizeLine:
            nbytes += raw.size - len(raw)
            bad = (number, raw.reason)
            continue
        body = raw[:-1] if last_terminated else raw
        # A line that opens an object is not blank: only others pay for a stripped copy.
        if body[:1] != b"{" and not body.strip():
            continue
        found = scan(body) if scan is not None and len(body) >= min_bytes else None
        if found is None:
            try:
                found = orjson.loads(body)
            except orjson.JSONDecodeError as err:
                bad = (number, _detail(f"not valid JSON: {err}"))
                continue
            if type(found) is not dict:
                bad = (number, f"not a JSON object but {type(found).__name__}")
                continue
        yield number, body, found
        if run is not None and last_terminated:
            taken, used = run(it, number)
            number += taken
            nbytes += used
    stats.lines, stats.bytes = number, nbytes
    if bad is not None:
        yield Finding(Code.TORN_TAIL, bad[0], None, _detail(f"last line unreadable: {bad[1]}"))
    elif number and not last_terminated:
        yield Finding(Code.TORN_TAIL, number, None,
                      "last line has no newline: the append was cut short")


def text(value: Any) -> str | None:
    """``value`` if it is a non-empty string, else ``None``."""
    return value if type(value) is str and value else None


def count(value: Any) -> int:
    """A token count (:func:`~pipeline.ledger.types.token_count`), else 0."""
    return token_count(value) or 0
