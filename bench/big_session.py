"""One big session audited with bounded memory (reliability matrix row 15).

Generates one session of about ``--mb`` MB (streamed to disk, reused across runs), then
audits it in a fresh child process with the code of one audit task (read, audit, tables,
redaction) and reports the child's peak resident memory against its resident memory
before the audit, and the throughput:

    .venv/bin/python bench/big_session.py --mb 2048          # the 2 GB run of the matrix
    .venv/bin/python bench/big_session.py --mb 64 --json     # what tests/reliability runs

Memory grows with the session's entries (the tree index keeps a small node per entry to
find the head and the active chain), never with its bytes: lines are streamed, and one
longer than ``--max-line-bytes`` is skipped in pieces.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rss import peak_rss_bytes

MB = 1_000_000


def measure(root: str, max_line_bytes: int | None) -> dict[str, Any]:
    """Audit the one session under ``root`` as one audit task does; what it cost."""
    from pipeline.io.storage import MAX_LINE_BYTES, enumerate_sessions, resolve
    from pipeline.run.batches import RunContext, audit_batch
    from pipeline.run.orchestrate import redacted

    location = resolve(root)
    listing = enumerate_sessions(location)
    before = peak_rss_bytes()
    t0 = time.perf_counter()
    result = redacted(audit_batch, location, 0, listing.sessions,
                      RunContext(max_line_bytes=max_line_bytes or MAX_LINE_BYTES))
    seconds = time.perf_counter() - t0
    row = result.sessions.select(["bytes", "lines", "entries", "status"]).to_pylist()[0]
    findings = result.findings.select(["line", "code", "detail"]).to_pylist()[:100]
    return {"bytes": row["bytes"], "lines": row["lines"], "entries": row["entries"],
            "status": row["status"], "findings": findings, "seconds": seconds,
            "rss_before": before, "rss_peak": peak_rss_bytes()}


def run_child(root: Path, max_line_bytes: int | None = None) -> dict[str, Any]:
    """:func:`measure` in a fresh process, so its peak memory is the audit's alone."""
    cmd = [sys.executable, __file__, "--measure", str(root)]
    if max_line_bytes is not None:
        cmd += ["--max-line-bytes", str(max_line_bytes)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=2048, help="size of the session (MB)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="size of tool results and texts, times the usual (longer lines)")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where the session is kept (default: the bench folder)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON only")
    ap.add_argument("--measure", metavar="ROOT", help=argparse.SUPPRESS)
    ap.add_argument("--max-line-bytes", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="a 4 MB session (for make test)")
    args = ap.parse_args()
    if args.quick:
        args.mb = 4
    if args.measure:
        print(json.dumps(measure(args.measure, args.max_line_bytes)))
        return

    from bench.common import BENCH_DIR, one_session

    folder = args.dir or BENCH_DIR / f"big-session-{args.mb}-{args.scale}"
    figures = run_child(one_session(folder, args.mb, scale=args.scale), args.max_line_bytes)
    if args.json:
        print(json.dumps(figures))
        return
    grown = (figures["rss_peak"] - figures["rss_before"]) / 2**20
    print(f"one {figures['bytes'] / MB:,.0f} MB session ({figures['entries']:,} entries): "
          f"{figures['bytes'] / MB / figures['seconds']:.1f} MB/s, status "
          f"{figures['status']}; audit peak RSS {figures['rss_peak'] / 2**20:,.0f} MiB "
          f"(+{grown:,.0f} MiB over the {figures['rss_before'] / 2**20:,.0f} MiB before it, "
          f"{grown * 2**20 / figures['entries']:,.0f} B per entry)")


if __name__ == "__main__":
    main()
