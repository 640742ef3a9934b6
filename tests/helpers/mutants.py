"""Mutated archives made from the project's own data, for the checks that every reader
of a line (the C kernel, pysimdjson, orjson) reads damaged real files alike and that the
C kernel neither crashes nor holds on to memory on them.

A mutant is a real session (a Claude Code or Codex transcript of ``tests/data/real``, a
ledger of the conformance corpus) with one to eight random edits of
the kinds a damaged or hostile file shows: a bit flipped, a JSON token (an escape, a lone
surrogate, a huge number, a key the readers look for, invalid UTF-8, deep nesting)
inserted or put in place of a string, bytes cut, a line truncated (its newline too),
repeated, swapped, dropped, or taken from another session. Long sessions are cut to a
window of 300 lines so that each mutant stays small and the edits land anywhere in it.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pipeline.io.storage import enumerate_sessions, resolve
from pipeline.run.batches import audit_batch
from pipeline.run.replay_batches import ReplayOptions, replay_batch
from tests.helpers.data_paths import CONFORMANCE, REAL
from tests.helpers.storage import table_rows


@dataclass(frozen=True)
class Source:
    """A session of the project's data: its path in an archive, and its lines."""

    path: str
    lines: tuple[bytes, ...]


#: What an edit may insert or put in place of a string.
TOKENS: tuple[bytes, ...] = (
    b'"', b"\\", b"\\u", b"\\ud800", b"\\udc00", b"\\u0000", b"{", b"}", b"[", b"]", b",",
    b":", b"1e400", b"-", b"0", b"-0", b"1.5", b"18446744073709551616",
    b"9223372036854775808", b"null", b"true", b"false", b"NaN", b"\xff", b"\xc3",
    b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b'"id"', b'"parent_id"', b'"uuid"',
    b'"parentUuid"', b'"type"', b'"progress"', b'"message"', b'"usage"', b'"user"',
    b'"assistant"', b'"content"', b'"kind"', b'"prev_hash"', b'"ts"', b'"timestamp"',
    b'"input_tokens"', b'"model"', b" ", b"\n", b"\r", b"\t", b"\x00", b'"a":1,',
    b"[" * 20, b'{"a":' * 40)
#: What a digit may become.
NUMBERS: tuple[bytes, ...] = (b"99999999999999999999", b"-1", b"1e5", b"0.5", b"00")
#: Lines a mutant keeps of a longer session.
WINDOW = 300
#: A task's tables, as rows: ``sessions``, ``findings`` and the run's further datasets.
Tables = dict[str, list[dict[str, Any]]]
#: What :func:`read` asks of a replay: every stage of it, the planner's included.
_REPLAY = ReplayOptions(planner=True)


@cache
def sources() -> tuple[Source, ...]:
    """Every session of ``tests/data`` a mutant may start from, with its archive path."""
    found: list[Source] = []

    def add(prefix: str, top: Path) -> None:
        for file in sorted(top.rglob("*.jsonl")):
            rel = file.relative_to(top).as_posix()
            found.append(Source(prefix + rel, tuple(file.read_bytes().splitlines(True))))

    add("agents/claude-code/projects/", REAL / "claude-code" / "projects")
    add("agents/codex/sessions/", REAL / "codex" / "sessions")
    add("", CONFORMANCE / "corpus")
    return tuple(found)


def mutate(lines: tuple[bytes, ...], rnd: random.Random) -> list[bytes]:
    """A copy of ``lines`` (cut to :data:`WINDOW` lines) with one to eight random edits."""
    out = list(lines)
    if len(out) > WINDOW:
        start = rnd.randrange(len(out) - WINDOW) if rnd.random() < 0.5 else 0
        out = out[start:start + WINDOW]
    for _ in range(rnd.choice((1, 1, 2, 3, 5, 8))):
        if not out:
            out.append(b"{}\n")
        i = rnd.randrange(len(out))
        line = out[i]
        at = rnd.randrange(len(line) + 1)
        edit = rnd.randrange(10)
        if edit == 0 and line:
            flipped = bytearray(line)
            flipped[min(at, len(line) - 1)] ^= 1 << rnd.randrange(8)
            line = bytes(flipped)
        elif edit == 1:
            line = line[:at] + rnd.choice(TOKENS) + line[at:]
        elif edit == 2:
            line = line[:at] + line[at + rnd.randrange(1, 40):]
        elif edit == 3:
            line = line[:at]
        elif edit == 4:
            out.insert(i, line)
        elif edit == 5:
            j = rnd.randrange(len(out))
            out[i], line = line, out[j]
            i = j
        elif edit == 6:
            other = rnd.choice(sources()).lines
            line = rnd.choice(other) if other else line
        elif edit == 7:
            opening = line.find(b'"', at)
            closing = line.find(b'"', opening + 1) if opening >= 0 else -1
            if closing >= 0:
                line = line[:opening] + rnd.choice(TOKENS) + line[closing + 1:]
        elif edit == 8:
            digit = next((k for k in range(at, len(line)) if 48 <= line[k] <= 57), None)
            if digit is not None:
                line = line[:digit] + rnd.choice(NUMBERS) + line[digit + 1:]
        else:
            del out[i]
            continue
        out[i] = line
    return out


def write_mutants(root: Path, seed: int, count: int) -> Iterator[Path]:
    """Write ``count`` mutants, each an archive of its own (``root/<n>/<its path>``, so a
    subagent's copy is audited without its parent, and no two collide); yield each
    archive's root."""
    rnd = random.Random(seed)
    for n in range(count):
        source = rnd.choice(sources())
        path = root / str(n) / source.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(mutate(source.lines, rnd)))
        yield root / str(n)


def read(root: Path) -> list[Tables]:
    """Audit and replay (with the planner) every session of the archive at ``root`` as
    one task each, as a worker does; return every table of both, as rows in their order
    (:func:`~tests.helpers.storage.table_rows`)."""
    archive = resolve(str(root))
    batch = enumerate_sessions(archive).sessions
    results = (audit_batch(archive, 0, batch),
               replay_batch(archive, 0, batch, _REPLAY, {o.key.path: None for o in batch}))
    return [{name: table_rows(table) for name, table in
             {"sessions": r.sessions, "findings": r.findings, **r.extra}.items()}
            for r in results]


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.helpers.mutants --seconds N``: write and read mutants in rounds
    (each round's archives in a temporary folder) until N seconds have passed, at least
    one round; fail on a task that failed. `make sanitize` runs it under the sanitizers,
    where a memory error aborts the process."""
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.mutants")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-round", type=int, default=20)
    args = parser.parse_args(argv)
    end = time.monotonic() + args.seconds
    codes: Counter[str] = Counter()
    sessions = 0
    seed = args.seed
    while sessions == 0 or time.monotonic() < end:
        with tempfile.TemporaryDirectory(prefix="mutants-") as folder:
            for root in write_mutants(Path(folder), seed, args.per_round):
                audit, replay = read(root)
                found = {f["code"] for f in audit["findings"] + replay["findings"]}
                if "audit_failed" in found:
                    print(f"seed {seed}: a task failed on {root}", file=sys.stderr)
                    return 1
                codes.update(found)
                sessions += 1
        seed += 1
    print(f"{sessions:,} mutated sessions audited and replayed (seeds {args.seed}-{seed - 1}); "
          f"sessions by finding: {dict(codes.most_common())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
