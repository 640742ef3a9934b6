"""A small archive end to end: ``vakpipe audit`` then ``vakpipe cost`` against ccusage.

The 9 MB of real Claude Code transcripts (``tests/data/real/claude-code``), audited and
priced through the CLI (each command a fresh process, as a user runs them), against
ccusage's native binary (``daily --json``) on the same files, in interleaved rounds;
prints each side's best wall time and the ratio (target: within 15x). Two ways: the two
commands (``vakpipe audit ROOT --out OUT`` then ``vakpipe cost OUT``), and the one-step
``vakpipe cost ROOT --out OUT`` (one process: one interpreter start, one set of imports).

vakpipe's resolved genai-prices rules are cached in the user's cache folder
(``pipeline.costs.pricing.PriceCache``); the bench keeps its own under its scratch folder
(``VAKPIPE_CACHE_DIR``), filled by the warm-up round, as a user's is after their first
report.

A user's install has compiled bytecode (pip compiles at install time); this
environment may not (``PYTHONDONTWRITEBYTECODE``), so the vakpipe processes keep theirs
under ``bench/.cache/pycache`` (``PYTHONPYCACHEPREFIX``) and a warm-up round fills it.

``--quick`` (for ``make test``): one vakpipe round, no warm-up, ccusage only when
already installed; checks the run worked, prints the figures, asserts no ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ccusage_compare import (
    CCUSAGE_DIR,
    DAILY_ARGS,
    DEFAULT_ROOT,
    ccusage_env,
    ensure_ccusage,
    vakpipe_cli,
)

TARGET_RATIO = 15.0


def vakpipe_env(cache: Path, prices: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    env["VAKPIPE_CACHE_DIR"] = str(prices)
    return env


def run_vakpipe(root: Path, scratch: Path, env: dict[str, str], *, one_step: bool = False
                ) -> float:
    """Wall seconds of ``vakpipe audit ROOT`` then ``vakpipe cost OUT`` (``one_step``:
    ``vakpipe cost ROOT --out OUT``)."""
    out = scratch / "out"
    shutil.rmtree(out, ignore_errors=True)
    commands = ([["cost", str(root), "--out", str(out)]] if one_step else
                [["audit", str(root), "--out", str(out), "--no-progress"], ["cost", str(out)]])
    start = time.perf_counter()
    for cmd in commands:
        done = subprocess.run([str(vakpipe_cli()), *cmd], capture_output=True, text=True,
                              env=env, check=False)
        if done.returncode not in (0, 3):
            sys.exit(f"vakpipe {cmd[0]} exited {done.returncode}: {done.stderr[-600:]}")
    return time.perf_counter() - start


def run_ccusage(binary: Path, root: Path, home: Path) -> float:
    start = time.perf_counter()
    subprocess.run([str(binary), *DAILY_ARGS], capture_output=True, env=ccusage_env(root, home),
                   check=True)
    return time.perf_counter() - start


def installed_ccusage() -> Path | None:
    natives = sorted((CCUSAGE_DIR / "node_modules" / "@ccusage").glob("ccusage-*/bin/ccusage"))
    return natives[0] if natives and os.access(natives[0], os.X_OK) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="one vakpipe round; ccusage only if installed; no ratio asserted")
    args = ap.parse_args()
    root = args.root.resolve()
    cache = Path(__file__).resolve().parent / ".cache" / "pycache"
    if args.quick:
        binary = installed_ccusage()
    else:
        found = ensure_ccusage(CCUSAGE_DIR)
        binary = found.native or found.wrapper
    size = sum(p.stat().st_size for p in root.rglob("*.jsonl"))
    print(f"small archive: {root} ({size / 1e6:.1f} MB); vakpipe audit + cost vs "
          f"ccusage {'(' + str(binary) + ')' if binary else '(not installed: skipped)'}")
    with tempfile.TemporaryDirectory(prefix="vakpipe-small-") as tmp:
        scratch = Path(tmp)
        env = vakpipe_env(cache, scratch / "vakpipe-cache")
        home = scratch / "home"
        home.mkdir()
        rounds = 1 if args.quick else args.rounds
        if not args.quick:
            run_vakpipe(root, scratch, env)  # warm-up: the bytecode and the price caches
        ours, one_step, theirs = [], [], []
        for _ in range(rounds):  # interleaved: both sides see the same machine load
            ours.append(run_vakpipe(root, scratch, env))
            one_step.append(run_vakpipe(root, scratch, env, one_step=True))
            if binary is not None:
                theirs.append(run_ccusage(binary, root, home))
    print(f"  vakpipe audit + cost: best {min(ours):.2f} s of {len(ours)} (two commands)")
    print(f"  vakpipe cost ROOT --out:  best {min(one_step):.2f} s of {len(one_step)} (one step)")
    if theirs:
        print(f"  ccusage daily:            best {min(theirs):.3f} s of {len(theirs)}")
        for label, times in (("two commands", ours), ("one step", one_step)):
            print(f"  wall ratio vakpipe/ccusage, {label}: {min(times) / min(theirs):.1f}x "
                  f"(target <= {TARGET_RATIO:.0f}x)")


if __name__ == "__main__":
    main()
