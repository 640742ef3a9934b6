"""The projection regression check: the pure comparison (``pipeline.replay.regress``) and
``vakpipe regress`` through the CLI entry point (``run``).

The CLI runs join the session's LocalCluster (``dask_scheduler``) and replay a fleet of
four small sessions; one smoke test reads and writes moto's S3 server.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from pipeline.cli import EXIT_FINDINGS, EXIT_OK, EXIT_UNUSABLE, run
from pipeline.io.storage import resolve
from pipeline.replay.regress import (
    ChangeLimit,
    ComparisonError,
    Thresholds,
    compare_requests,
    parse_change_limit,
    summarise,
)
from pipeline.run import orchestrate
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from pipeline.tables.schemas import REQUESTS_SCHEMA
from tests.helpers.storage import BUCKET, committed_rows, small_fleet

if TYPE_CHECKING:
    from distributed import Client

# --- the comparison ---------------------------------------------------------------------


def request(session: str, n: int, *, tokens: int = 100, digest: str | None = None,
            limit: int | None = 1000, hint: str = "none", rules: str = "v1") -> dict[str, Any]:
    """A ``requests`` row: request ``n`` (t1/i<n>) of ``session``."""
    return {"session_path": session, "entry_id": f"{session}-{n}", "scope": f"t1/i{n}",
            "turn": 1, "iteration": n, "model": "m", "rules": rules, "replayed_tokens": tokens,
            "request_digest": digest or f"d{n}", "model_input_limit": limit,
            "hint_level": hint}


def table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=REQUESTS_SCHEMA)


def test_identical_runs_change_nothing() -> None:
    rows = [request(s, n, tokens=10 * n) for s in ("a", "b") for n in range(1, 6)]
    pairs = compare_requests(table(rows), table(rows))
    assert pairs.num_rows == 10 and set(pairs["status"].to_pylist()) == {"same"}
    s = summarise(pairs)
    assert (s.requests_compared, s.requests_changed, s.requests_added, s.requests_removed) \
        == (10, 0, 0, 0)
    assert (s.sessions_compared, s.sessions_changed) == (2, 0)
    assert s.delta_changed.count == 0 and s.delta_changed.p50 is None
    assert (s.delta_all.min, s.delta_all.p50, s.delta_all.max, s.delta_all.sum) == (0, 0, 0, 0)
    assert (s.newly_over_window, s.newly_mandatory) == (0, 0)
    assert not Thresholds(ChangeLimit(Fraction(0)), 0).breaches(s)


def test_token_delta_percentiles() -> None:
    deltas = list(range(-10, 90))  # 100 deltas, negative ones included
    old = [request("a", n, tokens=1000) for n in range(100)]
    new = [request("a", n, tokens=1000 + d, digest=f"x{n}") for n, d in enumerate(deltas)]
    new.append(request("a", 100, tokens=7))  # added: no delta
    old.append(request("a", 101))  # removed: no delta
    pairs = compare_requests(table(old), table(new))
    s = summarise(pairs)
    assert (s.requests_compared, s.requests_changed, s.requests_added, s.requests_removed) \
        == (100, 100, 1, 1)
    # linear interpolation between ranks, as statistics' "inclusive" method does
    cuts = statistics.quantiles(deltas, n=100, method="inclusive")
    d = s.delta_changed
    assert (d.count, d.min, d.max, d.sum) == (100, -10, 89, sum(deltas))
    assert d.p50 == pytest.approx(cuts[49]) == pytest.approx(39.5)
    assert d.p95 == pytest.approx(cuts[94]) == pytest.approx(84.05)
    by_status = {r["entry_id"]: r for r in pairs.to_pylist()}
    assert by_status["a-100"]["status"] == "added" and by_status["a-100"]["token_delta"] is None
    assert by_status["a-101"]["status"] == "removed"
    assert by_status["a-101"]["new_request_digest"] is None
    assert by_status["a-0"]["token_delta"] == -10 and by_status["a-0"]["changed"]


def test_changed_is_the_digest_not_the_tokens() -> None:
    old = [request("a", 1, digest="same", tokens=10), request("b", 1, digest="one")]
    new = [request("a", 1, digest="same", tokens=10), request("b", 1, digest="two")]
    pairs = compare_requests(table(old), table(new))
    assert pairs["status"].to_pylist() == ["same", "changed"]  # session order
    s = summarise(pairs)
    assert (s.requests_changed, s.sessions_changed, s.delta_changed.sum) == (1, 1, 0)
    # an accounting-only change (an overhead) moves tokens, not digests
    more = [{**r, "replayed_tokens": r["replayed_tokens"] + 1} for r in old]
    s = summarise(compare_requests(table(old), table(more)))
    assert (s.requests_changed, s.requests_tokens_changed, s.delta_all.sum) == (0, 2, 2)


def test_new_overflow() -> None:
    old = [request("a", 1, tokens=900), request("a", 2, tokens=1100),
           request("a", 3, tokens=900, limit=None), request("a", 4, tokens=900),
           request("a", 5, tokens=1000)]
    new = [request("a", 1, tokens=1100),  # newly over
           request("a", 2, tokens=1200),  # over before already
           request("a", 3, tokens=5000, limit=None),  # unknown model: no window
           request("a", 4, tokens=900, limit=800),  # a smaller window (--window what-if)
           request("a", 5, tokens=1000),  # at the limit is not over it
           request("a", 6, tokens=5000)]  # added: not a pair
    pairs = compare_requests(table(old), table(new))
    assert [r["entry_id"] for r in pairs.to_pylist() if r["newly_over_window"]] \
        == ["a-1", "a-4"]
    s = summarise(pairs)
    assert s.newly_over_window == 2
    assert Thresholds(max_new_overflows=1).breaches(s) == (
        "2 requests newly over their window, more than --max-new-overflows 1",)
    assert not Thresholds(max_new_overflows=2).breaches(s)


def test_hints_newly_mandatory() -> None:
    old = [request("a", 1, hint="escalated"), request("a", 2, hint="mandatory"),
           request("a", 3, hint="none"), request("a", 4, hint="mandatory")]
    new = [request("a", 1, hint="mandatory"), request("a", 2, hint="mandatory"),
           request("a", 3, hint="advisory"), request("a", 4, hint="none")]
    pairs = compare_requests(table(old), table(new))
    assert pairs["newly_mandatory"].to_pylist() == [True, False, False, False]
    assert summarise(pairs).newly_mandatory == 1


def test_unusable_tables() -> None:
    rows = [request("a", 1)]
    with pytest.raises(ComparisonError, match=r"baseline's requests table repeats 1 "):
        compare_requests(table(rows + rows), table(rows))
    with pytest.raises(ComparisonError, match="candidate's requests table lacks request_digest"):
        compare_requests(table(rows), table(rows).drop_columns(["request_digest"]))


@pytest.mark.parametrize(("text", "value", "percent", "shown"), [
    ("5", Fraction(5), False, "5"), ("0", Fraction(0), False, "0"),
    ("5%", Fraction(5), True, "5%"), ("0.5%", Fraction(1, 2), True, "0.5%"),
])
def test_change_limits(text: str, value: Fraction, percent: bool, shown: str) -> None:
    limit = parse_change_limit(text)
    assert (limit.value, limit.percent, str(limit)) == (value, percent, shown)


@pytest.mark.parametrize("text", ["x", "-1", "1.5", "101%", "1/2", "%", "nan"])
def test_bad_change_limits(text: str) -> None:
    with pytest.raises(ValueError, match="--max-changed"):
        parse_change_limit(text)


def test_percentage_threshold_counts_the_requests_compared() -> None:
    old = [request("a", n) for n in range(200)]
    for changed, breached in ((10, False), (11, True)):
        new = [request("a", n, digest="x" if n < changed else None) for n in range(200)]
        new += [request("b", n) for n in range(50)]  # added requests are not compared
        s = summarise(compare_requests(table(old), table(new)))
        assert bool(Thresholds(parse_change_limit("5%")).breaches(s)) is breached, changed


# --- through the CLI --------------------------------------------------------------------


def summary_file(out: Path) -> dict[str, Any]:
    return json.loads((out / "regression-summary.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_fleet(tmp_path_factory)


@pytest.fixture(scope="module")
def terse(fleet: Path, dask_scheduler: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``vakpipe regress --candidate v1-terse-cards`` (baseline v1) of the fleet."""
    out = tmp_path_factory.mktemp("terse")
    assert run(["regress", str(fleet), "--out", str(out), "--candidate", "v1-terse-cards",
                "--scheduler", dask_scheduler, "--no-progress"]) == EXIT_OK
    return out


def test_terse_cards_change_the_requests_with_cards(terse: Path) -> None:
    baseline = {r["entry_id"]: r for r in committed_rows(terse / "baseline", "requests")}
    assert {r["rules"] for r in baseline.values()} == {"v1"}
    candidate = committed_rows(terse / "candidate", "requests")
    assert {r["rules"] for r in candidate} == {"v1-terse-cards"}
    pairs = committed_rows(terse, "regression")
    assert len(pairs) == len(baseline)
    changed = [p for p in pairs if p["changed"]]
    assert changed and all(p["status"] == "changed" for p in changed)
    # only a Card line differs, so only requests that send cards change, and get shorter
    assert all(baseline[p["entry_id"]]["plan_card"] > 0 for p in changed)
    assert all(p["token_delta"] < 0 for p in changed)
    assert all(p["token_delta"] == 0 for p in pairs if not p["changed"])
    summary = summary_file(terse)
    assert summary["requests_changed"] == len(changed)
    assert summary["requests_compared"] == len(pairs)
    assert summary["sessions_changed"] == len({p["session_path"] for p in changed})
    assert summary["delta_changed"]["sum"] == sum(p["token_delta"] for p in changed)
    assert summary["baseline"]["rules"] == "v1" and summary["passed"] is True
    manifest = json.loads((terse / "_manifest.json").read_text())
    assert manifest["requests_changed"] == len(changed)  # committed with the pairs


def test_same_rule_set_changes_nothing(fleet: Path, tmp_path: Path, dask_scheduler: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "same"
    assert run(["regress", str(fleet), "--out", str(out), "--baseline", "v1", "--candidate",
                "v1", "--max-changed", "0", "--max-new-overflows", "0", "--scheduler",
                dask_scheduler, "--no-progress"]) == EXIT_OK
    text = capsys.readouterr().out
    assert "requests changed           0 (0.0%)\n" in text and "  passed\n" in text
    summary = summary_file(out)
    assert summary["requests_changed"] == summary["requests_added"] == 0
    assert summary["requests_compared"] > 0 and summary["breaches"] == []


def test_thresholds_against_a_baseline_run(fleet: Path, terse: Path, tmp_path: Path,
                                           dask_scheduler: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    # one session that sends cards, compared with the v1 run committed before: only the
    # candidate is replayed, and the baseline is cut to the session asked for
    pairs = committed_rows(terse, "regression")
    path = next(p["session_path"] for p in pairs if p["changed"])
    changed = sum(p["changed"] for p in pairs if p["session_path"] == path)
    stem = Path(path).stem
    args = ["regress", str(fleet), "--baseline-run", str(terse / "baseline"), "--candidate",
            "v1-terse-cards", "--session", stem, "--scheduler", dask_scheduler,
            "--no-progress"]
    out = tmp_path / "run"
    assert run([*args, "--out", str(out), "--max-changed", str(changed - 1)]) == EXIT_FINDINGS
    text = capsys.readouterr().out
    assert f"FAILED: {changed} requests changed, more than --max-changed {changed - 1}" in text
    assert not (out / "baseline").exists()
    assert committed_rows(out, "regression") == [p for p in pairs if p["session_path"] == path]
    summary = summary_file(out)
    assert (summary["sessions_compared"], summary["requests_removed"]) == (1, 0)
    assert summary["baseline"]["run"] == str(terse / "baseline") and not summary["passed"]
    assert "archive" not in summary["baseline"]  # the same archive: nothing to say
    assert "another archive" not in capsys.readouterr().err
    assert run([*args, "--out", str(out), "--max-changed", str(changed)]) == EXIT_OK


def test_a_baseline_run_of_another_archive_is_said(fleet: Path, terse: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A baseline run that read another archive (a copy elsewhere, or a mistake) is
    compared all the same, and said: on stderr and in the summary."""
    copy = tmp_path / "copy"
    shutil.copytree(fleet, copy)
    out = tmp_path / "other"
    capsys.readouterr()
    assert run(["regress", str(copy), "--out", str(out), "--baseline-run",
                str(terse / "baseline"), "--candidate", "v1", "--workers", "0",
                "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    assert f"read another archive (file://{fleet})" in err, err
    summary = summary_file(out)
    assert summary["baseline"]["archive"] == f"file://{fleet}"
    assert summary["requests_changed"] == summary["requests_added"] == 0


def test_new_overflows_under_a_window(fleet: Path, terse: Path, tmp_path: Path,
                                      dask_scheduler: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    baseline = committed_rows(terse / "baseline", "requests")
    assert not any(r["replayed_tokens"] > r["model_input_limit"] for r in baseline)
    window = sorted(r["replayed_tokens"] for r in baseline)[len(baseline) // 2]
    over = sum(r["replayed_tokens"] > window for r in baseline)
    out = tmp_path / "window"
    code = run(["regress", str(fleet), "--out", str(out), "--baseline-run",
                str(terse / "baseline"), "--candidate", "v1", "--window", str(window),
                "--max-changed", "0", "--max-new-overflows", "0", "--scheduler",
                dask_scheduler, "--no-progress"])
    assert code == EXIT_FINDINGS
    text = capsys.readouterr().out
    assert f"FAILED: {over} requests newly over their window" in text
    assert "requests changed, more" not in text  # a window changes no projection
    summary = summary_file(out)
    assert (summary["requests_changed"], summary["newly_over_window"]) == (0, over)
    # the hint follows the recorded usage against the new window
    mandatory = [p for p in committed_rows(out, "regression") if p["newly_mandatory"]]
    assert mandatory and summary["newly_mandatory"] == len(mandatory)
    assert {p["new_model_input_limit"] for p in committed_rows(out, "regression")} == {window}


@pytest.mark.parametrize(("flags", "names"), [
    (["--candidate", "v9"], ["'v9'", "v1-terse-cards"]),
    (["--candidate", "v1", "--baseline", "v9"], ["'v9'"]),
    (["--candidate", "v1", "--baseline", "v1", "--baseline-run", "x"],
     ["--baseline", "--baseline-run"]),
    (["--candidate", "v1", "--max-changed", "5x"], ["--max-changed", "'5x'"]),
    (["--candidate", "v1", "--baseline-run", "{fleet}"], ["--baseline-run", "requests table"]),
    (["--candidate", "v1", "--baseline-run", "{out}"], ["--baseline-run and --out"]),
    (["--candidate", "v1", "--session", "no-such-session"], ["'no-such-session'"]),
])
def test_unusable_input_is_exit_2(fleet: Path, tmp_path: Path, dask_scheduler: str,
                                  flags: list[str], names: list[str],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    flags = [f.format(fleet=fleet, out=tmp_path / "out") for f in flags]
    # the session cluster: an unknown --session is found once the run has a cluster
    code = run(["regress", str(fleet), "--out", str(tmp_path / "out"), *flags,
                "--scheduler", dask_scheduler])
    assert code == EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert err.startswith("vakpipe: error: ") and len(err.splitlines()) == 1, err
    assert all(name in err for name in names), err
    assert not (tmp_path / "out" / "candidate").exists()


def test_both_replays_share_one_cluster_and_a_small_archive_starts_none(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a scheduler, a small archive replays in this process, as its audit would
    (a cluster cost ~0.6 s of a 2.7 s check on the 6.8 MB conformance corpus); given
    --workers, both replays run on one LocalCluster of at most one worker a session."""
    started: list[int | None] = []
    real = orchestrate.dask_client

    @contextmanager
    def counted(scheduler: str | None = None, workers: int | None = None,
                processes: bool = True) -> Iterator[Client]:
        started.append(workers)
        with real(scheduler, workers, processes) as client:
            yield client

    monkeypatch.setattr(orchestrate, "dask_client", counted)
    flags = ["--candidate", "v1-terse-cards", "--no-progress"]
    assert run(["regress", str(fleet), "--out", str(tmp_path / "small"), *flags]) == EXIT_OK
    assert started == []
    assert run(["regress", str(fleet), "--out", str(tmp_path / "cluster"), *flags,
                "--workers", "9"]) == EXIT_OK
    assert started == [len(list(fleet.rglob("*.jsonl")))]
    for out in ("small", "cluster"):
        assert committed_rows(resolve(str(tmp_path / out / "candidate")), "requests")


def test_a_summary_file_that_cannot_be_written_says_the_table_was_committed(
        fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import errno

    import jobs.regression_check as regression_check

    real = regression_check.write_small_file

    def full(out: Any, path: str, data: bytes) -> str:
        if path.endswith("regression-summary.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(out, path, data)

    monkeypatch.setattr(regression_check, "write_small_file", full)
    capsys.readouterr()
    assert run(["regress", str(fleet), "--out", str(tmp_path / "r"), "--candidate", "v1",
                "--no-progress"]) == EXIT_UNUSABLE
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"vakpipe: error: {tmp_path / 'r'}: the regression table was "
                           "committed, but regression-summary.json could not be written "
                           "(its run manifest holds the same summary): "), last
    assert "No space left on device" in last
    assert committed_rows(resolve(str(tmp_path / "r")), "regression")


def test_on_s3(s3: LocalS3, scheduler: str, capsys: pytest.CaptureFixture[str]) -> None:
    archive = f"s3://{BUCKET}/archive"
    write_fleet(resolve(archive), sessions=3, seed=12, size_scale=0.3)
    out = resolve(f"s3://{BUCKET}/regress")
    assert run(["regress", archive, "--out", out.url, "--candidate", "v1-terse-cards",
                "--scheduler", scheduler, "--no-progress"]) == EXIT_OK
    assert "3 sessions" in capsys.readouterr().out
    pairs = committed_rows(out, "regression")
    assert pairs and len({p["session_path"] for p in pairs}) == 3
    summary = json.loads(out.filesystem().cat_file(out.join("regression-summary.json")))
    assert summary["requests_compared"] == len(pairs)
    assert summary["requests_changed"] == sum(p["changed"] for p in pairs)
    assert committed_rows(resolve(f"{out.url}/candidate"), "requests")


def test_readers_of_one_run_given_a_regression_output_name_its_replays(
    terse: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vakpipe cost OUT` (and dashboard, export) of a regression check's output: its run
    is the comparison, with no usage or integrity tables; the line names the replays to
    read instead, never "audit its archive again" into OUT (that would replace the
    check)."""
    for argv in (["cost", str(terse)], ["dashboard", str(terse)],
                 ["export", "otel", str(terse), "--file", str(terse.parent / "x.json")]):
        capsys.readouterr()
        assert run(argv) == EXIT_UNUSABLE
        err = capsys.readouterr().err
        assert f"{terse}/candidate" in err and "vakpipe audit" not in err, err
    assert run(["cost", str(terse / "candidate"), "--report-dir",
                str(terse.parent / "candidate-cost")]) == EXIT_OK
