"""The ``vakpipe`` command line: thin wrappers over the library and the jobs.

Contract: the top layer; nothing imports it (``pipeline.cli:main`` is the entry point).
It alone imports :mod:`pipeline.synth` (``generate``, ``demo``) besides tests and benches.

One module per command group, each a set of plain click commands that import nothing
heavy until they run, and that import one another never (an ``independence`` contract):
:mod:`~pipeline.cli.audit` (``audit``, ``replay``), :mod:`~pipeline.cli.show`,
:mod:`~pipeline.cli.nightly`, :mod:`~pipeline.cli.compact`, :mod:`~pipeline.cli.regress`,
:mod:`~pipeline.cli.cost`, :mod:`~pipeline.cli.generate`, :mod:`~pipeline.cli.demo`,
:mod:`~pipeline.cli.plugins`, :mod:`~pipeline.cli.export` (``export otel``),
:mod:`~pipeline.cli.dashboard`. They share :mod:`~pipeline.cli._options` (the option
groups, the replay options' builder) and :mod:`~pipeline.cli._exits` (exit codes,
``--fail-on``); the group and its one error handler are :mod:`~pipeline.cli._group`.
This module adds the commands to the group.
"""

from __future__ import annotations

from typing import Any

from pipeline.cli import (
    audit,
    compact,
    cost,
    dashboard,
    demo,
    export,
    generate,
    nightly,
    plugins,
    regress,
    show,
)
from pipeline.cli._exits import (
    EXIT_BUDGET,
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_UNUSABLE,
)
from pipeline.cli._group import main

__all__ = ["EXIT_BUDGET", "EXIT_FINDINGS", "EXIT_OK", "EXIT_PARTIAL", "EXIT_UNUSABLE", "main",
           "run"]

for _command in (audit.audit, audit.replay, show.show, nightly.nightly, compact.compact,
                 regress.regress, cost.cost, generate.generate, demo.demo, plugins.plugins,
                 export.export, dashboard.dashboard):
    main.add_command(_command)


def run(argv: list[str] | None = None) -> Any:
    """Call the CLI in-process (for tests); returns the exit code."""
    try:
        main.main(args=argv, prog_name="vakpipe", standalone_mode=True)
    except SystemExit as stop:
        return stop.code
    return 0
