"""Rows 10 and 11: a client killed around its commit, and the same run twice.

Row 10 runs ``vakpipe`` as a separate process that SIGKILLs itself at a chosen point of
the commit protocol (the kill is real; where it lands is chosen by wrapping one function
in that process only, see :data:`CRASHING_VAKPIPE`):

* ``before-commit``: every part staged under ``OUT/_staging/<run>/``, nothing moved;
* ``before-manifest``: inside the commit, the parts moved into the dataset folders, the
  new manifest not written.

Either way the previous output stays in force (readers go through ``_manifest.json``),
and the next run commits exactly what an undisturbed run commits, removes the parts the
killed run moved in, and the staging folders it left.

Row 11: running the same command twice leaves one run's files and no duplicate row, for
every dataset, read through the manifest *and* as a plain folder of Parquet files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pyarrow.dataset as ds
import pytest
import s3fs

from pipeline.cli import EXIT_OK, run
from pipeline.io.commit import MANIFEST, STAGING, SUCCESS, read_manifest
from pipeline.io.storage import resolve
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from pipeline.tables.schemas import DATASETS, REPLAY_DATASETS
from tests.helpers.storage import BUCKET, committed_rows, plain_rows, vakpipe_exe

ARCHIVE = f"s3://{BUCKET}/archive"
TABLES = sorted({*DATASETS, *REPLAY_DATASETS})

#: ``python -c`` program: ``vakpipe`` that SIGKILLs itself at ``$CRASH_AT``.
CRASHING_VAKPIPE = """
import os, signal, sys
from pipeline.io import commit

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if os.environ["CRASH_AT"] == "before-commit":
    commit.StagedRun.commit = die
else:  # before-manifest: the commit reads the previous manifest right before its own
    commit.read_manifest = die
from pipeline.cli import main
main(prog_name="vakpipe")
"""


def vakpipe(*args: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """``vakpipe ARGS`` in a process of its own (killing itself at ``crash_at``)."""
    env = {**os.environ, **({"CRASH_AT": crash_at} if crash_at else {})}
    program = [sys.executable, "-c", CRASHING_VAKPIPE] if crash_at else [vakpipe_exe()]
    return subprocess.run([*program, *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def objects(prefix: str) -> dict[str, bytes]:
    """Every object under ``BUCKET/prefix`` (relative key: bytes), straight from moto."""
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    base = f"{BUCKET}/{prefix}/"
    return {p[len(base):]: fs.cat_file(p) for p in fs.find(base)}


def tables(prefix: str, names: list[str] = TABLES) -> dict[str, list[dict[str, Any]]]:
    return {d: committed_rows(resolve(f"s3://{BUCKET}/{prefix}"), d) for d in names}


def folder_rows(prefix: str, dataset: str) -> list[dict[str, Any]]:
    """Every row of every Parquet file in a dataset's folder: what a reader that ignores
    the manifest sees."""
    loc = resolve(f"s3://{BUCKET}/{prefix}")
    return plain_rows(ds.dataset(loc.join(dataset), filesystem=loc.filesystem(),
                                 format="parquet").to_table())


def assert_one_clean_run(prefix: str, names: list[str] = TABLES) -> None:
    """Only the committed run's files are there: no staging, no stray part, no duplicate."""
    files = objects(prefix)
    manifest = read_manifest(resolve(f"s3://{BUCKET}/{prefix}"))
    assert manifest is not None
    assert not any(k.startswith(f"{STAGING}/") for k in files), sorted(files)
    named = {f"{d}/{f}" for d, v in manifest["datasets"].items() for f in v["files"]}
    # Part files of the tables, and the compacted copies (the ``archive`` dataset).
    assert {k for k in files if k.endswith(".parquet") or k.startswith("archive/")} == named
    assert files[SUCCESS] == manifest["run_id"].encode()
    for d in names:
        rows = committed_rows(resolve(f"s3://{BUCKET}/{prefix}"), d)
        assert folder_rows(prefix, d) == rows
        assert manifest["datasets"][d]["rows"] == len(rows)


def grow_archive() -> None:
    """Change the archive, so a new run's output differs from the previous one's."""
    write_fleet(resolve(f"{ARCHIVE}"), sessions=7, seed=31, size_scale=0.2)


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", ["before-commit", "before-manifest"])
def test_a_client_killed_at_its_commit_leaves_the_previous_output_and_a_rerun_is_clean(
    crash_at: str, s3: LocalS3, scheduler: str
) -> None:
    write_fleet(resolve(ARCHIVE), sessions=5, seed=30, faults=True, size_scale=0.2)
    common = ["--scheduler", scheduler, "--no-progress", "--replay"]
    out = f"s3://{BUCKET}/out"
    assert run(["audit", ARCHIVE, "--out", out, *common]) == EXIT_OK
    before, rows_before = objects("out"), tables("out")
    grow_archive()

    killed = vakpipe("audit", ARCHIVE, "--out", out, *common, crash_at=crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    after = objects("out")
    staged = {k for k in after if k.startswith(f"{STAGING}/")}
    assert tables("out") == rows_before  # readers see exactly the previous run
    assert after[MANIFEST] == before[MANIFEST] and after[SUCCESS] == before[SUCCESS]
    if crash_at == "before-commit":  # every part staged, then the kill
        assert {k.rsplit("/", 2)[-2] for k in staged if k.endswith(".parquet")} >= \
            {"sessions", "findings", "usage", "turns", "requests"}
        assert {k: v for k, v in after.items() if k not in staged} == before
    else:  # the killed run's parts were moved in beside the previous ones: strays
        strays = {k for k in after if k.endswith(".parquet") and k not in before}
        assert len(strays) == len(TABLES) and not staged

    # The next run commits what an undisturbed run commits, and cleans up after the kill.
    assert run(["audit", ARCHIVE, "--out", out, *common]) == EXIT_OK
    assert run(["audit", ARCHIVE, "--out", f"s3://{BUCKET}/undisturbed", *common]) == EXIT_OK
    assert tables("out") == tables("undisturbed") != rows_before
    assert_one_clean_run("out")


@pytest.mark.slow
def test_the_same_run_twice_leaves_one_run_and_no_duplicate_row(
    s3: LocalS3, scheduler: str
) -> None:
    write_fleet(resolve(ARCHIVE), sessions=6, seed=32, faults=True, size_scale=0.3)
    common = ["--scheduler", scheduler, "--no-progress"]
    out = f"s3://{BUCKET}/twice"
    compaction = [*TABLES, "compaction"]
    compact = ["compact", ARCHIVE, "--out", out, "--window", "8000", "--write-archive",
               *common]
    assert run(compact) == EXIT_OK
    first, first_files = tables("twice", compaction), objects("twice")
    assert run(compact) == EXIT_OK
    assert tables("twice", compaction) == first
    assert_one_clean_run("twice", compaction)
    # The compacted copies: the same keys, once each (their packets carry the run time).
    copies = {k for k in objects("twice") if k.startswith("archive/")}
    assert copies == {k for k in first_files if k.startswith("archive/")} and copies
    sessions = [r["session_path"] for r in first["integrity/sessions"]]
    assert len(sessions) == len(set(sessions)) == 6
    # The nightly partition of one day, run twice: still one run's files in it.
    night = ["nightly", ARCHIVE, "--out", f"s3://{BUCKET}/nightly", "--date", "2026-12-01",
             *common]
    assert run(night) == EXIT_OK
    once = tables("nightly/date=2026-12-01", [*TABLES, "checkpoints"])
    assert run(night) == EXIT_OK
    assert tables("nightly/date=2026-12-01", [*TABLES, "checkpoints"]) == once
    assert_one_clean_run("nightly/date=2026-12-01", [*TABLES, "checkpoints"])
