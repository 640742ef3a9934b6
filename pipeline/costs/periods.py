"""The periods and projects a ``usage`` table is grouped by (``vakpipe cost --by``). Pure.

A record's ``day`` is the UTC day of its ``ts`` as the audit wrote it; with a time zone
(``--timezone``) it is the day of ``ts`` on that zone's clock, so a request at 23:30 UTC
counts on the next day in Europe/Berlin and on the same day in America/New_York, as
ccusage's ``--timezone`` counts it. ``week`` is the Monday that starts the ISO week of
that day, ``month`` its ``YYYY-MM``. A record with no ``ts`` keeps the audit's ``day``
(null) and so has no week or month either.

``project`` is what the audit recorded as the session's folder (``integrity/sessions``
column ``cwd_hash``): the Claude Code project folder (``projects/<dir>/``, the dashed
cwd Claude Code writes), the FNV-1a hash of a vak header's ``cwd`` (the folder of its
ledger, ``agents/<agent>/sessions/<cwd hash>/``). A Codex rollout records no project in
its path (its folder is the day): its project is null, shown as ``(none)``.
"""

from __future__ import annotations

from datetime import date
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import UsageError

#: Sources whose session folder names no project (a Codex rollout's folder is its day).
_NO_PROJECT = ("codex",)
#: The columns :func:`with_periods` and :func:`with_projects` add to ``usage``.
PERIOD_COLUMNS = ("week", "month")
PROJECT_COLUMN = "project"


def check_timezone(name: str | None) -> str | None:
    """``name`` when it is an IANA time zone this machine knows (``Europe/Berlin``,
    ``UTC``), else a :class:`~pipeline.errors.UsageError`; ``None`` stays ``None``.

    Raises
    ------
    UsageError
        An unknown zone name.
    """
    if name is None:
        return None
    try:
        ZoneInfo(name)
        # Arrow, which computes the days, reads fewer names than zoneinfo takes
        # (posixrules, posix/..., right/..., Factory): those were a traceback.
        pc.local_timestamp(pa.array([0], pa.timestamp("s", tz=name)))
    except (ZoneInfoNotFoundError, ValueError) as err:  # ArrowInvalid is a ValueError
        raise UsageError(f"--timezone {name!r}: not a time zone name (e.g. UTC, "
                         "Europe/Berlin, America/New_York)") from err
    return name


def local_days(ts: pa.ChunkedArray | pa.Array, zone: str) -> pa.ChunkedArray | pa.Array:
    """The calendar day of each instant of ``ts`` on ``zone``'s clock (null stays null)."""
    if not pa.types.is_timestamp(ts.type):
        raise TypeError(f"expected timestamps, got {ts.type}")
    unit = ts.type.unit
    zoned = ts.cast(pa.timestamp(unit, tz=ts.type.tz or "UTC")).cast(
        pa.timestamp(unit, tz=zone))
    return pc.local_timestamp(zoned).cast(pa.date32())


def with_periods(usage: pa.Table, zone: str | None = None) -> pa.Table:
    """``usage`` with ``day`` on ``zone``'s clock (when given) and ``week`` (its ISO
    week's Monday, a date) and ``month`` (``YYYY-MM``) columns added.

    Parameters
    ----------
    usage : pyarrow.Table
        Rows of the ``usage`` dataset (``ts`` and ``day`` columns).
    zone : str or None
        An IANA zone name (:func:`check_timezone`); ``None`` keeps the audit's UTC days.
    """
    day = usage["day"]
    if zone is not None and usage.num_rows:
        # A record with no ts keeps the audit's day (null: the audit derives it from ts).
        day = pc.coalesce(local_days(usage["ts"], zone), day)
        usage = usage.set_column(usage.schema.get_field_index("day"), "day", day)
    week = pc.floor_temporal(day, unit="week", week_starts_monday=True) \
        if usage.num_rows else pa.array([], pa.date32())
    month = pc.strftime(day, format="%Y-%m") if usage.num_rows else pa.array([], pa.string())
    for name, column in (("week", week), ("month", month)):
        if name in usage.column_names:
            usage = usage.drop_columns([name])
        usage = usage.append_column(name, column)
    return usage


def with_projects(usage: pa.Table, sessions: pa.Table | None) -> pa.Table:
    """``usage`` with a ``project`` column: each row's session's folder from the run's
    ``integrity/sessions`` table (module docstring); null for a Codex rollout, and for a
    session the table does not hold (or no table)."""
    if PROJECT_COLUMN in usage.column_names:
        usage = usage.drop_columns([PROJECT_COLUMN])
    if sessions is None or "cwd_hash" not in sessions.column_names or not usage.num_rows:
        return usage.append_column(PROJECT_COLUMN, pa.nulls(usage.num_rows, pa.string()))
    folders = sessions.select(["session_path", "cwd_hash"])
    if "source" in sessions.column_names:
        no_project = pc.is_in(pc.fill_null(sessions["source"], "vak"),
                              value_set=pa.array(_NO_PROJECT))
        folders = folders.set_column(1, "cwd_hash", pc.if_else(
            no_project, pa.scalar(None, pa.string()), folders["cwd_hash"]))
    # Each usage row's own file (a subagent's transcript lies in its project's folder).
    index = pc.index_in(usage["session_path"], value_set=folders["session_path"])
    project = pc.take(folders["cwd_hash"].combine_chunks(), index)
    return usage.append_column(PROJECT_COLUMN, project)


def day_range(usage: pa.Table) -> tuple[date | None, date | None]:
    """The first and last ``day`` of ``usage`` (nulls skipped), or ``(None, None)``."""
    if not usage.num_rows:
        return None, None
    span = pc.min_max(usage["day"])
    return span["min"].as_py(), span["max"].as_py()
