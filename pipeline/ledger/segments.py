"""vak's record-segment ledgers: keyless verification and frame decoding (docs/segments.md).
Pure: the IO layer hands in the directory's file names and a reader of their bytes.

One session ledger is a directory of ``seg-NNNNNNNN.log`` (the open segment) and
``seg-NNNNNNNN.sealed`` files, a ``seals.log`` of seal entries, a ``KEY`` naming the key
scope and a ``LOCK``. Every frame is ``len:u32le | flags:u8 | payload | SHA-256(prev ||
len || body)``; the chain runs over the stored bytes, so everything here but reading the
content needs no key.

:func:`read_segment_ledger` walks the segments in order, one in memory at a time, and
yields the ledger's entries as the lines of a JSONL *projection*: each entry opened
(AES-256-GCM under the scope key, AAD = the frame's index in its segment), decompressed
(zstd) and written as a JSONL entry whose ``prev_hash`` chains the projection's own lines,
so the JSONL reader, the tree, turns, usage, replay and cost read it as they read any
ledger. Its :class:`SegmentReport` holds the integrity findings of the segments, each
located ``<file> frame <index> byte <offset>``, once the lines are consumed. A broken
frame does not stop the reading of those after it (vak's rule: the record is evidence):
after a hash mismatch the chain goes on from the stored hash; only a length out of
bounds, after which no frame boundary is known, ends a segment's reading.
"""

from __future__ import annotations

import hashlib
import io
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from pipeline.ledger.keys import KEY_LEN, KeyProvider, opener
from pipeline.ledger.types import Code, Finding

if TYPE_CHECKING:
    import zstandard

GENESIS = bytes(32)
#: The largest frame body vak writes (``len``: flags and payload).
MAX_FRAME = 64 * 2**20
HASH_LEN = 32
SEALED_FLAG = 1
MAGIC = b"VAKSEG01"
SEALS = "seals.log"
KEY_FILE = "KEY"
LOCK_FILE = "LOCK"
#: An entry decompresses to at most this many bytes (a zstd bomb stops here).
MAX_ENTRY_BYTES = 256 * 2**20
#: A sealed file's whole-segment zstd decompresses to at most this many bytes.
MAX_SEGMENT_BYTES = 4 * 2**30
#: Unreadable frames listed one by one per ledger; the rest counted in one finding.
MAX_LISTED_FRAMES = 10
#: The envelope as vak serialises it, up to the end of ``ts`` (where ``prev_hash`` went).
_ENVELOPE = re.compile(rb'\{"id":"[^"\\]*","parent_id":(?:null|"[^"\\]*"),"ts":"[^"\\]*"')
_SEGMENT = re.compile(r"seg-(\d{1,20})\.(log|sealed|sealing)\Z")


def segment_name(name: str) -> tuple[int, str] | None:
    """``(number, suffix)`` of a segment file name (``seg-00000003.log`` -> ``(3,
    'log')``; suffixes ``log``, ``sealed``, ``sealing``), else ``None``."""
    found = _SEGMENT.match(name)
    return (int(found.group(1)), found.group(2)) if found else None


def is_member(name: str) -> bool:
    """Whether a file name belongs to a segment ledger directory."""
    return name in (SEALS, KEY_FILE, LOCK_FILE) or segment_name(name) is not None


def is_ledger(names: Iterable[str]) -> bool:
    """Whether a directory's file names make it a segment ledger: one segment file or a
    ``seals.log`` (a ``KEY`` or ``LOCK`` alone is no ledger)."""
    return any(n == SEALS or segment_name(n) is not None for n in names)


def link(prev: bytes, body: bytes | memoryview) -> bytes:
    """The hash of a frame: SHA-256 of the previous hash, ``u32le(len)`` and the body."""
    h = hashlib.sha256(prev)
    h.update(len(body).to_bytes(4, "little"))
    h.update(body)
    return h.digest()


@dataclass(frozen=True, slots=True)
class Frame:
    """One complete frame: its index in its segment, where it starts, flags, payload."""

    index: int
    offset: int
    flags: int
    payload: bytes


@dataclass(slots=True)
class ChainWalk:
    """What walking one segment's frames found."""

    frames: list[Frame] = field(default_factory=list)
    #: The hash of the last complete frame (as stored), or the start when none.
    head: bytes = GENESIS
    #: Where an incomplete trailing frame begins, if any.
    torn_at: int | None = None
    #: Frames whose stored hash is not their link (index, offset).
    mismatches: list[tuple[int, int]] = field(default_factory=list)
    #: Lengths out of bounds (or past the end, with verified frames after them): the
    #: frame index, offset, length, and where reading resumed (``None``: nothing after
    #: it could be read).
    bad_lengths: list[tuple[int, int, int, int | None]] = field(default_factory=list)


def walk_frames(data: bytes, prev: bytes | None) -> ChainWalk:
    """Walk the frames of ``data`` from ``prev`` (``None``: an unknown predecessor, the
    first frame's link is not checked). Never raises on any input."""
    walk = ChainWalk(head=prev if prev is not None else GENESIS)
    view = memoryview(data)
    pos, n, size = 0, 0, len(data)
    while pos < size:
        if size - pos < 4:
            walk.torn_at = pos
            break
        length = int.from_bytes(view[pos:pos + 4], "little")
        end = pos + 4 + length
        if length == 0 or length > MAX_FRAME or end + HASH_LEN > size:
            # No boundary after it is known: look for the next frame that verifies from
            # the 32 bytes before it (the hash this one stored), and read on from there.
            after = _resync(view, pos, size)
            if after is None and 0 < length <= MAX_FRAME:
                walk.torn_at = pos  # a frame that runs past the end: a torn tail
                break
            walk.bad_lengths.append((n, pos, length, after))
            if after is None:
                break
            body = view[pos + 4:after - HASH_LEN]
            stored = bytes(view[after - HASH_LEN:after])
            if len(body) and (prev is not None or n > 0) and link(walk.head, body) == stored:
                # Only its length was changed: its content still reads.
                walk.frames.append(Frame(n, pos, body[0], bytes(body[1:])))
            walk.head = stored
            n += 1
            pos = after
            continue
        body = view[pos + 4:end]
        stored = bytes(view[end:end + HASH_LEN])
        if (prev is not None or n > 0) and link(walk.head, body) != stored:
            walk.mismatches.append((n, pos))
        walk.frames.append(Frame(n, pos, body[0], bytes(body[1:])))
        # After a mismatch the chain goes on from the hash as stored: the frames after a
        # changed one still verify (vak reads them one by one: the record is evidence).
        walk.head = stored
        n += 1
        pos = end + HASH_LEN
    return walk


#: How far past a frame whose length is broken the next verifying frame is looked for.
MAX_RESYNC_BYTES = 4 * 2**20


def _resync(view: memoryview, start: int, size: int) -> int | None:
    """Where the first whole frame after ``start`` lies whose hash verifies from the 32
    bytes before it (the stored hash of the frame it follows); ``None`` within
    :data:`MAX_RESYNC_BYTES`. A SHA-256 match is conclusive; most offsets are passed over
    on their length alone."""
    p = start + 4 + 1 + HASH_LEN
    stop = min(size - (4 + 1 + HASH_LEN), start + MAX_RESYNC_BYTES)
    while p <= stop:
        length = int.from_bytes(view[p:p + 4], "little")
        end = p + 4 + length
        if 0 < length <= MAX_FRAME and end + HASH_LEN <= size and view[p + 4] <= SEALED_FLAG \
                and link(bytes(view[p - HASH_LEN:p]), view[p + 4:end]) == view[end:end + HASH_LEN]:
            return p
        p += 1
    return None


_LOCAL = threading.local()


def _dctx() -> zstandard.ZstdDecompressor:
    # One decompressor per thread (they are not thread-safe; making one costs more than
    # decompressing a small entry).
    dctx: zstandard.ZstdDecompressor | None = getattr(_LOCAL, "dctx", None)
    if dctx is None:
        import zstandard

        dctx = _LOCAL.dctx = zstandard.ZstdDecompressor()
    return dctx


def decompress(data: bytes, limit: int = MAX_ENTRY_BYTES) -> bytes:
    """zstd-decompress ``data`` (frames with or without a content size), refusing more
    than ``limit`` bytes.

    Raises
    ------
    ValueError
        Not zstd, truncated, or larger than ``limit``.
    """
    # zstandard is imported on first use (a command reading no segment ledger never
    # loads it); after that the import is a dictionary look-up.
    import zstandard

    try:
        size = zstandard.frame_content_size(data)
        if 0 <= size <= limit:
            # The size is in the frame header (vak's and most writers'): one call.
            out: bytes = _dctx().decompress(data, max_output_size=limit)
            if len(out) != size:
                raise ValueError("the frame's content size does not match its content")
            return out
        if size > limit:
            raise ValueError(f"decompresses to more than {limit:,} bytes")
        with _dctx().stream_reader(io.BytesIO(data)) as reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as err:
        raise ValueError(f"not zstd ({err})") from None
    if len(out) > limit:
        raise ValueError(f"decompresses to more than {limit:,} bytes")
    return out


@dataclass(frozen=True, slots=True)
class SealEntry:
    """One entry of ``seals.log``: ``seal <segment> <entries> <head hex> <0|1>``."""

    segment: int
    entries: int
    head: bytes
    compressed: bool

    @classmethod
    def decode(cls, data: bytes) -> SealEntry | None:
        """Parse a seal entry as vak does; ``None`` when malformed."""
        try:
            parts = data.decode("ascii").split(" ")
            if len(parts) != 5 or parts[0] != "seal" or len(parts[3]) != 64:
                return None
            if not (parts[1].isdigit() and parts[2].isdigit()):
                return None
            return cls(int(parts[1]), int(parts[2]), bytes.fromhex(parts[3]), parts[4] == "1")
        except (UnicodeDecodeError, ValueError):
            return None

    def encode(self) -> bytes:
        """The entry's bytes as vak writes them."""
        return (f"seal {self.segment} {self.entries} {self.head.hex()} "
                f"{int(self.compressed)}").encode("ascii")


@dataclass(frozen=True, slots=True)
class VerifiedSegment:
    """A sealed segment a night verified clean: its file as listed (name, size, version
    token), the SHA-256 of its bytes and its frames (all, and sealed ones)."""

    number: int
    name: str
    size: int
    version: str | None
    sha256: str
    frames: int
    sealed_frames: int


@dataclass(frozen=True, slots=True)
class SegmentCheckpoint:
    """What a night verified of one segment ledger (a monitor's checkpoint, as
    Certificate Transparency monitors keep one per log).

    ``seals`` are the seal entries of ``seals.log`` (segment -> entries, head hex);
    ``verified`` the sealed segments verified clean; ``open_segment`` the number of the
    open segment read (0: none), ``open_bytes`` the bytes of its complete frames and
    ``open_sha256`` their SHA-256.
    """

    seals: tuple[tuple[int, int, str], ...] = ()
    verified: tuple[VerifiedSegment, ...] = ()
    open_segment: int = 0
    open_bytes: int = 0
    open_sha256: str = ""

    def to_json(self) -> str:
        """The checkpoint as the ``segments`` column of the ``checkpoints`` table."""
        return orjson.dumps({
            "v": 1, "seals": [list(s) for s in self.seals],
            "verified": [[v.number, v.name, v.size, v.version, v.sha256, v.frames,
                          v.sealed_frames] for v in self.verified],
            "open": [self.open_segment, self.open_bytes, self.open_sha256],
        }).decode()

    @classmethod
    def from_json(cls, text: str | None) -> SegmentCheckpoint | None:
        """Read a ``segments`` column; ``None`` when empty or not one (the ledger is
        then read whole and checked on its projection, as before checkpoints)."""
        if not text:
            return None
        try:
            doc = orjson.loads(text)
            seals = tuple((int(n), int(e), str(h)) for n, e, h in doc["seals"])
            verified = tuple(VerifiedSegment(int(n), str(name), int(size),
                                             None if v is None else str(v), str(sha),
                                             int(f), int(sf))
                             for n, name, size, v, sha, f, sf in doc["verified"])
            n, b, sha = doc["open"]
            return cls(seals, verified, int(n), int(b), str(sha))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def seal(self, n: int) -> tuple[int, str] | None:
        """The seal entry of segment ``n`` as verified (entries, head hex)."""
        return next(((e, h) for m, e, h in self.seals if m == n), None)

    def segment(self, n: int) -> VerifiedSegment | None:
        """Segment ``n``'s record, when it was verified sealed and clean."""
        return next((v for v in self.verified if v.number == n), None)


@dataclass(slots=True)
class SegmentReport:
    """A segment ledger's integrity, complete once its lines are consumed."""

    findings: list[Finding] = field(default_factory=list)
    #: Complete frames read across the segments (the ledger's entries, keyless).
    frames: int = 0
    #: Of those, frames sealed under the scope key, and frames opened.
    sealed_frames: int = 0
    opened_frames: int = 0
    segments: int = 0
    scope: str | None = None
    #: Whether some segment was dropped by retention (its seal entry kept).
    dropped: bool = False
    #: Why the content could not be read (no key, shredded scope), else ``None``.
    sealed_reason: str | None = None
    #: Hex SHA-256 of the last frame read (the chain's head), else ``None``.
    head: str | None = None
    #: Against a previous night's checkpoint: ``history_truncated`` /
    #: ``history_rewritten`` findings (a seal entry, a sealed segment's bytes or the open
    #: segment's verified frames that changed). Empty without a checkpoint.
    history: list[Finding] = field(default_factory=list)
    #: What this reading verified, for the next night (docs/segments.md).
    checkpoint: SegmentCheckpoint | None = None
    #: Bytes of member files read (unchanged sealed segments skipped are not).
    bytes_read: int = 0
    #: Sealed segments not read: unchanged since the checkpoint verified them.
    skipped_segments: int = 0

    @property
    def content(self) -> str:
        """``plain`` (no frame sealed), ``opened`` (every sealed frame opened) or
        ``sealed`` (the content was not read: no key)."""
        if self.sealed_reason is not None:
            return "sealed"
        return "opened" if self.sealed_frames else "plain"


class SegmentLines:
    """The JSONL projection of a segment ledger, as an iterator of lines; its
    :attr:`report` is complete once the iterator is exhausted."""

    def __init__(self, lines: Iterator[bytes], report: SegmentReport) -> None:
        self.report = report
        self._lines = lines

    def map(self, through: Callable[[Iterator[bytes]], Iterator[bytes]]) -> SegmentLines:
        """The same lines passed through ``through`` (the IO layer's line guard), with
        the same report."""
        return SegmentLines(through(self._lines), self.report)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._lines)


def read_segment_ledger(names: Iterable[str], read: Callable[[str], bytes],
                        keys: KeyProvider | None = None, *,
                        previous: SegmentCheckpoint | None = None,
                        members: Mapping[str, tuple[int, str | None]] | None = None
                        ) -> SegmentLines:
    """Verify one segment ledger and project its entries as JSONL lines.

    Parameters
    ----------
    names:
        The file names of the ledger directory (others than its members are ignored).
    read:
        Returns the bytes of one of those files (its errors propagate: the IO layer's).
    keys:
        The key provider; ``None``: verification only, the content stays sealed.
    previous:
        A previous night's checkpoint of the ledger: the history it verified is checked
        (``report.history``), and a sealed segment it verified clean whose file (size,
        version), seal entry are unchanged is not read again when the content stays
        sealed (no key: nothing of it is needed but its verification).
    members:
        File name -> (size, version token) as listed (needed to skip a segment).

    Returns
    -------
    SegmentLines
        Iterate it for the projection's lines; then its ``report`` holds the findings.
    """
    report = SegmentReport()

    def counted(name: str) -> bytes:
        data = read(name)
        report.bytes_read += len(data)
        return data

    return SegmentLines(_read(sorted(set(names)), counted, keys, report, previous,
                              members or {}), report)


def members_read(names: Iterable[str],
                 members: Mapping[str, tuple[int, str | None]] | None = None,
                 previous: SegmentCheckpoint | None = None) -> list[str]:
    """The members :func:`read_segment_ledger` reads of a directory holding ``names``, in
    its order (``KEY``, ``seals.log``, then each segment's file by number, both when a
    ``.log`` lies beside a ``.sealed``), for reading them ahead on an object store.

    With ``previous`` (give it for a night without keys only: with a key every segment
    is read), a sealed segment the checkpoint verified clean, whose file is listed with
    the same size and version, is left out: the reader skips it unless its seal entry
    changed, which only ``seals.log`` tells (it is then read when asked for).
    """
    present = set(names)
    files: dict[int, list[str]] = {}
    for name in sorted(present):
        parsed = segment_name(name)
        if parsed is not None and parsed[1] != "sealing":
            files.setdefault(parsed[0], []).append(name)
    order = [name for name in (KEY_FILE, SEALS) if name in present]
    members = members or {}
    for n in sorted(files):
        before = previous.segment(n) if previous is not None else None
        order += [name for name in sorted(files[n], key=lambda m: not m.endswith(".sealed"))
                  if before is None or not _listed_as_verified(before, name, members)]
    return order


def _listed_as_verified(before: VerifiedSegment, name: str,
                        members: Mapping[str, tuple[int, str | None]]) -> bool:
    """Whether ``name`` is the sealed segment file a night verified clean (every frame
    sealed), listed again with the size and version it had then."""
    return (before.name == name and before.version is not None
            and members.get(name) == (before.size, before.version)
            and before.sealed_frames == before.frames > 0)


def _at(name: str, index: int | None = None, offset: int | None = None) -> str:
    where = name
    if index is not None:
        where += f" frame {index}"
    if offset is not None:
        where += f" byte {offset}"
    return where


class _Content:
    """Opens frames into JSONL projection lines; counts and reports the failures."""

    def __init__(self, key: bytes | None, report: SegmentReport) -> None:
        self.key = key
        self.report = report
        self.prev: str | None = None
        self.unreadable = 0
        #: Why there is no key, when known (a shredded scope).
        self.why: str | None = None
        self._open: Callable[[bytes, bytes], bytes | None] | None = None

    def fail(self, where: str, why: str) -> None:
        self.unreadable += 1
        if self.unreadable <= MAX_LISTED_FRAMES:
            self.report.findings.append(Finding(Code.FRAME_UNREADABLE, None, None,
                                                f"{where}: {why}"))

    def line(self, frame: Frame, where: str) -> bytes | None:
        """The projection line of a frame, ``None`` when it cannot be read."""
        payload = frame.payload
        if frame.flags & SEALED_FLAG:
            if self.key is None:
                return None
            if self._open is None:
                self._open = opener(self.key)
            opened = self._open(payload, frame.index.to_bytes(8, "little"))
            if opened is None:
                self.fail(where, "does not open under the scope key (another key, or "
                                 "changed before it was chained)")
                return None
            payload = opened
            self.report.opened_frames += 1
        try:
            raw = decompress(payload)
        except ValueError as err:
            self.fail(where, f"entry {err}")
            return None
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self.fail(where, "entry is not JSON")
            return None
        if type(obj) is not dict:
            self.fail(where, "entry is not a JSON object")
            return None
        start = _ENVELOPE.match(raw)
        if start is not None and b"\n" not in raw and "prev_hash" not in obj:
            # The entry's own bytes, prev_hash spliced in after ts where vak's JSONL writer
            # put it: a re-serialisation would lose what a parse loses (the second
            # ``kind`` of vak's ``work`` entries).
            if self.prev is not None and obj.get("kind") != "header":
                raw = b"%s,\"prev_hash\":\"%s\"%s" % (raw[:start.end()], self.prev.encode(),
                                                    raw[start.end():])
            self.prev = hashlib.sha256(raw).hexdigest()
            return raw + b"\n"
        return self._project(obj)

    def _project(self, obj: dict[str, object]) -> bytes:
        # The JSONL envelope: prev_hash right after ts (where vak's JSONL writer put it),
        # chaining the projection's own lines; none on the header.
        out: dict[str, object] = {}
        header = obj.get("kind") == "header"
        for k, v in obj.items():
            if k == "prev_hash":
                continue
            out[k] = v
            if k == "ts" and not header and self.prev is not None:
                out["prev_hash"] = self.prev
        try:
            line = orjson.dumps(out)
        except TypeError:  # an integer beyond 64 bits: re-read as text by the reader
            line = orjson.dumps({k: v for k, v in out.items() if k != "prev_hash"})
        self.prev = hashlib.sha256(line).hexdigest()
        return line + b"\n"

    def finish(self) -> None:
        if self.unreadable > MAX_LISTED_FRAMES:
            self.report.findings.append(Finding(
                Code.FRAME_UNREADABLE, None, None,
                f"{self.unreadable - MAX_LISTED_FRAMES} more frames unreadable"))


def _seals(data: bytes, report: SegmentReport) -> dict[int, SealEntry]:
    """The seal entries of ``seals.log`` (itself a chain from GENESIS, plaintext)."""
    walk = walk_frames(data, GENESIS)
    for index, offset in walk.mismatches:
        report.findings.append(Finding(Code.SEALS_LOG_BROKEN, None, None,
                                       f"{_at(SEALS, index, offset)}: hash does not match"))
    for index, offset, length, after in walk.bad_lengths:
        report.findings.append(Finding(
            Code.SEALS_LOG_BROKEN, None, None,
            f"{_at(SEALS, index, offset)}: frame length {length:,} is wrong; "
            + _resumed(len(data), offset, after)))
    if walk.torn_at is not None:
        report.findings.append(Finding(
            Code.SEALS_LOG_TORN_TAIL, None, None,
            f"{_at(SEALS, len(walk.frames), walk.torn_at)}: incomplete last frame "
            f"({len(data) - walk.torn_at:,} bytes)"))
    seals: dict[int, SealEntry] = {}
    for frame in walk.frames:
        entry = None
        if not frame.flags & SEALED_FLAG:
            try:
                entry = SealEntry.decode(decompress(frame.payload, 4096))
            except ValueError:
                entry = None
        where = _at(SEALS, frame.index, frame.offset)
        if entry is None:
            report.findings.append(Finding(Code.SEALS_LOG_BROKEN, None, None,
                                           f"{where}: not a seal entry"))
        elif entry.segment in seals and seals[entry.segment] != entry:
            report.findings.append(Finding(
                Code.SEALS_LOG_BROKEN, None, None,
                f"{where}: a second, different seal entry for segment {entry.segment}"))
        else:
            seals.setdefault(entry.segment, entry)
    return seals


def _sealed_frames(name: str, data: bytes, report: SegmentReport) -> bytes | None:
    """The frames of a ``.sealed`` file, or ``None`` (reported) when malformed."""
    if len(data) < len(MAGIC) + 1 or data[:len(MAGIC)] != MAGIC:
        report.findings.append(Finding(Code.SEALED_SEGMENT_MALFORMED, None, None,
                                       f"{_at(name, None, 0)}: no {MAGIC.decode()} magic"))
        return None
    flag = data[len(MAGIC)]
    if flag == 0:
        return data[len(MAGIC) + 1:]
    if flag == 1:
        try:
            return decompress(data[len(MAGIC) + 1:], MAX_SEGMENT_BYTES)
        except ValueError as err:
            report.findings.append(Finding(
                Code.SEALED_SEGMENT_MALFORMED, None, None,
                f"{_at(name, None, len(MAGIC) + 1)}: compressed segment {err}"))
            return None
    report.findings.append(Finding(Code.SEALED_SEGMENT_MALFORMED, None, None,
                                   f"{_at(name, None, len(MAGIC))}: flag {flag} is neither "
                                   "0 (frames) nor 1 (zstd of the frames)"))
    return None


def _read(names: list[str], read: Callable[[str], bytes], keys: KeyProvider | None,
          report: SegmentReport, previous: SegmentCheckpoint | None = None,
          members: Mapping[str, tuple[int, str | None]] | None = None) -> Iterator[bytes]:
    add = report.findings.append
    files: dict[int, set[str]] = {}
    for name in names:
        parsed = segment_name(name)
        if parsed is not None:
            files.setdefault(parsed[0], set()).add(parsed[1])
    key: bytes | None = None
    if KEY_FILE in names:
        try:
            scope = read(KEY_FILE).decode("utf-8").strip()
        except UnicodeDecodeError:
            scope = ""
        report.scope = scope or None
    if report.scope is not None and keys is not None:
        key = keys.scope_key(report.scope)
        if key is not None and len(key) != KEY_LEN:
            key = None  # a provider's bad value: no key, never a crash
    seals = _seals(read(SEALS), report) if SEALS in names else {}
    history = _History(previous, report)
    history.seals(seals)
    members = members or {}
    verified: list[VerifiedSegment] = []
    opened: tuple[int, int, str] = (0, 0, "")
    content = _Content(key, report)
    if key is None and report.scope is not None and keys is not None \
            and keys.shredded(report.scope):
        content.why = "the scope is shredded (its key destroyed)"
    numbers = set(files) | set(seals)
    last = max(numbers, default=0)
    newest_sealed = max(seals, default=0)
    prev: bytes | None = GENESIS
    for n in range(1, last + 1):
        kinds = files.get(n, set())
        seal = seals.get(n)
        log, sealed = f"seg-{n:08d}.log", f"seg-{n:08d}.sealed"
        if "sealing" in kinds:
            add(Finding(Code.SEAL_INTERRUPTED, None, None,
                        f"seg-{n:08d}.sealing: leftover of an interrupted seal (vak's "
                        "recovery deletes it); not read"))
        use: str | None = None
        if "log" in kinds and "sealed" in kinds:
            # The .log wins until seals.log holds the segment's seal entry.
            use = sealed if seal is not None else log
            add(Finding(Code.LOG_BESIDE_SEALED, None, None,
                        f"{log} beside {sealed}: an interrupted seal; "
                        f"{use} read (the seal entry is "
                        f"{'recorded' if seal is not None else 'not recorded'})"))
        elif "sealed" in kinds:
            use = sealed
        elif "log" in kinds:
            use = log
        if use is None:
            if seal is not None and n != newest_sealed:
                report.dropped = True
                add(Finding(Code.SEGMENT_DROPPED, None, None,
                            f"segment {n}: dropped by retention ({seal.entries} entries; "
                            "its seal entry kept, the chain after it verified from its "
                            "recorded head)"))
                prev = seal.head
            elif seal is not None:
                add(Finding(Code.SEGMENT_MISSING, None, None,
                            f"segment {n}: the newest sealed segment is gone (retention "
                            f"never drops it); {seal.entries} entries lost"))
                prev = seal.head
            else:
                add(Finding(Code.SEGMENT_MISSING, None, None,
                            f"segment {n}: no file and no seal entry (a gap in the "
                            "numbering)"))
                prev = None
            history.gone(n, retention=seal is not None and n != newest_sealed)
            continue
        before = previous.segment(n) if previous is not None else None
        if key is None and seal is not None and before is not None \
                and _listed_as_verified(before, use, members) and history.same_seal(n, seal):
            # Verified clean before, file and seal entry unchanged, and its content is
            # not read tonight (no key): reading it again would find what it found.
            report.segments += 1
            report.skipped_segments += 1
            report.frames += before.frames
            report.sealed_frames += before.sealed_frames
            if report.sealed_reason is None:
                report.sealed_reason = _why_sealed(report, content)
            report.head = seal.head.hex()
            verified.append(before)
            prev = seal.head
            continue
        report.segments += 1
        data = read(use)
        frames = data if use.endswith(".log") else _sealed_frames(use, data, report)
        if use.endswith(".sealed"):
            history.sealed_bytes(before, use, data)
        if frames is None:
            prev = seal.head if seal is not None else None
            continue
        history.open_segment(n, frames)
        walk = walk_frames(frames, prev)
        yield from _segment(use, n, walk, frames, seal, prev, content, report)
        if use.endswith(".log"):
            end = walk.torn_at if walk.torn_at is not None else len(frames)
            opened = (n, end, hashlib.sha256(frames[:end]).hexdigest())
        elif seal is not None and not walk.mismatches and not walk.bad_lengths \
                and walk.torn_at is None and len(walk.frames) == seal.entries \
                and walk.head == seal.head:
            verified.append(VerifiedSegment(
                n, use, len(data), members.get(use, (len(data), None))[1],
                hashlib.sha256(data).hexdigest(), len(walk.frames),
                sum(1 for f in walk.frames if f.flags & SEALED_FLAG)))
        if (use.endswith(".log") and n < last and seal is None
                and any(k for m, k in files.items() if m > n)):
            add(Finding(Code.SEGMENT_NOT_SEALED, None, None,
                        f"{use}: an open segment with later segments after it and no "
                        "seal entry (vak seals a segment before it opens the next)"))
        if use.endswith(".sealed") and seal is None:
            add(Finding(Code.SEALED_SEGMENT_UNRECORDED, None, None,
                        f"{use}: sealed, but seals.log holds no seal entry for it"))
        prev = seal.head if seal is not None else walk.head
    history.beyond(last)
    report.checkpoint = SegmentCheckpoint(
        tuple((n, s.entries, s.head.hex()) for n, s in sorted(seals.items())),
        tuple(verified), *opened)
    content.finish()
    if report.sealed_frames > report.opened_frames and report.sealed_reason is None:
        report.sealed_reason = "content not opened"
    if report.sealed_reason is not None:
        add(Finding(Code.CONTENT_SEALED, None, None,
                    f"{report.sealed_frames:,} frames sealed under scope "
                    f"{(report.scope or '?')[:120]!r}: {report.sealed_reason}; verified "
                    "without reading their content"))


class _History:
    """Checks a ledger against a previous night's checkpoint: what was verified must
    still be there, unchanged (``report.history``)."""

    def __init__(self, previous: SegmentCheckpoint | None, report: SegmentReport) -> None:
        self.previous = previous
        self.report = report

    def _break(self, code: Code, detail: str) -> None:
        self.report.history.append(Finding(code, None, None, detail))

    def seals(self, seals: dict[int, SealEntry]) -> None:
        """Every seal entry verified before is still in ``seals.log``, unchanged."""
        for n, entries, head in self.previous.seals if self.previous else ():
            now = seals.get(n)
            if now is None:
                self._break(Code.HISTORY_TRUNCATED,
                            f"{SEALS}: the seal entry of segment {n} verified before "
                            f"({entries} entries, head {head[:16]}…) is gone")
            elif (now.entries, now.head.hex()) != (entries, head):
                self._break(Code.HISTORY_REWRITTEN,
                            f"{SEALS}: segment {n} re-sealed: its seal entry said {entries} "
                            f"entries, head {head[:16]}…; now {now.entries}, "
                            f"{now.head.hex()[:16]}…")

    def same_seal(self, n: int, seal: SealEntry) -> bool:
        return self.previous is not None and \
            self.previous.seal(n) == (seal.entries, seal.head.hex())

    def sealed_bytes(self, before: VerifiedSegment | None, name: str, data: bytes) -> None:
        """A sealed segment verified before still has the bytes it had."""
        if before is not None and before.name == name \
                and hashlib.sha256(data).hexdigest() != before.sha256:
            self._break(Code.HISTORY_REWRITTEN,
                        f"{name}: its bytes changed since they were verified "
                        f"({before.size:,} bytes then, {len(data):,} now)")

    def open_segment(self, n: int, frames: bytes) -> None:
        """The open segment's frames verified before are the first bytes of its frames
        now (still open, or sealed since)."""
        p = self.previous
        if p is None or n != p.open_segment or not p.open_bytes:
            return
        name = f"seg-{n:08d}"
        if len(frames) < p.open_bytes:
            self._break(Code.HISTORY_TRUNCATED,
                        f"{name}: {len(frames):,} bytes of frames, shorter than the "
                        f"{p.open_bytes:,} verified before")
        elif hashlib.sha256(frames[:p.open_bytes]).hexdigest() != p.open_sha256:
            self._break(Code.HISTORY_REWRITTEN,
                        f"{name}: the first {p.open_bytes:,} bytes of frames verified "
                        "before no longer hash the same")

    def gone(self, n: int, *, retention: bool) -> None:
        """Segment ``n`` has no file: a break when it held verified frames, unless
        retention dropped it (its seal entry kept)."""
        p = self.previous
        if p is None or retention:
            return
        if p.segment(n) is not None or (n == p.open_segment and p.open_bytes):
            self._break(Code.HISTORY_TRUNCATED,
                        f"segment {n}: its frames verified before are gone")

    def beyond(self, last: int) -> None:
        """Segments verified before above the highest one there now."""
        p = self.previous
        if p is None:
            return
        highest = max([p.open_segment if p.open_bytes else 0,
                       *(v.number for v in p.verified)], default=0)
        if highest > last:
            self._break(Code.HISTORY_TRUNCATED,
                        f"segment {highest}: verified before, now the highest segment is "
                        f"{last}")


def _segment(name: str, n: int, walk: ChainWalk, data: bytes, seal: SealEntry | None,
             prev: bytes | None, content: _Content,
             report: SegmentReport) -> Iterator[bytes]:
    add = report.findings.append
    sealed_file = name.endswith(".sealed")
    for index, offset in walk.mismatches:
        code = (Code.SEGMENT_DISCONTINUITY if index == 0 and n > 1
                else Code.FRAME_HASH_MISMATCH)
        why = (f"does not chain from the head of segment {n - 1}" if code is
               Code.SEGMENT_DISCONTINUITY else "hash does not match (the chain is broken "
               "here; the frames after it are read from its stored hash)")
        add(Finding(code, None, None, f"{_at(name, index, offset)}: {why}"))
    for index, offset, length, after in walk.bad_lengths:
        add(Finding(Code.FRAME_LENGTH, None, None,
                    f"{_at(name, index, offset)}: frame length {length:,} is wrong (out of "
                    f"1 to {MAX_FRAME:,}, or past the end); " + _resumed(len(data), offset,
                                                                       after)))
    if walk.torn_at is not None:
        code = Code.SEALED_SEGMENT_MISMATCH if sealed_file else Code.FRAME_TORN_TAIL
        add(Finding(code, None, None,
                    f"{_at(name, len(walk.frames), walk.torn_at)}: incomplete last frame "
                    f"({len(data) - walk.torn_at:,} bytes; "
                    f"{'a sealed segment has none' if sealed_file else 'a crash mid-append'})"))
    if seal is not None and (len(walk.frames) != seal.entries or walk.head != seal.head):
        add(Finding(Code.SEALED_SEGMENT_MISMATCH, None, None,
                    f"{name}: {len(walk.frames)} frames, head {walk.head.hex()[:16]}…; "
                    f"its seal entry says {seal.entries}, {seal.head.hex()[:16]}…"))
    for frame in walk.frames:
        report.frames += 1
        if frame.flags & SEALED_FLAG:
            report.sealed_frames += 1
            if content.key is None and report.sealed_reason is None:
                report.sealed_reason = _why_sealed(report, content)
        if report.sealed_reason is not None:
            continue  # verified only: no content is read once some cannot be
        line = content.line(frame, _at(name, frame.index, frame.offset))
        if line is not None:
            yield line
    if walk.frames:
        report.head = walk.head.hex()


def _resumed(size: int, offset: int, after: int | None) -> str:
    if after is None:
        return f"{size - offset:,} bytes after it unread (no frame after it verifies)"
    return f"reading resumed at byte {after:,}, the next frame that verifies"


def _why_sealed(report: SegmentReport, content: _Content) -> str:
    if report.scope is None:
        return "no KEY file names the scope"
    return content.why or "no key for the scope"
