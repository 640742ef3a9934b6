"""Per-partition functions of the replay: audit and replay a batch of sessions, reading
each object once. Module-level and picklable; no dask imports.

The active chain is known only once a whole ledger has been read (the head is its last
valid entry), so the bytes read for the audit are spooled — in memory up to
``SPOOL_MEMORY_BYTES``, then to local disk — and the replay re-reads the spool, not the
object store.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

import pyarrow as pa

from pipeline.audit import SessionAudit, audit_session
from pipeline.catalog import ModelCatalog, load_catalog
from pipeline.io.storage import Location, SessionObject, open_lines, storage_errors
from pipeline.io.tables import REQUESTS_SCHEMA, TURNS_SCHEMA
from pipeline.partitions import BatchResult, audit_batch_result, unreadable
from pipeline.projection import get_rule_set
from pipeline.reader import Entry, read_ledger
from pipeline.scopes import parse_fold_key_to_scopes
from pipeline.session_replay import SessionReplay, replay_session
from pipeline.tokens import get_tokenizer

SPOOL_MEMORY_BYTES = 64 * 2**20


@dataclass(frozen=True)
class ReplayOptions:
    """What a replay run asks for (picklable: it travels with every task)."""

    rules: str = "v1"
    catalog: ModelCatalog = field(default_factory=load_catalog)
    planner: bool = False
    scope: str | None = None


def _tee(lines: Iterator[bytes], spool: IO[bytes]) -> Iterator[bytes]:
    for line in lines:
        spool.write(line)
        yield line


def replay_spooled(obj: SessionObject, audit: SessionAudit, spool: IO[bytes],
                   options: ReplayOptions) -> SessionReplay:
    """Replay a session's active chain from its spooled bytes."""
    spool.seek(0)
    active = audit.active
    entries = (item for item in read_ledger(spool)
               if isinstance(item, Entry) and (item.line, item.id) in active)
    rules = get_rule_set(options.rules)
    cap = options.catalog.lookup(audit.row.get("model")) if options.planner else None
    result = replay_session(obj.key, entries, rules=rules, tokenizer=get_tokenizer(),
                            catalog=options.catalog, planner=cap)
    if options.scope:
        universe = [r["scope"] for r in result.requests]
        chosen = {str(s) for s in parse_fold_key_to_scopes(options.scope, universe)}
        result.requests = [r for r in result.requests if r["scope"] in chosen]
    return result


def audit_and_replay(root: Location, obj: SessionObject,
                     options: ReplayOptions) -> tuple[SessionAudit, SessionReplay | None]:
    """Audit one object and replay it, reading it from storage once."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as spool:
        try:
            with open_lines(root, obj) as lines:
                audit = audit_session(obj.key, _tee(lines, spool), size=obj.size)
        except storage_errors() as err:
            return unreadable(obj, err), None
        audit.row["etag"] = obj.etag
        return audit, replay_spooled(obj, audit, spool, options)


def replay_batch(root: Location, index: int, batch: list[SessionObject],
                 options: ReplayOptions) -> BatchResult:
    """Audit and replay a batch of whole sessions: one Dask task of a replay run."""
    audits: list[SessionAudit] = []
    turns: list[dict[str, object]] = []
    requests: list[dict[str, object]] = []
    for obj in batch:
        audit, replayed = audit_and_replay(root, obj, options)
        audits.append(audit)
        if replayed is not None:
            turns.extend(replayed.turns)
            requests.extend(replayed.requests)
    result = audit_batch_result(index, batch, audits)
    result.extra["turns"] = pa.Table.from_pylist(turns, schema=TURNS_SCHEMA)
    result.extra["requests"] = pa.Table.from_pylist(requests, schema=REQUESTS_SCHEMA)
    return result
