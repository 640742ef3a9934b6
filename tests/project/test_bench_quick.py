"""The quick modes of the benchmarks run: ``bench/small_archive.py`` (audit + cost of the
real Claude Code set), ``bench/nightly_incremental.py`` (both layouts, two sizes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_small_archive_bench_quick() -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "small_archive.py"), "--quick"],
                          capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "vakpipe audit + cost: best" in done.stdout


def test_nightly_incremental_bench_quick() -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "nightly_incremental.py"),
                           "--quick"], capture_output=True, text=True, timeout=600,
                          check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    for layout in ("partitions", "delta"):
        assert f"{layout}: second / first night bytes written" in done.stdout
    assert "runner peak RSS slope" in done.stdout and "extrapolated to 1,000,000" in done.stdout
