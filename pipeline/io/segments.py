"""Reading vak's record-segment ledger directories through fsspec (docs/segments.md).

The pure verification and projection are :mod:`pipeline.ledger.segments`; this module
lists one ledger directory and hands its members' bytes over, one file at a time. It
never writes into the directory, and on a local filesystem never follows a symbolic link
in it (a linked member is left out, as if absent: what it names may lie anywhere).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.errors import UsageError
from pipeline.ledger.keys import (
    KeyProvider,
    StaticKeys,
    keys_from_json,
    open_key_file,
    vak_scope_keys,
)
from pipeline.ledger.segments import (
    SegmentCheckpoint,
    SegmentLines,
    is_member,
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


def segment_lines(fs: Any, path: str, keys: KeyProvider | None, *, local: bool,
                  max_line_bytes: int, tap: Callable[[bytes], object] | None = None,
                  previous: SegmentCheckpoint | None = None,
                  version: Callable[[dict[str, Any]], str | None] | None = None
                  ) -> SegmentLines:
    """The projection lines of the ledger directory ``path`` (as
    :func:`~pipeline.io.storage.open_lines` yields a JSONL object's), as
    :class:`~pipeline.ledger.segments.SegmentLines` (whose report the audit reads).

    A projection line longer than ``max_line_bytes`` is handed on as an
    :class:`~pipeline.ledger.types.OversizeLine`, as a JSONL line would be; ``tap`` sees
    every line. ``previous`` (a nightly's checkpoint of the ledger) and ``version`` (the
    version token of a member's listing) let unchanged sealed segments go unread
    (:func:`~pipeline.ledger.segments.read_segment_ledger`).

    Raises
    ------
    OSError and the storage's errors
        The directory or a member cannot be listed or read (left to the caller, which
        reports the session unreadable).
    """
    names: list[str] = []
    members: dict[str, tuple[int, str | None]] = {}
    for info in fs.ls(path, detail=True):
        name = posixpath.basename(str(info.get("name", "")).rstrip("/"))
        if info.get("type", "file") != "file" or not is_member(name):
            continue
        if local and os.path.islink(posixpath.join(path, name)):
            continue
        names.append(name)
        if version is not None:
            members[name] = (int(info.get("size") or 0), version(info))

    def read(name: str) -> bytes:
        full = posixpath.join(path, name)
        if local:
            # O_NOFOLLOW: a member swapped for a link after the listing is not followed.
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                return f.read()
        return bytes(fs.cat_file(full))

    def guard(source: Iterator[bytes]) -> Iterator[bytes]:
        for line in source:
            if tap is not None:
                tap(line)
            if len(line) - 1 > max_line_bytes:
                yield OversizeLine(len(line), max_line_bytes, terminated=True)
            else:
                yield line

    return read_segment_ledger(names, read, keys, previous=previous,
                               members=members).map(guard)


#: The environment variable vak's key file passphrase is read from (never a flag: a
#: command line shows in ``ps`` and in shell history).
PASSPHRASE_ENV = "VAKPIPE_KEY_PASSPHRASE"


def _read_text(url: str, what: str) -> bytes:
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(url)
        return bytes(fs.cat_file(path))
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read {what} {url!r}: {type(err).__name__}") from None


def load_keys(keys: str | None = None, key_file: str | None = None,
              tenant: str | None = None) -> StaticKeys | None:
    """The key provider of a command: ``--keys`` (a JSON object, scope -> hex key), and/or
    vak's own key material (``--vak-key-file``, its passphrase from
    :data:`PASSPHRASE_ENV`, with the tenant home ``--vak-tenant`` holding
    ``keys/scopes/``); ``None`` when neither is given.

    Raises
    ------
    UsageError
        A file cannot be read or is malformed, the passphrase is missing or wrong, or a
        key file is given without its tenant home (no message quotes key material).
    """
    provider: StaticKeys | None = None
    if keys is not None:
        provider = keys_from_json(_read_text(keys, "the keys file"), f"--keys {keys}")
    if key_file is not None or tenant is not None:
        if key_file is None or tenant is None:
            raise UsageError("--vak-key-file and --vak-tenant go together: the key file "
                             "holds the KEKs, the tenant home the wrapped scope keys")
        passphrase = os.environ.get(PASSPHRASE_ENV)
        if not passphrase:
            raise UsageError(f"--vak-key-file needs its passphrase in ${PASSPHRASE_ENV}")
        text = _read_text(key_file, "the vak key file").decode("utf-8", "replace")
        keks = open_key_file(text, passphrase)
        from fsspec.core import url_to_fs

        fs, home = url_to_fs(tenant)
        wrapped: dict[str, bytes] = {}
        tombstones: list[str] = []
        for sub, into in (("keys", wrapped), ("tombstones", None)):
            folder = f"{home.rstrip('/')}/keys/scopes/{sub}"
            try:
                names = [posixpath.basename(n) for n in fs.ls(folder, detail=False)]
            except (OSError, ValueError):
                continue  # none of that kind
            for name in names:
                if into is None:
                    tombstones.append(name)
                else:
                    into[name] = bytes(fs.cat_file(f"{folder}/{name}"))
        vak = vak_scope_keys(keks, wrapped, tombstones)
        provider = vak if provider is None else vak.merged(provider)
    return provider
