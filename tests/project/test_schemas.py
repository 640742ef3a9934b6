"""The output datasets agree with one another and with the README.

Over every dataset vakpipe writes (the integrity, usage, subagents, replay, compaction
and checkpoint tables, the ``regression`` pairs and the cost table): a column name means
one thing, so a name in two datasets has one type; every timestamp column is a
timestamp (UTC nanoseconds), never a string; names are snake_case; and the README's
Outputs table names only columns that exist.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.costs.report import GROUP_KEYS, cost_schema
from pipeline.ledger.entry import ts_nanos
from pipeline.replay.catalog import load_catalog
from pipeline.replay.projection import get_rule_set
from pipeline.replay.regress import REGRESSION_SCHEMA
from pipeline.replay.session import replay_session
from pipeline.replay.tokens import get_tokenizer
from pipeline.tables.schemas import (
    CHECKPOINTS_SCHEMA,
    COMPACTION_DATASETS,
    DATASETS,
    REPLAY_DATASETS,
    TURNS_SCHEMA,
    rows_table,
)
from tests.helpers.ledgers import read_bytes, sample_session, session_key

README = Path(__file__).resolve().parents[2] / "README.md"
TIMESTAMP = pa.timestamp("ns", tz="UTC")

#: Every dataset a run, a nightly, a regression check or a cost report writes.
ALL: dict[str, pa.Schema] = {
    **DATASETS, **REPLAY_DATASETS, **COMPACTION_DATASETS, "checkpoints": CHECKPOINTS_SCHEMA,
    "regression": REGRESSION_SCHEMA, "cost": cost_schema(tuple(GROUP_KEYS)),
}


def test_a_column_name_has_one_type_in_every_dataset() -> None:
    types: dict[str, dict[str, list[str]]] = {}
    for dataset, schema in ALL.items():
        for field in schema:
            types.setdefault(field.name, {}).setdefault(str(field.type), []).append(dataset)
    clashes = {name: seen for name, seen in types.items() if len(seen) > 1}
    assert clashes == {}


def is_time_name(name: str) -> bool:
    return name == "ts" or name.endswith("_ts") or name.startswith("ts_")


def test_every_timestamp_is_a_timestamp() -> None:
    for dataset, schema in ALL.items():
        for field in schema:
            if is_time_name(field.name) or pa.types.is_timestamp(field.type):
                assert field.type == TIMESTAMP, (dataset, field.name, field.type)


def test_column_names_are_snake_case() -> None:
    for dataset, schema in ALL.items():
        for name in schema.names:
            assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", name), (dataset, name)


def test_one_name_for_cache_writes() -> None:
    """``cache_write`` in every dataset: the provider's "cache creation" is not a second
    name for it."""
    names = {n for schema in ALL.values() for n in schema.names}
    assert not [n for n in names if "cache_creation" in n]
    for kinds in ("{}_tokens", "{}_tokens_abandoned", "billed_{}_tokens"):
        assert kinds.format("cache_write") in DATASETS["integrity/sessions"].names


def outputs_table() -> dict[str, list[str]]:
    """The README's Outputs table: dataset -> the names in its columns cell."""
    text = README.read_text()
    section = text.split("## Outputs", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        rows[cells[0].strip("`")] = re.findall(r"`([^`]+)`", cells[2])
    return rows


def test_the_readme_outputs_table_names_only_columns_that_exist() -> None:
    rows = outputs_table()
    assert set(rows) >= {"integrity/sessions", "integrity/findings", "usage"}
    for dataset, names in rows.items():
        assert dataset in ALL, dataset
        columns = ALL[dataset].names
        for name in names:
            if "*" in name:  # a family of columns: it names at least one
                assert fnmatch.filter(columns, name), (dataset, name)
            else:
                assert name in columns, (dataset, name)


def test_turn_first_ts_is_the_directive_instant() -> None:
    entries, _ = read_bytes(sample_session(turns=3).to_bytes())
    result = replay_session(session_key(), entries, rules=get_rule_set("v1"),
                            tokenizer=get_tokenizer(), catalog=load_catalog(None))
    table = rows_table(result.turns, TURNS_SCHEMA)
    assert table.schema.field("first_ts").type == TIMESTAMP
    at = {e.id: ts_nanos(e.ts) for e in entries}
    got = table.select(["turn_id", "first_ts"]).cast(
        pa.schema([("turn_id", pa.string()), ("first_ts", pa.int64())])).to_pylist()
    assert len(got) == 3
    assert all(r["first_ts"] is not None and r["first_ts"] == at[r["turn_id"]] for r in got)


@given(st.one_of(st.text(max_size=40), st.none(), st.integers(),
                 st.sampled_from(["2026-09-21T14:13:20Z", "2026-09-21T14:13:20.5+02:00",
                                  "9999-12-31T23:59:59Z", "2026-02-30T00:00:00Z"])))
def test_any_turn_first_ts_becomes_a_timestamp_or_null(text: object) -> None:
    row = {"session_path": "s.jsonl", "turn": 1, "first_ts": ts_nanos(text)}
    table = rows_table([row], TURNS_SCHEMA)  # never raises: a misfit is null
    assert table.schema.field("first_ts").type == TIMESTAMP
    assert table.num_rows == 1


@pytest.mark.parametrize("dataset", sorted(ALL))
def test_no_column_holds_timestamps_as_text(dataset: str) -> None:
    for field in ALL[dataset]:
        if is_time_name(field.name):
            assert not pa.types.is_string(field.type), (dataset, field.name)
