"""Per-batch functions of the replay: audit and replay a batch of sessions, reading
each object once. Module-level and picklable; no dask imports.

The active chain is known only once a whole ledger has been read (the head is its last
valid entry), so the bytes read for the audit are spooled — in memory up to
``SPOOL_MEMORY_BYTES``, then to local disk — and the replay re-reads the spool, not the
object store.
"""

from __future__ import annotations

import errno
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import IO

from pipeline.audit.checkpoint import Checkpoint, PrefixHasher, checkpoint_of
from pipeline.audit.session import SessionAudit
from pipeline.compaction.engine import (
    CapacityProfile,
    CompactionEngine,
    CompactionOptions,
    compaction_rows,
    packet_lines,
    supersede,
)
from pipeline.errors import StorageError
from pipeline.formats import VAK
from pipeline.io.archive import ARCHIVE, write_compacted
from pipeline.io.storage import (
    MAX_LINE_BYTES,
    Location,
    ReadAhead,
    SessionObject,
    check_output,
    guarded_lines,
)
from pipeline.ledger.layout import SEGMENTS
from pipeline.ledger.reader import Entry, read_ledger, reread_entry
from pipeline.ledger.segments import SegmentCheckpoint, SegmentReport
from pipeline.ledger.types import Code
from pipeline.replay.catalog import ModelCatalog, load_catalog
from pipeline.replay.engine import ReplayEngine
from pipeline.replay.projection import get_rule_set
from pipeline.replay.reported import reported_replay, transcript_entries
from pipeline.replay.scopes import parse_fold_key_to_scopes
from pipeline.replay.session import SessionReplay, replay_session
from pipeline.replay.tokens import get_tokenizer
from pipeline.run.batches import (
    UNCONTAINED,
    BatchResult,
    EndpointWatch,
    ObjectRead,
    RunContext,
    audit_batch_result,
    failed,
    not_attempted,
    read_object,
)
from pipeline.run.collector import cyclic_gc_paused
from pipeline.tables.schemas import (
    CHECKPOINTS_SCHEMA,
    COMPACTION_SCHEMA,
    REQUESTS_SCHEMA,
    TURNS_SCHEMA,
    rows_table,
)

SPOOL_MEMORY_BYTES = 64 * 2**20


@dataclass(frozen=True)
class ReplayOptions:
    """What a replay run was asked for: built once by the CLI or the job, never written
    into (what only the run knows travels apart, in its
    :class:`~pipeline.run.batches.RunContext`); picklable, it goes with every task."""

    rules: str = "v1"
    catalog: ModelCatalog = field(default_factory=load_catalog)
    planner: bool = False
    scope: str | None = None
    #: Plan the packets a capacity profile needs (the ``compaction`` table).
    compaction: CompactionOptions | None = None
    #: Write a compacted copy of every session that got packets (``--write-archive``).
    write_archive: bool = False


def active_entries(spool: IO[bytes], audit: SessionAudit,
                   max_line_bytes: int = MAX_LINE_BYTES,
                   kept: list[Entry] | None = None) -> Iterator[Entry]:
    """The active-chain entries of a spooled ledger, root first: of ``kept`` (the
    entries the audit read, when it kept them), else read again from the spool's start
    through the same line limit as the audit (the spool holds the over-long lines)."""
    active = audit.active
    if kept is not None:
        return (e for e in kept if (e.line, e.id) in active)
    spool.seek(0)
    lines = guarded_lines(spool, max_line_bytes)
    if audit.row.get("source", VAK) != VAK:
        # Another agent's transcript: its adapter reads it again (ids are its own).
        return transcript_entries(lines, active)
    if any(f.code is Code.TORN_MERGE or (f.code is Code.DAMAGED_ENTRY and f.entry_id)
           for f in audit.findings):
        # Entries recovered from inside a line: only the reader finds them again.
        return (item for item in read_ledger(lines)
                if isinstance(item, Entry) and (item.line, item.id) in active)
    return _entries_on(lines, {line for line, _ in active})


def _entries_on(lines: Iterator[bytes], wanted: set[int]) -> Iterator[Entry]:
    """The entries on the physical lines ``wanted``, which the audit found valid, one
    entry a line: parsed again, neither hashed nor checked (half the cost of a read)."""
    for number, raw in enumerate(lines, 1):
        if number in wanted:
            yield reread_entry(raw[:-1] if raw[-1:] == b"\n" else raw, number)


def replay_spooled(obj: SessionObject, audit: SessionAudit, spool: IO[bytes],
                   options: ReplayOptions, kept: list[Entry] | None = None, *,
                   max_line_bytes: int = MAX_LINE_BYTES,
                   new_engine: Callable[[str | None], ReplayEngine] | None = None
                   ) -> SessionReplay:
    """Replay a session's active chain from its spooled bytes (read again through the
    line limit of the audit, ``max_line_bytes``), or from the entries the audit
    ``kept`` (and plan its packets).

    ``new_engine`` makes, for the session's model, the engine that replays a vak ledger
    instead of the default one (of the options' rule set and planner): ``vakpipe show``
    renders its request from the engine that made the request's row. Not with options
    that plan packets (their engine plans them).
    """
    def entries() -> Iterator[Entry]:
        return active_entries(spool, audit, max_line_bytes, kept)

    if audit.row.get("source", VAK) != VAK:
        # Another agent's transcript: its turns and reported sizes, nothing to replay or
        # compact.
        turns, requests = reported_replay(
            audit, options.catalog, entries())
        if options.scope:
            universe = [r["scope"] for r in requests]
            chosen = {str(s) for s in parse_fold_key_to_scopes(options.scope, universe)}
            requests = [r for r in requests if r["scope"] in chosen]
        return SessionReplay(turns=turns, requests=requests)
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
    if profile is not None and new_engine is not None:
        raise ValueError("an engine of its own cannot plan packets")
    engine = new_engine(model) if new_engine is not None else None
    planning_engine = None
    if profile is not None and options.planner:
        cap = profile.capacity
        engine = planning_engine = compaction_engine(profile)
    result = replay_session(obj.key, entries(),
                            rules=rules,
                            tokenizer=tokenizer, catalog=options.catalog, planner=cap,
                            engine=engine)
    if options.scope:
        universe = [r["scope"] for r in result.requests]
        chosen = {str(s) for s in parse_fold_key_to_scopes(options.scope, universe)}
        result.requests = [r for r in result.requests if r["scope"] in chosen]
    if profile is not None:
        if planning_engine is None:
            planning_engine = compaction_engine(profile)
            for entry in entries():
                for _ in planning_engine.feed(entry):
                    pass
        planned = supersede(planning_engine.planned)
        result.compaction = compaction_rows(obj.key, session_id, planned, profile)
        result.packets = planned.survivors
    return result


def _write_archive(obj: SessionObject, audit: SessionAudit, spool: IO[bytes],
                   replayed: SessionReplay, context: RunContext,
                   root: Location | None = None) -> str | None:
    """Write the compacted copy of a session that got packets; return its path.

    A ledger whose last line is torn is not copied: a packet appended after the torn
    line would turn its ``torn_tail`` into another finding (the round trip promises
    none), and vak repairs such a tail itself before it appends.

    Never where a source ledger is: the copy's path, its links resolved, must lie
    outside the archive ``root``, and no symbolic link may lie on its way below the
    staging folder (else :class:`~pipeline.errors.OutputInsideArchiveError` or
    :class:`~pipeline.errors.UnsafeOutputError`, which stop the run).
    """
    head_id, head_hash = audit.row.get("head_id"), audit.row.get("head_hash")
    staging = context.staging
    if (staging is None or not replayed.packets or not head_id or not head_hash
            or any(f.code is Code.TORN_TAIL for f in audit.findings)
            # A compressed ledger (.jsonl.gz/.zst) is not copied: its copy would be the
            # decompressed bytes under a compressed name (docs/formats.md).
            or obj.key.compression is not None
            # Nor a segment ledger: its copy would be decrypted content (docs/segments.md).
            or obj.key.storage == SEGMENTS):
        return None
    session = audit.row.get("session_id") or obj.key.session_id
    lines = packet_lines(replayed.packets, session, head_id=head_id, head_hash=head_hash,
                         now_ns=context.run_ns)
    target = staging.join(obj.key.path)
    staging.check_inside(target)
    if root is not None:
        check_output(root, staging, (target,))
    try:
        write_compacted(staging, obj.key.path, spool, lines)
    except StorageError as err:
        # A key the output's filesystem cannot hold as a name (an S3 key of 1,000 bytes,
        # one local file name is at most 255): that copy is left out, its packets stay
        # ``archived: false``, and the run goes on. Any other failure is the output's.
        cause = err.__cause__
        if not isinstance(cause, OSError) or cause.errno != errno.ENAMETOOLONG:
            raise
        return None
    kept = {p.packet_id(session) for p in replayed.packets}
    for row in replayed.compaction:
        row["archived"] = row["packet_id"] in kept
    return obj.key.path


def audit_and_replay(
    root: Location, obj: SessionObject, options: ReplayOptions, context: RunContext,
    new_hasher: Callable[[], PrefixHasher] | None = None,
    watch: EndpointWatch | None = None, *, spool: IO[bytes] | None = None,
    new_engine: Callable[[str | None], ReplayEngine] | None = None,
    segments_before: SegmentCheckpoint | None = None, ahead: ReadAhead | None = None,
) -> tuple[ObjectRead, SessionReplay | None, str | None]:
    """Audit one object and replay it, reading it from storage once
    (:func:`~pipeline.run.batches.read_object`, its bytes spooled); with the run's
    staging folder for copies, also write its compacted copy (whose path is returned).

    ``new_hasher``, ``watch``, ``segments_before`` and ``ahead`` are
    :func:`~pipeline.run.batches.read_object`'s,
    ``new_engine`` :func:`replay_spooled`'s; ``spool``, a caller's spool that outlives
    the call (``vakpipe show`` reads it again), else a temporary one. No replay when
    the object was not read; a replay that raises (a bug; not the errors of
    :data:`~pipeline.run.batches.UNCONTAINED`) makes it ``audit_failed`` like an audit
    that raised, with no replay (the hasher of the read is kept: it judges the history
    all the same). The cyclic collector is paused meanwhile
    (:func:`~pipeline.run.collector.cyclic_gc_paused`).
    """
    if spool is None:
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as temporary:
            return audit_and_replay(root, obj, options, context, new_hasher, watch,
                                    spool=temporary, new_engine=new_engine,
                                    segments_before=segments_before, ahead=ahead)
    with cyclic_gc_paused():
        read = read_object(root, obj, context, spool=spool, new_hasher=new_hasher,
                           watch=watch, segments_before=segments_before, ahead=ahead)
        if not read.read:
            return read, None, None
        try:
            replayed = replay_spooled(obj, read.audit, spool, options, read.kept,
                                      max_line_bytes=context.max_line_bytes,
                                      new_engine=new_engine)
            copy = _write_archive(obj, read.audit, spool, replayed, context, root)
        except UNCONTAINED:
            raise
        except Exception as err:
            # Like an audit that raised: the object is ``audit_failed``, nothing of its
            # audit kept (no figures, no usage rows without their requests).
            return replace(read, audit=failed(obj, err), read=False, kept=None), None, None
        return read, replayed, copy


def checkpoint_rows(path: str, before: Checkpoint | None, audit: SessionAudit,
                    replayed: SessionReplay | None,
                    hasher: PrefixHasher | None,
                    segments: SegmentReport | None = None) -> list[dict[str, object]]:
    """Judge one object read by a nightly run against its checkpoint ``before``; add the
    history findings to ``audit``; return its checkpoint row for tonight (none or one).

    The verdict depends on the hasher alone, never on the audit or the replay: one that
    raised (``audit_failed``) still gets ``history_truncated``/``history_rewritten`` on
    its row, beside its ``audit_failed``. Its checkpoint is then not advanced: the old
    one is kept without ETag, so the next night reads it again and reports the break
    again, until the session replays (a new checkpoint is only taken of rows that are
    whole). Not read whole (``hasher`` is ``None``): nothing to judge, the old
    checkpoint is kept for the next night to read it again.

    A segment ledger (``segments``, its report) checked against a segment checkpoint is
    judged by its segments instead of its projection's bytes (a seal entry, a sealed
    segment's bytes, the open segment's verified frames: docs/segments.md), which see
    the history of a ledger whose content stays sealed; its new checkpoint holds the
    ledger's own.
    """
    if hasher is None:
        return [] if before is None else [before.reread().as_row()]
    own = segments.checkpoint if segments is not None else None
    if own is not None and before is not None and before.segments is not None \
            and SegmentCheckpoint.from_json(before.segments) is not None:
        broken = list(segments.history) if segments is not None else []
    else:
        broken = hasher.findings(before) if before is not None else []
    audit.add_findings(broken)
    if replayed is None:
        return [] if before is None else [before.reread().as_row()]
    checkpoint = checkpoint_of(path, hasher, audit.row,
                               own.to_json() if own is not None else None)
    return [(checkpoint.reread() if broken else checkpoint).as_row()]


def replay_batch(root: Location, index: int, batch: list[SessionObject],
                 options: ReplayOptions,
                 previous: dict[str, Checkpoint | None] | None = None,
                 context: RunContext | None = None) -> BatchResult:
    """Audit and replay a batch of whole sessions: one Dask task of a replay run.

    With ``previous`` (a nightly run: each object's checkpoint, or ``None`` for a new
    one), every object is checked against its checkpoint while it is read, and the new
    checkpoints are returned as the ``checkpoints`` table. An object that cannot be
    read keeps its old checkpoint; that one, and the new checkpoint of an object with a
    history finding, lose their ETag so the next run reads the object again
    (:meth:`Checkpoint.reread`).
    """
    context = context or RunContext()
    audits: list[SessionAudit] = []
    turns: list[dict[str, object]] = []
    requests: list[dict[str, object]] = []
    compaction: list[dict[str, object]] = []
    archived: list[str] = []
    checkpoints: list[dict[str, object]] = []
    # A dead storage endpoint: once it failed MAX_CONNECTION_FAILURES objects in a row,
    # the rest of the batch is reported not read, without a request.
    watch = EndpointWatch()
    # A segment ledger's checkpoint, parsed once for the read-ahead and the reading.
    segment_checkpoints = {
        obj.key.path: SegmentCheckpoint.from_json(before.segments)
        for obj in batch if obj.key.storage == SEGMENTS and previous is not None
        and (before := previous.get(obj.key.path)) is not None}

    def segments_before(obj: SessionObject) -> SegmentCheckpoint | None:
        return segment_checkpoints.get(obj.key.path)

    with ReadAhead(root, batch, watch.reachable, segments_before=segments_before) as ahead:
        for obj in batch:
            before = previous.get(obj.key.path) if previous is not None else None
            if watch.dead:
                audits.append(not_attempted(obj, watch))
                if previous is not None:
                    checkpoints.extend(checkpoint_rows(obj.key.path, before, audits[-1],
                                                       None, None))
                continue
            read, replayed, copy = audit_and_replay(
                root, obj, options, context, None if previous is None else
                partial(PrefixHasher, before.verified_bytes if before else None), watch,
                segments_before=segments_before(obj), ahead=ahead)
            audit = read.audit
            if previous is not None:
                checkpoints.extend(checkpoint_rows(obj.key.path, before, audit, replayed,
                                                   read.hasher, read.segments))
            audits.append(audit)
            if replayed is not None:
                turns.extend(replayed.turns)
                requests.extend(replayed.requests)
                compaction.extend(replayed.compaction)
            if copy is not None:
                archived.append(copy)
    result = audit_batch_result(index, batch, audits)
    result.extra["turns"] = rows_table(turns, TURNS_SCHEMA)
    result.extra["requests"] = rows_table(requests, REQUESTS_SCHEMA)
    if options.compaction is not None:
        result.extra["compaction"] = rows_table(compaction, COMPACTION_SCHEMA)
    if context.staging is not None:
        result.files[ARCHIVE] = archived
    if previous is not None:
        result.extra["checkpoints"] = rows_table(checkpoints, CHECKPOINTS_SCHEMA)
    return result
