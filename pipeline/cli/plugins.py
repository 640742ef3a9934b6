"""``vakpipe plugins``: what the registries know, built in and installed (entry points)."""

from __future__ import annotations

from typing import Any

import click

from pipeline.cli._output import json_option, json_output


def _builtin() -> dict[str, list[str]]:
    from pipeline.compaction.registry import SUMMARISERS
    from pipeline.costs.pricing import BUILTIN_PRICE_SOURCES
    from pipeline.formats import FORMATS
    from pipeline.replay.projection import RULE_SETS

    return {"rule_sets": list(RULE_SETS), "summarisers": list(SUMMARISERS),
            # layers of every price table; --prices NAME tries that one first
            "price_sources": list(BUILTIN_PRICE_SOURCES),
            "formats": ["vak", *(f.name for f in FORMATS)]}


def _rows() -> list[dict[str, Any]]:
    from pipeline import plugins
    from pipeline.costs.pricing import load_toml_prices, with_price_source
    from pipeline.formats import format_adapter
    from pipeline.replay.projection import get_rule_set

    builtin = _builtin()
    rows: list[dict[str, Any]] = [
        {"kind": kind, "group": plugins.GROUPS[kind], "name": name, "builtin": True,
         "distribution": "vakpipe", "version": None, "entry_point": None, "ok": True,
         "error": None}
        for kind, names in builtin.items() for name in names]

    def price_source(name: str) -> object:
        from pipeline.costs.pricing import LayeredPriceTable

        # Made as `cost --prices NAME` makes it, over the shipped TOML layer only
        # (genai-prices' snapshot is not needed to tell whether a plug-in loads).
        return with_price_source(name, LayeredPriceTable((load_toml_prices(None),)))

    verify = {"rule_sets": get_rule_set,
              "formats": lambda name: format_adapter(plugins.load("formats", name)),
              "price_sources": price_source}
    for status in plugins.inventory(verify):
        p = status.plugin
        shadowed = p.name in builtin[p.kind]
        rows.append({
            "kind": p.kind, "group": plugins.GROUPS[p.kind], "name": p.name, "builtin": False,
            "distribution": p.distribution, "version": p.version, "entry_point": p.value,
            "ok": status.error is None and not shadowed,
            "error": ("a built-in has this name: the built-in is used" if shadowed
                      else status.error)})
    return rows


@click.command()
@json_option
def plugins(as_json: bool) -> None:
    """List the rule sets, summarisers, price sources and transcript formats vakpipe
    knows: its own, then the plug-ins installed (entry point groups vakpipe.rule_sets,
    vakpipe.summarisers, vakpipe.price_sources, vakpipe.transcript_formats).

    A plug-in that does not load is listed with the one line saying why (exit 0)."""
    with json_output("plugins", as_json) as doc:
        rows = _rows()
        for kind in _builtin():
            mine = [r for r in rows if r["kind"] == kind]
            click.echo(f"{kind} ({mine[0]['group']}):")
            for r in mine:
                if r["builtin"]:
                    where = "built-in"
                else:
                    where = (f"plug-in {r['distribution'] or '?'} {r['version'] or ''}".rstrip()
                             + f" ({r['entry_point']})")
                line = f"  {r['name']:<20} {where}"
                if r["error"]:
                    line += f"\n  {'':<20} BROKEN: {r['error']}"
                click.echo(line)
        doc.set({"plugins": rows})
