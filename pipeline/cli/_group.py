"""The ``vakpipe`` command group and its one error handler (:class:`_Commands`).

The command modules define plain click commands; :mod:`pipeline.cli` adds them here.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from pipeline.cli._exits import EXIT_PIPE_CLOSED, EXIT_UNUSABLE
from pipeline.cli._options import DEFAULT_HEARTBEAT_S
from pipeline.cli._output import error_document
from pipeline.errors import PipelineError


def _fail(err: PipelineError, ctx: click.Context | None = None) -> None:
    click.echo(f"vakpipe: error: {err}", err=True)
    error_document(ctx, str(err), EXIT_UNUSABLE)  # with --json: the error as a document
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

        with lifecycle.reporting(lifecycle.Reporter(heartbeat=DEFAULT_HEARTBEAT_S)) as reporter:
            try:
                with lifecycle.handle_signals():
                    result = super().invoke(ctx)
            except PipelineError as err:
                reporter.end(EXIT_UNUSABLE, str(err))
                _fail(err, ctx)
            except lifecycle.Interrupted as stop:
                reporter.end(stop.exit_code, stop.line().removeprefix("vakpipe: "))
                click.echo(stop.line(), err=True)
                sys.exit(stop.exit_code)
            except BrokenPipeError:
                reporter.end(EXIT_PIPE_CLOSED)
                _reader_gone()
            except SystemExit as stop:  # a command's own exit (1, 3, 4) after its run
                reporter.end(stop.code if isinstance(stop.code, int) else
                             0 if stop.code is None else EXIT_UNUSABLE)
                raise
            except click.ClickException as err:  # an option's value refused: click says it
                reporter.end(err.exit_code, err.format_message())
                raise
            except click.exceptions.Exit as stop:
                reporter.end(stop.exit_code)
                raise
            except Exception as err:  # a bug: its traceback follows, exit 1
                first = str(err).partition("\n")[0]
                reporter.end(1, f"{type(err).__name__}: {first}" if first
                             else type(err).__name__)
                raise
            reporter.end(0)
            return result


def _reader_gone() -> None:
    """Exit :data:`~pipeline.cli._exits.EXIT_PIPE_CLOSED`, quietly, once standard output's
    reader has gone: what the command committed is committed (a run's summary is
    printed after its commit), and nothing is left to say to it. Standard output points
    at the null device first, so the interpreter's flush at exit raises nothing."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    finally:
        os.close(null)
    sys.exit(EXIT_PIPE_CLOSED)


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
      4  cost --budgets: a budget's spend is over its limit (the line names it)

    Every command takes --json: its summary as one JSON document on stdout.
    """
