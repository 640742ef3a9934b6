"""The option groups the commands share, and the one builder of replay options.

Each command module takes its options from here (``--storage-option``, ``--prices``,
the cluster, the progress reporter, the replay flags, ``--max-line-bytes``,
``--force``), so one flag means the same on every command that has it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pipeline.errors import UsageError
from pipeline.io.storage import LARGEST_LINE_LIMIT, MAX_LINE_BYTES
from pipeline.ledger.types import LARGEST_WINDOW

if TYPE_CHECKING:
    from pipeline.run.replay_batches import ReplayOptions

F = TypeVar("F", bound=Callable[..., Any])
storage_option = click.option(
    "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
    help="fsspec storage option (repeatable), e.g. endpoint_url=http://127.0.0.1:5000",
)
prices_option = click.option(
    "--prices", "prices_path", default=None, type=click.Path(dir_okay=False),
    metavar="FILE|SOURCE",
    help="Your own price table (TOML), or a price source vakpipe plugins lists (a "
         "plug-in, or genai-prices: its data before vakpipe's overrides): its rules "
         "come first.")

#: ``--window``'s tokens, as a catalog rule's (:data:`LARGEST_WINDOW`).
WINDOW = click.IntRange(min=1, max=LARGEST_WINDOW)

#: Seconds between heartbeat lines when stderr is not a terminal (``--heartbeat``).
DEFAULT_HEARTBEAT_S = 30.0


class Seconds(click.FloatRange):
    """A number of seconds in a range, NaN refused: no comparison holds for it, so the
    range lets it through (``--heartbeat nan`` timed its waits at zero: ten thousand
    heartbeat lines in a two-second run)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        """``value`` as FloatRange converts it, unless it is NaN."""
        seconds = super().convert(value, param, ctx)
        if seconds != seconds:
            self.fail("nan is not a number of seconds", param, ctx)
        return seconds


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
                 help="Workers of the local cluster (default: one per core; a small "
                      "archive runs in this process, no cluster: under 128 MiB for an "
                      "audit, 32 MiB when it replays, 2.25x that for a folder on two "
                      "cores); 0: always in this process."),
    storage_option,
)
session_option = click.option(
    "--session", "session_ids", multiple=True, metavar="ID",
    help="Only the session with this id, its file name's stem (repeatable).")
progress_option = _options(
    click.option("--progress/--no-progress", default=None, callback=_set_reporter("progress"),
                 help="Progress bar labelled by stage (default: on a tty)."),
    # At most a day: past about 3e11 s the waits overflow the platform's time_t.
    click.option("--heartbeat", type=Seconds(min=0, max=86_400),
                 default=DEFAULT_HEARTBEAT_S,
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
    click.option("--window", type=WINDOW, default=None,
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


def keys_option(f: F) -> F:
    """``--keys FILE`` and vak's key material (``--vak-key-file``, ``--vak-tenant``, the
    passphrase in ``$VAKPIPE_KEY_PASSPHRASE``): the keys that open sealed segment
    ledgers (docs/segments.md). Loaded before the command runs; every location the
    command resolves then carries them to its workers
    (:func:`pipeline.io.storage.use_keys`)."""
    @functools.wraps(f)
    def run_with_keys(*args: Any, keys_path: str | None, vak_key_file: str | None,
                      vak_tenant: str | None, **kwargs: Any) -> Any:
        from pipeline.io.keyfiles import load_keys
        from pipeline.io.storage import use_keys

        use_keys(load_keys(keys_path, vak_key_file, vak_tenant))
        try:
            return f(*args, **kwargs)
        finally:
            use_keys(None)

    options = _options(
        click.option("--keys", "keys_path", default=None, metavar="FILE",
                     help="JSON object: key scope (a segment ledger's KEY, e.g. "
                          "conversation:<id>) -> its 32-byte key in hex. Opens sealed "
                          "segment ledgers; without it they are verified, not read."),
        click.option("--vak-key-file", default=None, metavar="FILE",
                     help="vak's passphrase-sealed key file (passphrase in "
                          "$VAKPIPE_KEY_PASSPHRASE), with --vak-tenant."),
        click.option("--vak-tenant", default=None, metavar="DIR",
                     help="The vak tenant home whose keys/scopes/ holds the wrapped "
                          "scope keys (with --vak-key-file)."),
    )
    return options(run_with_keys)  # type: ignore[return-value]


_BYTE_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "k": 2**10,
               "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30}


if TYPE_CHECKING:
    _IntParamType = click.ParamType[int, Any]
else:
    _IntParamType = click.ParamType  # generic (subscriptable) only from click 8.4


class ByteSize(_IntParamType):
    """A byte count: ``1048576``, ``64MiB``, ``512KiB``, ``1GiB`` (kB, MB, GB are powers
    of ten)."""

    name = "bytes"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        """``value`` as a positive number of bytes, at most :data:`LARGEST_LINE_LIMIT`
        (a larger one, "no limit" to its user, reads as that: no line is longer)."""
        if isinstance(value, int):
            return min(value, LARGEST_LINE_LIMIT)
        match = _BYTE_SIZE.fullmatch(str(value))
        unit = _BYTE_UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None or int(match.group(1)) < 1:
            self.fail(f"{value!r} is not a byte count (e.g. 1048576, 64MiB)", param, ctx)
        return min(int(match.group(1)) * unit, LARGEST_LINE_LIMIT)


max_line_option = click.option(
    "--max-line-bytes", type=ByteSize(), default=f"{MAX_LINE_BYTES // 2**20}MiB",
    show_default=True,
    metavar="N", help="Longest line read (e.g. 64MiB): a longer one is reported as a "
    "damaged line and never read into memory.")


def build_replay_options(rules: str, planner: bool, catalog_path: str | None,
                         window: int | None, scope: str | None) -> ReplayOptions:
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
    return ReplayOptions(rules, catalog, planner, scope)
