"""What a nightly reads of segment ledgers that grew, against what the night before read
(docs/segments.md, *Nightly checkpoints*).

Generates sealed segment ledgers of several segments (the older ones sealed), reads each
once as night 1 (a frame fewer in its open segment) and again as night 2 (grown by that
frame) from night 1's checkpoint, through the reader a nightly uses
(:func:`pipeline.ledger.segments.read_segment_ledger`), and prints, measured in the same
run:

* the bytes each night read (keyless: sealed segments verified unchanged are not read
  again; with the keys every segment is read, for the replay) and their ratio;
* the time of the keyless night 2 against the keyless night 1 (interleaved, best of
  ``--repeat``).

Run: ``.venv/bin/python bench/segment_nightly.py [--ledgers 40] [--segments 8] [--quick]``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import best_of
from pipeline.ledger.keys import StaticKeys
from pipeline.ledger.segments import (
    SEALS,
    SegmentCheckpoint,
    SegmentReport,
    read_segment_ledger,
    walk_frames,
)
from pipeline.synth.segments import segment_ledger

Files = dict[str, bytes]


def night(files: Files, previous: SegmentCheckpoint | None,
          keys: StaticKeys | None) -> SegmentReport:
    # A member's version token: its digest (an ETag of a whole-object put).
    members = {n: (len(d), hashlib.sha256(d).hexdigest()) for n, d in files.items()}
    lines = read_segment_ledger(files, files.__getitem__, keys, previous=previous,
                                members=members)
    for _ in lines:
        pass
    return lines.report


def earlier(files: Files) -> Files:
    """The ledger the night before: its open segment without its last frame."""
    name = max(n for n in files if n.endswith(".log") and n != SEALS)
    last = walk_frames(files[name], None).frames[-1]
    return {**files, name: files[name][:last.offset]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledgers", type=int, default=40)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a few small ledgers, once")
    args = parser.parse_args()
    if args.quick:
        args.ledgers, args.segments, args.turns, args.repeat = 4, 4, 3, 1
    made = [segment_ledger(2000 + i, sealed=True, segments=args.segments, turns=args.turns)
            for i in range(args.ledgers)]
    keys = StaticKeys({led.scope: led.key for led in made if led.key is not None})
    pairs = [(earlier(led.files), led.files) for led in made]
    size = sum(len(d) for _, files in pairs for d in files.values())
    print(f"ledgers: {len(made)} sealed, {args.segments} segments each, {size:,} bytes "
          "on night 2 (one frame appended to each since night 1)")
    for label, k in (("keyless", None), ("with keys", keys)):
        first = [night(before, None, k) for before, _ in pairs]
        second = [night(after, r.checkpoint, k) for (_, after), r in zip(pairs, first,
                                                                          strict=True)]
        assert not any(r.history for r in second)
        one, two = sum(r.bytes_read for r in first), sum(r.bytes_read for r in second)
        skipped = sum(r.skipped_segments for r in second)
        print(f"{label}: night 1 read {one:,} bytes, night 2 {two:,} "
              f"({skipped} sealed segments not read again): night 2 / night 1 bytes read "
              f"= {two / one:.3f}")
    checkpoints = [night(before, None, None).checkpoint for before, _ in pairs]
    t1, t2 = best_of(
        args.repeat,
        lambda: [night(before, None, None) for before, _ in pairs],
        lambda: [night(after, c, None) for (_, after), c in zip(pairs, checkpoints,
                                                                 strict=True)],
    )
    print(f"keyless night 1: {t1.wall:.3f} s, night 2: {t2.wall:.3f} s = "
          f"{t2.wall / t1.wall:.3f} x night 1")


if __name__ == "__main__":
    main()
