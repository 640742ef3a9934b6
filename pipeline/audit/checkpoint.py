"""Checkpoints between audits (spec section 6). Pure.

A nightly run records, per session it verified, the verified byte length (up to the last
complete line), the SHA-256 of those bytes, the entry count, the head hash and the
object's ETag and size. The next run:

* skips an object whose ETag and size are unchanged, carrying its rows forward;
* re-reads any other object, hashing its first ``verified_bytes`` bytes on the way
  (:class:`PrefixHasher`): shorter than the checkpoint is ``history_truncated``, a prefix
  that no longer hashes the same (same length with another head, or edited then
  appended) is ``history_rewritten``;
* reports a checkpointed session that is no longer listed as ``session_missing``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from dataclasses import dataclass
from typing import Any

from pipeline.ledger.types import Code, Finding


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a run verified of one session."""

    session_path: str
    verified_bytes: int
    prefix_sha256: str
    entries: int
    head_hash: str | None
    etag: str | None
    size: int
    #: A segment ledger's :class:`~pipeline.ledger.segments.SegmentCheckpoint` as JSON
    #: (``None`` for a JSONL object, or a checkpoint taken before it existed).
    segments: str | None = None

    def as_row(self) -> dict[str, Any]:
        """The row of the ``checkpoints`` table."""
        return {f: getattr(self, f) for f in self.__slots__}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Checkpoint:
        """Read a row of the ``checkpoints`` table."""
        # ``segments`` may be absent from a table written before it existed.
        values: list[Any] = [row[f] if f != "segments" else row.get(f)
                             for f in cls.__slots__]
        return cls(*values)

    def reread(self) -> Checkpoint:
        """The same checkpoint without its ETag: the next run reads the object again.

        For a checkpoint kept without having verified the object's current content
        (it could not be read, or it is missing: if it comes back unchanged, its ETag
        would match and the rows carried forward would be the ``unreadable_object`` or
        ``session_missing`` ones), and for one whose run reported a history finding
        (carried forward, the finding would be repeated every night the object does not
        change, and vanish the night it grows).
        """
        return dataclasses.replace(self, etag=None)


class Change(enum.Enum):
    """How a listed object stands against its checkpoint, before reading it."""

    NEW = "new"  # no checkpoint
    UNCHANGED = "unchanged"  # same ETag and size: not read, rows carried forward
    CHANGED = "changed"  # anything else: read, its prefix checked


def classify(size: int, etag: str | None, previous: Checkpoint | None) -> Change:
    """Decide whether an object must be read.

    An object without an ETag (some filesystems) is always read: size alone cannot show
    that bytes were rewritten in place.
    """
    if previous is None:
        return Change.NEW
    if etag is not None and etag == previous.etag and size == previous.size:
        return Change.UNCHANGED
    return Change.CHANGED


class PrefixHasher:
    """Hashes a ledger's lines as they stream past, for its checkpoint and the check of
    the previous one.

    Only newline-terminated lines count as verified (a torn last line is not history
    yet: vak repairs it before appending). ``check_at`` is the previous checkpoint's
    ``verified_bytes``: the digest of exactly that many leading bytes is taken on the
    way, whatever the line boundaries of the new content.
    """

    __slots__ = ("_open", "_sha", "at_check", "check_at", "total", "verified")

    def __init__(self, check_at: int | None = None) -> None:
        self._sha = hashlib.sha256()
        # The line being read in pieces (one over --max-line-bytes, or the torn last):
        # the verified bytes and their digest move only once its newline comes.
        self._open: hashlib._Hash | None = None
        self.check_at = check_at
        # Nothing verified before (an empty object, or only a torn line): the empty prefix
        # is there even if no line ever comes.
        self.at_check: str | None = self._sha.hexdigest() if check_at == 0 else None
        self.verified = 0  # bytes of complete lines
        self.total = 0  # all bytes

    def update(self, line: bytes) -> None:
        """Account the next physical line (with its ``\\n`` unless it is the torn last),
        or the next piece of one: bytes without a newline are held as an open line until
        the piece that ends it."""
        end = self.total + len(line)
        if self.check_at is not None and self.at_check is None and end >= self.check_at:
            probe = (self._sha if self._open is None else self._open).copy()
            # Bytes between the last complete line and here belong to the open line.
            probe.update(line[: self.check_at - self.total])
            self.at_check = probe.hexdigest()
        self.total = end
        if self._open is None and line.endswith(b"\n"):
            self._sha.update(line)
            self.verified = end
            return
        if self._open is None:
            self._open = self._sha.copy()
        self._open.update(line)
        if line.endswith(b"\n"):
            self._sha, self._open = self._open, None
            self.verified = end

    @property
    def digest(self) -> str:
        """SHA-256 of the verified bytes."""
        return self._sha.hexdigest()

    def findings(self, previous: Checkpoint) -> list[Finding]:
        """``history_truncated`` / ``history_rewritten`` against ``previous``, if any."""
        if self.total < previous.verified_bytes:
            return [Finding(
                Code.HISTORY_TRUNCATED, None, None,
                f"{self.total:,} bytes, shorter than the {previous.verified_bytes:,} "
                "verified before",
            )]
        if self.at_check != previous.prefix_sha256:
            same = self.total == previous.size
            return [Finding(
                Code.HISTORY_REWRITTEN, None, None,
                ("same length as verified before, other content" if same else
                 f"the first {previous.verified_bytes:,} bytes verified before no longer "
                 "hash the same"),
            )]
        return []


def checkpoint_of(path: str, hasher: PrefixHasher, row: dict[str, Any],
                  segments: str | None = None) -> Checkpoint:
    """The new checkpoint of a session just audited (``row``: its integrity row;
    ``segments``: a segment ledger's own checkpoint, as JSON)."""
    return Checkpoint(path, hasher.verified, hasher.digest, int(row.get("entries") or 0),
                      row.get("head_hash"), row.get("etag"), int(row.get("bytes") or 0),
                      segments)


def missing_finding(previous: Checkpoint) -> Finding:
    """The ``session_missing`` finding of a checkpointed session no longer listed."""
    return Finding(Code.SESSION_MISSING, None, None,
                   f"verified before ({previous.entries:,} entries, "
                   f"{previous.verified_bytes:,} bytes); no longer in the archive")
