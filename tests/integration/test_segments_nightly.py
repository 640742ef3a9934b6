"""``vakpipe nightly`` twice over segment ledgers, in separate processes, in both
layouts (docs/segments.md, *Nightly checkpoints*): each break of a ledger's verified
history is reported the night it is seen; clean growth and unchanged ledgers are not."""

from __future__ import annotations

import subprocess
from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest

from jobs.nightly_tables import read_night
from pipeline.io.commit import read_dataset
from pipeline.io.storage import resolve
from pipeline.ledger.segments import (
    GENESIS,
    SEALS,
    SealEntry,
    SegmentCheckpoint,
    decompress,
    walk_frames,
)
from pipeline.synth.segments import SegmentLedger, compress, frame, keys_json, segment_ledger
from tests.helpers.storage import vakpipe_exe

#: ledger -> the history findings night 2 reports for it (the break made in between).
BREAKS = {
    "unchanged": set(),
    "grown": set(),
    "open_truncated": {"history_truncated"},
    "open_rewritten": {"history_rewritten"},
    "sealed_bytes_changed": {"history_rewritten"},
    "re_sealed": {"history_rewritten"},
}


def vakpipe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                          timeout=300, check=False)


def cut(files: dict[str, bytes], drop: int = 2) -> dict[str, bytes]:
    """The open segment without its last ``drop`` frames (a clean, shorter ledger)."""
    name = max(n for n in files if n.endswith(".log") and n != SEALS)
    frames = walk_frames(files[name], None).frames
    return {**files, name: files[name][:frames[-drop].offset]}


def nights(led: SegmentLedger, kind: str) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The ledger's files on night 1 and on night 2."""
    full = dict(led.files)
    if kind == "grown":
        return cut(full), full
    later = dict(full)
    if kind == "open_truncated":
        later = cut(full)
    elif kind == "open_rewritten":
        name = max(n for n in full if n.endswith(".log") and n != SEALS)
        at = 12
        later[name] = full[name][:at] + bytes([full[name][at] ^ 0x20]) + full[name][at + 1:]
    elif kind == "sealed_bytes_changed":
        data = full["seg-00000002.sealed"]
        later["seg-00000002.sealed"] = data[:-5] + bytes([data[-5] ^ 1]) + data[-4:]
    elif kind == "re_sealed":
        walk = walk_frames(full[SEALS], GENESIS)
        entries = [SealEntry.decode(decompress(f.payload)) for f in walk.frames]
        out, head = bytearray(), GENESIS
        for e in entries:
            assert e is not None
            if e.segment == 1:
                e = SealEntry(1, e.entries + 1, e.head, e.compressed)
            data, head = frame(head, 0, compress(e.encode()))
            out += data
        later[SEALS] = bytes(out)
    return full, later


def write(root: Path, led: SegmentLedger, files: dict[str, bytes]) -> None:
    base = root / led.path
    base.mkdir(parents=True, exist_ok=True)
    for old in base.iterdir():
        if old.name not in files:
            old.unlink()
    for name, data in files.items():
        if not (base / name).exists() or (base / name).read_bytes() != data:
            (base / name).write_bytes(data)


def findings(out: Path, fmt: str, day: date) -> pa.Table:
    if fmt == "delta":
        return read_night(resolve(str(out)), "integrity/findings", day)
    return read_dataset(resolve(str(out / f"date={day.isoformat()}")), "integrity/findings")


def checkpoints(out: Path, fmt: str, day: date) -> pa.Table:
    if fmt == "delta":
        return read_night(resolve(str(out)), "checkpoints", day)
    return read_dataset(resolve(str(out / f"date={day.isoformat()}")), "checkpoints")


@pytest.mark.parametrize(("fmt", "keyed"), [("partitions", False), ("delta", False),
                                            ("partitions", True)])
def test_each_break_is_reported_and_growth_is_not(tmp_path: Path, fmt: str,
                                                  keyed: bool) -> None:
    root, out = tmp_path / "archive", tmp_path / "nightly"
    made = {kind: segment_ledger(500 + i, segments=4, sealed=True)
            for i, kind in enumerate(BREAKS)}
    later = {}
    for kind, led in made.items():
        first, later[kind] = nights(led, kind)
        write(root, led, first)
    args: tuple[str, ...] = ("nightly", str(root), "--out", str(out), "--workers", "0",
                             "--format", fmt)
    if keyed:  # the content read (and replayed): the same verdicts, from the segments
        (tmp_path / "keys.json").write_bytes(keys_json(made.values()))
        args += ("--keys", str(tmp_path / "keys.json"))
    done = vakpipe(*args, "--date", "2026-12-01")
    assert done.returncode == 0, done.stderr
    night1 = checkpoints(out, fmt, date(2026, 12, 1)).to_pylist()
    assert len(night1) == len(made)
    for row in night1:  # every segment ledger has a checkpoint of its own
        ck = SegmentCheckpoint.from_json(row["segments"])
        assert ck is not None and len(ck.verified) == 3 and ck.open_segment == 4
    for kind, led in made.items():
        write(root, led, later[kind])
    done = vakpipe(*args, "--date", "2026-12-02")
    assert done.returncode == 0, done.stderr
    assert "1 unchanged (carried forward)" in done.stdout
    assert "history breaks: history_truncated 1, history_rewritten 3" in done.stdout
    rows = findings(out, fmt, date(2026, 12, 2)).to_pylist()
    for kind, led in made.items():
        history = {str(r["code"]) for r in rows if r["session_path"] == led.path
                   and str(r["code"]).startswith("history_")}
        assert history == BREAKS[kind], kind
    # Night 3, nothing changed since: the breaks were reported once, and no night
    # reports a break where there was none.
    done = vakpipe(*args, "--date", "2026-12-03")
    assert done.returncode == 0, done.stderr
    rows = findings(out, fmt, date(2026, 12, 3)).to_pylist()
    assert not [r for r in rows if str(r["code"]).startswith("history_")]
