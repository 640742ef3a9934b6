"""Staged writes and atomic commits of a run's Parquet datasets.

A run writes every part under ``OUT/_staging/<run_id>/`` first. Only when all parts
are there does :meth:`StagedRun.commit` move them into the dataset folders (under names
that carry the run id), write ``OUT/_manifest.json`` naming exactly the committed files,
delete the files of the previous run, and write ``OUT/_SUCCESS`` last.

A run that fails before the commit leaves the previous output untouched (its files and
its manifest). A crash inside the commit leaves the previous manifest in force; readers
that go through the manifest (:func:`read_dataset`) always see one complete run, and
the next run removes the stray files. A client killed before its commit leaves its
staging folder; the next commit removes the staging folders of older runs.

Nothing a commit writes, moves or deletes can lie outside ``OUT``: every path is built
from ``OUT`` and checked (:meth:`~pipeline.io.storage.Location.check_inside`) first.
Names read from a previous manifest must be plain relative names (:func:`parse_manifest`;
one that is not makes the manifest corrupt: exit 2, nothing deleted), and on a local
disk no symbolic link may lie on the way to a path written or deleted (refused, exit 2):
a link could lead the commit into the archive. A stray link a clean-up removes is
unlinked itself, never followed. ``--force`` (:func:`recovering_manifests`) sets a
corrupt manifest aside as ``_manifest.json.corrupt-<run_id>`` instead of stopping, and
deletes nothing it names.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import (
    CommitError,
    ConcurrentRunError,
    CorruptManifestError,
    CorruptTableError,
    PipelineError,
    RunReplacedError,
    UnsafeOutputError,
    UsageError,
)
from pipeline.io.archive import ARCHIVE
from pipeline.io.storage import (
    Location,
    check_output,
    locate,
    map_io,
    printable,
    storage_error,
    storage_errors,
    unsafe_segment,
)
from pipeline.tables.schemas import OUTPUT_DATASETS

MANIFEST = "_manifest.json"
#: A night's folder in a nightly output of the partitions layout (``nightly --format
#: partitions``, the default).
NIGHT_PARTITION = re.compile(r"date=(\d{4}-\d\d-\d\d)\Z")
SUCCESS = "_SUCCESS"
STAGING = "_staging"
#: Datasets of files at nested paths (the compacted ledgers, in the archive's layout);
#: every other dataset's files are Parquet parts directly in its folder.
FILE_DATASETS = frozenset({ARCHIVE})
#: A dataset name: one or two segments (``usage``, ``integrity/sessions``) of letters,
#: digits, ``_`` and ``-``, never starting with ``_`` (``_staging``) or a dot.
_DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(?:/[A-Za-z0-9][A-Za-z0-9_-]*)?")
#: The names a commit gives its Parquet parts: the only entries of a dataset folder a
#: clean-up ever removes without a manifest naming them.
_PART_NAME = re.compile(r"part-[A-Za-z0-9_.-]+\.parquet")
#: What fsspec's list calls read as a glob pattern (``glob.has_magic``).
_GLOB = re.compile(r"[*?\[]")
#: The codec of every Parquet part a run writes.
PART_COMPRESSION = "zstd"
#: Whether a part's columns are dictionary-encoded (pyarrow's default is yes). No: most
#: of a part's strings are ids and paths, which overflow the dictionary page and fall
#: back to plain after paying for it, and zstd folds the few repeated names (kind,
#: model, provider) as well as a dictionary does. Measured on every table of the 536 MB
#: benchmark fleet's audit and of a 200-session replay (best of 7): encoding 24% / 30%
#: less CPU, reading back 11% / 18% less, the parts 16% / 12% smaller (docs/scaling.md).
PART_DICTIONARY = False
#: Set by ``--force`` (:func:`recovering_manifests`).
_RECOVER: ContextVar[bool] = ContextVar("vakpipe_recover_manifests", default=False)


@contextmanager
def recovering_manifests(enabled: bool = True) -> Iterator[None]:
    """Within the block, a corrupt manifest does not stop a run (``--force``).

    A commit sets the corrupt ``_manifest.json`` of its output aside as
    ``_manifest.json.corrupt-<run_id>`` and deletes nothing it names (the part files
    of the run's own datasets are cleaned as ever); :func:`read_manifest` reads a
    corrupt manifest as no manifest. A context variable, so every command that commits
    gets the option without each job passing it down.
    """
    token = _RECOVER.set(enabled)
    try:
        yield
    finally:
        _RECOVER.reset(token)


def _refused_commit(err: CorruptManifestError) -> CorruptManifestError:
    """``err`` (:func:`parse_manifest`'s) as a command that commits into the output says
    it: with ``--force``, the way past it."""
    return CorruptManifestError(
        f"{err}; nothing was changed: rerun with --force to set it aside as "
        f"{MANIFEST}.corrupt-<run_id> (nothing it names is deleted)")


def unreadable_run(err: CorruptManifestError) -> CorruptManifestError:
    """``err`` as a reader of a run says it: readers have no ``--force``; the command
    that wrote the output has."""
    return CorruptManifestError(
        f"{err}; the run cannot be read: write it again (the command that wrote it, whose "
        "--force sets this manifest aside; nothing it names is deleted)")


def valid_dataset_name(name: object) -> bool:
    """Whether ``name`` is a dataset name vakpipe writes (see :data:`_DATASET_NAME`)."""
    return isinstance(name, str) and _DATASET_NAME.fullmatch(name) is not None


def valid_file_name(dataset: str, name: object) -> bool:
    """Whether ``name`` can be a file of ``dataset`` in a manifest: a plain name (a
    relative path of plain names in a file dataset, :data:`FILE_DATASETS`), no segment
    empty, ``.`` or ``..``, no backslash, NUL or other control character."""
    if not isinstance(name, str):
        return False
    parts = name.split("/")
    if dataset not in FILE_DATASETS and len(parts) != 1:
        return False
    return not any(unsafe_segment(p) for p in parts)


def parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """Read and check the bytes of a manifest: a JSON object whose ``datasets`` maps
    dataset names to ``{"files": [names...], "rows": n}``, every name plain
    (:func:`valid_dataset_name`, :func:`valid_file_name`).

    Raises
    ------
    CorruptManifestError
        Anything else: a one-line message naming ``where`` and what is wrong.
    """
    def corrupt(why: str) -> CorruptManifestError:
        return CorruptManifestError(f"{where} is corrupt ({why})")

    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise corrupt(f"not JSON: {printable(str(err), 80)}") from err
    if not isinstance(manifest, dict):
        raise corrupt("not a JSON object")
    datasets = manifest.get("datasets")
    if not isinstance(datasets, dict):
        raise corrupt("no datasets object")
    if not isinstance(manifest.get("run_id", ""), str):
        raise corrupt("run_id is not a string")
    for name, entry in datasets.items():
        if not valid_dataset_name(name):
            raise corrupt(f"dataset name {printable(str(name), 80)!r} is not one vakpipe "
                          "writes")
        files = entry.get("files") if isinstance(entry, dict) else None
        if not isinstance(files, list):
            raise corrupt(f"dataset {name!r} has no list of files")
        for file in files:
            if not valid_file_name(name, file):
                raise corrupt(f"dataset {name!r} names {printable(str(file), 80)!r}, not a "
                              "plain file name below it")
        rows = entry.get("rows", 0)
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise corrupt(f"dataset {name!r} has no row count")
    return manifest


def new_run_id() -> str:
    """A sortable, unique run id: UTC time to the microsecond plus a random suffix.

    Ids sort by start time, and a commit removes the staging folders of runs whose ids
    sort before its own. To the second only, a run started in the same second as a run
    killed before its commit sorted after or before it by the suffix alone, and left
    the killed run's folder behind half the time.
    """
    now = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{now}-{uuid.uuid4().hex[:8]}"


def write_small_file(out: Location, path: str, data: bytes) -> str:
    """Write one small file (a manifest, ``_SUCCESS``, a summary, a report's files, a
    ground truth) at ``path`` below ``out``: the one way vakpipe writes such files.

    ``path`` must be a plain path below ``out`` with no symbolic link on its way, itself
    included (:meth:`~pipeline.io.storage.Location.check_inside`). On a local disk the
    bytes go to a new temporary name beside it (created exclusively, never through a
    link: ``O_EXCL | O_NOFOLLOW``), then renamed onto ``path``: a reader sees the old
    file or the new one, never half of one, and a file hard-linked there is replaced,
    never written through; a device, FIFO or socket there is refused, never replaced.
    On an object store a single object write is atomic already.
    Returns ``path``.

    Raises
    ------
    UnsafeOutputError
        ``path`` is not a plain path below ``out``, or a link lies on its way.
    StorageError
        The storage failed (a temporary file left behind is removed, best effort).
    """
    out.check_inside(path)
    parent = posixpath.dirname(path)
    try:
        if out.protocol != "file":
            out.filesystem().pipe_file(path, data)
            return path
        if parent != out.path.rstrip("/"):
            out.check_inside(parent)
        os.makedirs(parent, exist_ok=True)
        out.check_inside(path)  # again: the folders now exist, none may be a link
        _refuse_special_file(path)
        tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # replaces a name, never follows what it held
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp)
            raise
    except storage_errors() as err:
        if isinstance(err, PipelineError):
            raise
        raise storage_error(err, out.url) from err
    return path


def _refuse_special_file(path: str) -> None:
    """Refuse to replace a device, a FIFO or a socket: the rename would put a regular
    file in its place (as root, ``--file /dev/full`` replaced the device node; ``/dev/null``
    would have gone the same way). A folder is left to the rename, which refuses it."""
    try:
        kind = _special_kind(os.lstat(path).st_mode)
    except FileNotFoundError:
        return
    if kind is not None:
        raise UnsafeOutputError(f"{printable(path)} is {kind}, not a file vakpipe may "
                                "replace; refused, nothing written there")


def _special_kind(mode: int) -> str | None:
    """What a file of ``mode`` is when it is neither a regular file nor a folder."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return ("a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "not a regular file")


def special_file(out: Location, path: str) -> str | None:
    """What the file a reader would read at ``path`` below a local ``out`` is, through
    any link, when it is a device, a FIFO or a socket (its read could block for ever,
    or never end: ``/dev/zero`` as a manifest was read until the kernel killed the
    process); ``None`` for a regular file, a folder, an absent path or an object store."""
    if out.protocol != "file":
        return None
    try:
        return _special_kind(os.stat(path).st_mode)
    except OSError:
        return None  # absent, or a dangling link: the read says so


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: The temporary names :func:`write_small_file` writes to.
_TMP_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")
#: Names that make a folder a vakpipe output (a run's, or a report's).
_OUTPUT_MARKS = frozenset({MANIFEST, SUCCESS, STAGING})


def check_report_folder(dest: Location, allowed: Iterable[str]) -> None:
    """Refuse a folder ``dest`` for a report when it holds anything but ``allowed`` (a
    report's files); absent or empty is fine.

    Stricter than :func:`check_vakpipe_output`: a run's output, or a nightly output's
    folder of nights, is a vakpipe output but no report's folder (a report's
    ``_manifest.json`` would replace the run's, or make the nights read as a run).

    Raises
    ------
    UnsafeOutputError
        ``dest`` holds other entries.
    StorageError
        The folder cannot be listed.
    """
    try:
        names = _entries(dest)
    except storage_errors() as err:
        raise storage_error(err, dest.url) from err
    other = sorted(set(names) - set(allowed))
    if other:
        shown = ", ".join(printable(n, 40) for n in other[:3])
        raise UnsafeOutputError(
            f"{printable(dest.url)} is not a report's folder: it holds other files ({shown}"
            f"{', ...' if len(other) > 3 else ''}): a report there would mix with them, or "
            "replace a run's _manifest.json; choose an empty folder or a report's own")


def _entries(out: Location) -> dict[str, dict[str, Any]]:
    """The entries of folder ``out`` by name (none when it is not there), without
    ``out`` itself (some stores list it) and the temporary files
    :func:`write_small_file` leaves when killed mid-write (ours)."""
    fs = out.filesystem()
    fs.invalidate_cache(out.path)
    try:
        entries = fs.ls(out.path, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    names = {posixpath.basename(str(e["name"]).rstrip("/")): e for e in entries}
    names.pop(posixpath.basename(out.path.rstrip("/")), None)
    return {n: e for n, e in names.items() if not _TMP_NAME.fullmatch(n)}


def check_vakpipe_output(out: Location) -> None:
    """Refuse an ``OUT`` that holds files but is not a vakpipe output, unless ``--force``.

    A vakpipe output is absent, empty, or holds ``_manifest.json``, ``_SUCCESS`` or
    ``_staging`` itself or in one of its folders (a regression check's
    ``baseline``/``candidate``). Anything else would have a run mixed into somebody
    else's files (and its clean-ups sharing their folders). A nightly output (``date=``
    nights) is refused too: a run at its root would be what its readers read instead of
    the nights.

    Raises
    ------
    UnsafeOutputError
        ``out`` holds other files (one line; ``--force`` accepts it).
    StorageError
        The output cannot be listed.
    """
    if _RECOVER.get():
        return
    fs = out.filesystem()
    try:
        names = _entries(out)
        nights = sorted(n for n in names if NIGHT_PARTITION.match(n))
        what = f"{nights[-1]}, ..." if nights else None
        # delta.NIGHTS spelt out: importing it costs every run deltalake's import.
        if what is None and "nights" in names:
            from pipeline.io.delta import NIGHTS, table_exists  # see open_run

            what = "its Delta tables" if table_exists(out, NIGHTS) else None
        if what is not None:
            raise UnsafeOutputError(
                f"{printable(out.url)} is a nightly output ({what}): a run committed "
                "there would sit beside its nights and hide them from their readers (a run "
                "at OUT is read first); choose another --out")
        if not names or _OUTPUT_MARKS & set(names):
            return
        for name, entry in names.items():
            if entry.get("type") != "directory" or unsafe_segment(name):
                continue
            below = {posixpath.basename(str(p).rstrip("/"))
                     for p in fs.ls(out.join(name), detail=False)}
            if _OUTPUT_MARKS & below:
                return
    except storage_errors() as err:
        raise storage_error(err, out.url) from err
    shown = ", ".join(printable(n, 40) for n in sorted(names)[:3])
    raise UnsafeOutputError(
        f"{printable(out.url)} is not empty and is not a vakpipe output (no {MANIFEST}, "
        f"{SUCCESS} or {STAGING}; it holds {shown}{', ...' if len(names) > 3 else ''}): "
        "refused, a run would be mixed into those files; choose an empty --out, or "
        "--force")


@dataclass(frozen=True)
class EncodedPart:
    """One Parquet part's bytes, encoded where its table was made (a worker), and its
    row count: a task ships its datasets as these, a quarter to an eighth of their
    tables' size, and the runner writes the bytes as they are (:func:`encode_part`)."""

    data: bytes
    rows: int


def encode_part(table: pa.Table, schema: pa.Schema) -> EncodedPart:
    """``table`` as the Parquet part :meth:`StagedRun.write_part` writes for a dataset
    of ``schema``: cast to it, compressed with :data:`PART_COMPRESSION`, without
    dictionaries (:data:`PART_DICTIONARY`)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table.cast(schema), sink, compression=PART_COMPRESSION,
                   use_dictionary=PART_DICTIONARY)
    return EncodedPart(sink.getvalue().to_pybytes(), table.num_rows)


@dataclass
class StagedRun:
    """The staging area of one run under an output location."""

    out: Location
    run_id: str
    schemas: dict[str, pa.Schema]
    _parts: dict[str, dict[int, tuple[str, int]]] = field(default_factory=dict)
    #: File datasets (compacted ledgers): paths relative to the dataset folder, written
    #: by the workers under :meth:`stage_dir`.
    _files: dict[str, set[str]] = field(default_factory=dict)
    #: The run in force under ``OUT`` when :meth:`preflight` read it (``(None,)``: none);
    #: ``None`` until then.
    _base: tuple[Any] | None = None

    @property
    def stage_path(self) -> str:
        """Filesystem path of this run's staging folder."""
        return self.out.join(STAGING, self.run_id)

    def stage_dir(self, dataset: str) -> str:
        """Where the workers write the files of a file dataset before the commit."""
        return posixpath.join(self.stage_path, dataset)

    def add_files(self, dataset: str, relpaths: list[str]) -> None:
        """Record files written under :meth:`stage_dir` for the commit to publish."""
        self._files.setdefault(dataset, set()).update(relpaths)

    def write_part(self, dataset: str, index: int, part: pa.Table | EncodedPart) -> None:
        """Stage part ``index`` of ``dataset`` (rewriting it if it was staged before):
        a table, encoded here, or a part a worker encoded (:func:`encode_part`)."""
        if dataset not in self.schemas:
            raise KeyError(f"unknown dataset {dataset!r}")
        if isinstance(part, pa.Table):
            part = encode_part(part, self.schemas[dataset])
        fs = self.out.filesystem()
        path = posixpath.join(self.stage_path, dataset, f"part-{index:05d}.parquet")
        self.out.check_inside(path)
        try:
            self.out.makedirs(posixpath.dirname(path))
            with fs.open(path, "wb") as f:
                f.write(part.data)
        except storage_errors() as err:
            raise storage_error(err, self.out.url) from err
        self._parts.setdefault(dataset, {})[index] = (path, part.rows)

    def preflight(self, root: Location | None = None, files: Iterable[str] = ()) -> None:
        """Check, before any task runs, that this run can commit without harm.

        The previous manifest reads (or ``--force`` is on, and the commit will set it
        aside), and every path the commit will write, move or delete lies below ``OUT``
        through no symbolic link: the staging folder, the folders of this run's
        datasets and of the file datasets ``files`` it will write, the manifest, and
        what the previous manifest names. With ``root`` (the archive), each of them is
        also compared with the archive, links resolved. Last, ``OUT`` is empty or a
        vakpipe output (:func:`check_vakpipe_output`; ``--force`` accepts another).

        Raises
        ------
        CorruptManifestError, UnsafeOutputError, OutputInsideArchiveError
            As the commit would; nothing was written.
        """
        self.out.check_inside(self.out.join(MANIFEST))
        try:
            previous = self._previous()
            self._base = (_run_id(previous),)
            paths = self._paths(previous, set(files))
            if root is not None:
                check_output(root, self.out, [path for path, _ in paths])
        except storage_errors() as err:
            raise storage_error(err, self.out.url) from err
        # After the links and the archive: those refusals say more than "not ours".
        check_vakpipe_output(self.out)

    def _paths(self, previous: dict[str, Any] | None,
               files: set[str]) -> list[tuple[str, bool]]:
        """Every path the commit touches but the part files it moves, each checked (see
        :meth:`Location.check_inside`); with whether a link there is refused (else a
        path removed, which is unlinked when it is a link)."""
        out = self.out
        paths = [(out.join(STAGING), True), (self.stage_path, True),
                 (out.join(MANIFEST), True), (out.join(SUCCESS), True)]
        paths += [(out.join(d), True) for d in sorted({*self.schemas, *self._files, *files})]
        for dataset, entry in sorted(((previous or {}).get("datasets") or {}).items()):
            paths.append((out.join(dataset), True))
            paths += [(out.join(dataset, rel), False) for rel in entry["files"]]
        for path, refuse_link in paths:
            out.check_inside(path, leaf=refuse_link)
        return paths

    def _previous(self) -> dict[str, Any] | None:
        """The manifest in force under ``OUT``; a corrupt one stops the commit (nothing
        touched) or, with ``--force``, reads as none."""
        try:
            return _load_manifest(self.out)
        except CorruptManifestError as err:
            if not _RECOVER.get():
                raise _refused_commit(err) from err
            return None

    def _previous_or_aside(self) -> None:
        """Load the previous manifest before anything moves; a corrupt one stops the
        commit (nothing touched) or, with ``--force``, is set aside."""
        manifest = self.out.join(MANIFEST)
        self.out.check_inside(manifest)
        try:
            _load_manifest(self.out)
        except CorruptManifestError as err:
            if not _RECOVER.get():
                raise _refused_commit(err) from err
            self._move(manifest, self.out.join(f"{MANIFEST}.corrupt-{self.run_id}"))

    def _move(self, source: str, target: str) -> None:
        """Move a staged file into place, never through (or onto) a link."""
        self.out.check_inside(source)
        self.out.check_inside(target)
        self.out.makedirs(posixpath.dirname(target))
        fs = self.out.filesystem()
        if self.out.protocol == "file":
            fs.mv(source, target)  # a rename
            return
        # The one-file calls: fsspec's mv and rm read ``*``, ``?`` and ``[`` in a path
        # as a glob pattern (an output named ``out[1]`` failed to commit on S3).
        fs.cp_file(source, target)
        fs.rm_file(source)

    def _move_all(self, moves: list[tuple[str, str]]) -> None:
        """:meth:`_move` each ``(source, target)``. On S3, where a move is a server-side
        copy and a delete, in one fsspec call instead: its copies run concurrently and
        its deletes go 1,000 keys a request (docs/scaling.md, "Output commit")."""
        if len(moves) < 2 or not self._in_bulk([path for move in moves for path in move]):
            for source, target in moves:
                self._move(source, target)
            return
        for source, target in moves:
            self.out.check_inside(source)
            self.out.check_inside(target)
        self.out.filesystem().mv([source for source, _ in moves],
                                 [target for _, target in moves])

    def _remove_all(self, paths: list[str]) -> None:
        """:meth:`_remove` each of ``paths`` (files); on S3 in bulk requests."""
        if len(paths) < 2 or not self._in_bulk(paths):
            for path in paths:
                self._remove(path)
            return
        for path in paths:
            self.out.check_inside(path, leaf=False)
        self.out.filesystem().rm(paths)

    def _in_bulk(self, paths: list[str]) -> bool:
        """Whether ``paths`` may go to the storage in one call: on S3 (whose list calls
        are tested here, against moto), and none that fsspec would read as a glob pattern
        (``*``, ``?``, ``[``: a list call expands those, which could match keys that are
        not ours)."""
        return self.out.protocol == "s3" and not any(_GLOB.search(path) for path in paths)

    def _write(self, path: str, data: bytes) -> None:
        """Write a small file in place: locally under a temporary name, then moved onto
        its own (a file hard-linked there is replaced, never written through)."""
        write_small_file(self.out, path, data)

    def _remove(self, path: str) -> None:
        """Remove the file ``path`` below ``OUT``, never what a link leads to: on a local
        disk a link is unlinked itself, a folder left alone (:func:`remove_tree` removes
        folders)."""
        self.out.check_inside(path, leaf=False)
        if self.out.protocol == "file":
            if os.path.islink(path):
                os.unlink(path)
            elif os.path.lexists(path) and not os.path.isdir(path):
                os.remove(path)
            return
        fs = self.out.filesystem()
        if fs.exists(path):
            fs.rm_file(path)  # literal (see _move)

    def commit(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Publish the staged parts atomically; return the manifest written.

        Every dataset gets at least one (possibly empty) file, so it always reads with
        its schema. Before anything moves, the previous manifest is read and checked,
        and every path to write or delete is checked (:meth:`preflight`).

        Raises
        ------
        CorruptManifestError
            The previous manifest is corrupt (without ``--force``); nothing moved.
        UnsafeOutputError
            A path to write or delete is not a plain path below ``OUT``, or a symbolic
            link lies on its way; nothing moved.
        CommitError
            The storage failed; the previous manifest stays in force.
        """
        fs = self.out.filesystem()
        for dataset, schema in self.schemas.items():
            if not self._parts.get(dataset):
                self.write_part(dataset, 0, schema.empty_table())
        files: dict[str, list[str]] = {}
        rows: dict[str, int] = {}
        try:
            self._previous_or_aside()
            current = self._previous()
            self._check_alone(current)
            self._paths(current, set())
            moves: list[tuple[str, str]] = []
            for dataset, parts in self._parts.items():
                final_dir = self.out.join(dataset)
                self.out.makedirs(final_dir)
                names = []
                for index in sorted(parts):
                    staged, n = parts[index]
                    name = f"part-{self.run_id}-{index:05d}.parquet"
                    moves.append((staged, posixpath.join(final_dir, name)))
                    names.append(name)
                    rows[dataset] = rows.get(dataset, 0) + n
                files[dataset] = names
            self._move_all(moves)
            # Read again right before ours replaces it (another run may have committed
            # meanwhile); checked as the first read was.
            previous = read_manifest(self.out)
            self._paths(previous, set())
            for dataset, rels in self._files.items():
                self._move_all([(posixpath.join(self.stage_dir(dataset), rel),
                                 self.out.join(dataset, rel)) for rel in sorted(rels)])
                files[dataset] = sorted(rels)
                rows[dataset] = len(rels)
            manifest = {
                "run_id": self.run_id,
                "committed_at": datetime.now(UTC).isoformat(),
                "datasets": {d: {"files": files[d], "rows": rows.get(d, 0)} for d in files},
                **summary,
            }
            # A single object write is atomic on object stores; locally, write then rename.
            self._write(self.out.join(MANIFEST),
                        json.dumps(manifest, indent=1, sort_keys=True).encode())
            for dataset, before in ((previous or {}).get("datasets") or {}).items():
                if dataset in files and dataset not in self._files:
                    continue  # a Parquet dataset of this run: its folder is listed below
                # The previous manifest says what the last run published: of a file
                # dataset (nested paths) the files this run did not write again, and all
                # of a dataset this run does not write (its replay tables, its compacted
                # archive): OUT holds one run, the one in force.
                keep = set(files.get(dataset, ()))
                self._remove_all([self.out.join(dataset, rel)
                                  for rel in sorted(set(before["files"]) - keep)])
                if dataset not in files:
                    self._remove_dataset_folder(dataset)
            for dataset, names in files.items():
                if dataset in self._files:
                    continue
                keep = set(names)
                # A fresh listing: strays of a run killed in another process are not in
                # a listing this process cached before. Only parts are removed (a file
                # of another name is not vakpipe's to delete).
                fs.invalidate_cache(self.out.join(dataset))
                listed = (posixpath.basename(path.rstrip("/"))
                          for path in fs.ls(self.out.join(dataset), detail=False))
                self._remove_all([self.out.join(dataset, name) for name in listed
                                  if name not in keep and _PART_NAME.fullmatch(name)])
            self._write(self.out.join(SUCCESS), self.run_id.encode())
            self._remove_stale_staging()
            self.abort()
        except ConcurrentRunError:
            raise
        except storage_errors() as err:
            raise CommitError(f"{self.out.url}: commit of run {self.run_id} failed: {err}") from err
        return manifest

    def _check_alone(self, current: dict[str, Any] | None) -> None:
        """Refuse to replace a run that committed under ``OUT`` after :meth:`preflight`
        read the output: another run went on beside this one."""
        if self._base is None or _run_id(current) == self._base[0]:
            return
        raise ConcurrentRunError(
            f"{self.out.url}: run {_run_id(current)} committed here while run "
            f"{self.run_id} went on (one run at a time per output); this run was not "
            "committed, the output holds the other")

    def _remove_dataset_folder(self, dataset: str) -> None:
        """Remove the folder of a dataset the previous run wrote and this one does not
        (``turns``/``requests`` after a ``--replay`` run), once its named files are gone:
        only when all it still holds is part files of this project's naming (strays of
        killed runs) or, for a file dataset, empty folders; never anything else. Then
        its parent folder (``integrity`` of ``integrity/x``) if that is left empty.
        Best effort: a folder left costs nothing but a listing."""
        fs = self.out.filesystem()
        folder = self.out.join(dataset)
        try:
            self.out.check_inside(folder)
            fs.invalidate_cache(folder)
            if self.out.protocol == "file":
                if not os.path.isdir(folder) or os.path.islink(folder):
                    return
                if dataset in FILE_DATASETS:
                    for here, dirs, names in os.walk(folder, topdown=False):
                        if names or any(os.path.islink(os.path.join(here, d)) for d in dirs):
                            return
                        os.rmdir(here)
                    return
            names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(folder, detail=False)]
            if not all(_PART_NAME.fullmatch(n) for n in names):
                return  # a file of another name is not vakpipe's to delete
            for name in names:
                self._remove(self.out.join(dataset, name))
            if self.out.protocol == "file":
                os.rmdir(folder)
                parent = posixpath.dirname(folder)
                if parent != self.out.path.rstrip("/") and not os.listdir(parent):
                    os.rmdir(parent)
        except _best_effort_errors():
            pass

    def _remove_stale_staging(self) -> None:
        """Remove the staging folders of runs older than this one (a client killed before
        its commit leaves its folder behind; nothing else ever removes it).

        Run ids sort by start time; a younger folder may belong to a run still going and
        is left alone (one run at a time per output is the rule, see docs/audit.md).
        Best effort: a leftover costs space, never correctness. Never through a link:
        ``_staging`` a link, nothing is removed; a link inside it is unlinked.
        """
        fs = self.out.filesystem()
        staging = self.out.join(STAGING)
        try:
            self.out.check_inside(staging)
            fs.invalidate_cache(staging)
            if not fs.exists(staging):
                return
            for path in fs.ls(staging, detail=False):
                name = posixpath.basename(path.rstrip("/"))
                if name < self.run_id and not unsafe_segment(name):
                    remove_tree(self.out, self.out.join(STAGING, name))
        except _best_effort_errors():
            pass

    def abort(self) -> None:
        """Remove this run's staging folder (the previous output is untouched); nothing
        when a link lies on the way."""
        fs = self.out.filesystem()
        staging = self.out.join(STAGING)
        try:
            self.out.check_inside(self.stage_path)
            remove_tree(self.out, self.stage_path)
            if fs.exists(staging) and not fs.ls(staging, detail=False):
                fs.rmdir(staging)
        except _best_effort_errors():  # best effort: a later run ignores stale staging
            pass


def remove_tree(out: Location, path: str) -> None:
    """Remove ``path`` below ``out`` and everything below it: the one way vakpipe removes
    a folder of its own (a run's staging folder, the nightly's scratch output).

    Never through a link: on a local disk a link at ``path`` is unlinked itself, and a
    folder is removed by :func:`shutil.rmtree`, which unlinks the links inside it. On an
    object store the path is read literally: fsspec's recursive ``rm`` reads ``*``,
    ``?`` and ``[`` as a glob pattern, so below an output named ``out[1]`` it would
    reach ``out1``'s folder of the same name. Such a path's files are listed (a prefix
    listing, literal) and deleted one by one. A path with nothing at it is no error.

    Raises
    ------
    UnsafeOutputError
        ``path`` is not below ``out``, or a link lies on its way.
    """
    out.check_inside(path, leaf=False)
    if out.protocol == "file":
        if os.path.islink(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
        return
    fs = out.filesystem()
    if not _GLOB.search(path):
        if fs.exists(path):
            fs.rm(path, recursive=True)
        return
    for found in fs.find(path):
        out.check_inside(found, leaf=False)
        fs.rm_file(found)
    fs.invalidate_cache(path)


def _best_effort_errors() -> tuple[type[BaseException], ...]:
    """What a best-effort clean-up gives up on: the storage failing, a link on the way."""
    return (*storage_errors(), UnsafeOutputError)


def _read_part(fs: Any, path: str, columns: list[str] | None = None) -> pa.Table:
    """One Parquet part, opened as a file: on S3 one HEAD and a GET for a small part,
    where pyarrow opening the path through fsspec itself sends five HEADs and two GETs."""
    with fs.open(path, "rb") as f:
        return pq.read_table(f, columns=columns)


def _load_manifest(out: Location) -> dict[str, Any] | None:
    """The checked manifest under ``out`` (:func:`parse_manifest`), or ``None``."""
    path = out.join(MANIFEST)
    kind = special_file(out, path)
    if kind is not None:
        raise CorruptManifestError(f"{printable(path)} is {kind}, not a manifest; not read")
    try:
        raw = out.filesystem().cat_file(path)
    except FileNotFoundError:
        return None
    except IsADirectoryError as err:
        raise CorruptManifestError(f"{path} is a folder, not a manifest") from err
    return parse_manifest(raw, path)


def read_manifest(out: Location) -> dict[str, Any] | None:
    """The manifest of the last committed run under ``out``, or ``None``.

    Checked (:func:`parse_manifest`): every dataset and file name it holds is a plain
    name below ``out``. Within :func:`recovering_manifests` (``--force``), a corrupt one
    reads as none.

    Raises
    ------
    CorruptManifestError
        The manifest is not one vakpipe writes.
    """
    try:
        return _load_manifest(out)
    except CorruptManifestError:
        if _RECOVER.get():
            return None
        raise


def read_dataset(out: Location, dataset: str) -> pa.Table:
    """Read one dataset of the last committed run, exactly the files its manifest names.

    Raises
    ------
    FileNotFoundError
        No committed run, or it has no such dataset.
    CorruptManifestError
        The manifest is not one vakpipe writes.
    RunReplacedError
        A newer run committed while the files were read.
    """
    manifest = read_manifest(out)
    if manifest is None:
        raise FileNotFoundError(f"{out.url}: no committed dataset {dataset!r}")
    return CommittedRun(out, manifest).read(dataset)


@dataclass(frozen=True, slots=True)
class CommittedRun:
    """One committed run, read as of one manifest: every table :meth:`read` returns is of
    the commit that manifest describes, never of a newer one that lands meanwhile (a
    nightly committing while ``vakpipe cost`` reads its output).

    ``location`` holds the manifest: ``OUT``, a nightly output's newest ``date=`` night,
    or a Delta nightly output (``manifest`` then a view of one night, its tables pinned
    to their versions of that night: :func:`pipeline.io.delta.nightly_manifest`).
    """

    location: Location
    manifest: dict[str, Any]

    @property
    def datasets(self) -> dict[str, Any]:
        """The manifest's datasets, by name."""
        found = self.manifest.get("datasets")
        return found if isinstance(found, dict) else {}

    def read(self, dataset: str, columns: list[str] | None = None) -> pa.Table:
        """The run's ``dataset`` (only ``columns``, when given): exactly the files (or the
        Delta version) its manifest names.

        Raises
        ------
        FileNotFoundError
            The run has no such dataset.
        RunReplacedError
            A file the manifest names is gone: a newer commit replaced the run while it
            was read (its clean-up deletes the older run's files).
        CorruptTableError
            A file the manifest names is not the Parquet it should be, or is gone while
            the run is still the one in force (deleted by hand); a Delta table or a file
            of its version is gone, or does not read.
        """
        entry = self.datasets.get(dataset)
        if entry is None:
            raise FileNotFoundError(f"{self.location.url}: no committed dataset {dataset!r}")
        if "version" in entry:
            from pipeline.io.delta import read_version  # see open_run

            try:
                return read_version(self.location, dataset, int(entry["version"]), columns)
            except FileNotFoundError as err:  # never deleted by a newer commit
                raise CorruptTableError(
                    f"{self.location.url}: its {dataset} Delta table is gone, though its "
                    "nights table names it") from err
        paths = [self.location.join(dataset, name) for name in entry["files"]]
        for path in paths:
            kind = special_file(self.location, path)
            if kind is not None:
                raise CorruptTableError(
                    f"{self.location.url}: its {dataset} table is damaged ({printable(path)} "
                    f"is {kind}, not a part; not read); write the run again (the command "
                    "that wrote it)")
        try:
            fs = self.location.filesystem()
            # A listing this process cached before the run committed would not know its
            # files.
            fs.invalidate_cache(self.location.join(dataset))
            table = pa.concat_tables(map_io(
                self.location, partial(_read_part, fs, columns=columns), paths))
            self._check_columns(dataset, table, columns)
            return table
        except FileNotFoundError as err:
            if _run_id(read_manifest(self.location)) == _run_id(self.manifest):
                raise CorruptTableError(
                    f"{self.location.url}: its {dataset} table is damaged (a file its "
                    f"manifest names is gone: {printable(str(err), 200)}); write the run "
                    "again (the command that wrote it)") from err
            raise RunReplacedError(
                f"{self.location.url}: run {self.manifest.get('run_id')} was replaced by a "
                f"newer commit while it was read ({dataset}); read it again") from err
        except pa.ArrowException as err:  # not a storage failure (OSError): the bytes
            text = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise CorruptTableError(
                f"{self.location.url}: its {dataset} table is damaged ({printable(text, 200)});"
                " write the run again (the command that wrote it)") from err

    def _check_columns(self, dataset: str, table: pa.Table, columns: list[str] | None) -> None:
        """Refuse a table whose parts lack a column of its dataset's schema, or hold one
        of another type: read on, a report would fail at the first use of that column
        with a traceback (one dataset's part copied over another's, a part of another
        tool)."""
        expected = OUTPUT_DATASETS.get(dataset)
        if expected is None:
            return
        for name in columns or expected.names:
            if expected.get_field_index(name) < 0:
                continue
            want = expected.field(name).type
            got = table.schema.field(name).type if name in table.column_names else None
            if got != want:
                why = (f"no column {name!r}" if got is None
                       else f"its column {name!r} is {got}, not {want}")
                raise CorruptTableError(
                    f"{self.location.url}: its {dataset} table is damaged ({why}); write "
                    "the run again (the command that wrote it)")

    def read_optional(self, dataset: str) -> pa.Table | None:
        """:meth:`read`, or ``None`` when the run did not write ``dataset``."""
        return self.read(dataset) if dataset in self.datasets else None

    @property
    def archive(self) -> Location | None:
        """The archive the run read: its manifest's ``archive`` (the root as a URL that
        names it from any folder), or for a run older than that field its ``root`` as
        given (a relative local root then read against the folder this command runs in);
        ``None`` when neither names a storage this process has a filesystem for. Located
        only (:func:`~pipeline.io.storage.locate`): nothing connects."""
        root = self.manifest.get("archive") or self.manifest.get("root")
        if not isinstance(root, str) or not root.strip():
            return None
        return locate(root)

    def check_clear_of(self, dest: Location, *, folder: bool) -> None:
        """Refuse ``dest`` (a report's ``folder``, or one file) when writing there would
        replace or mix with this run's own files: the run's folder itself (for a
        report: its manifest would replace the run's), or anything under a name the run
        keeps there: its tables' folders, and every ``_``-name (``_manifest.json``,
        ``_SUCCESS``, ``_staging``, a nightly's scratch, a Delta log); a Delta nightly
        output's ``nights`` table too.

        Raises
        ------
        UnsafeOutputError
            ``dest`` would land on the run's own files.
        """
        rel = _below(self.location, dest)
        if rel is None:
            return
        if folder and not rel:
            raise UnsafeOutputError(
                f"{printable(dest.url)} holds the run it reports on ({self.location.url}): "
                "a report there would replace the run's _manifest.json; choose another "
                "folder (the default is OUT/cost)")
        first = rel.split("/", 1)[0]
        tables = {name.split("/", 1)[0] for name in self.datasets}
        if any("version" in entry for entry in self.datasets.values()):
            from pipeline.io.delta import NIGHTS  # see open_run

            tables.add(NIGHTS)
        if first.startswith("_") or first in tables:
            raise UnsafeOutputError(
                f"{printable(dest.url)} lies among the files of the run it reports on "
                f"({self.location.url}: {first}); writing there could replace them: "
                "choose another path")

    def check_apart(self, dest: Location) -> None:
        """Refuse ``dest``, where a reader of this run writes (a cost report, a dashboard,
        an export), when it overlaps :attr:`archive`. The reader itself never reads the
        archive; what it writes must not land there all the same.

        Raises
        ------
        OutputInsideArchiveError
            ``dest`` lies inside the archive, or the archive inside ``dest``.
        """
        archive = self.archive
        if archive is not None:
            check_output(archive, dest)


def check_reader_output(run: CommittedRun, out: Location, dest: Location, *,
                        folder: bool) -> None:
    """Refuse ``dest``, where a reader of ``run`` (found under ``out``: the run's own
    output, or a nightly output) writes a report's ``folder`` or one file, when it
    would land in the archive the run read (:meth:`CommittedRun.check_apart`), on the
    run's own files (:meth:`CommittedRun.check_clear_of`), or, under a nightly output of
    ``date=`` nights, in any night or as the nightly output's own report folder; a file
    named ``_manifest.json`` or ``_SUCCESS`` anywhere.

    Raises
    ------
    OutputInsideArchiveError
        ``dest`` overlaps the archive.
    UnsafeOutputError
        ``dest`` would land on a run's files.
    """
    run.check_apart(dest)
    run.check_clear_of(dest, folder=folder)
    if not folder and posixpath.basename(dest.path) in (MANIFEST, SUCCESS):
        # Any output's: a page named so would replace the run (or report) it marks.
        raise UnsafeOutputError(
            f"{printable(dest.url)}: {posixpath.basename(dest.path)} is the name a vakpipe "
            "output keeps for itself; writing there could replace another run's; choose "
            "another name")
    rel = None if run.location.path == out.path else _below(out, dest)
    if rel is None:
        return
    # A nightly output: its nights are runs of their own, and OUT itself a folder of
    # nights, which a report's _manifest.json would make read as a run.
    if (folder and not rel) or NIGHT_PARTITION.match(rel.split("/", 1)[0]):
        raise UnsafeOutputError(
            f"{printable(dest.url)} lies among the nights of the nightly output "
            f"{out.url}; writing there could replace a night's files: choose another path")


def other_archive(summary: dict[str, Any], root: Location) -> str | None:
    """The archive a run's summary (its manifest, a Delta night's summary) names, when it
    is not ``root``; ``None`` when it is ``root`` or names none.

    Compared as locations: the summary's ``archive`` (a URL that names it from any
    folder) against ``root`` resolved, so the same archive named from another folder, or
    by its absolute path, is the same. A run older than that field names its ``root`` as
    it was given: compared as text, as before.
    """
    recorded = summary.get("archive")
    if isinstance(recorded, str) and recorded:
        where = locate(recorded)
        same = where is not None and (where.protocol, where.path) == (root.protocol,
                                                                     root.path)
        return None if same else recorded
    before = summary.get("root")
    return before if isinstance(before, str) and before != root.url else None


def _below(parent: Location, dest: Location) -> str | None:
    """``dest``'s path relative to ``parent`` (``""``: ``parent`` itself), or ``None``
    when it is not at or below it (:meth:`Location.contains`)."""
    if not parent.contains(dest):
        return None
    return dest.path.rstrip("/")[len(parent.path.rstrip("/")) + 1:]


def _run_id(manifest: dict[str, Any] | None) -> Any:
    return None if manifest is None else manifest.get("run_id")


def open_run(out: Location) -> CommittedRun | None:
    """The run a reader of ``out`` reads, its manifest read once: ``out``'s own; for a
    nightly output, its newest committed night (a ``date=`` partition); for a Delta
    nightly output (``OUT``, or a past night ``OUT/night=YYYY-MM-DD``), that night.
    ``None`` when ``out`` holds none. For readers of a run only: a commit never takes it
    for a previous run.

    Raises
    ------
    CorruptManifestError
        A manifest is not one vakpipe writes (:func:`unreadable_run`).
    """
    try:
        manifest = read_manifest(out)
        if manifest is not None:
            return CommittedRun(out, manifest)
        for _, name in reversed(_partition_names(out)):
            loc = out.child(name)
            manifest = read_manifest(loc)
            if manifest is not None:
                return CommittedRun(loc, manifest)
    except CorruptManifestError as err:
        raise unreadable_run(err) from err
    check_named_night(out)
    # Imported only for a Delta output: deltalake takes ~0.2 s to import, a tenth of
    # what ``vakpipe cost`` of a run's output costs.
    from pipeline.io.delta import nightly_manifest

    night = nightly_manifest(out)
    return None if night is None else CommittedRun(*night)


def check_named_night(out: Location) -> None:
    """Refuse ``OUT/date=D`` that holds no committed run when ``OUT`` is a nightly
    output: a night it did not commit (or a date that is none), said as such and with
    the nights it has, not as an archive to audit.

    Raises
    ------
    UsageError
        ``out`` is such a night.
    """
    named = NIGHT_PARTITION.match(out.path.rstrip("/").rsplit("/", 1)[-1])
    if named is None:
        return
    days = [day for day, _ in _partition_names(out.parent)]
    if days:
        from pipeline.io.delta import nights_span  # see open_run

        raise UsageError(f"{out.parent.url} has no night committed on {named.group(1)}; "
                         f"its nights: {nights_span(days)}")


def _partition_names(out: Location) -> list[tuple[str, str]]:
    """``(day, folder name)`` of the ``date=`` folders under ``out``, oldest first."""
    fs = out.filesystem()
    try:
        fs.invalidate_cache(out.path)
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(out.path, detail=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((found.group(1), name) for name in names
                  if (found := NIGHT_PARTITION.match(name)))


def committed_partitions(out: Location) -> list[tuple[str, Location, dict[str, Any]]]:
    """The committed nights of a nightly output of the partitions layout (its
    ``OUT/date=YYYY-MM-DD`` folders), oldest first: ``(day, location, manifest)``. A
    partition without a manifest is a night that did not commit: left out. Empty when
    ``out`` does not exist or holds no such folder.

    Raises
    ------
    CorruptManifestError
        A partition's manifest is not one vakpipe writes.
    """
    folders = [(day, out.child(name)) for day, name in _partition_names(out)]
    manifests = map_io(out, lambda folder: read_manifest(folder[1]), folders)
    return [(day, loc, manifest) for (day, loc), manifest in zip(folders, manifests, strict=True)
            if manifest is not None]
