"""Where sessions live in an archive (spec section 1). Pure.

``<root>/agents/<agent>/sessions/<cwd_hash>/<session_id>.jsonl``
"""

from __future__ import annotations

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


def parse_session_path(relative: str) -> SessionKey | None:
    """Parse a path relative to the archive root, or ``None`` if it is not a session.

    Any single non-empty path segment is accepted for ``agent`` and ``cwd_hash`` (a
    directory that is not the FNV-1a of the header's ``cwd`` is reported as
    ``cwd_hash_mismatch``, not skipped), and any non-empty stem before ``.jsonl`` for the
    session id (a stem that is not ``session_id`` is ``session_id_mismatch``).
    """
    parts = relative.split("/")
    if len(parts) != 5 or parts[0] != "agents" or parts[2] != "sessions":
        return None
    agent, cwd_dir, name = parts[1], parts[3], parts[4]
    if not name.endswith(".jsonl") or len(name) <= len(".jsonl"):
        return None
    # Keys are data, never paths to follow: a dot segment or a control character
    # (NUL, newline) would let a hostile key point elsewhere on a local filesystem.
    for segment in (agent, cwd_dir, name):
        if segment in ("", ".", "..") or any(ord(c) < 0x20 or c == "\\" for c in segment):
            return None
    return SessionKey(relative, agent, cwd_dir, name[: -len(".jsonl")])


def session_path(agent: str, cwd: str, session_id: str) -> str:
    """Relative path at which vak stores a session (the inverse of the parser)."""
    return f"agents/{agent}/sessions/{cwd_hash(cwd)}/{session_id}.jsonl"
