"""Delta Lake tables under an output (``deltalake``, delta-rs): the nightly's store.

A table is a folder with a ``_delta_log``; every write is one atomic commit (on S3 a
conditional put of the next log entry, so two writers never both win one version), and
every committed version stays readable by version or timestamp until it is expired
(:func:`expire`). DuckDB, Polars, Spark and pyarrow (through
``DeltaTable(...).to_pyarrow_dataset()``) read them.

Only this module imports ``deltalake``; the storage errors it raises become
:class:`~pipeline.errors.StorageError` / :class:`~pipeline.errors.CommitError` here.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Iterable
from datetime import date
from typing import Any, Literal

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

#: delta-rs allocates through its own jemalloc (symbols prefixed ``_rjem_``), which by
#: default keeps freed pages resident for 10 s: in a nightly, whose phases (classification,
#: then one commit per table) each free what they built within seconds, the runner's peak
#: RSS was then the sum of its commits instead of the largest (measured with
#: bench/nightly_incremental.py: -15 to -35 MiB of peak at 1,000 and 4,000 sessions,
#: docs/nightly.md *Runner memory*). Read once, when the library first allocates: set
#: before it is imported; a value given in the environment wins.
JEMALLOC_CONF = "_RJEM_MALLOC_CONF"
os.environ.setdefault(JEMALLOC_CONF, "dirty_decay_ms:0,muzzy_decay_ms:0")

from deltalake import CommitProperties, DeltaTable, write_deltalake  # noqa: E402
from deltalake.exceptions import DeltaError, TableNotFoundError  # noqa: E402

from pipeline.errors import (  # noqa: E402
    CommitError,
    CorruptTableError,
    ExpiredVersionError,
    StorageError,
    UsageError,
)
from pipeline.io.storage import Location, printable  # noqa: E402

#: Where a Delta table keeps its log: a folder holding one is a table.
DELTA_LOG = "_delta_log"
#: The nightly's table of committed nights (one row each), and its columns' names.
NIGHTS = "nights"
#: The findings of every night, appended to (never rewritten, as ``nights``).
HISTORY = "history"
NIGHT = "night"
CREATED = "created"
#: ``OUT/night=YYYY-MM-DD``: how readers (``vakpipe cost``, ``regress --baseline-run``)
#: name a past night of a Delta nightly output.
NIGHT_SUFFIX = re.compile(r"(.*)/night=(\d{4}-\d\d-\d\d)/?\Z")


def delta_storage_options(loc: Location) -> dict[str, str]:
    """delta-rs's storage options for ``loc``: the fsspec options vakpipe resolved
    (``--storage-option``), under the names delta-rs reads (the standard AWS
    environment it reads itself)."""
    if loc.protocol != "s3":
        return {}
    opts = loc.storage_options
    client = opts.get("client_kwargs") or {}
    found = {
        "AWS_ACCESS_KEY_ID": opts.get("key"),
        "AWS_SECRET_ACCESS_KEY": opts.get("secret"),
        "AWS_SESSION_TOKEN": opts.get("token"),
        "AWS_ENDPOINT_URL": opts.get("endpoint_url") or client.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
        "AWS_REGION": client.get("region_name") or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION"),
        "AWS_PROFILE": opts.get("profile"),
    }
    out = {k: str(v) for k, v in found.items() if v}
    if out.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        out["AWS_ALLOW_HTTP"] = "true"  # a local endpoint (moto, MinIO): not TLS
    out.setdefault("AWS_REGION", "us-east-1")
    return out


def table_uri(loc: Location, name: str) -> str:
    """The URI delta-rs opens for table ``name`` below ``loc``."""
    if loc.protocol == "file":
        return loc.join(name)
    if loc.protocol == "s3":
        return "s3://" + loc.join(name).lstrip("/")
    raise UsageError(f"{loc.url}: Delta tables need a local folder or s3:// "
                     f"({loc.protocol}:// is not supported by delta-rs)")


#: What delta-rs adds to an error's text: colour codes, and a Rust backtrace after the
#: message, from its first frame (``   0: <unknown>``) on.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BACKTRACE = re.compile(r"\n\s*0: .*", re.DOTALL)
#: Arrow's words before why a file is not Parquet: the path, said already.
_SOURCE = re.compile(r"Could not open Parquet input source '[^']*': ")


def _repair(name: str) -> str:
    """What a damaged table's message tells its reader to do: a state table is
    rewritten whole by a night with ``--rebaseline``; ``nights`` and ``history`` are
    only ever appended to."""
    if name in (NIGHTS, HISTORY):
        return ("restore it (the bucket's versioning, a backup), or start the nightly over "
                "into a new --out")
    return ("restore it (the bucket's versioning, a backup), or run the nightly with "
            "--rebaseline (every session read again, every table rewritten)")


#: The file names found under each table (by its URI), listed once a process: files
#: are only added by a commit (and removed by an expiry, which only a version no newer
#: one needs loses), so a name missing is listed again before it is called gone.
_LISTED: dict[str, frozenset[str]] = {}


def _damaged_files(data: pads.Dataset, columns: list[str] | None
                   ) -> list[tuple[str, BaseException]]:
    """Each data file of ``data`` that does not read, with its error: read one at a
    time, in this thread."""
    found: list[tuple[str, BaseException]] = []
    for part in data.get_fragments():
        try:
            part.to_table(columns=columns, schema=data.schema, use_threads=False)
        except (OSError, pa.ArrowException) as err:
            found.append((printable(part.path, 200), err))
    return found


def _files_said(damaged: list[tuple[str, BaseException]], shown: int = 3) -> str:
    """The files that do not read, in words: the first ``shown`` with why."""
    said = [f"{path} is gone" if isinstance(err, FileNotFoundError)
            else f"{path} does not read ({_SOURCE.sub('', error_text(err))})"
            for path, err in damaged]
    more = f", and {len(said) - shown:,} more" if len(said) > shown else ""
    head = "its data file " if len(said) == 1 else f"{len(said):,} of its data files: "
    return head + ", ".join(said[:shown]) + more


def error_text(err: BaseException) -> str:
    """A delta-rs error as one printable line: its message's lines joined, without
    the colour codes, the ``↳`` of its causes and the Rust backtrace it may carry."""
    message = _BACKTRACE.sub("", _ANSI.sub("", str(err)))
    text = " ".join(filter(None, (line.strip().lstrip("\u21b3").strip()
                                  for line in message.splitlines())))
    return printable(f"{type(err).__name__}: {text}" if text else type(err).__name__, 300)


def _storage(err: BaseException, where: str) -> StorageError:
    return StorageError(f"{where}: {error_text(err)}")


class Tables:
    """The Delta tables below one output location."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc
        self.options = delta_storage_options(loc)
        table_uri(loc, "probe")  # refuse a protocol delta-rs cannot write, before any work

    def uri(self, name: str) -> str:
        """The table's URI."""
        return table_uri(self.loc, name)

    def open(self, name: str, version: int | None = None) -> DeltaTable | None:
        """The table (at ``version``, default the newest), or ``None`` when there is none.

        Raises
        ------
        StorageError
            The storage failed, or the version is expired.
        CorruptTableError
            The table's log does not read as Delta's.
        """
        try:
            return DeltaTable(self.uri(name), version=version, storage_options=self.options)
        except TableNotFoundError:
            return None
        except OSError as err:  # delta-rs's storage failures
            raise _storage(err, self.uri(name)) from err
        except DeltaError as err:  # a log that does not parse, a protocol it cannot read
            raise CorruptTableError(f"{self.uri(name)}: the Delta table cannot be read "
                                    f"({error_text(err)})") from err

    def version(self, name: str) -> int | None:
        """The newest version of the table, or ``None``."""
        table = self.open(name)
        return None if table is None else table.version()

    def dataset(self, name: str, version: int | None = None) -> pads.Dataset | None:
        """The table at ``version`` as a pyarrow dataset (streamed, never read whole)."""
        table = self.open(name, version)
        if table is None:
            return None
        # A local table is read through Arrow's own file system. delta-rs's is Python
        # (a PyFileSystem): its buffers are Python objects, which a thread of Arrow's may
        # free after the scan returned, taking the GIL; in a process that is exiting
        # then, that thread ends mid-C++ and the process aborts ("terminate called
        # without an active exception", exit 134: 2 of 30 refused `vakpipe cost` runs
        # under load with pyarrow 18 and deltalake 1.5; docs/nightly.md, *Damaged
        # tables*).
        local = (pafs.SubTreeFileSystem(self.loc.join(name), pafs.LocalFileSystem())
                 if self.loc.protocol == "file" else None)
        try:
            return table.to_pyarrow_dataset(filesystem=local)
        except DeltaError as err:  # a reader feature pyarrow's datasets lack
            raise CorruptTableError(f"{self.uri(name)}: the Delta table cannot be read "
                                    f"({error_text(err)})") from err

    def read(self, name: str, columns: list[str] | None = None, version: int | None = None,
             where: pads.Expression | None = None) -> pa.Table | None:
        """``columns`` (default all) of the table at ``version``, the rows ``where``
        holds; ``None`` when there is no table.

        Its data files are found in a listing of the table's folder first: Arrow's
        read of a file that is gone, through delta-rs's file system, can leave the
        process to abort as it exits ("terminate called without an active exception",
        exit 134: every time on Arrow's threads, about one exit in 30 in this thread).
        Read by Arrow's scan in this thread (``use_threads=False``; as fast here:
        docs/nightly.md, *Damaged tables*). A file that does not read is named by
        reading every file again, one at a time.

        Raises
        ------
        CorruptTableError
            A data file the newest version names is gone, or one of any version is not
            Parquet.
        ExpiredVersionError
            A data file of an older version is gone (expired by ``--keep-days``).
        StorageError
            The storage failed.
        """
        data = self.dataset(name, version)
        if data is None:
            return None
        damaged: list[tuple[str, BaseException]] = [
            (printable(path, 200), FileNotFoundError(path)) for path in self._gone(name, data)]
        failed: BaseException | None = None
        if not damaged:
            try:
                return data.to_table(columns=columns, filter=where, use_threads=False)
            except (FileNotFoundError, pa.ArrowException) as err:
                failed = err
            except OSError as err:
                raise _storage(err, self.uri(name)) from err
            damaged = _damaged_files(data, columns) or [("a data file", failed)]
        if version is not None and version != self.version(name) and all(
                isinstance(e, FileNotFoundError) for _, e in damaged):
            # Vacuumed (--keep-days) once a newer version no longer needed it.
            raise ExpiredVersionError(
                f"{self.uri(name)}: version {version} no longer reads: "
                f"{_files_said(damaged)}, expired by --keep-days or lost") from failed
        raise CorruptTableError(f"{self.uri(name)}: the Delta table is damaged: "
                                f"{_files_said(damaged)}; {_repair(name)}") from failed

    def _gone(self, name: str, data: pads.FileSystemDataset) -> list[str]:
        """The data files of ``data`` its table's folder does not hold, by a listing
        kept for the process (:data:`_LISTED`) and made again before any is called
        gone."""
        uri = self.uri(name)
        wanted = {posixpath.basename(path): path for path in data.files}
        kept = uri in _LISTED
        if not kept:
            _LISTED[uri] = self._listing(name)
        missing = [path for base, path in wanted.items() if base not in _LISTED[uri]]
        if missing and kept:  # the kept listing may predate a commit: list again
            _LISTED[uri] = self._listing(name)
            missing = [path for base, path in wanted.items() if base not in _LISTED[uri]]
        return missing

    def _listing(self, name: str) -> frozenset[str]:
        """The names of the files under table ``name``'s folder, listed now."""
        fs: Any = self.loc.filesystem()
        folder = self.loc.join(name)
        try:
            fs.invalidate_cache(folder)
            return frozenset(posixpath.basename(p) for p in fs.find(folder))
        except OSError as err:
            raise _storage(err, self.uri(name)) from err

    def write(self, name: str, data: pa.Table | pa.RecordBatchReader, *,
              mode: Literal["append", "overwrite"], predicate: str | None = None,
              partition_by: list[str] | None = None, metadata: dict[str, str] | None = None,
              schema_mode: Literal["merge", "overwrite"] | None = None,
              stats_columns: tuple[str, ...] = ()) -> int:
        """One commit of ``data`` into the table: ``append``, or ``overwrite`` (with
        ``predicate``: only the rows it matches are replaced). Returns the new version.
        ``stats_columns``: a new table keeps file statistics of these columns only (the
        log holds the statistics of every file, and every reader loads the log: of all
        ~40 columns they made it 4 times larger).

        Raises
        ------
        CommitError
            The commit did not happen (the table stays at its previous version).
        """
        try:
            commit = CommitProperties(custom_metadata=metadata)
            config = ({"delta.dataSkippingStatsColumns": ",".join(stats_columns)}
                      if stats_columns and self.version(name) is None else None)
            if mode == "append":
                write_deltalake(self.uri(name), data, mode="append", partition_by=partition_by,
                                storage_options=self.options, schema_mode=schema_mode,
                                commit_properties=commit, configuration=config)
            else:
                write_deltalake(self.uri(name), data, mode="overwrite", predicate=predicate,
                                partition_by=partition_by, storage_options=self.options,
                                schema_mode=schema_mode, commit_properties=commit,
                                configuration=config)
        except (DeltaError, OSError, pa.ArrowException) as err:
            raise CommitError(f"{self.uri(name)}: commit failed: {error_text(err)}") from err
        version = self.version(name)
        assert version is not None
        return version

    def restore(self, name: str, version: int) -> None:
        """Make ``version`` the newest again (a new commit; later versions stay in the log)."""
        table = self.open(name)
        if table is None or table.version() == version:
            return
        try:
            table.restore(version)
        except (DeltaError, OSError) as err:
            raise CommitError(f"{self.uri(name)}: restore to version {version} failed: "
                              f"{error_text(err)}") from err

    def expire(self, names: Iterable[str], keep_hours: int) -> dict[str, int]:
        """Delete the files no version younger than ``keep_hours`` needs, and the log
        entries before them; the newest version is never touched. Returns the files
        deleted per table."""
        removed: dict[str, int] = {}
        for name in names:
            table = self.open(name)
            if table is None:
                continue
            try:
                gone = table.vacuum(retention_hours=keep_hours, dry_run=False,
                                    enforce_retention_duration=False)
                table.create_checkpoint()
                table.cleanup_metadata()
            except (DeltaError, OSError) as err:
                raise _storage(err, self.uri(name)) from err
            removed[name] = len(gone)
        return removed


def sql_string(value: str) -> str:
    """``value`` as a SQL string literal of a delta-rs predicate."""
    return "'" + value.replace("'", "''") + "'"


def in_predicate(column: str, values: Iterable[str]) -> str:
    """``column IN ('a', 'b')`` (never empty: call it with values)."""
    return f"{column} IN ({', '.join(sql_string(v) for v in values)})"


def as_reader(schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> pa.RecordBatchReader:
    """A stream of ``batches`` for one commit (never gathered into one table)."""
    return pa.RecordBatchReader.from_batches(schema, iter(batches))


def table_exists(loc: Location, name: str) -> bool:
    """Whether ``loc/name`` is a Delta table (its log folder is there)."""
    fs: Any = loc.filesystem()
    path = loc.join(name, DELTA_LOG)
    fs.invalidate_cache(path)
    try:
        return bool(fs.exists(path))
    except OSError as err:
        raise _storage(err, loc.url) from err


def nights(tables: Tables) -> list[dict[str, Any]]:
    """The committed nights, oldest first (one small row each)."""
    data = tables.read(NIGHTS)
    if data is None:
        return []
    rows = data.to_pylist()
    return sorted(rows, key=lambda r: (r["committed_at"], r["run_id"]))


def night_versions(out: Location, night: date | None = None) -> dict[str, int]:
    """The version of each table as of ``night`` (its last run that day; default the
    newest night): what ``DeltaTable(uri, version=...)`` opens to read that night.

    Raises
    ------
    UsageError
        No night committed on ``night``.
    """
    rows = nights(Tables(out))
    if night is not None:
        rows = [r for r in rows if r[NIGHT] == night.isoformat()]
    if not rows:
        raise UsageError(f"{out.url}: no night committed"
                         + (f" on {night.isoformat()}" if night else ""))
    versions: dict[str, int] = json.loads(rows[-1]["versions"])
    return versions


def read_night(out: Location, dataset: str, night: date | None = None) -> pa.Table:
    """One state table as of ``night`` (default the newest), without the ``night`` and
    ``created`` columns: the table an audit of the archive that night would give."""
    version = night_versions(out, night).get(dataset)
    if version is None:
        raise FileNotFoundError(f"{out.url}: no committed dataset {dataset!r}")
    return read_version(out, dataset, version)


def read_version(out: Location, dataset: str, version: int,
                 columns: list[str] | None = None) -> pa.Table:
    """State table ``dataset`` at ``version`` (:func:`read_night`), only ``columns`` when
    given."""
    table = Tables(out).read(dataset, columns, version)
    if table is None:
        raise FileNotFoundError(f"{out.url}: no committed dataset {dataset!r}")
    table = table.drop_columns([c for c in (NIGHT, CREATED) if c in table.column_names])
    # Back to the nanoseconds every other vakpipe output has.
    return table.cast(pa.schema([
        f.with_type(pa.timestamp("ns", tz=f.type.tz)) if pa.types.is_timestamp(f.type) else f
        for f in table.schema]))


def nightly_output(out: Location) -> tuple[Location, date | None] | None:
    """Whether ``out`` names a Delta nightly output (its ``nights`` table is there) or one
    past night of it (``OUT/night=YYYY-MM-DD``): the output and the night (``None``: the
    newest); else ``None``. Only local and S3 outputs can be one."""
    if out.protocol not in ("file", "s3"):
        return None
    found = NIGHT_SUFFIX.match(out.path)
    base = out.parent if found is not None else out
    if not table_exists(base, NIGHTS):
        return None
    if found is None:
        return base, None
    try:
        return base, date.fromisoformat(found.group(2))
    except ValueError as err:
        raise UsageError(f"{out.url}: night={found.group(2)} is not a date ({err})") from err


def nights_span(days: list[str]) -> str:
    """The nights of an output, said in a line: the first and the last, and how many."""
    return days[0] if len(days) == 1 else f"{days[0]} ... {days[-1]} ({len(days)})"


def night_summary(row: dict[str, Any]) -> dict[str, Any]:
    """A ``nights`` row's summary (its run's, as a run's manifest holds it: ``archive``
    included), with the row's ``root``."""
    summary = json.loads(row["summary"])
    return {**(summary if isinstance(summary, dict) else {}), "root": row["root"]}


def nightly_manifest(out: Location) -> tuple[Location, dict[str, Any]] | None:
    """A Delta nightly output's night (see :func:`nightly_output`), for the readers of a
    run (:func:`pipeline.io.commit.open_run`): the output, and a manifest-shaped view of
    the night (run id, summary fields, and each dataset's version that night, which
    :meth:`~pipeline.io.commit.CommittedRun.read` reads); ``None`` when ``out`` is
    none.

    Raises
    ------
    UsageError
        ``out`` names a night (``OUT/night=D``) the output did not commit, or no date.
    """
    found = nightly_output(out)
    if found is None:
        return None
    base, night = found
    committed = nights(Tables(base))
    rows = committed if night is None else [r for r in committed
                                             if r[NIGHT] == night.isoformat()]
    if not rows:
        if night is None or not committed:
            return None
        raise UsageError(f"{base.url} has no night committed on {night.isoformat()}; its "
                         f"nights: {nights_span(sorted({r[NIGHT] for r in committed}))}")
    last = rows[-1]
    versions = json.loads(last["versions"])
    return base, {
        **night_summary(last), "run_id": last["run_id"], "night": last[NIGHT],
        "datasets": {name: {"files": [], "version": v} for name, v in versions.items()}}
