"""``bench/otel_export.py --quick`` runs (the OpenTelemetry export against pricing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_otel_export_bench_quick() -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "otel_export.py"), "--quick"],
                          capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "baseline price_usage by day,model" in done.stdout
    assert "spans/s" in done.stdout
