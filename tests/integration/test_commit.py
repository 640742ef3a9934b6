"""Tests of pipeline.io.commit: staged writes, atomic commits, reruns, failed runs.

Each test runs on a local folder and on S3 (moto's server over real HTTP). The audits
here read a ``memory://`` archive, so ``run_audit`` runs its tasks on threads of this
process, where a test can make a batch fail.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pipeline.run.orchestrate as orchestrate
from pipeline.errors import (
    CommitError,
    ConcurrentRunError,
    CorruptManifestError,
    CorruptTableError,
    OutputInsideArchiveError,
    RunReplacedError,
    UnsafeOutputError,
)
from pipeline.io.commit import (
    FILE_DATASETS,
    MANIFEST,
    STAGING,
    SUCCESS,
    EncodedPart,
    StagedRun,
    committed_partitions,
    encode_part,
    new_run_id,
    open_run,
    parse_manifest,
    read_dataset,
    read_manifest,
    recovering_manifests,
    remove_tree,
    valid_dataset_name,
    valid_file_name,
)
from pipeline.io.storage import Location, check_output, enumerate_sessions, resolve
from pipeline.ledger.types import Code, Finding
from pipeline.run.batches import BatchResult, RunContext, audit_batch
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from pipeline.tables.schemas import DATASETS, SESSIONS_SCHEMA, findings_table
from tests.helpers.fault_proxy import fault_proxy
from tests.helpers.storage import BUCKET, Places, places, plain_rows

SESSIONS, FINDINGS = "integrity/sessions", "integrity/findings"


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Places:
    if request.param == "s3":
        request.getfixturevalue("s3")
    return places(request.param, tmp_path)


def snapshot(out: Location) -> dict[str, bytes]:
    """Every file under ``out``: relative path -> bytes."""
    fs = out.filesystem()
    fs.invalidate_cache()
    prefix = out.path.rstrip("/") + "/"
    return {p[len(prefix):]: fs.cat_file(p) for p in fs.find(out.path)}


def session_rows(*paths: str) -> pa.Table:
    return pa.Table.from_pylist(
        [{"session_path": p, "agent": "vak", "status": "ok", "lines": i} for i, p in
         enumerate(paths)], schema=SESSIONS_SCHEMA)


def finding_rows(*paths: str) -> pa.Table:
    return findings_table((p, Finding(Code.TORN_TAIL, 3, "id", "detail")) for p in paths)


def staged(out: Location, run_id: str, parts: dict[int, list[str]]) -> StagedRun:
    run = StagedRun(out, run_id, DATASETS)
    for index, paths in parts.items():
        run.write_part(SESSIONS, index, session_rows(*paths))
        run.write_part(FINDINGS, index, finding_rows(*paths))
    return run


# --- StagedRun on its own -----------------------------------------------------------------


def test_commit_publishes_manifest_success_and_readable_datasets(where: Places) -> None:
    out = where.out
    run = staged(out, "run-1", {0: ["a", "b"], 1: ["c"]})
    manifest = run.commit({"sessions": 3})
    fs = out.filesystem()
    assert read_manifest(out) == manifest
    assert manifest["run_id"] == "run-1" and manifest["sessions"] == 3
    assert manifest["datasets"][SESSIONS] == {
        "files": ["part-run-1-00000.parquet", "part-run-1-00001.parquet"], "rows": 3}
    assert fs.cat_file(out.join(SUCCESS)) == b"run-1"
    files = snapshot(out)
    assert not any(p.startswith(STAGING) for p in files), files
    published = {posixpath.join(d, f) for d in DATASETS for f in manifest["datasets"][d]["files"]}
    assert set(files) == {MANIFEST, SUCCESS} | published
    for dataset, schema in DATASETS.items():
        table = read_dataset(out, dataset)
        # usage and subagents: no part staged, so the commit wrote empty ones
        empty = dataset in ("usage", "subagents")
        assert table.schema == schema and table.num_rows == (0 if empty else 3)
        # The folder reads as a plain Parquet dataset too (no stray files in it).
        direct = ds.dataset(out.join(dataset), filesystem=fs, format="parquet").to_table()
        assert direct.schema == schema
        assert plain_rows(direct) == plain_rows(table)
    assert sorted(read_dataset(out, SESSIONS)["session_path"].to_pylist()) == ["a", "b", "c"]


def test_a_run_does_not_commit_over_one_that_committed_beside_it(where: Places) -> None:
    # Two runs on one OUT at once: the later commit once replaced the earlier one's
    # tables, and both said where their tables were. Delta's rule for an overwrite that
    # meets a concurrent commit: the later one fails, nothing of it lands.
    out = where.out
    staged(out, "run-0", {0: ["z"]}).commit({})
    slow, fast = staged(out, "run-1", {0: ["a"]}), staged(out, "run-2", {0: ["b"]})
    slow.preflight()
    fast.preflight()
    fast.commit({})
    with pytest.raises(ConcurrentRunError, match=r": run run-2 committed here while run "
                       r"run-1 went on \(one run at a time per output\); this run was not "
                       r"committed, the output holds the other$"):
        slow.commit({})
    slow.abort()
    assert isinstance(ConcurrentRunError("x"), CommitError)  # exit 2, as a failed commit
    assert read_manifest(out)["run_id"] == "run-2"  # type: ignore[index]
    assert read_dataset(out, SESSIONS)["session_path"].to_pylist() == ["b"]
    assert not any("run-1" in path for path in snapshot(out))
    # One run after another, each read at its preflight, commits as ever.
    after = staged(out, "run-3", {0: ["c"]})
    after.preflight()
    assert after.commit({})["run_id"] == "run-3"


def test_commit_of_a_run_without_rows_writes_empty_datasets(where: Places) -> None:
    manifest = StagedRun(where.out, "run-empty", DATASETS).commit({})
    for dataset, schema in DATASETS.items():
        assert manifest["datasets"][dataset]["rows"] == 0
        table = read_dataset(where.out, dataset)
        assert table.num_rows == 0 and table.schema == schema


def test_rewriting_a_part_replaces_it(where: Places) -> None:
    run = staged(where.out, "run-1", {0: ["a", "b"]})
    run.write_part(SESSIONS, 0, session_rows("z"))
    run.commit({})
    assert read_dataset(where.out, SESSIONS)["session_path"].to_pylist() == ["z"]


def test_a_part_encoded_elsewhere_is_written_as_it_came(where: Places) -> None:
    """A worker's encoded part (:func:`encode_part`) is written byte for byte, counted
    in the manifest, and reads back as the table staged here would."""
    encoded = encode_part(session_rows("a", "b"), SESSIONS_SCHEMA)
    assert isinstance(encoded, EncodedPart) and encoded.rows == 2
    chunks = pq.ParquetFile(pa.BufferReader(encoded.data)).metadata.row_group(0)
    for i in range(chunks.num_columns):  # zstd, and no dictionary (commit.PART_DICTIONARY)
        column = chunks.column(i)
        assert column.compression == "ZSTD" and not column.has_dictionary_page
    assert plain_rows(pq.read_table(pa.BufferReader(encoded.data))) == \
        plain_rows(session_rows("a", "b"))
    run = StagedRun(where.out, "run-e", DATASETS)
    run.write_part(SESSIONS, 0, encoded)
    run.write_part(SESSIONS, 1, session_rows("c"))
    stage = snapshot(where.out)
    assert stage[posixpath.join(STAGING, "run-e", SESSIONS, "part-00000.parquet")] == encoded.data
    manifest = run.commit({})
    assert manifest["datasets"][SESSIONS]["rows"] == 3
    table = read_dataset(where.out, SESSIONS)
    assert table.schema == SESSIONS_SCHEMA
    assert sorted(table["session_path"].to_pylist()) == ["a", "b", "c"]


def test_unknown_dataset_is_refused(where: Places) -> None:
    with pytest.raises(KeyError):
        StagedRun(where.out, "r", DATASETS).write_part("nope", 0, session_rows("a"))


def test_abort_leaves_the_previous_output_byte_identical(where: Places) -> None:
    staged(where.out, "run-1", {0: ["a"], 1: ["b"]}).commit({"n": 1})
    before = snapshot(where.out)
    second = staged(where.out, "run-2", {0: ["x"], 1: ["y"], 2: ["z"]})
    assert any(p.startswith(STAGING) for p in snapshot(where.out))  # staged, not published
    second.abort()
    assert snapshot(where.out) == before
    assert read_manifest(where.out)["run_id"] == "run-1"  # type: ignore[index]


@pytest.mark.parametrize("attempt", range(4))
def test_a_run_started_right_after_a_killed_one_removes_its_staging(
    where: Places, attempt: int
) -> None:
    """Run ids are minted as the CLI mints them, within milliseconds of each other: the
    second run's id sorts after the killed run's, so its commit removes the folder the
    killed run left (to the second only, it did so about half the time)."""
    staged(where.out, new_run_id(), {0: ["a"]})  # killed before its commit
    staged(where.out, new_run_id(), {0: ["b"]}).commit({})
    assert not any(p.startswith(STAGING) for p in snapshot(where.out))


def test_run_ids_sort_by_start_time() -> None:
    first = new_run_id()
    time.sleep(0.001)
    assert first < new_run_id()


def test_a_new_commit_replaces_the_previous_files(where: Places) -> None:
    staged(where.out, "run-1", {0: ["a"], 1: ["b"], 2: ["c"]}).commit({})
    staged(where.out, "run-2", {0: ["x"]}).commit({})
    files = snapshot(where.out)
    data_files = sorted(p for p in files if p.endswith(".parquet"))
    assert data_files == [f"{d}/part-run-2-00000.parquet" for d in sorted(DATASETS)]
    assert files[SUCCESS] == b"run-2"
    assert read_dataset(where.out, SESSIONS)["session_path"].to_pylist() == ["x"]


def test_datasets_the_new_run_does_not_write_are_removed(where: Places) -> None:
    """A replay with a compacted archive, then a plain audit into the same OUT: the old
    replay tables and archive copies go with the run they belonged to."""
    schemas = {**DATASETS, "turns": DATASETS[SESSIONS]}
    run = StagedRun(where.out, "run-1", schemas)
    run.write_part("turns", 0, session_rows("a"))
    fs = where.out.filesystem()
    copy = posixpath.join(run.stage_dir("archive"), "agents/x/s.jsonl")
    where.out.makedirs(posixpath.dirname(copy))
    fs.pipe_file(copy, b"{}\n")
    run.add_files("archive", ["agents/x/s.jsonl"])
    run.commit({})
    assert {"turns/part-run-1-00000.parquet", "archive/agents/x/s.jsonl"} <= set(
        snapshot(where.out))
    staged(where.out, "run-2", {0: ["x"]}).commit({})
    files = snapshot(where.out)
    assert not any(p.startswith(("turns/", "archive/")) for p in files), files
    assert set((read_manifest(where.out) or {})["datasets"]) == set(DATASETS)


def test_a_crash_inside_the_commit_keeps_the_previous_manifest(
    where: Places, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = where.out
    staged(out, "run-1", {0: ["a"]}).commit({})
    fs = out.filesystem()
    import pipeline.io.commit as commit_module

    real_write = commit_module.write_small_file

    def failing_write(loc: Any, path: str, data: bytes) -> Any:
        # Every small file (the manifest too) goes through the one writer.
        if MANIFEST in path:
            raise PermissionError(f"{path}: simulated failure")
        return real_write(loc, path, data)

    monkeypatch.setattr(commit_module, "write_small_file", failing_write)
    with pytest.raises(CommitError, match="run-2"):
        staged(out, "run-2", {0: ["x"], 1: ["y"]}).commit({})
    monkeypatch.undo()
    # The new files were moved in, but readers that go through the manifest still see
    # exactly the previous run.
    assert read_manifest(out)["run_id"] == "run-1"  # type: ignore[index]
    assert read_dataset(out, SESSIONS)["session_path"].to_pylist() == ["a"]
    assert fs.cat_file(out.join(SUCCESS)) == b"run-1"
    # The next run removes the strays.
    staged(out, "run-3", {0: ["q"]}).commit({})
    data_files = sorted(p for p in snapshot(out) if p.endswith(".parquet"))
    assert data_files == [f"{d}/part-run-3-00000.parquet" for d in sorted(DATASETS)]


def test_a_failed_move_keeps_the_previous_manifest(
    where: Places, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = where.out
    staged(out, "run-1", {0: ["a"], 1: ["b"]}).commit({})
    before = snapshot(out)

    def failing_mv(self: Any, *args: Any, **kwargs: Any) -> None:
        raise PermissionError("simulated: the copy was refused")

    # The parts move one by one (locally) or in one call (S3): both fail alike.
    monkeypatch.setattr(type(out.filesystem()), "mv", failing_mv)
    with pytest.raises(CommitError, match="run-2"):
        staged(out, "run-2", {0: ["x"], 1: ["y"], 2: ["z"]}).commit({})
    monkeypatch.undo()
    out.filesystem().invalidate_cache()
    assert read_manifest(out)["run_id"] == "run-1"  # type: ignore[index]
    published = {p: b for p, b in snapshot(out).items() if not p.startswith(STAGING)}
    assert published == before


@pytest.mark.usefixtures("s3")
def test_on_s3_parts_move_and_old_parts_go_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A move on S3 is a copy and a delete: the parts of a run go in one call, whose
    copies run concurrently and whose deletes (the staged parts', then the previous
    run's) go 1,000 keys a request."""
    out = places("s3", Path("unused")).out
    staged(out, "run-1", {i: [f"a{i}"] for i in range(5)}).commit({})
    calls: list[tuple[str, int]] = []
    fs = out.filesystem()  # the instance every call of the commit gets (s3fs caches it)
    real_mv, real_rm = fs.mv, fs.rm

    def mv(path1: Any, path2: Any, **kwargs: Any) -> None:
        calls.append(("mv", len(path1) if isinstance(path1, list) else 1))
        real_mv(path1, path2, **kwargs)

    def rm(path: Any, **kwargs: Any) -> None:
        calls.append(("rm", len(path) if isinstance(path, list) else 1))
        real_rm(path, **kwargs)

    monkeypatch.setattr(fs, "mv", mv)
    monkeypatch.setattr(fs, "rm", rm)
    staged(out, "run-2", {i: [f"b{i}"] for i in range(4)}).commit({})
    # Every dataset's parts (4 staged in two, an empty one in each other) in one move,
    # and each Parquet dataset's 5 (or 1) old parts in one delete.
    # Every dataset's parts (4 staged in two datasets, an empty one in each other) in
    # one move: one copy call, one delete of the staged keys. Then each of the two
    # datasets' 5 old parts in one delete.
    moved = 2 * 4 + len(DATASETS) - 2
    assert calls[:2] == [("mv", moved), ("rm", moved)]
    assert calls.count(("rm", 5)) == 2
    data_files = sorted(p for p in snapshot(out) if p.endswith(".parquet"))
    assert data_files == sorted(f"{d}/part-run-2-{i:05d}.parquet" for d in DATASETS
                                for i in (range(4) if d in (SESSIONS, FINDINGS) else [0]))
    assert sorted(read_dataset(out, SESSIONS)["session_path"].to_pylist()) == [
        "b0", "b1", "b2", "b3"]


@pytest.mark.usefixtures("s3")
def test_an_output_named_like_a_glob_moves_one_by_one_and_touches_no_neighbour() -> None:
    """fsspec expands ``*``, ``?`` and ``[`` in the paths of a list call: an output
    named ``out[1]`` would reach ``out1``. Such names move and delete one by one."""
    neighbour = resolve(f"s3://{BUCKET}/out1")
    staged(neighbour, "theirs", {0: ["n"]}).commit({})
    theirs = snapshot(neighbour)
    out = resolve(f"s3://{BUCKET}/out[1]")
    staged(out, "run-1", {0: ["a"], 1: ["b"], 2: ["c"]}).commit({})
    staged(out, "run-2", {0: ["x"], 1: ["y"]}).commit({})
    assert sorted(read_dataset(out, SESSIONS)["session_path"].to_pylist()) == ["x", "y"]
    data_files = sorted(p for p in snapshot(out) if p.endswith(".parquet"))
    assert data_files == sorted(f"{d}/part-run-2-{i:05d}.parquet" for d in DATASETS
                                for i in (range(2) if d in (SESSIONS, FINDINGS) else [0]))
    assert snapshot(neighbour) == theirs


def test_remove_tree_removes_the_folder_and_nothing_beside_it(where: Places) -> None:
    fs = where.out.filesystem()
    for rel in ("_scratch/a.parquet", "_scratch/x/b.parquet", "_scratch2/c", "keep.json"):
        where.out.makedirs(posixpath.dirname(where.out.join(rel)))
        fs.pipe_file(where.out.join(rel), b"x")
    remove_tree(where.out, where.out.join("_scratch"))
    assert sorted(snapshot(where.out)) == ["_scratch2/c", "keep.json"]
    remove_tree(where.out, where.out.join("_scratch"))  # nothing there: no error


def test_remove_tree_unlinks_a_link_and_never_follows_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "archive"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "sub" / "ledger.jsonl").write_bytes(b"{}")
    out = resolve(str(tmp_path / "out"))
    (tmp_path / "out" / "_scratch").mkdir(parents=True)
    (tmp_path / "out" / "_scratch" / "in").symlink_to(elsewhere)
    (tmp_path / "out" / "gone").symlink_to(elsewhere / "sub")
    remove_tree(out, out.join("_scratch"))
    remove_tree(out, out.join("gone"))
    assert os.listdir(tmp_path / "out") == []
    assert (elsewhere / "sub" / "ledger.jsonl").read_bytes() == b"{}"
    with pytest.raises(UnsafeOutputError):
        remove_tree(out, str(elsewhere))


@pytest.mark.usefixtures("s3")
def test_remove_tree_reads_a_glob_like_output_literally() -> None:
    """fsspec's recursive ``rm`` globs: ``out[1]/_scratch`` would match ``out1/_scratch``
    (the nightly's scratch folder has one fixed name in every output)."""
    fs = fsspec.filesystem("s3")
    for name in ("out[1]", "out1"):
        for rel in ("_scratch/a.parquet", "_scratch/x/b.parquet", "keep.json"):
            fs.pipe_file(f"{BUCKET}/{name}/{rel}", b"x")
    out, neighbour = resolve(f"s3://{BUCKET}/out[1]"), resolve(f"s3://{BUCKET}/out1")
    theirs = snapshot(neighbour)
    remove_tree(out, out.join("_scratch"))
    assert sorted(snapshot(out)) == ["keep.json"]
    assert snapshot(neighbour) == theirs
    remove_tree(out, out.join("_scratch"))


#: Output names that fsspec's glob would read as patterns matching one another.
GLOBBY = st.text(alphabet="ab1*?[]", min_size=1, max_size=5)


@given(names=st.lists(GLOBBY, min_size=2, max_size=4, unique=True))
def test_remove_tree_removes_only_its_own_folder_whatever_the_names(names: list[str]) -> None:
    """On an object store (here fsspec's memory one, whose ``rm`` globs as s3fs's does),
    removing ``<name>/_scratch`` leaves every other output's folder of that name."""
    fs = fsspec.filesystem("memory")
    base = f"globby-{uuid.uuid4().hex[:8]}"
    outs = [resolve(f"memory://{base}/{name}") for name in names]
    for out in outs:
        for rel in ("_scratch/a", "_scratch/x/b", "keep"):
            fs.pipe_file(out.join(rel), b"x")
    try:
        remove_tree(outs[0], outs[0].join("_scratch"))
        left = {p.lstrip("/").split("/", 1)[1] for p in fs.find(f"/{base}")}
        assert left == {f"{name}/{rel}" for name in names
                        for rel in ("_scratch/a", "_scratch/x/b", "keep")
                        if name != names[0] or rel == "keep"}
    finally:
        fs.rm(f"/{base}", recursive=True)


def test_read_dataset_without_a_commit(where: Places) -> None:
    assert read_manifest(where.out) is None
    with pytest.raises(FileNotFoundError, match="integrity/sessions"):
        read_dataset(where.out, SESSIONS)


def test_a_nightly_output_is_read_as_its_newest_committed_night(where: Places) -> None:
    """The readers of a run (``vakpipe cost``, ``export otel``, ``regress
    --baseline-run``) given a nightly output of ``date=`` partitions read its newest
    committed night; a newer partition that did not commit (no manifest) is left out."""
    out = where.out
    assert committed_partitions(out) == [] and open_run(out) is None
    staged(out.child("date=2026-12-01"), "night-1", {0: ["a"]}).commit({})
    staged(out.child("date=2026-12-02"), "night-2", {0: ["b", "c"]}).commit({})
    fs = out.filesystem()
    fs.makedirs(out.join("date=2026-12-03"), exist_ok=True)
    fs.pipe_file(out.join("date=2026-12-03", "stray.txt"), b"not committed")
    assert [day for day, _, _ in committed_partitions(out)] == ["2026-12-01", "2026-12-02"]
    run = open_run(out)
    assert run is not None and run.manifest["run_id"] == "night-2"
    assert sorted(run.read(SESSIONS)["session_path"].to_pylist()) == ["b", "c"]
    # A run committed at OUT itself is read first.
    staged(out, "run-at-out", {0: ["z"]}).commit({})
    assert open_run(out).manifest["run_id"] == "run-at-out"  # type: ignore[union-attr]


def test_a_run_is_read_as_of_the_manifest_it_was_opened_with(where: Places) -> None:
    """A reader opens a run once and reads every table of that one commit: a commit that
    lands meanwhile (a nightly while `vakpipe cost` reads) never mixes its tables in, and
    the older run's files, deleted by that commit, fail as one clear error rather than
    reading as a dataset the run does not have."""
    out = where.out
    staged(out, "first", {0: ["a"]}).commit({})
    run = open_run(out)
    assert run is not None and run.manifest["run_id"] == "first"
    staged(out, "second", {0: ["b"]}).commit({})
    with pytest.raises(RunReplacedError, match="run first was replaced by a newer commit"):
        run.read(SESSIONS)
    with pytest.raises(FileNotFoundError, match="no committed dataset 'nothing'"):
        run.read("nothing")
    assert open_run(out).read(SESSIONS)["session_path"].to_pylist() == ["b"]  # type: ignore[union-attr]


def test_on_s3_a_run_of_many_parts_reads_them_side_by_side_in_manifest_order(
    s3: LocalS3
) -> None:
    """Each part once: one HEAD and one GET (pyarrow opening the path itself sent five
    HEADs and two GETs), the parts side by side, their rows in the manifest's order; a
    part gone is the same one error as when read one by one."""
    out = resolve(f"s3://{BUCKET}/out")
    names = [f"s{i}" for i in range(6)]
    staged(out, "first", {i: [name] for i, name in enumerate(names)}).commit({})
    with fault_proxy(s3.endpoint) as proxy:
        run = open_run(resolve(out.url, {"endpoint_url": proxy.endpoint}))
        assert run is not None
        proxy.clear()
        assert run.read(SESSIONS)["session_path"].to_pylist() == names
        parts = [r for r in proxy.requests() if r.key.startswith(f"out/{SESSIONS}/")]
        assert sorted((r.method, r.key) for r in parts) == sorted(
            (method, f"out/{SESSIONS}/{name}") for method in ("GET", "HEAD")
            for name in run.datasets[SESSIONS]["files"])
        assert [r for r in proxy.requests() if r.key.endswith(MANIFEST)] == []
        staged(out, "second", {0: ["b"]}).commit({})
        with pytest.raises(RunReplacedError, match="run first was replaced by a newer commit"):
            run.read(SESSIONS)


def test_a_damaged_part_of_a_run_is_one_error_naming_its_table(where: Places) -> None:
    out = where.out
    staged(out, "first", {0: ["a"]}).commit({})
    run = open_run(out)
    assert run is not None
    part = out.join(SESSIONS, run.datasets[SESSIONS]["files"][0])
    out.filesystem().pipe_file(part, b"PAR1 cut short")
    with pytest.raises(CorruptTableError, match="its integrity/sessions table is damaged"):
        run.read(SESSIONS)


# --- run_audit over a memory archive, committing to local or S3 ---------------------------


@pytest.fixture
def archive(memfs: fsspec.AbstractFileSystem, monkeypatch: pytest.MonkeyPatch) -> Location:
    """A 30-session faulty fleet in memory, cut into many small batches."""
    loc = places("memory", Path("commit-tests")).archive
    write_fleet(loc, sessions=30, seed=21, faults=True, size_scale=0.2)
    monkeypatch.setattr(orchestrate, "MIN_BATCH_BYTES", 1)
    return loc


def test_rerun_gives_the_same_rows_without_duplicates(where: Places, archive: Location) -> None:
    first = orchestrate.run_audit(archive, where.out, workers=2, progress=False)
    rows1 = {d: plain_rows(read_dataset(where.out, d)) for d in DATASETS}
    m1 = read_manifest(where.out)
    assert m1 is not None and len(m1["datasets"][SESSIONS]["files"]) > 1
    second = orchestrate.run_audit(archive, where.out, workers=2, progress=False)
    m2 = read_manifest(where.out)
    assert m2 is not None and m2["run_id"] == second.run_id != first.run_id
    for d in DATASETS:
        assert plain_rows(read_dataset(where.out, d)) == rows1[d]
        assert m2["datasets"][d]["rows"] == m1["datasets"][d]["rows"] == len(rows1[d])
        # Only the files of the second run are left: a plain dataset read sees no duplicate.
        direct = ds.dataset(where.out.join(d), filesystem=where.out.filesystem(),
                            format="parquet").to_table()
        assert plain_rows(direct) == rows1[d]
    paths = [r["session_path"] for r in rows1[SESSIONS]]
    assert len(paths) == len(set(paths)) == 30
    files = snapshot(where.out)
    assert not any(p.startswith(STAGING) for p in files)
    assert all(second.run_id in p for p in files if p.endswith(".parquet"))
    assert m2["sessions"] == 30 and m2["findings_by_code"] == dict(sorted(second.codes.items()))


class BatchFailed(RuntimeError):
    pass


def test_a_failed_batch_leaves_the_previous_output_byte_identical(
    where: Places, archive: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    orchestrate.run_audit(archive, where.out, workers=2, progress=False)
    before = snapshot(where.out)
    last = len(orchestrate.plan_batches(enumerate_sessions(archive).sessions, 2)) - 1
    assert last >= 3

    def flaky_batch(root: Location, index: int, batch: list[Any],
                    context: RunContext) -> BatchResult:
        if index == last:
            raise BatchFailed(f"batch {index} failed")
        return audit_batch(root, index, batch, context)

    staged_parts: list[str] = []
    real_write_part = StagedRun.write_part

    def spy(self: StagedRun, dataset: str, index: int, table: pa.Table) -> None:
        real_write_part(self, dataset, index, table)
        staged_parts.append(posixpath.join(self.stage_path, dataset, str(index)))

    monkeypatch.setattr(orchestrate, "audit_batch", flaky_batch)
    monkeypatch.setattr(StagedRun, "write_part", spy)
    with pytest.raises(BatchFailed):
        orchestrate.run_audit(archive, where.out, workers=2, progress=False)
    assert staged_parts  # batches before the failure were staged, then thrown away
    assert snapshot(where.out) == before


# --- outputs can never reach the archive (issue 16) --------------------------------------

#: Names built from the characters that matter: separators, dots, controls, plain ones.
NAMES = st.text(alphabet=st.sampled_from(["a", "Z", "0", "-", "_", ".", "/", "\\", "\x00",
                                          "\n", " ", "=", "\u2024", "%"]), max_size=12)


@given(dataset=NAMES, name=NAMES, nested=st.booleans())
def test_any_name_the_manifest_check_accepts_stays_inside_out(
    dataset: str, name: str, nested: bool
) -> None:
    out = "/srv/reports/out"
    file_dataset = sorted(FILE_DATASETS)[0] if nested else dataset
    for d in (dataset, file_dataset):
        if not (valid_dataset_name(d) and valid_file_name(d, name)):
            continue
        joined = posixpath.join(out, d, name)
        # No dot segment, nothing absolute: normalising changes nothing, and the path
        # lies strictly below OUT.
        assert posixpath.normpath(joined) == joined
        assert joined.startswith(out + "/") and len(joined) > len(out) + 1
        resolve(out).check_inside(joined, leaf=True)  # no link on a path that does not exist


@pytest.mark.parametrize("dataset, name", [
    ("usage/../../archive", "x"), ("/abs", "x"), ("a/b/c", "x"), ("_staging", "x"),
    ("usage", "../x"), ("usage", "a/b.parquet"), ("usage", "/x"), ("usage", ""),
    ("usage", "."), ("usage", "..\\x"), ("usage", "x\x00"), ("usage", "x\ny"),
    ("archive", "agents//x.jsonl"), ("archive", "agents/../../x"), ("archive", "/etc/x"),
    ("usage", 3), ("", "x"), (".hidden", "x"),
])
def test_manifest_names_that_climb_or_hide_are_refused(dataset: Any, name: Any) -> None:
    raw = json.dumps({"run_id": "r", "datasets": {str(dataset): {"files": [name],
                                                                    "rows": 1}}})
    with pytest.raises(CorruptManifestError, match="is corrupt"):
        parse_manifest(raw.encode(), "OUT/_manifest.json")


def test_names_vakpipe_writes_are_accepted() -> None:
    for dataset in ("integrity/sessions", "integrity/findings", "usage", "subagents",
                    "turns", "requests", "compaction", "checkpoints", "regression"):
        assert valid_dataset_name(dataset)
        assert valid_file_name(dataset, "part-20261201T000000000000Z-0a1b2c3d-00000.parquet")
    # Archive keys are data: escaped-looking or lookalike names are plain names.
    for key in ("agents/vak/sessions/%2e%2e/pct.jsonl", "agents/vak/sessions/h/\u2024\u2024.jsonl",
                "agents/vak/sessions/h/" + "L" * 900 + ".jsonl"):
        assert valid_file_name("archive", key)


def test_a_corrupt_manifest_stops_read_and_commit_until_forced(tmp_path: Path) -> None:
    out = resolve(str(tmp_path / "out"))
    staged(out, "run-1", {0: ["a"]}).commit({})
    bad = b'{"datasets": {"usage": {"files": ["../../x"]}}}'
    Path(out.join(MANIFEST)).write_bytes(bad)
    before = snapshot(out)
    with pytest.raises(CorruptManifestError):
        read_manifest(out)
    with pytest.raises(CorruptManifestError):
        read_dataset(out, SESSIONS)
    with pytest.raises(CorruptManifestError, match="cannot be read: write it again"):
        open_run(out)  # a reader has no --force
    run = staged(out, "run-2", {0: ["b"]})
    with pytest.raises(CorruptManifestError, match="rerun with --force"):
        run.preflight()
    with pytest.raises(CorruptManifestError, match="rerun with --force"):
        run.commit({})
    run.abort()
    assert snapshot(out) == before  # nothing moved, nothing deleted
    with recovering_manifests():
        assert read_manifest(out) is None
        staged(out, "run-3", {0: ["c"]}).commit({})
    assert Path(out.join(f"{MANIFEST}.corrupt-run-3")).read_bytes() == bad
    assert read_dataset(out, SESSIONS)["session_path"].to_pylist() == ["c"]


def test_links_on_the_way_are_refused_a_link_removed_is_unlinked(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "keep.parquet").write_bytes(b"keep")
    out = resolve(str(tmp_path / "out"))
    Path(out.path).mkdir()
    (Path(out.path) / "usage").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        out.check_inside(out.join("usage", "part-1.parquet"))
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        out.check_inside(out.join("usage"))
    out.check_inside(out.join("usage"), leaf=False)  # a link removed: unlinked itself
    with pytest.raises(UnsafeOutputError, match="not a plain path"):
        out.check_inside(out.join("a", "..", "b"))
    with pytest.raises(UnsafeOutputError, match="not a plain path"):
        out.check_inside(str(tmp_path / "elsewhere"))
    run = StagedRun(out, "run-1", DATASETS)
    with pytest.raises(UnsafeOutputError):
        run.preflight()
    run.write_part(SESSIONS, 0, session_rows("a"))  # staged: below _staging, no link
    with pytest.raises(UnsafeOutputError):
        run.commit({})  # refused before anything moved
    assert not Path(out.join(SESSIONS)).exists() and not Path(out.join(MANIFEST)).exists()
    run.abort()
    remove_tree(out, out.join("usage"))
    assert not os.path.lexists(out.join("usage"))
    assert (elsewhere / "keep.parquet").read_bytes() == b"keep"


def test_object_stores_get_the_name_checks_only() -> None:
    out = resolve("memory://reports/out")
    out.check_inside(out.join("usage", "part-1.parquet"))
    with pytest.raises(UnsafeOutputError):
        out.check_inside(out.join("usage", "..", "..", "archive"))


def test_check_output_resolves_every_path_written(tmp_path: Path) -> None:
    archive, out = tmp_path / "archive", tmp_path / "out"
    (archive / "agents").mkdir(parents=True)
    out.mkdir()
    (out / "_staging").symlink_to(archive / "agents", target_is_directory=True)
    (out / "usage").symlink_to(tmp_path, target_is_directory=True)  # around the archive
    root, loc = resolve(str(archive)), resolve(str(out))
    check_output(root, loc)  # OUT itself is beside the archive
    for name in ("_staging/run/x.parquet", "usage"):
        with pytest.raises(OutputInsideArchiveError, match="overlaps the archive"):
            check_output(root, loc, [loc.join(*name.split("/"))])
    check_output(root, loc, [loc.join("integrity", "sessions")])


def test_a_part_deleted_by_hand_is_a_damaged_table_not_a_replaced_run(where: Places) -> None:
    out = where.out
    staged(out, "first", {0: ["a"]}).commit({})
    run = open_run(out)
    assert run is not None
    out.filesystem().rm_file(out.join(SESSIONS, run.datasets[SESSIONS]["files"][0]))
    with pytest.raises(CorruptTableError, match="a file its manifest names is gone"):
        run.read(SESSIONS)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_manifest_or_part_that_is_no_regular_file_is_refused_unread(
        tmp_path: Path, kind: str) -> None:
    """A reader once read ``/dev/zero`` linked as ``_manifest.json`` until the kernel
    killed it, and waited for ever on a FIFO there (a run's preflight too)."""
    out = resolve(str(tmp_path / "out"))

    def plant(path: str) -> None:
        os.unlink(path)
        if kind == "fifo":
            os.mkfifo(path)
        else:
            os.symlink("/dev/zero", path)

    manifest = staged(out, "run-1", {0: ["a"]}).commit({})
    part = out.join(SESSIONS, manifest["datasets"][SESSIONS]["files"][0])
    plant(part)
    said = "a FIFO" if kind == "fifo" else "a device"
    run = open_run(out)
    assert run is not None
    with pytest.raises(CorruptTableError, match=rf"its {SESSIONS} table is damaged \(.* is "
                       rf"{said}, not a part; not read\)"):
        run.read(SESSIONS)
    plant(out.join(MANIFEST))
    with pytest.raises(CorruptManifestError, match=rf"_manifest.json is {said}, not a "
                       "manifest; not read"):
        read_manifest(out)
    if kind == "fifo":  # a link is refused as a link; a FIFO there is set aside by --force
        with pytest.raises(CorruptManifestError):
            staged(out, "run-2", {0: ["b"]}).preflight()
        with recovering_manifests():
            again = staged(out, "run-3", {0: ["b"]})
            again.preflight()
            assert again.commit({})["run_id"] == "run-3"
        assert (tmp_path / "out" / f"{MANIFEST}.corrupt-run-3").is_fifo()


def test_a_part_of_another_table_is_refused_as_damaged(where: Places) -> None:
    """A part that reads as Parquet but holds another dataset's columns (one part copied
    over another's) made each report fail at its first use of a column: a KeyError
    traceback. It is a damaged table, named, exit 2."""
    out = where.out
    manifest = staged(out, "run-1", {0: ["a"]}).commit({})
    fs = out.filesystem()
    usage = out.join("usage", manifest["datasets"]["usage"]["files"][0])
    sessions = out.join(SESSIONS, manifest["datasets"][SESSIONS]["files"][0])
    fs.pipe_file(usage, fs.cat_file(sessions))
    run = open_run(out)
    assert run is not None
    with pytest.raises(CorruptTableError, match=r"its usage table is damaged \(no column "):
        run.read("usage")
    retyped = session_rows("a").set_column(
        SESSIONS_SCHEMA.get_field_index("lines"), "lines", pa.array(["three"]))
    fs.pipe_file(sessions, encode_part(retyped, retyped.schema).data)
    with pytest.raises(CorruptTableError, match=r"its integrity/sessions table is damaged "
                       r"\(its column 'lines' is string, not "):
        run.read(SESSIONS)
    assert run.read(SESSIONS, ["session_path"]).num_rows == 1  # the columns asked for
