"""Audit throughput of vak's record-segment ledgers against their floor (docs/segments.md).

Prints, measured in the same run and interleaved (only ratios matter on a shared
machine), over a generated fleet of segment ledgers (several segments each, the older
ones sealed):

* the floor: one process reading every segment file and, per frame, its SHA-256 link
  and the zstd decompression of its entry (for sealed frames, AES-256-GCM first);
* the keyless verification alone (:func:`pipeline.ledger.segments.read_segment_ledger`,
  no key: chain, seals, content not read) and the whole audit of each ledger with its
  key (verification, opening, the projection and the JSONL audit), in this process;
* ``vakpipe audit`` of the fleet in process (``--workers 0``: listing, reading, Parquet,
  commit), keyless and with ``--keys``.

Run: ``.venv/bin/python bench/segment_audit.py [--ledgers 200] [--quick]``.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bench.common import MB, best_of
from pipeline.audit.segments import audit_lines
from pipeline.io.storage import enumerate_sessions, resolve, use_keys
from pipeline.ledger.keys import StaticKeys
from pipeline.ledger.layout import segment_member
from pipeline.ledger.segments import MAGIC, read_segment_ledger
from pipeline.run.orchestrate import run_audit
from pipeline.synth.segments import keys_json, segment_ledger, write_segment_ledger


def make_fleet(root: Path, ledgers: int, sealed: bool, turns: int) -> StaticKeys:
    made = [segment_ledger(1000 + i, sealed=sealed, segments=4, turns=turns)
            for i in range(ledgers)]
    loc = resolve(str(root))
    for led in made:
        write_segment_ledger(loc, led)
    import json

    keys = {k: bytes.fromhex(v) for k, v in json.loads(keys_json(made)).items()}
    return StaticKeys(keys)


def floor(root: Path, keys: StaticKeys) -> int:
    """SHA-256 link and zstd decompression of every frame (AES-GCM first if sealed)."""
    dctx = zstandard.ZstdDecompressor()
    frames = 0
    for folder in sorted({p.parent for p in root.rglob("seg-*")}):
        key = keys.scope_key((folder / "KEY").read_text().strip())
        aead = AESGCM(key) if key is not None else None
        for path in sorted(folder.glob("seg-*")):
            data = path.read_bytes()
            if path.suffix == ".sealed":
                data = data[len(MAGIC) + 1:] if data[len(MAGIC)] == 0 else \
                    dctx.decompressobj().decompress(data[len(MAGIC) + 1:])
            pos, prev, n = 0, bytes(32), 0
            while pos + 4 <= len(data):
                length = int.from_bytes(data[pos:pos + 4], "little")
                body = data[pos + 4:pos + 4 + length]
                prev = hashlib.sha256(prev + length.to_bytes(4, "little") + body).digest()
                payload = body[1:]
                if body[0] & 1 and aead is not None:
                    payload = aead.decrypt(payload[:12], payload[12:], n.to_bytes(8, "little"))
                dctx.decompressobj().decompress(payload)
                pos += 4 + length + 32
                n += 1
                frames += 1
    return frames


def in_process(root: Path, keys: StaticKeys | None, whole: bool) -> None:
    """Keyless verification alone, or the whole audit with the keys, of each ledger."""
    for folder in sorted({p.parent for p in root.rglob("seg-*")}):
        names = [p.name for p in folder.iterdir()]
        lines = read_segment_ledger(names, lambda n, f=folder: (f / n).read_bytes(), keys)
        if whole:
            key = segment_member(f"{folder.relative_to(root).as_posix()}/KEY")
            assert key is not None
            audit_lines(key, lines)
        else:
            for _ in lines:
                pass


def cli_run(root: Path, out: Path, keys: StaticKeys | None) -> None:
    use_keys(keys)
    try:
        shutil.rmtree(out, ignore_errors=True)
        run_audit(resolve(str(root)), resolve(str(out)), workers=0, progress=False)
    finally:
        use_keys(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledgers", type=int, default=120)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a few small ledgers, once")
    args = parser.parse_args()
    if args.quick:
        args.ledgers, args.turns, args.repeat = 6, 3, 1
    base = Path(tempfile.mkdtemp(prefix="vakpipe-bench-segments-"))
    try:
        for sealed in (False, True):
            root = base / ("sealed" if sealed else "plain") / "archive"
            keys = make_fleet(root, args.ledgers, sealed, args.turns)
            size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
            assert len(enumerate_sessions(resolve(str(root))).sessions) == args.ledgers
            out = root.parent / "out"
            timings = best_of(
                args.repeat,
                lambda r=root, k=keys: floor(r, k),
                lambda r=root: in_process(r, None, whole=False),
                lambda r=root, k=keys: in_process(r, k, whole=True),
                lambda r=root, o=out: cli_run(r, o, None),
                lambda r=root, o=out, k=keys: cli_run(r, o, k),
            )
            names = ("floor (SHA-256 + zstd" + (" + AES-GCM)" if sealed else ")"),
                     "keyless verification", "audit with keys, in process",
                     "vakpipe audit, keyless", "vakpipe audit --keys")
            base_wall = timings[0].wall
            kind = "sealed" if sealed else "plain"
            print(f"{kind}: {args.ledgers} ledgers, {size / MB:.1f} MB")
            for name, t in zip(names, timings, strict=True):
                print(f"  {name:<32} {size / MB / t.wall:8.1f} MB/s   "
                      f"{base_wall / t.wall:6.2f} x floor")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
