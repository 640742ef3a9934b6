"""The ledger writer of the generator: serialisation, hash chain and fault injection. Pure.

:func:`write` turns a stream of clean entries into physical lines exactly as vak writes
them (compact JSON in vak's key order, ``prev_hash`` over the previous line's bytes,
``\\n``-terminated) and, when asked, damages that stream in one place the way a crash,
a disk or a person would. Each fault is described by a :class:`FaultSpec` fixed before
writing, so its ground truth (:func:`expected_findings`) is known without generating.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from random import Random

import orjson

from pipeline.ledger.types import Code
from pipeline.ledger.wire import RawEntry, serialize


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """Ground truth: one finding a correct audit must report.

    Attributes
    ----------
    code:
        Finding code as the spec writes it (``"hash_mismatch"``, ...).
    line:
        1-based physical line of the finding, ``None`` when it has none.
    detail:
        What was done to the bytes, for humans.
    """

    code: str
    line: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Where and how one session is damaged.

    Attributes
    ----------
    name:
        Fault name (one of :data:`FAULTS`, conformance naming).
    index:
        0-based index, in the clean entry stream, of the entry the fault hits.
    cut:
        A fraction in (0, 1) placing the tear or the damage inside that entry's line.
    count:
        Number of unchained entries (``unchained_legacy`` only).
    token:
        A fresh id (orphan's parent, second header's id).
    """

    name: str
    index: int = 0
    cut: float = 0.5
    count: int = 0
    token: str = ""


# name -> (finding code, first allowed index, last allowed index as an offset from the
# number of entries n, line of the finding minus the entry index). Middle faults need an
# entry after the hit one, because that entry's prev_hash is what exposes them.
_TABLE: dict[str, tuple[Code, int, int, int]] = {
    "torn_tail": (Code.TORN_TAIL, -1, -1, 1),
    "recovered_torn": (Code.TORN_WRITE_RECOVERED, 1, -1, 1),
    "torn_merge": (Code.TORN_MERGE, 1, -2, 1),
    "damaged_middle": (Code.DAMAGED_ENTRY, 1, -2, 1),
    "invalid_utf8": (Code.DAMAGED_ENTRY, 1, -2, 1),
    "nan_literal": (Code.DAMAGED_ENTRY, 1, -2, 1),
    "not_object": (Code.DAMAGED_ENTRY, 1, -2, 1),
    "missing_field": (Code.DAMAGED_ENTRY, 1, -2, 1),
    "deep_nesting": (Code.DAMAGED_ENTRY, 1, -2, 1),
    "tamper_edit": (Code.HASH_MISMATCH, 1, -2, 2),
    "delete_line": (Code.HASH_MISMATCH, 1, -2, 1),
    "swap_lines": (Code.HASH_MISMATCH, 1, -2, 1),
    "orphan_parent": (Code.ORPHAN_PARENT, 1, -1, 1),
    "duplicate_id": (Code.DUPLICATE_ID, 3, -1, 1),
    "second_header": (Code.SECOND_HEADER, 1, -1, 1),
    "unchained_legacy": (Code.UNCHAINED, 1, -1, 1),
    "cwd_hash_mismatch": (Code.CWD_HASH_MISMATCH, 0, 0, 1),
    "session_id_mismatch": (Code.SESSION_ID_MISMATCH, 0, 0, 1),
}
#: Every fault the generator can inject, in a fixed order.
FAULTS: tuple[str, ...] = tuple(_TABLE)
#: Faults that only change where the session is stored, not its bytes.
PATH_FAULTS = frozenset({"cwd_hash_mismatch", "session_id_mismatch"})
_DETAIL = {
    "torn_tail": "last line cut mid-way, no newline (crash mid-append)",
    "recovered_torn": "a prefix of the entry sealed by a newline, then the entry in full",
    "torn_merge": "torn fragment, then the next entry appended on the same line",
    "damaged_middle": "a run of the line's bytes overwritten with NUL",
    "invalid_utf8": "an invalid UTF-8 sequence inserted into a string",
    "nan_literal": "ts replaced by the bare literal NaN",
    "not_object": "the line wrapped in a JSON array",
    "missing_field": "the envelope's kind key removed",
    "deep_nesting": "a 2000-deep nested array added to the object",
    "tamper_edit": "a value edited in place, JSON still valid (exposed by the next line)",
    "delete_line": "a middle line deleted (exposed by the line after it)",
    "swap_lines": "two adjacent middle lines swapped",
    "orphan_parent": "parent_id points at an entry that never existed",
    "duplicate_id": "the entry reuses the id of the entry before it",
    "second_header": "a second header entry written in the middle",
    "unchained_legacy": "entries right after the header written without prev_hash",
    "cwd_hash_mismatch": "session stored under another project's directory",
    "session_id_mismatch": "session file named after another session id",
}


def plan_fault(name: str, n: int, rng: Random, token: str) -> FaultSpec:
    """Place fault ``name`` in a session of ``n`` entries (``n >= 5``).

    Parameters
    ----------
    name:
        One of :data:`FAULTS`.
    n:
        Number of entries of the clean session (header included).
    rng:
        Source of the placement; the same state gives the same spec.
    token:
        A fresh entry id for faults that invent one.
    """
    _, lo, hi, _ = _TABLE[name]
    if name == "unchained_legacy":
        return FaultSpec(name, 1, count=min(rng.randint(2, 4), n - 1))
    index = rng.randint(lo % n, hi % n) if name not in PATH_FAULTS else 0
    return FaultSpec(name, index, cut=rng.uniform(0.05, 0.95), token=token)


def expected_findings(spec: FaultSpec) -> tuple[InjectedFault, ...]:
    """The primary findings a correct audit reports for ``spec`` (spec section 2)."""
    code, _, _, offset = _TABLE[spec.name]
    detail = f"{spec.name}: {_DETAIL[spec.name]}"
    if spec.name == "unchained_legacy":
        return tuple(InjectedFault(code.text, k, detail) for k in range(2, spec.count + 2))
    return (InjectedFault(code.text, spec.index + offset, detail),)


def _digest(line: bytes) -> str:
    return hashlib.sha256(memoryview(line)[:-1]).hexdigest()


def _cut(line: bytes, frac: float) -> int:
    """A position strictly inside the line's body, so the prefix is never valid JSON."""
    return min(max(1, int((len(line) - 1) * frac)), len(line) - 2)


_OUTPUT_TOKENS = re.compile(rb'"output_tokens":(\d+)')


def _tamper(line: bytes, ts: str) -> bytes:
    """Edit a value in place so the line stays a valid entry (only the chain sees it)."""
    m = _OUTPUT_TOKENS.search(line)
    if m is not None:  # the realistic tamper: inflate billed usage
        return line[: m.start(1)] + str(int(m.group(1)) * 10 + 7).encode() + line[m.end(1) :]
    old = f'"ts":"{ts}"'.encode()
    digit = str((int(ts[-2]) + 1) % 10)
    return line.replace(old, f'"ts":"{ts[:-2]}{digit}Z"'.encode(), 1)


def _damage(name: str, line: bytes, e: RawEntry, frac: float) -> bytes:
    """Make the line no longer a valid entry, in the way ``name`` says."""
    body = line[:-1]
    if name == "damaged_middle":
        at = _cut(line, frac)
        run = min(16, len(body) - at)
        return body[:at] + b"\0" * run + body[at + run :] + b"\n"
    if name == "invalid_utf8":
        return body.replace(b'"ts":"', b'"ts":"\xc3\x28', 1) + b"\n"
    if name == "nan_literal":
        return body.replace(f'"ts":"{e.ts}"'.encode(), b'"ts":NaN', 1) + b"\n"
    if name == "not_object":
        return b"[" + body + b"]\n"
    if name == "missing_field":
        return body.replace(b'"kind":' + orjson.dumps(e.kind) + b",", b"", 1) + b"\n"
    # deep_nesting: deeper than any JSON parser's default limit
    return body[:-1] + b',"nest":' + b"[" * 2000 + b"]" * 2000 + b"}\n"


def write(
    entries: Iterable[RawEntry], spec: FaultSpec | None, written: list[int]
) -> Iterator[bytes]:
    """Serialise and chain ``entries``, injecting ``spec``; yield physical lines.

    Parameters
    ----------
    entries:
        The clean session, header first.
    spec:
        The fault to inject, or ``None``.
    written:
        ``written[0]`` is increased by the size of every line yielded (the session
        builder reads it to stop at a target size).

    Yields
    ------
    bytes
        One physical line each, with its ``\\n`` (a torn tail has none).
    """
    name = spec.name if spec is not None else ""
    unchained = spec.count if spec is not None and name == "unchained_legacy" else 0
    hits_one = spec is not None and name not in PATH_FAULTS and not unchained
    at = spec.index if spec is not None and hits_one else -1
    frac = spec.cut if spec is not None else 0.5
    tail: str | None = None  # digest of the last valid entry: what vak's writer chains to
    remap: dict[str, str] = {}  # ids lost or reused by a fault -> id later entries point at
    prefix = b""  # a torn fragment the next append lands on (torn_merge)
    held = b""  # a line written after its successor (swap_lines)
    header: RawEntry | None = None
    recent = ["", ""]  # ids of the two entries before this one
    for i, e in enumerate(entries):
        if remap and e.parent_id in remap:
            e = e._replace(parent_id=remap[e.parent_id])
        out: list[bytes] = []
        if i == 0:
            header = e
        elif i == at and name == "orphan_parent":
            e = e._replace(parent_id=spec.token if spec else "")
        elif i == at and name == "duplicate_id":
            # Reuse an id from just before, but not the parent's: that would make the
            # entry name itself as its parent, a second oddity.
            dup = recent[0] if recent[0] != e.parent_id else recent[1]
            remap[e.id] = dup
            e = e._replace(id=dup)
        elif i == at and name == "second_header" and header is not None:
            extra = serialize(header._replace(id=spec.token if spec else "", ts=e.ts), tail)
            tail = _digest(extra)
            out.append(extra)
        line = serialize(e, None if i <= unchained else tail)
        recent = [recent[1], e.id]
        if i != at or name in ("orphan_parent", "duplicate_id", "second_header"):
            tail = _digest(line)
            out.append(line)
        elif name == "torn_merge":
            # The entry is lost: vak reopens, chains to the last parseable line, and its
            # next append lands on the fragment. Later children hang from the lost
            # entry's parent, as vak's in-memory tail would after the reopen.
            prefix = line[: _cut(line, frac)]
            remap[e.id] = e.parent_id or ""
            continue
        elif name == "torn_tail":
            out.append(line[: _cut(line, frac)])
        elif name == "recovered_torn":
            tail = _digest(line)
            out += [line[: _cut(line, frac)] + b"\n", line]
        else:
            # Changed after writing: the writer chained the next entry to the original.
            tail = _digest(line)
            if name == "tamper_edit":
                out.append(_tamper(line, e.ts))
            elif name == "swap_lines":
                held = line
            elif name != "delete_line":
                out.append(_damage(name, line, e, frac))
        for o in out:
            if prefix:
                o, prefix = prefix + o, b""
            written[0] += len(o)
            yield o
        if held and i > at:
            written[0] += len(held)
            yield held
            held = b""
    for o in (prefix, held):  # only if a fault was placed at the very end
        if o:
            written[0] += len(o)
            yield o
