"""``vakpipe dashboard``: the fleet dashboard of a nightly output, read in a real browser.

A small generated fleet (with injected faults) is audited on three nights by ``vakpipe
nightly``; between the first two one ledger is cut short and another deleted (history
breaks); the newest night plans compaction packets under a small what-if window. The
page is written through the installed ``vakpipe`` script, then loaded from disk by
headless Chromium (offline: a proxy that refuses everything) as the cost report's test
does: every chart drawn by the inlined plotly.js, no console line, a screenshot kept under
``tmp_path`` and copied to ``.pytest_cache/screenshots/dashboard.png``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import s3fs

from pipeline.io.storage import resolve
from pipeline.synth.fleet import write_fleet
from pipeline.synth.local_s3 import LocalS3
from tests.helpers.storage import BUCKET, run_vakpipe
from tests.integration.test_report_browser import SCREENSHOTS, WIDTH, Charts, browse, png_size

vakpipe = run_vakpipe


@pytest.fixture(scope="module")
def nightly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dash-fleet")
    write_fleet(resolve(str(root)), sessions=10, seed=3, size_scale=0.5, faults=True)
    out = tmp_path_factory.mktemp("dash-nightly")
    common = ["--workers", "0", "--no-progress"]
    done = vakpipe("nightly", str(root), "--out", str(out), "--date", "2026-12-01", *common)
    assert done.returncode == 0, done.stderr
    ledgers = sorted(root.rglob("*.jsonl"))
    cut, gone = ledgers[0], ledgers[1]
    cut.write_bytes(cut.read_bytes()[:1500])  # a verified history cut short
    gone.unlink()  # and one that went missing
    for day, extra in (("2026-12-02", []), ("2026-12-03", ["--compaction", "--window", "9000"])):
        done = vakpipe("nightly", str(root), "--out", str(out), "--date", day, *common, *extra)
        assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def page(nightly: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    dest = tmp_path_factory.mktemp("dash-page") / "fleet.html"
    done = vakpipe("dashboard", str(nightly), "--html", str(dest), "--json")
    assert done.returncode == 0, done.stderr
    return dest, json.loads(done.stdout)


def test_the_json_names_every_night_and_the_history_breaks(page: tuple[Path, dict]) -> None:
    dest, doc = page
    assert doc["schema"] == "vakpipe.dashboard/1" and doc["html"] == str(dest)
    nights = {n["night"]: n for n in doc["nights"]}
    assert list(nights) == ["2026-12-01", "2026-12-02", "2026-12-03"]
    assert nights["2026-12-02"]["codes"].get("history_truncated", 0) >= 1
    assert nights["2026-12-02"]["codes"].get("session_missing", 0) == 1
    assert nights["2026-12-03"]["codes"].get("session_missing", 0) == 1
    assert doc["sessions_needing_packets"] > 0 and doc["tokens_saved"] > 0
    assert doc["billed_usd"] > 0


def test_the_page_has_every_section_with_its_numbers(page: tuple[Path, dict]) -> None:
    dest, doc = page
    text = dest.read_text()
    for section in ("findings", "history", "packets", "saturation", "cost", "waste"):
        assert f"<h2 id={section}>" in text
    said = re.search(r"<b>([\d,]+)</b> sessions need packets", text)
    assert said is not None and int(said.group(1)) == doc["sessions_needing_packets"]
    assert f"{doc['tokens_saved']:,} tokens saved" in text
    # every chart has a table of its numbers after it
    assert text.count('class="plotly-graph-div"') >= 6
    assert text.count("<table>") >= text.count('class="plotly-graph-div"')
    assert "cdn.plot.ly" not in text.replace("https://cdn.plot.ly", "")  # no fetched script


def test_the_dashboard_renders_offline_in_chromium(page: tuple[Path, dict],
                                                   tmp_path: Path) -> None:
    dest, _ = page
    done = browse(dest, tmp_path / "profile-dom", "--enable-logging=stderr", "--v=0",
                  "--virtual-time-budget=15000", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    parsed = Charts()
    parsed.feed(done.stdout)
    assert len(parsed.charts) >= 6, parsed.charts
    assert all(parsed.charts.values()), f"charts plotly.js did not draw: {parsed.charts}"
    console = [ln for ln in done.stderr.splitlines() if ":CONSOLE" in ln]
    assert console == [], console
    shot = tmp_path / "dashboard.png"
    done = browse(dest, tmp_path / "profile-shot", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert png_size(shot)[0] == WIDTH
    assert shot.stat().st_size > 50_000
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, SCREENSHOTS / "dashboard.png")


def test_one_run_and_the_default_place(nightly: Path, tmp_path: Path) -> None:
    run_out = nightly / "date=2026-12-03"
    done = vakpipe("dashboard", str(run_out))
    assert done.returncode == 0, done.stderr
    assert (run_out / "dashboard.html").exists()
    # a nightly partition read as one run is labelled by its night, not by the day it ran
    assert "1 night(s), newest 2026-12-03:" in done.stdout, done.stdout
    # a run that is not a night (an audit's): the UTC day of its run id, as nights are
    # written (it was 20261207)
    fleet, audit_out = tmp_path / "fleet", tmp_path / "audit"
    write_fleet(resolve(str(fleet)), sessions=2, seed=5)
    assert vakpipe("audit", str(fleet), "--out", str(audit_out), "--workers", "0",
                   "--no-progress").returncode == 0
    done = vakpipe("dashboard", str(audit_out))
    assert done.returncode == 0, done.stderr
    assert re.search(r"1 night\(s\), newest \d{4}-\d\d-\d\d:", done.stdout), done.stdout
    # nothing committed there: one line, exit 2
    empty = tmp_path / "empty"
    empty.mkdir()
    done = vakpipe("dashboard", str(empty))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "empty: no committed run" in done.stderr
    done = vakpipe("dashboard", str(tmp_path / "typo"))  # nothing at all there
    assert done.returncode == 2 and "typo: nothing is there, so no committed run" in done.stderr


def test_cost_and_export_of_a_nightly_output_read_its_newest_night(nightly: Path,
                                                                   tmp_path: Path) -> None:
    """``vakpipe cost OUT`` on a nightly output prices its newest committed night, as
    ``OUT/date=…`` named would be (and as a Delta nightly output's ``OUT`` is read); the
    OpenTelemetry export reads the same night."""
    newest = json.loads((nightly / "date=2026-12-03" / "_manifest.json").read_text())
    docs = []
    for source, report in ((nightly, tmp_path / "a"), (nightly / "date=2026-12-03",
                                                        tmp_path / "b")):
        done = vakpipe("cost", str(source), "--report-dir", str(report), "--json")
        assert done.returncode == 0, done.stderr
        docs.append(json.loads(done.stdout))
    assert docs[0]["run_id"] == docs[1]["run_id"] == newest["run_id"]
    assert docs[0]["totals"] == docs[1]["totals"] and docs[0]["records"] > 0
    spans = tmp_path / "spans.json"
    done = vakpipe("export", "otel", str(nightly), "--file", str(spans), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["input"]["run_id"] == newest["run_id"]


def test_cost_of_an_archive_without_out_names_the_one_step(tmp_path: Path) -> None:
    """An archive given to ``vakpipe cost`` (or ``export otel``) without ``--out``: one
    line naming the audit into an output and the one-step cost, never advice to audit
    into the archive itself."""
    root = tmp_path / "archive"
    write_fleet(resolve(str(root)), sessions=2, seed=1, size_scale=0.2)
    for command in (["cost", str(root)], ["export", "otel", str(root), "--file",
                                          str(tmp_path / "spans.json")]):
        done = vakpipe(*command)
        assert done.returncode == 2 and done.stderr.count("\n") == 1
        assert f"vakpipe audit {root} --out OUT" in done.stderr
        assert f"vakpipe cost {root} --out OUT" in done.stderr
        assert "--out " + str(root) not in done.stderr
    assert not (tmp_path / "spans.json").exists()


def test_a_delta_nightly_output_has_one_point_per_night(tmp_path: Path) -> None:
    # `nightly --format delta` keeps its nights in Delta tables, not date= folders: the
    # dashboard reads each night as of itself, and the history break on the second.
    root = tmp_path / "archive"
    write_fleet(resolve(str(root)), sessions=6, seed=5, size_scale=0.4)
    out = tmp_path / "delta"
    common = ["--workers", "0", "--no-progress", "--format", "delta"]
    for day in ("2026-12-01", "2026-12-02"):
        done = vakpipe("nightly", str(root), "--out", str(out), "--date", day, *common)
        assert done.returncode == 0, done.stderr
        ledger = sorted(root.rglob("*.jsonl"))[0]
        ledger.write_bytes(ledger.read_bytes()[:1500])  # cut short before the next night
    done = vakpipe("dashboard", str(out), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    nights = {n["night"]: n for n in doc["nights"]}
    assert list(nights) == ["2026-12-01", "2026-12-02"]
    assert all(n["sessions"] == 6 for n in nights.values())
    assert nights["2026-12-02"]["codes"].get("history_truncated", 0) == 1
    assert (out / "dashboard.html").exists() and doc["billed_usd"] > 0
    # Never onto the Delta tables' files (the `nights` table included), nor a report
    # folder at OUT itself.
    for argv in (["dashboard", str(out), "--html", str(out / "nights" / "x.html")],
                 ["dashboard", str(out), "--html", str(out / "usage" / "x.html")],
                 ["cost", str(out), "--report-dir", str(out)]):
        done = vakpipe(*argv)
        assert done.returncode == 2 and "replace" in done.stderr, done.stderr
    assert not (out / "nights" / "x.html").exists() and not (out / "costs.csv").exists()
    done = vakpipe("audit", str(root), "--out", str(out), "--workers", "0")  # a run at OUT
    assert done.returncode == 2 and "is a nightly output" in done.stderr, done.stderr


def test_the_same_output_on_s3_gives_the_same_nights(
    nightly: Path, page: tuple[Path, dict], s3: LocalS3, tmp_path: Path
) -> None:
    """On an object store the nights' manifests and tables are read side by side
    (``map_io``): the nights come out the same, in order."""
    s3fs.S3FileSystem(skip_instance_cache=True).put(f"{nightly}/", f"{BUCKET}/nightly/",
                                                    recursive=True)
    dest = tmp_path / "fleet.html"
    done = vakpipe("dashboard", f"s3://{BUCKET}/nightly", "--html", str(dest), "--json")
    assert done.returncode == 0, done.stderr
    _, local = page
    assert json.loads(done.stdout)["nights"] == local["nights"]
