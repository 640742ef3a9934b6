"""The output tables' redaction (``pipeline.tables.redact``): the whole-column search that
picks the columns to read cell by cell never passes over a cell that holds a secret."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ledger.redact import _WORDS, TRIGGER
from pipeline.tables.redact import _redact_column, redact_table

#: Pieces of cells: rule words (halves of them too, so two cells side by side spell one),
#: secrets of known shapes, text no rule knows, and characters outside ASCII.
PIECES = st.sampled_from([*_WORDS, *(w[: len(w) // 2] for w in _WORDS),
                          *(w[len(w) // 2:] for w in _WORDS),
                          "ghp_" + "A" * 36, "AKIA" + "Q" * 16, "password=hunter2",
                          "sk-ant-api03-" + "x" * 40, "plain", "01a1acca-9f", "é", "İ", " "])
CELL = st.none() | st.lists(PIECES, max_size=4).map("".join)
#: A table's rows of three text cells, in one to three chunks.
CHUNKS = st.lists(st.lists(st.tuples(CELL, CELL, CELL), max_size=6), min_size=1, max_size=3)


def by_cells(table: pa.Table, limits: dict[str, int]) -> list[Any]:
    """Every text column redacted cell by cell (the search per cell alone)."""
    return [_redact_column(table[name], limits.get(name)).to_pylist()
            for name in table.column_names]


@settings(max_examples=300, deadline=None)
@given(chunks=CHUNKS, large=st.booleans(), sliced=st.integers(0, 2), cut=st.booleans())
def test_a_table_is_redacted_as_cell_by_cell(chunks: list[list[tuple[str | None, ...]]],
                                             large: bool, sliced: int, cut: bool) -> None:
    kind = pa.large_string() if large else pa.string()
    # Chunks of different lengths, sliced (their character data then holds more than
    # their cells); the first column cut to a limit when asked.
    table = pa.table({f"c{i}": pa.chunked_array(
        [pa.array([row[i] for row in chunk], kind)[min(sliced, len(chunk)):]
         for chunk in chunks], kind) for i in range(3)})
    limits = {"c0": 12} if cut else {}
    out = redact_table(table, keep=(), limits=limits)
    assert out.column_names == table.column_names and out.schema == table.schema
    assert [out[n].to_pylist() for n in out.column_names] == by_cells(table, limits)


def test_the_trigger_is_words_alone() -> None:
    # What makes one search over a column's joined cells exact: no anchor, no boundary,
    # no class or repetition, nothing that depends on where a cell starts or ends.
    assert TRIGGER.startswith("(?i)")
    body = TRIGGER[len("(?i)"):]
    for special in ("^", "$", "\\b", "\\B", "\\A", "\\z", "(", ")", "[", "*", "+", "?", "{"):
        assert special not in body.replace("\\" + special[-1], ""), special
