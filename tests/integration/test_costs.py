"""The cost report: usage rows, billed / effective / wasted, pricing, grouping, the CLI
(docs/cost-rules.md, "Billed, effective, wasted" and "The cost report").

The rules are checked on hand-built ledgers priced with a test table where a token costs
whole dollars ($1 input, $2 output, $0.10 cache read, $1.25 cache write; twice that above
1,000 prompt tokens), so every expected amount can be read off the ledger. The CLI runs
on a small generated fleet audited (with replay) on the session's Dask cluster.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from dataclasses import replace
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs

from pipeline.audit.session import SessionAudit
from pipeline.cli import EXIT_OK, EXIT_UNUSABLE, run
from pipeline.costs.html import CostPage, packet_summary, render
from pipeline.costs.pricing import Price, Rates, Tier
from pipeline.costs.report import (
    CostReport,
    cost_schema,
    in_window,
    parse_by,
    price_usage,
    unknown_lines,
)
from pipeline.errors import UsageError
from pipeline.io.commit import read_dataset
from pipeline.io.storage import resolve
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from pipeline.tables.schemas import COMPACTION_SCHEMA, USAGE_SCHEMA, usage_table
from tests.helpers.ledgers import (
    LedgerBuilder,
    attempt,
    audit_bytes,
    session_key,
    usage,
)
from tests.helpers.storage import BUCKET

D = Decimal
PROVIDER, MODEL = "ollama", "gemma4:e2b-mlx"  # what LedgerBuilder writes


def _rates(i: str, o: str, r: str, w: str) -> Rates:
    return Rates(*(D(x) * 1_000_000 for x in (i, o, r, w)))  # USD per token, per million


class Prices:
    """A test price table: exact (provider, model) pairs."""

    def __init__(self, rules: dict[tuple[str, str], Price]) -> None:
        self.rules = rules

    def lookup(self, provider: str | None, model: str | None) -> Price | None:
        return self.rules.get((provider or "", model or ""))


TIER = Tier(1000, _rates("2", "4", "0.2", "2.5"))
PRICES = Prices({
    (PROVIDER, MODEL): Price(PROVIDER, MODEL, _rates("1", "2", "0.1", "1.25"), TIER),
    (PROVIDER, "other"): Price(PROVIDER, "other", _rates("10", "20", "1", "12.5")),
})


def rows_of(*builders: LedgerBuilder) -> pa.Table:
    audits: list[SessionAudit] = []
    for n, b in enumerate(builders):
        sid = f"0199a1f2-5f00-7000-8000-{n:012x}"
        audits.append(audit_bytes(b.to_bytes(), session_key(sid)))
    return usage_table(audits)


def header(b: LedgerBuilder, n: int = 0) -> str:
    return b.header(session_id=f"0199a1f2-5f00-7000-8000-{n:012x}")


def request(b: LedgerBuilder, u: dict[str, int] | None, *attempts: dict[str, Any],
            winning: int | None = 0, **env: Any) -> str:
    """An assistant message (``meta.usage`` = ``u``) and, with attempts, its receipt."""
    a = b.assistant(u=u, **env)
    if attempts:
        b.receipt(list(attempts), winning=winning, parent=a, **env)
    return a


def totals(report: CostReport) -> dict[str, Decimal]:
    return {m: c.total for m, c in report.totals.items()}


def only_row(report: CostReport) -> dict[str, Any]:
    (row,) = report.table.to_pylist()
    return row


# --- usage rows -------------------------------------------------------------------------


def test_usage_rows_tie_attempts_to_their_message_and_resolve_provider_and_model() -> None:
    b = LedgerBuilder()
    header(b)
    b.user()
    own = attempt(1, u=usage(3, 1))
    own.update(provider="acme", model="rocket")
    a = request(b, usage(3, 1), attempt(0, "failed", usage(2, 0)), own, winning=1)
    # A receipt with no provider and no model of its own falls back to the header's.
    b.entry("receipt", {"purpose": "summarize", "provider": "", "winning_attempt": 0,
                        "attempts": [attempt(0, u=usage(1, 1))], "prefix_digest": ""})
    rows = rows_of(b).drop(["ts"]).to_pylist()
    assert [(r["kind"], r["ordinal"], r["settlement"], r["winning"]) for r in rows] == [
        ("message", None, None, None), ("attempt", 0, "failed", False),
        ("attempt", 1, "ok", True), ("attempt", 0, "ok", True)]
    assert [r["request_id"] for r in rows] == [a, a, a, None]
    assert [(r["provider"], r["model"]) for r in rows] == [
        (PROVIDER, MODEL), (PROVIDER, MODEL), ("acme", "rocket"), (PROVIDER, MODEL)]
    assert [r["purpose"] for r in rows] == [None, "execute", "execute", "summarize"]
    assert all(r["on_active_chain"] and r["day"] == date(2026, 9, 21) for r in rows)
    assert rows[0]["session_id"] == "0199a1f2-5f00-7000-8000-000000000000"
    assert usage_table([]).schema == USAGE_SCHEMA


def test_large_sessions_are_converted_in_chunks_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.tables.schemas as tables

    monkeypatch.setattr(tables, "USAGE_CHUNK", 3)
    audits = []
    for n, requests in enumerate((2, 10, 1, 1)):  # large, large, small, small
        b = LedgerBuilder()
        header(b, n)
        b.user()
        for _ in range(requests):
            request(b, usage(1, 1), attempt(0, u=usage(1, 1)))
        audits.append(audit_bytes(b.to_bytes(), session_key(f"0199a1f2-5f00-7000-8000-{n:012x}")))
    expected = [(a.row["session_id"], r[0]) for a in audits for r in a.usage]
    t = usage_table(audits)
    assert list(zip(t["session_id"].to_pylist(), t["entry_id"].to_pylist(),
                    strict=True)) == expected
    assert all(not a.usage for a in audits)  # consumed as converted
    assert max(len(batch) for batch in t.to_batches()) <= 3


# --- billed, effective, wasted ------------------------------------------------------------


def test_a_retried_receipt_bills_every_attempt_once() -> None:
    b = LedgerBuilder()
    header(b)
    b.user()
    request(b, usage(10, 1), attempt(0, "failed", usage(10, 0)),
            attempt(1, "failed", usage(10, 0), reason="retry"),
            attempt(2, "ok", usage(10, 1), reason="retry"), winning=2)
    t = rows_of(b)
    assert t["billed"].to_pylist() == [False, True, True, True]  # the message: its receipt
    assert t["waste"].to_pylist() == [None, "retry", "retry", None]
    report = price_usage(t, PRICES)
    assert totals(report) == {"billed": D(32), "effective": D(12), "wasted": D(20),
                              "wasted_abandoned": D(0), "wasted_retry": D(20)}
    row = only_row(report)
    assert (row["records"], row["requests"]) == (3, 1)
    assert (row["billed_tokens"], row["effective_tokens"], row["wasted_retry_tokens"]) == (
        31, 11, 20)


def test_an_abandoned_branch_is_billed_and_wasted() -> None:
    b = LedgerBuilder()
    root = header(b)
    b.user("first try")
    request(b, usage(5, 1), attempt(0, u=usage(5, 1)))
    b.branch_at(root)  # re-asked: the first branch is abandoned
    b.user("second try")
    request(b, usage(7, 2), attempt(0, u=usage(7, 2)))
    t = rows_of(b)
    assert t["on_active_chain"].to_pylist() == [False, False, True, True]
    assert t["waste"].to_pylist() == [None, "abandoned", None, None]
    assert totals(price_usage(t, PRICES)) == {
        "billed": D(18), "effective": D(11), "wasted": D(7), "wasted_abandoned": D(7),
        "wasted_retry": D(0)}


def test_a_message_and_its_receipt_are_one_request_not_two() -> None:
    b = LedgerBuilder()
    header(b)
    b.user()
    request(b, usage(4, 1), attempt(0, u=usage(4, 1)))  # both: billed once, by the receipt
    request(b, usage(3, 0))  # no receipt: the message's usage is the bill
    request(b, None, attempt(0, u=usage(2, 0)))  # no meta.usage: the receipt's
    request(b, usage(5, 0), attempt(0, "failed"), winning=None)  # a receipt without usage
    a = request(b, usage(1, 0), attempt(0, u=usage(1, 0)))
    # A second receipt of an answered message billed it again: a retry, not effective.
    b.receipt([attempt(0, u=usage(1, 0))], winning=0, parent=a)
    t = rows_of(b)
    assert t["kind"].to_pylist() == ["message", "attempt", "message", "attempt", "message",
                                     "message", "attempt", "attempt"]
    assert t["billed"].to_pylist() == [False, True, True, True, True, False, True, True]
    assert t["effective"].to_pylist() == [False, True, True, True, True, False, True, False]
    report = price_usage(t, PRICES)
    assert totals(report)["billed"] == D(6 + 3 + 2 + 5 + 1 + 1)
    assert totals(report)["wasted_retry"] == D(1)
    assert only_row(report)["requests"] == 5


def test_cache_reads_and_writes_are_priced_apart() -> None:
    b = LedgerBuilder()
    header(b)
    b.user()
    request(b, None, attempt(0, u=usage(1, 1, cache_read=10, cache_creation=4)))
    row = only_row(price_usage(rows_of(b), PRICES))
    assert (row["billed_input_usd"], row["billed_output_usd"]) == (1.0, 2.0)
    assert (row["billed_cache_read_usd"], row["billed_cache_write_usd"]) == (1.0, 5.0)
    assert (row["billed_cache_read_tokens"], row["billed_cache_write_tokens"]) == (10, 4)
    assert row["billed_usd"] == 9.0 and row["billed_tokens"] == 16


def test_an_unknown_model_is_flagged_never_priced_and_named() -> None:
    b = LedgerBuilder()
    header(b)
    b.user()
    odd = attempt(0, u=usage(100, 50))
    odd["model"] = "mystery-9"
    request(b, None, odd)
    request(b, None, attempt(0, u=usage(1, 0)))
    report = price_usage(rows_of(b), PRICES, ["model"])
    by_model = {r["model"]: r for r in report.table.to_pylist()}
    assert by_model["mystery-9"]["unknown_model"] and by_model["mystery-9"]["billed_usd"] == 0
    assert by_model["mystery-9"]["unknown_tokens"] == 150
    assert not by_model[MODEL]["unknown_model"] and by_model[MODEL]["billed_usd"] == 1.0
    assert report.totals["billed"].unknown_model
    assert [(u.provider, u.model, u.records, u.tokens) for u in report.unknown] == [
        (PROVIDER, "mystery-9", 1, 150)]
    (line,) = unknown_lines(report.unknown)
    assert "ollama/mystery-9" in line and "150 billed tokens" in line and "NOT PRICED" in line


def test_the_tier_is_decided_per_request_on_its_whole_prompt() -> None:
    b = LedgerBuilder()
    header(b)
    b.user()
    request(b, None, attempt(0, u=usage(600, 0)))
    request(b, None, attempt(0, u=usage(400, 0, cache_read=300, cache_creation=300)))  # 1000
    request(b, None, attempt(0, u=usage(400, 0, cache_read=300, cache_creation=301)))  # 1001
    report = price_usage(rows_of(b), PRICES)
    base = D(600) + D(400) + D(30) + D("375")
    tiered = D(800) + D(60) + D("752.5")
    assert totals(report)["billed"] == base + tiered
    assert only_row(report)["tiered_records"] == 1


def test_grouping_by_day_model_session_agent_and_provider() -> None:
    one, two = LedgerBuilder(), LedgerBuilder()
    header(one, 0)
    one.user()
    request(one, None, attempt(0, u=usage(1, 0)), ts="2026-09-21T10:00:00Z")
    other = attempt(0, u=usage(1, 0))
    other["model"] = "other"
    request(one, None, other, ts="2026-09-21T11:00:00Z")
    request(one, None, attempt(0, u=usage(2, 0)), ts="2026-09-22T00:00:00.500Z")
    header(two, 1)
    two.user()
    request(two, None, attempt(0, u=usage(4, 0)), ts="2026-09-22T23:59:59.999999999Z")
    t = rows_of(one, two)
    got = price_usage(t, PRICES, parse_by("day,model")).table
    assert got.schema == cost_schema(("day", "model"))
    assert [(r["day"], r["model"], r["billed_usd"]) for r in got.to_pylist()] == [
        (date(2026, 9, 21), MODEL, 1.0), (date(2026, 9, 21), "other", 10.0),
        (date(2026, 9, 22), MODEL, 6.0)]
    sessions = price_usage(t, PRICES, ["session"]).table.to_pylist()
    assert [(r["session_id"][-1], r["billed_usd"]) for r in sessions] == [("0", 13.0), ("1", 4.0)]
    (row,) = price_usage(t, PRICES, ["agent", "provider"]).table.to_pylist()
    assert (row["agent"], row["provider"], row["billed_usd"]) == ("vak", PROVIDER, 17.0)
    window = in_window(t, since=date(2026, 9, 22), until=date(2026, 9, 22))
    assert totals(price_usage(window, PRICES))["billed"] == D(6)
    assert in_window(t, until=date(2026, 9, 20)).num_rows == 0
    for bad in ("day,day", "year"):  # week is a period now (issue 23)
        with pytest.raises(UsageError):
            parse_by(bad)
    assert parse_by("") == () and parse_by(" model , day") == ("model", "day")


# --- the page -----------------------------------------------------------------------------


def test_the_page_says_what_the_run_lacks_and_lists_sessions_needing_packets() -> None:
    b = LedgerBuilder()
    header(b)
    b.user()
    request(b, None, attempt(0, u=usage(1, 0)))
    t = rows_of(b)
    by_day = price_usage(t, PRICES, ["day"])
    page = CostPage(source="x", run_id="r", window="all", prices="test", by=("day",),
                    totals=price_usage(t, PRICES), grouped=by_day,
                    daily_by_model=price_usage(t, PRICES, ["day", "model"]), daily=by_day,
                    saturation=None, hints=None, packets=None)
    text = render(page)
    assert "no replay in this run" in text and "no compaction table in this run" in text
    compaction = pa.Table.from_pylist(
        [{"session_path": "s/a.jsonl", "packet_id": "p1", "turns_covered": 3,
          "tokens_before": 900, "superseded": False, "model": "m"},
         {"session_path": "s/a.jsonl", "packet_id": "p0", "turns_covered": 2,
          "tokens_before": 500, "superseded": True, "model": "m"}], schema=COMPACTION_SCHEMA)
    packets = packet_summary(compaction)
    assert (packets.sessions, packets.packets) == (1, 1)
    assert "s/a.jsonl" in render(replace(page, packets=packets))


# --- the CLI ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def audited(dask_scheduler: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generated fleet plus one session of an unknown model, audited with replay."""
    root = tmp_path_factory.mktemp("cost-fleet")
    write_fleet(resolve(str(root)), sessions=6, seed=5, size_scale=0.3)
    b = LedgerBuilder()
    header(b, 7)
    b.user()
    odd = attempt(0, u=usage(1000, 10))
    odd.update(provider="acme", model="mystery-1")
    request(b, None, odd)
    path = root / session_key("0199a1f2-5f00-7000-8000-000000000007").path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b.to_bytes())
    out = tmp_path_factory.mktemp("cost-out")
    code = run(["audit", str(root), "--out", str(out), "--replay", "--scheduler",
                dask_scheduler, "--no-progress"])
    assert code == EXIT_OK
    return out


EXTERNAL = re.compile(r"<(?:script|link|img|iframe)\b[^>]*(?:src|href)\s*=\s*[\"']?(?:https?:)?//",
                      re.IGNORECASE)


def test_cost_command_writes_tables_and_an_offline_report(
        audited: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run(["cost", str(audited)]) == EXIT_OK
    captured = capsys.readouterr()
    assert "vakpipe: warning: unknown model acme/mystery-1: 1,010 billed tokens" in captured.err
    assert "billed" in captured.out and "NOT PRICED" in captured.out
    folder = audited / "cost"
    assert sorted(p.name for p in folder.iterdir()) == ["_manifest.json", "costs.csv",
                                                        "costs.parquet", "report.html"]
    table = pq.read_table(folder / "costs.parquet")
    assert table.schema == cost_schema(("day", "model"))
    usage_rows = read_dataset(resolve(str(audited)), "usage")
    assert table.num_rows > 1 and usage_rows.num_rows > table.num_rows
    with open(folder / "costs.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == table.num_rows
    page = (folder / "report.html").read_text()
    assert not EXTERNAL.search(page)
    assert page.count('class="plotly-graph-div"') == 3  # by model, split, saturation
    assert "Plotly.newPlot" in page and "mystery-1" in page
    assert "no compaction table in this run" in page


def test_cost_command_window_grouping_and_report_dir(audited: Path, tmp_path: Path) -> None:
    days = sorted({d for d in read_dataset(resolve(str(audited)), "usage")["day"].to_pylist()})
    first = days[0].isoformat()
    where = tmp_path / "rep"
    assert run(["cost", str(audited), "--since", first, "--until", first,
                "--by", "session,provider", "--report-dir", str(where)]) == EXIT_OK
    table = pq.read_table(where / "costs.parquet")
    assert table.column_names[:3] == ["session_path", "session_id", "provider"]
    assert (where / "report.html").exists() and (where / "costs.csv").exists()
    assert not (where / "cost").exists()
    # The day's total is the same however it is grouped.
    assert run(["cost", str(audited), "--by", "day", "--report-dir", str(tmp_path / "d")]) == 0
    by_day = pq.read_table(tmp_path / "d" / "costs.parquet").to_pylist()
    same = [r["billed_usd"] for r in by_day if r["day"] == days[0]]
    assert sum(table["billed_usd"].to_pylist()) == pytest.approx(sum(same))


@pytest.mark.parametrize(("args", "names"), [
    (["--by", "year"], ["--by", "year"]),
    (["--since", "2026-09-02", "--until", "2026-09-01"], ["--since"]),
])
def test_bad_cost_options_are_one_line_errors(audited: Path, args: list[str], names: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert run(["cost", str(audited), *args]) == EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vakpipe: error: ")
    assert all(n in err for n in names)


def test_cost_of_a_folder_without_a_run_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["cost", str(tmp_path)]) == EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path}: no committed run" in err
    # a path with nothing at all (a typo) says so
    assert run(["cost", str(tmp_path / "typo")]) == EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "typo: nothing is there, so no committed run" in err


def test_cost_of_a_run_without_a_usage_table_is_a_one_line_error(
        audited: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run committed before the usage table existed: one line naming it, exit 2."""
    old = tmp_path / "old-run"
    shutil.copytree(audited, old)
    manifest = json.loads((old / "_manifest.json").read_text("utf-8"))
    del manifest["datasets"]["usage"]
    (old / "_manifest.json").write_text(json.dumps(manifest), "utf-8")
    capsys.readouterr()
    assert run(["cost", str(old)]) == EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its run has no usage table" in err


def test_cost_report_on_s3(audited: Path, s3: LocalS3,
                           capsys: pytest.CaptureFixture[str]) -> None:
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for path in audited.rglob("*"):
        if path.is_file() and "cost" not in path.relative_to(audited).parts:
            fs.pipe_file(f"{BUCKET}/out/{path.relative_to(audited).as_posix()}",
                         path.read_bytes())
    capsys.readouterr()
    assert run(["cost", f"s3://{BUCKET}/out", "--by", "model"]) == EXIT_OK
    assert "acme/mystery-1" in capsys.readouterr().err
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{BUCKET}/out/cost")) == [
        "_manifest.json", "costs.csv", "costs.parquet", "report.html"]
    table = pq.read_table(io.BytesIO(fs.cat_file(f"{BUCKET}/out/cost/costs.parquet")))
    assert table.column_names[0] == "model"


def test_a_report_with_a_link_among_its_files_writes_none_of_them(tmp_path: Path) -> None:
    """Every path of a report is checked before its first file is written: a link where
    its second file goes leaves the first untouched (no new file beside the previous
    report's manifest), and nothing is written through the link."""
    from jobs.cost_report import COSTS_CSV, COSTS_PARQUET, publish
    from pipeline.errors import UnsafeOutputError

    out = tmp_path / "out"
    (out / "cost").mkdir(parents=True)
    outside = tmp_path / "outside.csv"
    outside.write_bytes(b"keep")
    (out / "cost" / COSTS_CSV).symlink_to(outside)
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        publish(resolve(str(out / "cost")), {COSTS_PARQUET: b"new", COSTS_CSV: b"new"},
                base=resolve(str(out)))
    assert sorted(p.name for p in (out / "cost").iterdir()) == [COSTS_CSV]
    assert outside.read_bytes() == b"keep"


def test_a_report_cut_short_leaves_no_manifest_vouching_for_a_mix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that fills at report.html once left the new tables beside the previous
    report's page and manifest, which still named the previous run."""
    import errno

    import jobs.cost_report as cost_report
    from jobs.cost_report import COSTS_CSV, COSTS_PARQUET, REPORT_HTML, publish
    from pipeline.errors import StorageError

    dest = resolve(str(tmp_path / "cost"))
    publish(dest, {COSTS_PARQUET: b"old", COSTS_CSV: b"old", REPORT_HTML: b"old"},
            run_id="run-1")
    assert cost_report.read_report_manifest(dest)["run_id"] == "run-1"  # type: ignore[index]
    real = cost_report.write_small_file

    def full_at_the_page(out: Any, path: str, data: bytes) -> str:
        if path.endswith(REPORT_HTML):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(out, path, data)

    monkeypatch.setattr(cost_report, "write_small_file", full_at_the_page)
    with pytest.raises(StorageError, match="No space left on device"):
        publish(dest, {COSTS_PARQUET: b"new", COSTS_CSV: b"new", REPORT_HTML: b"new"},
                run_id="run-2")
    assert cost_report.read_report_manifest(dest) is None
    assert (tmp_path / "cost" / COSTS_PARQUET).read_bytes() == b"new"
    monkeypatch.setattr(cost_report, "write_small_file", real)
    publish(dest, {COSTS_PARQUET: b"new", COSTS_CSV: b"new", REPORT_HTML: b"new"},
            run_id="run-2")
    assert cost_report.read_report_manifest(dest)["run_id"] == "run-2"  # type: ignore[index]


@pytest.mark.parametrize("command", [
    ["cost", "OUT", "--report-dir", "ARCHIVE/report"],
    ["dashboard", "OUT", "--html", "ARCHIVE/page.html"],
    ["export", "otel", "OUT", "--file", "ARCHIVE/spans.json"],
])
def test_what_a_reader_of_a_run_writes_never_lands_in_the_archive_it_read(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """A report, page or export aimed into the archive the run read is refused (exit 2,
    one line), from any folder: the run was audited with a relative root from another
    one, and its manifest keeps the archive's absolute URL."""
    work = tmp_path / "work"
    write_fleet(resolve(str(work / "ARCHIVE")), sessions=2, seed=5, size_scale=0.2)
    monkeypatch.chdir(work)
    assert run(["audit", "ARCHIVE", "--out", "OUT", "--workers", "0", "--no-progress"]) \
        == EXIT_OK
    before = sorted(p.relative_to(work) for p in (work / "ARCHIVE").rglob("*"))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    argv = [f"work/{a}" if a.startswith(("OUT", "ARCHIVE")) else a for a in command]
    assert run(argv) == EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "inside the archive" in err, err
    assert sorted(p.relative_to(work) for p in (work / "ARCHIVE").rglob("*")) == before


def test_the_one_step_cost_refuses_a_report_in_the_archive_before_auditing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "archive"
    write_fleet(resolve(str(archive)), sessions=2, seed=5, size_scale=0.2)
    assert run(["cost", str(archive), "--out", str(tmp_path / "out"), "--report-dir",
                str(archive / "report"), "--workers", "0"]) == EXIT_UNUSABLE
    assert "inside the archive" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (archive / "report").exists()


@pytest.mark.parametrize("command", [["cost", "OUT"], ["dashboard", "OUT"],
                                     ["export", "otel", "OUT", "--file", "spans.json"]])
def test_a_damaged_table_of_the_run_is_one_line(
    command: list[str], audited: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "OUT"
    shutil.copytree(audited, out)
    for part in [*(out / "usage").glob("*.parquet"),
                 *(out / "integrity" / "sessions").glob("*.parquet")]:
        part.write_bytes(part.read_bytes()[:100])
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert run(command) == EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "table is damaged" in err, err


def test_by_repeated_joins_its_lists(audited: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`--by day --by model` is `--by day,model` (the last one alone, as click would keep
    it, would drop the day without a word)."""
    capsys.readouterr()
    docs = []
    for argv in (["--by", "day", "--by", "model"], ["--by", "day,model"]):
        assert run(["cost", str(audited), *argv, "--json", "--report-dir",
                    str(tmp_path / "_".join(argv))]) == EXIT_OK
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0]["by"] == docs[1]["by"] == ["day", "model"]
    assert docs[0]["rows"] == docs[1]["rows"]
    assert run(["cost", str(audited), "--by", "day", "--by", "day"]) == EXIT_UNUSABLE


def test_a_report_aimed_into_an_s3_archive_is_refused(s3: LocalS3,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    archive = f"s3://{BUCKET}/archive"
    write_fleet(resolve(archive), sessions=2, seed=5, size_scale=0.2)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    before = sorted(fs.find(f"{BUCKET}/archive"))
    assert run(["audit", archive, "--out", f"s3://{BUCKET}/out", "--workers", "0",
                "--no-progress"]) == EXIT_OK
    capsys.readouterr()
    for argv in (["cost", f"s3://{BUCKET}/out", "--report-dir", f"{archive}/report"],
                 ["cost", archive, "--out", f"s3://{BUCKET}/out2", "--report-dir",
                  f"{archive}/report", "--workers", "0"]):
        assert run(argv) == EXIT_UNUSABLE
        assert "inside the archive" in capsys.readouterr().err
    fs.invalidate_cache()
    assert sorted(fs.find(f"{BUCKET}/archive")) == before
    assert not fs.exists(f"{BUCKET}/out2")


@pytest.mark.parametrize("command", [
    ["cost", "OUT", "--report-dir", "OUT"],
    ["cost", "OUT", "--report-dir", "OUT/usage"],
    ["dashboard", "OUT", "--html", "OUT/_manifest.json"],
    ["export", "otel", "OUT", "--file", "OUT/integrity/spans.json"],
    ["cost", "NIGHTLY", "--report-dir", "NIGHTLY"],
    ["cost", "NIGHTLY", "--report-dir", "NIGHTLY/date=2026-12-01"],
    ["dashboard", "NIGHTLY", "--html", "NIGHTLY/date=2026-12-02/page.html"],
])
def test_what_a_reader_writes_never_replaces_a_run_s_files(
    command: list[str], audited: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """A report folder, page or export aimed at the run's own folder, a table's folder or
    a `_` file of it, or into a night of a nightly output, is refused (exit 2, one line)
    and every file stays as it was: `--report-dir OUT` replaced the run's manifest with
    the report's, and the run was gone."""
    shutil.copytree(audited, tmp_path / "OUT", ignore=shutil.ignore_patterns("cost"))
    for night in ("date=2026-12-01", "date=2026-12-02"):
        shutil.copytree(tmp_path / "OUT", tmp_path / "NIGHTLY" / night)

    def files() -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    before = files()
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert run(command) == EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "replace" in err, err
    assert files() == before


def test_a_report_never_replaces_another_run_s_manifest(
    audited: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--report-dir` at another run's output (or a nightly's folder of nights) is no
    report's folder: refused, the run intact (it was a vakpipe output, so it passed, and
    the report's _manifest.json replaced the run's). A report's own folder may hold
    other files beside the report."""
    other = tmp_path / "other"
    shutil.copytree(audited, other, ignore=shutil.ignore_patterns("cost"))
    nightly = tmp_path / "nightly"
    shutil.copytree(other, nightly / "date=2026-12-01")
    manifest = (other / "_manifest.json").read_bytes()
    capsys.readouterr()
    for dest in (other, nightly):
        assert run(["cost", str(audited), "--report-dir", str(dest)]) == EXIT_UNUSABLE
        assert "not a report's folder" in capsys.readouterr().err
    for argv in (["dashboard", str(audited), "--html", str(other / "_manifest.json")],
                 ["export", "otel", str(audited), "--file", str(other / "_SUCCESS")]):
        assert run(argv) == EXIT_UNUSABLE
        assert "keeps for itself" in capsys.readouterr().err
    assert (other / "_manifest.json").read_bytes() == manifest
    assert not (nightly / "_manifest.json").exists()
    mine = tmp_path / "mine"
    assert run(["cost", str(audited), "--report-dir", str(mine)]) == EXIT_OK
    (mine / "notes.txt").write_text("kept")
    assert run(["cost", str(audited), "--report-dir", str(mine)]) == EXIT_OK
    assert (mine / "notes.txt").read_text() == "kept"
