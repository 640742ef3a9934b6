"""``bench/segment_audit.py --quick`` runs and prints its ratios against the floor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_segment_bench_quick() -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "segment_audit.py"), "--quick"],
                          capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    for kind in ("plain", "sealed"):
        assert f"{kind}: 6 ledgers" in done.stdout
    assert done.stdout.count("x floor") == 10
