"""Utilization of the requests of a transcript vakpipe cannot replay. Pure.

Claude Code and Codex do not freeze the contract and projection that would let a
request be rebuilt, but they record what the provider reported for each one. Their
``requests`` rows are those reported sizes (input + cache read + cache write) against
the model's window from the catalog: ``rules`` is ``"reported"``, the replay columns
are null (docs/formats.md).
"""

from __future__ import annotations

from typing import Any

from pipeline.audit import USAGE_FIELDS, SessionAudit
from pipeline.catalog import ModelCatalog
from pipeline.utilization import HintState, limit_columns, utilization

#: The ``rules`` of a request row measured from reported usage, not replayed.
REPORTED = "reported"


def reported_requests(audit: SessionAudit, catalog: ModelCatalog) -> list[dict[str, Any]]:
    """One ``requests`` row per request on the active chain, in file order."""
    rows: list[dict[str, Any]] = []
    hint = HintState()
    path = audit.row["session_path"]
    for values in audit.usage:
        rec = dict(zip(USAGE_FIELDS, values, strict=True))
        if rec["kind"] != "message" or not rec["on_active_chain"]:
            continue
        size = rec["input_tokens"] + rec["cache_read_tokens"] + rec["cache_write_tokens"]
        cap = catalog.lookup(rec["model"])
        util = utilization(size, cap.input_limit if cap else None, size)
        level = hint.update(util)
        rows.append({
            "session_path": path, "entry_id": rec["entry_id"], "model": rec["model"],
            "provider": rec["provider"], "model_known": cap is not None, "rules": REPORTED,
            "reported_input_tokens": size, "reported_output_tokens": rec["output_tokens"],
            "last_request_tokens": size,
            **limit_columns(util),
            "hint_level": level.label,
        })
    return rows
