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
"""

from __future__ import annotations

import json
import posixpath
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import CommitError
from pipeline.io.storage import Location, storage_error, storage_errors

MANIFEST = "_manifest.json"
SUCCESS = "_SUCCESS"
STAGING = "_staging"


def new_run_id() -> str:
    """A sortable, unique run id: UTC time to the microsecond plus a random suffix.

    Ids sort by start time, and a commit removes the staging folders of runs whose ids
    sort before its own. To the second only, a run started in the same second as a run
    killed before its commit sorted after or before it by the suffix alone, and left
    the killed run's folder behind half the time.
    """
    now = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{now}-{uuid.uuid4().hex[:8]}"


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

    def write_part(self, dataset: str, index: int, table: pa.Table) -> None:
        """Stage part ``index`` of ``dataset`` (rewriting it if it was staged before)."""
        if dataset not in self.schemas:
            raise KeyError(f"unknown dataset {dataset!r}")
        fs = self.out.filesystem()
        path = posixpath.join(self.stage_path, dataset, f"part-{index:05d}.parquet")
        try:
            self.out.makedirs(posixpath.dirname(path))
            with fs.open(path, "wb") as f:
                pq.write_table(table.cast(self.schemas[dataset]), f, compression="zstd")
        except storage_errors() as err:
            raise storage_error(err, self.out.url) from err
        self._parts.setdefault(dataset, {})[index] = (path, table.num_rows)

    def commit(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Publish the staged parts atomically; return the manifest written.

        Every dataset gets at least one (possibly empty) file, so it always reads with
        its schema.
        """
        fs = self.out.filesystem()
        for dataset, schema in self.schemas.items():
            if not self._parts.get(dataset):
                self.write_part(dataset, 0, schema.empty_table())
        files: dict[str, list[str]] = {}
        rows: dict[str, int] = {}
        try:
            for dataset, parts in self._parts.items():
                final_dir = self.out.join(dataset)
                self.out.makedirs(final_dir)
                names = []
                for index in sorted(parts):
                    staged, n = parts[index]
                    name = f"part-{self.run_id}-{index:05d}.parquet"
                    fs.mv(staged, posixpath.join(final_dir, name))
                    names.append(name)
                    rows[dataset] = rows.get(dataset, 0) + n
                files[dataset] = names
            previous = read_manifest(self.out)
            for dataset, rels in self._files.items():
                for rel in sorted(rels):
                    target = self.out.join(dataset, rel)
                    self.out.makedirs(posixpath.dirname(target))
                    fs.mv(posixpath.join(self.stage_dir(dataset), rel), target)
                files[dataset] = sorted(rels)
                rows[dataset] = len(rels)
            manifest = {
                "run_id": self.run_id,
                "committed_at": datetime.now(UTC).isoformat(),
                "datasets": {d: {"files": files[d], "rows": rows.get(d, 0)} for d in files},
                **summary,
            }
            # A single object write is atomic on object stores; locally, write then rename.
            tmp = self.out.join(f"{MANIFEST}.{self.run_id}.tmp")
            fs.pipe_file(tmp, json.dumps(manifest, indent=1, sort_keys=True).encode())
            fs.mv(tmp, self.out.join(MANIFEST))
            for dataset, before in ((previous or {}).get("datasets") or {}).items():
                if not isinstance(before, dict) or (dataset in files
                                                    and dataset not in self._files):
                    continue  # a Parquet dataset of this run: its folder is listed below
                # The previous manifest says what the last run published: of a file
                # dataset (nested paths) the files this run did not write again, and all
                # of a dataset this run does not write (its replay tables, its compacted
                # archive): OUT holds one run, the one in force.
                keep = set(files.get(dataset, ()))
                for rel in sorted({r for r in before.get("files") or [] if isinstance(r, str)}
                                  - keep):
                    if fs.exists(self.out.join(dataset, rel)):
                        fs.rm(self.out.join(dataset, rel))
            for dataset, names in files.items():
                if dataset in self._files:
                    continue
                keep = set(names)
                # A fresh listing: strays of a run killed in another process are not in
                # a listing this process cached before.
                fs.invalidate_cache(self.out.join(dataset))
                for path in fs.ls(self.out.join(dataset), detail=False):
                    if posixpath.basename(path) not in keep:
                        fs.rm(path, recursive=True)
            fs.pipe_file(self.out.join(SUCCESS), self.run_id.encode())
            self._remove_stale_staging()
            self.abort()
        except storage_errors() as err:
            raise CommitError(f"{self.out.url}: commit of run {self.run_id} failed: {err}") from err
        return manifest

    def _remove_stale_staging(self) -> None:
        """Remove the staging folders of runs older than this one (a client killed before
        its commit leaves its folder behind; nothing else ever removes it).

        Run ids sort by start time; a younger folder may belong to a run still going and
        is left alone (one run at a time per output is the rule, see docs/audit.md).
        Best effort: a leftover costs space, never correctness.
        """
        fs = self.out.filesystem()
        staging = self.out.join(STAGING)
        try:
            fs.invalidate_cache(staging)
            if not fs.exists(staging):
                return
            for path in fs.ls(staging, detail=False):
                name = posixpath.basename(path.rstrip("/"))
                if name < self.run_id:
                    fs.rm(path, recursive=True)
        except storage_errors():
            pass

    def abort(self) -> None:
        """Remove this run's staging folder (the previous output is untouched)."""
        fs = self.out.filesystem()
        try:
            if fs.exists(self.stage_path):
                fs.rm(self.stage_path, recursive=True)
            staging = self.out.join(STAGING)
            if fs.exists(staging) and not fs.ls(staging, detail=False):
                fs.rmdir(staging)
        except storage_errors():  # best effort: a later run ignores stale staging
            pass


def read_manifest(out: Location) -> dict[str, Any] | None:
    """The manifest of the last committed run under ``out``, or ``None``."""
    fs = out.filesystem()
    try:
        return json.loads(fs.cat_file(out.join(MANIFEST)))  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


def read_dataset(out: Location, dataset: str) -> pa.Table:
    """Read one dataset of the last committed run, exactly the files its manifest names."""
    manifest = read_manifest(out)
    if manifest is None or dataset not in manifest["datasets"]:
        raise FileNotFoundError(f"{out.url}: no committed dataset {dataset!r}")
    fs = out.filesystem()
    # The manifest is read fresh; a listing cached by this process before another one
    # committed would not know its files.
    fs.invalidate_cache(out.join(dataset))
    tables = [
        pq.read_table(out.join(dataset, name), filesystem=fs)
        for name in manifest["datasets"][dataset]["files"]
    ]
    return pa.concat_tables(tables)
