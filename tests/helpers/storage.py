"""Plain helpers of the IO, orchestration and CLI tests (fixtures are in conftest)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pipeline.io.storage import Location, resolve

#: The bucket the ``s3`` fixture creates for every test.
BUCKET = "vakpipe-test"


@dataclass(frozen=True)
class Places:
    """Where one test's archive and output go, on one kind of storage."""

    kind: str
    archive: Location
    out: Location


def places(kind: str, tmp_path: Path) -> Places:
    """An archive and an output location of ``kind`` (``local``, ``memory``, ``s3``)."""
    if kind == "local":
        return Places(kind, resolve(str(tmp_path / "archive")), resolve(str(tmp_path / "out")))
    if kind == "memory":
        base = f"memory://{tmp_path.name}"
        return Places(kind, resolve(f"{base}/archive"), resolve(f"{base}/out"))
    if kind == "s3":
        return Places(kind, resolve(f"s3://{BUCKET}/archive"), resolve(f"s3://{BUCKET}/out"))
    raise ValueError(kind)


def vakpipe_exe() -> str:
    """The ``vakpipe`` console script of this environment."""
    sibling = Path(sys.executable).with_name("vakpipe")
    if sibling.exists():
        return str(sibling)
    found = shutil.which("vakpipe")
    if found is None:  # pragma: no cover
        pytest.fail("the vakpipe entry point is not installed (pip install -e .)")
    return found


def run_vakpipe(*args: str, env: dict[str, str] | None = None,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``vakpipe ARGS`` through its entry point, in a process of its own (``env``: its
    whole environment; default this one's). Never raises on a failing exit."""
    return subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """A table's rows as dicts, in its order, timestamps as integer nanoseconds.

    (Nanosecond timestamps do not convert to ``datetime`` without pandas.)
    """
    columns = [
        col.cast(pa.int64()) if pa.types.is_timestamp(col.type) else col for col in table.columns
    ]
    rows: list[dict[str, Any]] = pa.Table.from_arrays(columns, names=table.column_names).to_pylist()
    return rows


def plain_rows(table: pa.Table) -> list[dict[str, Any]]:
    """A table's rows (:func:`table_rows`) in a canonical order."""
    return sorted(table_rows(table), key=lambda r: json.dumps(r, sort_keys=True, default=str))


def committed_rows(out: Path | Location, dataset: str) -> list[dict[str, Any]]:
    """The rows of ``dataset`` in the run committed under ``out`` (:func:`plain_rows`)."""
    from pipeline.io.commit import read_dataset

    loc = out if isinstance(out, Location) else resolve(str(out))
    return plain_rows(read_dataset(loc, dataset))


def small_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four small generated sessions (recorded plans, cards, packets, resets; seed 11) in
    a new folder: a fleet that replays in about a second."""
    from pipeline.synth.fleet import write_fleet

    root = tmp_path_factory.mktemp("fleet")
    write_fleet(resolve(str(root)), sessions=4, seed=11, size_scale=0.5)
    return root
