"""The nightly audit into Delta Lake tables (``vakpipe nightly --format delta``).

Instead of one complete partition per night, OUT holds one Delta table per dataset
(``integrity/sessions``, ``integrity/findings``, ``usage``, ``turns``, ``requests``,
``compaction``, ``checkpoints``): the state of the archive as of the newest night, each
row stamped with the ``night`` that read it and partitioned by the day the session was
created (``created``, from its UUIDv7 id or first timestamp), so a night's replaced rows
live in the few recent partitions and older files are never rewritten. A night commits
only the rows of the sessions it read (and of the sessions gone missing), replacing
their earlier rows; every earlier night stays readable by version. Two append-only
tables keep the history: ``history`` (every finding each night found: ``WHERE night =
D``) and ``nights`` (one row per committed night: its run, root, options, summary and
the version of each table as of that night; the night's commit point).

The runner never holds a Python object per session of the archive: the baseline's
checkpoints are streamed as Arrow (three columns) and joined with the listing; only the
checkpoints of the objects read tonight (and of the missing ones) become Python objects,
for the tasks that check them. Decisions: docs/nightly.md, *Delta tables*.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.nightly_audit import NightlySummary, check_layout, options_fingerprint
from pipeline.audit.checkpoint import Checkpoint, missing_finding
from pipeline.errors import BaselineError, UsageError
from pipeline.io.commit import StagedRun, new_run_id, other_archive, read_manifest, remove_tree
from pipeline.io.delta import (
    CREATED,
    HISTORY,
    NIGHT,
    NIGHTS,
    Tables,
    as_reader,
    in_predicate,
    night_summary,
    night_versions,
    nights,
    read_night,
)
from pipeline.io.storage import (
    MAX_LINE_BYTES,
    Listing,
    Location,
    forget_listing,
    storage_error,
    storage_errors,
)
from pipeline.ledger.layout import SessionKey, parse_session_path
from pipeline.run.batches import not_audited
from pipeline.run.orchestrate import RunSummary, check_locations, execute_run, list_sessions
from pipeline.run.replay_batches import ReplayOptions
from pipeline.tables.schemas import CHECKPOINTS_SCHEMA, findings_table, sessions_table

#: The state tables, in the order a night commits them.
STATE = ("integrity/sessions", "integrity/findings", "usage", "subagents", "turns",
         "requests", "compaction", "checkpoints")
#: The columns whose file statistics the tables keep: what a night's predicate and a
#: reader's usual filters prune files by.
STATS = ("session_path", NIGHT, CREATED)
#: Tonight's rows, committed as a plain vakpipe output before they go into the tables.
SCRATCH = "_night"
UNKNOWN_DAY = "unknown"
#: Part index of the missing sessions' rows in the scratch output (after every task's).
_MISSING_PART = 1_000_000
NIGHTS_SCHEMA = pa.schema([
    (NIGHT, pa.string()), ("run_id", pa.string()), ("committed_at", pa.string()),
    ("root", pa.string()), ("options", pa.string()), ("baseline_run_id", pa.string()),
    ("versions", pa.string()), ("summary", pa.string()),
])


def created_day(session_id: str | None, first_ts_ns: int | None) -> str:
    """The day a session was created (UTC, ``YYYY-MM-DD``): from its id when that is a
    UUIDv7 (48 bits of milliseconds), else from its first timestamp, else ``unknown``."""
    hexa = (session_id or "").replace("-", "")
    if len(hexa) == 32 and hexa[12] == "7":
        try:
            ms = int(hexa[:12], 16)
            return datetime.fromtimestamp(ms / 1000, UTC).date().isoformat()
        except (ValueError, OverflowError, OSError):
            pass
    if first_ts_ns is not None:
        return datetime.fromtimestamp(first_ts_ns // 1_000_000_000, UTC).date().isoformat()
    return UNKNOWN_DAY


def release_memory() -> None:
    """Hand the memory this process freed back to the system (glibc's ``malloc_trim``;
    a no-op elsewhere).

    The runner's phases (the listing and its classification, the reading, one commit
    per table) each free what they built, but glibc keeps freed blocks of the heap and
    of every thread's arena mapped: without a trim between phases, peak RSS is the sum
    of the phases, and each grows with the archive (measured: the runner's peak slope
    per session 5 KiB untrimmed, docs/nightly.md *Runner memory*).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # musl has no malloc_trim
        return None


def _checkpoint_columns(tables: Tables, version: int | None) -> pa.Table:
    """The baseline's checkpoints, the columns the classification needs (Arrow)."""
    if version is None:
        return pa.table({"session_path": pa.array([], pa.string()),
                         "ck_etag": pa.array([], pa.string()),
                         "ck_size": pa.array([], pa.int64()),
                         CREATED: pa.array([], pa.string())})
    table = tables.read("checkpoints", ["session_path", "etag", "size", CREATED], version)
    if table is None:
        table = pa.table({
            "session_path": pa.array([], pa.string()), "etag": pa.array([], pa.string()),
            "size": pa.array([], pa.int64()), CREATED: pa.array([], pa.string())})
    return table.rename_columns(["session_path", "ck_etag", "ck_size", CREATED])


def _full_checkpoints(tables: Tables, version: int | None,
                      paths: list[str]) -> dict[str, tuple[Checkpoint, str]]:
    """Whole checkpoints (and their ``created``) of ``paths`` only: the objects read
    tonight and the missing ones, never the archive's."""
    if version is None or not paths:
        return {}
    where = pc.field("session_path").isin(pa.array(paths, pa.string()))
    found: dict[str, tuple[Checkpoint, str]] = {}
    # Every column (the table's own, one Delta log opened): a table written before a
    # column existed (``segments``) reads without it, which from_row allows.
    table = tables.read("checkpoints", None, version, where)
    for row in table.to_pylist() if table is not None else ():
        found[row["session_path"]] = (Checkpoint.from_row(row), row[CREATED])
    return found


def _classify(listing: Listing, baseline: pa.Table, same_options: bool
              ) -> tuple[list[int], pa.Table, Counter[str]]:
    """Which listed objects to read (their indexes), the checkpointed paths no longer
    listed (with ``created``), and the counts of ``changes``: as
    :func:`pipeline.audit.checkpoint.classify`, as Arrow kernels (a hash lookup of each
    listed path among the checkpoints' paths, no Python object per session)."""
    paths = pa.array((o.key.path for o in listing.sessions), pa.string(),
                     size=len(listing.sessions))
    sizes = pa.array((o.size for o in listing.sessions), pa.int64(),
                     size=len(listing.sessions))
    etags = pa.array((o.etag for o in listing.sessions), pa.string(),
                     size=len(listing.sessions))
    known_paths = baseline["session_path"].combine_chunks()
    at = pc.index_in(paths, value_set=known_paths)
    known = pc.is_valid(at)
    ck_etag = pc.take(baseline["ck_etag"], at)
    ck_size = pc.take(baseline["ck_size"], at)
    unchanged = pc.fill_null(pc.and_(pc.and_(known, pc.is_valid(etags)), pc.and_(
        pc.equal(etags, ck_etag), pc.equal(sizes, ck_size))), False)
    changes: Counter[str] = Counter()
    n_known = pc.sum(known).as_py() or 0
    n_same = pc.sum(unchanged).as_py() or 0
    changes["new"] = len(paths) - n_known
    changes["changed"] = n_known - n_same
    if same_options:
        changes["unchanged"] = n_same
        read = pc.indices_nonzero(pc.invert(unchanged))
    else:
        changes["reread_options_changed"] = n_same
        read = pa.array(range(len(paths)), pa.uint64())
    missing = baseline.filter(pc.invert(pc.is_in(known_paths, value_set=paths)))
    changes = Counter({k: v for k, v in changes.items() if v})
    changes["missing"] = missing.num_rows
    return read.to_pylist(), missing, changes


def _stage_missing(staged: StagedRun, missing: list[Checkpoint]) -> None:
    """The rows of sessions checkpointed and no longer listed (as the partitions layout)."""
    if not missing:
        return
    gone = [not_audited(parse_session_path(c.session_path)
                        or SessionKey(c.session_path, "", "", ""), c.size, missing_finding(c))
            for c in missing]
    staged.write_part("integrity/sessions", _MISSING_PART, sessions_table([g.row for g in gone]))
    staged.write_part("integrity/findings", _MISSING_PART, findings_table(
        (g.row["session_path"], f) for g in gone for f in g.findings))
    staged.write_part("checkpoints", _MISSING_PART, pa.Table.from_pylist(
        [c.reread().as_row() for c in missing], schema=CHECKPOINTS_SCHEMA))


def _scratch_batches(scratch: Location, manifest: dict[str, Any],
                     dataset: str) -> Iterator[pa.RecordBatch]:
    fs = scratch.filesystem()
    for name in manifest["datasets"][dataset]["files"]:
        try:
            with fs.open(scratch.join(dataset, name), "rb") as f:
                yield from pq.ParquetFile(f).iter_batches(batch_size=16_384)
        except storage_errors() as err:
            raise storage_error(err, scratch.url) from err


def _stamped(batches: Iterator[pa.RecordBatch], schema: pa.Schema, night: str,
             created: dict[str, str]) -> Iterator[pa.RecordBatch]:
    """Tonight's batches with ``night`` and ``created`` columns."""
    for batch in batches:
        days = [created.get(p, UNKNOWN_DAY) for p in batch.column("session_path").to_pylist()]
        table = pa.Table.from_arrays(
            [*batch.columns, pa.array([night] * batch.num_rows, pa.string()),
             pa.array(days, pa.string())], names=schema.names)
        # Nanoseconds to the microseconds of Delta timestamps (sub-microsecond digits go).
        yield from table.cast(schema, safe=False).to_batches()


def _delta_type(kind: pa.DataType) -> pa.DataType:
    """Delta Lake stores timestamps in microseconds (the tables' are nanoseconds)."""
    if pa.types.is_timestamp(kind) and kind.unit == "ns":
        return pa.timestamp("us", tz=kind.tz)
    return kind


def _created_of_tonight(scratch: Location, manifest: dict[str, Any],
                        sticky: dict[str, str]) -> dict[str, str]:
    """``created`` of every session with rows tonight: the baseline's when it had one (a
    session's rows never move between partitions), else from its id or first timestamp."""
    created = dict(sticky)
    for batch in _scratch_batches(scratch, manifest, "integrity/sessions"):
        first_ts = pc.cast(batch.column("first_ts"), pa.int64()).to_pylist()
        for path, sid, ts in zip(batch.column("session_path").to_pylist(),
                                 batch.column("session_id").to_pylist(), first_ts, strict=True):
            created.setdefault(path, created_day(sid, ts))
    return created


def _counts(tables: Tables, version: dict[str, int], run: RunSummary) -> None:
    """Statuses and findings over every row of the state tables tonight (only the
    columns counted are read)."""
    run.statuses.clear()
    run.codes.clear()
    run.severity_codes.clear()
    statuses = tables.read("integrity/sessions", ["status"], version.get("integrity/sessions"))
    if statuses is not None:
        for item in pc.value_counts(statuses.column(0)).to_pylist():
            run.statuses[str(item["values"])] += int(item["counts"])
    findings = tables.read("integrity/findings", ["severity", "code"],
                           version.get("integrity/findings"))
    if findings is not None:
        for row in findings.group_by(["severity", "code"]).aggregate(
                [("code", "count")]).to_pylist():
            run.codes[row["code"]] += row["code_count"]
            run.severity_codes[(row["severity"], row["code"])] += row["code_count"]


def _remove_scratch(out: Location) -> None:
    """Best effort: tonight's rows are in the tables now."""
    with suppress(*storage_errors()):
        remove_tree(out, out.join(SCRATCH))


def _recover(tables: Tables, last: dict[str, Any] | None, day: date, *,
             check: bool) -> None:
    """Undo what a night that failed inside its publication committed: every table back
    to its version as of the last committed night (a new version; the failed ones stay
    in the log, never read as a night). With ``check`` (a night that starts from
    ``last``), every table ``last`` names must be there at that version or a later one.
    One deleted or put back from an older copy by hand would be started over, or
    continued, with tonight's rows only: the sessions carried forward would be lost
    from it in silence.

    Raises
    ------
    BaselineError
        With ``check``: a table is gone, or older than the night names.
    """
    if last is None:
        return
    versions: dict[str, int] = json.loads(last["versions"])
    for name, version in sorted(versions.items()):
        current = tables.version(name)
        # Only a later version is a failed night's: an earlier one, or none, is a table
        # set back or deleted by hand.
        if current is not None and current > version:
            tables.restore(name, version)
        elif check and (current is None or current < version):
            state = "is gone" if current is None else f"is at version {current}"
            raise BaselineError(
                f"baseline {tables.uri(name)}: the Delta table {state}, but the "
                f"{last[NIGHT]} night names its version {version}; refusing to run, which "
                "would lose the rows of every session carried forward: restore it, or run "
                "again with --rebaseline (every session read again, every table "
                f"rewritten; recorded as a rebaseline in the {day.isoformat()} night)")


def run_nightly_tables(
    root: Location,
    out: Location,
    options: ReplayOptions,
    *,
    day: date | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    rebaseline: bool = False,
    allow_other_root: bool = False,
    keep_days: int | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> NightlySummary:
    """Audit and replay what changed under ``root`` since the last night; commit only the
    rows of the sessions read (and missing) into the Delta tables under ``out``.

    Parameters
    ----------
    rebaseline:
        Start from nothing: every session read as new, every table rewritten.
    allow_other_root:
        Accept a root other than the one the last night audited.
    keep_days:
        After the commit, expire versions older than this many days (never the newest).

    Raises
    ------
    UsageError
        A date before the newest night's; another root than the last night's (without
        ``allow_other_root``); an output delta-rs cannot write (``memory://``).
    BaselineError
        The state tables are there but the ``nights`` table that names their versions
        is gone (without ``rebaseline``).
    """
    day = day or datetime.now(UTC).date()
    # The runner's Arrow work is small and streamed; mimalloc (pyarrow's default pool)
    # keeps segments per thread that grew its peak RSS with the archive (measured:
    # +9 MB for the classification of 4,000 sessions, +2 MB with the system allocator).
    pa.set_memory_pool(pa.system_memory_pool())
    in_process = check_locations(root, out, scheduler)
    check_layout(out, "delta")
    tables = Tables(out)
    committed = nights(tables)
    if not committed and tables.version("checkpoints") is not None and \
            tables.version(NIGHTS) is None and not rebaseline:
        raise BaselineError(
            f"baseline {out.url}: its tables are there but the {NIGHTS} table naming "
            "their versions is gone; refusing to run as a first night, which would hide "
            "any history break since: run again with --rebaseline to start over from "
            f"nothing (recorded as a rebaseline in the {day.isoformat()} night)")
    last = committed[-1] if committed else None
    if last is not None and last[NIGHT] > day.isoformat():
        raise UsageError(f"--date {day.isoformat()} is before the last night committed "
                         f"under {out.url} ({last[NIGHT]}); the Delta tables hold one "
                         "history: read an earlier night by its version instead")
    if last is not None and not allow_other_root:
        before = other_archive(night_summary(last), root)
        if before is not None:
            raise UsageError(f"{root.url} is not the archive the last night audited "
                             f"({before}, {last[NIGHT]}): every session would be "
                             "reported missing; --allow-other-root to accept it")
    _recover(tables, last, day, check=not rebaseline)
    base = None if rebaseline or last is None else last
    base_versions: dict[str, int] = json.loads(base["versions"]) if base else {}
    fingerprint = options_fingerprint(options)
    same_options = base is not None and base["options"] == fingerprint
    listing = list_sessions(root)
    checkpoints = _checkpoint_columns(tables, base_versions.get("checkpoints"))
    read_at, missing_t, changes = _classify(listing, checkpoints, same_options)
    to_read = [listing.sessions[i] for i in read_at]
    # The whole listing is done with: keep its counts, not one object per session
    # through the reading and the tables' commits (~1.5 KiB per session).
    listed = Listing([], listing.skipped, listing.skipped_examples)
    n_listed, listed_bytes = len(listing.sessions), listing.total_bytes
    del listing, read_at
    # s3fs keeps what ``find`` listed (an info dict per object) in its cache for the
    # life of the process: ~1.4 KiB per session held through the whole night. The tasks
    # that read tonight's objects need none of it (one GET of the listed version).
    forget_listing(root)
    # Python objects only for what is read tonight and what went missing.
    full = _full_checkpoints(tables, base_versions.get("checkpoints"),
                             [o.key.path for o in to_read]
                             + missing_t["session_path"].to_pylist())
    del checkpoints
    release_memory()
    previous = {o.key.path: full[o.key.path][0] if o.key.path in full else None
                for o in to_read}
    missing = [full[p][0] for p in missing_t["session_path"].to_pylist()]
    sticky = {p: c for p, (_, c) in full.items()}
    run_id = new_run_id()
    scratch = out.child(SCRATCH)
    run = RunSummary(run_id, root.url, out.url, n_listed, listed_bytes, listed.skipped,
                     archive=root.absolute_url)
    run.manifest_extra = {"options": fingerprint, "date": day.isoformat()}
    summary = NightlySummary(run, day, f"{out.url} night {base[NIGHT]} (run {base['run_id']})"
                             if base else None, changes,
                             sum(o.size for o in to_read), rebaseline, False)

    def before_commit(staged: StagedRun) -> None:
        for code in ("history_truncated", "history_rewritten"):
            changes[code] = run.codes[code]
        _stage_missing(staged, missing)

    execute_run(root, scratch, Listing(to_read, listed.skipped, listed.skipped_examples),
                run, scheduler=scheduler, workers=workers, progress=progress,
                replay=options, in_process=in_process,
                previous=previous if base is not None else {}, before_commit=before_commit,
                max_line_bytes=max_line_bytes)
    del to_read, previous
    release_memory()
    manifest = read_manifest(scratch)
    assert manifest is not None
    created = _created_of_tonight(scratch, manifest, sticky)
    replaced = sorted(created)
    night = day.isoformat()
    meta = {"vakpipe_run_id": run_id, "night": night}
    whole = base is None or not same_options
    predicate = None
    if not whole and replaced:
        predicate = (in_predicate(CREATED, sorted(set(created.values()))) + " AND "
                     + in_predicate("session_path", replaced))
    if tables.version(NIGHTS) is None:
        # Made before any state table: state tables without it were tampered with, not
        # left by a first night that failed (see the check at the start).
        tables.write(NIGHTS, NIGHTS_SCHEMA.empty_table(), mode="append", metadata=meta)
    versions: dict[str, int] = {}
    for name in STATE:
        release_memory()  # what the previous table's commit freed, before the next one
        exists = tables.version(name)
        if name not in manifest["datasets"]:
            if exists is not None and whole:
                # Not written tonight (--compaction dropped): its old rows are stale.
                handle = tables.open(name)
                assert handle is not None
                handle.delete()
            if exists is not None:
                versions[name] = tables.version(name) or 0
            continue
        if not whole and predicate is None and exists is not None:
            versions[name] = exists  # nothing read tonight: the table stays as it was
            continue
        schema = staged_schema(scratch, manifest, name)
        stream = _stamped(_scratch_batches(scratch, manifest, name), schema, night, created)
        if whole or exists is None:
            versions[name] = _write_whole(tables, name, schema, stream, meta)
            continue
        versions[name] = tables.write(name, as_reader(schema, stream), mode="overwrite",
                                      partition_by=[CREATED], metadata=meta,
                                      predicate=predicate)
    release_memory()
    findings_schema = staged_schema(scratch, manifest, "integrity/findings")
    history_schema = findings_schema.append(pa.field("run_id", pa.string()))

    def found_tonight() -> Iterator[pa.RecordBatch]:
        for batch in _stamped(_scratch_batches(scratch, manifest, "integrity/findings"),
                              findings_schema, night, created):
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array([run_id] * batch.num_rows, pa.string())],
                schema=history_schema)

    versions[HISTORY] = tables.write(HISTORY, as_reader(history_schema, found_tonight()),
                                     mode="append", partition_by=[NIGHT], metadata=meta,
                                     stats_columns=(*STATS, "code"))
    release_memory()
    _counts(tables, versions, run)
    summary_dict = summary.as_dict()
    tables.write(NIGHTS, pa.Table.from_pylist([{
        NIGHT: night, "run_id": run_id, "committed_at": datetime.now(UTC).isoformat(),
        "root": root.url, "options": fingerprint,
        "baseline_run_id": base["run_id"] if base else None,
        "versions": json.dumps(versions, sort_keys=True),
        "summary": json.dumps(summary_dict, sort_keys=True, default=str)}],
        schema=NIGHTS_SCHEMA), mode="append", metadata=meta)
    _remove_scratch(out)
    if keep_days is not None:
        tables.expire([*STATE, HISTORY, NIGHTS], keep_days * 24)
    summary.summary_at = f"{tables.uri(NIGHTS)} (night = '{night}', run_id = '{run_id}')"
    return summary


#: Uncompressed bytes of one commit of a table written whole: delta-rs holds every
#: partition's rows of a commit in memory until it ends.
WHOLE_COMMIT_BYTES = 64 << 20


def _write_whole(tables: Tables, name: str, schema: pa.Schema,
                 stream: Iterator[pa.RecordBatch], meta: dict[str, str]) -> int:
    """Replace the whole table by ``stream`` in commits of at most
    :data:`WHOLE_COMMIT_BYTES` (the first overwrites, the next append), so the runner
    never holds a whole table. Only a night that reads everything writes whole (a first
    night, options changed, --rebaseline): until its ``nights`` row is committed, the
    next run starts again from the last committed night (:func:`_recover`)."""
    pending = next(stream, None)
    first, version = True, 0
    while first or pending is not None:
        def chunk() -> Iterator[pa.RecordBatch]:
            nonlocal pending
            size = 0
            while pending is not None and size < WHOLE_COMMIT_BYTES:
                batch, pending = pending, None
                size += batch.nbytes
                yield batch
                pending = next(stream, None)

        version = tables.write(name, as_reader(schema, chunk()),
                               mode="overwrite" if first else "append",
                               partition_by=[CREATED], metadata=meta,
                               schema_mode="overwrite" if first else None,
                               stats_columns=STATS)
        first = False
    return version


def staged_schema(scratch: Location, manifest: dict[str, Any], dataset: str) -> pa.Schema:
    """The schema of a dataset of tonight's rows, with ``night`` and ``created``."""
    first = manifest["datasets"][dataset]["files"][0]
    fs = scratch.filesystem()
    with fs.open(scratch.join(dataset, first), "rb") as f:
        schema = pq.read_schema(f)
    schema = pa.schema([f.with_type(_delta_type(f.type)) for f in schema])
    return schema.append(pa.field(NIGHT, pa.string())).append(pa.field(CREATED, pa.string()))


def expire_nights(out: Location, keep_days: int) -> dict[str, int]:
    """Expire versions older than ``keep_days`` days of every table under ``out``."""
    return Tables(out).expire([*STATE, HISTORY, NIGHTS], keep_days * 24)


__all__ = ["HISTORY", "NIGHTS", "STATE", "created_day", "expire_nights", "night_versions",
           "read_night", "run_nightly_tables"]
