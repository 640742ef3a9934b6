"""Reading vak's record-segment ledger directories through fsspec (docs/segments.md).

The pure verification and projection are :mod:`pipeline.ledger.segments`; this module
lists one ledger directory and hands its members' bytes over, one file at a time. It
never writes into the directory, and on a local filesystem never follows a symbolic link
in it (a linked member is left out, as if absent: what it names may lie anywhere).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pipeline.ledger.keys import KeyProvider
from pipeline.ledger.segments import (
    SegmentCheckpoint,
    SegmentLines,
    is_member,
    members_read,
    read_segment_ledger,
)
from pipeline.ledger.types import OversizeLine


def directory_version(members: list[tuple[str, dict[str, Any]]],
                      version: Callable[[dict[str, Any]], str | None]) -> str:
    """One version token for a ledger directory: a digest of its members' names, sizes
    and versions (any member added, removed or rewritten changes it)."""
    h = hashlib.sha256()
    for name, info in sorted(members, key=lambda m: m[0]):
        h.update(f"{name}\0{info.get('size')}\0{version(info)}\n".encode("utf-8",
                                                                         "surrogatepass"))
    return "segments:" + h.hexdigest()[:32]


@dataclass(frozen=True)
class ListedLedger:
    """A ledger directory as listed for reading (:func:`list_ledger`): its members'
    names, each one's size and version token, and the bytes of those already fetched
    (:func:`fetch_ledger`)."""

    names: list[str]
    members: dict[str, tuple[int, str | None]]
    fetched: dict[str, bytes] = field(default_factory=dict)


def list_ledger(fs: Any, path: str, *, local: bool,
                version: Callable[[dict[str, Any]], str | None] | None = None
                ) -> ListedLedger:
    """The members of the ledger directory ``path`` (on a local filesystem, a member that
    is a symbolic link is left out); ``version`` gives a member's version token from its
    listing (none without it)."""
    names: list[str] = []
    members: dict[str, tuple[int, str | None]] = {}
    for info in fs.ls(path, detail=True):
        name = posixpath.basename(str(info.get("name", "")).rstrip("/"))
        if info.get("type", "file") != "file" or not is_member(name):
            continue
        if local and os.path.islink(posixpath.join(path, name)):
            continue
        names.append(name)
        members[name] = (int(info.get("size") or 0),
                         version(info) if version is not None else None)
    return ListedLedger(names, members)


@dataclass(frozen=True)
class MemberReads:
    """How the members of a ledger on an object store are fetched: up to ``members`` of
    those about to be read side by side (one request each, in one call), each of at
    most ``max_bytes`` (a larger one is fetched alone: its transfer outweighs its round
    trip)."""

    members: int
    max_bytes: int


class _Members:
    """``read(name)`` for :func:`~pipeline.ledger.segments.read_segment_ledger`: a
    member's bytes. On an object store (``reads``), asking for a member not fetched yet
    fetches it together with the next members the reader will ask for
    (:func:`~pipeline.ledger.segments.members_read`), side by side: a ledger costs a
    round trip or two, not one per member. A member that could not be fetched so is
    read alone when asked for (its error, if any, raised then)."""

    def __init__(self, fs: Any, path: str, listed: ListedLedger, *, local: bool,
                 reads: MemberReads | None, skipped: SegmentCheckpoint | None) -> None:
        self._fs, self._path, self._local = fs, path, local
        #: The members' bytes fetched and not yet asked for.
        self.fetched = dict(listed.fetched)
        self._sizes = {name: size for name, (size, _) in listed.members.items()}
        self._reads = reads
        # ``skipped``: a keyless night's checkpoint, whose verified segments go unread.
        self._order = (members_read(listed.names, listed.members, skipped)
                       if reads is not None else [])
        self._position = {name: i for i, name in enumerate(self._order)}
        self._next = 0  # the first of _order not fetched yet
        for name in self.fetched:
            self._next = max(self._next, self._position.get(name, -1) + 1)

    def __call__(self, name: str) -> bytes:
        data = self.fetched.pop(name, None)
        if data is None and self._position.get(name, -1) >= self._next:
            self.fetch(self._position[name])
            data = self.fetched.pop(name, None)
        return data if data is not None else self._read_one(name)

    def fetch(self, start: int = 0, least: int = 2) -> None:
        """Fetch the members from ``_order[start]`` on, as many as :class:`MemberReads`
        lets go side by side, when they are at least ``least``."""
        assert self._reads is not None
        group: list[str] = []
        for name in self._order[start:start + self._reads.members]:
            if group and self._sizes.get(name, 0) > self._reads.max_bytes:
                break
            group.append(name)
        self._next = start + len(group)
        if len(group) < least:
            return
        got = self._fs.cat_ranges([posixpath.join(self._path, name) for name in group],
                                  None, None, on_error="return")
        for name, data in zip(group, got, strict=True):
            if isinstance(data, bytes):  # else the error a read alone raises again
                self.fetched[name] = data

    def _read_one(self, name: str) -> bytes:
        full = posixpath.join(self._path, name)
        if self._local:
            # O_NOFOLLOW: a member swapped for a link after the listing is not followed.
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                return f.read()
        return bytes(self._fs.cat_file(full))


def fetch_ledger(fs: Any, path: str, reads: MemberReads, keys: KeyProvider | None, *,
                 previous: SegmentCheckpoint | None = None,
                 version: Callable[[dict[str, Any]], str | None] | None = None
                 ) -> ListedLedger:
    """List the ledger directory ``path`` on an object store and fetch the first members
    its reading will ask for (:class:`MemberReads`), ahead of it
    (:class:`~pipeline.io.storage.ReadAhead`); ``keys`` and ``previous`` as for
    :func:`segment_lines`."""
    listed = list_ledger(fs, path, local=False, version=version)
    members = _Members(fs, path, listed, local=False, reads=reads,
                       skipped=previous if keys is None else None)
    members.fetch(least=1)
    return dataclasses.replace(listed, fetched=members.fetched)


def segment_lines(fs: Any, path: str, keys: KeyProvider | None, *, local: bool,
                  max_line_bytes: int, tap: Callable[[bytes], object] | None = None,
                  previous: SegmentCheckpoint | None = None,
                  version: Callable[[dict[str, Any]], str | None] | None = None,
                  reads: MemberReads | None = None, listed: ListedLedger | None = None,
                  ) -> SegmentLines:
    """The projection lines of the ledger directory ``path`` (as
    :func:`~pipeline.io.storage.open_lines` yields a JSONL object's), as
    :class:`~pipeline.ledger.segments.SegmentLines` (whose report the audit reads).

    A projection line longer than ``max_line_bytes`` is handed on as an
    :class:`~pipeline.ledger.types.OversizeLine`, as a JSONL line would be; ``tap`` sees
    every line. ``previous`` (a nightly's checkpoint of the ledger) and ``version`` (the
    version token of a member's listing) let unchanged sealed segments go unread
    (:func:`~pipeline.ledger.segments.read_segment_ledger`). ``reads`` (on an object
    store) fetches the members side by side (:class:`MemberReads`); ``listed``, the directory
    as :func:`fetch_ledger` listed it ahead, is read instead of listing it again.

    Raises
    ------
    OSError and the storage's errors
        The directory or a member cannot be listed or read (left to the caller, which
        reports the session unreadable).
    """
    if listed is None:
        listed = list_ledger(fs, path, local=local, version=version)
    read = _Members(fs, path, listed, local=local, reads=reads,
                    skipped=previous if keys is None else None)

    def guard(source: Iterator[bytes]) -> Iterator[bytes]:
        for line in source:
            if tap is not None:
                tap(line)
            if len(line) - 1 > max_line_bytes:
                yield OversizeLine(len(line), max_line_bytes, terminated=True)
            else:
                yield line

    return read_segment_ledger(listed.names, read, keys, previous=previous,
                               members=listed.members if version is not None else None
                               ).map(guard)
