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
from pipeline.compaction import (
    CapacityProfile,
    CompactionEngine,
    CompactionOptions,
    compaction_rows,
    packet_lines,
    supersede,
)
from pipeline.io.archive import ARCHIVE, write_compacted
from pipeline.io.storage import Location, SessionObject, open_lines, storage_errors
from pipeline.io.tables import COMPACTION_SCHEMA, REQUESTS_SCHEMA, TURNS_SCHEMA
from pipeline.partitions import BatchResult, audit_batch_result, unreadable
from pipeline.projection import get_rule_set
from pipeline.reader import Entry, read_ledger
from pipeline.scopes import parse_fold_key_to_scopes
from pipeline.session_replay import SessionReplay, replay_session
from pipeline.tokens import get_tokenizer
from pipeline.types import Code

SPOOL_MEMORY_BYTES = 64 * 2**20


@dataclass(frozen=True)
class ReplayOptions:
    """What a replay run asks for (picklable: it travels with every task)."""

    rules: str = "v1"
    catalog: ModelCatalog = field(default_factory=load_catalog)
    planner: bool = False
    scope: str | None = None
    #: Plan the packets a capacity profile needs (the ``compaction`` table).
    compaction: CompactionOptions | None = None
    #: Write a compacted copy of every session that got packets (``--write-archive``).
    write_archive: bool = False
    #: Where the copies go (set by the run: its staging folder), and the run time their
    #: packets are stamped with.
    archive_to: Location | None = None
    run_ns: int = 0


def _tee(lines: Iterator[bytes], spool: IO[bytes]) -> Iterator[bytes]:
    for line in lines:
        spool.write(line)
        yield line


def _active_entries(spool: IO[bytes], audit: SessionAudit) -> Iterator[Entry]:
    spool.seek(0)
    active = audit.active
    return (item for item in read_ledger(spool)
            if isinstance(item, Entry) and (item.line, item.id) in active)


def replay_spooled(obj: SessionObject, audit: SessionAudit, spool: IO[bytes],
                   options: ReplayOptions) -> SessionReplay:
    """Replay a session's active chain from its spooled bytes (and plan its packets)."""
    rules = get_rule_set(options.rules)
    tokenizer = get_tokenizer()
    model = audit.row.get("model")
    cap = options.catalog.lookup(model) if options.planner else None
    planning = options.compaction
    profile = planning.profile(options.catalog, model) if planning is not None else None
    session_id = audit.row.get("session_id") or obj.key.session_id

    def compaction_engine(profile: CapacityProfile) -> CompactionEngine:
        assert planning is not None
        return CompactionEngine(rules, tokenizer, capacity=profile.capacity,
                                summariser=planning.summariser, session_id=session_id,
                                summary_tokens=planning.summary_tokens)

    # Under the planner the replay and the packet planning share one pass: the requests
    # are then counted with the planned packets in place, for the profile's capacity.
    engine = None
    if profile is not None and options.planner:
        cap = profile.capacity
        engine = compaction_engine(profile)
    result = replay_session(obj.key, _active_entries(spool, audit), rules=rules,
                            tokenizer=tokenizer, catalog=options.catalog, planner=cap,
                            engine=engine)
    if options.scope:
        universe = [r["scope"] for r in result.requests]
        chosen = {str(s) for s in parse_fold_key_to_scopes(options.scope, universe)}
        result.requests = [r for r in result.requests if r["scope"] in chosen]
    if profile is not None:
        if engine is None:
            engine = compaction_engine(profile)
            for entry in _active_entries(spool, audit):
                for _ in engine.feed(entry):
                    pass
        planned = supersede(engine.planned)
        result.compaction = compaction_rows(obj.key, session_id, planned, profile)
        result.packets = planned.survivors
    return result


def _write_archive(obj: SessionObject, audit: SessionAudit, spool: IO[bytes],
                   replayed: SessionReplay, options: ReplayOptions) -> str | None:
    """Write the compacted copy of a session that got packets; return its path.

    A ledger whose last line is torn is not copied: a packet appended after the torn
    line would turn its ``torn_tail`` into another finding (the round trip promises
    none), and vak repairs such a tail itself before it appends.
    """
    head_id, head_hash = audit.row.get("head_id"), audit.row.get("head_hash")
    if (options.archive_to is None or not replayed.packets or not head_id or not head_hash
            or any(f.code is Code.TORN_TAIL for f in audit.findings)):
        return None
    session = audit.row.get("session_id") or obj.key.session_id
    lines = packet_lines(replayed.packets, session, head_id=head_id, head_hash=head_hash,
                         now_ns=options.run_ns)
    write_compacted(options.archive_to, obj.key.path, spool, lines)
    kept = {p.packet_id(session) for p in replayed.packets}
    for row in replayed.compaction:
        row["archived"] = row["packet_id"] in kept
    return obj.key.path


def audit_and_replay(
    root: Location, obj: SessionObject, options: ReplayOptions
) -> tuple[SessionAudit, SessionReplay | None, str | None]:
    """Audit one object and replay it, reading it from storage once; with an archive
    destination, also write its compacted copy (whose path is returned)."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as spool:
        try:
            with open_lines(root, obj) as lines:
                audit = audit_session(obj.key, _tee(lines, spool), size=obj.size)
        except storage_errors() as err:
            return unreadable(obj, err), None, None
        audit.row["etag"] = obj.etag
        replayed = replay_spooled(obj, audit, spool, options)
        return audit, replayed, _write_archive(obj, audit, spool, replayed, options)


def replay_batch(root: Location, index: int, batch: list[SessionObject],
                 options: ReplayOptions) -> BatchResult:
    """Audit and replay a batch of whole sessions: one Dask task of a replay run."""
    audits: list[SessionAudit] = []
    turns: list[dict[str, object]] = []
    requests: list[dict[str, object]] = []
    compaction: list[dict[str, object]] = []
    archived: list[str] = []
    for obj in batch:
        audit, replayed, copy = audit_and_replay(root, obj, options)
        audits.append(audit)
        if replayed is not None:
            turns.extend(replayed.turns)
            requests.extend(replayed.requests)
            compaction.extend(replayed.compaction)
        if copy is not None:
            archived.append(copy)
    result = audit_batch_result(index, batch, audits)
    result.extra["turns"] = pa.Table.from_pylist(turns, schema=TURNS_SCHEMA)
    result.extra["requests"] = pa.Table.from_pylist(requests, schema=REQUESTS_SCHEMA)
    if options.compaction is not None:
        result.extra["compaction"] = pa.Table.from_pylist(compaction, schema=COMPACTION_SCHEMA)
    if options.archive_to is not None:
        result.files[ARCHIVE] = archived
    return result
