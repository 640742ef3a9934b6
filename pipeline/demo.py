"""``vakpipe demo``: the whole audit on an embedded default, in one command.

A local S3 endpoint (moto's server on 127.0.0.1), a generated fleet uploaded to it, the
audit on a LocalCluster of processes, and a summary. The tables are written to a local
folder so they outlive the endpoint.
"""

from __future__ import annotations

import click

from jobs.audit import audit_job, print_summary
from pipeline.io.fleet import write_fleet
from pipeline.io.local_s3 import local_s3
from pipeline.io.storage import resolve

BUCKET = "vakpipe-demo"


def run_demo(*, sessions: int = 200, seed: int = 7, out: str = "out/demo",
             workers: int | None = None) -> None:
    """Run the demo and print where the results are."""
    with local_s3() as s3:
        click.echo(f"local S3 endpoint: {s3.endpoint}")
        archive = resolve(f"s3://{BUCKET}/archive")
        archive.filesystem().mkdir(BUCKET)
        fleet = write_fleet(archive, sessions=sessions, seed=seed, faults=True)
        click.echo(f"uploaded {fleet.sessions} generated sessions ({fleet.bytes:,} bytes) "
                   f"to {archive.url}")
        summary = audit_job(archive, resolve(out), workers=workers)
        print_summary(summary)
    click.echo(f"results: {resolve(out).path} (Parquet; _manifest.json lists the run)")
