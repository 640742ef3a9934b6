"""The cost report read by a person: opened in a real browser, and readable at a glance.

A small generated fleet is audited with replay (a small what-if window, so some requests
are over it) and priced through the installed ``vakpipe`` script; headless Chromium then
loads ``report.html`` from disk. ``--dump-dom`` gives the page after its scripts ran:
every plotly chart holds the ``svg`` plotly.js drew, which proves the inlined plotly.js
ran offline; Chromium's console log (``--enable-logging=stderr``) must be silent, since
an uncaught error is logged there. A screenshot is kept under ``tmp_path`` and copied to
``.pytest_cache/screenshots/`` (git-ignored) for a person to look at.

Skipped only when no Chromium can be found and ``CI`` is not set; in CI it must run
(``.ci/run`` installs Debian's ``chromium``).

The rest checks the page's text: a log-scaled saturation axis with the over-window
requests in their own red bars, a colour per model that is the same in every report,
tables in sideways-scrolling boxes, and the escaping and partial banner kept.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.costs.html import (
    OVER_COLOUR,
    PALETTE,
    CostPage,
    model_colours,
    render,
)
from pipeline.costs.pricing import load_prices
from pipeline.costs.report import price_usage
from pipeline.io.storage import resolve
from pipeline.synth.fleet import write_fleet
from pipeline.tables.schemas import USAGE_SCHEMA
from tests.helpers.storage import vakpipe_exe

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / ".pytest_cache" / "screenshots"
WIDTH, HEIGHT = 1400, 2000


def chromium() -> str:
    """The Chromium to drive: ``$CHROMIUM``, else the first of the usual names on PATH."""
    names = [os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome",
             "google-chrome-stable"]
    for name in names:
        found = shutil.which(name) if name else None
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("no Chromium on PATH: CI must run the browser check (.ci/run installs it)")
    pytest.skip("no Chromium on PATH (apt-get install chromium); CI installs and runs it")


def browse(page: Path, profile: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """Chromium, headless, on ``page`` with its own profile folder (no shared state)."""
    return subprocess.run(
        [chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
         f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
         # Nothing may be fetched: a proxy that refuses every connection.
         "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
         *flags, page.as_uri()],
        capture_output=True, text=True, timeout=180, check=False)


class Charts(HTMLParser):
    """The plotly chart divs of a page and whether each holds an ``svg``."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, bool] = {}
        self._open: list[tuple[str, str | None]] = []  # (tag, chart id it opens)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        chart = None
        if tag == "div" and "plotly-graph-div" in (a.get("class") or "").split():
            chart = a.get("id") or f"chart-{len(self.charts)}"
            self.charts[chart] = False
        if tag == "svg":
            for _, inside in self._open:
                if inside is not None:
                    self.charts[inside] = True
        if tag not in ("br", "img", "input", "meta", "link", "wbr", "hr"):
            self._open.append((tag, chart))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == tag:
                del self._open[i:]
                break


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def vakpipe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([vakpipe_exe(), *args], capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.fixture(scope="module")
def report(dask_scheduler: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``report.html`` of a generated fleet audited with replay under a 9,000-token
    what-if window (so some requests are over it), priced by day, model and session."""
    root = tmp_path_factory.mktemp("browser-fleet")
    write_fleet(resolve(str(root)), sessions=8, seed=5, size_scale=0.5)
    out = tmp_path_factory.mktemp("browser-out")
    done = vakpipe("audit", str(root), "--out", str(out), "--replay", "--window", "9000",
                   "--scheduler", dask_scheduler, "--no-progress")
    assert done.returncode == 0, done.stderr
    done = vakpipe("cost", str(out), "--by", "day,model,session")
    assert done.returncode == 0, done.stderr
    return out / "cost" / "report.html"


def test_the_report_renders_offline_in_chromium(report: Path, tmp_path: Path) -> None:
    # The page after its scripts ran: every chart drawn by the inlined plotly.js.
    done = browse(report, tmp_path / "profile-dom", "--enable-logging=stderr", "--v=0",
                  "--virtual-time-budget=15000", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    parsed = Charts()
    parsed.feed(done.stdout)
    assert len(parsed.charts) == 3, parsed.charts  # by model, split, saturation
    assert all(parsed.charts.values()), f"charts plotly.js did not draw: {parsed.charts}"
    assert 'class="main-svg"' in done.stdout
    # An uncaught error (or anything the page logs) is a console line of Chromium's log.
    console = [ln for ln in done.stderr.splitlines() if ":CONSOLE" in ln]
    assert console == [], console
    # The screenshot, for a person to judge (and kept where one can find it).
    shot = tmp_path / "report.png"
    done = browse(report, tmp_path / "profile-shot", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert png_size(shot) == (WIDTH, HEIGHT)
    # A blank page of that size is ~6 kB; the report's text and charts are far more.
    assert shot.stat().st_size > 50_000
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, SCREENSHOTS / "cost-report.png")


def test_the_page_says_how_many_requests_were_over_their_window(report: Path) -> None:
    page = report.read_text()
    said = re.search(r"<b>([\d,]+)</b> of ([\d,]+) requests were at or over", page)
    assert said is not None and int(said.group(1).replace(",", "")) > 0
    assert '"type":"log"' in page  # the saturation count axis
    assert OVER_COLOUR in page and "at or over the window" in page
    # every table in a box that scrolls sideways rather than past the page's edge
    assert page.count("<table>") == page.count("<div class='wide") > 0


# --- the page's text, without a browser -------------------------------------------------


def usage_rows(models: list[str]) -> pa.Table:
    rows = [{"session_path": f"s/{i}.jsonl", "session_id": str(i), "agent": "vak",
             "entry_id": f"e{i}", "request_id": f"e{i}", "kind": "message", "ordinal": 0,
             "winning": True, "ts": 1_790_000_000_000_000_000 + i, "provider": "anthropic",
             "model": m, "on_active_chain": True, "input_tokens": 100, "output_tokens": 10,
             "cache_read_tokens": 0, "cache_write_tokens": 0, "billed": True,
             "effective": True, "waste": None} for i, m in enumerate(models)]
    table = pa.Table.from_pylist(rows, schema=USAGE_SCHEMA.remove(
        USAGE_SCHEMA.get_field_index("day")))
    return table.append_column("day", table["ts"].cast(pa.date32())).select(
        USAGE_SCHEMA.names)


def page_of(models: list[str], saturation: list[tuple[str, int]] | None = None,
            partial: str | None = None) -> str:
    usage = usage_rows(models)
    prices = load_prices(None)
    by_day = price_usage(usage, prices, ["day"])
    return render(CostPage(
        source="s3://b/r", run_id="r", window="all", prices="test", by=("model",),
        totals=price_usage(usage, prices), grouped=price_usage(usage, prices, ["model"]),
        daily_by_model=price_usage(usage, prices, ["day", "model"]), daily=by_day,
        saturation=saturation, hints={}, packets=None, partial=partial))


def trace_colours(page: str) -> dict[str, str]:
    """Trace name -> marker colour, as plotly's figure JSON in the page has them."""
    pairs = re.findall(r'"marker":\{"color":"(#[0-9A-Fa-f]{6})"\},"name":"([^"]+)"', page)
    return {name: colour for colour, name in pairs}


def test_a_model_has_the_same_colour_in_every_report() -> None:
    one = trace_colours(page_of(["claude-opus-4-1", "gpt-5"]))
    other = trace_colours(page_of(["gpt-5", "gemini-2.5-pro", "claude-opus-4-1", "o3"]))
    assert one["claude-opus-4-1"] == other["claude-opus-4-1"]
    assert one["gpt-5"] == other["gpt-5"]
    # and not from Python's per-process hash: pinned
    assert model_colours(["claude-opus-4-1"]) == {"claude-opus-4-1": one["claude-opus-4-1"]}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=len(PALETTE),
                unique=True))
def test_model_colours_are_distinct_and_order_free(models: list[str]) -> None:
    colours = model_colours(models)
    assert set(colours) == set(models)
    assert len(set(colours.values())) == len(models)  # two models never share one
    assert model_colours(list(reversed(models))) == colours
    assert set(colours.values()) <= set(PALETTE)
    # a model alone keeps its colour when nothing else takes it first
    for m in models:
        alone = model_colours([m])[m]
        if alone not in {colours[o] for o in models if o < m}:
            assert colours[m] == alone


def test_over_window_requests_are_their_own_bars_on_a_log_axis() -> None:
    bins = [("0–5%", 1700), ("5–10%", 1650), ("100–105%", 2), ("105–110%", 1), ("≥150%", 3)]
    page = page_of(["gpt-5"], saturation=bins)
    assert "<b>6</b> of 3,356 requests were at or over" in page
    assert '"type":"log"' in page
    colours = trace_colours(page)
    assert colours["at or over the window"] == OVER_COLOUR
    assert colours["within the window"] != OVER_COLOUR


def test_escaping_and_the_partial_banner_stay() -> None:
    page = page_of(["<img src=x onerror=alert(1)>"], partial="3 of 9 sessions not read")
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "id=partial" in page and "3 of 9 sessions not read" in page


def test_columns_zero_in_every_row_are_named_not_shown() -> None:
    page = page_of(["gpt-5", "claude-opus-4-1"])
    shown = re.search(r"id=grouped>.*", page, re.S)
    assert shown is not None
    assert "zero in every row, so not shown" in shown.group(0)
    assert "<code>wasted_retry_usd</code>" in shown.group(0)
    assert "<th>billed_<wbr>usd</th>" in shown.group(0)
