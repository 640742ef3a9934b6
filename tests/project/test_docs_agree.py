"""What the README promises, as a new user trying every command meets it (issue 18):

- every reading command takes ``--max-line-bytes``, and ``show`` and ``regress`` read
  through it (``show`` its one ledger, ``regress`` both replays);
- locations are printed as the URL the user gave (``s3://`` kept);
- an empty ``--since/--until`` window says so, and which days the data covers.

The commands run as the installed ``vakpipe`` script, in their own processes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.io.commit import read_dataset
from pipeline.io.storage import resolve
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from tests.helpers.ledgers import sample_session, session_key, usage
from tests.helpers.storage import BUCKET, vakpipe_exe

READING = ("audit", "replay", "show", "nightly", "compact", "regress")
LIMIT = "2KiB"


def vakpipe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.parametrize("command", READING)
def test_every_reading_command_takes_the_line_limit(command: str) -> None:
    done = CliRunner().invoke(main, [command, "--help"])
    assert done.exit_code == 0 and "--max-line-bytes" in done.output


def long_line_archive(root: Path, *, last: bool = False) -> Path:
    """One session whose second turn's directive is a 4,000-byte line (``last``: the
    ledger's last line, else the request after it chains to it): whole under the default
    limit, a damaged line under 2 KiB."""
    b = sample_session(turns=1)
    b.user("y" * 4000)
    if not last:
        b.assistant("ok", u=usage(5, 1))
    path = root / session_key().path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b.to_bytes())
    return path


def test_show_reads_through_the_line_limit(tmp_path: Path) -> None:
    path = long_line_archive(tmp_path / "archive", last=True)
    whole = vakpipe("show", str(path), "--scope", "t1/i1")
    assert whole.returncode == 0, whole.stderr
    assert "audit     ok" in whole.stdout
    limited = vakpipe("show", str(path), "--scope", "t1/i1", "--max-line-bytes", LIMIT)
    assert limited.returncode == 0, limited.stderr
    # the over-long last line is a torn tail, as `vakpipe replay` reports it ...
    assert "audit     warning · 0 errors, 1 warnings · active chain 7 of 7" in limited.stdout
    # ... and the request before it is shown as before
    def request(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if not ln.startswith("audit ")]
    assert request(limited.stdout) == request(whole.stdout)
    assert vakpipe("show", str(path), "--scope", "t1/i1",
                   "--max-line-bytes", "0").returncode == 2


def test_regress_reads_both_replays_through_the_line_limit(tmp_path: Path,
                                                           dask_scheduler: str) -> None:
    root = tmp_path / "archive"
    long_line_archive(root)
    out = tmp_path / "reg"
    done = vakpipe("regress", str(root), "--out", str(out), "--candidate", "v1",
                   "--max-line-bytes", LIMIT, "--scheduler", dask_scheduler,
                   "--no-progress")
    assert done.returncode == 0, done.stderr
    for side in ("baseline", "candidate"):
        findings = read_dataset(resolve(str(out / side)), "integrity/findings").to_pylist()
        assert [f["code"] for f in findings] == ["damaged_entry", "orphan_parent"], side
        assert "2,048 bytes" in findings[0]["detail"], side


def test_s3_locations_are_printed_as_urls(s3: LocalS3, dask_scheduler: str) -> None:
    archive, out = f"s3://{BUCKET}/archive", f"s3://{BUCKET}/reports"
    write_fleet(resolve(archive), sessions=3, seed=2, size_scale=0.3)
    done = vakpipe("audit", archive, "--out", out, "--scheduler", dask_scheduler,
                   "--no-progress")
    assert done.returncode == 0, done.stderr
    # the README's layout: OUT/integrity/sessions, not OUT/integrity/integrity/...
    assert f"tables: {out}/integrity/sessions, {out}/integrity/findings" in done.stdout
    done = vakpipe("cost", out)
    assert done.returncode == 0, done.stderr
    report = next(ln for ln in done.stdout.splitlines() if ln.strip().startswith("report:"))
    assert report.strip() == (f"report: {out}/cost/costs.parquet, {out}/cost/costs.csv, "
                              f"{out}/cost/report.html")


def test_an_empty_window_says_which_days_the_data_covers(tmp_path: Path,
                                                        dask_scheduler: str) -> None:
    root, out = tmp_path / "archive", tmp_path / "out"
    write_fleet(resolve(str(root)), sessions=3, seed=2, size_scale=0.3)
    assert vakpipe("audit", str(root), "--out", str(out), "--scheduler", dask_scheduler,
                   "--no-progress").returncode == 0
    days = sorted(d for d in read_dataset(resolve(str(out)), "usage")["day"].to_pylist()
                  if d is not None)
    done = vakpipe("cost", str(out), "--since", "2031-01-01", "--until", "2031-01-31")
    assert done.returncode == 0, done.stderr
    line = f"no usage between 2031-01-01 and 2031-01-31; the data covers {days[0]} to {days[-1]}"
    assert [ln for ln in done.stderr.splitlines() if "no usage" in ln] == [f"vakpipe: {line}"]
    # a window with usage says nothing of the kind
    done = vakpipe("cost", str(out), "--since", days[0].isoformat())
    assert done.returncode == 0 and "no usage" not in done.stderr
