"""What every transcript format shares: the adapter protocol, detection and the line
loop. Pure: no IO imports.

Other agents' transcripts are read onto the model the vak reader produces: a stream of
:class:`~pipeline.reader.Entry` and :class:`~pipeline.types.Finding`, which
:func:`pipeline.audit.audit_session` turns into the same rows as a vak ledger's. The
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

import hashlib
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import Any, Protocol

import orjson

from pipeline.reader import MAX_DETAIL_CHARS, Entry, LineStats
from pipeline.redact import bounded, redact
from pipeline.types import Code, Finding, OversizeLine, token_count

#: The ``source`` of a vak ledger.
VAK = "vak"
#: Id of the synthetic header entry a transcript without a header is rooted at.
ROOT_ID = "(transcript)"
#: Lines looked at to tell a file's format (the first that parses decides).
SNIFF_LINES = 16


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
        ``links`` for sessions it started) as the lines are read."""


def root_entry() -> Entry:
    """The synthetic header every root of a transcript hangs from."""
    return Entry(0, ROOT_ID, None, "header", "", None, None, "", {})


def sniffed(formats: Iterable[TranscriptFormat],
            lines: Iterable[bytes]) -> tuple[TranscriptFormat | None, Iterator[bytes]]:
    """The format of a file by its content, and its lines (none consumed).

    The first of the file's first :data:`SNIFF_LINES` lines that parses as a JSON object
    decides: a vak envelope (``id`` and ``kind``) or no adapter claiming it gives
    ``None`` (read as a vak ledger, whose reader reports whatever is wrong).
    """
    it = iter(lines)
    head = list(islice(it, SNIFF_LINES))
    found: TranscriptFormat | None = None
    for raw in head:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if type(obj) is not dict:
            continue
        if "kind" not in obj or "id" not in obj:
            found = next((f for f in formats if f.sniff(obj)), None)
        break
    return found, chain(head, it)


def _detail(text: str) -> str:
    return bounded(redact(text), MAX_DETAIL_CHARS)


def json_lines(lines: Iterable[bytes],
               stats: LineStats) -> Iterator[tuple[int, str, dict[str, Any]] | Finding]:
    """Parse a transcript's physical lines: ``(line, sha256, object)`` per JSON object
    line, a finding per line that is not one.

    A bad line is ``damaged_entry``; the last line is ``torn_tail`` when it is bad or
    has no newline (an append cut short), as for vak ledgers. Blank lines are skipped.
    ``stats`` gets the lines and bytes read.
    """
    number = nbytes = 0
    last_terminated = True
    bad: tuple[int, str] | None = None  # the newest bad line: a torn tail if nothing follows
    for number, raw in enumerate(lines, 1):
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
        if not body.strip():
            continue
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            bad = (number, _detail(f"not valid JSON: {err}"))
            continue
        if type(obj) is not dict:
            bad = (number, f"not a JSON object but {type(obj).__name__}")
            continue
        yield number, hashlib.sha256(body).hexdigest(), obj
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
    """A token count (:func:`~pipeline.types.token_count`), else 0."""
    return token_count(value) or 0
