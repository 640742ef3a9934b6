"""Synthetic record-segment ledgers, clean and with each fault (docs/segments.md).

Written from the format as ``spec/vak-segments.md`` gives it (vak's ``records.rs``,
``segments.rs``): frames ``len:u32le | flags | payload | SHA-256(prev || len || body)``,
payload ``zstd(entry)`` (level 3), sealed frames ``nonce || AES-256-GCM || tag`` with the
frame's index in its segment (u64le) as additional data, ``.sealed`` files ``VAKSEG01``
+ flag (1: zstd of the whole segment, only when no frame is sealed) and a ``seals.log``
chain of ``seal <n> <entries> <head hex> <0|1>`` entries.

The entries are those of a generated JSONL session (:mod:`pipeline.synth.generator`)
without their ``prev_hash`` (chaining moved to the frames), so a ledger opened with its
key projects back to that session's lines. Deterministic in the seed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from random import Random

import orjson
import zstandard

from pipeline.io.storage import Location
from pipeline.ledger.keys import KEY_FILE_MAGIC, scope_file_name, seal_bytes, wrap_scope_key
from pipeline.ledger.layout import cwd_hash
from pipeline.ledger.segments import GENESIS, MAGIC, SEALS, SealEntry, link
from pipeline.ledger.types import Code
from pipeline.synth.generator import generate_session

#: The faults a segment ledger can carry -> the findings a correct audit reports with
#: the ledger's key (primary ones; without the key, ``frame_unreadable`` cannot be seen).
SEGMENT_FAULTS: dict[str, tuple[Code, ...]] = {
    "frame_hash_mismatch": (Code.FRAME_HASH_MISMATCH,),
    "frame_length": (Code.FRAME_LENGTH,),
    "frame_torn_tail": (Code.FRAME_TORN_TAIL,),
    "frame_unreadable": (Code.FRAME_UNREADABLE,),
    "segment_discontinuity": (Code.SEGMENT_DISCONTINUITY,),
    "sealed_segment_malformed": (Code.SEALED_SEGMENT_MALFORMED,),
    "sealed_segment_mismatch": (Code.SEALED_SEGMENT_MISMATCH,),
    "sealed_segment_unrecorded": (Code.SEALED_SEGMENT_UNRECORDED,),
    "seals_log_broken": (Code.SEALS_LOG_BROKEN,),
    "seals_log_torn_tail": (Code.SEALS_LOG_TORN_TAIL,),
    "seal_interrupted": (Code.SEAL_INTERRUPTED,),
    "log_beside_sealed": (Code.LOG_BESIDE_SEALED,),
    "segment_dropped": (Code.SEGMENT_DROPPED,),
    "segment_missing": (Code.SEGMENT_MISSING,),
    "segment_not_sealed": (Code.SEGMENT_NOT_SEALED,),
}
_ZSTD = zstandard.ZstdCompressor(level=3)


def compress(data: bytes) -> bytes:
    """zstd level 3, as vak's ``seal::compress``."""
    return _ZSTD.compress(data)


def frame(prev: bytes, flags: int, payload: bytes) -> tuple[bytes, bytes]:
    """One frame's bytes chained from ``prev``, and its hash."""
    body = bytes([flags]) + payload
    h = link(prev, body)
    return len(body).to_bytes(4, "little") + body + h, h


@dataclass
class SegmentLedger:
    """One generated segment ledger: its directory's files, key and ground truth.

    Attributes
    ----------
    path:
        ``agents/<agent>/sessions/<cwd hash>/<session id>`` (the directory).
    scope:
        The ``KEY`` file's scope name.
    key:
        The scope's 32-byte key (``None`` for a plain ledger: no frame sealed).
    files:
        File name -> bytes.
    fault:
        The injected fault (a key of :data:`SEGMENT_FAULTS`), or ``None``.
    expected:
        The codes a correct audit reports with the key (primary ones).
    entries:
        Frames a keyless audit counts.
    lines:
        The JSONL session the entries come from (what the projection reads as).
    """

    path: str
    session_id: str
    scope: str
    key: bytes | None
    files: dict[str, bytes]
    fault: str | None
    expected: tuple[Code, ...]
    entries: int
    lines: list[bytes] = field(repr=False, default_factory=list)


_PREV_HASH = re.compile(rb',"prev_hash":"[0-9a-f]{64}"')


def _entries(lines: Iterable[bytes]) -> list[bytes]:
    # Textually: a parse would lose the second ``kind`` of vak's ``work`` entries.
    return [_PREV_HASH.sub(b"", line.rstrip(b"\n"), count=1) for line in lines]


class _Writer:
    def __init__(self, rng: Random, key: bytes | None) -> None:
        self.rng = rng
        self.key = key

    def segment(self, entries: list[bytes], prev: bytes,
                bad: dict[int, str] | None = None) -> tuple[bytes, bytes, int]:
        """Frames of one segment from ``prev``; its bytes, head and entry count."""
        out, head = bytearray(), prev
        for i, entry in enumerate(entries):
            how = (bad or {}).get(i)
            payload = compress(entry)
            flags = 0
            if how == "not_zstd":
                payload = b"\x00not zstd"
            if self.key is not None:
                flags = 1
                aad = (i + (1 if how == "aad" else 0)).to_bytes(8, "little")
                payload = seal_bytes(self.key, self.rng.randbytes(12), payload, aad)
            data, head = frame(head, flags, payload)
            if how == "rewrite":
                # Stored bytes changed after writing (another nonce, or another zstd
                # level): the content still reads, only the link fails.
                again = (seal_bytes(self.key, self.rng.randbytes(12), compress(entry),
                                    i.to_bytes(8, "little")) if self.key is not None
                         else zstandard.ZstdCompressor(level=9).compress(entry) + b"")
                body = bytes([flags]) + again
                if body[1:] == payload:
                    body = bytes([flags]) + payload[:-1] + b"\x00" + payload[-1:]
                data = len(body).to_bytes(4, "little") + body + head
            out += data
        return bytes(out), head, len(entries)


def segment_ledger(seed: int, *, segments: int = 3, sealed: bool = True,
                   fault: str | None = None, turns: int = 3,
                   agent: str = "vak") -> SegmentLedger:
    """Generate one segment ledger.

    Parameters
    ----------
    seed:
        Everything follows from it (entries, key, nonces).
    segments:
        Number of segments (all but the last sealed; 3 or more for the faults that
        need an older sealed segment).
    sealed:
        Frames sealed under the scope key (vak's way) or plaintext (compressed whole
        when sealed into a ``.sealed`` file).
    fault:
        One of :data:`SEGMENT_FAULTS`, or ``None``.
    turns:
        Turns of the generated session the entries come from.
    """
    if fault is not None and fault not in SEGMENT_FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(SEGMENT_FAULTS)}")
    segments = max(segments, 3 if fault else 1)
    session = generate_session(seed, turns=turns, consistent=False)
    lines = list(session.lines())
    entries = _entries(lines)
    rng = Random(seed * 7919 + 17)
    key = hashlib.sha256(f"vakpipe-synth-key-{seed}".encode()).digest() if sealed else None
    writer = _Writer(rng, key)
    # Split the entries into segments, none empty.
    cuts = sorted(rng.sample(range(1, len(entries) - 1), segments - 1))  # last: 2 or more
    chunks = [entries[a:b] for a, b in zip([0, *cuts], [*cuts, len(entries)], strict=True)]
    files: dict[str, bytes] = {}
    seals: list[SealEntry] = []
    prev = GENESIS
    last = len(chunks)
    count = len(entries)
    for n, chunk in enumerate(chunks, 1):
        bad: dict[int, str] = {}
        if fault == "frame_unreadable" and n == last:
            bad[0] = "aad" if sealed else "not_zstd"
        if fault == "frame_hash_mismatch" and n == last:
            bad[min(1, len(chunk) - 1)] = "rewrite"
        start = prev
        if fault == "segment_discontinuity" and n == last:
            start = hashlib.sha256(b"another chain").digest()
        data, head, k = writer.segment(chunk, start, bad)
        name = f"seg-{n:08d}"
        if n == last or (fault == "segment_not_sealed" and n == 1):
            files[f"{name}.log"] = data
        else:
            compressed = key is None
            files[f"{name}.sealed"] = MAGIC + bytes([compressed]) + (
                compress(data) if compressed else data)
            seals.append(SealEntry(n, k, head, compressed))
            if fault == "log_beside_sealed" and n == last - 1:
                files[f"{name}.log"] = data  # a crash after the seal entry was recorded
        prev = head
    _apply(fault, files, seals, last, rng)
    files[SEALS] = _seals_log(seals, fault)
    if fault == "seals_log_torn_tail":
        files[SEALS] += b"\x05\x00\x00"
    scope = f"conversation:{session.session_id}"
    files["KEY"] = scope.encode() + b"\n"
    files["LOCK"] = b""
    if fault == "frame_torn_tail":
        count -= 1
    elif fault in ("segment_dropped", "segment_missing", "sealed_segment_malformed"):
        count -= len(chunks[0 if fault == "segment_dropped" else last - 2])
    path = (f"agents/{agent}/sessions/{cwd_hash(session.cwd)}/{session.session_id}")
    return SegmentLedger(path, session.session_id, scope, key, files, fault,
                         SEGMENT_FAULTS[fault] if fault else (), count, lines)


def _apply(fault: str | None, files: dict[str, bytes], seals: list[SealEntry], last: int,
           rng: Random) -> None:
    """Inject a fault that changes files after they were written."""
    log = f"seg-{last:08d}.log"
    older = f"seg-{last - 1:08d}.sealed"
    if fault == "frame_length":
        # The second frame's length zeroed: the reader finds the next frame by its hash,
        # and the zeroed one's content too (its body and hash are intact).
        first = int.from_bytes(files[log][:4], "little")
        at = 4 + first + 32
        files[log] = files[log][:at] + b"\x00\x00\x00\x00" + files[log][at + 4:]
    elif fault == "frame_torn_tail":
        files[log] = files[log][:len(files[log]) - rng.randrange(1, 30)]
    elif fault == "sealed_segment_malformed":
        files[older] = b"VAKSEG02" + files[older][8:]
    elif fault == "sealed_segment_mismatch":
        s = seals[-1]
        seals[-1] = SealEntry(s.segment, s.entries + 1, s.head, s.compressed)
    elif fault == "sealed_segment_unrecorded":
        seals.pop()
    elif fault == "seal_interrupted":
        files[f"seg-{last:08d}.sealing"] = MAGIC + b"\x00" + files[log][:20]
    elif fault == "segment_dropped":
        del files["seg-00000001.sealed"]
    elif fault == "segment_missing":
        del files[older]
        seals.pop()


def _seals_log(seals: list[SealEntry], fault: str | None) -> bytes:
    out, head = bytearray(), GENESIS
    for seal in seals:
        data, head = frame(head, 0, compress(seal.encode()))
        out += data
    if fault == "seals_log_broken" and out:
        out[-1] ^= 0x01  # the last seal entry's stored hash changed
    return bytes(out)


def write_segment_ledger(root: Location, ledger: SegmentLedger) -> None:
    """Write a ledger's files under ``root`` at its path."""
    fs = root.filesystem()
    base = root.join(ledger.path)
    root.makedirs(base)
    for name, data in ledger.files.items():
        fs.pipe_file(f"{base}/{name}", data)


def keys_json(ledgers: Iterable[SegmentLedger]) -> bytes:
    """The ``--keys`` file of some ledgers: scope -> key in hex."""
    return orjson.dumps({led.scope: led.key.hex() for led in ledgers if led.key is not None})


def vak_key_material(ledgers: Iterable[SegmentLedger], passphrase: str, *,
                     shredded: Iterable[str] = (), iterations: int = 1000,
                     seed: int = 0) -> tuple[str, dict[str, bytes]]:
    """vak's key material for some ledgers: the passphrase-sealed key file's text, and
    the tenant home's files (``keys/scopes/keys/<hex scope>`` wrapped under KEK version
    0; ``keys/scopes/tombstones/<hex scope>`` for each ``shredded`` scope, whose key
    file is gone). ``iterations`` is low: a test's PBKDF2 need not be slow."""
    rng = Random(seed)
    kek = rng.randbytes(32)
    gone = set(shredded)
    files: dict[str, bytes] = {}
    for led in ledgers:
        if led.key is None:
            continue
        name = scope_file_name(led.scope)
        if led.scope in gone:
            files[f"keys/scopes/tombstones/{name}"] = b""
        else:
            files[f"keys/scopes/keys/{name}"] = wrap_scope_key(0, kek, led.scope, led.key,
                                                               rng.randbytes(12))
    text = f"{rng.randbytes(32).hex()}\n{rng.randbytes(48).hex()}\n{kek.hex()}"
    salt = rng.randbytes(16)
    secret = hashlib.pbkdf2_hmac("sha256", passphrase.encode(), salt, iterations)
    sealed = seal_bytes(secret, rng.randbytes(12), text.encode(), KEY_FILE_MAGIC.encode())
    return f"{KEY_FILE_MAGIC}\n{iterations}\n{salt.hex()}\n{sealed.hex()}\n", files


def write_segment_fleet(root: Location, ledgers: int, *, seed: int = 0,
                        faults: bool = False) -> tuple[list[SegmentLedger], bytes]:
    """Write ``ledgers`` segment ledgers under ``root`` (sealed under their scope keys,
    every fourth plain; with ``faults``, every other one carries the next fault of
    :data:`SEGMENT_FAULTS`) and ``segment-ground-truth.json`` (path -> fault, expected
    codes, entries); return them and their ``--keys`` file's bytes."""
    names = sorted(SEGMENT_FAULTS)
    made = []
    for i in range(ledgers):
        fault = names[(i // 2) % len(names)] if faults and i % 2 else None
        made.append(segment_ledger(seed * 100_003 + i, sealed=i % 4 != 3, fault=fault,
                                   segments=3))
    for led in made:
        write_segment_ledger(root, led)
    truth = {led.path: {"fault": led.fault, "expected": [c.text for c in led.expected],
                        "entries": led.entries, "sealed": led.key is not None}
             for led in made}
    root.filesystem().pipe_file(root.join("segment-ground-truth.json"),
                                orjson.dumps(truth, option=orjson.OPT_INDENT_2))
    return made, keys_json(made)
