"""The fleet dashboard: one self-contained HTML page per nightly output or audit run.
Pure (pyarrow, and plotly's files through :mod:`pipeline.costs.html`).

What a person looks at in the morning, without SQL: integrity findings per night (the
trend), history breaks, the sessions needing compaction packets and the tokens those
packets would save, window saturation by model, cost billed / effective / wasted by
project and day, and the sessions wasting most. Every chart has its numbers in a table
under it (and on hover). The charts are the cost report's (plotly.js inlined once, names
escaped); the figures are computed here from the run's tables
(:func:`night_of`, :func:`cost_by_project_day`, ...), the page by :func:`render_dashboard`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.costs.html import PAGE_CSS, SPLIT_COLOURS, Charts, html_table, model_colours
from pipeline.costs.pricing import PriceTable
from pipeline.costs.report import CostReport, price_usage

__all__ = ["HISTORY_CODES", "SATURATION_BANDS", "DashboardPage", "Night", "PacketSavings",
           "cost_by_project_day", "night_of", "packet_savings", "render_dashboard",
           "saturation_by_model", "top_waste"]

#: Findings that say a session's history changed under the nightly audit.
HISTORY_CODES = ("history_truncated", "history_rewritten", "session_missing")
SEVERITIES = ("error", "warning", "info")
_SEVERITY_COLOURS = {"error": "#FB0D0D", "warning": "#E0B400", "info": "#778AAE"}
#: Saturation bands (percent of the model's input window): lower bounds, and labels.
SATURATION_BANDS = ((0, "under 50%"), (50, "50–80%"), (80, "80–100%"), (100, "over 100%"))
_BAND_COLOURS = {"under 50%": "#1CA71C", "50–80%": "#2E91E5", "80–100%": "#E0B400",
                 "over 100%": "#FB0D0D"}
#: Rows of a "top" table.
TOP = 20


@dataclass(frozen=True)
class Night:
    """One nightly partition's (or one run's) integrity figures."""

    label: str
    sessions: int
    #: Findings by severity, and by code.
    severities: dict[str, int]
    codes: dict[str, int]
    partial: bool = False


@dataclass(frozen=True)
class PacketSavings:
    """Sessions needing packets and what the planned packets would save."""

    sessions: int
    packets: int
    tokens_before: int
    tokens_after: int
    top: list[dict[str, Any]]

    @property
    def tokens_saved(self) -> int:
        """Tokens the planned packets take out of the requests that need them."""
        return self.tokens_before - self.tokens_after


@dataclass(frozen=True)
class DashboardPage:
    """Everything the page shows; ``None`` marks a table the run did not write."""

    source: str
    #: The run the figures other than the trend come from (the newest night).
    run_id: str | None
    nights: list[Night]
    cost: list[dict[str, Any]]
    top_waste: list[dict[str, Any]]
    saturation: list[dict[str, Any]] | None
    packets: PacketSavings | None
    prices: str
    unpriced: list[str] = field(default_factory=list)
    #: Nights whose tables retention (``nightly --keep-days``) expired: not shown.
    expired: list[str] = field(default_factory=list)


#: The columns of a night's ``integrity/sessions`` and ``integrity/findings`` the page
#: reads (:func:`night_of`, :func:`cost_by_project_day`): a reader need read no other.
SESSION_COLUMNS = ["session_path", "agent", "cwd_hash"]
FINDING_COLUMNS = ["severity", "code"]


def night_of(label: str, sessions: pa.Table, findings: pa.Table, *,
             partial: bool = False) -> Night:
    """A night's figures from its ``integrity/sessions`` and ``integrity/findings``."""
    severities = {r["values"]: r["counts"]
                  for r in findings["severity"].value_counts().to_pylist()} \
        if findings.num_rows else {}
    codes = {r["values"]: r["counts"] for r in findings["code"].value_counts().to_pylist()} \
        if findings.num_rows else {}
    return Night(label, sessions.num_rows, severities, codes, partial)


def _projects(sessions: pa.Table) -> dict[str, str]:
    """``session_path`` -> project: the Claude Code project folder, the vak cwd hash,
    Codex's day folder (the sessions table's ``cwd_hash``), with its agent."""
    out = {}
    for r in sessions.select(["session_path", "agent", "cwd_hash"]).to_pylist():
        out[r["session_path"]] = f"{r['agent'] or '?'}: {r['cwd_hash'] or '(none)'}"
    return out


def by_day_and_session(usage: pa.Table, prices: PriceTable) -> CostReport:
    """``usage`` priced by day and session: what :func:`cost_by_project_day` and
    :func:`top_waste` sum up, and the page's totals (exact, whatever the grouping), from
    one pricing pass."""
    return price_usage(usage, prices, ["day", "session"])


def cost_by_project_day(per: pa.Table, sessions: pa.Table) -> list[dict[str, Any]]:
    """Billed, effective and wasted dollars by project and day (a subagent's usage under
    its parent session's project), sorted by day then project; ``per`` is the cost table
    of :func:`by_day_and_session`."""
    projects = _projects(sessions)
    sums: dict[tuple[str, str], dict[str, Any]] = {}
    for r in per.select(["day", "session_path", "billed_usd", "effective_usd",
                         "wasted_usd", "billed_tokens", "wasted_tokens"]).to_pylist():
        key = (str(r["day"]), projects.get(r["session_path"], "(unknown)"))
        row = sums.setdefault(key, {"day": key[0], "project": key[1], "billed_usd": 0.0,
                                    "effective_usd": 0.0, "wasted_usd": 0.0,
                                    "billed_tokens": 0, "wasted_tokens": 0})
        for k in ("billed_usd", "effective_usd", "wasted_usd", "billed_tokens",
                  "wasted_tokens"):
            row[k] += r[k] or 0
    return [sums[k] for k in sorted(sums)]


#: What :func:`top_waste` shows of a session, summed over its days.
_WASTE_COLUMNS = ["wasted_usd", "wasted_tokens", "wasted_abandoned_usd", "wasted_retry_usd",
                  "billed_usd"]


def top_waste(per: pa.Table, n: int = TOP) -> list[dict[str, Any]]:
    """The ``n`` sessions with the most wasted dollars (abandoned branches, retries);
    ``per`` is the cost table of :func:`by_day_and_session`."""
    sums = per.group_by("session_path", use_threads=False).aggregate(
        [(c, "sum") for c in _WASTE_COLUMNS]).rename_columns(
        ["session_path", *_WASTE_COLUMNS])
    rows = [r for r in sums.to_pylist() if (r["wasted_usd"] or 0) > 0 or r["wasted_tokens"]]
    rows.sort(key=lambda r: (-r["wasted_usd"], -r["wasted_tokens"], r["session_path"]))
    return [{"session": r["session_path"], "wasted_usd": r["wasted_usd"],
             "wasted_tokens": r["wasted_tokens"],
             "wasted_abandoned_usd": r["wasted_abandoned_usd"],
             "wasted_retry_usd": r["wasted_retry_usd"], "billed_usd": r["billed_usd"]}
            for r in rows[:n]]


def saturation_by_model(requests: pa.Table) -> list[dict[str, Any]]:
    """Per model: requests in each saturation band, the median and largest saturation."""
    t = requests.select(["model", "saturation"]).filter(pc.is_valid(requests["saturation"]))
    by_model: dict[str, list[int]] = {}
    for model, sat in zip(t["model"].to_pylist(), t["saturation"].to_pylist(), strict=True):
        by_model.setdefault(model or "(no model)", []).append(int(sat))
    out = []
    for model in sorted(by_model):
        values = sorted(by_model[model])
        row: dict[str, Any] = {"model": model, "requests": len(values)}
        for i, (low, label) in enumerate(SATURATION_BANDS):
            high = SATURATION_BANDS[i + 1][0] if i + 1 < len(SATURATION_BANDS) else None
            row[label] = sum(1 for v in values if v >= low and (high is None or v < high))
        row["median %"] = values[len(values) // 2]
        row["max %"] = values[-1]
        out.append(row)
    return out


def packet_savings(compaction: pa.Table, n: int = TOP) -> PacketSavings:
    """Sessions needing packets (superseded ones left out), the tokens before and after
    the planned packets, and the ``n`` sessions that would save most."""
    live = compaction.filter(pc.invert(pc.fill_null(compaction["superseded"], False)))
    per: dict[str, dict[str, Any]] = {}
    for r in live.select(["session_path", "model", "tokens_before", "tokens_after"]
                         ).to_pylist():
        row = per.setdefault(r["session_path"], {"session": r["session_path"],
                                                 "model": r["model"], "packets": 0,
                                                 "tokens_before": 0, "tokens_after": 0})
        row["packets"] += 1
        row["tokens_before"] += r["tokens_before"] or 0
        row["tokens_after"] += r["tokens_after"] or 0
    for row in per.values():
        row["tokens_saved"] = row["tokens_before"] - row["tokens_after"]
    top = sorted(per.values(), key=lambda r: (-r["tokens_saved"], r["session"]))[:n]
    return PacketSavings(len(per), live.num_rows,
                         sum(r["tokens_before"] for r in per.values()),
                         sum(r["tokens_after"] for r in per.values()), top)


# --- the page ---------------------------------------------------------------------------


def _trend(page: DashboardPage, charts: Charts) -> str:
    labels = [n.label for n in page.nights]
    series = {s: [float(n.severities.get(s, 0)) for n in page.nights] for s in SEVERITIES}
    chart = charts.bars("Integrity findings per night, by severity", labels, series,
                        "findings", colours=_SEVERITY_COLOURS)
    rows = [{"night": n.label, "sessions": n.sessions,
             **{s: n.severities.get(s, 0) for s in SEVERITIES},
             "partial": n.partial} for n in page.nights]
    codes = sorted({c for n in page.nights for c in n.codes})
    by_code = [{"code": c, **{n.label: n.codes.get(c, 0) for n in page.nights}}
               for c in codes]
    return (chart + html_table(rows, ["night", "sessions", *SEVERITIES, "partial"])
            + "<h3>Findings by code and night</h3>"
            + (html_table(by_code, ["code", *labels], full=len(labels) > 8) if by_code
               else "<p class=note>no findings.</p>"))


def _history(page: DashboardPage, charts: Charts) -> str:
    total = sum(n.codes.get(c, 0) for n in page.nights for c in HISTORY_CODES)
    rows = [{"night": n.label, **{c: n.codes.get(c, 0) for c in HISTORY_CODES}}
            for n in page.nights]
    lead = (f"<p><b>{total:,}</b> history breaks over {len(page.nights):,} "
            f"night{'s' if len(page.nights) != 1 else ''}: a verified history that was cut, "
            "rewritten, or whose object went missing.</p>")
    if not total:
        return lead + "<p class=note>none: every verified history still hashes the same.</p>"
    series = {c: [float(n.codes.get(c, 0)) for n in page.nights] for c in HISTORY_CODES}
    return lead + charts.bars("History breaks per night", [n.label for n in page.nights],
                              series, "findings") + html_table(rows, ["night", *HISTORY_CODES])


def _packets(page: DashboardPage, charts: Charts) -> str:
    p = page.packets
    if p is None:
        return ("<p class=note>no compaction table: run the nightly audit with "
                "<code>--compaction</code> (or <code>vakpipe compact</code>) to plan "
                "packets.</p>")
    text = (f"<p><b>{p.sessions:,}</b> sessions need packets ({p.packets:,} planned); "
            f"the packets would take the requests that need them from {p.tokens_before:,} "
            f"to {p.tokens_after:,} tokens: <b>{p.tokens_saved:,} tokens saved</b>.</p>")
    if not p.top:
        return text
    chart = charts.bars("Tokens the planned packets would save, top sessions",
                        [r["session"] for r in p.top],
                        {"tokens saved": [float(r["tokens_saved"]) for r in p.top]}, "tokens")
    return text + chart + html_table(p.top, ["session", "model", "packets", "tokens_before",
                                         "tokens_after", "tokens_saved"])


def _saturation(page: DashboardPage, charts: Charts) -> str:
    if page.saturation is None:
        return ("<p class=note>no replay in this run (no <code>requests</code> table): the "
                "nightly audit replays; <code>vakpipe audit --replay</code> does too.</p>")
    if not page.saturation:
        return "<p class=note>the requests table has no saturation figures.</p>"
    labels = [label for _, label in SATURATION_BANDS]
    models = [r["model"] for r in page.saturation]
    series = {label: [float(r[label]) for r in page.saturation] for label in labels}
    chart = charts.bars("Requests by window saturation, per model", models, series,
                        "requests", colours=_BAND_COLOURS)
    return chart + html_table(page.saturation, ["model", "requests", *labels, "median %",
                                            "max %"])


def _cost(page: DashboardPage, charts: Charts) -> str:
    if not page.cost:
        return "<p class=note>no billed usage.</p>"
    days = sorted({r["day"] for r in page.cost})
    at = {d: i for i, d in enumerate(days)}
    projects = sorted({r["project"] for r in page.cost})
    by_project: dict[str, list[float]] = {p: [0.0] * len(days) for p in projects}
    split = {k: [0.0] * len(days) for k in ("effective", "wasted")}
    for r in page.cost:
        by_project[r["project"]][at[r["day"]]] += r["billed_usd"]
        split["effective"][at[r["day"]]] += r["effective_usd"]
        split["wasted"][at[r["day"]]] += r["wasted_usd"]
    totals: dict[str, dict[str, Any]] = {}
    for r in page.cost:
        t = totals.setdefault(r["project"], {"project": r["project"], "billed_usd": 0.0,
                                            "effective_usd": 0.0, "wasted_usd": 0.0,
                                            "wasted_tokens": 0})
        for k in ("billed_usd", "effective_usd", "wasted_usd", "wasted_tokens"):
            t[k] += r[k]
    by_total = sorted(totals.values(), key=lambda t: -t["billed_usd"])
    unpriced = ("<div class=warn><b>Not priced (counted as $0):</b> "
                + html.escape("; ".join(page.unpriced)) + "</div>") if page.unpriced else ""
    return "".join([
        unpriced,
        charts.bars("Billed cost per day, by project", days, by_project, "USD",
                    colours=model_colours(projects)),
        charts.bars("Billed = effective + wasted, per day", days,
                    {"effective": split["effective"], "wasted": split["wasted"]}, "USD",
                    colours={"effective": SPLIT_COLOURS["effective"],
                             "wasted": SPLIT_COLOURS["wasted: abandoned branches"]}),
        "<h3>By project</h3>",
        html_table(by_total, ["project", "billed_usd", "effective_usd", "wasted_usd",
                          "wasted_tokens"]),
        "<h3>By project and day</h3>",
        html_table(page.cost, ["day", "project", "billed_usd", "effective_usd", "wasted_usd",
                           "billed_tokens", "wasted_tokens"], full=True),
    ])


def _waste(page: DashboardPage) -> str:
    if not page.top_waste:
        return "<p class=note>no session wasted anything.</p>"
    return html_table(page.top_waste, ["session", "wasted_usd", "wasted_tokens",
                                   "wasted_abandoned_usd", "wasted_retry_usd", "billed_usd"],
                  full=True)


def render_dashboard(page: DashboardPage) -> str:
    """The whole dashboard page.

    Parameters
    ----------
    page : DashboardPage
        The nights' figures and the newest night's tables' figures.

    Returns
    -------
    str
        A complete HTML document; plotly.js is inlined, nothing is fetched.
    """
    charts = Charts()
    newest = page.nights[-1].label if page.nights else "?"
    partial = [n.label for n in page.nights if n.partial]
    banner = ("<div class=warn id=partial role=alert><b>PARTIAL NIGHTS: "
              + html.escape(", ".join(partial)) + ".</b> Some sessions were not read on "
              "those nights; their figures are short.</div>") if partial else ""
    meta = (f"source <code>{html.escape(page.source)}</code>; newest: "
            f"<code>{html.escape(newest)}</code> (run <code>{html.escape(page.run_id or '?')}"
            f"</code>); {html.escape(page.prices)}")
    if page.expired:
        span = " ... ".join(dict.fromkeys((page.expired[0], page.expired[-1])))
        meta += (f"; {len(page.expired):,} earlier night(s) not shown, their tables expired "
                 f"by --keep-days ({html.escape(span)})")
    return "".join([
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>vakpipe fleet dashboard</title>", f"<style>{PAGE_CSS}</style></head><body>",
        "<h1>vakpipe fleet dashboard</h1>", banner, f"<p class=note>{meta}</p>",
        "<h2 id=findings>Integrity findings per night</h2>", _trend(page, charts),
        "<h2 id=history>History breaks</h2>", _history(page, charts),
        "<h2 id=packets>Sessions needing packets</h2>", _packets(page, charts),
        "<h2 id=saturation>Window saturation by model</h2>", _saturation(page, charts),
        "<h2 id=cost>Cost: billed, effective, wasted by project and day</h2>",
        _cost(page, charts),
        "<h2 id=waste>Top sessions by waste</h2>", _waste(page),
        "</body></html>\n",
    ])

