"""The ``vakpipe`` command line: thin wrappers over the library and the jobs.

Contract: the top layer; nothing imports it (``pipeline.cli:main`` is the entry point).
It alone imports :mod:`pipeline.synth` (``generate``, ``demo``) besides tests and benches.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pipeline.errors import PipelineError, UsageError
from pipeline.io.storage import MAX_LINE_BYTES, parse_storage_options, resolve

if TYPE_CHECKING:
    from pipeline.run.orchestrate import RunSummary
    from pipeline.run.replay_batches import ReplayOptions

F = TypeVar("F", bound=Callable[..., Any])
EXIT_OK, EXIT_FINDINGS, EXIT_UNUSABLE, EXIT_PARTIAL = 0, 1, 2, 3

storage_option = click.option(
    "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
    help="fsspec storage option (repeatable), e.g. endpoint_url=http://127.0.0.1:5000",
)


def _fail(err: PipelineError) -> None:
    click.echo(f"vakpipe: error: {err}", err=True)
    sys.exit(EXIT_UNUSABLE)


class _Commands(click.Group):
    """The command group: every command runs inside one lifecycle, in one place.

    A :class:`~pipeline.run.lifecycle.Reporter` (stage, progress bar or heartbeat) is in
    force for the command; SIGINT and SIGTERM stop it cleanly (staging removed, cluster
    closed, one line, exit 130 / 143); a :class:`~pipeline.errors.PipelineError` is one
    ``vakpipe: error:`` line and exit 2. Commands need no handler of their own.
    """

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command inside the lifecycle."""
        from pipeline.run import lifecycle

        try:
            with lifecycle.reporting(lifecycle.Reporter(heartbeat=DEFAULT_HEARTBEAT_S)), \
                    lifecycle.handle_signals():
                return super().invoke(ctx)
        except PipelineError as err:
            _fail(err)
        except lifecycle.Interrupted as stop:
            click.echo(stop.line(), err=True)
            sys.exit(stop.exit_code)


#: Seconds between heartbeat lines when stderr is not a terminal (``--heartbeat``).
DEFAULT_HEARTBEAT_S = 30.0


def _set_reporter(name: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def store(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        from pipeline.run import lifecycle

        reporter = lifecycle.current()
        if name == "json_lines":
            reporter.json_lines = value == "json"
        elif value is not None:
            setattr(reporter, name, value or None)
        return value
    return store


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vakpipe")
def main() -> None:
    """Audit, replay and compact archives of vak session ledgers.

    \b
    Exit codes of the commands that read an archive:
      0  the run completed (findings are data, not failures)
      1  --fail-on matched (regress: a threshold was exceeded)
      2  unusable input or setup, or a failed commit (one line on stderr)
      3  the run completed but is partial: some sessions could not be read or
         audited (unreadable_object, changed_during_audit, worker_crashed,
         audit_failed); the tables hold everything else, the manifest says
         "partial": true
    """


def _options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """Several click options as one decorator (the first listed comes first in --help)."""
    def apply(f: F) -> F:
        for decorate in reversed(decorators):
            f = decorate(f)
        return f
    return apply


cluster_options = _options(
    click.option("--scheduler", envvar="DASK_SCHEDULER_ADDRESS", default=None,
                 help="Join an existing Dask scheduler (also DASK_SCHEDULER_ADDRESS)."),
    click.option("--workers", type=click.IntRange(min=0), default=None,
                 help="Workers of the local cluster (default: one per core; an archive "
                      "under 32 MiB runs in this process, no cluster); 0: always in this "
                      "process."),
    storage_option,
)
session_option = click.option(
    "--session", "session_ids", multiple=True, metavar="ID",
    help="Only the session with this id, its file name's stem (repeatable).")
progress_option = _options(
    click.option("--progress/--no-progress", default=None, callback=_set_reporter("progress"),
                 help="Progress bar labelled by stage (default: on a tty)."),
    click.option("--heartbeat", type=click.FloatRange(min=0), default=DEFAULT_HEARTBEAT_S,
                 show_default=True, metavar="SECONDS", expose_value=False,
                 callback=_set_reporter("heartbeat"),
                 help="Without a bar (stderr not a tty): a progress line every SECONDS "
                      "(stage, sessions and bytes done, rate, ETA); 0: none."),
    click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
                 show_default=True, expose_value=False, callback=_set_reporter("json_lines"),
                 help="json: heartbeats and stage changes as JSON lines on stderr."),
)
what_if_options = _options(
    click.option("--planner", is_flag=True,
                 help="Replay under planner v1's plan instead of the recorded plan in force."),
    click.option("--catalog", "catalog_path", default=None, type=click.Path(dir_okay=False),
                 help="Your own model catalog (TOML); its rules come first."),
    click.option("--window", type=click.IntRange(min=1), default=None,
                 help="What-if: give every model this input window."),
)
replay_options = _options(
    click.option("--rules", default="v1", show_default=True,
                 help="Projection rule set to replay."),
    what_if_options,
)
scope_option = click.option("--scope", default=None,
                            help="Only requests in this fold key (e.g. t3/i2-t5).")


def force_option(f: F) -> F:
    """``--force`` on a command that commits: a corrupt ``OUT/_manifest.json`` is set
    aside as ``_manifest.json.corrupt-<run_id>`` instead of stopping the run (exit 2),
    and nothing it names is deleted (see :func:`pipeline.io.commit.recovering_manifests`);
    a non-empty ``OUT`` that is not a vakpipe output is accepted
    (:func:`pipeline.io.commit.check_vakpipe_output`).
    """
    @functools.wraps(f)
    def run_forced(*args: Any, force: bool, **kwargs: Any) -> Any:
        from pipeline.io.commit import recovering_manifests

        with recovering_manifests(force):
            return f(*args, **kwargs)

    option = click.option(
        "--force", is_flag=True,
        help="Set a corrupt OUT/_manifest.json aside (as _manifest.json.corrupt-<run>) "
             "instead of stopping; nothing it names is deleted. Also accepts an OUT that "
             "holds other files (not a vakpipe output).")
    return option(run_forced)  # type: ignore[return-value]


_BYTE_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "k": 2**10,
               "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30}


class ByteSize(click.ParamType[int, Any]):
    """A byte count: ``1048576``, ``64MiB``, ``512KiB``, ``1GiB`` (kB, MB, GB are powers
    of ten)."""

    name = "bytes"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        """``value`` as a positive number of bytes."""
        if isinstance(value, int):
            return value
        match = _BYTE_SIZE.fullmatch(str(value))
        unit = _BYTE_UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None or int(match.group(1)) < 1:
            self.fail(f"{value!r} is not a byte count (e.g. 1048576, 64MiB)", param, ctx)
        return int(match.group(1)) * unit


max_line_option = click.option(
    "--max-line-bytes", type=ByteSize(), default=f"{MAX_LINE_BYTES // 2**20}MiB",
    show_default=True,
    metavar="N", help="Longest line read (e.g. 64MiB): a longer one is reported as a "
    "damaged line and never read into memory.")


def _replay_options(rules: str, planner: bool, catalog_path: str | None, window: int | None,
                    scope: str | None, max_line_bytes: int = MAX_LINE_BYTES) -> ReplayOptions:
    """Check the replay flags (``audit``, ``replay``, ``show``) and build the options.

    Raises
    ------
    UsageError
        An unknown rule set, a fold key that does not parse (the grammar refusal line),
        an unreadable catalog.
    """
    from pipeline.replay.catalog import load_catalog
    from pipeline.replay.projection import get_rule_set
    from pipeline.replay.scopes import FoldRefusal, fold_key
    from pipeline.run.replay_batches import ReplayOptions

    try:
        get_rule_set(rules)
    except ValueError as err:
        raise UsageError(str(err)) from err
    parsed = fold_key(scope) if scope is not None else None
    if isinstance(parsed, FoldRefusal):
        raise UsageError(f"--scope {scope!r}: {parsed.error}")
    catalog = load_catalog(catalog_path)
    if window is not None:
        catalog = catalog.with_window(window)
    return ReplayOptions(rules, catalog, planner, scope, max_line_bytes=max_line_bytes)


@main.command()
@click.argument("root")
@click.option("--out", required=True, help="Output location (any fsspec URL or folder).")
@cluster_options
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default=None,
              help="Exit 1 when any session has a finding of this severity or worse "
                   "(a partial run exits 3 first).")
@progress_option
@click.option("--replay", is_flag=True,
              help="Also replay every request (turns and requests tables), one read per file.")
@replay_options
@scope_option
@max_line_option
@force_option
def audit(root: str, out: str, scheduler: str | None, workers: int | None,
          storage_options: tuple[str, ...], fail_on: str | None, progress: bool | None,
          replay: bool, rules: str, planner: bool, catalog_path: str | None,
          window: int | None, scope: str | None, max_line_bytes: int) -> None:
    """Verify every session ledger under ROOT and write integrity tables under OUT."""
    from jobs.audit import print_summary
    from pipeline.run.orchestrate import run_audit

    options = parse_storage_options(storage_options)
    replay_opts = None
    if replay or planner or scope or window or catalog_path or rules != "v1":
        replay_opts = _replay_options(rules, planner, catalog_path, window, scope,
                                      max_line_bytes)
    summary = run_audit(resolve(root, options), resolve(out, options),
                        scheduler=scheduler, workers=workers, progress=progress,
                        replay=replay_opts, max_line_bytes=max_line_bytes)
    print_summary(summary)
    _exit_on(fail_on, summary)


def _exit_on(fail_on: str | None, summary: RunSummary) -> None:
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


@main.command()
@click.argument("root")
@click.option("--out", required=True, help="Output location (any fsspec URL or folder).")
@session_option
@replay_options
@scope_option
@cluster_options
@progress_option
@max_line_option
@force_option
def replay(root: str, out: str, session_ids: tuple[str, ...], rules: str, planner: bool,
           catalog_path: str | None, window: int | None, scope: str | None,
           scheduler: str | None, workers: int | None, storage_options: tuple[str, ...],
           progress: bool | None, max_line_bytes: int) -> None:
    """Replay every session under ROOT (or --session ones) into tables under OUT.

    Writes what `audit --replay` writes: integrity/sessions, integrity/findings, turns
    and requests.
    """
    from jobs.replay import print_replay_summary, replay_job

    options = parse_storage_options(storage_options)
    summary = replay_job(resolve(root, options), resolve(out, options),
                         _replay_options(rules, planner, catalog_path, window, scope,
                                         max_line_bytes),
                         sessions=frozenset(session_ids) or None, scheduler=scheduler,
                         workers=workers, progress=progress)
    print_replay_summary(summary)
    _exit_on(None, summary)


@main.command()
@click.argument("session")
@click.option("--scope", required=True, help="The request to show: an iteration tN/iM.")
@replay_options
@storage_option
@click.option("--full", is_flag=True, help="Print every text whole (default: cut long ones).")
@max_line_option
def show(session: str, scope: str, rules: str, planner: bool, catalog_path: str | None,
         window: int | None, storage_options: tuple[str, ...], full: bool,
         max_line_bytes: int) -> None:
    """Print the request at --scope of the ledger SESSION (one file's URL).

    The request as the model received it: its figures, the plan, the prefix and every
    message with its tokens.
    """
    from jobs.replay import show_job

    text = show_job(session, scope,
                    _replay_options(rules, planner, catalog_path, window, None,
                                    max_line_bytes),
                    storage_options=parse_storage_options(storage_options), full=full)
    click.echo(text)


@main.command()
@click.argument("root")
@click.option("--out", required=True,
              help="Output location; each night commits OUT/date=YYYY-MM-DD/.")
@click.option("--date", "day", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="The partition to write (default: today, UTC).")
@click.option("--compaction", is_flag=True,
              help="Also plan the packets each session's bound model needs (compaction table).")
@click.option("--baseline", "baseline_day", type=click.DateTime(["%Y-%m-%d"]), default=None,
              metavar="YYYY-MM-DD",
              help="Start from this committed partition instead of the newest (when the "
                   "newest lost its manifest or cannot be read).")
@click.option("--rebaseline", is_flag=True,
              help="Start over from no baseline (everything read as new; no history break "
                   "can be reported tonight); recorded in the summary.")
@replay_options
@cluster_options
@progress_option
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default=None,
              help="Exit 1 when any session has a finding of this severity or worse "
                   "(a partial run exits 3 first).")
@max_line_option
@force_option
def nightly(root: str, out: str, day: datetime | None, compaction: bool,
            baseline_day: datetime | None, rebaseline: bool, rules: str,
            planner: bool, catalog_path: str | None, window: int | None,
            scheduler: str | None, workers: int | None, storage_options: tuple[str, ...],
            progress: bool | None, fail_on: str | None, max_line_bytes: int) -> None:
    """The nightly audit: read only what changed under ROOT since the last night.

    Writes the integrity, usage, turns, requests (and with --compaction, compaction)
    tables of every session into OUT/date=YYYY-MM-DD/, with the checkpoints the next
    night starts from and summary.json. Unchanged objects are not read: their rows are
    carried forward. History that no longer extends what was verified is reported
    (history_truncated, history_rewritten, session_missing).
    """
    import dataclasses

    from jobs.nightly_audit import print_nightly_summary, run_nightly
    from pipeline.compaction.engine import CompactionOptions
    from pipeline.compaction.registry import get_summariser

    options = parse_storage_options(storage_options)
    replay_opts = _replay_options(rules, planner, catalog_path, window, None,
                                  max_line_bytes)
    if compaction:
        replay_opts = dataclasses.replace(
            replay_opts, compaction=CompactionOptions(get_summariser("cards")))
    summary = run_nightly(resolve(root, options), resolve(out, options), replay_opts,
                          day=day.date() if day else None, scheduler=scheduler,
                          workers=workers, progress=progress,
                          baseline_day=baseline_day.date() if baseline_day else None,
                          rebaseline=rebaseline)
    print_nightly_summary(summary)
    _exit_on(fail_on, summary.run)


@main.command()
@click.argument("root")
@click.option("--out", required=True, help="Output location (any fsspec URL or folder).")
@click.option("--window", type=click.IntRange(min=1), default=None,
              help="What-if: plan for this input window instead of each session's model.")
@click.option("--model", "what_if_model", default=None, metavar="NAME",
              help="What-if: plan for this catalog model's capacity.")
@click.option("--summariser", type=click.Choice(["cards", "http"]), default="cards",
              show_default=True, help="Who writes the summaries.")
@click.option("--summariser-url", default=None, metavar="URL",
              help="OpenAI-compatible endpoint of the http summariser.")
@click.option("--summariser-model", default=None, metavar="NAME",
              help="Model the http summariser asks (default: --model, else the URL's).")
@click.option("--summary-tokens", type=click.IntRange(min=16), default=2000,
              show_default=True, help="Upper bound of one summary's tokens.")
@click.option("--write-archive", is_flag=True,
              help="Also write compacted copies of the affected ledgers under OUT/archive.")
@click.option("--rules", default="v1", show_default=True, help="Projection rule set.")
@click.option("--catalog", "catalog_path", default=None, type=click.Path(dir_okay=False),
              help="Your own model catalog (TOML); its rules come first.")
@session_option
@cluster_options
@progress_option
@max_line_option
@force_option
def compact(root: str, out: str, window: int | None, what_if_model: str | None,
            summariser: str, summariser_url: str | None, summariser_model: str | None,
            summary_tokens: int, write_archive: bool, rules: str, catalog_path: str | None,
            session_ids: tuple[str, ...], scheduler: str | None, workers: int | None,
            storage_options: tuple[str, ...], progress: bool | None,
            max_line_bytes: int) -> None:
    """Plan the compaction packets every session under ROOT needs, under OUT.

    Each session is replayed under planner v1 for its bound model's capacity (or the
    --window / --model what-if); where a request's plan names a packet range no stored
    packet covers, a packet is planned and summarised from the turns' cards. Writes the
    integrity, turns, requests and compaction tables; --write-archive adds compacted
    copies of the ledgers (the source archive is never written).
    """
    from jobs.compact import compact_job, print_compaction_summary
    from pipeline.compaction.engine import CompactionOptions
    from pipeline.compaction.registry import get_summariser

    if window is not None and what_if_model is not None:
        raise UsageError("--window and --model are two what-ifs: give one")
    if summariser == "http":
        if not summariser_url:
            raise UsageError("--summariser http needs --summariser-url")
        writer = get_summariser("http", url=summariser_url,
                                model=summariser_model or what_if_model or "")
        probe = getattr(writer, "probe", None)
        if probe is not None:
            probe()  # an unreachable endpoint is a setup error, before any read
    else:
        writer = get_summariser("cards")
    options = parse_storage_options(storage_options)
    replay_opts = _replay_options(rules, True, catalog_path, window, None, max_line_bytes)
    if what_if_model is not None and replay_opts.catalog.lookup(what_if_model) is None:
        raise UsageError(f"--model {what_if_model!r} is not in the model catalog")
    summary = compact_job(
        resolve(root, options), resolve(out, options), replay_opts,
        CompactionOptions(writer, window=window, model=what_if_model,
                          summary_tokens=summary_tokens),
        write_archive=write_archive, sessions=frozenset(session_ids) or None,
        scheduler=scheduler, workers=workers, progress=progress)
    print_compaction_summary(summary)
    _exit_on(None, summary)


@main.command()
@click.argument("root")
@click.option("--out", required=True, help="Output location (any fsspec URL or folder).")
@click.option("--baseline", default=None,
              help="Rule set of the baseline replay (default: v1).")
@click.option("--candidate", required=True, help="Rule set of the candidate replay.")
@click.option("--baseline-run", default=None, metavar="PATH",
              help="Compare with this run's committed requests table instead of replaying "
                   "a baseline.")
@click.option("--max-changed", default=None, metavar="N|P%",
              help="Exit 1 when more requests changed (a number, or a percentage of the "
                   "requests compared).")
@click.option("--max-new-overflows", type=click.IntRange(min=0), default=None, metavar="N",
              help="Exit 1 when more requests are newly over their model's window.")
@click.option("--allow-partial", is_flag=True,
              help="Exit 0 when a run compared is partial (still said; default: exit 3).")
@session_option
@what_if_options
@cluster_options
@progress_option
@max_line_option
@force_option
def regress(root: str, out: str, baseline: str | None, candidate: str,
            baseline_run: str | None, max_changed: str | None, max_new_overflows: int | None,
            allow_partial: bool,
            session_ids: tuple[str, ...], planner: bool, catalog_path: str | None,
            window: int | None, scheduler: str | None, workers: int | None,
            storage_options: tuple[str, ...], progress: bool | None,
            max_line_bytes: int) -> None:
    """Replay ROOT under two projection rule sets and compare every request.

    Writes OUT/baseline and OUT/candidate (the two replays), the regression dataset (one
    row per request pair) and OUT/regression-summary.json. Exit 1 when a threshold is
    exceeded.
    """
    from jobs.regression_check import print_regression, regression_job
    from pipeline.replay.regress import Thresholds, parse_change_limit

    if baseline is not None and baseline_run is not None:
        raise UsageError("--baseline and --baseline-run name two baselines: give one")
    options = parse_storage_options(storage_options)
    thresholds = Thresholds(
        parse_change_limit(max_changed) if max_changed is not None else None,
        max_new_overflows)
    # Both replays read through the same line limit (it travels in their options).
    base_opts = (None if baseline_run is not None
                 else _replay_options(baseline or "v1", planner, catalog_path, window, None,
                                      max_line_bytes))
    report = regression_job(
        resolve(root, options), resolve(out, options),
        _replay_options(candidate, planner, catalog_path, window, None, max_line_bytes),
        baseline=base_opts,
        baseline_run=resolve(baseline_run, options) if baseline_run is not None else None,
        thresholds=thresholds, sessions=frozenset(session_ids) or None,
        scheduler=scheduler, workers=workers, progress=progress)
    print_regression(report)
    if report.partial and not allow_partial:
        sys.exit(EXIT_PARTIAL)  # before the thresholds: a partial comparison proves nothing
    if report.breaches:
        sys.exit(EXIT_FINDINGS)


@main.command()
@click.argument("source", metavar="OUT|ROOT")
@click.option("--out", "run_out", default=None,
              help="SOURCE is an archive: audit it into this output first (in this process "
                   "when small), then price that run (its report under OUT/cost).")
@click.option("--since", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="First day (UTC, inclusive) to price.")
@click.option("--until", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="Last day (UTC, inclusive) to price.")
@click.option("--by", "by_text", default="day,model", show_default=True,
              help="Group the cost table by these, comma-separated: day, agent, model, "
                   "provider, session.")
@click.option("--prices", "prices_path", default=None, type=click.Path(dir_okay=False),
              help="Your own price table (TOML); its rules come first.")
@click.option("--report-dir", default=None,
              help="Where the tables and report.html go (default: OUT/cost).")
@click.option("--fail-on", "fail_on", type=click.Choice(["unpriced"]), default=None,
              help="Exit 1 when a billed model has no price (the line names them).")
@click.option("--allow-partial", is_flag=True,
              help="Exit 0 when the priced run is partial (still said; default: exit 3).")
@storage_option
def cost(source: str, run_out: str | None, since: datetime | None, until: datetime | None,
         by_text: str, prices_path: str | None, report_dir: str | None, fail_on: str | None,
         allow_partial: bool, storage_options: tuple[str, ...]) -> None:
    """Price the usage of the run committed under OUT: billed, effective and wasted USD.

    Writes costs.parquet and costs.csv (grouped by --by) and report.html (charts, one
    self-contained file) under OUT/cost or --report-dir. Models the price table does not
    know are named on stderr and never priced silently; --fail-on unpriced makes them
    exit 1.

    \b
    In one step from an archive: vakpipe cost ROOT --out OUT audits ROOT into OUT (as
    vakpipe audit ROOT --out OUT does), then prices that run.
    """
    from jobs.cost_report import cost_job, print_cost_summary, unpriced_failure
    from pipeline.costs.report import parse_by

    options = parse_storage_options(storage_options)
    out = resolve(source, options)
    by = parse_by(by_text)
    if run_out is not None:
        from jobs.audit import print_summary
        from pipeline.io.commit import read_manifest
        from pipeline.run.orchestrate import run_audit

        if since is not None and until is not None and since > until:  # before the audit
            raise UsageError(f"--since {since.date()} is after --until {until.date()}")
        if read_manifest(out) is not None:
            raise UsageError(f"{source} is a run's output, not an archive: price it with "
                             f"`vakpipe cost {source}` (--out is for an archive)")
        out = resolve(run_out, options)
        print_summary(run_audit(resolve(source, options), out))
    outcome = cost_job(out, by=by, since=since.date() if since else None,
                       until=until.date() if until else None, prices_path=prices_path,
                       report_dir=resolve(report_dir, options) if report_dir else None)
    print_cost_summary(outcome)
    if outcome.partial and not allow_partial:
        sys.exit(EXIT_PARTIAL)  # before --fail-on: figures of a partial run prove nothing
    unpriced = unpriced_failure(outcome) if fail_on == "unpriced" else None
    if unpriced is not None:
        click.echo(f"vakpipe: {unpriced}", err=True)
        sys.exit(EXIT_FINDINGS)


@main.command()
@click.argument("out")
@click.option("--sessions", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--faults/--no-faults", default=False, help="Inject one fault into some sessions.")
@click.option("--force", is_flag=True,
              help="Write into a folder that is not empty (adds sessions; replaces "
                   "ground-truth.json).")
@storage_option
def generate(out: str, sessions: int, seed: int, faults: bool, force: bool,
             storage_options: tuple[str, ...]) -> None:
    """Write a synthetic fleet in vak's wire format under OUT (an empty folder, unless
    --force), with its ground truth."""
    from pipeline.synth.fleet import write_fleet

    loc = resolve(out, parse_storage_options(storage_options))
    written = write_fleet(loc, sessions=sessions, seed=seed, faults=faults,
                          exclusive=not force)
    click.echo(f"wrote {written.sessions} sessions, {written.bytes:,} bytes under {out}; "
               f"ground truth: {written.truth_path}")


@main.command()
@click.option("--sessions", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--out", default="out/demo", show_default=True, help="Where the tables go.")
@click.option("--workers", type=click.IntRange(min=1), default=None)
def demo(sessions: int, seed: int, out: str, workers: int | None) -> None:
    """Start a local S3 endpoint, upload a generated fleet, audit it, print a summary."""
    from pipeline.cli.demo import run_demo

    run_demo(sessions=sessions, seed=seed, out=out, workers=workers)


def run(argv: list[str] | None = None) -> Any:
    """Call the CLI in-process (for tests); returns the exit code."""
    try:
        main.main(args=argv, prog_name="vakpipe", standalone_mode=True)
    except SystemExit as stop:
        return stop.code
    return 0
