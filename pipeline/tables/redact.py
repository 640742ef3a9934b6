"""Redaction of the output tables: every transcript string column, at the table's edge.

The text rules are :mod:`pipeline.ledger.redact`'s; this module applies them to Arrow
columns (RE2 picks out the cells that may hold a secret, only those are redacted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ledger.redact import TRIGGER, quote, redact

__all__ = ["NOT_TRANSCRIPT", "redact_table"]


def _redact_column(column: pa.ChunkedArray, limit: int | None) -> pa.ChunkedArray:
    """One string column, redacted (and cut to ``limit`` characters): Arrow (RE2) picks
    out the cells holding a rule's word or over the limit, and only those go through
    :func:`redact` and are replaced."""
    hit = pc.match_substring_regex(column, TRIGGER)
    if limit is not None:
        hit = pc.or_(hit, pc.greater(pc.utf8_length(column), limit))
    hit = pc.fill_null(hit, False)
    if not pc.any(hit).as_py():
        return column
    old = pc.filter(column, hit).to_pylist()
    new = [redact(v) if limit is None else quote(v, limit) for v in old]
    if new == old:  # a rule's word, and no secret (a hex digest holding "acca")
        return column
    mask = hit.combine_chunks() if isinstance(hit, pa.ChunkedArray) else hit
    return pa.chunked_array([pc.replace_with_mask(column.combine_chunks(), mask,
                                                  pa.array(new, column.type))])


#: Columns of the output tables that never hold transcript text: object keys and what
#: the path gives (they name the archive's objects and must find them again: row 13 of
#: the reliability matrix escapes hostile ones), digests vakpipe computes, validated
#: timestamps, and texts it writes from numbers, scopes and its own vocabularies. Every
#: other string column is redacted, new ones included.
NOT_TRANSCRIPT = frozenset({
    "session_path", "agent", "cwd_hash", "etag", "status", "code", "severity", "kind",
    "waste", "head_hash", "prefix_sha256", "replayed_prefix_digest", "request_digest",
    "rules", "hint_level", "hint_text", "now_line", "scope", "plan_packet_range", "state",
    "first_ts", "summary_detail", "summariser", "summariser_version",
})


def _characters(column: pa.ChunkedArray) -> list[pa.Buffer]:
    """The character data of each chunk of a string column: its cells' bytes one after
    the other (and whatever a null or a slice leaves beside them)."""
    return [data for chunk in column.chunks
            if (data := chunk.buffers()[2]) is not None and data.size]


def _candidates(columns: list[pa.ChunkedArray]) -> list[bool]:
    """Whether each column may hold a rule's word, by one RE2 search over the character
    data of each of its chunks read as one string (all columns in one call).

    :data:`~pipeline.ledger.redact.TRIGGER` is words and nothing else (no anchors, no
    word boundaries), so a word in a cell is a word in the cells' bytes joined: a column
    found without one has no cell with one. A word across two cells is only a false
    alarm: that column is then read cell by cell. One RE2 scan of a table's characters
    instead of one match per cell: the tables of the 536 MB benchmark fleet redact in
    0.061 s of CPU instead of 0.107 s (docs/reliability.md).
    """
    datas = [_characters(column) for column in columns]
    flat = [data for column in datas for data in column]
    if not flat:
        return [False] * len(columns)
    ends = [0]
    for data in flat:
        ends.append(ends[-1] + data.size)
    joined = pa.Array.from_buffers(
        pa.large_string(), len(flat),
        [None, pa.array(ends, pa.int64()).buffers()[1], pa.py_buffer(b"".join(flat))])
    hits = iter(pc.match_substring_regex(joined, TRIGGER).to_pylist())
    return [any([next(hits) for _ in column]) for column in datas]


def redact_table(table: pa.Table, *, keep: Iterable[str] = NOT_TRANSCRIPT,
                 limits: Mapping[str, int] | None = None) -> pa.Table:
    """``table`` with every string column but ``keep`` redacted.

    Parameters
    ----------
    table:
        An output table.
    keep:
        Columns left as they are (default :data:`NOT_TRANSCRIPT`).
    limits:
        Columns cut to at most this many characters after redaction (finding details).
    """
    kept, limits = set(keep), limits or {}
    texts = [i for i, field in enumerate(table.schema) if field.name not in kept
             and (pa.types.is_string(field.type) or pa.types.is_large_string(field.type))]
    columns = table.columns
    # Cut to a limit, a column is read cell by cell; the others first as a whole.
    whole = [i for i in texts if table.schema[i].name not in limits]
    maybe = dict(zip(whole, _candidates([columns[i] for i in whole]), strict=True))
    changed = False
    for i in texts:
        if maybe.get(i, True):
            new = _redact_column(columns[i], limits.get(table.schema[i].name))
            changed = changed or new is not columns[i]
            columns[i] = new
    return pa.Table.from_arrays(columns, schema=table.schema) if changed else table
