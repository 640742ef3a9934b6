"""The cost report's charts are written without plotly's Python objects
(:class:`pipeline.costs.html.Charts`): each fragment must be what plotly's own
``Figure.to_html`` writes for the same figure, to the byte but for the key order inside
the ``plotly_white`` template (same content, read from plotly's template file).

The bytes are plotly 7's. plotly 6 (the lowest release ``pyproject.toml`` admits) wraps
the same figure otherwise (the height on the inner ``div``, ``type="text/javascript"``),
so there the figure is compared: its div id, data, layout and config, as parsed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import plotly
import plotly.graph_objects as go
from hypothesis import given, settings
from hypothesis import strategies as st
from plotly.io.json import to_json_plotly

from pipeline.costs.html import Charts, _plotly_asset, _plotly_json
from pipeline.ledger.text import html_text


def plotly_bars(n: int, title: str, x: list[str], series: dict[str, list[float]],
                y_title: str, *, colours: Mapping[str, str] | None = None,
                log_y: bool = False, counts: bool = False) -> str:
    """The chart as the report drew it with plotly's graph objects (the reference)."""
    colours = colours or {}
    fig = go.Figure([
        go.Bar(name=html_text(name), x=[html_text(v) for v in x],
               y=[v if v or not log_y else None for v in y],
               marker_color=colours.get(name),
               **({"texttemplate": "%{y:,}", "textposition": "outside",
                   "cliponaxis": False} if counts else {}))
        for name, y in series.items()])
    fig.update_layout(title=html_text(title), barmode="stack", template="plotly_white",
                      height=380, yaxis_title=y_title, legend_title_text="",
                      margin={"t": 50, "b": 40, "l": 60, "r": 20})
    if log_y:
        top = max((v for y in series.values() for v in y), default=1.0) or 1.0
        fig.update_yaxes(type="log", range=[math.log10(0.5), math.log10(top * 3)], dtick=1)
    return str(fig.to_html(full_html=False, include_plotlyjs=n == 1, div_id=f"chart-{n}",
                           config={"displaylogo": False}))


def _same_but_template_order(mine: str, theirs: str) -> None:
    template = _plotly_asset("templates/plotly_white.json", json=True)
    ours_t = _plotly_json(template)
    fig = go.Figure(layout={"template": "plotly_white"})
    theirs_t = to_json_plotly(fig.to_dict()["layout"]["template"])
    assert json.loads(ours_t) == json.loads(theirs_t)
    assert mine.count(ours_t) == 1 and theirs.count(theirs_t) == 1
    if PLOTLY_MAJOR >= 7:
        assert mine.replace(ours_t, "T") == theirs.replace(theirs_t, "T")
    else:
        assert new_plot_arguments(mine) == new_plot_arguments(theirs)
        # plotly.js inlined in both or in neither
        assert ("window.PlotlyConfig" in mine) == ("window.PlotlyConfig" in theirs)


PLOTLY_MAJOR = int(plotly.__version__.split(".")[0])


def new_plot_arguments(fragment: str) -> list[Any]:
    """The arguments of the fragment's last ``Plotly.newPlot(...)`` call, parsed: the div
    id, the data, the layout, the config."""
    decoder = json.JSONDecoder()
    at = fragment.rindex("Plotly.newPlot(") + len("Plotly.newPlot(")
    arguments: list[Any] = []
    while True:
        while fragment[at] in " \n,":
            at += 1
        if fragment[at] == ")":
            return arguments
        value, at = decoder.raw_decode(fragment, at)
        arguments.append(value)


_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
_values = st.floats(0, 1e7, allow_nan=False) | st.sampled_from([0.0, 1e-5, 1.0, 3e-9])


@settings(max_examples=40, deadline=None)
@given(st.data(), st.lists(_text, min_size=1, max_size=4, unique=True),
       st.dictionaries(_text, st.none() | st.sampled_from(["#2E91E5", "#FB0D0D"]),
                       min_size=1, max_size=3),
       st.booleans(), st.booleans(), _text, _text)
def test_a_chart_is_what_plotly_writes(data: st.DataObject, x: list[str],
                                       names: dict[str, str | None], log_y: bool,
                                       counts: bool, title: str, y_title: str) -> None:
    series = {name: data.draw(st.lists(_values, min_size=len(x), max_size=len(x)))
              for name in names}
    colours = {k: v for k, v in names.items() if v is not None}
    charts = Charts()
    charts.n = 1  # the second chart of a page: no plotly.js (checked apart, once)
    mine = charts.bars(title, x, series, y_title, colours=colours, log_y=log_y,
                       counts=counts)
    theirs = plotly_bars(2, title, x, series, y_title, colours=colours, log_y=log_y,
                         counts=counts)
    _same_but_template_order(mine, theirs)


def test_the_first_chart_carries_plotly_js_as_plotly_writes_it() -> None:
    series = {"claude-opus-4-6": [1.5, 0.0], "gpt-5.5 <b>": [0.25, 2.0]}
    mine = Charts().bars("Billed ≥150% – cost", ["2026-11-01", "2026-11-02"], series, "USD",
                          colours={"claude-opus-4-6": "#2E91E5"})
    theirs = plotly_bars(1, "Billed ≥150% – cost", ["2026-11-01", "2026-11-02"], series,
                         "USD", colours={"claude-opus-4-6": "#2E91E5"})
    assert len(mine) > 1_000_000  # plotly.js inlined: the page opens offline
    _same_but_template_order(mine, theirs)
