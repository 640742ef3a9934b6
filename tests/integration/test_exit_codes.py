"""One test per row of the README's exit-code table, through the real CLI in a process.

0 the run completed; 1 ``--fail-on`` matched (and the line says which findings); 2 an
unusable input or setup, found before any session is read, as one ``vakpipe: error:``
line and in seconds (missing root and empty root told apart, a bad or unreachable
scheduler, an unreachable summariser, an output that takes no write); 3 partial.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from pipeline.cli import EXIT_FINDINGS, EXIT_OK, EXIT_PARTIAL, EXIT_UNUSABLE
from pipeline.io.storage import resolve
from pipeline.synth.fleet import write_fleet
from tests.helpers.storage import vakpipe_exe


def vakpipe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([vakpipe_exe(), *args, "--no-progress"], capture_output=True,
                          text=True, timeout=120, check=False)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == EXIT_UNUSABLE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vakpipe: error: "), done.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet")
    write_fleet(resolve(str(root)), sessions=12, seed=3, faults=True)
    return root


def test_0_a_completed_run(fleet: Path, tmp_path: Path) -> None:
    done = vakpipe("audit", str(fleet), "--out", str(tmp_path / "out"))
    assert done.returncode == EXIT_OK, done.stderr
    assert done.stderr == ""
    assert (tmp_path / "out" / "_SUCCESS").exists()


def test_1_fail_on_says_which_findings_matched(fleet: Path, tmp_path: Path) -> None:
    done = vakpipe("audit", str(fleet), "--out", str(tmp_path / "out"), "--fail-on", "warning")
    assert done.returncode == EXIT_FINDINGS, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("vakpipe: --fail-on warning matched: sessions ")
    assert "findings " in line and "e.g. agents/vak/sessions/" in line


def test_2_missing_root_and_empty_root_differ(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    missing = one_error_line(vakpipe("audit", str(tmp_path / "nope"), "--out",
                                     str(tmp_path / "o1")))
    empty = one_error_line(vakpipe("audit", str(tmp_path / "empty"), "--out",
                                   str(tmp_path / "o2")))
    assert "does not exist" in missing
    assert "no session ledgers found" in empty
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_2_a_malformed_scheduler_address(fleet: Path, tmp_path: Path) -> None:
    line = one_error_line(vakpipe("audit", str(fleet), "--out", str(tmp_path / "o"),
                                  "--scheduler", "bogus"))
    assert "bad Dask scheduler address 'bogus'" in line


@pytest.mark.slow
def test_2_an_unreachable_scheduler(fleet: Path, tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    line = one_error_line(vakpipe("audit", str(fleet), "--out", str(tmp_path / "o"),
                                  "--scheduler", address))
    assert f"cannot reach the Dask scheduler '{address}'" in line
    assert not (tmp_path / "o" / "_staging").exists()


def test_2_a_tls_scheduler_without_tls_settings_in_one_line(fleet: Path,
                                                            tmp_path: Path) -> None:
    # The client that could not start once waited out a 20 s timeout at exit, then
    # printed its finaliser's traceback under the error line.
    line = one_error_line(vakpipe("audit", str(fleet), "--out", str(tmp_path / "o"),
                                  "--scheduler", f"tls://127.0.0.1:{free_port()}"))
    assert "cannot reach the Dask scheduler 'tls://127.0.0.1:" in line
    assert "TLS expects a `ssl_context`" in line


def test_2_an_unreachable_summariser_before_any_read(fleet: Path, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    line = one_error_line(vakpipe("compact", str(fleet), "--out", str(tmp_path / "o"),
                                  "--summariser", "http", "--summariser-url", url,
                                  "--model", "claude-sonnet-4-5"))
    assert "summariser endpoint http://127.0.0.1:" in line and "cannot connect" in line
    assert not (tmp_path / "o").exists()


def test_2_a_dask_configuration_the_local_cluster_cannot_start_with(
    fleet: Path, tmp_path: Path
) -> None:
    """A memory target that is no number (in DASK_* or a YAML file): the workers fail as
    they start. It was distributed's traceback and exit 1 (--fail-on's code); now the
    last line says what failed and where to look, exit 2. The workers' own log of it,
    in their processes, still comes first."""
    done = subprocess.run([vakpipe_exe(), "audit", str(fleet), "--out", str(tmp_path / "o"),
                           "--workers", "1", "--no-progress"], capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**os.environ, "DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "abc"})
    assert done.returncode == EXIT_UNUSABLE, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("vakpipe: error: the local Dask cluster did not start: "), last
    assert "check the Dask configuration" in last
    assert not (tmp_path / "o" / "_manifest.json").exists()


@pytest.mark.parametrize("where", ["file", "folder"])
def test_2_a_dask_configuration_file_that_does_not_parse(fleet: Path, tmp_path: Path,
                                                         where: str) -> None:
    """dask reads its YAML files at its import: a malformed one was the import's
    traceback, exit 1. A folder's file is read only when it may set the scheduler's
    address (so a small run in this process looks at it); a run with a cluster always."""
    bad = tmp_path / "dask" / "bad.yaml"
    bad.parent.mkdir()
    bad.write_text("scheduler-address: [tcp://x\n" if where == "folder" else
                   "distributed: [1, 2\n")
    config = str(bad if where == "file" else bad.parent)
    line = one_error_line(subprocess.run(
        [vakpipe_exe(), "audit", str(fleet), "--out", str(tmp_path / "o"), "--no-progress",
         *(["--workers", "1"] if where == "file" else [])],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "DASK_CONFIG": config}))
    assert line == (f"vakpipe: error: the Dask configuration does not read: A dask config "
                    f"file at '{bad}' is malformed; check the Dask configuration (DASK_* "
                    "variables, DASK_CONFIG, ~/.config/dask)")


def test_2_an_output_that_takes_no_write(fleet: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    line = one_error_line(vakpipe("audit", str(fleet), "--out", str(blocker / "out")))
    assert str(blocker) in line
    # a file as OUT, or as the run a report reads, is named as what it is
    for args in (["audit", str(fleet), "--out", str(blocker), "--no-progress"],
                 ["cost", str(blocker)],
                 ["dashboard", str(blocker), "--html", str(tmp_path / "d.html")]):
        line = one_error_line(subprocess.run([vakpipe_exe(), *args], capture_output=True,
                                             text=True, timeout=120, check=False))
        assert line.startswith(f"vakpipe: error: {blocker}: a file where a folder is needed")
    assert blocker.read_text() == "not a folder"


def test_2_a_corrupt_manifest_names_the_way_past_it_each_command_has(
    fleet: Path, tmp_path: Path
) -> None:
    """A command that commits into OUT names its ``--force``; a reader of the run, which
    has none, says to write the run again (before: every one said "rerun with --force",
    and the one-step ``cost ROOT --out OUT`` had no ``--force`` either)."""
    def plain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                              timeout=120, check=False)

    out = tmp_path / "out"
    assert vakpipe("audit", str(fleet), "--out", str(out)).returncode == EXIT_OK
    (out / "_manifest.json").write_text('{"datasets": ')
    for args in (["cost", str(out)], ["dashboard", str(out), "--html", str(tmp_path / "d.html")],
                 ["export", "otel", str(out), "--file", str(tmp_path / "spans.json")]):
        line = one_error_line(plain(*args))
        assert "_manifest.json is corrupt (not JSON" in line, line
        assert "the run cannot be read: write it again" in line and "rerun" not in line, line
    for command in ("audit", "cost"):
        line = one_error_line(vakpipe(command, str(fleet), "--out", str(out)))
        assert "nothing was changed: rerun with --force to set it aside" in line, line
    line = one_error_line(plain("cost", str(out), "--force"))
    assert "--force: options of the audit, only with --out" in line
    done = vakpipe("cost", str(fleet), "--out", str(out), "--force")
    assert done.returncode == EXIT_OK, done.stderr
    assert [p.read_text() for p in out.glob("_manifest.json.corrupt-*")] == ['{"datasets": ']


def test_3_a_partial_run(fleet: Path, tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    first = sorted(fleet.rglob("*.jsonl"))[0]
    shutil.copy(first, flat / first.name)
    (flat / "broken.jsonl.gz").write_bytes(b"not gzip at all")
    done = vakpipe("audit", str(flat), "--out", str(tmp_path / "o"), "--fail-on", "error")
    assert done.returncode == EXIT_PARTIAL, done.stderr  # partial comes before --fail-on
