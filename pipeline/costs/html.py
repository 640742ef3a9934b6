"""The cost report as one self-contained HTML page. Pure (pyarrow, and plotly's files).

The charts are plotly.js charts, with plotly.js inlined once in the page: the report opens
offline, from a file or an object store, with no CDN. Tables are plain HTML, each in a
box that scrolls sideways rather than past the page's right edge.

Readable at a glance, and alike from one report to the next: a model has the same colour
in every report (:func:`model_colours`), and the saturation histogram counts on a log
axis, the requests over their window in their own red bars, so a handful of them is not
lost beside thousands under it.
"""

from __future__ import annotations

import hashlib
import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.costs.budgets import BudgetStatus, Level, row_level
from pipeline.costs.report import GROUP_KEYS, CostReport
from pipeline.ledger.text import html_text

#: Width of a saturation bin (percent of the model's input window), and the last bin.
SATURATION_STEP, SATURATION_CAP = 5, 150
#: Rows of a grouped cost table shown in the page (the CSV has them all).
MAX_ROWS = 200
#: The colours a model can get (plotly's Dark24: two dozen that stay apart on white).
PALETTE = ("#2E91E5", "#E15F99", "#1CA71C", "#FB0D0D", "#DA16FF", "#222A2A", "#B68100",
           "#750D86", "#EB663B", "#511CFB", "#00A08B", "#FB00D1", "#FC0080", "#B2828D",
           "#6C7C32", "#778AAE", "#862A16", "#A777F1", "#620042", "#1616A7", "#DA60CA",
           "#6C4516", "#0D2A63", "#AF0038")
#: The parts of a billed dollar, always in these colours.
SPLIT_COLOURS = {"effective": "#1CA71C", "wasted: abandoned branches": "#EB663B",
                 "wasted: failed or retried attempts": "#AF0038"}
#: Saturation bars: within the window, and over it (the requests that did not fit).
UNDER_COLOUR, OVER_COLOUR = "#2E91E5", "#FB0D0D"
# Tables: in a box that scrolls sideways (.wide) instead of running past the page's
# right edge; text cells (paths, model names) and headers (at their underscores) wrap,
# figures stay on one line. The grouped table (.full) may use the window's whole width.
PAGE_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;
color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{padding:.25em .6em;
border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}
th{background:#f4f4f4;white-space:normal;vertical-align:bottom}
.wide{overflow-x:auto;max-width:100%}
.full{width:calc(100vw - 2em);max-width:none;position:relative;left:50%;
transform:translateX(-50%)}.full table{font-size:.9em;margin:.5em auto 1.5em}
td.t{white-space:normal;overflow-wrap:anywhere;min-width:7em;max-width:26em;text-align:left}
td:first-child,th:first-child{text-align:left}.warn{background:#fff3cd;border:1px solid
#e0b400;padding:.6em 1em}tr.limit td{background:#fdd}tr.over td{background:#fff3cd}
.breach{background:#fdd;border:1px solid #c00;padding:.6em 1em}.note{color:#666}h2{margin-top:1.8em}
"""


@dataclass(frozen=True)
class PacketSummary:
    """Sessions whose bound model needs compaction packets (from a ``compaction`` table)."""

    sessions: int
    packets: int
    top: list[dict[str, Any]]


@dataclass(frozen=True)
class CostPage:
    """Everything the page shows; ``None`` marks a table the run did not write."""

    source: str
    run_id: str | None
    window: str
    prices: str
    by: Sequence[str]
    totals: CostReport
    grouped: CostReport
    daily_by_model: CostReport
    daily: CostReport
    saturation: list[tuple[str, int]] | None
    hints: dict[str, int] | None
    packets: PacketSummary | None
    #: The input run is partial: the line saying how many sessions were not read.
    partial: str | None = None
    #: ``--budgets``: each budget in each period of the window.
    budgets: tuple[BudgetStatus, ...] = ()
    #: The zone of the days (``--timezone``); ``None``: UTC.
    timezone: str | None = None


def saturation_bins(requests: pa.Table) -> list[tuple[str, int]]:
    """Requests per saturation bin (``SATURATION_STEP`` % wide, the last one open)."""
    sat = requests["saturation"].drop_null()
    if len(sat) == 0:
        return []
    capped = pc.min_element_wise(sat.cast(pa.int64()), SATURATION_CAP)
    bins = pc.multiply(pc.divide(capped, SATURATION_STEP), SATURATION_STEP)
    counts = {r["values"]: r["counts"] for r in bins.value_counts().to_pylist()}
    out = []
    for low in range(0, max(counts) + 1, SATURATION_STEP):
        label = (f"≥{low}%" if low >= SATURATION_CAP else f"{low}–{low + SATURATION_STEP}%")
        out.append((label, counts.get(low, 0)))
    return out


def hint_counts(requests: pa.Table) -> dict[str, int]:
    """Requests per over-budget hint level."""
    return {r["values"]: r["counts"]
            for r in requests["hint_level"].drop_null().value_counts().to_pylist()}


def packet_summary(compaction: pa.Table, top: int = 20) -> PacketSummary:
    """Sessions needing packets, and the ``top`` ones by packets planned."""
    live = compaction.filter(pc.invert(pc.fill_null(compaction["superseded"], False)))
    per = live.group_by("session_path").aggregate(
        [("packet_id", "count"), ("turns_covered", "sum"), ("tokens_before", "max"),
         ("model", "max")])
    rows = sorted(per.to_pylist(), key=lambda r: (-r["packet_id_count"], r["session_path"]))
    return PacketSummary(per.num_rows, live.num_rows, [
        {"session": r["session_path"], "model": r["model_max"], "packets": r["packet_id_count"],
         "turns covered": r["turns_covered_sum"], "largest tokens before": r["tokens_before_max"]}
        for r in rows[:top]])


def model_colours(models: Iterable[str]) -> dict[str, str]:
    """A colour of :data:`PALETTE` for each model, the same in every report.

    A model's colour is picked by a digest of its name (not Python's ``hash``, which
    changes with every process), so it does not depend on which other models a report
    shows. Only when two models of one report land on the same colour does the one later
    in name order take the next free colour (and the palette repeats past 24 models).
    """
    taken: dict[str, str] = {}
    used: set[str] = set()
    for name in sorted(set(models)):
        start = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
        for step in range(len(PALETTE)):
            colour = PALETTE[(start + step) % len(PALETTE)]
            if colour not in used:
                break
        else:
            colour = PALETTE[start % len(PALETTE)]
        taken[name] = colour
        used.add(colour)
    return taken


def _cell(v: Any, usd: bool = False) -> str:
    if v is None:
        return "<td></td>"
    if isinstance(v, bool):
        return f"<td>{'yes' if v else ''}</td>"
    if usd:
        return f"<td>${v:,.4f}</td>"
    if isinstance(v, int):
        return f"<td>{v:,}</td>"
    if isinstance(v, str):
        return f"<td class=t>{html.escape(v)}</td>"  # a text may wrap
    return f"<td>{html.escape(str(v))}</td>"


#: The class of a table row inside a budget period over a level.
_ROW_CLASS = {Level.OK: "", Level.WARN: " class=over", Level.LIMIT: " class=limit"}


def html_table(rows: list[dict[str, Any]], columns: Sequence[str], *, full: bool = False,
               classes: Sequence[str] | None = None) -> str:
    """``rows`` as an escaped HTML table of ``columns`` (every chart's numbers beside it;
    the cost report's and the dashboard's); ``classes``, one attribute text per row."""
    # A column's name as in costs.csv, breakable after each underscore.
    head = "".join(f"<th>{html.escape(c).replace('_', '_<wbr>')}</th>" for c in columns)
    body = "".join(f"<tr{classes[i] if classes else ''}>"
                   + "".join(_cell(r.get(c), c.endswith("usd")) for c in columns)
                   + "</tr>" for i, r in enumerate(rows))
    box = "wide full" if full else "wide"
    return f"<div class='{box}'><table><tr>{head}</tr>{body}</table></div>"


class Charts:
    """Bar charts as HTML fragments, written as plotly's ``Figure.to_html`` writes them
    (plotly.js, from the installed plotly package, goes into the first one only).

    The figure's JSON is built here rather than by plotly's Python objects: importing and
    validating those took ~0.35 s of a small report's run. The fragment is plotly's to
    the byte but for the order of the keys inside the ``plotly_white`` template (read from
    plotly's own template file); tests/unit/costs/test_cost_html_charts.py checks that against
    plotly itself.
    """

    def __init__(self) -> None:
        self.n = 0

    def bars(self, title: str, x: list[str], series: dict[str, list[float]],
             y_title: str, *, colours: Mapping[str, str] | None = None,
             log_y: bool = False, counts: bool = False) -> str:
        """A stacked bar chart; ``colours`` by series name, ``log_y`` a log-scaled
        value axis (bars start below 1), ``counts`` the value printed on each bar."""
        # Plotly renders a subset of HTML in trace names, tick labels, titles and hover
        # text (links included): a model name is data, so its markup is escaped.
        colours = colours or {}
        data = []
        for name, y in series.items():
            trace: dict[str, Any] = {
                "name": html_text(name), "x": [html_text(v) for v in x],
                # a zero on a log axis has no height: left out, not drawn at 1
                "y": [v if v or not log_y else None for v in y]}
            if colours.get(name) is not None:
                trace["marker"] = {"color": colours[name]}
            if counts:
                trace.update(texttemplate="%{y:,}", textposition="outside", cliponaxis=False)
            # plotly writes a trace's properties sorted, its type last
            data.append({**dict(sorted(trace.items())), "type": "bar"})
        yaxis: dict[str, Any] = {"title": {"text": y_title}}
        if log_y:
            top = max((v for y in series.values() for v in y), default=1.0) or 1.0
            # From 0.5 (so a bar of 1 shows) to room above the tallest bar for its label.
            yaxis.update(type="log", range=[math.log10(0.5), math.log10(top * 3)], dtick=1)
        layout = {"template": _plotly_asset("templates/plotly_white.json", json=True),
                  "legend": {"title": {"text": ""}},
                  "margin": {"t": 50, "b": 40, "l": 60, "r": 20},
                  "title": {"text": html_text(title)}, "barmode": "stack", "height": CHART_HEIGHT,
                  "yaxis": yaxis}
        self.n += 1
        return _figure_html(f"chart-{self.n}", data, layout, with_plotlyjs=self.n == 1)


#: Pixel height of a chart.
CHART_HEIGHT = 380


def _plotly_asset(name: str, *, json: bool = False) -> Any:
    """A file of the installed plotly's ``package_data`` (plotly.js, a template), read
    without importing plotly."""
    import importlib.util
    import json as json_module
    from pathlib import Path

    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the cost report's charts need plotly: pip install plotly")
    text = (Path(spec.submodule_search_locations[0]) / "package_data" / name).read_text(
        encoding="utf-8")
    return json_module.loads(text) if json else text


def _plotly_json(obj: Any) -> str:
    """``obj`` as plotly's ``to_json_plotly`` writes it (orjson when installed, as plotly
    chooses, else the json module), with the characters unsafe in a script escaped."""
    swaps = [("<", "\\u003c"), (">", "\\u003e"), ("/", "\\u002f")]
    try:
        import orjson
    except ImportError:
        import json

        text = json.dumps(obj, separators=(",", ":"))
    else:
        text = orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
                            ).decode("utf8")
        swaps += [("\u2028", "\\u2028"), ("\u2029", "\\u2029")]
    for unsafe, safe in swaps:
        text = text.replace(unsafe, safe)
    return text


def _figure_html(div_id: str, data: list[dict[str, Any]], layout: dict[str, Any], *,
                 with_plotlyjs: bool) -> str:
    """plotly's ``to_html(full_html=False, include_plotlyjs=with_plotlyjs,
    div_id=div_id, config={"displaylogo": False})`` of the figure ``data``, ``layout``."""
    load = ("        <script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>\n"
            f"        <script>{_plotly_asset('plotly.min.js')}</script>    "
            if with_plotlyjs else "")
    script = (f'                if (document.getElementById("{div_id}")) {{'
              "                    Plotly.newPlot("
              f'                        "{div_id}",'
              f"                        {_plotly_json(data)},"
              f"                        {_plotly_json(layout)},"
              '                        {"displaylogo": false, "responsive": true}'
              "                    )                }")
    return (f'<div style="height:{layout["height"]}px; width:100%;">                '
            f'{load}            <div id="{div_id}" class="plotly-graph-div" '
            'style="height:100%; width:100%;"></div>            <script>'
            "                window.PLOTLYENV=window.PLOTLYENV || {};                "
            f"{script};            </script>        </div>")


def _daily_by_model(report: CostReport, charts: Charts) -> str:
    t = report.table
    if t.num_rows == 0:
        return "<p class=note>no billed usage in the window</p>"
    days = sorted({str(d) for d in t["day"].to_pylist()})
    at = {d: i for i, d in enumerate(days)}
    series: dict[str, list[float]] = {}
    for row in t.select(["day", "model", "billed_usd"]).to_pylist():
        y = series.setdefault(row["model"] or "(no model)", [0.0] * len(days))
        y[at[str(row["day"])]] += row["billed_usd"]
    series = dict(sorted(series.items()))  # the legend in the same order in every report
    return charts.bars("Billed cost per day, by model", days, series, "USD",
                       colours=model_colours(series))


def _billed_split(report: CostReport, charts: Charts) -> str:
    t = report.table
    if t.num_rows == 0:
        return ""
    days = [str(d) for d in t["day"].to_pylist()]
    series = {"effective": t["effective_usd"].to_pylist(),
              "wasted: abandoned branches": t["wasted_abandoned_usd"].to_pylist(),
              "wasted: failed or retried attempts": t["wasted_retry_usd"].to_pylist()}
    return charts.bars("Billed = effective + wasted, per day", days, series, "USD",
                       colours=SPLIT_COLOURS)


def _saturation(page: CostPage, charts: Charts) -> str:
    if page.saturation is None:
        return ("<p class=note>no replay in this run (no <code>requests</code> table): "
                "run <code>vakpipe audit --replay</code> to see how full each request's "
                "window was.</p>")
    if not page.saturation:
        return "<p class=note>the requests table has no saturation figures.</p>"
    labels = [label for label, _ in page.saturation]
    # The bins from 100% on hold the requests over their window: few beside thousands,
    # so their own colour, and a log count axis where 1 is as visible as 1,000.
    over = [_over_window(label) for label in labels]
    series = {"within the window": [0.0 if o else float(n)
                                    for o, (_, n) in zip(over, page.saturation, strict=True)],
              "at or over the window": [float(n) if o else 0.0
                                  for o, (_, n) in zip(over, page.saturation, strict=True)]}
    total_over = sum(n for o, (_, n) in zip(over, page.saturation, strict=True) if o)
    chart = charts.bars("Requests by window saturation (log scale)", labels, series,
                        "requests (log scale)", log_y=True, counts=True,
                        colours={"within the window": UNDER_COLOUR,
                                 "at or over the window": OVER_COLOUR})
    chart = (f"<p><b>{total_over:,}</b> of {sum(n for _, n in page.saturation):,} requests "
             "were at or over their model's input window (red).</p>" + chart)
    hints = html_table([{"hint level": k, "requests": v}
                    for k, v in sorted((page.hints or {}).items())], ["hint level", "requests"])
    return chart + hints


def _over_window(label: str) -> bool:
    """Whether a saturation bin's requests were over their window (100% and up)."""
    low = label.lstrip("≥").split("–")[0].rstrip("%")
    return low.isdigit() and int(low) >= 100


def _packets(page: CostPage) -> str:
    if page.packets is None:
        return ("<p class=note>no compaction table in this run: run "
                "<code>vakpipe compact</code> (or the nightly audit with "
                "<code>--compaction</code>) to plan packets.</p>")
    p = page.packets
    text = (f"<p>{p.sessions:,} sessions need packets ({p.packets:,} packets planned, "
            "superseded ones left out), as the run planned them (not cut to the days "
            "above).</p>")
    if p.top:
        text += html_table(p.top, list(p.top[0]))
    return text


def _totals(report: CostReport) -> str:
    t = report.table
    row = t.to_pylist()[0] if t.num_rows else {}
    names = [("billed", "billed (every attempt the provider charged)"),
             ("effective", "effective (winning requests on the active chain)"),
             ("wasted", "wasted"), ("wasted_abandoned", "… on abandoned branches"),
             ("wasted_retry", "… on failed or retried attempts")]
    rows = [{"measure": label, "usd": row.get(f"{m}_usd", 0.0),
             "tokens": row.get(f"{m}_tokens", 0)} for m, label in names]
    kinds = [{"billed by kind": k.replace("_", " "), "usd": row.get(f"billed_{k}_usd", 0.0),
              "tokens": row.get(f"billed_{k}_tokens", 0)}
             for k in ("input", "output", "cache_read", "cache_write")]
    return (html_table(rows, ["measure", "usd", "tokens"])
            + html_table(kinds, ["billed by kind", "usd", "tokens"]))


def _partial_banner(page: CostPage) -> str:
    """A banner above everything when the input run is partial: every figure is short."""
    if page.partial is None:
        return ""
    return ("<div class=warn id=partial role=alert><b>PARTIAL INPUT: "
            f"{html.escape(page.partial)}.</b> Every figure below leaves out the usage of "
            "the sessions that were not read.</div>")


def _budget_banner(page: CostPage) -> str:
    """A banner at the top naming every budget period over its limit (or nothing)."""
    breaches = [s for s in page.budgets if s.breached]
    if not breaches:
        return ""
    return ("<div class=breach id=budget-breach role=alert><b>BUDGET LIMIT EXCEEDED:</b>"
            "<ul>" + "".join(f"<li>{html.escape(s.line())}</li>" for s in breaches)
            + "</ul>See <a href='#budgets'>Budgets</a>.</div>")


def _budgets(page: CostPage) -> str:
    """The budgets against their spend, a row per budget and period, those over a level
    coloured."""
    if not page.budgets:
        return ""
    rows = [{"budget": s.budget.name, "period": s.period, "project": s.budget.project,
             "agent": s.budget.agent, "spent_usd": s.spend, "warn_usd": s.budget.warn,
             "limit_usd": s.budget.limit, "projected_usd": s.projected,
             "running": s.running, "status": s.level.value,
             "projected_status": s.projected_level.value} for s in page.budgets]
    columns = ["budget", "period", "project", "agent", "spent_usd", "warn_usd", "limit_usd",
               "projected_usd", "running", "status", "projected_status"]
    return ("<h2 id=budgets>Budgets</h2>"
            + html_table(rows, columns, full=True,
                     classes=[_ROW_CLASS[s.level] for s in page.budgets]))


def render(page: CostPage) -> str:
    """The whole report page.

    Parameters
    ----------
    page : CostPage
        The priced tables (totals, grouped, per day) and the optional replay and
        compaction figures.

    Returns
    -------
    str
        A complete HTML document; plotly.js is inlined, nothing is fetched.
    """
    charts = Charts()
    unknown = page.grouped.unknown
    warn = ("<div class=warn><b>Unknown models: their usage is NOT PRICED (counted as $0)."
            "</b><ul>" + "".join(
                f"<li>{html.escape(u.provider or '(no provider)')} / "
                f"{html.escape(u.model or '(no model)')}: {u.tokens:,} billed tokens in "
                f"{u.records:,} records</li>" for u in unknown)
            + "</ul>Add rules for them in a <code>--prices</code> file.</div>"
            if unknown else "<p class=note>every model was priced.</p>")
    grouped = sorted(page.grouped.table.to_pylist(), key=lambda r: -r["billed_usd"])
    columns = [c for c in page.grouped.table.column_names
               if not c.startswith("billed_") or c == "billed_usd" or c == "billed_tokens"]
    # A figure that is nothing in every row shown says nothing and widens the table
    # past the page: left out, and named (costs.csv has every column).
    keys = {c for k in page.by for c in GROUP_KEYS.get(k, (k,))}
    empty = [c for c in columns if c not in keys and c != "billed_usd"
             and not any(r.get(c) for r in grouped[:MAX_ROWS])]
    columns = [c for c in columns if c not in empty]
    cut = (f"<p class=note>the {MAX_ROWS} costliest of {len(grouped):,} rows; all are in "
           "costs.csv and costs.parquet.</p>" if len(grouped) > MAX_ROWS else "")
    if empty and grouped:
        cut += ("<p class=note>zero in every row, so not shown (costs.csv has them): "
                + ", ".join(f"<code>{html.escape(c)}</code>" for c in empty) + "</p>")
    meta = (f"source <code>{html.escape(page.source)}</code>, run "
            f"<code>{html.escape(page.run_id or '?')}</code>; days: "
            f"{html.escape(page.window)}; {html.escape(page.prices)}")
    by = ", ".join(page.by) or "nothing (one total)"
    if page.timezone:
        meta += f"; days in {html.escape(page.timezone)}"
    marks = [_ROW_CLASS[row_level(r, page.budgets)] for r in grouped[:MAX_ROWS]]
    return "".join([
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>vakpipe cost report</title>", f"<style>{PAGE_CSS}</style></head><body>",
        "<h1>vakpipe cost report</h1>", _partial_banner(page), _budget_banner(page),
        f"<p class=note>{meta}</p>",
        warn,
        "<h2 id=totals>Totals</h2>", _totals(page.totals), _budgets(page),
        "<h2 id=daily>Daily cost by model</h2>", _daily_by_model(page.daily_by_model, charts),
        "<h2 id=split>Billed, effective, wasted</h2>", _billed_split(page.daily, charts),
        "<h2 id=saturation>Window saturation</h2>", _saturation(page, charts),
        "<h2 id=packets>Sessions needing packets</h2>", _packets(page),
        f"<h2 id=grouped>Cost by {html.escape(by)}</h2>", cut,
        html_table(grouped[:MAX_ROWS], columns, full=True,
               classes=marks if page.budgets else None),
        "</body></html>\n",
    ])
