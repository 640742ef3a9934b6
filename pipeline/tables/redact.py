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
    columns = []
    changed = False
    for field, column in zip(table.schema, table.columns, strict=True):
        if field.name not in kept and (pa.types.is_string(field.type)
                                       or pa.types.is_large_string(field.type)):
            new = _redact_column(column, limits.get(field.name))
            changed = changed or new is not column
            column = new
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=table.schema) if changed else table
