"""Row 3, failing closed: the nightly's tamper evidence survives what an attacker (or an
accident) does to the evidence itself.

- The last night's ``_manifest.json`` deleted, or its manifest or checkpoints table
  made unreadable, then history truncated: the next night refuses to run as a first
  night (exit 2, one ``vakpipe: error:`` line naming ``--baseline DATE`` and
  ``--rebaseline``); ``--baseline`` of an older intact night reports the truncation,
  ``--rebaseline`` starts over and says so.
- A local ledger rewritten at the same size with its modification time set back is
  read again (the version token holds the inode's change time) and ``history_rewritten``.
- A rewritten prefix followed by an entry whose replay (or audit) raises is
  ``history_rewritten`` beside ``audit_failed``, every night until it replays.

The nightly runs are the real CLI in separate processes on the session cluster, except
the last group: a replay that raises is made by replacing a function, so those runs are
on ``memory://`` (a LocalCluster of threads in this process) through the CLI in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import date
from pathlib import Path
from typing import Any

import fsspec
import pytest

import pipeline.run.batches as batches
import pipeline.run.replay_batches as replay_batches
from jobs.nightly_audit import SUMMARY_FILE, partition
from pipeline.cli import EXIT_PARTIAL, EXIT_UNUSABLE, run
from pipeline.io.commit import MANIFEST
from pipeline.io.storage import resolve
from pipeline.synth.fleet import GROUND_TRUTH
from tests.helpers.fleets import copied_fleet
from tests.helpers.ledgers import sample_session, session_key
from tests.helpers.storage import committed_rows, vakpipe_exe

D1, D2, D3 = (date(2026, 12, d) for d in (1, 2, 3))


generated, archive = copied_fleet("tamper-fleet", sessions=3, seed=21, size_scale=0.4,
                                  consistent=False)


def a_clean_session(root: Path) -> str:
    truth = json.loads((root / GROUND_TRUTH).read_text())
    clean: list[str] = sorted(p for p, t in truth.items() if t["fault"] is None)
    return clean[0]


def night(archive: Path, out: Path, day: date, scheduler: str,
          *extra: str) -> subprocess.CompletedProcess[str]:
    """``vakpipe nightly`` in a process of its own."""
    return subprocess.run(
        [vakpipe_exe(), "nightly", str(archive), "--out", str(out), "--date", day.isoformat(),
         "--scheduler", scheduler, "--no-progress", *extra],
        capture_output=True, text=True, timeout=300, check=False)


def summary(out: Path, day: date) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / f"date={day}" / SUMMARY_FILE).read_text())
    return data


def codes(out: Path, day: date, path: str) -> set[str]:
    return {r["code"] for r in committed_rows(partition(resolve(str(out)), day),
                                              "integrity/findings")
            if r["session_path"] == path}


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == EXIT_UNUSABLE, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.strip()]
    assert line.startswith("vakpipe: error: ") and "Traceback" not in done.stderr
    return line


def truncate_lines(file: Path, lines: int) -> None:
    kept = file.read_bytes().splitlines(keepends=True)[:-lines]
    file.write_bytes(b"".join(kept))


def test_a_deleted_manifest_is_refused_and_the_way_out_reports_the_truncation(
        archive: Path, tmp_path: Path, scheduler: str) -> None:
    out = tmp_path / "out"
    assert night(archive, out, D1, scheduler).returncode == 0
    assert night(archive, out, D2, scheduler).returncode == 0
    (out / f"date={D2}" / MANIFEST).unlink()
    victim = a_clean_session(archive)
    truncate_lines(archive / victim, 3)

    line = one_error_line(night(archive, out, D3, scheduler))
    assert "_manifest.json is gone" in line and "date=2026-12-02" in line
    assert "--baseline 2026-12-01" in line and "--rebaseline" in line
    assert not (out / f"date={D3}" / MANIFEST).exists()
    # Run again, it is still refused: nothing was silently accepted the first time.
    assert night(archive, out, D3, scheduler).returncode == EXIT_UNUSABLE

    done = night(archive, out, D3, scheduler, "--baseline", "2026-12-01")
    assert done.returncode == 0, done.stderr
    assert "date=2026-12-01 (--baseline)" in done.stdout
    got = summary(out, D3)
    assert got["changes"]["history_truncated"] == 1 and got["baseline_pinned"] is True
    assert got["baseline"].endswith("date=2026-12-01")
    assert "history_truncated" in codes(out, D3, victim)


def test_rebaseline_starts_over_and_says_so(archive: Path, tmp_path: Path,
                                            scheduler: str) -> None:
    out = tmp_path / "out"
    assert night(archive, out, D1, scheduler).returncode == 0
    (out / f"date={D1}" / MANIFEST).unlink()
    line = one_error_line(night(archive, out, D2, scheduler))
    assert "--baseline" not in line and "--rebaseline" in line  # no older intact night
    assert one_error_line(night(archive, out, D2, scheduler, "--baseline", "2026-12-01",
                                "--rebaseline")).endswith("give one")
    done = night(archive, out, D2, scheduler, "--rebaseline")
    assert done.returncode == 0, done.stderr
    assert "baseline none (--rebaseline" in done.stdout
    got = summary(out, D2)
    assert got["rebaseline"] is True and got["baseline"] is None
    assert got["changes"]["new"] == got["sessions"]


@pytest.mark.parametrize("damage", ["manifest", "checkpoints"])
def test_a_corrupt_baseline_is_one_line_exit_2_not_a_traceback(
        damage: str, archive: Path, tmp_path: Path, scheduler: str) -> None:
    out = tmp_path / "out"
    assert night(archive, out, D1, scheduler).returncode == 0
    assert night(archive, out, D2, scheduler).returncode == 0
    day = out / f"date={D2}"
    if damage == "manifest":
        (day / MANIFEST).write_bytes((day / MANIFEST).read_bytes()[:40])
    else:
        for part in (day / "checkpoints").iterdir():
            part.write_bytes(b"PAR1 not a parquet file")
    line = one_error_line(night(archive, out, D3, scheduler))
    assert ("manifest" in line) if damage == "manifest" else ("checkpoints table" in line)
    assert "--baseline 2026-12-01" in line and "--rebaseline" in line
    assert night(archive, out, D3, scheduler, "--baseline", "2026-12-01").returncode == 0


def test_a_same_size_rewrite_with_its_mtime_restored_is_history_rewritten(
        archive: Path, tmp_path: Path, scheduler: str) -> None:
    out = tmp_path / "out"
    assert night(archive, out, D1, scheduler).returncode == 0
    victim = archive / a_clean_session(archive)
    before = victim.stat()
    data = bytearray(victim.read_bytes())
    at = data.index(b'"ts":"') + 8  # a digit of the first timestamp: same length
    data[at] = ord("0") if data[at] != ord("0") else ord("1")
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert victim.stat().st_mtime_ns == before.st_mtime_ns
    assert victim.stat().st_size == before.st_size

    done = night(archive, out, D2, scheduler)
    assert done.returncode == 0, done.stderr
    got = summary(out, D2)
    assert got["changes"]["changed"] == 1 and got["changes"]["history_rewritten"] == 1
    assert "history_rewritten" in codes(out, D2, a_clean_session(archive))


# -- a replay (or audit) that raises never hides a history break ----------------------------

ARCHIVE = "memory://tamper/archive"


def memory_night(out: str, day: date) -> Any:
    return run(["nightly", ARCHIVE, "--out", out, "--date", day.isoformat(),
                "--no-progress"])


@pytest.mark.parametrize("where", ["replay", "audit"])
def test_a_rewritten_prefix_with_an_entry_that_crashes_is_still_history_rewritten(
        where: str, memfs: fsspec.AbstractFileSystem, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    key = session_key()
    path = resolve(ARCHIVE).join(key.path)
    data = sample_session(turns=3).to_bytes()
    memfs.pipe_file(path, data)
    out = str(tmp_path / "out")
    assert memory_night(out, D1) == 0

    # The prefix edited (a digit of a timestamp), then one entry appended: the appended
    # entry stands for any input the replay (or the audit) cannot take.
    edited = bytearray(data)
    at = edited.index(b'"ts":"') + 8
    edited[at] = ord("0") if edited[at] != ord("0") else ord("1")
    memfs.pipe_file(path, bytes(edited) + data.splitlines(keepends=True)[-1])

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("an input no test foresaw")

    # The nightly's read (the per-object pipeline) and its replay.
    if where == "replay":
        monkeypatch.setattr(replay_batches, "replay_spooled", boom)
    else:
        monkeypatch.setattr(batches, "audit_lines", boom)
    for day in (D2, D3):  # reported every night until the session replays
        assert memory_night(out, day) == EXIT_PARTIAL
        found = codes(Path(out), day, key.path)
        assert found == {"history_rewritten", "audit_failed"}, (day, found)
        assert json.loads((Path(out) / f"date={day}" / SUMMARY_FILE).read_text())[
            "changes"]["history_rewritten"] == 1
