"""Where sessions live in an archive (spec section 1, docs/formats.md). Pure.

``<root>/agents/<agent>/sessions/<cwd_hash>/<session_id>.jsonl`` (vak), and the
transcripts of other agents synced beside it, under any prefix:
``[…/]projects/<dir>/<session>.jsonl`` and
``[…/]projects/<dir>/<session>/subagents/agent-<id>.jsonl`` (Claude Code),
``[…/]sessions/YYYY/MM/DD/rollout-<time>-<session>.jsonl`` (Codex CLI). The path only
makes an object a candidate: its content decides how it is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
    h = _FNV_OFFSET
    for b in cwd.encode("utf-8", "surrogatepass"):
        h = ((h ^ b) * _FNV_PRIME) & _MASK64
    return f"{h:016x}"


@dataclass(frozen=True, slots=True, order=True)
class SessionKey:
    """A session object's place in the archive, parsed from its relative path."""

    path: str
    agent: str
    cwd_hash: str
    session_id: str
    #: The session file a subagent transcript belongs to (Claude Code), else ``None``.
    parent: str | None = None

    @property
    def subagent(self) -> str | None:
        """The subagent's id (``a881341`` of ``agent-a881341.jsonl``), else ``None``."""
        return self.session_id if self.parent is not None else None


CLAUDE_CODE = "claude-code"
CODEX = "codex"
#: The session id (a UUID) a Codex rollout's file name ends with.
_ROLLOUT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


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
    name = parts[-1]
    if not name.endswith(".jsonl") or len(name) <= len(".jsonl"):
        return None
    # Keys are data, never paths to follow: a dot segment or a control character
    # (NUL, newline) would let a hostile key point elsewhere on a local filesystem.
    for segment in parts:
        if segment in ("", ".", "..") or any(ord(c) < 0x20 or c == "\\" for c in segment):
            return None
    stem = name[: -len(".jsonl")]
    if len(parts) == 5 and parts[0] == "agents" and parts[2] == "sessions":
        return SessionKey(relative, parts[1], parts[3], stem)
    if len(parts) >= 3 and parts[-3] == "projects":
        return SessionKey(relative, CLAUDE_CODE, parts[-2], stem)
    if (len(parts) >= 5 and parts[-5] == "projects" and parts[-2] == "subagents"
            and stem.startswith("agent-") and len(stem) > len("agent-")):
        parent = "/".join([*parts[:-3], parts[-3] + ".jsonl"])
        return SessionKey(relative, CLAUDE_CODE, parts[-4], stem[len("agent-"):], parent)
    if len(parts) >= 5 and parts[-5] == "sessions" and stem.startswith("rollout-"):
        day = parts[-4:-1]
        if all(d.isdigit() and d.isascii() for d in day):
            found = _ROLLOUT_ID.search(stem)
            return SessionKey(relative, CODEX, "-".join(day), found.group(0) if found else stem)
    return None


def session_path(agent: str, cwd: str, session_id: str) -> str:
    """Relative path at which vak stores a session (the inverse of the parser)."""
    return f"agents/{agent}/sessions/{cwd_hash(cwd)}/{session_id}.jsonl"
