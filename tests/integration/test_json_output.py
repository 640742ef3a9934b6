"""``--json`` on every command (issue 23, docs/json-output.md): each command runs as a
separate process, its stdout is exactly one JSON document of schema
``vakpipe.<command>/1`` (parsed here), the human text goes to stderr, and the exit code
is the one the command gives without ``--json``. ``cost`` is in test_cost_reading.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest

from pipeline.cli import EXIT_FINDINGS, EXIT_OK, EXIT_UNUSABLE, main
from tests.helpers.data_paths import REAL
from tests.helpers.storage import vakpipe_exe

SHORT = REAL / "claude-code" / "projects" / "-home-marco-projects-spotter" / "short.jsonl"


def _run(*args: str, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                          timeout=600, check=False, cwd=cwd, env=env)


def _document(done: subprocess.CompletedProcess[str], command: str,
              code: int = EXIT_OK) -> dict[str, Any]:
    assert done.returncode == code, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # one document and nothing else on stdout
    doc: dict[str, Any] = json.loads(lines[0])
    assert doc["schema"] == f"vakpipe.{command}/1"
    assert doc["exit"] == code
    assert lines[0].isascii()  # escaped: nothing from a ledger reaches a terminal raw
    return doc


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("json") / "fleet"
    doc = _document(_run("generate", str(root), "--sessions", "6", "--seed", "3", "--faults",
                         "--json"), "generate")
    assert doc["sessions"] == 6 and doc["bytes"] > 0 and doc["faults"] is True
    assert Path(doc["ground_truth"]).exists()
    return root


def test_audit_and_replay_print_the_run_summary(fleet: Path, tmp_path: Path) -> None:
    done = _run("audit", str(fleet), "--out", str(tmp_path / "a"), "--workers", "0",
                "--json")
    doc = _document(done, "audit")
    assert doc["sessions"] == 6 and doc["partial"] is False
    assert sum(doc["statuses"].values()) == 6
    assert sum(doc["findings_by_code"].values()) == sum(
        n for codes in doc["findings_by_severity"].values() for n in codes.values())
    assert doc["out"] == str(tmp_path / "a") and doc["run_id"]
    assert f"run {doc['run_id']}: 6 sessions" in done.stderr  # the human text, on stderr
    # --fail-on: the same exit code as without --json, and still the document.
    failing = _run("audit", str(fleet), "--out", str(tmp_path / "f"), "--workers", "0",
                   "--fail-on", "warning", "--json")
    assert _document(failing, "audit", EXIT_FINDINGS)["statuses"] == doc["statuses"]
    assert "--fail-on warning matched" in failing.stderr
    replayed = _document(_run("replay", str(fleet), "--out", str(tmp_path / "r"),
                              "--workers", "0", "--json"), "replay")
    assert replayed["sessions"] == 6


def test_show_prints_the_request_row_and_the_text(tmp_path: Path) -> None:
    doc = _document(_run("show", str(SHORT), "--scope", "t1/i1", "--json"), "show")
    assert doc["scope"] == "t1/i1" and doc["request"]["model"] == "claude-opus-4-6"
    assert doc["request"]["reported_input_tokens"] == 25353
    assert doc["session"]["source"] == "claude-code"
    assert isinstance(doc["text"], list) and doc["text"]


def test_compact_nightly_and_regress(fleet: Path, tmp_path: Path) -> None:
    compact = _document(_run("compact", str(fleet), "--out", str(tmp_path / "c"),
                             "--workers", "0", "--json"), "compact")
    assert compact["sessions"] == 6
    assert set(compact["compaction"]) >= {"sessions_needing_packets", "packets"}
    night = _document(_run("nightly", str(fleet), "--out", str(tmp_path / "n"), "--workers",
                           "0", "--date", "2026-12-01", "--json"), "nightly")
    assert night["day"] == "2026-12-01" and night["sessions"] == 6
    assert night["baseline"] is None and "changes" in night
    regress = _document(_run("regress", str(fleet), "--out", str(tmp_path / "g"),
                             "--candidate", "v1-terse-cards", "--workers", "0", "--json"),
                        "regress")
    assert regress["baseline"]["rules"] == "v1"
    assert regress["candidate"]["rules"] == "v1-terse-cards"
    assert regress["passed"] is True and "thresholds" in regress


def test_unusable_input_is_an_error_document_and_exit_2(tmp_path: Path) -> None:
    done = _run("audit", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"), "--json")
    doc = _document(done, "error", EXIT_UNUSABLE)
    assert doc["command"] == "audit" and "does not exist" in doc["error"]
    assert done.stderr.startswith("vakpipe: error:")


def _leaves(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every command a user runs (``export otel`` under its group), by its full name."""
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found.update(_leaves(command, f"{prefix}{name} "))
        else:
            found[prefix + name] = command
    return found


def test_every_command_takes_json() -> None:
    # A command added later without --json fails here, not in a user's script.
    leaves = _leaves(main)
    assert "export otel" in leaves
    assert sorted(leaves) == sorted(
        name for name, command in leaves.items()
        if any(p.name == "as_json" for p in command.params))


@pytest.mark.slow
def test_demo(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "DASK_SCHEDULER"))}
    done = _run("demo", "--sessions", "8", "--out", str(tmp_path / "d"), "--workers", "1",
                "--json", cwd=tmp_path, env=env)
    doc = _document(done, "demo")
    # The JSONL fleet and the demo's 4 plain segment ledgers.
    assert doc["fleet"]["sessions"] == 8 and doc["fleet"]["segment_ledgers"] == 4
    assert doc["audit"]["sessions"] == 12
    assert set(doc["what_ifs"]) == {"bound", "half"}
    assert "local S3 endpoint" in done.stderr
