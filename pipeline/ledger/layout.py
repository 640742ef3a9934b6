"""Where sessions live in an archive (spec section 1, docs/formats.md). Pure.

``<root>/agents/<agent>/sessions/<cwd_hash>/<session_id>.jsonl`` (vak), and the
transcripts of other agents synced beside it, under any prefix:
``[…/]projects/<dir>/<session>.jsonl`` and
``[…/]projects/<dir>/<session>/subagents/agent-<id>.jsonl`` (Claude Code),
``[…/]sessions/YYYY/MM/DD/rollout-<time>-<session>.jsonl`` (Codex CLI). The path only
makes an object a candidate: its content decides how it is read.

Any of them may be compressed: ``.jsonl.gz`` (gzip) or ``.jsonl.zst`` (zstd). A root that
holds none of these layouts is read flat (:func:`flat_session_key`): a single ledger
file, or a folder of ledgers and transcripts, each keyed from its content's format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import Any

from pipeline.ledger.segments import is_member

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def cwd_hash(cwd: str) -> str:
    """FNV-1a 64 over the UTF-8 bytes of ``cwd``, as 16 lowercase hex digits.

    Examples
    --------
    >>> cwd_hash("/home/me/proj")
    '2d872b17b24e117e'
    """
    # A byte at a time in Python (~2 us a path): every session's header asks, and a
    # fleet's sessions share a few directories, so short paths are remembered.
    return _cwd_hash_cached(cwd) if len(cwd) <= _CACHED_CWD_CHARS else _fnv1a_hex(cwd)


def _fnv1a_hex(cwd: str) -> str:
    h = _FNV_OFFSET
    for b in cwd.encode("utf-8", "surrogatepass"):
        h = ((h ^ b) * _FNV_PRIME) & _MASK64
    return f"{h:016x}"


#: Paths up to this long are remembered (at most 4,096 of them: a bounded few MB).
_CACHED_CWD_CHARS = 512
_cwd_hash_cached = lru_cache(maxsize=4096)(_fnv1a_hex)


@dataclass(frozen=True, slots=True, order=True)
class SessionKey:
    """A session object's place in the archive, parsed from its relative path."""

    path: str
    agent: str
    cwd_hash: str
    session_id: str
    #: The session file a subagent transcript belongs to (Claude Code), else ``None``.
    parent: str | None = None
    #: A subagent transcript whose parent file the listing does not hold (set at
    #: enumeration, which sees the whole listing; the audit reports it).
    parent_missing: bool = False
    #: How the ledger is stored: ``jsonl`` (one object, the path's) or ``segments`` (a
    #: directory of vak's record segments, the path's; docs/segments.md).
    storage: str = "jsonl"

    @property
    def compression(self) -> str | None:
        """``gzip`` or ``zstd`` for a compressed ledger (by its name), else ``None``."""
        return compression_of(self.path)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by the thousand in every run (each task's batch goes to its worker):
        # a slots dataclass's default state looks up fields() on every object, which
        # cost the runner ~0.05 s of CPU per 5,000 sessions.
        return SessionKey, _KEY_FIELDS(self)

    @property
    def subagent(self) -> str | None:
        """The subagent's id (``a881341`` of ``agent-a881341.jsonl``), else ``None``."""
        return self.session_id if self.parent is not None else None


#: Every field of a :class:`SessionKey`, in the constructor's order (its slots').
_KEY_FIELDS = attrgetter(*SessionKey.__slots__)

CLAUDE_CODE = "claude-code"
CODEX = "codex"
#: The agent of a vak ledger read flat whose header names none.
VAK_AGENT = "vak"
#: Ledger file suffixes: plain, and compressed as fsspec names the codec.
SUFFIXES: dict[str, str | None] = {".jsonl": None, ".jsonl.gz": "gzip", ".jsonl.zst": "zstd"}
#: The layouts an archive root may hold, as an error message lists them.
LAYOUTS = ("agents/<agent>/sessions/<cwd hash>/<session>.jsonl (vak), "
           "agents/<agent>/sessions/<cwd hash>/<session>/seg-*.log|.sealed (vak's record "
           "segments), [.../]projects/<dir>/<session>.jsonl (Claude Code), "
           "[.../]sessions/YYYY/MM/DD/rollout-*.jsonl (Codex), or a single ledger file or a "
           "flat folder of them (.jsonl, .jsonl.gz, .jsonl.zst)")
#: The session id (a UUID) a Codex rollout's file name ends with.
_ROLLOUT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


#: What no segment of a session's key may hold: a control character or a backslash.
_UNSAFE_CHAR = re.compile(r"[\x00-\x1f\\]")


def _unsafe(relative: str, parts: list[str]) -> bool:
    """Whether a key (``relative``, split into ``parts`` at "/") holds an empty or dot
    segment or a character no key may hold. Keys are data, never paths to follow: such
    a segment would let a hostile key point elsewhere on a local filesystem. One search
    of the whole key (no segment holds a "/"): it runs once per listed object."""
    return _UNSAFE_CHAR.search(relative) is not None or any(
        segment in ("", ".", "..") for segment in parts)


def parse_session_path(relative: str) -> SessionKey | None:
    """Parse a path relative to the archive root, or ``None`` if it is not a session.

    Any single non-empty path segment is accepted for ``agent`` and ``cwd_hash`` (a
    directory that is not the FNV-1a of the header's ``cwd`` is reported as
    ``cwd_hash_mismatch``, not skipped), and any non-empty stem before ``.jsonl`` for the
    session id (a stem that is not ``session_id`` is ``session_id_mismatch``). Claude
    Code and Codex paths (module docstring) give ``agent`` ``claude-code`` or ``codex``,
    the project directory or the day as ``cwd_hash``.
    """
    parts = relative.split("/")
    stem = ledger_stem(parts[-1])
    if stem is None:
        return None
    if _unsafe(relative, parts):
        return None
    if len(parts) == 5 and parts[0] == "agents" and parts[2] == "sessions":
        return SessionKey(relative, parts[1], parts[3], stem)
    if len(parts) >= 3 and parts[-3] == "projects":
        return SessionKey(relative, CLAUDE_CODE, parts[-2], stem)
    if (len(parts) >= 5 and parts[-5] == "projects" and parts[-2] == "subagents"
            and stem.startswith("agent-") and len(stem) > len("agent-")):
        # The parent transcript is stored as its subagents are (compressed or not).
        suffix = parts[-1][len(stem):]
        parent = "/".join([*parts[:-3], parts[-3] + suffix])
        return SessionKey(relative, CLAUDE_CODE, parts[-4], stem[len("agent-"):], parent)
    if len(parts) >= 5 and parts[-5] == "sessions" and stem.startswith("rollout-"):
        day = parts[-4:-1]
        if all(d.isdigit() and d.isascii() for d in day):
            found = _ROLLOUT_ID.search(stem)
            return SessionKey(relative, CODEX, "-".join(day), found.group(0) if found else stem)
    return None


JSONL = "jsonl"
SEGMENTS = "segments"


def segment_member(relative: str) -> SessionKey | None:
    """The key of the segment ledger a file belongs to, or ``None``.

    ``agents/<agent>/sessions/<cwd hash>/<session id>/<member>`` where the member is a
    ``seg-N.log``/``.sealed``/``.sealing``, ``seals.log``, ``KEY`` or ``LOCK``
    (:func:`~pipeline.ledger.segments.is_member`); the key's path is the directory's.
    Whether the directory is a ledger (it holds a segment or ``seals.log``) is the
    listing's to say, which sees all its files.
    """
    parts = relative.split("/")
    if len(parts) != 6 or parts[0] != "agents" or parts[2] != "sessions" \
            or not is_member(parts[5]):
        return None
    if _unsafe(relative, parts):
        return None
    return SessionKey("/".join(parts[:5]), parts[1], parts[3], parts[4], storage=SEGMENTS)


def ledger_stem(name: str) -> str | None:
    """The stem of a ledger file name (``x`` of ``x.jsonl``, ``x.jsonl.gz``,
    ``x.jsonl.zst``), else ``None``."""
    for suffix in SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


def compression_of(path: str) -> str | None:
    """The codec of a ledger path by its suffix (``gzip``, ``zstd``), else ``None``."""
    for suffix, codec in SUFFIXES.items():
        if codec is not None and path.endswith(suffix):
            return codec
    return None


#: A Codex rollout's day in its file name (``rollout-2025-10-01T12-00-00-<uuid>``).
_ROLLOUT_DAY = re.compile(r"rollout-(\d{4}-\d{2}-\d{2})T")


def flat_session_key(relative: str, folder: str, source: str,
                     header: dict[str, object] | None = None) -> SessionKey | None:
    """The key of a ledger read flat (a single file given as the root, or a file of a
    folder in none of the layouts), from its content's format (docs/formats.md).

    Parameters
    ----------
    relative:
        The file's path relative to the root (its name; for a single file, its name).
    folder:
        The name of the folder holding the file (for Claude Code's project directory).
    source:
        ``vak``, ``claude-code`` or ``codex``: what the formats package sniffed.
    header:
        A vak ledger's first line, parsed (its ``agent`` and ``cwd``), if it is a header.

    Returns
    -------
    SessionKey or None
        ``agent``, ``cwd_hash`` and ``session_id`` as the layout would give them: a vak
        ledger's agent (``vak`` unless its header names one) and the FNV-1a of its
        header's ``cwd``; Claude Code's folder name; a Codex rollout's day and UUID.
        ``None`` when the name is no plain ledger name.
    """
    name = relative.rsplit("/", 1)[-1]
    stem = ledger_stem(name)
    if stem is None or any(ord(c) < 0x20 or c == "\\" for c in relative) \
            or any(p in ("", ".", "..") for p in relative.split("/")):
        return None
    if source == CODEX:
        found = _ROLLOUT_ID.search(stem)
        day = _ROLLOUT_DAY.match(stem)
        return SessionKey(relative, CODEX, day.group(1) if day else "-",
                          found.group(0) if found else stem)
    if source == CLAUDE_CODE:
        return SessionKey(relative, CLAUDE_CODE, folder or "-", stem)
    head = header or {}
    agent = head.get("agent")
    cwd = head.get("cwd")
    return SessionKey(relative, agent if isinstance(agent, str) and agent else VAK_AGENT,
                      cwd_hash(cwd) if isinstance(cwd, str) else "-", stem)


def session_path(agent: str, cwd: str, session_id: str) -> str:
    """Relative path at which vak stores a session (the inverse of the parser)."""
    return f"agents/{agent}/sessions/{cwd_hash(cwd)}/{session_id}.jsonl"
