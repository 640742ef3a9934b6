"""``vakpipe compact``: the compaction packets every session needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pipeline.cli._exits import exit_on
from pipeline.cli._options import (
    WINDOW,
    build_replay_options,
    cluster_options,
    force_option,
    keys_option,
    max_line_option,
    progress_option,
    session_option,
)
from pipeline.cli._output import json_option, json_output
from pipeline.errors import UsageError
from pipeline.io.storage import parse_storage_options, resolve

if TYPE_CHECKING:
    from pipeline.run.orchestrate import RunSummary


@click.command()
@click.argument("root")
@click.option("--out", required=True, help="Output location (any fsspec URL or folder).")
@click.option("--window", type=WINDOW, default=None,
              help="What-if: plan for this input window instead of each session's model.")
@click.option("--model", "what_if_model", default=None, metavar="NAME",
              help="What-if: plan for this catalog model's capacity.")
@click.option("--summariser", default="cards", show_default=True, metavar="NAME",
              help="Who writes the summaries: cards, http, or an installed plug-in's name "
                   "(vakpipe plugins).")
@click.option("--summariser-url", default=None, metavar="URL",
              help="OpenAI-compatible endpoint of the http summariser.")
@click.option("--summariser-model", default=None, metavar="NAME",
              help="Model the http summariser asks (default: --model, else the URL's).")
@click.option("--summary-tokens", type=click.IntRange(min=16), default=2000,
              show_default=True, help="Upper bound of one summary's tokens.")
@click.option("--write-archive", is_flag=True,
              help="Also write compacted copies of the affected ledgers under OUT/archive.")
@click.option("--rules", default="v1", show_default=True, help="Projection rule set.")
@click.option("--catalog", "catalog_path", default=None, type=click.Path(dir_okay=False),
              help="Your own model catalog (TOML); its rules come first.")
@session_option
@cluster_options
@progress_option
@max_line_option
@force_option
@json_option
@keys_option
def compact(root: str, out: str, window: int | None, what_if_model: str | None,
            summariser: str, summariser_url: str | None, summariser_model: str | None,
            summary_tokens: int, write_archive: bool, rules: str, catalog_path: str | None,
            session_ids: tuple[str, ...], scheduler: str | None, workers: int | None,
            storage_options: tuple[str, ...], progress: bool | None,
            max_line_bytes: int, as_json: bool) -> None:
    """Plan the compaction packets every session under ROOT needs, under OUT.

    Each session is replayed under planner v1 for its bound model's capacity (or the
    --window / --model what-if); where a request's plan names a packet range no stored
    packet covers, a packet is planned and summarised from the turns' cards. Writes the
    integrity, turns, requests and compaction tables; --write-archive adds compacted
    copies of the ledgers (the source archive is never written).
    """
    from jobs.audit import summary_json
    from jobs.compact import print_compaction_summary

    with json_output("compact", as_json) as doc:
        summary = _compact(root, out, window, what_if_model, summariser, summariser_url,
                           summariser_model, summary_tokens, write_archive, rules,
                           catalog_path, session_ids, scheduler, workers, storage_options,
                           progress, max_line_bytes)
        print_compaction_summary(summary, write_archive=write_archive)
        doc.set(summary_json(summary))
        exit_on(None, summary)


def _compact(root: str, out: str, window: int | None, what_if_model: str | None,
             summariser: str, summariser_url: str | None, summariser_model: str | None,
             summary_tokens: int, write_archive: bool, rules: str, catalog_path: str | None,
             session_ids: tuple[str, ...], scheduler: str | None, workers: int | None,
             storage_options: tuple[str, ...], progress: bool | None,
             max_line_bytes: int) -> RunSummary:
    from jobs.compact import compact_job
    from pipeline.compaction.engine import CompactionOptions
    from pipeline.compaction.registry import get_summariser

    if window is not None and what_if_model is not None:
        raise UsageError("--window and --model are two what-ifs: give one")
    if summariser == "http":
        if not summariser_url:
            raise UsageError("--summariser http needs --summariser-url")
        writer = get_summariser("http", url=summariser_url,
                                model=summariser_model or what_if_model or "")
        probe = getattr(writer, "probe", None)
        if probe is not None:
            probe()  # an unreachable endpoint is a setup error, before any read
    else:
        writer = get_summariser(summariser)  # cards, or a plug-in (an unknown name: exit 2)
    options = parse_storage_options(storage_options)
    replay_opts = build_replay_options(rules, True, catalog_path, window, None)
    if what_if_model is not None and replay_opts.catalog.lookup(what_if_model) is None:
        raise UsageError(f"--model {what_if_model!r} is not in the model catalog")
    return compact_job(
        resolve(root, options), resolve(out, options), replay_opts,
        CompactionOptions(writer, window=window, model=what_if_model,
                          summary_tokens=summary_tokens),
        write_archive=write_archive, sessions=frozenset(session_ids) or None,
        scheduler=scheduler, workers=workers, progress=progress,
        max_line_bytes=max_line_bytes)
