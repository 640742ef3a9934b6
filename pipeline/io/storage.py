"""Locations, listings and streamed reads over any fsspec URL."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import errno
import io
import itertools
import os
import posixpath
import re
import socket
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter
from typing import Any, TypeVar

import fsspec
import fsspec.asyn
import fsspec.compression
from fsspec.core import split_protocol, url_to_fs
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from pipeline.errors import (
    EmptyInputError,
    ObjectChangedError,
    OutputInsideArchiveError,
    StorageError,
    UnsafeOutputError,
    UsageError,
)
from pipeline.io.segments import (
    ListedLedger,
    MemberReads,
    directory_version,
    fetch_ledger,
    segment_lines,
)
from pipeline.ledger.kernel import guarded_c
from pipeline.ledger.keys import KeyProvider
from pipeline.ledger.layout import (
    LAYOUTS,
    SEGMENTS,
    VAK_AGENT,
    SessionKey,
    flat_session_key,
    ledger_stem,
    parse_session_path,
    segment_member,
)
from pipeline.ledger.segments import SegmentCheckpoint, is_ledger, is_member
from pipeline.ledger.types import OversizeLine, read_user_bytes

#: Protocols whose paths are object keys under a bucket, with no folders to create.
OBJECT_STORES = frozenset({"s3", "gs", "gcs", "az", "abfs", "abfss"})

#: Read buffer for streamed ledgers: lines are cut from it, so memory stays bounded by
#: this plus the largest line, whatever the file size.
READ_BLOCK_BYTES = 4 * 2**20
#: The buffer lines are cut from.
LINE_BUFFER_BYTES = 2**20
#: The longest line read (``--max-line-bytes``; the default of every command): a longer
#: one is skipped unread and reported as not a valid entry, so a worker's memory stays
#: bounded by about twice this plus the parsed entry, whatever a file holds. vak writes
#: one line per entry, and its largest (a tool result, a bound system prompt) stay far
#: below it.
MAX_LINE_BYTES = 64 * 2**20
#: The largest line limit taken: no line is longer, and the readers ask for the limit
#: plus one byte in a signed 64-bit count (a limit of 2^63 - 1 failed every session).
LARGEST_LINE_LIMIT = 2**62
#: Pieces the rest of an over-long line is skipped in.
SKIP_PIECE_BYTES = 2**20
T = TypeVar("T")
R = TypeVar("R")

#: Objects of an object store opened ahead of the one being read (:class:`ReadAhead`):
#: each waits a network round trip or two (the opening HEAD, the GET), which a batch of
#: small sessions otherwise pays one object after another. Within s3fs's connection
#: pool (10 by default).
READ_AHEAD_OBJECTS = 8
#: Only objects up to this size are read ahead, whole (one block: one GET): a larger
#: one's round trip is small beside its reading, and the objects held ahead stay within
#: :data:`READ_AHEAD_OBJECTS` times this.
READ_AHEAD_MAX_BYTES = READ_BLOCK_BYTES
#: A segment ledger's members on an object store are fetched as many side by side (each
#: up to :data:`READ_AHEAD_MAX_BYTES`; a larger one alone), the next ones as the reader
#: asks for them: a ledger of five members costs one round trip for them, not five.
MEMBER_READS = MemberReads(READ_AHEAD_OBJECTS, READ_AHEAD_MAX_BYTES)

# botocore retries and timeouts for S3: an unreachable endpoint should fail in seconds,
# not after minutes of silent retries; throttling still gets adaptive backoff.
_S3_DEFAULTS: dict[str, Any] = {
    "config_kwargs": {
        "connect_timeout": 5,
        "read_timeout": 60,
        "retries": {"max_attempts": 5, "mode": "adaptive"},
    },
}


def parse_storage_options(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """Turn ``key=value`` strings into fsspec storage options.

    Values ``true``/``false``, integers and JSON objects are decoded; anything else
    stays a string. A dotted key (``client_kwargs.region_name=x``) nests.
    """
    import json

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option wants key=value, got {pair!r}")
        value: Any
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw
            if not isinstance(value, int | float | dict | list):
                value = raw
        target = options
        *parents, leaf = key.split(".")
        for p in parents:
            target = target.setdefault(p, {})
            if not isinstance(target, dict):
                raise UsageError(f"--storage-option {pair!r}: {p!r} was given a value already")
        if isinstance(target.get(leaf), dict):
            raise UsageError(f"--storage-option {pair!r}: {leaf!r} has options nested already")
        target[leaf] = value
    return options


def _with_defaults(options: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``options`` over ``defaults``, nested dicts merged key by key (never mutated)."""
    merged = dict(options)
    for key, value in defaults.items():
        if key not in merged:
            merged[key] = copy.deepcopy(value)
        elif isinstance(value, dict) and isinstance(merged[key], dict):
            merged[key] = _with_defaults(merged[key], value)
    return merged


@dataclass(frozen=True)
class Location:
    """A root or output URL resolved to a protocol, a path and storage options.

    Picklable: workers rebuild the filesystem from it (fsspec caches the instance per
    process), so no live client crosses the wire.
    """

    url: str
    protocol: str
    path: str
    storage_options: dict[str, Any] = field(default_factory=dict, hash=False)
    #: The keys that open sealed segment ledgers read below this location (``--keys``;
    #: docs/segments.md). Never shown: not in the ``repr``, and a provider's own
    #: ``repr`` names no key.
    keys: KeyProvider | None = field(default=None, repr=False, compare=False, hash=False)

    def filesystem(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem behind this location (one cached instance per process).

        The options go in as a copy: botocore rewrites the ``retries`` dict it is given
        in place, which changed this location's options, hence fsspec's cache key, after
        the first request (a second instance, without the first one's listing cache).
        """
        return fsspec.filesystem(self.protocol, **copy.deepcopy(self.storage_options))

    def makedirs(self, path: str) -> None:
        """Create folder ``path`` where the storage has folders.

        Object stores have none, and their ``makedirs`` is harmful: s3fs's creates the
        *bucket* when it cannot see it (a typo in ``--out`` made a new bucket, and a
        writer allowed to put objects but not to list the bucket failed on CreateBucket).
        """
        if self.protocol not in OBJECT_STORES:
            self.filesystem().makedirs(path, exist_ok=True)

    @property
    def absolute_url(self) -> str:
        """A URL of this location that names it from anywhere: a local path's absolute
        ``file://`` URL (``url`` may be relative to the folder the command ran in)."""
        return f"file://{self.path}" if self.protocol == "file" else self.url

    def join(self, *parts: str) -> str:
        """Filesystem path of ``parts`` below this location."""
        return "/".join([self.path.rstrip("/"), *parts])

    def child(self, name: str) -> Location:
        """The location of ``name`` below this one: same storage and options, its URL
        and path one segment deeper (``OUT/date=…``, ``OUT/baseline``, ``OUT/cost``)."""
        return dataclasses.replace(self, url=f"{self.url.rstrip('/')}/{name}",
                                   path=self.join(name))

    @property
    def parent(self) -> Location:
        """The location one segment up: the inverse of :meth:`child`."""
        return dataclasses.replace(self, url=self.url.rstrip("/").rsplit("/", 1)[0],
                                   path=posixpath.dirname(self.path.rstrip("/")))

    def contains(self, other: Location) -> bool:
        """Whether ``other`` lies at or below this location on the same storage."""
        if self.protocol != other.protocol:
            return False
        mine, theirs = self.path.rstrip("/") + "/", other.path.rstrip("/") + "/"
        return theirs.startswith(mine)

    def check_inside(self, path: str, *, leaf: bool = True) -> None:
        """Refuse ``path`` unless it lies below this location, reached through no link.

        Every storage: ``path`` must be this location's path, a ``/`` and plain
        segments (:func:`unsafe_segment`: no empty, ``.`` or ``..`` segment, no backslash,
        NUL or other control character). A local path: no component below this location
        that exists may be a symbolic link, the last one included with ``leaf`` (a path
        written or moved onto; a path removed is unlinked itself when it is a link, so
        only the folders on its way count). Object stores have no links. This location
        itself may be reached through links: :func:`check_output` compares it resolved.

        Raises
        ------
        UnsafeOutputError
            ``path`` is not a plain path below, or a link lies on its way.
        """
        base = self.path.rstrip("/")
        rel = path[len(base) + 1:] if path.startswith(base + "/") else ""
        parts = rel.split("/")
        if not rel or any(unsafe_segment(p) for p in parts):
            raise UnsafeOutputError(f"{printable(path)} is not a plain path below the output "
                                    f"{printable(self.url)}; refused, nothing written there")
        if self.protocol != "file":
            return
        current = base
        for i, part in enumerate(parts):
            current = f"{current}/{part}"
            if i == len(parts) - 1 and not leaf:
                return
            try:
                mode = os.lstat(current).st_mode
            except OSError:
                # Not there (nothing deeper is either), or a name the disk cannot hold:
                # the write that follows fails in its own place, if it must.
                return
            if stat.S_ISLNK(mode):
                raise UnsafeOutputError(
                    f"{printable(current)} is a symbolic link inside the output "
                    f"{printable(self.url)}: vakpipe never writes, moves or deletes through "
                    "a link there (it could lead into the archive); remove the link or "
                    "choose another --out")


#: A password in a URL's user part (``ftp://user:password@host/…``).
_PASSWORD = re.compile(r"\A([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*):[^/@]*@")


def shown_url(url: str) -> str:
    """``url`` with a password in its user part masked (``ftp://user:***@host/x``): the
    form every message, summary and manifest shows."""
    return _PASSWORD.sub(r"\1:***@", url)


def resolve(url: str, storage_options: dict[str, Any] | None = None) -> Location:
    """Resolve ``url`` (``s3://``, ``file://``, ``memory://``, a plain path, ...).

    S3 gets bounded timeouts and retries unless the caller overrides them; endpoint,
    region and credentials come from the standard AWS environment
    (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ...) as botocore reads it. A password in the
    URL's user part goes to the filesystem (fsspec moves it to its options) and never
    into :attr:`Location.url`, which messages and manifests show (:func:`shown_url`).
    """
    if not url.strip():
        # fsspec reads "" as the current folder: an unset variable in a script
        # (`--out "$OUT"`) would otherwise audit, or write beside, whatever folder the
        # command ran in.
        raise UsageError("empty location (''): give a folder or a URL")
    options = dict(storage_options or {})
    shown = shown_url(url)
    try:
        fs, path = url_to_fs(url, **options)
    except (ImportError, ValueError) as err:
        raise UsageError(f"cannot use {shown!r}: {err}") from err
    except TypeError as err:  # an option of the wrong type (``max_concurrency=abc``)
        raise UsageError(f"{shown}: the storage options (--storage-option) do not fit its "
                         f"filesystem: {printable(str(err), 160)}") from err
    except Exception as err:
        # Some filesystems connect as they are made (ftp, sftp): whatever their client
        # raises (ConnectionRefusedError, ftplib's and paramiko's own errors), one line.
        raise StorageError(f"{shown}: storage unreachable or refused: "
                           f"{type(err).__name__}: {printable(str(err), 160)}") from err
    protocol, path = _canonical(fs.protocol, path)
    if protocol == "s3":
        # Merged key by key: overriding one retry setting keeps the bounded timeouts.
        options = _with_defaults(options, _S3_DEFAULTS)
        if os.environ.get("AWS_PROFILE") and "profile" not in options:
            options["profile"] = os.environ["AWS_PROFILE"]
    location = Location(shown, protocol, path, options, keys=_KEYS[0])
    if protocol == "s3":
        _make_s3_client(location)
    return location


#: s3fs's options that are dicts (a value that is not JSON stays a string).
_S3_OBJECT_OPTIONS = ("client_kwargs", "config_kwargs", "s3_additional_kwargs")


def _make_s3_client(location: Location) -> None:
    """Make ``location``'s S3 client now, as its first request would.

    botocore refuses what it cannot use only as the client is made: an endpoint that
    is no URL (``endpoint_url=notaurl``, or in ``AWS_ENDPOINT_URL``), an option s3fs
    hands to botocore's session that it does not take (``region_name``, which belongs
    in ``client_kwargs``), a profile that is not configured. Made at the first request,
    the first two were a traceback from whichever read came first. No request is sent;
    the credentials are looked up (the instance is the one every later call of
    :meth:`Location.filesystem` gets, so that is done once either way).

    Its session parses the timestamps of S3's answers with :func:`_s3_timestamp`: this
    is the command's process, which lists the archive.
    """
    for name in _S3_OBJECT_OPTIONS:
        value = location.storage_options.get(name)
        if value is not None and not isinstance(value, dict):
            # s3_additional_kwargs is read at every request, not as the client is made:
            # a string there was a traceback from the listing.
            raise UsageError(f"{location.url}: the storage option {name} must be a JSON "
                             f"object ({name}={{\"key\": ...}}), got "
                             f"{printable(repr(value), 80)}")
    fs = location.filesystem()
    try:
        if fs.session is None:
            import aiobotocore.session

            # What s3fs makes as it connects, with botocore's documented parser hook.
            fs.session = aiobotocore.session.AioSession(**fs.kwargs)
            fs.session.get_component("response_parser_factory").set_parser_defaults(
                timestamp_parser=_s3_timestamp)
        fs.connect()
    except (TypeError, ValueError, AttributeError) as err:
        # AttributeError: an option of the wrong kind that s3fs or botocore calls a method
        # of (client_kwargs={bad, not JSON, is the string "{bad").
        text = printable(str(err).splitlines()[0] if str(err) else type(err).__name__, 160)
        raise UsageError(f"{location.url}: the storage options (--storage-option, AWS_* "
                         f"variables) do not make an S3 client: {text}") from err
    except storage_errors() as err:
        raise storage_error(err, location.url) from err


def _s3_timestamp(text: str) -> datetime.datetime:
    """An S3 timestamp (a listed object's ``LastModified``: ``2026-12-07T07:03:26.000Z``)
    by the standard library, others by botocore's own parser (an HTTP date).

    botocore's default, dateutil's general parser, took 40-80 us a key here, about half
    the CPU of listing an archive (10^6 sessions: over a minute in the command's
    process); ``fromisoformat`` takes ~0.3 us and gives the same instant.
    """
    try:
        return datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        from botocore.utils import parse_timestamp

        stamp: datetime.datetime = parse_timestamp(text)
        return stamp


def _canonical(protocols: str | tuple[str, ...], path: str) -> tuple[str, str]:
    """A filesystem's first protocol name (``s3`` for s3a) and ``path`` as
    :class:`Location` keeps it (a local one absolute; no trailing ``/``)."""
    protocol = protocols if isinstance(protocols, str) else protocols[0]
    protocol = "s3" if protocol == "s3a" else protocol
    if protocol == "file":
        path = os.path.abspath(path)
    return protocol, path.rstrip("/") or "/"


def locate(url: str) -> Location | None:
    """``url``'s storage and path, for comparing locations only (:func:`check_output`):
    no filesystem is made, so nothing connects (an ftp URL's :func:`resolve` would);
    ``None`` when no installed filesystem has its protocol."""
    try:
        cls = fsspec.get_filesystem_class(split_protocol(url)[0] or "file")
    except (ImportError, ValueError):
        return None
    protocol, path = _canonical(cls.protocol, cls._strip_protocol(url))
    return Location(shown_url(url), protocol, path)


#: The key provider of this process's command (``--keys``), attached to every location
#: it resolves, so the keys travel with the root to every worker (:func:`use_keys`).
_KEYS: list[KeyProvider | None] = [None]


def use_keys(keys: KeyProvider | None) -> None:
    """Make ``keys`` the key provider of the locations :func:`resolve` returns from now
    on in this process (the CLI's ``--keys``)."""
    _KEYS[0] = keys


#: Characters a name under an output may not hold: another system's separator, NUL and
#: the other control characters.
_UNSAFE_CHARS = re.compile(r"[\\\x00-\x1f\x7f]")


def unsafe_segment(segment: str) -> bool:
    """Whether ``segment`` cannot be one plain name of a path below an output: empty,
    ``.`` or ``..``, or holding a backslash or a control character (NUL included)."""
    return segment in ("", ".", "..") or _UNSAFE_CHARS.search(segment) is not None


def _real(loc: Location) -> Location:
    """``loc`` with a local path's symbolic links resolved (others as they are)."""
    if loc.protocol != "file":
        return loc
    return dataclasses.replace(loc, path=os.path.realpath(loc.path))


def check_output(root: Location, out: Location, written: Iterable[str] = ()) -> None:
    """Refuse an output location that overlaps the archive being read, and paths under
    it (``written``: folders and files a run writes, moves or deletes) that resolve into
    the archive or around it.

    Either way round: an output inside the archive writes into it, and an archive inside
    the output could be written over by a commit (``OUT/archive`` of ``compact
    --write-archive``) or deleted by one (the stray files of a dataset folder). Local
    paths are compared with their symbolic links resolved, so a link cannot hide one
    inside the other: ``OUT`` itself, and each of ``written`` (``OUT/_staging``, a
    dataset folder, a compacted copy), whose own links are followed to where they lead.
    """
    for a, b in ((root, out), (_real(root), _real(out))):
        if a.contains(b):
            raise OutputInsideArchiveError(
                f"output {out.url!r} lies inside the archive {root.url!r}; vakpipe never "
                "writes into the archive it reads"
            )
        if b.contains(a):
            raise OutputInsideArchiveError(
                f"the archive {root.url!r} lies inside the output {out.url!r}; a commit "
                "there could overwrite or delete archive objects: choose an output "
                "beside the archive"
            )
    real_root = _real(root)
    for path in written:
        target = _real(dataclasses.replace(out, path=path))
        if real_root.contains(target) or target.contains(real_root):
            raise OutputInsideArchiveError(
                f"{printable(path)} resolves to {printable(target.path)}, which overlaps the "
                f"archive {printable(root.url)}; vakpipe never writes into the archive it "
                "reads: remove the link under the output")


@dataclass(frozen=True, slots=True, order=True)
class SessionObject:
    """One session object found by a listing: its key, full path, size and version."""

    key: SessionKey
    full_path: str
    size: int
    etag: str | None = None
    #: Why the listing already knows the object cannot be read (a dangling symbolic
    #: link): its read fails with this, and the audit reports it as ``unreadable_object``.
    unreadable: str | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # As SessionKey's: pickled by the thousand per run, the default is 2-3x slower.
        return SessionObject, _OBJECT_FIELDS(self)


#: Every field of a :class:`SessionObject`, in the constructor's order (its slots').
_OBJECT_FIELDS = attrgetter(*SessionObject.__slots__)


@dataclass(frozen=True)
class Listing:
    """What enumerating a root found."""

    sessions: list[SessionObject]
    skipped: int
    skipped_examples: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Sum of the session objects' sizes."""
        return sum(s.size for s in self.sessions)


def object_version(info: dict[str, Any]) -> str | None:
    """The version token of an object from its fsspec ``info``: its ETag, unquoted.

    Local files have no ETag: their modification time stands in, with the inode's
    change time and number when the listing gives them (fsspec's ``created`` is
    ``st_ctime`` on Linux). The modification time can be set back (``touch -d``,
    ``os.utime``, ``cp -p``); the change time moves on every write and on every such
    reset, and cannot be set, so a same-size rewrite with its mtime restored is still
    another version. ``None`` when the storage gives neither (``memory://``).
    """
    etag = info.get("ETag") or info.get("etag")
    if not etag and info.get("mtime") is not None:
        etag = f"mtime:{info['mtime']!r}"
        if info.get("ino") is not None:
            etag += f";ctime:{info.get('created')!r};ino:{info['ino']}"
    return str(etag).strip('"') if etag else None


def forget_listing(root: Location) -> None:
    """Drop what ``root``'s filesystem cached of listings at and below it.

    s3fs keeps each folder a ``find`` listed (an info dict per object, ~1.4 KiB a
    session) for the life of the process, and its ``invalidate_cache(path)`` drops
    ``path`` and its parents only, never the folders below: a whole archive's listing
    stayed cached after a night had "invalidated" it.
    """
    fs = root.filesystem()
    below = root.path.rstrip("/") + "/"
    cache = fs.dircache
    for path in [p for p in cache if p.startswith(below)]:
        cache.pop(path, None)
    fs.invalidate_cache(root.path)


def refresh_object(root: Location, obj: SessionObject) -> SessionObject:
    """``obj`` as it is now: its size and version looked up again, past any cached
    listing (before a re-read of an object that changed).

    Raises
    ------
    OSError, botocore and aiohttp errors
        As the look-up fails (see :func:`storage_errors`); a vanished object is a
        ``FileNotFoundError``.
    """
    fs = root.filesystem()
    fs.invalidate_cache(obj.full_path)
    info = fs.info(obj.full_path)
    return dataclasses.replace(obj, size=int(info.get("size") or 0), etag=object_version(info))


def printable(text: str, limit: int = 200) -> str:
    """``text`` safe to print and to quote in a summary: ASCII only, one line, bounded.

    Backslashes are doubled and every other character that is not printable ASCII
    (controls, NUL, bidirectional overrides, lookalike letters, any non-ASCII) becomes
    its ``\\x``/``\\u`` escape, so what is shown is unambiguous and the exact key can be
    recovered from it; a longer text is cut and says how much is left out.
    """
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    escaped = "".join(out)
    if len(escaped) > limit:
        escaped = f"{escaped[:limit]}...(+{len(escaped) - limit} chars)"
    return escaped


def storage_error(err: BaseException, url: str) -> StorageError:
    """Translate an fsspec/s3fs/botocore error about ``url`` into a one-line error; one
    of vakpipe's own (already one line: a run replaced while it was read) as it is."""
    if isinstance(err, StorageError):
        return type(err)(*err.args)
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    name = type(err).__name__
    if isinstance(err, NotADirectoryError):
        # A file given as --out, or as the run a report reads: the path it names is not
        # the one given but a name under it.
        return StorageError(f"{url}: a file where a folder is needed ({text})")
    if isinstance(err, IsADirectoryError):
        return StorageError(f"{url}: a folder where a file is needed ({text})")
    if isinstance(err, FileNotFoundError) or "NoSuchBucket" in text:
        return StorageError(f"{url}: no such bucket or path ({text})")
    if isinstance(err, PermissionError) or any(
        code in text for code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                                  "InvalidClientTokenId", "Forbidden")
    ):
        return StorageError(f"{url}: access denied; check the credentials ({text})")
    if "Endpoint" in name or "Connect" in name or "connect" in text.lower():
        return StorageError(f"{url}: storage endpoint unreachable ({text})")
    return StorageError(f"{url}: storage error: {name}: {text}")


def endpoint_unreachable(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) says the storage endpoint could
    not be connected to at all: connection refused, a connect timeout, an unknown host,
    a TLS handshake refused.

    Not a failure of one object (AccessDenied, NoSuchKey, SlowDown), nor a connection
    the endpoint accepted and then cut (a reset: botocore calls both an
    ``EndpointConnectionError``, so the cause decides).
    """
    kinds = _unreachable_errors()
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, kinds):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = [ConnectionRefusedError, socket.gaierror]
    try:
        from botocore.exceptions import ConnectTimeoutError

        kinds.append(ConnectTimeoutError)
    except ImportError:  # pragma: no cover
        pass
    try:
        import aiohttp

        # Refused, unknown host, certificate: the connection was never made.
        kinds.append(aiohttp.ClientConnectorError)
        timeout = getattr(aiohttp, "ConnectionTimeoutError", None)  # aiohttp >= 3.10
        if isinstance(timeout, type) and issubclass(timeout, BaseException):
            kinds.append(timeout)
    except ImportError:  # pragma: no cover
        pass
    return tuple(kinds)


def storage_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the storage failed" (OSError, botocore's, aiohttp's).

    aiohttp's are there because s3fs lets them through once its own retries are spent:
    a body cut short (``ClientPayloadError``) is not an OSError.
    """
    errors: list[type[BaseException]] = [OSError]
    # Only the modules already imported: no error of one that is not can have been raised,
    # and importing them (aiohttp: ~0.15 s) would slow every local run that catches a
    # FileNotFoundError. botocore and aiohttp are only there when s3fs is.
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None:
        errors += [botocore.BotoCoreError, botocore.ClientError]
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None:
        errors.append(aiohttp.ClientError)
    return tuple(errors)


def enumerate_sessions(root: Location) -> Listing:
    """List every session object under ``root`` (spec section 1, docs/formats.md).

    One recursive ``find`` under the prefix, then filtering, rather than a two-level
    glob (which lists every directory separately: ~25 times slower on S3). Objects in
    the archive layouts (:func:`~pipeline.ledger.layout.parse_session_path`) are sessions;
    when there are none, the root is read flat: a single ledger file given as the root,
    or every ledger file under it (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``) whose first
    lines the formats package recognises (vak, Claude Code, Codex), keyed from its
    content (:func:`~pipeline.ledger.layout.flat_session_key`). A local symbolic link named
    like a ledger is never followed: a dangling one is listed as a session the audit
    reports unreadable, any other skipped. Each subagent transcript is marked when its
    parent transcript is not in the listing (``parent_missing``).

    Raises
    ------
    StorageError
        The storage cannot be listed (no bucket, no endpoint, no access).
    EmptyInputError
        The root does not exist (a local path), nothing at all or no session among the
        objects under it: the message names the layouts read.
    """
    fs = root.filesystem()
    try:
        found = fs.find(root.path, detail=True)
    except storage_errors() as err:
        raise storage_error(err, root.url) from err
    if not found and root.protocol == "file" and not os.path.lexists(root.path):
        raise EmptyInputError(f"root {root.url} does not exist")
    prefix = root.path.rstrip("/") + "/"
    single = _single_file(root, found)
    sessions: list[SessionObject] = []
    skipped: list[str] = []
    candidates: list[tuple[str, str, dict[str, Any]]] = []
    # Segment ledger directories (docs/segments.md): their members, grouped.
    folders: dict[str, tuple[SessionKey, list[tuple[str, dict[str, Any]]]]] = {}
    for full_path, info in found.items():
        relative = full_path[len(prefix):] if full_path.startswith(prefix) else full_path
        if single:
            relative = posixpath.basename(full_path)
        if not _utf8(relative):
            # A local name of bytes that are not UTF-8 (object stores' keys always are):
            # the tables' strings cannot hold it, and a name rewritten to fit would no
            # longer name the object. Skipped and counted, as a key no layout takes.
            if single:
                raise EmptyInputError(
                    f"{printable(root.url)}: a file name that is not UTF-8; a session is "
                    "named in the tables by its file name, in UTF-8: give it a UTF-8 name")
            skipped.append(relative)
            continue
        member = None if single else segment_member(relative)
        if member is not None and info.get("type", "file") == "file" \
                and not _dangling_link(root, full_path, info):
            folders.setdefault(member.path, (member, []))[1].append(
                (posixpath.basename(relative), info))
            continue
        key = None if single else parse_session_path(relative)
        dangling = _dangling_link(root, full_path, info)
        if key is not None and (info.get("type", "file") == "file" or dangling):
            sessions.append(_listed(key, full_path, info, dangling))
            continue
        if ledger_stem(posixpath.basename(relative)) is not None and (
                info.get("type", "file") == "file" or dangling):
            candidates.append((relative, full_path, info))
        skipped.append(relative)
    for folder, (key, members) in folders.items():
        if is_ledger(name for name, _ in members):
            sessions.append(SessionObject(key, root.join(folder),
                                          sum(int(i.get("size") or 0) for _, i in members),
                                          directory_version(members, object_version)))
        else:
            skipped.extend(f"{folder}/{name}" for name, _ in members)
    top = [(r, info) for r in skipped if "/" not in r
           for info in [found.get(f"{prefix}{r}", {})] if info.get("type", "file") == "file"]
    if not sessions and not single and is_ledger(r for r, _ in top):
        # The root is itself one segment ledger directory (as `show` takes it).
        name = posixpath.basename(root.path.rstrip("/"))
        members = [(r, i) for r, i in top if is_member(r)]
        sessions.append(SessionObject(
            SessionKey(name, VAK_AGENT, "-", name, storage=SEGMENTS), root.path.rstrip("/"),
            sum(int(i.get("size") or 0) for _, i in members),
            directory_version(members, object_version)))
        skipped = [r for r in skipped if not ("/" not in r and is_member(r))]
    if not sessions and candidates:
        # None of the layouts: the root is one ledger, or a flat folder of them.
        flat = _flat_sessions(root, candidates, single)
        taken = {s.key.path for s in flat}
        sessions = flat
        skipped = [r for r in skipped if r not in taken]
    if not sessions:
        what = f"{len(skipped)} other objects" if skipped else "nothing"
        shown = ", ".join(repr(printable(k, 60)) for k in sorted(skipped)[:3])
        examples = f"; e.g. {shown}" if skipped else ""
        raise EmptyInputError(f"{root.url}: no session ledgers found ({what} under it)"
                              f"{examples}; vakpipe reads {LAYOUTS}")
    sessions = _mark_orphans(sessions)
    sessions.sort()
    return Listing(sessions, len(skipped), tuple(sorted(skipped)[:5]))


def _utf8(name: str) -> bool:
    """Whether ``name`` is text, not a local name's undecodable bytes (lone surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _single_file(root: Location, found: dict[str, Any]) -> bool:
    """Whether the root is itself one object (a single ledger given as the root)."""
    if len(found) != 1:
        return False
    (path, info), = found.items()
    return path.rstrip("/") == root.path.rstrip("/") and info.get("type", "file") == "file"


def _dangling_link(root: Location, full_path: str, info: dict[str, Any]) -> bool:
    """Whether a local listing's entry is a symbolic link to nothing."""
    return (root.protocol == "file" and bool(info.get("islink"))
            and not os.path.exists(full_path))


def _listed(key: SessionKey, full_path: str, info: dict[str, Any],
            dangling: bool) -> SessionObject:
    if dangling:
        # Never followed (nor read): reported on its row instead of skipped in silence.
        target = info.get("destination")
        return SessionObject(key, full_path, 0, None,
                             "dangling symbolic link" + (
                                 f" (to {printable(str(target), 120)})" if target else ""))
    return SessionObject(key, full_path, int(info.get("size") or 0), object_version(info))


#: Bytes of a flat candidate's first lines read to tell its format (per line).
SNIFF_LINE_BYTES = 2**20


def _flat_sessions(root: Location, candidates: list[tuple[str, str, dict[str, Any]]],
                   single: bool) -> list[SessionObject]:
    """The ledgers among the files of a root in no layout, keyed by their content.

    In a folder, a file is a session when its first lines are a vak ledger's or a
    format's the formats package knows, or it cannot be read (a dangling link: its row
    says so); others (empty, broken, JSON of something else) are skipped. A single file
    given as the root is always a session: one no format claims is keyed as a vak
    ledger, and its audit says what is wrong with it.
    """
    from pipeline.formats import UNKNOWN, VAK, detect
    from pipeline.formats.base import is_vak_entry

    sessions = []
    unreadable: tuple[type[BaseException], ...] = (*storage_errors(), EOFError, ValueError)
    for relative, full_path, info in candidates:
        dangling = _dangling_link(root, full_path, info)
        folder = posixpath.basename(posixpath.dirname(full_path))
        source, header = VAK, None
        if not dangling:
            probe = SessionObject(SessionKey(relative, "", "", ""), full_path,
                                  int(info.get("size") or 0))
            try:
                with open_lines(root, probe, max_line_bytes=SNIFF_LINE_BYTES) as lines:
                    head = list(itertools.islice(lines, 20))
                fmt, _ = detect(head)
                source = VAK if fmt is None else fmt.name
                if fmt is None:
                    objects = [o for o in map(_json_object, head) if o is not None]
                    if not any(map(is_vak_entry, objects)):
                        source = UNKNOWN  # empty, or no line of any ledger
                    header = objects[0] if objects and objects[0].get("kind") == "header" \
                        else None
            except unreadable:
                pass  # read (and reported) by the audit
        if source == UNKNOWN:
            if not single:
                continue
            source = VAK
        key = flat_session_key(relative, folder, source, header)
        if key is not None:
            sessions.append(_listed(key, full_path, info, dangling))
    return sessions


def _json_object(line: bytes) -> dict[str, Any] | None:
    import orjson

    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _mark_orphans(sessions: list[SessionObject]) -> list[SessionObject]:
    """Mark every subagent transcript whose parent file the listing does not hold
    (compressed or not: the parent counts by its stem)."""
    def stem(path: str) -> str:
        name = posixpath.basename(path)
        return posixpath.join(posixpath.dirname(path), ledger_stem(name) or name)

    if all(s.key.parent is None for s in sessions):
        return sessions  # no subagent transcript (a vak archive): no stem to compute
    listed = {stem(s.key.path) for s in sessions}
    return [dataclasses.replace(s, key=dataclasses.replace(s.key, parent_missing=True))
            if s.key.parent is not None and stem(s.key.parent) not in listed else s
            for s in sessions]


#: Sees every byte read from an object, in order (a spool, a checkpoint's hasher).
Tap = Callable[[bytes], object]


def guarded_lines(f: Any, max_line_bytes: int = MAX_LINE_BYTES,
                  tap: Tap | None = None) -> Iterator[bytes]:
    """The physical lines of the binary file ``f``, none longer than ``max_line_bytes``.

    A line whose bytes (newline excluded) exceed the limit is skipped in pieces, never
    held whole, and yielded as an :class:`~pipeline.ledger.types.OversizeLine` in its place,
    so line numbers stay physical. ``tap`` gets every byte as read: each line, and an
    over-long line piece by piece.

    The loop is the C kernel's (``guarded_c``: no Python frame per line, ~1% of a vak
    audit's task; docs/scaling.md) where it built, else :func:`_guarded_lines`; either
    hands an over-long line to :func:`_rest_skipped`.
    """
    readline = f.readline
    if guarded_c is not None:
        return guarded_c(readline, max_line_bytes, tap,
                         partial(_rest_skipped, readline, max_line_bytes, tap))
    return _guarded_lines(readline, max_line_bytes, tap)


def _guarded_lines(readline: Callable[[int], bytes], limit: int,
                   tap: Tap | None) -> Iterator[bytes]:
    """:func:`guarded_lines` in Python (where the C kernel did not build)."""
    # readline from C, one Python check per line: the guard costs ~0.1 us a line.
    for line in iter(partial(readline, limit + 1), b""):
        if len(line) > limit and line[-1:] != b"\n":
            yield _rest_skipped(readline, limit, tap, line)
            continue
        if tap is not None:
            tap(line)
        yield line


def _rest_skipped(readline: Callable[[int], bytes], limit: int, tap: Tap | None,
                  line: bytes) -> OversizeLine:
    """The marker of an over-long line whose first ``line`` bytes were read: the rest
    is read (and tapped) :data:`SKIP_PIECE_BYTES` at a time, never held whole."""
    size = len(line)
    if tap is not None:
        tap(line)
    del line  # dropped before the rest is read: one piece in memory at a time
    while True:
        piece = readline(SKIP_PIECE_BYTES)
        size += len(piece)
        if tap is not None and piece:
            tap(piece)
        if not piece or piece[-1:] == b"\n":
            break
    return OversizeLine(size, limit, terminated=bool(piece))


def reads_over_network(root: Location) -> bool:
    """Whether reading an object under ``root`` waits on a network round trip (anything
    but a local folder or fsspec's in-memory filesystem)."""
    cls = fsspec.get_filesystem_class(root.protocol)
    return not issubclass(cls, LocalFileSystem | MemoryFileSystem)


def map_io(where: Location, read: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[read(item) for item in items]``, side by side on :data:`READ_AHEAD_OBJECTS`
    threads when ``where`` reads over the network (each read waits on its round trips),
    else one after another. The results are in the items' order; the first item's error
    (in that order) is raised, as the loop would raise it."""
    todo = list(items)
    if len(todo) < 2 or not reads_over_network(where):
        return [read(item) for item in todo]
    with ThreadPoolExecutor(READ_AHEAD_OBJECTS, thread_name_prefix="vakpipe-read") as pool:
        return list(pool.map(read, todo))


class ReadAhead:
    """Opens a batch's next small objects on threads while the current one is read.

    A batch of small sessions on an object store is otherwise bound by round trips: each
    object's open (a HEAD where the listing is not cached) and GET wait on the network
    one after another, ~20-40 ms each against S3, which dwarfs the audit of a 100 KB
    session. Here the :data:`READ_AHEAD_OBJECTS` objects after the one taken are fetched
    whole (each at most :data:`READ_AHEAD_MAX_BYTES`), side by side: on S3 in one GET
    asking for the listed version (:func:`_get_listed_version`), elsewhere opened and
    their one block fetched into the file object's cache; :func:`open_lines` then reads
    the object from memory, its version checked as any object's is.

    A segment ledger up to that size is listed and its members fetched side by side
    (:func:`~pipeline.io.segments.fetch_ledger`, those its reading will ask for: on a
    night without keys, not the sealed segments ``segments_before(obj)``, the night's
    checkpoint of it, says are unchanged and verified).

    Nothing is read ahead from a local folder or memory (no round trip to save), nor a
    known-unreadable object or one over :data:`READ_AHEAD_MAX_BYTES`; and only while
    ``ready()`` says so (a batch pauses it until its endpoint answered, and whenever it
    just failed to reach it: a dead endpoint is not sent a batch's worth of requests).
    An object is taken once: a second read of it (it changed under the first) opens it
    anew. Use as a context manager: the files opened ahead and never taken are closed,
    the opens not yet started cancelled.
    """

    def __init__(self, root: Location, objects: Sequence[SessionObject],
                 ready: Callable[[], bool] = lambda: True,
                 depth: int = READ_AHEAD_OBJECTS,
                 segments_before: Callable[[SessionObject], SegmentCheckpoint | None]
                 = lambda obj: None) -> None:
        self._root = root
        self._segments_before = segments_before
        self._objects = list(objects) if reads_over_network(root) else []
        self._position = {obj.full_path: i for i, obj in enumerate(self._objects)}
        self._ready = ready
        self._depth = depth
        self._next = 0  # the first object not yet considered for reading ahead
        self._pending: dict[str, Future[Any]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        for future in self._pending.values():
            if not future.cancel():
                future.add_done_callback(_close_opened)
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def take(self, obj: SessionObject) -> Future[Any] | None:
        """The opening of ``obj`` started ahead (its result, the open file object or, for
        a segment ledger, its :class:`~pipeline.io.segments.ListedLedger`; or the error
        it raised), or ``None``: open it yourself. Starts reading ahead the
        objects after it."""
        position = self._position.get(obj.full_path)
        if position is None:
            return None
        future = self._pending.pop(obj.full_path, None)
        self._next = max(self._next, position + 1)
        if self._ready():
            self._fill(position + self._depth)
        return future

    def _fill(self, last: int) -> None:
        end = min(last, len(self._objects) - 1)
        while self._next <= end:
            obj = self._objects[self._next]
            self._next += 1
            if obj.unreadable is None and obj.size <= READ_AHEAD_MAX_BYTES:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._depth,
                                                    thread_name_prefix="vakpipe-read-ahead")
                self._pending[obj.full_path] = (
                    self._pool.submit(_open_object, self._root, obj, True)
                    if obj.key.storage != SEGMENTS else
                    self._pool.submit(fetch_ledger, self._root.filesystem(), obj.full_path,
                                      MEMBER_READS, self._root.keys,
                                      previous=self._segments_before(obj),
                                      version=object_version))


def _open_object(root: Location, obj: SessionObject, fetch: bool = False) -> Any:
    """``obj`` opened for reading in blocks of :data:`READ_BLOCK_BYTES`; with ``fetch``,
    its first block fetched (into the file object's cache) and the file back at 0,
    unless it opened another version than the one listed (:func:`open_lines` raises
    then, before any GET).

    An S3 object up to :data:`READ_AHEAD_MAX_BYTES` whose listing gave its ETag is
    fetched whole, as that version, in one GET (:func:`_get_listed_version`): s3fs's
    file object would first send a HEAD for what the listing already says, on a worker,
    which has no cached listing (two round trips an object instead of one).
    """
    if root.protocol == "s3" and obj.etag is not None and obj.size <= READ_AHEAD_MAX_BYTES:
        return io.BytesIO(_get_listed_version(root.filesystem(), obj))
    raw = root.filesystem().open(obj.full_path, "rb", block_size=READ_BLOCK_BYTES)
    if fetch:
        try:
            _check_version(obj, getattr(raw, "details", None) or {}, "since it was listed")
            raw.read(1)
            raw.seek(0)
        except BaseException:
            raw.close()
            raise
    return raw


def _get_listed_version(fs: Any, obj: SessionObject) -> bytes:
    """The bytes of the S3 object ``obj`` names, in one GET that asks for its listed
    ETag (``If-Match``): another version is a 412, raised as
    :class:`~pipeline.errors.ObjectChangedError` before any of its bytes are read. The
    answer's own ETag and length are checked too, for a store that ignores ``If-Match``.

    s3fs's own calls (its retries of throttling and of a body cut short, its
    translation of S3's errors), as its ``cat_file``, which cannot send ``If-Match``.
    """
    from s3fs.core import _error_wrapper

    bucket, key, _ = fs.split_path(obj.full_path)

    async def get() -> tuple[bytes, str | None]:
        answer = await fs._call_s3("get_object", Bucket=bucket, Key=key,
                                   IfMatch=f'"{obj.etag}"')
        try:
            return await answer["Body"].read(), answer.get("ETag")
        finally:
            answer["Body"].close()

    try:
        answer: tuple[bytes, str | None] = fsspec.asyn.sync(fs.loop, _error_wrapper, get,
                                                             retries=fs.retries)
    except OSError as err:
        # s3fs's translation of 412 PreconditionFailed (its own file object tells it
        # the same way)
        if err.errno == errno.EINVAL and "pre-conditions" in str(err):
            raise ObjectChangedError(
                f"changed since it was listed: version {obj.etag} of {obj.size:,} bytes "
                f"listed, another found (If-Match failed)") from err
        raise
    data, etag = answer
    _check_version(obj, {"ETag": etag, "size": len(data)}, "since it was listed")
    return data


def _close_opened(future: Future[Any]) -> None:
    """Close the file a read-ahead opened that nobody took."""
    if not future.cancelled() and future.exception() is None:
        opened = future.result()
        if not isinstance(opened, ListedLedger):  # a ledger's members are bytes
            opened.close()


@contextmanager
def open_lines(root: Location, obj: SessionObject, *, max_line_bytes: int = MAX_LINE_BYTES,
               tap: Tap | None = None, segments_before: SegmentCheckpoint | None = None,
               ahead: ReadAhead | None = None) -> Iterator[Iterator[bytes]]:
    """Open one session object for streamed, line-by-line reading.

    Yields an iterator of physical lines (bytes, with their ``\\n``), lines over
    ``max_line_bytes`` replaced by markers (see :func:`guarded_lines`, which also says
    what ``tap`` sees). Errors are left to the caller, which reports them per object.

    The lines are those of one version of the object, the one ``obj`` names (its ETag,
    or a local file's modification time, and size, as listed): when the object is
    another version once opened, or changes while it is read, the block raises
    :class:`~pipeline.errors.ObjectChangedError` (the caller may look it up again with
    :func:`refresh_object` and read it once more). On S3 an object up to
    :data:`READ_AHEAD_MAX_BYTES` is one GET asking for the listed ETag (``If-Match``); for
    a larger one s3fs sends the ETag it opened as ``If-Match`` with every ranged GET, so
    a replacement between two of them fails the read instead of splicing two versions; a
    local file is looked at again after its last line.

    ``segments_before``: a nightly's checkpoint of a segment ledger (docs/segments.md).
    ``ahead``: the batch's :class:`ReadAhead`, which may have opened the object already.
    """
    if obj.unreadable is not None:
        # Known at listing time (a dangling link): never opened, so never followed.
        raise FileNotFoundError(obj.unreadable)
    local = issubclass(fsspec.get_filesystem_class(root.protocol), LocalFileSystem)
    if obj.key.storage == SEGMENTS:
        # A directory of vak's record segments: its entries as the lines of a JSONL
        # projection, its integrity on the lines' report (docs/segments.md).
        started = ahead.take(obj) if ahead is not None else None
        yield segment_lines(root.filesystem(), obj.full_path, root.keys, local=local,
                            max_line_bytes=max_line_bytes, tap=tap,
                            previous=segments_before, version=object_version,
                            reads=MEMBER_READS if reads_over_network(root) else None,
                            listed=started.result() if started is not None else None)
        return
    codec = obj.key.compression
    if local:
        # The OS file directly: fsspec's local wrapper adds a Python call per buffer fill
        # (and no filesystem instance is looked up: ~9 us an object, ~1% of the audit
        # of a 100 KB session).
        with open(obj.full_path, "rb", buffering=LINE_BUFFER_BYTES) as f:
            opened = _stat_info(f)
            _check_version(obj, opened, "since it was listed")
            yield guarded_lines(f if codec is None else decompressed(f, codec),
                                max_line_bytes, tap)
            read = _stat_info(f)
            if read != opened:  # the same fields are the same version, checked above
                _check_version(obj, read, "while it was read")
        return
    started = ahead.take(obj) if ahead is not None else None
    try:
        # The open's errors, also one made ahead, are raised here, as they are translated.
        with started.result() if started is not None else _open_object(root, obj) as raw:
            # What the file object opened (a HEAD, or the cached listing).
            _check_version(obj, getattr(raw, "details", None) or {}, "since it was listed")
            # fsspec's own readline is slow; a C BufferedReader on top cuts lines fast.
            # Its buffer is smaller than the request size (requests stay
            # READ_BLOCK_BYTES, as the file object caches its block) so the lines are
            # cut from cache-warm memory.
            stream = (decompressed(raw, codec) if codec is not None
                      else raw if isinstance(raw, io.BytesIO)  # fetched whole
                      else io.BufferedReader(raw, LINE_BUFFER_BYTES))
            yield guarded_lines(stream, max_line_bytes, tap)
    except _expired_errors() as err:
        raise ObjectChangedError(f"changed while it was read ({err})") from err


def _zstd_file(infile: Any, mode: str = "rb", **kwargs: Any) -> Any:
    """A zstd-decompressing reader of ``infile`` (pyarrow's codec, not fsspec's own
    ``zstandard`` one: see the registration below)."""
    import pyarrow as pa

    # Borrowed: pyarrow closes the file it wraps, and the caller still looks at it.
    return pa.CompressedInputStream(pa.PythonFile(_Borrowed(infile), mode="r"), "zstd")


class _Borrowed(io.RawIOBase):
    """Reads ``f`` and never closes it."""

    def __init__(self, f: Any) -> None:
        super().__init__()
        self._f = f

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._f.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


# Always pyarrow's codec for .jsonl.zst, even now that ``zstandard`` is installed (for
# segment ledgers): its errors are the ones _Decompressing turns into unreadable objects
# (zstandard's ZstdError is none of them), so a damaged stream reads as before.
fsspec.compression.register_compression("zstd", _zstd_file, "zst", force=True)


class _Decompressing(io.RawIOBase):
    """A raw reader over a decompressing stream: its codec's errors (a truncated or
    damaged stream) become ``OSError``, so the object is reported unreadable."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._stream.read(len(buffer))
        except OSError:
            raise
        except (EOFError, ValueError, RuntimeError) as err:  # zlib, gzip, pyarrow
            raise OSError(f"damaged compressed stream: {type(err).__name__}: {err}") from err
        n = len(data)
        buffer[:n] = data
        return n


def decompressed(raw: Any, codec: str) -> io.BufferedReader:
    """The decompressed bytes of the binary file ``raw`` (``gzip``, ``zstd``: fsspec's
    compression registry), read front to back: a compressed object cannot be
    range-read, so it is always streamed whole."""
    return io.BufferedReader(_Decompressing(fsspec.compression.compr[codec](raw, mode="rb")),
                             LINE_BUFFER_BYTES)


def _stat_info(f: Any) -> dict[str, Any]:
    st = os.fstat(f.fileno())
    # The fields of fsspec's local ``info`` that object_version reads, the same way.
    return {"size": st.st_size, "mtime": st.st_mtime, "ino": st.st_ino,
            "created": getattr(st, "st_birthtime", st.st_ctime)}


def _check_version(obj: SessionObject, info: dict[str, Any], when: str) -> None:
    """Raise :class:`ObjectChangedError` when ``info`` is not the version ``obj`` names
    (nothing to compare when either has no version)."""
    version = object_version(info)
    if obj.etag is None or version is None:
        return
    size = info.get("size")
    if version != obj.etag or (size is not None and int(size) != obj.size):
        raise ObjectChangedError(
            f"changed {when}: version {obj.etag} of {obj.size:,} bytes listed, "
            f"{version} of {'?' if size is None else f'{int(size):,}'} bytes found")


def _expired_errors() -> tuple[type[BaseException], ...]:
    """s3fs's error for a read whose object was replaced (a failed ``If-Match``)."""
    try:
        from s3fs.utils import FileExpired
    except ImportError:  # pragma: no cover - s3fs is only needed for s3://
        return ()
    return (FileExpired,)


def read_user_file(url: str, what: str, storage_options: dict[str, Any] | None = None
                   ) -> bytes:
    """The bytes of a small file a user names (a keys file, a budget file; any fsspec
    URL, a pipe of the shell's ``<(...)`` too), at most
    :data:`~pipeline.ledger.types.USER_FILE_LIMIT` of them read.

    Parameters
    ----------
    url : str
        The file.
    what : str
        The file as messages name it (``"the keys file 'k.json'"``).
    storage_options : dict, optional
        fsspec options of ``url``.

    Raises
    ------
    UsageError
        ``cannot read <what>: <error type>`` (no message quotes the file's bytes: key
        material), or it is larger than the limit (a device, a ledger named by mistake).
    """
    where = resolve(url, dict(storage_options or {}))
    # fsspec's local files seek to their end when opened, which a pipe cannot
    return read_small(None if where.protocol == "file" else where.filesystem(), where.path,
                      what)


def read_small(fs: Any, path: str, what: str) -> bytes:
    """:func:`read_user_file` of ``path`` on the fsspec filesystem ``fs`` (``None``: the
    local one, read as a stream)."""
    failures: tuple[type[BaseException], ...] = (*storage_errors(), ValueError)
    try:
        with open(path, "rb") if fs is None else fs.open(path, "rb") as stream:
            return read_user_bytes(stream, what)
    except UsageError:
        raise  # past the limit: a ValueError, said as it is
    except failures as err:
        raise UsageError(f"cannot read {what}: {type(err).__name__}") from None
