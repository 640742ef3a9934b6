"""Arrow schemas of the output datasets and row -> table conversion."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from pipeline.audit import USAGE_KINDS
from pipeline.types import Finding

_TS = pa.timestamp("ns", tz="UTC")

SESSIONS_SCHEMA = pa.schema(
    [
        ("session_path", pa.string()),
        ("agent", pa.string()),
        ("cwd_hash", pa.string()),
        ("session_id", pa.string()),
        ("bytes", pa.int64()),
        ("etag", pa.string()),
        ("lines", pa.int64()),
        ("entries", pa.int64()),
        ("status", pa.string()),
        ("errors", pa.int32()),
        ("warnings", pa.int32()),
        ("infos", pa.int32()),
        ("head_id", pa.string()),
        ("head_hash", pa.string()),
        ("active_chain_len", pa.int64()),
        ("abandoned_entries", pa.int64()),
        ("model", pa.string()),
        ("provider", pa.string()),
        ("app_version", pa.string()),
        ("first_ts", _TS),
        ("last_ts", _TS),
        ("turns", pa.int64()),
        ("requests", pa.int64()),
        ("requests_abandoned", pa.int64()),
        ("receipt_attempts", pa.int64()),
        ("receipt_failed_attempts", pa.int64()),
        *[(f"{k}_tokens", pa.int64()) for k in USAGE_KINDS],
        *[(f"{k}_tokens_abandoned", pa.int64()) for k in USAGE_KINDS],
        *[(f"billed_{k}_tokens", pa.int64()) for k in USAGE_KINDS],
    ]
)

FINDINGS_SCHEMA = pa.schema(
    [
        ("session_path", pa.string()),
        ("line", pa.int64()),
        ("code", pa.string()),
        ("severity", pa.string()),
        ("entry_id", pa.string()),
        ("detail", pa.string()),
    ]
)

#: Dataset name -> schema, in the order a run writes them.
DATASETS: dict[str, pa.Schema] = {
    "integrity/sessions": SESSIONS_SCHEMA,
    "integrity/findings": FINDINGS_SCHEMA,
}


def sessions_table(rows: list[dict[str, Any]]) -> pa.Table:
    """One ``integrity/sessions`` table from audit rows (missing columns are null)."""
    return pa.Table.from_pylist(rows, schema=SESSIONS_SCHEMA)


def findings_table(items: Iterable[tuple[str, Finding]]) -> pa.Table:
    """One ``integrity/findings`` table from ``(session_path, finding)`` pairs."""
    cols: dict[str, list[Any]] = {name: [] for name in FINDINGS_SCHEMA.names}
    for path, f in items:
        cols["session_path"].append(path)
        cols["line"].append(f.line)
        cols["code"].append(f.code.text)
        cols["severity"].append(f.severity.label)
        cols["entry_id"].append(f.entry_id)
        cols["detail"].append(f.detail)
    return pa.Table.from_pydict(cols, schema=FINDINGS_SCHEMA)
