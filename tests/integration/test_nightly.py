"""The incremental nightly audit: dated partitions, checkpoints, rows carried forward.

Through :func:`jobs.nightly_audit.run_nightly` and the CLI (``vakpipe nightly``), on a
generated fleet in a local folder (and once in moto's S3), with the session cluster of
real worker processes. The archive is changed between nights the way it changes in
production: sessions grow by valid appends, get truncated, rewritten or deleted.

The invariant behind most checks: a night's partition holds exactly the rows a full
read of the archive would give, whatever was carried forward instead of read.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from jobs.nightly_audit import (
    SUMMARY_FILE,
    NightlySummary,
    latest_partition,
    partition,
    run_nightly,
)
from pipeline.audit.checkpoint import Change, Checkpoint, classify
from pipeline.cli import run
from pipeline.io.commit import MANIFEST, read_manifest
from pipeline.io.storage import Location, enumerate_sessions, resolve
from pipeline.run.replay_batches import ReplayOptions, replay_batch
from pipeline.synth.fleet import GROUND_TRUTH, grow_session, write_fleet
from pipeline.synth.local_s3 import LocalS3
from tests.helpers.fault_proxy import fault_proxy
from tests.helpers.fleets import copied_fleet
from tests.helpers.storage import BUCKET, committed_rows

D1, D2, D3, D4 = (date(2026, 12, d) for d in (1, 2, 3, 4))
DATASETS = ("integrity/sessions", "integrity/findings", "usage", "turns", "requests",
            "checkpoints")
HISTORY = ("history_truncated", "history_rewritten", "session_missing")


#: Ten small sessions (two with injected faults), generated once per module; each test
#: its own copy.
generated, archive = copied_fleet("generated", sessions=10, seed=21, faults=True,
                                  size_scale=0.5, consistent=False)


def clean_sessions(root: Path) -> list[str]:
    """Paths (relative) of the sessions generated without a fault, in path order."""
    truth = json.loads((root / GROUND_TRUTH).read_text())
    return sorted(p for p, t in truth.items() if t["fault"] is None)


def nightly(root: Path, out: Path, day: date, scheduler: str,
            options: ReplayOptions | None = None) -> NightlySummary:
    return run_nightly(resolve(str(root)), resolve(str(out)), options or ReplayOptions(),
                       day=day, scheduler=scheduler, progress=False)


def rows(out: Path | Location, day: date, dataset: str,
         paths: set[str] | None = None) -> list[dict[str, Any]]:
    """A partition's committed rows of ``dataset`` (sorted), optionally of some sessions."""
    loc = out if isinstance(out, Location) else resolve(str(out))
    found = committed_rows(partition(loc, day), dataset)
    return found if paths is None else [r for r in found if r["session_path"] in paths]


def by_path(out: Path, day: date, dataset: str) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in rows(out, day, dataset):
        grouped.setdefault(r["session_path"], []).append(r)
    return grouped


def history_codes(out: Path, day: date) -> dict[str, str]:
    """``{session_path: code}`` of the checkpoint findings in a partition."""
    return {r["session_path"]: r["code"] for r in rows(out, day, "integrity/findings")
            if r["code"] in HISTORY}


def checkpoints(out: Path, day: date) -> dict[str, Checkpoint]:
    return {r["session_path"]: Checkpoint.from_row(r) for r in rows(out, day, "checkpoints")}


def full_read(root: Path, tmp_path: Path, scheduler: str, day: date) -> Path:
    """The partition a first night (everything read) gives for ``root`` as it is now."""
    fresh = tmp_path / "fresh"
    shutil.rmtree(fresh, ignore_errors=True)
    summary = nightly(root, fresh, day, scheduler)
    assert summary.baseline is None
    return fresh


# -- first and unchanged nights ----------------------------------------------------------


def test_first_night_reads_all_and_an_unchanged_night_reads_nothing(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    out = tmp_path / "out"
    first = nightly(archive, out, D1, scheduler)
    n = len(list(archive.rglob("*.jsonl")))
    total = sum(p.stat().st_size for p in archive.rglob("*.jsonl"))
    assert first.baseline is None
    assert first.changes["new"] == n and first.changes["missing"] == 0
    assert first.bytes_read == first.run.bytes == total
    assert {p.name for p in out.iterdir()} == {"date=2026-12-01"}
    assert set(checkpoints(out, D1)) == {str(p.relative_to(archive))
                                        for p in archive.rglob("*.jsonl")}

    second = nightly(archive, out, D2, scheduler)
    assert second.baseline == partition(resolve(str(out)), D1).url
    assert second.bytes_read == 0
    assert {k: v for k, v in second.changes.items() if v} == {"unchanged": n}
    for dataset in DATASETS:
        assert rows(out, D2, dataset) == rows(out, D1, dataset), dataset
    assert second.run.statuses == first.run.statuses
    assert second.run.codes == first.run.codes
    # summary.json is the summary returned; the manifest records the night's options.
    stored = json.loads((out / "date=2026-12-02" / SUMMARY_FILE).read_text())
    assert stored == json.loads(json.dumps(second.as_dict()))
    assert stored["bytes_read"] == 0 and stored["date"] == "2026-12-02"
    manifest = read_manifest(partition(resolve(str(out)), D2))
    assert manifest is not None and manifest["options"] == stored["options"]
    assert manifest["baseline"] == second.baseline
    # Both partitions stay, each complete.
    assert read_manifest(partition(resolve(str(out)), D1)) is not None


# -- growth ---------------------------------------------------------------------------------


def test_a_grown_session_is_read_again_and_the_others_carried(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    out = tmp_path / "out"
    nightly(archive, out, D1, scheduler)
    grown = clean_sessions(archive)[0]
    added = grow_session(resolve(str(archive)), grown, entries=1)

    summary = nightly(archive, out, D2, scheduler)
    assert summary.changes["changed"] == 1 and summary.changes["new"] == 0
    assert summary.changes["unchanged"] == len(checkpoints(out, D1)) - 1
    assert summary.bytes_read == (archive / grown).stat().st_size
    assert history_codes(out, D2) == {}
    before = by_path(out, D1, "integrity/sessions")[grown][0]
    after = by_path(out, D2, "integrity/sessions")[grown][0]
    assert after["entries"] == before["entries"] + 1
    assert after["bytes"] == before["bytes"] + added
    assert after["status"] == before["status"] == "ok"
    assert after["turns"] == before["turns"] + 1  # the appended entry is a directive
    cp = checkpoints(out, D2)[grown]
    assert cp.verified_bytes == cp.size == after["bytes"]
    assert cp.entries == after["entries"]
    assert len(by_path(out, D2, "turns")[grown]) == len(by_path(out, D1, "turns")[grown]) + 1
    others = set(checkpoints(out, D1)) - {grown}
    for dataset in DATASETS:
        assert rows(out, D2, dataset, others) == rows(out, D1, dataset, others), dataset
    # Carried or read, the night holds what a full read of the archive gives.
    fresh = full_read(archive, tmp_path, scheduler, D2)
    for dataset in DATASETS:
        assert rows(out, D2, dataset) == rows(fresh, D2, dataset), dataset


# -- history breaks (issue 7, matrix row 3) --------------------------------------------------


def test_truncated_rewritten_edited_and_deleted_sessions(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    out = tmp_path / "out"
    nightly(archive, out, D1, scheduler)
    shorter, other_head, edited, deleted = clean_sessions(archive)[:4]
    # Object shorter: its last line dropped (the file alone is still a valid ledger).
    data = (archive / shorter).read_bytes()
    (archive / shorter).write_bytes(data[:data.rindex(b"\n", 0, len(data) - 1) + 1])
    # Same length, other head: one character of the head line flipped.
    data = (archive / other_head).read_bytes()
    at = data.rindex(b'"ts":"') + len(b'"ts":"2026-')
    flipped = data[:at] + (b"0" if data[at:at + 1] != b"0" else b"1") + data[at + 1:]
    assert len(flipped) == len(data)
    (archive / other_head).write_bytes(flipped)
    # Prefix edited (a character of the header's cwd), then a valid entry appended.
    data = (archive / edited).read_bytes()
    at = data.index(b'"cwd":"') + len(b'"cwd":"') + 1
    (archive / edited).write_bytes(data[:at] + b"X" + data[at + 1:])
    grow_session(resolve(str(archive)), edited, entries=2)
    # Deleted.
    (archive / deleted).unlink()

    second = nightly(archive, out, D2, scheduler)
    assert history_codes(out, D2) == {shorter: "history_truncated",
                                      other_head: "history_rewritten",
                                      edited: "history_rewritten",
                                      deleted: "session_missing"}
    assert second.changes["changed"] == 3 and second.changes["missing"] == 1
    assert second.changes["history_truncated"] == 1
    assert second.changes["history_rewritten"] == 2
    assert second.run.codes["session_missing"] == 1
    sessions = by_path(out, D2, "integrity/sessions")
    assert all(sessions[p][0]["status"] == "error"
               for p in (shorter, other_head, edited, deleted))
    assert sessions[deleted][0]["entries"] is None  # not read: no figures
    assert deleted not in by_path(out, D2, "turns")
    # The checkpoints follow the new content; the missing one is kept as it was.
    cps1, cps2 = checkpoints(out, D1), checkpoints(out, D2)
    assert cps2[shorter].verified_bytes < cps1[shorter].verified_bytes
    assert cps2[other_head].prefix_sha256 != cps1[other_head].prefix_sha256
    assert cps2[deleted].verified_bytes == cps1[deleted].verified_bytes

    # The next night, nothing changed: the missing session is reported again; the
    # breaks were reported the night they were seen and are not repeated.
    third = nightly(archive, out, D3, scheduler)
    assert history_codes(out, D3) == {deleted: "session_missing"}
    assert third.changes["missing"] == 1
    assert third.changes["history_truncated"] == third.changes["history_rewritten"] == 0
    live = set(cps2) - {deleted}
    fresh = full_read(archive, tmp_path, scheduler, D3)
    for dataset in DATASETS:
        assert rows(out, D3, dataset, live) == rows(fresh, D3, dataset), dataset
    # Once re-verified, they are carried like any other session.
    fourth = nightly(archive, out, D4, scheduler)
    assert fourth.bytes_read == 0 and history_codes(out, D4) == {deleted: "session_missing"}


def test_a_missing_session_that_comes_back_is_read_again(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    out = tmp_path / "out"
    nightly(archive, out, D1, scheduler)
    gone = clean_sessions(archive)[0]
    aside = tmp_path / "aside.jsonl"
    # Moved away and back: same bytes, same modification time (the local ETag token).
    os.rename(archive / gone, aside)
    nightly(archive, out, D2, scheduler)
    nightly(archive, out, D3, scheduler)
    assert history_codes(out, D3) == {gone: "session_missing"}
    os.rename(aside, archive / gone)

    back = nightly(archive, out, D4, scheduler)
    assert back.bytes_read == (archive / gone).stat().st_size
    assert history_codes(out, D4) == {}

    def versionless(day: date, dataset: str) -> list[dict[str, Any]]:
        # A rename moves the inode's change time, part of the local version token.
        return [{k: v for k, v in r.items() if k != "etag"} for r in rows(out, day, dataset)]

    for dataset in DATASETS:
        assert versionless(D4, dataset) == versionless(D1, dataset), dataset


def test_an_unreadable_object_keeps_its_checkpoint_and_is_read_again(archive: Path) -> None:
    root = resolve(str(archive))
    obj = next(o for o in enumerate_sessions(root).sessions
               if o.key.path == clean_sessions(archive)[0])
    before = Checkpoint(obj.key.path, 100, "0" * 64, 2, "1" * 64, obj.etag, obj.size)
    assert classify(obj.size, obj.etag, before) is Change.UNCHANGED
    os.unlink(obj.full_path)  # vanished after the listing
    result = replay_batch(root, 0, [obj], ReplayOptions(), {obj.key.path: before})
    assert [r["code"] for r in result.findings.to_pylist()] == ["unreadable_object"]
    [kept] = map(Checkpoint.from_row, result.extra["checkpoints"].to_pylist())
    # Its rows are the unreadable ones: they must never be carried forward as if the
    # object had been verified.
    assert kept == before.reread()
    assert classify(obj.size, obj.etag, kept) is Change.CHANGED


# -- options, reruns, failures (through the CLI) -------------------------------------------


def cli_nightly(root: Path, out: Path, day: date, scheduler: str, *extra: str) -> Any:
    return run(["nightly", str(root), "--out", str(out), "--date", day.isoformat(),
                "--scheduler", scheduler, "--no-progress", *extra])


def summary_json(out: Path, day: date) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (out / f"date={day.isoformat()}" / SUMMARY_FILE).read_text())
    return data


def test_cli_options_change_rereads_everything(
    archive: Path, tmp_path: Path, scheduler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert cli_nightly(archive, out, D1, scheduler) == 0
    total = summary_json(out, D1)["bytes"]
    assert summary_json(out, D1)["bytes_read"] == total
    printed = capsys.readouterr().out
    assert "nightly 2026-12-01: baseline none (first run)" in printed
    assert f"read {total:,} of {total:,} bytes" in printed

    # Another rule set: every session's replay rows are stale, so everything is read.
    assert cli_nightly(archive, out, D2, scheduler, "--rules", "v1-terse-cards") == 0
    second = summary_json(out, D2)
    n = second["sessions"]
    assert second["bytes_read"] == total
    assert second["changes"]["reread_options_changed"] == n
    assert second["changes"].get("unchanged", 0) == 0
    assert {r["rules"] for r in rows(out, D2, "requests")} == {"v1-terse-cards"}
    assert second["options"] != summary_json(out, D1)["options"]
    assert rows(out, D2, "integrity/sessions") == rows(out, D1, "integrity/sessions")
    printed = capsys.readouterr().out
    assert f"{n:,} re-read (options changed)" in printed

    # Same options again: nothing read; --fail-on sees the findings carried forward
    # (the fleet's faults are warnings).
    assert cli_nightly(archive, out, D3, scheduler, "--rules", "v1-terse-cards",
                       "--fail-on", "warning") == 1
    assert summary_json(out, D3)["bytes_read"] == 0
    assert summary_json(out, D3)["statuses"] == {"ok": n - 2, "warning": 2}
    assert cli_nightly(archive, out, D3, scheduler, "--rules", "v1-terse-cards",
                       "--fail-on", "error") == 0
    # A session deleted is an error, every night it stays missing.
    (archive / clean_sessions(archive)[0]).unlink()
    for day in (D4, date(2026, 12, 5)):
        assert cli_nightly(archive, out, day, scheduler, "--rules", "v1-terse-cards",
                           "--fail-on", "error") == 1
    assert "history breaks: missing 1" in capsys.readouterr().out


def test_cli_same_day_rerun_replaces_the_partition(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    out = tmp_path / "out"
    assert cli_nightly(archive, out, D1, scheduler) == 0
    day = resolve(str(out / "date=2026-12-01"))
    first = read_manifest(day)
    assert cli_nightly(archive, out, D1, scheduler) == 0
    again = read_manifest(day)
    assert first is not None and again is not None
    assert again["run_id"] != first["run_id"]
    assert again["baseline"] == day.url  # its own previous version
    assert summary_json(out, D1)["bytes_read"] == 0
    assert summary_json(out, D1)["run_id"] == again["run_id"]
    for dataset in DATASETS:
        assert committed_rows(day, dataset) == rows(out, D1, dataset)
        # Only the new run's files are left.
        names = {p.name for p in (out / "date=2026-12-01" / dataset).iterdir()}
        assert names == set(again["datasets"][dataset]["files"])
        assert all(again["run_id"] in name for name in names)
    assert [p.name for p in out.iterdir()] == ["date=2026-12-01"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_cli_failed_night_leaves_the_previous_partitions_intact(
    archive: Path, tmp_path: Path, scheduler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert cli_nightly(archive, out, D1, scheduler) == 0
    assert cli_nightly(archive, out, D2, scheduler) == 0
    kept = snapshot(out)
    grow_session(resolve(str(archive)), clean_sessions(archive)[0], entries=2)
    # A real failure: the night's staging area cannot be created (a file is in its
    # way), so no part can be written, the task results and the rows carried alike.
    blocked = out / "date=2026-12-03"
    blocked.mkdir()
    (blocked / "_staging").write_text("in the way")
    capsys.readouterr()
    assert cli_nightly(archive, out, D3, scheduler) == 2
    assert "vakpipe: error:" in capsys.readouterr().err
    (blocked / "_staging").unlink()
    assert snapshot(out) == kept  # nothing written, nothing removed
    newest = latest_partition(resolve(str(out)), D3)
    assert newest is not None and newest.location == partition(resolve(str(out)), D2)
    assert read_manifest(resolve(str(blocked))) is None

    # The same night run again: D2's checkpoints are still in force.
    assert cli_nightly(archive, out, D3, scheduler) == 0
    third = summary_json(out, D3)
    assert third["changes"]["changed"] == 1 and third["baseline"].endswith("date=2026-12-02")
    assert {k: v for k, v in snapshot(out).items()
            if not k.startswith("date=2026-12-03")} == kept


# -- S3 ---------------------------------------------------------------------------------------


def test_smoke_s3_two_nights_with_compaction(s3: object, scheduler: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    root, out = f"s3://{BUCKET}/archive", f"s3://{BUCKET}/reports/nightly"
    write_fleet(resolve(root), sessions=4, seed=11, size_scale=0.5, consistent=False)
    for day in (D1, D2):
        assert run(["nightly", root, "--out", out, "--date", day.isoformat(),
                    "--scheduler", scheduler, "--no-progress", "--compaction",
                    "--window", "8000"]) == 0  # a window small enough to need packets
    printed = capsys.readouterr().out
    assert "4 new" in printed and "4 unchanged (carried forward)" in printed
    loc = resolve(out)
    fs = loc.filesystem()
    first, second = (json.loads(fs.cat_file(partition(loc, d).join(SUMMARY_FILE)))
                     for d in (D1, D2))
    assert first["bytes_read"] == first["bytes"] > 0
    assert second["bytes_read"] == 0  # every ETag and size matched
    assert second["changes"] == {"missing": 0, "unchanged": 4, "history_rewritten": 0,
                                 "history_truncated": 0}
    manifest = json.loads(fs.cat_file(partition(loc, D2).join(MANIFEST)))
    assert "compaction" in manifest["datasets"]
    assert all(cp.etag and not cp.etag.startswith("mtime:")
               for cp in map(Checkpoint.from_row, rows(loc, D2, "checkpoints")))
    for dataset in (*DATASETS, "compaction"):
        assert rows(loc, D2, dataset) == rows(loc, D1, dataset), dataset
    assert rows(loc, D2, "compaction")


def test_on_s3_a_night_reads_its_baseline_manifest_once_for_all_its_tables(
    s3: LocalS3
) -> None:
    """The carried tables are of the one commit the night found (a manifest read per
    table cost two round trips each, twelve reads a night)."""
    root, out = f"s3://{BUCKET}/archive", f"s3://{BUCKET}/reports/nightly"
    write_fleet(resolve(root), sessions=4, seed=11, size_scale=0.2, consistent=False)
    with fault_proxy(s3.endpoint) as proxy:
        via = ("--storage-option", f"endpoint_url={proxy.endpoint}")
        for day in (D1, D2):
            proxy.clear()
            assert run(["nightly", root, "--out", out, "--date", day.isoformat(),
                        "--workers", "0", "--no-progress", *via]) == 0
        baseline = partition(resolve(out), D1).path.split("/", 1)[1]
        manifests = proxy.requests(f"{baseline}/{MANIFEST}", "GET")
        # One, as the baseline is found: its run is read as of that manifest.
        assert len(manifests) == 1
    assert rows(resolve(out), D2, "integrity/sessions") == rows(resolve(out), D1,
                                                               "integrity/sessions")
