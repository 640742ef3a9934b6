"""The compaction job (``vakpipe compact``): plan the packets a capacity needs.

:func:`jobs.audit.audit_job` with replay options that carry
:class:`~pipeline.compaction.engine.CompactionOptions`; this module builds them and prints.
"""

from __future__ import annotations

import dataclasses

import click

from jobs.audit import audit_job, print_summary
from pipeline.compaction.engine import CompactionOptions
from pipeline.io.storage import MAX_LINE_BYTES, Location
from pipeline.run.orchestrate import RunSummary
from pipeline.run.replay_batches import ReplayOptions


def compact_job(root: Location, out: Location, options: ReplayOptions,
                compaction: CompactionOptions, *, write_archive: bool = False,
                sessions: frozenset[str] | None = None, scheduler: str | None = None,
                workers: int | None = None, progress: bool | None = None,
                max_line_bytes: int = MAX_LINE_BYTES) -> RunSummary:
    """Replay every session under ``root`` under planner v1 for the compaction's capacity
    profile, plan its packets, and commit the integrity, ``turns``, ``requests`` and
    ``compaction`` tables (and, with ``write_archive``, the compacted copies under
    ``out/archive``) in one atomic commit."""
    options = dataclasses.replace(options, planner=True, compaction=compaction,
                                  write_archive=write_archive)
    return audit_job(root, out, options, sessions=sessions, scheduler=scheduler,
                     workers=workers, progress=progress, max_line_bytes=max_line_bytes)


def print_compaction_summary(summary: RunSummary, *, write_archive: bool = False) -> None:
    """Print a compaction run's summary: the audit's, then what the budget needs (and,
    with ``write_archive``, that segment ledgers are not copied)."""
    print_summary(summary)
    c = summary.compaction
    click.echo(f"  compaction: {c['sessions_needing_packets']:,} of {summary.sessions:,} "
               f"sessions need packets; {c['packets']:,} packets planned, "
               f"{c['packets_superseded']:,} superseded by broader ones")
    if c["transcripts_not_planned"]:
        click.echo(f"  transcripts: {c['transcripts_not_planned']:,} (Claude Code, Codex) get "
                   "no plan: their requests cannot be rebuilt, only measured "
                   "(docs/formats.md)")
    if c["archive_sessions"]:
        click.echo(f"  compacted archive: {c['archive_sessions']:,} ledgers under "
                   f"{summary.out}/archive")
    segments = summary.storages.get("segments", 0)
    if write_archive and segments:
        click.echo(f"  segment ledgers: {segments:,} not copied into the compacted archive "
                   "(a copy would be their decrypted content); their packets say "
                   "archived: false")
    click.echo(f"  table: {summary.out}/compaction")
