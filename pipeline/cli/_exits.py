"""Exit codes of the commands that read an archive, and how ``--fail-on`` ends a run."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from pipeline.run.orchestrate import RunSummary

EXIT_OK, EXIT_FINDINGS, EXIT_UNUSABLE, EXIT_PARTIAL = 0, 1, 2, 3
#: ``vakpipe cost --budgets``: a budget's spend is over its limit (before partial: spend
#: read from a partial run is a lower bound, so a breach it shows is real).
EXIT_BUDGET = 4
#: Standard output closed before the command wrote all of it (a reader that stopped
#: early: ``vakpipe cost OUT | head``): 128 + SIGPIPE, what a Unix tool killed by the
#: signal exits with. click's own handling exits 1, which is ``--fail-on``'s code here.
EXIT_PIPE_CLOSED = 141


def exit_on(fail_on: str | None, summary: RunSummary) -> None:
    """Exit 3 when the run is partial; else exit 1 when ``--fail-on`` names a severity
    some session reached.

    Partial first: a verdict over the sessions read says nothing of those not read, so
    a partial run never passes for a complete one, whatever ``--fail-on`` says.
    """
    if summary.partial:
        sys.exit(EXIT_PARTIAL)
    statuses: Mapping[str, int] = summary.statuses
    worst = {"error": ("error",), "warning": ("error", "warning")}.get(fail_on or "", ())
    if any(statuses.get(s) for s in worst):
        click.echo(fail_on_line(fail_on or "", summary, worst), err=True)
        sys.exit(EXIT_FINDINGS)


def fail_on_line(fail_on: str, summary: RunSummary, severities: tuple[str, ...]) -> str:
    """Why ``--fail-on`` matched: sessions by status, findings of those severities by
    code (most first), and the first few sessions (escaped)."""
    from pipeline.io.storage import printable

    sessions = ", ".join(f"{summary.statuses[s]:,} {s}" for s in severities
                         if summary.statuses.get(s))
    codes = sorted(((n, code) for (sev, code), n in summary.severity_codes.items()
                    if sev in severities), key=lambda nc: (-nc[0], nc[1]))
    shown = ", ".join(f"{code} {n:,}" for n, code in codes[:8])
    more = f", +{len(codes) - 8} more codes" if len(codes) > 8 else ""
    examples = sorted(p for s in severities for p in summary.status_examples.get(s, []))[:3]
    eg = "; e.g. " + ", ".join(printable(p, 120) for p in examples) if examples else ""
    return (f"vakpipe: --fail-on {fail_on} matched: sessions {sessions}"
            f"{'; findings ' + shown + more if shown else ''}{eg}")
