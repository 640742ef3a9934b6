"""``vakpipe demo``: the whole audit on an embedded default, in one command.

A local S3 endpoint (moto's server on 127.0.0.1), a generated fleet uploaded to it, the
audit on a LocalCluster of processes, and a summary; then two compaction what-ifs on the
same cluster: the packets each session's bound model needs, and those it would need with
half its window. The tables are written to local folders so they outlive the endpoint,
every one of them under ``OUT`` and nothing beside it: the audit's in ``OUT/audit``,
each what-if's in ``OUT/compaction-bound`` and ``OUT/compaction-half`` (each a run's
output, committed by its own manifest).

Its heavy imports (the cluster, the local S3 server, the generator) wait for the command
to run: ``vakpipe --help`` and every other command load none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pipeline.cli._output import json_option, json_output
from pipeline.io.storage import resolve

if TYPE_CHECKING:
    from pipeline.io.storage import Location

BUCKET = "vakpipe-demo"
#: The compaction what-ifs: folder suffix, window scale, how the line names it.
WHAT_IFS = (("bound", 1.0, "at the bound window"), ("half", 0.5, "at half the bound window"))


#: Plain segment ledgers uploaded beside the generated JSONL fleet.
SEGMENT_LEDGERS = 4
#: The audit's folder under the demo's ``--out``.
AUDIT_DIR = "audit"


def audit_out(out: str) -> str:
    """The folder under ``out`` that the audit writes to."""
    return f"{out.rstrip('/')}/{AUDIT_DIR}"


def compaction_out(out: str, name: str) -> str:
    """The folder under ``out`` that the ``name`` what-if writes to."""
    return f"{out.rstrip('/')}/compaction-{name}"


@click.command()
@click.option("--sessions", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--out", default="out/demo", show_default=True, help="Where the tables go.")
@click.option("--workers", type=click.IntRange(min=1), default=None)
@json_option
def demo(sessions: int, seed: int, out: str, workers: int | None, as_json: bool) -> None:
    """Start a local S3 endpoint, upload a generated fleet, audit it, print a summary."""
    with json_output("demo", as_json) as doc:
        record: dict[str, Any] = {}
        run_demo(sessions=sessions, seed=seed, out=out, workers=workers, record=record)
        doc.set(record)


def run_demo(*, sessions: int = 200, seed: int = 7, out: str = "out/demo",
             workers: int | None = None, record: dict[str, Any] | None = None) -> None:
    """Run the demo and print where the results are.

    Parameters
    ----------
    sessions, seed:
        The generated fleet (with injected faults).
    out:
        Local folder of the results: the audit's tables in :func:`audit_out`, the
        compaction what-ifs' in :func:`compaction_out` (nothing is written beside it).
    workers:
        LocalCluster size (default: one per core).
    record:
        Filled with what was printed, as JSON values (``vakpipe demo --json``).
    """
    from jobs.audit import audit_job, print_summary, summary_json
    from pipeline.run.orchestrate import dask_client
    from pipeline.synth.fleet import write_fleet
    from pipeline.synth.local_s3 import local_s3
    from pipeline.synth.segments import segment_ledger, write_segment_ledger

    with local_s3() as s3:
        click.echo(f"local S3 endpoint: {s3.endpoint}")
        archive = resolve(f"s3://{BUCKET}/archive")
        archive.filesystem().mkdir(BUCKET)
        fleet = write_fleet(archive, sessions=sessions, seed=seed, faults=True)
        # Beside the JSONL fleet, a few ledgers as current vak writes them (directories
        # of record segments, plain: their content reads without keys; docs/segments.md).
        ledgers = [segment_ledger(seed * 1000 + i, sealed=False, segments=3)
                   for i in range(SEGMENT_LEDGERS)]
        for led in ledgers:
            write_segment_ledger(archive, led)
        segment_bytes = sum(len(d) for led in ledgers for d in led.files.values())
        click.echo(f"uploaded {fleet.sessions} generated sessions ({fleet.bytes:,} bytes) "
                   f"and {len(ledgers)} segment ledgers ({segment_bytes:,} bytes) "
                   f"to {archive.url}")
        # One cluster for the three runs (started inside the endpoint's lifetime, so its
        # workers inherit the endpoint's settings): a cluster start costs seconds.
        with dask_client(None, workers) as client:
            address = str(client.scheduler_info()["address"])
            summary = audit_job(archive, resolve(audit_out(out)), scheduler=address)
            print_summary(summary)
            click.echo("compaction what-ifs (planner v1, summaries from the turn cards):")
            what_ifs = [_what_if(archive, compaction_out(out, name), scale, label, address)
                        for name, scale, label in WHAT_IFS]
    click.echo(f"results: {resolve(out).path} (Parquet under audit/, compaction-bound/, "
               "compaction-half/; each folder's _manifest.json lists its run)")
    if record is not None:
        record.update({"archive": archive.url, "fleet": {"sessions": fleet.sessions,
                                                         "bytes": fleet.bytes, "seed": seed,
                                                         "segment_ledgers": len(ledgers),
                                                         "segment_bytes": segment_bytes},
                       "audit": summary_json(summary),
                       "what_ifs": {name: w for (name, _, _), w in zip(WHAT_IFS, what_ifs,
                                                                        strict=True)},
                       "out": resolve(out).path})


def _what_if(archive: Location, out: str, scale: float, label: str,
             scheduler: str) -> dict[str, Any]:
    from jobs.compact import compact_job
    from pipeline.compaction.cards import CardsSummariser
    from pipeline.compaction.engine import CompactionOptions
    from pipeline.run.replay_batches import ReplayOptions

    done = compact_job(archive, resolve(out), ReplayOptions(),
                       CompactionOptions(CardsSummariser(), scale=scale), scheduler=scheduler)
    c = done.compaction
    click.echo(f"  {label}: {c['sessions_needing_packets']:,} of {done.sessions:,} sessions "
               f"need packets ({c['packets']:,} planned, {c['packets_superseded']:,} "
               f"superseded); tables: {resolve(out).path}")
    return {"scale": scale, "sessions": done.sessions, "out": resolve(out).path,
            **{k: c[k] for k in ("sessions_needing_packets", "packets", "packets_superseded")}}
