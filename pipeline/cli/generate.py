"""``vakpipe generate``: a synthetic fleet in vak's wire format, with its ground truth."""

from __future__ import annotations

import os

import click

from pipeline.cli._options import (
    storage_option,
)
from pipeline.cli._output import json_option, json_output
from pipeline.errors import UsageError
from pipeline.io.storage import parse_storage_options, resolve


@click.command()
@click.argument("out")
@click.option("--sessions", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--faults/--no-faults", default=False, help="Inject one fault into some sessions.")
@click.option("--force", is_flag=True,
              help="Write into a folder that is not empty (adds sessions; replaces "
                   "ground-truth.json).")
@click.option("--segment-ledgers", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also write this many of vak's record-segment ledgers (docs/segments.md).")
@click.option("--keys-out", default=None, metavar="FILE",
              help="Write the segment ledgers' keys here, as --keys reads them.")
@storage_option
@json_option
def generate(out: str, sessions: int, seed: int, faults: bool, force: bool,
             segment_ledgers: int, keys_out: str | None,
             storage_options: tuple[str, ...], as_json: bool) -> None:
    """Write a synthetic fleet in vak's wire format under OUT (an empty folder, unless
    --force), with its ground truth."""
    from pipeline.synth.fleet import write_fleet

    with json_output("generate", as_json) as doc:
        if keys_out is not None and not os.path.isdir(os.path.dirname(os.path.abspath(keys_out))):
            raise UsageError(f"--keys-out {keys_out}: its folder does not exist")
        loc = resolve(out, parse_storage_options(storage_options))
        written = write_fleet(loc, sessions=sessions, seed=seed, faults=faults,
                              exclusive=not force)
        click.echo(f"wrote {written.sessions} sessions, {written.bytes:,} bytes under {out}; "
                   f"ground truth: {written.truth_path}")
        segments = 0
        if segment_ledgers:
            from pipeline.synth.segments import write_segment_fleet

            made, keys = write_segment_fleet(loc, segment_ledgers, seed=seed, faults=faults)
            segments = len(made)
            if keys_out is not None:
                _write_keys(keys_out, keys)
            click.echo(f"wrote {len(made)} segment ledgers; ground truth: "
                       f"{loc.join('segment-ground-truth.json')}"
                       + (f"; keys: {keys_out}" if keys_out else ""))
        doc.set({"out": out, "sessions": written.sessions, "bytes": written.bytes,
                 "seed": seed, "faults": faults, "ground_truth": str(written.truth_path),
                 "segment_ledgers": segments})


def _write_keys(path: str, keys: bytes) -> None:
    """Write the keys file readable by its owner only (it holds the ledgers' keys)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # a file that was there keeps no wider mode
            f.write(keys)
    except OSError as err:
        raise UsageError(f"--keys-out {path}: cannot write it ({err.strerror or err})") from err
