"""The ``vakpipe`` command line: thin wrappers over the library and the jobs."""

from __future__ import annotations

import sys
from typing import Any

import click

from pipeline.errors import PipelineError, UsageError
from pipeline.io.storage import parse_storage_options, resolve

EXIT_OK, EXIT_FINDINGS, EXIT_UNUSABLE = 0, 1, 2

storage_option = click.option(
    "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
    help="fsspec storage option (repeatable), e.g. endpoint_url=http://127.0.0.1:5000",
)


def _fail(err: PipelineError) -> None:
    click.echo(f"vakpipe: error: {err}", err=True)
    sys.exit(EXIT_UNUSABLE)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vakpipe")
def main() -> None:
    """Audit, replay and compact archives of vak session ledgers."""


@main.command()
@click.argument("root")
@click.option("--out", required=True, help="Output location (any fsspec URL or folder).")
@click.option("--scheduler", envvar="DASK_SCHEDULER_ADDRESS", default=None,
              help="Join an existing Dask scheduler (also DASK_SCHEDULER_ADDRESS).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Workers of the local cluster (default: one per core).")
@storage_option
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default=None,
              help="Exit 1 when any session has a finding of this severity or worse.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a tty).")
@click.option("--replay", is_flag=True,
              help="Also replay every request (turns and requests tables), one read per file.")
@click.option("--rules", default="v1", show_default=True, help="Projection rule set to replay.")
@click.option("--planner", is_flag=True,
              help="Replay under planner v1's plan instead of the recorded plan in force.")
@click.option("--catalog", "catalog_path", default=None, type=click.Path(dir_okay=False),
              help="Your own model catalog (TOML); its rules come first.")
@click.option("--window", type=click.IntRange(min=1), default=None,
              help="What-if: give every model this input window.")
@click.option("--scope", default=None, help="Only requests in this fold key (e.g. t3/i2-t5).")
def audit(root: str, out: str, scheduler: str | None, workers: int | None,
          storage_options: tuple[str, ...], fail_on: str | None, progress: bool | None,
          replay: bool, rules: str, planner: bool, catalog_path: str | None,
          window: int | None, scope: str | None) -> None:
    """Verify every session ledger under ROOT and write integrity tables under OUT."""
    from jobs.audit import audit_job, print_summary
    from pipeline.catalog import load_catalog
    from pipeline.projection import get_rule_set
    from pipeline.replay_partitions import ReplayOptions
    from pipeline.scopes import FoldRefusal, fold_key

    try:
        options = parse_storage_options(storage_options)
        replay_options = None
        if replay or planner or scope or window or catalog_path or rules != "v1":
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
            replay_options = ReplayOptions(rules, catalog, planner, scope)
        summary = audit_job(resolve(root, options), resolve(out, options),
                            scheduler=scheduler, workers=workers, progress=progress,
                            replay=replay_options)
    except PipelineError as err:
        _fail(err)
        return
    print_summary(summary)
    worst = {"error": ("error",), "warning": ("error", "warning")}.get(fail_on or "", ())
    if any(summary.statuses.get(s) for s in worst):
        sys.exit(EXIT_FINDINGS)


@main.command()
@click.argument("out")
@click.option("--sessions", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--faults/--no-faults", default=False, help="Inject one fault into some sessions.")
@storage_option
def generate(out: str, sessions: int, seed: int, faults: bool,
             storage_options: tuple[str, ...]) -> None:
    """Write a synthetic fleet in vak's wire format under OUT, with its ground truth."""
    from pipeline.io.fleet import write_fleet

    try:
        loc = resolve(out, parse_storage_options(storage_options))
        written = write_fleet(loc, sessions=sessions, seed=seed, faults=faults)
    except PipelineError as err:
        _fail(err)
        return
    click.echo(f"wrote {written.sessions} sessions, {written.bytes:,} bytes under {out}; "
               f"ground truth: {written.truth_path}")


@main.command()
@click.option("--sessions", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--out", default="out/demo", show_default=True, help="Where the tables go.")
@click.option("--workers", type=click.IntRange(min=1), default=None)
def demo(sessions: int, seed: int, out: str, workers: int | None) -> None:
    """Start a local S3 endpoint, upload a generated fleet, audit it, print a summary."""
    from pipeline.demo import run_demo

    try:
        run_demo(sessions=sessions, seed=seed, out=out, workers=workers)
    except PipelineError as err:
        _fail(err)


def run(argv: list[str] | None = None) -> Any:
    """Call the CLI in-process (for tests); returns the exit code."""
    try:
        main.main(args=argv, prog_name="vakpipe", standalone_mode=True)
    except SystemExit as stop:
        return stop.code
    return 0
