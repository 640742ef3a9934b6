"""Whether a report's input run is complete. Pure.

A run that could not read (or audit) some sessions says so in its manifest
(``"partial": true``, ``"unread_objects": N``, ``"sessions": M``). Every report made
from such a run (``vakpipe cost``, ``vakpipe regress --baseline-run``) says so too: one
console line, a banner in its HTML, ``partial`` and ``sessions_unread`` in its JSON
summary, and exit code 3 unless ``--allow-partial``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class InputRun:
    """A run a report reads, and how complete it is."""

    url: str
    run_id: str | None
    partial: bool
    sessions: int
    sessions_unread: int

    @classmethod
    def of(cls, url: str, manifest: dict[str, Any]) -> InputRun:
        """Read the completeness of the run whose manifest is ``manifest``.

        A manifest that says ``partial`` without a count still counts as partial (one
        session at least was not read).
        """
        unread = manifest.get("unread_objects")
        unread = unread if isinstance(unread, int) and unread >= 0 else 0
        partial = bool(manifest.get("partial")) or unread > 0
        sessions = manifest.get("sessions")
        return cls(url, manifest.get("run_id") if isinstance(manifest.get("run_id"), str)
                   else None, partial, sessions if isinstance(sessions, int) else 0,
                   max(unread, 1) if partial else 0)

    def line(self) -> str:
        """``input run X is partial: N of M sessions not read; figures are incomplete``."""
        total = f"{self.sessions:,}" if self.sessions else "?"
        return (f"input run {self.url} is partial: {self.sessions_unread:,} of {total} "
                "sessions not read; figures are incomplete")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (a summary's ``inputs``)."""
        return {"run": self.url, "run_id": self.run_id, "partial": self.partial,
                "sessions": self.sessions, "sessions_unread": self.sessions_unread}
