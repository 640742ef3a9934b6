"""Transcript formats of other agents (Claude Code, Codex CLI), read onto the vak
reader's model so that the audit, utilization and costs cover them too. Pure.

A file's format is told by its content (:func:`detect`), never by its path alone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from pipeline import plugins
from pipeline.errors import PluginError
from pipeline.formats.base import UNKNOWN, VAK, TranscriptFormat, sniffed
from pipeline.formats.claude_code import ClaudeCode
from pipeline.formats.codex import Codex

#: The adapters tried, in order, on a file that is not a vak ledger.
FORMATS: tuple[TranscriptFormat, ...] = (ClaudeCode(), Codex())
#: Every ``source`` value a row can have.
SOURCES: tuple[str, ...] = (VAK, *(f.name for f in FORMATS), UNKNOWN)


_log = logging.getLogger("vakpipe.plugins")


def format_check(obj: Any) -> str | None:
    """Why an installed format plug-in's object is not an adapter (``None``: it is)."""
    missing = [m for m in ("name", "sniff", "read") if not hasattr(obj, m)]
    return f"it has no {', '.join(missing)}" if missing else None


def format_adapter(obj: Any) -> TranscriptFormat:
    """A format plug-in's entry point as an adapter: the object itself, or what its class
    or function makes.

    Raises
    ------
    PluginError
        It is not an adapter (no ``name``, ``sniff`` or ``read``).
    """
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "sniff")):
        obj = obj()
    reason = format_check(obj)
    if reason is not None:
        raise PluginError(f"not a transcript format: {reason}")
    adapter: TranscriptFormat = obj
    return adapter


@functools.cache
def all_formats() -> tuple[TranscriptFormat, ...]:
    """The built-in adapters, then the installed plug-ins' (``vakpipe.transcript_formats``:
    an adapter, or a class that makes one), each tried in that order.

    A plug-in that does not load is left out with one warning line (logger
    ``vakpipe.plugins``): its files read as unknown, as before it was installed;
    ``vakpipe plugins`` names the error.
    """
    found = list(FORMATS)
    names = {f.name for f in FORMATS}
    for plugin in plugins.installed("formats"):
        if plugin.name in names:
            continue  # a built-in name always wins
        try:
            found.append(format_adapter(plugins.load("formats", plugin.name)))
        except Exception as err:  # a plug-in may raise anything: one line, never a crash
            _log.warning("vakpipe: plug-in %s:%s left out: %s", plugins.GROUPS["formats"],
                         plugin.name, " ".join(str(err).split())[:300])
    return tuple(found)


def detect(lines: Iterable[bytes]) -> tuple[TranscriptFormat | None, Iterator[bytes]]:
    """The adapter of a file by its first lines (``None``: a vak ledger; a file nobody
    claims gets :class:`~pipeline.formats.base.UnknownFormat`), and all its lines, none
    consumed. Plug-in formats (:func:`all_formats`) are tried after the built-in ones."""
    return sniffed(all_formats(), lines)


__all__ = ["FORMATS", "SOURCES", "UNKNOWN", "VAK", "TranscriptFormat", "all_formats", "detect",
           "format_adapter", "format_check"]
