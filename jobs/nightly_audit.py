"""The incremental nightly run: dated partitions, checkpoints, rows carried forward.

Each run commits one partition ``OUT/date=YYYY-MM-DD/`` holding the integrity, usage,
``turns``, ``requests`` (and, asked for, ``compaction``) tables of *every* session in
the archive that night, plus the ``checkpoints`` table (:mod:`pipeline.audit.checkpoint`).
Only objects that changed since the newest committed partition are read: the rows of
the others are copied from that partition. A rerun on the same day replaces the day's
partition (its own previous version is then the baseline).

The job (``vakpipe nightly``, the deployed CronJob): :func:`run_nightly` turns the
options into the run and commits it, :func:`print_nightly_summary` prints its result.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections import Counter
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any

import click
import pyarrow as pa
import pyarrow.compute as pc

from jobs.audit import print_summary
from pipeline.audit.checkpoint import Change, Checkpoint, classify, missing_finding
from pipeline.errors import BaselineError, CommitError, UsageError
from pipeline.io.commit import (
    MANIFEST,
    NIGHT_PARTITION,
    STAGING,
    SUCCESS,
    CommittedRun,
    StagedRun,
    new_run_id,
    other_archive,
    read_manifest,
    write_small_file,
)
from pipeline.io.storage import (
    MAX_LINE_BYTES,
    Listing,
    Location,
    printable,
    storage_error,
    storage_errors,
)
from pipeline.ledger.layout import SessionKey, parse_session_path
from pipeline.run.batches import not_audited
from pipeline.run.orchestrate import RunSummary, check_locations, execute_run, list_sessions
from pipeline.run.replay_batches import ReplayOptions
from pipeline.tables.schemas import findings_table, schemas_digest, sessions_table

SUMMARY_FILE = "summary.json"
#: Part indexes of carried and missing rows come after every task's (tasks count from 0).
_CARRIED_PART = 1_000_000


def partition(out: Location, day: date) -> Location:
    """The location of ``day``'s partition under ``out``."""
    name = f"date={day.isoformat()}"
    return out.child(name)


def _names(fs: Any, path: str) -> list[str]:
    fs.invalidate_cache(path)
    return [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]


def _partition_days(out: Location, day: date) -> list[date]:
    """The dates of the ``date=`` folders under ``out`` on or before ``day``, newest first."""
    try:
        names = _names(out.filesystem(), out.path)
    except FileNotFoundError:
        return []
    except storage_errors() as err:
        raise storage_error(err, out.url) from err
    days = sorted((m.group(1) for n in names if (m := NIGHT_PARTITION.match(n))), reverse=True)
    return [date.fromisoformat(t) for t in days if t <= day.isoformat()]


#: The folder of the ``delta`` layout's commit point (``jobs.nightly_tables``).
DELTA_NIGHTS = "nights"


def check_layout(out: Location, layout: str) -> None:
    """Refuse an ``out`` that holds the other layout's nights, or a run of its own (an
    audit's: its readers would read it, not the nights); one listing of ``out``.

    A ``--format delta`` night pointed at a folder of ``date=`` partitions (or the other
    way round) finds no baseline of its own: it would run as a first night, silently
    losing the history checks against the nights already there.

    Raises
    ------
    UsageError
        ``out`` holds nights of the other layout.
    """
    try:
        names = _names(out.filesystem(), out.path)
    except FileNotFoundError:
        return
    except storage_errors() as err:
        raise storage_error(err, out.url) from err
    partitions = sorted(n for n in names if NIGHT_PARTITION.match(n))
    if MANIFEST in names:
        raise UsageError(
            f"{out.url} holds a run of its own (its {MANIFEST}: an audit's, a replay's): "
            "nights beside it would be hidden from its readers, which read that run; give "
            "the nightly another --out")
    if layout == "delta" and partitions:
        raise UsageError(
            f"{out.url} holds nights of the partitions layout ({partitions[-1]}): "
            "--format delta starts its own history; give it another --out (or run "
            "--format partitions here)")
    if layout == "partitions" and DELTA_NIGHTS in names:
        raise UsageError(
            f"{out.url} holds the Delta tables of --format delta nights: run "
            "--format delta here, or give the partitions layout another --out")


def _manifest(loc: Location) -> dict[str, Any] | None:
    """The partition's manifest; ``None`` without one. Raises :class:`BaselineError`
    when it is there but not a manifest (cut, edited, not JSON)."""
    try:
        manifest = read_manifest(loc)
    except FileNotFoundError:
        return None
    except storage_errors() as err:
        raise storage_error(err, loc.url) from err
    except ValueError as err:  # not JSON, not UTF-8
        raise BaselineError(f"{loc.url}: {MANIFEST} is unreadable ({err})") from err
    if manifest is None:
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("datasets"), dict) \
            or "checkpoints" not in manifest["datasets"]:
        raise BaselineError(f"{loc.url}: {MANIFEST} is not a nightly partition's manifest")
    return manifest


def _was_committed(loc: Location) -> bool:
    """Whether a folder without a manifest held a committed night: its ``_SUCCESS``, or
    tables and no staging folder. A night that failed before or during its commit
    leaves only ``_staging`` (and, killed inside the commit, tables beside it)."""
    try:
        names = set(_names(loc.filesystem(), loc.path))
    except FileNotFoundError:
        return False
    except storage_errors() as err:
        raise storage_error(err, loc.url) from err
    return SUCCESS in names or (STAGING not in names and bool(names))


def _way_out(day: date, older: date | None) -> str:
    pick = (f"--baseline {older.isoformat()} to start from the newest intact partition, "
            "or " if older else "")
    return (f"run again with {pick}--rebaseline to start over from nothing (recorded as a "
            f"rebaseline in the {day.isoformat()} summary; no history break made meanwhile "
            "can then be reported)")


def latest_partition(out: Location, day: date) -> CommittedRun | None:
    """The newest committed partition on or before ``day`` (a manifest is its commit),
    as of the manifest read: every table the night takes from it is of that one commit.

    Folders of nights that failed before their commit are passed over.

    Raises
    ------
    BaselineError
        The newest night that was committed lost its manifest, or its manifest is
        unreadable: the checkpoints it held are gone, and reading everything as a first
        night would report no history break made since. The message names the way out.
    """
    days = _partition_days(out, day)
    for n, when in enumerate(days):
        loc = partition(out, when)
        try:
            manifest = _manifest(loc)
            if manifest is not None:
                return CommittedRun(loc, manifest)
            if not _was_committed(loc):
                continue
            problem = f"{loc.url}: committed, but its {MANIFEST} is gone"
        except BaselineError as err:
            problem = str(err)
        intact = next((d for d in days[n + 1:] if _intact(partition(out, d))), None)
        raise BaselineError(f"baseline {problem}; refusing to run as a first night, which "
                            f"would hide any history break since: {_way_out(day, intact)}")
    return None


def _way_out_before(out: Location, day: date, baseline: Location | None) -> str:
    """The way out of a baseline found unreadable: an intact partition older than it."""
    older = next((d for d in _partition_days(out, day)
                  if baseline is not None and partition(out, d).url < baseline.url
                  and _intact(partition(out, d))), None)
    return _way_out(day, older)


def _intact(loc: Location) -> bool:
    try:
        return _manifest(loc) is not None
    except BaselineError:
        return False


def chosen_partition(out: Location, day: date, baseline_day: date) -> CommittedRun:
    """The partition ``--baseline DATE`` names, which must be committed and readable, as
    of its manifest.

    Raises
    ------
    BaselineError, UsageError
        It is not there, not committed or unreadable; it is after ``day``.
    """
    if baseline_day > day:
        raise UsageError(f"--baseline {baseline_day.isoformat()} is after the night's date "
                         f"{day.isoformat()}")
    loc = partition(out, baseline_day)
    manifest = _manifest(loc)
    if manifest is None:
        raise BaselineError(f"--baseline {baseline_day.isoformat()}: {loc.url} is not a "
                            "committed partition")
    return CommittedRun(loc, manifest)


def options_fingerprint(options: ReplayOptions) -> str:
    """What the carried rows depend on: rule set, catalog, planner, compaction profile,
    and the output tables' columns (:func:`pipeline.tables.schemas.schemas_digest`).

    A change of any of them makes every session's replay rows stale, so the run reads
    everything again (the checkpoints still catch rewritten history).
    """
    compaction = options.compaction
    text = json.dumps({
        "rules": options.rules, "catalog": options.catalog.version,
        "catalog_rules": [dataclasses.astuple(r) for r in options.catalog.rules],
        "planner": options.planner, "scope": options.scope, "tables": schemas_digest(),
        "compaction": None if compaction is None else [
            compaction.window, compaction.model, compaction.scale, compaction.summary_tokens,
            compaction.summariser.name, compaction.summariser.version],
    }, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class NightlySummary:
    """A nightly run: the run's summary and what changed since the baseline."""

    run: RunSummary
    day: date
    baseline: str | None
    changes: Counter[str] = dataclasses.field(default_factory=Counter)
    bytes_read: int = 0
    #: ``--rebaseline``: started from nothing on purpose, earlier partitions ignored.
    rebaseline: bool = False
    #: ``--baseline DATE``: the baseline was named, not the newest partition.
    baseline_pinned: bool = False
    #: Where the summary was stored, when not the partition's ``summary.json``.
    summary_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``summary.json``)."""
        return {"run_id": self.run.run_id, "bytes_read": self.bytes_read, **self.run.as_dict(),
                "sessions_unread": len(self.run.unread),
                "rebaseline": self.rebaseline, "baseline_pinned": self.baseline_pinned,
                "changes": dict(sorted(self.changes.items()))}


def _from_baseline(baseline: CommittedRun, dataset: str,
                   way_out: Callable[[], str]) -> pa.Table:
    """A dataset of the baseline; one that cannot be read whole is a :class:`BaselineError`
    (a storage failure stays one: the night can simply be run again)."""
    try:
        return baseline.read(dataset)
    except (FileNotFoundError, ValueError, KeyError, TypeError, pa.ArrowException) as err:
        # A part file gone, or bytes that are not its table: the rows are lost.
        raise BaselineError(
            f"baseline {baseline.location.url}: its {dataset} table is unreadable "
            f"({printable(f'{type(err).__name__}: {err}', 160)}); {way_out()}") from err
    except storage_errors() as err:
        raise storage_error(err, baseline.location.url) from err


def check_same_root(root: Location, baseline: CommittedRun) -> None:
    """Refuse a night of another archive than its baseline's.

    Raises
    ------
    UsageError
        The baseline's manifest names another root (``--allow-other-root`` accepts it).
    """
    before = other_archive(baseline.manifest, root)
    if before is not None:
        raise UsageError(f"{root.url} is not the archive the baseline audited ({before}, "
                         f"{baseline.location.url}): every session would be reported "
                         "missing; --allow-other-root to accept it")


def _checkpoints(baseline: CommittedRun | None,
                 way_out: Callable[[], str]) -> dict[str, Checkpoint]:
    if baseline is None:
        return {}
    table = _from_baseline(baseline, "checkpoints", way_out)
    try:
        return {row["session_path"]: Checkpoint.from_row(row) for row in table.to_pylist()}
    except (KeyError, TypeError) as err:
        raise BaselineError(f"baseline {baseline.location.url}: its checkpoints table is "
                            f"not one ({err!r}); {way_out()}") from err


def _carry(staged: StagedRun, baseline: CommittedRun, paths: set[str],
           missing: list[Checkpoint], run: RunSummary, way_out: Callable[[], str]) -> None:
    """Stage the baseline's rows of ``paths`` and the rows of missing sessions; count
    both into ``run``."""
    keep = pa.array(sorted(paths), pa.string())
    for offset, name in enumerate(sorted(staged.schemas)):
        if name not in baseline.datasets or not paths:
            continue
        table = _from_baseline(baseline, name, way_out)
        table = table.filter(pc.is_in(table["session_path"], value_set=keep))
        staged.write_part(name, _CARRIED_PART + offset, table)
        if name == "integrity/sessions":
            run.statuses.update(table["status"].to_pylist())
        elif name == "integrity/findings":
            run.codes.update(table["code"].to_pylist())
    if missing:
        gone = [not_audited(parse_session_path(c.session_path)
                            or SessionKey(c.session_path, "", "", ""), c.size, missing_finding(c))
                for c in missing]
        index = _CARRIED_PART + len(staged.schemas)
        staged.write_part("integrity/sessions", index, sessions_table([g.row for g in gone]))
        staged.write_part("integrity/findings", index, findings_table(
            (g.row["session_path"], f) for g in gone for f in g.findings))
        # Kept, so the session is reported missing every night until it is back; and
        # read again when it is back, however unchanged it looks.
        staged.write_part("checkpoints", index, pa.Table.from_pylist(
            [c.reread().as_row() for c in missing], schema=staged.schemas["checkpoints"]))
        run.statuses["error"] += len(missing)
        run.codes["session_missing"] += len(missing)


def run_nightly(
    root: Location,
    out: Location,
    options: ReplayOptions,
    *,
    day: date | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    baseline_day: date | None = None,
    rebaseline: bool = False,
    allow_other_root: bool = False,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> NightlySummary:
    """Audit and replay what changed under ``root`` since the last night; commit the
    whole archive's tables into ``out``'s partition for ``day`` (default today, UTC).

    The baseline is the newest committed partition on or before ``day``;
    ``baseline_day`` (``--baseline``) names another, ``rebaseline`` (``--rebaseline``)
    starts from none, recorded as such in the summary. A baseline of another archive
    root is refused unless ``allow_other_root`` (its sessions would all be "missing").

    Returns
    -------
    NightlySummary
        The run's counts, what changed (``new``, ``unchanged``, ``changed``,
        ``missing``, ``history_truncated``, ``history_rewritten``) and the bytes read.

    Raises
    ------
    BaselineError
        The baseline lost its manifest, or it or its checkpoints are unreadable (and
        neither ``baseline_day`` nor ``rebaseline`` says what to do instead).
    """
    day = day or datetime.now(UTC).date()
    if rebaseline and baseline_day is not None:
        raise UsageError("--baseline and --rebaseline: give one")
    target = partition(out, day)
    in_process = check_locations(root, out, scheduler)
    check_layout(out, "partitions")
    baseline: CommittedRun | None
    if rebaseline:
        baseline = None
    elif baseline_day is not None:
        baseline = chosen_partition(out, day, baseline_day)
    else:
        baseline = latest_partition(out, day)
    way_out = functools.partial(_way_out_before, out, day,
                                baseline.location if baseline is not None else None)
    if baseline is not None and not allow_other_root:
        check_same_root(root, baseline)
    previous = _checkpoints(baseline, way_out)
    fingerprint = options_fingerprint(options)
    same_options = baseline is not None and baseline.manifest.get("options") == fingerprint
    listing = list_sessions(root)
    to_read, unchanged = [], set()
    changes: Counter[str] = Counter()
    for obj in listing.sessions:
        change = classify(obj.size, obj.etag, previous.get(obj.key.path))
        if change is Change.UNCHANGED and same_options:
            unchanged.add(obj.key.path)
            changes[change.value] += 1
        else:
            to_read.append(obj)
            # "unchanged" counts only what is carried forward (as printed and documented).
            changes["reread_options_changed" if change is Change.UNCHANGED
                    else change.value] += 1
    listed = {obj.key.path for obj in listing.sessions}
    missing = [c for path, c in sorted(previous.items()) if path not in listed]
    changes["missing"] = len(missing)
    run = RunSummary(new_run_id(), root.url, target.url, len(listing.sessions),
                     listing.total_bytes, listing.skipped, archive=root.absolute_url)
    run.manifest_extra = {"options": fingerprint, "date": day.isoformat(),
                          "baseline": baseline.location.url if baseline else None,
                          "rebaseline": rebaseline, "baseline_pinned": baseline_day is not None,
                          "changes": changes}
    summary = NightlySummary(run, day, baseline.location.url if baseline else None, changes,
                             sum(o.size for o in to_read), rebaseline, baseline_day is not None)

    def before_commit(staged: StagedRun) -> None:
        for code in ("history_truncated", "history_rewritten"):
            changes[code] = run.codes[code]
        if baseline is not None:
            _carry(staged, baseline, unchanged, missing, run, way_out)

    execute_run(root, target, Listing(to_read, listing.skipped, listing.skipped_examples),
                run, scheduler=scheduler, workers=workers, progress=progress,
                replay=options, in_process=in_process, previous=previous,
                before_commit=before_commit, max_line_bytes=max_line_bytes)
    try:
        write_small_file(target, target.join(SUMMARY_FILE),
                         json.dumps(summary.as_dict(), indent=1, sort_keys=True).encode())
    except storage_errors() as err:
        raise CommitError(f"{target.url}: run committed, but {SUMMARY_FILE} could not be "
                          f"written: {err}") from err
    return summary


def print_nightly_summary(summary: NightlySummary) -> None:
    """Print what changed since the baseline, then the run's summary."""
    c = summary.changes
    if summary.rebaseline:
        base = "none (--rebaseline: started over, earlier partitions not compared)"
    elif summary.baseline is None:
        base = "none (first run)"
    else:
        base = summary.baseline + (" (--baseline)" if summary.baseline_pinned else "")
    click.echo(f"nightly {summary.day.isoformat()}: baseline {base}")
    reread = (f"{c['reread_options_changed']:,} re-read (options changed), "
              if c["reread_options_changed"] else "")
    click.echo(f"  objects: {c['new']:,} new, {c['changed']:,} changed, "
               f"{c['unchanged']:,} unchanged (carried forward), {reread}"
               f"{c['missing']:,} missing; "
               f"read {summary.bytes_read:,} of {summary.run.bytes:,} bytes")
    breaks = {k: c[k] for k in ("history_truncated", "history_rewritten", "missing") if c[k]}
    if breaks:
        click.echo("  history breaks: " + ", ".join(f"{k} {v}" for k, v in breaks.items()))
    print_summary(summary.run)
    click.echo(f"  summary: {summary.summary_at or f'{summary.run.out}/{SUMMARY_FILE}'}")
