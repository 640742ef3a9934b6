"""The fleet dashboard job (``vakpipe dashboard``): one HTML page for a nightly output
(every ``date=`` partition, or every night of a ``--format delta`` output: the trend; the
newest: everything else) or for one run.

Thin: the figures and the page are :mod:`pipeline.costs.dashboard`; this module finds the
nights, reads their tables (each night's as of its one commit:
:class:`pipeline.io.commit.CommittedRun`), writes the page and prints where it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click
import pyarrow as pa

from pipeline.costs.dashboard import (
    FINDING_COLUMNS,
    SESSION_COLUMNS,
    DashboardPage,
    Night,
    by_day_and_session,
    cost_by_project_day,
    night_of,
    packet_savings,
    render_dashboard,
    saturation_by_model,
    top_waste,
)
from pipeline.costs.pricing import load_prices
from pipeline.costs.report import drop_copies, unknown_lines
from pipeline.errors import CorruptManifestError, ExpiredVersionError, UsageError
from pipeline.io.commit import (
    CommittedRun,
    check_named_night,
    check_reader_output,
    committed_partitions,
    open_run,
    read_manifest,
    unreadable_run,
)
from pipeline.io.delta import NIGHT, NIGHTS, Tables, nights_span, table_exists
from pipeline.io.delta import nights as committed_nights
from pipeline.io.files import write_file
from pipeline.io.storage import Location, map_io, storage_error, storage_errors
from pipeline.tables.partial import InputRun

#: The page's name under OUT when no ``--html`` is given.
DASHBOARD_HTML = "dashboard.html"
#: The ``--json`` document's schema (docs/dashboard.md).
SCHEMA = "vakpipe.dashboard/1"


@dataclass(frozen=True)
class DashboardOutcome:
    """Where the page went and what it shows."""

    path: str
    nights: list[Night]
    sessions_needing_packets: int | None
    tokens_saved: int | None
    billed_usd: float
    wasted_usd: float
    #: Nights whose tables retention expired (``nightly --keep-days``): left out.
    expired: list[str]

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {"schema": SCHEMA, "html": self.path,
                "nights": [{"night": n.label, "sessions": n.sessions, "partial": n.partial,
                            "findings": n.severities, "codes": n.codes} for n in self.nights],
                "sessions_needing_packets": self.sessions_needing_packets,
                "tokens_saved": self.tokens_saved, "billed_usd": self.billed_usd,
                "wasted_usd": self.wasted_usd, "expired_nights": self.expired}


def _runs(out: Location) -> list[tuple[str, CommittedRun]]:
    """``(label, run)`` of the runs shown, oldest first: OUT itself when it is a run,
    else its committed ``date=`` partitions (a folder without a manifest is a night that
    did not commit: left out), or a Delta nightly output's nights."""
    try:
        manifest = read_manifest(out)
        if manifest is not None:
            return [(_run_label(manifest), CommittedRun(out, manifest))]
        runs = [(day, CommittedRun(loc, found))
                for day, loc, found in committed_partitions(out)]
    except CorruptManifestError as err:
        raise unreadable_run(err) from err
    if not runs and table_exists(out, NIGHTS):
        # A Delta nightly output (`nightly --format delta`): one point per night
        # committed, each read as of itself (OUT/night=YYYY-MM-DD).
        for day in sorted({str(r[NIGHT]) for r in committed_nights(Tables(out))}):
            night = open_run(out.child(f"night={day}"))
            if night is not None:
                runs.append((day, night))
    if not runs:
        check_named_night(out)
        missing = "" if out.filesystem().exists(out.path) else "nothing is there, so "
        raise UsageError(f"{out.url}: {missing}no committed run and no nightly partition "
                         "(date=…) with one; run `vakpipe audit` or `vakpipe nightly` into it "
                         "first")
    return runs


def _run_label(manifest: dict[str, Any]) -> str:
    """A run's point on the page: its night (a nightly partition's ``date``), else the
    UTC day of its run id (``20261207T...``) as ``2026-12-07``, as the nights are."""
    night = manifest.get("date")
    if isinstance(night, str) and night:
        return night
    run_id = str(manifest.get("run_id") or "run")
    day = run_id[:8]
    return f"{day[:4]}-{day[4:6]}-{day[6:]}" if day.isdigit() and len(day) == 8 else run_id


def _integrity(run: CommittedRun) -> tuple[pa.Table, pa.Table] | None:
    """The columns of a night's sessions and findings the page shows; ``None`` when its
    Delta version has expired."""
    try:
        return (run.read("integrity/sessions", SESSION_COLUMNS),
                run.read("integrity/findings", FINDING_COLUMNS))
    except ExpiredVersionError:
        return None


def dashboard_job(out: Location, *, html: Location | None = None,
                  prices: str | None = None) -> DashboardOutcome:
    """Build and write the dashboard of the run or nightly output under ``out``.

    Parameters
    ----------
    out : Location
        A run's output, or a nightly output (its ``date=`` partitions).
    html : Location, optional
        The page's file; default ``OUT/dashboard.html``.
    prices : str, optional
        A price file or price-source plug-in (as ``vakpipe cost --prices``).

    Raises
    ------
    UsageError
        Nothing committed under ``out``.
    """
    try:
        runs = _runs(out)
        dest = html or out.child(DASHBOARD_HTML)
        for _, run in runs:  # before any table is read
            if "integrity/sessions" not in run.datasets:
                from jobs.regression_check import replays_hint  # only on this error's way

                raise UsageError(f"{run.location.url}: its run has no integrity tables"
                                 f"{replays_hint(run.location, run.datasets)}")
            # The page lands in no archive a night read, on no night's files.
            check_reader_output(run, out, dest, folder=False)
        nights, sessions, expired = [], None, []
        # Only what the page shows: a year of nights is 365 tables of each, read side by
        # side on an object store.
        for (label, run), tables in zip(runs, map_io(out, _integrity, [r for _, r in runs]),
                                        strict=True):
            if tables is None:  # an expired version: never the newest night's
                expired.append(label)
                continue
            sessions, findings = tables
            nights.append(night_of(label, sessions, findings,
                                   partial=InputRun.of(run.location.url, run.manifest).partial))
        _, newest = runs[-1]
        usage = newest.read_optional("usage")
        requests = newest.read_optional("requests")
        compaction = newest.read_optional("compaction")
    except storage_errors() as err:
        raise storage_error(err, out.url) from err
    table = load_prices(prices)
    cost, waste, unpriced, billed, wasted = [], [], [], 0.0, 0.0
    if usage is not None:
        # Priced as `vakpipe cost` prices it: a request several files hold, once.
        usage, _ = drop_copies(usage)
        totals = by_day_and_session(usage, table)
        cost = cost_by_project_day(totals.table, sessions)
        waste = top_waste(totals.table)
        unpriced = unknown_lines(totals.unknown)
        billed, wasted = float(totals.totals["billed"].total), \
            float(totals.totals["wasted"].total)
    packets = packet_savings(compaction) if compaction is not None else None
    page = DashboardPage(
        source=out.url, run_id=newest.manifest.get("run_id"), nights=nights, cost=cost,
        top_waste=waste,
        saturation=saturation_by_model(requests) if requests is not None else None,
        packets=packets, prices=f"prices: {table.source}", unpriced=unpriced,
        expired=expired)
    write_file(dest, render_dashboard(page).encode("utf-8"))
    return DashboardOutcome(dest.url, nights, packets.sessions if packets else None,
                            packets.tokens_saved if packets else None, billed, wasted,
                            expired)


def print_dashboard(outcome: DashboardOutcome) -> None:
    """Where the page is, and its headline figures."""
    last = outcome.nights[-1]
    findings = sum(last.severities.values())
    packets = ("" if outcome.sessions_needing_packets is None else
               f"; {outcome.sessions_needing_packets:,} sessions need packets "
               f"({outcome.tokens_saved:,} tokens saved)")
    click.echo(f"dashboard: {len(outcome.nights):,} night(s), newest {last.label}: "
               f"{last.sessions:,} sessions, {findings:,} findings; billed "
               f"${outcome.billed_usd:,.2f}, wasted ${outcome.wasted_usd:,.2f}{packets}")
    if outcome.expired:
        click.echo(f"  earlier nights not shown, their tables expired by --keep-days: "
                   f"{nights_span(outcome.expired)}")
    click.echo(f"  page: {outcome.path}")
