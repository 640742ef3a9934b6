"""``--json``: a command's summary as one JSON document on stdout (docs/json-output.md).

Every command takes ``--json`` (:data:`json_option`). With it, the command runs inside
:func:`json_output`: whatever it would print on stdout (its human summary) goes to
stderr instead, and when it ends, exit 0, 1 or 3 alike, the one document it set is
written to stdout: ``{"schema": "vakpipe.<command>/1", ...}``. A command that stops on
unusable input (exit 2) writes ``{"schema": "vakpipe.error/1", ...}`` instead, through
the group's one error handler (:func:`error_document`). Exit codes do not change.

The document is ASCII JSON (``ensure_ascii``): a key or model name from a ledger, with
control characters or escape sequences in it, cannot reach a terminal raw. A change that
removes or renames a key, or changes its meaning, is a new schema version (``/2``);
adding a key is not.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, TextIO

import click

#: The ``click`` context ``meta`` key saying that ``--json`` is in force.
JSON_META = "vakpipe.json"
#: The version of every ``vakpipe.<command>`` schema this vakpipe writes.
SCHEMA_VERSION = 1


def _remember(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[JSON_META] = ctx.info_name or "vakpipe"
    return value


json_option = click.option(
    "--json", "as_json", is_flag=True, callback=_remember,
    help="Print the summary as one JSON document on stdout (schema vakpipe.<command>/1, "
         "docs/json-output.md); the human text goes to stderr. Exit codes are unchanged.")


def schema(command: str) -> str:
    """The schema name of ``command``'s document (``vakpipe.cost/1``)."""
    return f"vakpipe.{command}/{SCHEMA_VERSION}"


def _default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, set | frozenset | tuple):
        return sorted(value) if isinstance(value, set | frozenset) else list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def dumps(document: dict[str, Any]) -> str:
    """``document`` as one line of ASCII JSON (dates as ISO strings)."""
    return json.dumps(document, default=_default, ensure_ascii=True, allow_nan=False)


@dataclass
class JsonDocument:
    """The document a command fills while it runs (:meth:`set`); written when it ends."""

    command: str
    enabled: bool
    body: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def set(self, body: dict[str, Any]) -> None:
        """The command's summary (every key but ``schema``)."""
        self.body = body

    def text(self) -> str | None:
        """The document's line, or ``None`` when the command set none."""
        if self.body is None:
            return None
        return dumps({"schema": schema(self.command), **self.body, **self.extra})


@contextlib.contextmanager
def json_output(command: str, enabled: bool) -> Iterator[JsonDocument]:
    """Run a command body with ``--json`` in force (when ``enabled``): stdout goes to
    stderr, and the document is written to the real stdout as the body ends, whether it
    returns or exits (``sys.exit`` of 1 or 3). An exception other than ``SystemExit``
    writes nothing here (the group's handler writes the error document)."""
    doc = JsonDocument(command, enabled)
    if not enabled:
        yield doc
        return
    real: TextIO = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        try:
            yield doc
        except SystemExit as stop:
            doc.extra["exit"] = stop.code if isinstance(stop.code, int) else 1
            _write(real, doc)
            raise
    doc.extra["exit"] = 0
    _write(real, doc)


def _write(stream: TextIO, doc: JsonDocument) -> None:
    line = doc.text()
    if line is not None:
        stream.write(line + "\n")
        stream.flush()


def error_document(ctx: click.Context | None, message: str, code: int) -> None:
    """Write the ``vakpipe.error/1`` document on stdout when ``--json`` was given."""
    if ctx is None or JSON_META not in ctx.meta:
        return
    click.echo(dumps({"schema": schema("error"), "command": ctx.meta[JSON_META],
                      "error": message, "exit": code}))
