"""Issue 18 item 4: outputs with nothing stale or stray, through the real CLI.

A cost report is committed under a manifest of its own naming the run it describes (a
rerun's report replaces it, a report older than the run in force is detected); datasets
a run no longer writes go with their folders; ``generate`` and the runs refuse a
non-empty folder that is not theirs unless ``--force``; every small file goes through
one writer that never follows a link. (``vakpipe demo`` writing only under ``--out`` is
``tests/integration/test_demo.py``, a slow test.)
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from jobs.cost_report import read_report_manifest, stale_report_line
from pipeline.cli import EXIT_OK, EXIT_UNUSABLE
from pipeline.cli.demo import audit_out, compaction_out
from pipeline.errors import UnsafeOutputError
from pipeline.io.commit import MANIFEST, read_manifest, write_small_file
from pipeline.io.storage import resolve
from pipeline.synth.fleet import GROUND_TRUTH
from tests.helpers.storage import vakpipe_exe


def vakpipe(*args: str) -> subprocess.CompletedProcess[str]:
    """``vakpipe ARGS`` in a process of its own."""
    return subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                          timeout=300, check=False, env=dict(os.environ))


def ok(*args: str) -> subprocess.CompletedProcess[str]:
    done = vakpipe(*args)
    assert done.returncode == EXIT_OK, (done.stdout, done.stderr)
    return done


def one_error_line(done: subprocess.CompletedProcess[str], *names: str) -> str:
    assert done.returncode == EXIT_UNUSABLE, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vakpipe: error: "), done.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: a file's bytes, a link's target, or ``dir``."""
    found: dict[str, bytes | str] = {}
    for here, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(here) / name
            rel = path.relative_to(folder).as_posix()
            found[rel] = (f"link:{os.readlink(path)}" if path.is_symlink()
                          else "dir" if path.is_dir() else path.read_bytes())
    return found


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clean") / "archive"
    ok("generate", str(root), "--sessions", "3", "--seed", "5")
    return root


def run_id(out: Path) -> str:
    return str((read_manifest(resolve(str(out))) or {})["run_id"])


def test_a_rerun_of_cost_replaces_the_report_and_names_the_run_in_force(
        archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok("audit", str(archive), "--out", str(out), "--no-progress")
    first = run_id(out)
    ok("cost", str(out))
    cost = resolve(str(out / "cost"))
    assert (read_report_manifest(cost) or {})["run_id"] == first
    assert stale_report_line(resolve(str(out))) is None
    # The run is redone: the report beside it now describes an older run, and says so.
    ok("audit", str(archive), "--out", str(out), "--no-progress")
    second = run_id(out)
    assert second != first
    line = stale_report_line(resolve(str(out)))
    assert line is not None and first in line and second in line
    ok("cost", str(out))
    manifest = read_report_manifest(cost) or {}
    assert manifest["run_id"] == second and manifest["source"] == str(out)
    assert stale_report_line(resolve(str(out))) is None
    assert sorted(p.name for p in (out / "cost").iterdir()) == [
        MANIFEST, "costs.csv", "costs.parquet", "report.html"]
    html = (out / "cost" / "report.html").read_text()
    assert second in html and first not in html
    # A report of an older vakpipe (no manifest of its own) is no report of this run.
    (out / "cost" / MANIFEST).unlink()
    assert "no cost report manifest" in (stale_report_line(resolve(str(out))) or "")


def test_a_plain_audit_after_a_replay_leaves_no_replay_folders(
        archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok("audit", str(archive), "--out", str(out), "--replay", "--no-progress")
    assert (out / "turns").is_dir() and (out / "requests").is_dir()
    ok("audit", str(archive), "--out", str(out), "--no-progress")
    assert not (out / "turns").exists() and not (out / "requests").exists()
    assert set((read_manifest(resolve(str(out))) or {})["datasets"]) == {
        "integrity/sessions", "integrity/findings", "usage", "subagents"}


def test_a_dataset_folder_holding_other_files_is_left(archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok("audit", str(archive), "--out", str(out), "--replay", "--no-progress")
    (out / "turns" / "my-notes.txt").write_text("mine")
    ok("audit", str(archive), "--out", str(out), "--no-progress")
    assert sorted(p.name for p in (out / "turns").iterdir()) == ["my-notes.txt"]
    assert not (out / "requests").exists()


def test_generate_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    ok("generate", str(fleet), "--sessions", "2", "--seed", "1")
    before = snapshot(fleet)
    one_error_line(vakpipe("generate", str(fleet), "--sessions", "2", "--seed", "2"),
                   str(fleet), "not empty", "--force")
    assert snapshot(fleet) == before
    ok("generate", str(fleet), "--sessions", "2", "--seed", "2", "--force")
    truth = json.loads((fleet / GROUND_TRUTH).read_text())
    assert len(truth) == 2 and set(truth) < {k for k in snapshot(fleet) if k.endswith(".jsonl")}


@pytest.mark.parametrize("command", ["audit", "replay", "cost-dir"])
def test_an_unrelated_non_empty_out_is_refused_unless_forced(
        archive: Path, tmp_path: Path, command: str) -> None:
    mine = tmp_path / "my-folder"
    (mine / "photos").mkdir(parents=True)
    (mine / "thesis.txt").write_text("do not mix")
    (mine / "photos" / "a.jpg").write_bytes(b"\xff\xd8")
    before = snapshot(mine)
    if command == "cost-dir":
        out = tmp_path / "out"
        ok("audit", str(archive), "--out", str(out), "--no-progress")
        one_error_line(vakpipe("cost", str(out), "--report-dir", str(mine)),
                       str(mine), "not a report's folder")
        assert snapshot(mine) == before
        return
    args = (command, str(archive), "--out", str(mine), "--no-progress")
    one_error_line(vakpipe(*args), str(mine), "not a vakpipe output", "--force")
    assert snapshot(mine) == before
    ok(*args, "--force")
    after = snapshot(mine)
    assert {k: after[k] for k in before} == before  # nothing of theirs touched
    assert (mine / MANIFEST).is_file()
    # Now a vakpipe output: the next run needs no --force.
    ok(*args)


def test_the_small_file_writer_never_follows_a_link(tmp_path: Path) -> None:
    out = resolve(str(tmp_path / "out"))
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").symlink_to(victim)
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        write_small_file(out, out.join("summary.json"), b"{}")
    assert victim.read_text() == "precious"
    # A link on the way (a folder) is refused too, and nothing is created through it.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out" / "cost").symlink_to(elsewhere)
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        write_small_file(out, out.join("cost", "report.html"), b"<html>")
    assert list(elsewhere.iterdir()) == []
    # Outside OUT, or climbing out of it: refused.
    for path in (str(tmp_path / "x.json"), out.join("..", "x.json")):
        with pytest.raises(UnsafeOutputError):
            write_small_file(out, path, b"{}")
    # A plain path: written whole, no temporary file left, a hard link replaced.
    write_small_file(out, out.join("a", "b.json"), b"1")
    os.link(tmp_path / "out" / "a" / "b.json", tmp_path / "hard.json")
    write_small_file(out, out.join("a", "b.json"), b"2")
    assert (tmp_path / "hard.json").read_bytes() == b"1"
    assert sorted(p.name for p in (tmp_path / "out" / "a").iterdir()) == ["b.json"]
    assert (tmp_path / "out" / "a" / "b.json").read_bytes() == b"2"


def test_cost_refuses_a_report_file_that_is_a_link(archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok("audit", str(archive), "--out", str(out), "--no-progress")
    victim = tmp_path / "victim.html"
    victim.write_text("precious")
    (out / "cost").mkdir()
    (out / "cost" / "report.html").symlink_to(victim)
    one_error_line(vakpipe("cost", str(out)), "symbolic link")
    assert victim.read_text() == "precious"


def test_the_demo_writes_only_under_its_out() -> None:
    # The folders of the demo's runs (the run itself: tests/integration/test_demo.py).
    for path in (audit_out("out/demo"), compaction_out("out/demo", "bound"),
                 compaction_out("out/demo/", "half")):
        assert path.startswith("out/demo/") and ".." not in path


def test_a_run_and_nights_never_share_an_out(archive: Path, tmp_path: Path) -> None:
    """An audit (or replay, regress, one-step cost) into a nightly output would commit a
    run at its root, which every reader reads before the nights; a nightly into a run's
    output would put nights its readers never see. Both refused before anything is read,
    nothing written."""
    nightly, audited = tmp_path / "nightly", tmp_path / "audited"
    ok("nightly", str(archive), "--out", str(nightly), "--workers", "0", "--no-progress")
    ok("audit", str(archive), "--out", str(audited), "--workers", "0", "--no-progress")
    before = snapshot(tmp_path)
    for args in (["audit", str(archive), "--out", str(nightly)],
                 ["replay", str(archive), "--out", str(nightly)],
                 ["cost", str(archive), "--out", str(nightly)]):
        one_error_line(vakpipe(*args, "--workers", "0", "--no-progress"),
                       "is a nightly output")
    one_error_line(vakpipe("nightly", str(archive), "--out", str(audited), "--workers",
                           "0", "--no-progress"), "holds a run of its own")
    assert snapshot(tmp_path) == before
