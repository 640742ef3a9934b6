"""The projection regression check (``vakpipe regress``): replay an archive under a
baseline and a candidate rule set, compare every request, commit the pairs.

The runs are :func:`pipeline.run.orchestrate.run_audit`, the comparison is
:mod:`pipeline.replay.regress`; this module wires them to storage and prints.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import CommitError, CorruptManifestError, UsageError
from pipeline.io.commit import (
    CommittedRun,
    StagedRun,
    check_vakpipe_output,
    new_run_id,
    open_run,
    other_archive,
    read_dataset,
    write_small_file,
)
from pipeline.io.storage import (
    MAX_LINE_BYTES,
    Location,
    check_output,
    storage_error,
    storage_errors,
)
from pipeline.replay.regress import (
    REGRESSION_SCHEMA,
    DeltaStats,
    RegressionSummary,
    Thresholds,
    compare_requests,
    summarise,
)
from pipeline.run.orchestrate import RunSummary, SharedCluster, run_audit
from pipeline.run.replay_batches import ReplayOptions
from pipeline.tables.partial import InputRun

#: The dataset of request pairs and the summary file, under OUT.
REGRESSION = "regression"
SUMMARY_FILE = "regression-summary.json"
#: Where the two replays are committed, under OUT.
BASELINE, CANDIDATE = "baseline", "candidate"


@dataclass(frozen=True)
class RegressionReport:
    """What a regression check did and found."""

    out: str
    baseline: str
    candidate: str
    baseline_run: str
    candidate_run: str
    summary: RegressionSummary
    thresholds: Thresholds
    breaches: tuple[str, ...]
    runs: tuple[RunSummary, ...]
    #: The runs compared (the baseline run or replay, the candidate replay).
    inputs: tuple[InputRun, ...] = ()
    #: The archive ``--baseline-run`` read, when it is not ROOT (a copy of it elsewhere,
    #: or a mistake): requests are matched by session path all the same.
    baseline_archive: str | None = None

    @property
    def partial(self) -> tuple[InputRun, ...]:
        """The inputs that are partial: the comparison leaves their unread sessions out."""
        return tuple(i for i in self.inputs if i.partial)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form (``regression-summary.json``, and the manifest's summary)."""
        return {
            "partial": bool(self.partial),
            # Summed over the inputs (a session unread in both counts twice).
            "sessions_unread": sum(i.sessions_unread for i in self.inputs),
            "inputs": [i.as_dict() for i in self.inputs],
            "baseline": {"rules": self.baseline, "run": self.baseline_run,
                         **({"archive": self.baseline_archive}
                            if self.baseline_archive else {})},
            "candidate": {"rules": self.candidate, "run": self.candidate_run},
            **self.summary.as_dict(),
            "thresholds": self.thresholds.as_dict(),
            "breaches": list(self.breaches),
            "passed": not self.breaches,
        }


def replays_hint(out: Location, datasets: Mapping[str, Any]) -> str:
    """For a reader of one run given a regression check's output (its ``regression``
    table, no usage or integrity tables): where the runs it replayed are; ``""`` for any
    other run."""
    if REGRESSION not in datasets:
        return ""
    return (f"; it is a regression check's output: price or show one of its replays, "
            f"{out.url}/{CANDIDATE} (or {out.url}/{BASELINE}, when it replayed one)")


def _baseline_run(run: Location) -> tuple[pa.Table, CommittedRun]:
    """``--baseline-run``'s run (:func:`~pipeline.io.commit.open_run`) and its requests
    table, of that one commit."""
    try:
        found = open_run(run)
        if found is None or "requests" not in found.datasets:
            raise UsageError(f"--baseline-run {run.url}: no committed requests table (the "
                             "OUT of `replay` or `audit --replay` has one, and a regress "
                             "OUT/candidate)")
        return found.read("requests"), found
    except CorruptManifestError as err:
        raise UsageError(f"--baseline-run {run.url}: unreadable manifest ({err})") from err
    except storage_errors() as err:
        raise storage_error(err, run.url) from err


def _rules_of(requests: pa.Table) -> str:
    names = pc.unique(requests["rules"]).drop_null().to_pylist() if requests.num_rows else []
    return ",".join(sorted(names)) or "?"


def regression_job(root: Location, out: Location, candidate: ReplayOptions, *,
                   baseline: ReplayOptions | None = None, baseline_run: Location | None = None,
                   thresholds: Thresholds | None = None,
                   sessions: frozenset[str] | None = None, scheduler: str | None = None,
                   workers: int | None = None, progress: bool | None = None,
                   max_line_bytes: int = MAX_LINE_BYTES) -> RegressionReport:
    """Replay ``root`` under the baseline and the candidate and compare every request.

    Each replay is a run of its own, committed atomically under ``OUT/baseline`` and
    ``OUT/candidate``; the pairs are then committed as the ``regression`` dataset under
    ``out`` (its manifest carries the summary), and the summary is written to
    ``OUT/regression-summary.json``.

    Parameters
    ----------
    root, out:
        Archive to read and output location (never inside the archive).
    candidate:
        Replay options of the candidate (rule set, planner, catalog).
    baseline:
        Replay options of the baseline (give it or ``baseline_run``).
    baseline_run:
        A previous run's output (its committed ``requests`` table) to compare against
        instead of replaying a baseline.
    thresholds:
        What makes the check fail (the report's ``breaches``); default none.
    sessions:
        Only the sessions with these ids (file stems); a baseline run is cut to them.
    scheduler, workers, progress, max_line_bytes:
        As for :func:`pipeline.run.orchestrate.run_audit` (both replays read through the
        same line limit); without a scheduler, both replays share one LocalCluster,
        started only when the first replay needs one (a small archive runs in this
        process, as an audit does).

    Raises
    ------
    UsageError
        Neither or both of ``baseline`` and ``baseline_run``; ``baseline_run`` is ``out``
        or holds no requests table.
    ComparisonError
        A requests table cannot be compared.
    """
    if (baseline is None) == (baseline_run is None):
        raise UsageError("give exactly one baseline: a rule set or a previous run")
    check_output(root, out)
    # OUT/baseline and OUT/candidate are committed first: OUT itself is checked here.
    check_vakpipe_output(out)
    thresholds = thresholds or Thresholds()
    base_loc, cand_loc = out.child(BASELINE), out.child(CANDIDATE)
    old: pa.Table | None = None
    base_archive = None
    if baseline_run is not None:
        if baseline_run.protocol == out.protocol and baseline_run.path == out.path:
            raise UsageError(f"--baseline-run and --out are both {out.url}: the check "
                             "would replace the run it compares against")
        # Read first: a wrong path fails before the replay, and OUT/candidate may be
        # the baseline run (last night's) that this run replaces.
        old, base = _baseline_run(baseline_run)
        inputs = [InputRun.of(baseline_run.url, base.manifest)]
        base_archive = other_archive(base.manifest, root)
    else:
        inputs = []
    runs: list[RunSummary] = []
    with SharedCluster() as cluster:
        replay_into = functools.partial(run_audit, root, scheduler=scheduler, workers=workers,
                                        progress=progress, sessions=sessions,
                                        max_line_bytes=max_line_bytes, cluster=cluster)
        if baseline is not None:
            runs.append(replay_into(base_loc, replay=baseline))
        runs.append(replay_into(cand_loc, replay=candidate))
    inputs.extend(InputRun(r.out, r.run_id, r.partial, r.sessions, len(r.unread))
                  for r in runs)
    new = read_dataset(cand_loc, "requests")
    if old is None:
        old = read_dataset(base_loc, "requests")
    elif sessions is not None:
        audited = read_dataset(cand_loc, "integrity/sessions")["session_path"]
        old = old.filter(pc.is_in(old["session_path"], audited.combine_chunks()))
    pairs = compare_requests(old, new)
    summary = summarise(pairs)
    label = baseline.rules if baseline is not None else _rules_of(old)
    baseline_url = baseline_run.url if baseline_run is not None else base_loc.url
    report = RegressionReport(out.url, label, candidate.rules, baseline_url,
                              cand_loc.url, summary, thresholds, thresholds.breaches(summary),
                              tuple(runs), tuple(inputs), base_archive)
    staged = StagedRun(out, new_run_id(), {REGRESSION: REGRESSION_SCHEMA})
    try:
        staged.write_part(REGRESSION, 0, pairs)
        staged.commit(report.as_dict())
    except BaseException:
        staged.abort()
        raise
    try:  # the manifest holds the same report: this file is its copy for a reader
        write_small_file(out, out.join(SUMMARY_FILE),
                         json.dumps(report.as_dict(), indent=1).encode())
    except storage_errors() as err:
        raise CommitError(f"{out.url}: the regression table was committed, but "
                          f"{SUMMARY_FILE} could not be written (its run manifest holds the "
                          f"same summary): {err}") from err
    return report


def _signed(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:+,.1f}"
    return f"{int(x):+,}" if x else "0"


def _delta_row(label: str, d: DeltaStats) -> str:
    if not d.count:
        return f"  {label:<26} none"
    figures = (("min", d.min), ("p50", d.p50), ("p95", d.p95), ("max", d.max), ("sum", d.sum))
    return f"  {label:<26} " + " · ".join(f"{k} {_signed(v)}" for k, v in figures)


def print_regression(report: RegressionReport) -> None:
    """Print a regression check's summary table, and the thresholds' verdict."""
    s = report.summary
    echo = click.echo
    for partial in report.partial:
        echo(f"vakpipe: warning: {partial.line()}", err=True)
    if report.baseline_archive:
        echo(f"vakpipe: warning: --baseline-run {report.baseline_run} read another archive "
             f"({report.baseline_archive}); requests are matched by session path, and the "
             "sessions only one of them holds count as added or removed", err=True)
    share = f" ({100 * s.requests_changed / s.requests_compared:.1f}%)" \
        if s.requests_compared else ""
    echo(f"regression {report.baseline} → {report.candidate}: {s.sessions_compared} "
         f"sessions, {s.requests_compared:,} requests compared")
    echo(f"  {'requests changed':<26} {s.requests_changed:,}{share}")
    echo(f"  {'requests added / removed':<26} {s.requests_added:,} / {s.requests_removed:,}")
    echo(f"  {'requests, tokens changed':<26} {s.requests_tokens_changed:,}")
    echo(f"  {'sessions changed':<26} {s.sessions_changed:,} of {s.sessions_compared:,}")
    echo(_delta_row("token Δ, changed requests", s.delta_changed))
    echo(_delta_row("token Δ, all requests", s.delta_all))
    echo(f"  {'newly over their window':<26} {s.newly_over_window:,}")
    echo(f"  {'hints newly mandatory':<26} {s.newly_mandatory:,}")
    for line in report.breaches:
        echo(f"  FAILED: {line}")
    if not report.breaches:
        echo("  passed" + (" (no thresholds given)" if report.thresholds == Thresholds()
                           else ""))
    echo(f"  tables: {report.out}/{REGRESSION}, {report.out}/{SUMMARY_FILE}; replays "
         f"{report.baseline_run}, {report.candidate_run}")
