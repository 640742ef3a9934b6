"""Row 15: a big session is audited with bounded memory.

One session, generated straight to disk, is audited in a fresh process with the code of
one audit task (``bench/big_session.py --measure``); the process's peak resident memory
over what it held before the audit must stay within a budget that depends on the
session's *entries* and its *longest line*, never on its bytes:

    32 MiB + 2 KiB per entry + 3 x the longest line

(the tree index keeps a small node per entry, ~1.2 KiB measured, to find the head and
the active chain; a line is parsed whole, and the ``--max-line-bytes`` guard bounds the
longest one read). Two shapes: a realistic session (many small entries) and one of few
very long lines (tool results 40 times their usual size).

The default size keeps the suite fast; ``VAKPIPE_BIG_SESSION_MB=2048`` runs the 2 GB
session of the matrix (minutes), as does the benchmark:
``.venv/bin/python bench/big_session.py --mb 2048``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "big_session.py"
SIZE_MB = int(os.environ.get("VAKPIPE_BIG_SESSION_MB", "32"))


def budget(entries: int, longest: int) -> int:
    """The memory an audit task may add for a session (see the module docstring)."""
    return 32 * 2**20 + 2048 * entries + 3 * longest


@pytest.mark.slow
@pytest.mark.parametrize("scale", [1.0, 40.0], ids=["many-entries", "long-lines"])
def test_a_big_session_is_audited_in_bounded_memory(scale: float, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--mb", str(SIZE_MB), "--scale",
                           str(scale), "--dir", str(tmp_path), "--json"],
                          capture_output=True, text=True, check=True, timeout=3600)
    figures = json.loads(done.stdout.splitlines()[-1])
    (ledger,) = tmp_path.rglob("*.jsonl")
    with open(ledger, "rb") as f:
        lengths = [len(line) for line in f]
    assert figures["bytes"] == sum(lengths) >= SIZE_MB * 10**6
    assert figures["lines"] == len(lengths) == figures["entries"]
    assert figures["status"] == "ok"
    grown = figures["rss_peak"] - figures["rss_before"]
    assert grown <= budget(figures["entries"], max(lengths)), (
        f"{grown / 2**20:.0f} MiB for {figures['entries']:,} entries, longest line "
        f"{max(lengths) / 2**20:.1f} MiB, {figures['bytes'] / 2**20:.0f} MiB in all")
