"""The nightly audit into Delta Lake tables (``vakpipe nightly --format delta``).

The invariant: each night, read as of itself from the Delta tables, holds exactly the
rows of the partition the ``partitions`` layout commits for that night over the same
archive (timestamps in Delta's microseconds), so torn, missing, rewritten and truncated
sessions are reported as they are there; while a night writes only the rows of the
sessions it read. Through the job and the CLI, on generated fleets in local folders and
once on moto's S3 server, with the session cluster's worker processes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

import jobs.nightly_tables as nt
from jobs.dashboard import dashboard_job
from jobs.nightly_audit import partition, run_nightly
from jobs.nightly_tables import (
    HISTORY,
    NIGHTS,
    created_day,
    night_versions,
    read_night,
    run_nightly_tables,
)
from pipeline.cli import run
from pipeline.errors import BaselineError, CommitError, ExpiredVersionError
from pipeline.io.commit import read_dataset
from pipeline.io.delta import error_text
from pipeline.io.storage import resolve
from pipeline.run.replay_batches import ReplayOptions
from pipeline.synth.fleet import grow_session, write_fleet
from tests.helpers.fleets import copied_fleet
from tests.helpers.storage import BUCKET, plain_rows, vakpipe_exe
from tests.integration.test_nightly import D1, D2, D3, DATASETS, clean_sessions

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


generated, archive = copied_fleet("generated-delta", sessions=10, seed=21, faults=True,
                                  size_scale=0.5, consistent=False)


def delta_night(root: Path, out: Path, day: date, scheduler: str, **kw: Any) -> Any:
    return run_nightly_tables(resolve(str(root)), resolve(str(out)), ReplayOptions(),
                              day=day, scheduler=scheduler, progress=False, **kw)


def micro(table: pa.Table) -> list[dict[str, Any]]:
    """Rows (:func:`plain_rows`) with timestamps cut to microseconds (Delta's unit)."""
    columns = [pc.cast(pc.cast(c, pa.timestamp("us", tz="UTC"), safe=False), c.type)
               if pa.types.is_timestamp(c.type) else c for c in table.columns]
    return plain_rows(pa.Table.from_arrays(columns, names=table.column_names))


def as_of(out: Path, day: date, dataset: str) -> list[dict[str, Any]]:
    return micro(read_night(resolve(str(out)), dataset, day))


def partition_rows(out: Path, day: date, dataset: str) -> list[dict[str, Any]]:
    return micro(read_dataset(partition(resolve(str(out)), day), dataset))


def state_versions(out: Path) -> dict[str, int]:
    return {name: DeltaTable(str(out / name)).version() for name in DATASETS}


def test_every_night_equals_the_partition_of_that_night(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    parts, tables = tmp_path / "parts", tmp_path / "tables"
    opts = ReplayOptions()
    first = delta_night(archive, tables, D1, scheduler)
    run_nightly(resolve(str(archive)), resolve(str(parts)), opts, day=D1,
                scheduler=scheduler, progress=False)
    shorter, other_head, grown, deleted = clean_sessions(archive)[:4]
    data = (archive / shorter).read_bytes()
    (archive / shorter).write_bytes(data[:data.rindex(b"\n", 0, len(data) - 1) + 1])
    data = (archive / other_head).read_bytes()
    at = data.rindex(b'"ts":"') + len(b'"ts":"2026-')
    (archive / other_head).write_bytes(
        data[:at] + (b"0" if data[at:at + 1] != b"0" else b"1") + data[at + 1:])
    grow_session(resolve(str(archive)), grown, entries=2)
    (archive / deleted).unlink()
    before = state_versions(tables)
    second = delta_night(archive, tables, D2, scheduler)
    expected = run_nightly(resolve(str(archive)), resolve(str(parts)), opts, day=D2,
                           scheduler=scheduler, progress=False)
    assert second.changes == expected.changes
    assert second.run.statuses == expected.run.statuses
    assert second.run.codes == expected.run.codes
    assert second.bytes_read == expected.bytes_read < first.bytes_read
    for day in (D1, D2):
        for dataset in DATASETS:
            assert as_of(tables, day, dataset) == partition_rows(parts, day, dataset), \
                (day, dataset)
    # Only the changed and missing sessions' rows were written: one version more each.
    assert all(v == before[k] + 1 for k, v in state_versions(tables).items())
    # "What night D2 found": a plain filter of a well-known reader on the history table.
    found = DeltaTable(str(tables / HISTORY)).to_pyarrow_dataset()  # noqa: F841
    breaks = duckdb.sql("SELECT session_path, code FROM found WHERE night = '2026-12-02' "
                        "AND (code LIKE 'history_%' OR code = 'session_missing') "
                        "ORDER BY 1").fetchall()
    assert breaks == sorted([(shorter, "history_truncated"), (other_head, "history_rewritten"),
                             (deleted, "session_missing")])


def test_an_unchanged_night_writes_no_row(archive: Path, tmp_path: Path,
                                          scheduler: str) -> None:
    out = tmp_path / "out"
    delta_night(archive, out, D1, scheduler)
    before = state_versions(out)
    second = delta_night(archive, out, D2, scheduler)
    assert second.bytes_read == 0 and second.changes["unchanged"] == 10
    assert state_versions(out) == before  # no commit at all
    assert not (out / "_night").exists()  # tonight's scratch output is gone
    for dataset in DATASETS:
        assert as_of(out, D2, dataset) == as_of(out, D1, dataset)
    assert night_versions(resolve(str(out)), D2)["usage"] == before["usage"]


def test_history_breaks_survive_a_same_day_rerun(archive: Path, tmp_path: Path,
                                                 scheduler: str) -> None:
    out = tmp_path / "out"
    delta_night(archive, out, D1, scheduler)
    shorter = clean_sessions(archive)[0]
    data = (archive / shorter).read_bytes()
    (archive / shorter).write_bytes(data[:data.rindex(b"\n", 0, len(data) - 1) + 1])
    first = delta_night(archive, out, D2, scheduler)
    again = delta_night(archive, out, D2, scheduler)  # the same day, run again
    assert first.changes["history_truncated"] == 1 and again.changes["history_truncated"] == 0
    history = DeltaTable(str(out / HISTORY)).to_pyarrow_table(
        filters=[("night", "=", "2026-12-02")])
    runs = {r["run_id"] for r in history.to_pylist() if r["code"] == "history_truncated"}
    assert runs == {first.run.run_id}  # kept beside the rerun's findings
    nights = DeltaTable(str(out / NIGHTS)).to_pyarrow_table().to_pylist()
    assert sorted(r["run_id"] for r in nights if r["night"] == "2026-12-02") == sorted(
        [first.run.run_id, again.run.run_id])


def test_a_night_that_fails_inside_its_commit_leaves_the_earlier_ones_intact(
    archive: Path, tmp_path: Path, scheduler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    delta_night(archive, out, D1, scheduler)
    reference = {d: as_of(out, D1, d) for d in DATASETS}
    grow_session(resolve(str(archive)), clean_sessions(archive)[0], entries=2)
    real = nt.Tables.write

    def failing(self: nt.Tables, name: str, *args: Any, **kw: Any) -> int:
        if name == "usage":
            raise CommitError("usage: commit failed (injected)")
        return real(self, name, *args, **kw)

    monkeypatch.setattr(nt.Tables, "write", failing)
    with pytest.raises(CommitError):
        delta_night(archive, out, D2, scheduler)
    monkeypatch.setattr(nt.Tables, "write", real)
    # integrity/sessions got a version past the night's; night D1 still reads as it was.
    assert DeltaTable(str(out / "integrity/sessions")).version() > \
        night_versions(resolve(str(out)))["integrity/sessions"]
    assert {d: as_of(out, D1, d) for d in DATASETS} == reference
    # The next run puts every table back to D1's version first, then reads the change.
    again = delta_night(archive, out, D2, scheduler)
    assert again.changes["changed"] == 1
    fresh = tmp_path / "fresh"
    delta_night(archive, fresh, D2, scheduler)
    for dataset in DATASETS:
        assert as_of(out, D2, dataset) == as_of(fresh, D2, dataset), dataset


def test_another_root_is_refused_unless_allowed(
    archive: Path, tmp_path: Path, scheduler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    shutil.copytree(archive, other)
    for layout in ("delta", "partitions"):
        out = tmp_path / f"out-{layout}"
        base = ["nightly", "--out", str(out), "--scheduler", scheduler, "--no-progress",
                "--format", layout]
        assert run([*base[:1], str(archive), *base[1:], "--date", "2026-12-01"]) == 0
        capsys.readouterr()
        assert run([*base[:1], str(other), *base[1:], "--date", "2026-12-02"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--allow-other-root" in err, err
        assert run([*base[:1], str(other), *base[1:], "--date", "2026-12-02",
                    "--allow-other-root"]) == 0


def test_the_same_archive_named_from_another_folder_is_the_same_root(
    archive: Path, tmp_path: Path, scheduler: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """Nights name their archive as given (`./archive` from its parent, an absolute path
    from cron): compared by where it is, not by how it was written. A relative name that
    now points elsewhere is another archive."""
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(archive, elsewhere / archive.name)
    for layout in ("delta", "partitions"):
        out = tmp_path / f"out-{layout}"
        base = ["--out", str(out), "--scheduler", scheduler, "--no-progress",
                "--format", layout]
        monkeypatch.chdir(archive.parent)
        assert run(["nightly", archive.name, *base, "--date", "2026-12-01"]) == 0
        assert run(["nightly", str(archive), *base, "--date", "2026-12-02"]) == 0
        monkeypatch.chdir(elsewhere)  # the same name, another archive
        capsys.readouterr()
        assert run(["nightly", archive.name, *base, "--date", "2026-12-03"]) == 2
        assert f"file://{archive}" in capsys.readouterr().err


def test_an_output_of_the_other_layout_is_refused(
    archive: Path, tmp_path: Path, scheduler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A night of one layout pointed at the other's nights stops with one line, exit 2,
    and writes nothing: it would run as a first night and lose the history checks."""
    for first, then in (("partitions", "delta"), ("delta", "partitions")):
        out = tmp_path / f"out-{first}"
        base = ["nightly", str(archive), "--out", str(out), "--scheduler", scheduler,
                "--no-progress"]
        assert run([*base, "--format", first, "--date", "2026-12-01"]) == 0
        before = sorted(p.relative_to(out) for p in out.rglob("*"))
        capsys.readouterr()
        assert run([*base, "--format", then, "--date", "2026-12-02"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "another --out" in err, err
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_keep_days_expires_old_versions_never_the_newest(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    out = tmp_path / "out"
    delta_night(archive, out, D1, scheduler)
    grow_session(resolve(str(archive)), clean_sessions(archive)[0], entries=2)
    delta_night(archive, out, D2, scheduler)
    newest = {d: as_of(out, D2, d) for d in DATASETS}
    grow_session(resolve(str(archive)), clean_sessions(archive)[1], entries=2)
    delta_night(archive, out, D3, scheduler, keep_days=0)
    after = {d: as_of(out, D3, d) for d in DATASETS}
    assert after != newest  # D3 read the growth
    fresh = tmp_path / "fresh"
    delta_night(archive, fresh, D3, scheduler)
    assert after == {d: as_of(fresh, D3, d) for d in DATASETS}
    with pytest.raises(ExpiredVersionError, match=r"version 0 no longer reads: .* expired"):
        read_night(resolve(str(out)), "usage", D1)  # D1's files are expired
    # The dashboard shows the nights that still read, and says which did not (before:
    # exit 2 on the first expired night, for as long as the output kept any).
    page = dashboard_job(resolve(str(out)), html=resolve(str(tmp_path / "page.html")))
    assert page.expired[:1] == [D1.isoformat()] and page.nights[-1].label == D3.isoformat()
    assert [*page.expired, *(n.label for n in page.nights)] == \
        [d.isoformat() for d in (D1, D2, D3)]
    assert "not shown, their tables expired by --keep-days" in \
        (tmp_path / "page.html").read_text()


def test_tables_without_their_nights_table_refuse_a_first_night(
    archive: Path, tmp_path: Path, scheduler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    delta_night(archive, out, D1, scheduler)
    shutil.rmtree(out / NIGHTS)
    cmd = ["nightly", str(archive), "--out", str(out), "--format", "delta", "--date",
           "2026-12-02", "--scheduler", scheduler, "--no-progress"]
    assert run(cmd) == 2
    assert "--rebaseline" in capsys.readouterr().err
    assert run([*cmd, "--rebaseline"]) == 0


def _data_file(table: Path) -> Path:
    return sorted(table.rglob("part-*.parquet"))[0]


def _newest_log(table: Path) -> Path:
    return sorted((table / "_delta_log").glob("*.json"))[-1]


#: Damage done to a Delta nightly output outside vakpipe (a lifecycle rule, a vacuum with
#: a short retention, a partial copy), and what the one line then says.
GONE = "the Delta table is damaged: its data file "
DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "a data file of nights gone": (lambda out: _data_file(out / NIGHTS).unlink(),
                                   f"nights: {GONE}"),
    "a data file of usage gone": (lambda out: _data_file(out / "usage").unlink(),
                                  f"usage: {GONE}"),
    "a data file of usage not Parquet": (
        lambda out: _data_file(out / "usage").write_bytes(b"not parquet"),
        "usage: the Delta table is damaged: its data file "),
    "a log entry that does not parse": (
        lambda out: _newest_log(out / NIGHTS).open("a").write("garbage{\n"),
        "nights: the Delta table cannot be read (DeltaError: "),
}


def test_a_damaged_table_is_one_line_for_its_readers_never_a_crash(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    """Through the entry point: a scan that failed on one file while Arrow's threads
    still read others aborted the process at exit (exit 134, "terminate called without
    an active exception"), after a message that blamed a newer commit."""
    built = tmp_path / "built"
    delta_night(archive, built, D1, scheduler)
    for name, (damage, said) in DAMAGES.items():
        out = tmp_path / name.replace(" ", "-")
        shutil.copytree(built, out)
        damage(out)
        readers = [["cost", str(out)], ["dashboard", str(out), "--html",
                                        str(tmp_path / f"{out.name}.html")]]
        if "usage" not in name:  # the nightly reads nights, never the rows it keeps
            readers.append(["nightly", str(archive), "--out", str(out), "--format",
                            "delta", "--date", "2026-12-02", "--workers", "0",
                            "--no-progress"])
        for args in readers:
            done = subprocess.run([vakpipe_exe(), *args], text=True,
                                  capture_output=True, timeout=120, check=False)
            lines = done.stderr.strip().splitlines()
            assert (done.returncode, len(lines)) == (2, 1), (name, args[0], done.stderr)
            assert lines[0].startswith("vakpipe: error: ") and said in lines[0], \
                (name, args[0], lines[0])
            assert ".parquet is gone; " in lines[0] if "gone" in name else True
            assert ".parquet does not read (ArrowInvalid: " in lines[0] \
                if "not Parquet" in name else True
        if "usage" in name:  # a state table: a night with --rebaseline rewrites it whole
            assert "or run the nightly with --rebaseline" in lines[0]
            assert run(["nightly", str(archive), "--out", str(out), "--format", "delta",
                        "--date", "2026-12-02", "--rebaseline", "--workers", "0",
                        "--no-progress"]) == 0
            assert run(["cost", str(out)]) == 0
        elif "data file" in name:
            assert "or start the nightly over into a new --out" in lines[0]


def test_a_delta_rs_error_is_one_line_without_its_colours_and_backtrace() -> None:
    storage = OSError("Kernel error -> Generic S3 error\n  \x1b[31m\u21b3\x1b[0m "
                      "Error performing GET http://127.0.0.1:1/b/_delta_log\n"
                      "   \x1b[31m\u21b3\x1b[0m HTTP error")
    assert error_text(storage) == ("OSError: Kernel error -> Generic S3 error Error "
                                   "performing GET http://127.0.0.1:1/b/_delta_log HTTP error")
    log = ValueError("Kernel error: Json error: unexpected 'g'\n   0: <unknown>\n"
                     "  12: start_thread\n             at ./nptl/pthread_create.c:442:8\n")
    assert error_text(log) == "ValueError: Kernel error: Json error: unexpected 'g'"
    assert error_text(OSError()) == "OSError"


def test_a_state_table_gone_or_set_back_is_refused_until_a_rebaseline(
    archive: Path, tmp_path: Path, scheduler: str
) -> None:
    """Before: a night started a deleted table over with its own rows only (every session
    carried forward lost from it, in silence), and tried to "restore" a table copied
    back from an older night to a version its log did not have."""
    out, older = tmp_path / "out", tmp_path / "older-usage"
    delta_night(archive, out, D1, scheduler)
    shutil.copytree(out / "usage", older)
    grow_session(resolve(str(archive)), clean_sessions(archive)[0], entries=2)
    delta_night(archive, out, D2, scheduler)
    whole = as_of(out, D2, "usage")
    shutil.rmtree(out / "usage")
    with pytest.raises(BaselineError, match=r"usage: the Delta table is gone, but the "
                                            r"2026-12-02 night names its version 1"):
        delta_night(archive, out, D3, scheduler)
    shutil.copytree(older, out / "usage")
    with pytest.raises(BaselineError, match=r"is at version 0, but .* --rebaseline"):
        delta_night(archive, out, D3, scheduler)
    delta_night(archive, out, D3, scheduler, rebaseline=True)
    assert as_of(out, D3, "usage") == whole


def test_created_day_follows_the_uuidv7_then_the_first_timestamp() -> None:
    assert created_day("0199a1f2-5f00-7000-8000-00000000abcd", None) == "2025-10-01"
    assert created_day("not-a-uuid", 1_764_547_200 * 10**9) == "2025-12-01"
    assert created_day(None, None) == "unknown"


def test_smoke_s3_two_nights_through_the_cli(s3: object, scheduler: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    root, out = f"s3://{BUCKET}/archive", f"s3://{BUCKET}/reports/nightly"
    write_fleet(resolve(root), sessions=4, seed=11, size_scale=0.5, consistent=False)
    for day in (D1, D2):
        assert run(["nightly", root, "--out", out, "--date", day.isoformat(), "--format",
                    "delta", "--scheduler", scheduler, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "4 new" in printed and "4 unchanged (carried forward)" in printed
    loc = resolve(out)
    v1, v2 = night_versions(loc, D1), night_versions(loc, D2)
    assert {k: v for k, v in v1.items() if k != HISTORY} == \
        {k: v for k, v in v2.items() if k != HISTORY}
    usage = read_night(loc, "usage", D2)
    assert usage.num_rows > 0 and isinstance(usage, pa.Table)


def test_cost_and_regress_read_a_night_of_the_tables(
    archive: Path, tmp_path: Path, scheduler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tables, parts = tmp_path / "tables", tmp_path / "parts"
    delta_night(archive, tables, D1, scheduler)
    run_nightly(resolve(str(archive)), resolve(str(parts)), ReplayOptions(), day=D1,
                scheduler=scheduler, progress=False)
    grow_session(resolve(str(archive)), clean_sessions(archive)[0], entries=2)
    delta_night(archive, tables, D2, scheduler)
    capsys.readouterr()
    assert run(["cost", str(tables / "night=2026-12-01"), "--report-dir",
                str(tmp_path / "c-delta")]) == 0
    from_tables = capsys.readouterr().out
    assert run(["cost", str(parts / "date=2026-12-01"), "--report-dir",
                str(tmp_path / "c-parts")]) == 0
    from_parts = capsys.readouterr().out
    figures = [line for line in from_parts.splitlines() if "$" in line]
    assert figures and figures == [line for line in from_tables.splitlines() if "$" in line]
    # A night the output did not commit: said so, with its nights (before: "no committed
    # run ... audit it", or for night=2026-13-45 a traceback).
    for missing, nights in ((tables / "night=2026-11-30", "2026-12-01 ... 2026-12-02 (2)"),
                            (parts / "date=2026-11-30", "2026-12-01")):
        assert run(["cost", str(missing)]) == 2
        assert capsys.readouterr().err.endswith(
            f"has no night committed on 2026-11-30; its nights: {nights}\n")
    assert run(["dashboard", str(parts / "date=2026-11-30"), "--html",
                str(tmp_path / "d.html")]) == 2
    assert "has no night committed on 2026-11-30" in capsys.readouterr().err
    assert run(["cost", str(tables / "night=2026-13-45")]) == 2
    assert "night=2026-13-45 is not a date" in capsys.readouterr().err
    # The newest night, as the baseline of a regression check.
    assert run(["regress", str(archive), "--out", str(tmp_path / "reg"), "--candidate", "v1",
                "--baseline-run", str(tables), "--scheduler", scheduler,
                "--no-progress"]) == 0
    summary = json.loads((tmp_path / "reg" / "regression-summary.json").read_text())
    assert summary["requests_changed"] == 0, summary


def test_a_predicate_replaces_exactly_the_paths_it_names(tmp_path: Path) -> None:
    """Quotes and SQL-looking text in a session path stay data."""
    from pipeline.io.delta import Tables, in_predicate

    tables = Tables(resolve(str(tmp_path / "out")))
    paths = ["a'b.jsonl", "x' OR '1'='1", "plain.jsonl"]
    table = pa.table({"session_path": paths, "n": [1, 2, 3], "created": ["d"] * 3})
    tables.write("t", table, mode="overwrite", partition_by=["created"])
    tables.write("t", pa.table({"session_path": paths[:2], "n": [10, 20],
                                "created": ["d", "d"]}),
                 mode="overwrite", partition_by=["created"],
                 predicate=in_predicate("session_path", paths[:2]))
    found = DeltaTable(str(tmp_path / "out" / "t")).to_pyarrow_table().sort_by("n")
    assert found["n"].to_pylist() == [3, 10, 20]


def test_s3_options_reach_delta_rs_under_its_names() -> None:
    from pipeline.io.delta import delta_storage_options

    loc = resolve("s3://b/out", {"key": "K", "secret": "S",
                                 "client_kwargs": {"endpoint_url": "http://127.0.0.1:9",
                                                   "region_name": "eu-west-1"}})
    found = delta_storage_options(loc)
    assert found["AWS_ACCESS_KEY_ID"] == "K" and found["AWS_SECRET_ACCESS_KEY"] == "S"
    assert found["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
    assert found["AWS_ALLOW_HTTP"] == "true" and found["AWS_REGION"] == "eu-west-1"
