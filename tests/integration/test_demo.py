"""Smoke test of ``vakpipe demo``: the one command a newcomer runs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.io.commit import read_dataset, read_manifest
from pipeline.io.storage import resolve
from tests.helpers.storage import vakpipe_exe


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo-out"
    # The demo starts its own S3 endpoint: nothing of the test session's may leak in.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "DASK_SCHEDULER"))}
    done = subprocess.run(
        [vakpipe_exe(), "demo", "--sessions", "20", "--out", str(out), "--workers", "2"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("local S3 endpoint: http://127.0.0.1:")
    assert any(line.startswith("uploaded 20 generated sessions") and
               "and 4 segment ledgers" in line for line in lines)
    # The JSONL fleet and the segment ledgers (plain: read without keys), in one run.
    assert any(line.startswith("run ") and " 24 sessions" in line for line in lines)
    assert "  segment ledgers: 4 (plain 4, opened 0, sealed 0)" in lines
    assert any(line.strip().startswith("status:") for line in lines)
    assert any("findings by code:" in line for line in lines)
    # The compaction what-ifs, each in its folder under --out (nothing beside it).
    at = lines.index("compaction what-ifs (planner v1, summaries from the turn cards):")
    bound, half = lines[at + 1], lines[at + 2]
    for line, name, label in ((bound, "bound", "at the bound window"),
                              (half, "half", "at half the bound window")):
        folder = out / f"compaction-{name}"
        match = re.fullmatch(rf"  {label}: (\d+) of 24 sessions need packets \((\d+) planned, "
                             rf"(\d+) superseded\); tables: {re.escape(str(folder))}", line)
        assert match, line
        manifest = read_manifest(resolve(str(folder)))
        assert manifest is not None and manifest["sessions"] == 24
        table = read_dataset(resolve(str(folder)), "compaction")
        assert table.num_rows == int(match[2])
        assert len(set(table["session_path"].to_pylist())) == int(match[1])
        assert set(table["profile"].to_pylist()) <= {"bound" if name == "bound" else "boundx0.5"}
        assert "requests" in manifest["datasets"] and "archive" not in manifest["datasets"]
    # Half the window never needs fewer packets than the whole of it.
    assert int(half.split()[5]) >= int(bound.split()[4])
    assert lines[-1].startswith(f"results: {out} ")
    # Everything the demo writes is under --out: its folder is the only new entry.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-out"]
    assert sorted(p.name for p in out.iterdir()) == ["audit", "compaction-bound",
                                                      "compaction-half"]
    out = out / "audit"
    manifest = read_manifest(resolve(str(out)))
    assert manifest is not None and manifest["sessions"] == 24
    assert (out / "_SUCCESS").read_text() == manifest["run_id"]
    for dataset in ("integrity/sessions", "integrity/findings"):
        files = manifest["datasets"][dataset]["files"]
        assert files and all((out / dataset / f).is_file() for f in files)
        rows = sum(pq.read_table(out / dataset / f).num_rows for f in files)
        assert rows == manifest["datasets"][dataset]["rows"]
    sessions = read_dataset(resolve(str(out)), "integrity/sessions")
    assert sessions.num_rows == 24
    assert sessions["storage"].to_pylist().count("segments") == 4
    assert not (out / "_staging").exists()
