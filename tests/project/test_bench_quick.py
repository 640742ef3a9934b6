"""``bench/small_archive.py --quick`` runs (audit + cost of the real Claude Code set)."""

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
