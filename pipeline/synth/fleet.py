"""Write a generated fleet (and its ground truth) to any fsspec location."""

from __future__ import annotations

import calendar
import hashlib
import json
import posixpath
import random
import time
from dataclasses import dataclass
from typing import Any

from pipeline.errors import UsageError
from pipeline.io.commit import write_small_file
from pipeline.io.storage import Location, printable, storage_error, storage_errors
from pipeline.ledger.reader import parse_entry
from pipeline.ledger.wire import RawEntry, rfc3339_ns, serialize, uuid7
from pipeline.synth.generator import generate_fleet

GROUND_TRUTH = "ground-truth.json"


@dataclass(frozen=True)
class WrittenFleet:
    """What :func:`write_fleet` wrote."""

    sessions: int
    bytes: int
    truth_path: str


def check_empty_target(out: Location) -> None:
    """Refuse to generate into a folder or prefix that holds anything (``vakpipe
    generate`` without ``--force``): a fleet added to another one mixes their sessions,
    and its ground truth would name only the new ones.

    Raises
    ------
    UsageError
        ``out`` holds objects.
    StorageError
        It cannot be listed.
    """
    fs = out.filesystem()
    try:
        fs.invalidate_cache(out.path)
        found = fs.find(out.path, maxdepth=None, withdirs=False) if fs.exists(out.path) else []
    except storage_errors() as err:
        raise storage_error(err, out.url) from err
    if found:
        first = printable(str(sorted(found)[0]), 80)
        raise UsageError(f"{out.url} is not empty ({len(found):,} objects, e.g. {first}): "
                         "generate writes a fleet into an empty folder; --force adds to it "
                         f"(and replaces {GROUND_TRUTH})")


def write_fleet(out: Location, *, sessions: int, seed: int, faults: bool = False,
                size_scale: float = 1.0, consistent: bool = True,
                noise: float = 0.0, exclusive: bool = False) -> WrittenFleet:
    """Generate a fleet and write it under ``out`` in the archive layout.

    Sessions are streamed line by line into their objects, so memory stays bounded
    whatever their size. The ground truth (injected faults, lines and bytes per
    session, in the shape of the conformance ``expected.json``) goes to
    ``out/ground-truth.json``, which an audit counts as a skipped object.
    ``consistent`` makes reported usage and card figures exactly what replay under rule
    set v1 computes (~10 MB/s: it tokenizes); ``noise`` perturbs reported usage by up to
    that fraction, as providers do. ``exclusive`` refuses a non-empty ``out``
    (:func:`check_empty_target`).
    """
    if exclusive:
        check_empty_target(out)
    fs = out.filesystem()
    truth: dict[str, dict[str, Any]] = {}
    total = 0
    try:
        for s in generate_fleet(sessions, seed, faults=faults, size_scale=size_scale,
                                consistent=consistent, noise=noise):
            n_lines = n_bytes = 0
            path = out.join(s.path)
            if out.protocol == "file":  # object stores have no folders to create
                fs.makedirs(posixpath.dirname(path), exist_ok=True)
            with fs.open(path, "wb") as f:
                for line in s.lines():
                    f.write(line)
                    n_lines += 1
                    n_bytes += len(line)
            total += n_bytes
            truth[s.path] = {
                "fault": s.fault,
                "findings": [{"line": x.line, "code": x.code} for x in s.faults],
                "lines": n_lines,
                "bytes": n_bytes,
            }
        truth_path = write_small_file(out, out.join(GROUND_TRUTH),
                                      json.dumps(truth, indent=1, sort_keys=True).encode())
    except storage_errors() as err:
        raise storage_error(err, out.url) from err
    return WrittenFleet(len(truth), total, truth_path)


def _ts_ns(ts: str) -> int:
    """Nanoseconds since the epoch of a valid entry's ``ts`` (RFC 3339, ``Z``)."""
    whole, _, frac = ts[:-1].partition(".")
    seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return seconds * 1_000_000_000 + int(frac.ljust(9, "0") or 0)


def grow_session(root: Location, path: str, *, entries: int = 3, seed: int = 0) -> int:
    """Append ``entries`` valid entries to one session, as vak's writer would.

    The new entries continue the head: a directive, the assistant's answer (with usage)
    and its receipt, repeated as needed, each chained to the line before it
    (``prev_hash``), parented on the entry before it, one second apart after the head's
    ``ts``. An audit of the grown session finds nothing new: it has a new turn and,
    from the second entry on, a new request. For exercising incremental runs (the
    nightly audit's tests and benchmark).

    Parameters
    ----------
    root:
        The archive.
    path:
        The session's path relative to ``root``.
    entries:
        How many entries to append.
    seed:
        Seeds the new entries' ids.

    Returns
    -------
    int
        Bytes appended.

    Raises
    ------
    ValueError
        When the session's last line is not a complete, valid entry (vak would append
        onto a torn tail: growing it would not be a clean append).
    """
    fs = root.filesystem()
    full = root.join(path)
    try:
        data = fs.cat_file(full)
    except storage_errors() as err:
        raise storage_error(err, root.url) from err
    lines = data.split(b"\n")
    if len(lines) < 2 or lines[-1]:
        raise ValueError(f"{path}: the last line is torn (no newline)")
    head, _, _ = parse_entry(lines[-2], len(lines) - 1)
    if head is None:
        raise ValueError(f"{path}: the last line is not a valid entry")
    provider, model = _provider_and_model(lines)
    rng = random.Random(seed)
    prev_hash = hashlib.sha256(lines[-2]).hexdigest()
    parent, ns = head.id, _ts_ns(head.ts)
    out: list[bytes] = []
    u = {"input_tokens": 12, "output_tokens": 48, "cache_read_input_tokens": 900,
         "cache_creation_input_tokens": 0}
    for i in range(entries):
        ns += 1_000_000_000
        ident = uuid7(ns // 1_000_000, rng.getrandbits(74))
        step = i % 3
        payload: dict[str, Any]
        if step == 0:
            kind, payload = "message", {"message": {"role": "user", "content": [
                {"type": "text", "text": f"Next step {i // 3 + 1}: check the ledger tail."}]}}
        elif step == 1:
            kind, payload = "message", {
                "message": {"role": "assistant", "content": [
                    {"type": "text", "text": "Checked: the tail verifies."}]},
                "meta": {"model": model, "stop_reason": "end_turn", "usage": u}}
        else:
            kind, payload = "receipt", {
                "purpose": "execute", "provider": provider, "model": model,
                "winning_attempt": 0,
                "attempts": [{"ordinal": 0, "reason": "initial", "domain": "unknown",
                              "settlement": "ok", "latency_ms": 1200, "usage": u}]}
        line = serialize(RawEntry(ident, parent, rfc3339_ns(ns), None, kind, payload),
                         prev_hash=prev_hash)
        out.append(line)
        prev_hash, parent = hashlib.sha256(line[:-1]).hexdigest(), ident
    suffix = b"".join(out)
    try:
        if root.protocol == "file":
            with fs.open(full, "ab") as f:
                f.write(suffix)
        else:  # object stores have no append: the object is written again
            fs.pipe_file(full, data + suffix)
    except storage_errors() as err:
        raise storage_error(err, root.url) from err
    return len(suffix)


def _provider_and_model(lines: list[bytes]) -> tuple[str, str]:
    """The provider and model of a session's last receipt (else its header's contract)."""
    for n in range(len(lines) - 1, -1, -1):
        if b'"kind":"receipt"' not in lines[n] and n:
            continue
        entry, _, _ = parse_entry(lines[n], n + 1)
        if entry is None or entry.kind not in ("receipt", "header"):
            continue
        source = entry.data.get("contract") if entry.is_header else entry.data
        if isinstance(source, dict) and isinstance(source.get("provider"), str) \
                and isinstance(source.get("model"), str):
            return source["provider"], source["model"]
    return "anthropic", "claude-sonnet-4-5"
