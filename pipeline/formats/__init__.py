"""Transcript formats of other agents (Claude Code, Codex CLI), read onto the vak
reader's model so that the audit, utilization and costs cover them too. Pure.

A file's format is told by its content (:func:`detect`), never by its path alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from pipeline.formats.base import UNKNOWN, VAK, TranscriptFormat, sniffed
from pipeline.formats.claude_code import ClaudeCode
from pipeline.formats.codex import Codex

#: The adapters tried, in order, on a file that is not a vak ledger.
FORMATS: tuple[TranscriptFormat, ...] = (ClaudeCode(), Codex())
#: Every ``source`` value a row can have.
SOURCES: tuple[str, ...] = (VAK, *(f.name for f in FORMATS), UNKNOWN)


def detect(lines: Iterable[bytes]) -> tuple[TranscriptFormat | None, Iterator[bytes]]:
    """The adapter of a file by its first lines (``None``: a vak ledger; a file nobody
    claims gets :class:`~pipeline.formats.base.UnknownFormat`), and all its lines, none
    consumed."""
    return sniffed(FORMATS, lines)


__all__ = ["FORMATS", "SOURCES", "UNKNOWN", "VAK", "TranscriptFormat", "detect"]
