"""The cost report as one self-contained HTML page. Pure (pyarrow and plotly only).

The charts are plotly's, with plotly.js inlined once in the page: the report opens
offline, from a file or an object store, with no CDN. Tables are plain HTML.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.costs import CostReport

#: Width of a saturation bin (percent of the model's input window), and the last bin.
SATURATION_STEP, SATURATION_CAP = 5, 150
#: Rows of a grouped cost table shown in the page (the CSV has them all).
MAX_ROWS = 200
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{padding:.25em .7em;
border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}th{background:#f4f4f4}
.wide{overflow-x:auto}
td:first-child,th:first-child{text-align:left}.warn{background:#fff3cd;border:1px solid
#e0b400;padding:.6em 1em}.note{color:#666}h2{margin-top:1.8em}
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


def _cell(v: Any, usd: bool = False) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else ""
    if usd:
        return f"${v:,.4f}"
    if isinstance(v, int):
        return f"{v:,}"
    return html.escape(str(v))


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c), c.endswith('usd'))}</td>"
                                    for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


class _Charts:
    """Plotly figures as HTML fragments; plotly.js goes into the first one only."""

    def __init__(self) -> None:
        self.n = 0

    def bars(self, title: str, x: list[str], series: dict[str, list[float]],
             y_title: str) -> str:
        import plotly.graph_objects as go  # heavy: only when a report is drawn

        fig = go.Figure([go.Bar(name=name, x=x, y=y) for name, y in series.items()])
        fig.update_layout(title=title, barmode="stack", template="plotly_white",
                          height=380, yaxis_title=y_title, legend_title_text="",
                          margin={"t": 50, "b": 40, "l": 60, "r": 20})
        self.n += 1
        return str(fig.to_html(full_html=False, include_plotlyjs=self.n == 1,
                               div_id=f"chart-{self.n}", config={"displaylogo": False}))


def _daily_by_model(report: CostReport, charts: _Charts) -> str:
    t = report.table
    if t.num_rows == 0:
        return "<p class=note>no billed usage in the window</p>"
    days = sorted({str(d) for d in t["day"].to_pylist()})
    at = {d: i for i, d in enumerate(days)}
    series: dict[str, list[float]] = {}
    for row in t.select(["day", "model", "billed_usd"]).to_pylist():
        y = series.setdefault(row["model"] or "(no model)", [0.0] * len(days))
        y[at[str(row["day"])]] += row["billed_usd"]
    return charts.bars("Billed cost per day, by model", days, series, "USD")


def _billed_split(report: CostReport, charts: _Charts) -> str:
    t = report.table
    if t.num_rows == 0:
        return ""
    days = [str(d) for d in t["day"].to_pylist()]
    series = {"effective": t["effective_usd"].to_pylist(),
              "wasted: abandoned branches": t["wasted_abandoned_usd"].to_pylist(),
              "wasted: failed or retried attempts": t["wasted_retry_usd"].to_pylist()}
    return charts.bars("Billed = effective + wasted, per day", days, series, "USD")


def _saturation(page: CostPage, charts: _Charts) -> str:
    if page.saturation is None:
        return ("<p class=note>no replay in this run (no <code>requests</code> table): "
                "run <code>vakpipe audit --replay</code> to see how full each request's "
                "window was.</p>")
    if not page.saturation:
        return "<p class=note>the requests table has no saturation figures.</p>"
    labels = [label for label, _ in page.saturation]
    chart = charts.bars("Requests by window saturation", labels,
                        {"requests": [float(n) for _, n in page.saturation]}, "requests")
    hints = _table([{"hint level": k, "requests": v}
                    for k, v in sorted((page.hints or {}).items())], ["hint level", "requests"])
    return chart + hints


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
        text += _table(p.top, list(p.top[0]))
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
    return (_table(rows, ["measure", "usd", "tokens"])
            + _table(kinds, ["billed by kind", "usd", "tokens"]))


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
    charts = _Charts()
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
    cut = (f"<p class=note>the {MAX_ROWS} costliest of {len(grouped):,} rows; all are in "
           "costs.csv and costs.parquet.</p>" if len(grouped) > MAX_ROWS else "")
    meta = (f"source <code>{html.escape(page.source)}</code>, run "
            f"<code>{html.escape(page.run_id or '?')}</code>; days: "
            f"{html.escape(page.window)}; {html.escape(page.prices)}")
    by = ", ".join(page.by) or "nothing (one total)"
    return "".join([
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>vakpipe cost report</title>", f"<style>{_CSS}</style></head><body>",
        "<h1>vakpipe cost report</h1>", f"<p class=note>{meta}</p>", warn,
        "<h2>Totals</h2>", _totals(page.totals),
        "<h2>Daily cost by model</h2>", _daily_by_model(page.daily_by_model, charts),
        "<h2>Billed, effective, wasted</h2>", _billed_split(page.daily, charts),
        "<h2>Window saturation</h2>", _saturation(page, charts),
        "<h2>Sessions needing packets</h2>", _packets(page),
        f"<h2>Cost by {html.escape(by)}</h2>", cut,
        "<div class=wide>", _table(grouped[:MAX_ROWS], columns), "</div>",
        "</body></html>\n",
    ])
