"""A whole replay run: audit and replay in one pass, committed tables, exact figures."""

from __future__ import annotations

from pathlib import Path

import fsspec

from pipeline.io.commit import read_dataset
from pipeline.io.storage import resolve
from pipeline.run.orchestrate import run_audit
from pipeline.run.replay_batches import ReplayOptions
from pipeline.synth.fleet import write_fleet
from tests.helpers.storage import plain_rows


def test_audit_with_replay_reproduces_every_generated_figure(
    memfs: fsspec.AbstractFileSystem, tmp_path: Path
) -> None:
    root = resolve("memory://fleet")
    write_fleet(root, sessions=8, seed=4, consistent=True)
    out = resolve(str(tmp_path / "out"))
    summary = run_audit(root, out, workers=2, progress=False, replay=ReplayOptions())
    assert summary.sessions == 8
    requests = read_dataset(out, "requests").to_pylist()
    turns = plain_rows(read_dataset(out, "turns"))  # first_ts: nanoseconds
    assert requests and turns
    # The generator writes usage, prefix digests and card tokens exactly as rule set v1
    # replays them: no drift anywhere on the active chains.
    assert all(r["drift_tokens"] == 0 for r in requests)
    assert all(r["prefix_digest_match"] in (True, None) for r in requests)
    carded = [t for t in turns if t["recorded_tokens_full"] is not None]
    assert carded and all(t["tokens_full"] == t["recorded_tokens_full"] for t in carded)
    assert all(r["now_line"].startswith("context ") for r in requests)
    assert {r["rules"] for r in requests} == {"v1"}


def test_scope_selects_requests(memfs: fsspec.AbstractFileSystem, tmp_path: Path) -> None:
    root = resolve("memory://fleet")
    write_fleet(root, sessions=3, seed=5, consistent=False)
    out = resolve(str(tmp_path / "out"))
    run_audit(root, out, workers=1, progress=False, replay=ReplayOptions(scope="t1"))
    scopes = {r["scope"] for r in read_dataset(out, "requests").to_pylist()}
    assert scopes and all(s.startswith("t1/") for s in scopes)


def test_cli_audit_replay_and_refusals(memfs: fsspec.AbstractFileSystem, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pipeline.cli import main

    write_fleet(resolve("memory://cli"), sessions=3, seed=6, consistent=False)
    out = tmp_path / "out"
    runner = CliRunner()
    ok = runner.invoke(main, ["audit", "memory://cli", "--out", str(out), "--replay",
                              "--window", "50000", "--workers", "1", "--no-progress"])
    assert ok.exit_code == 0, ok.output
    rows = read_dataset(resolve(str(out)), "requests").to_pylist()
    assert rows and {r["model_input_limit"] for r in rows} == {50000}
    for bad in (["--rules", "v9"], ["--scope", "t3/x"]):
        res = runner.invoke(main, ["audit", "memory://cli", "--out", str(out), *bad])
        assert res.exit_code == 2 and "vakpipe: error:" in res.output
