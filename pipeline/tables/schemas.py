"""Arrow schemas of the output datasets and row -> table conversion."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.audit.session import USAGE_FIELDS, USAGE_KINDS, SessionAudit
from pipeline.ledger.kernel import columns_c
from pipeline.ledger.types import Finding

_TS = pa.timestamp("ns", tz="UTC")

#: Which format a file is (vak, claude-code, codex) and, for a subagent's transcript,
#: the session it belongs to and the subagent (docs/formats.md).
_PROVENANCE = [
    ("source", pa.string()),
    ("parent_session_path", pa.string()),
    ("subagent", pa.string()),
]

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
        *_PROVENANCE,
        # how the ledger is stored (jsonl, segments) and, for a segment ledger, whether
        # its content was read: plain, opened (with its key) or sealed (docs/segments.md)
        ("storage", pa.string()),
        ("content", pa.string()),
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

#: One row per usage-bearing record: an assistant message's ``meta.usage`` (kind
#: ``message``) or a receipt attempt's (``attempt``); billed / effective / waste per
#: ``docs/cost-rules.md``.
USAGE_SCHEMA = pa.schema(
    [
        ("session_path", pa.string()),
        ("session_id", pa.string()),
        ("agent", pa.string()),
        ("entry_id", pa.string()),
        ("request_id", pa.string()),
        ("kind", pa.string()),
        ("purpose", pa.string()),
        ("ordinal", pa.int32()),
        ("settlement", pa.string()),
        ("winning", pa.bool_()),
        ("ts", _TS),
        ("day", pa.date32()),
        ("provider", pa.string()),
        ("model", pa.string()),
        ("on_active_chain", pa.bool_()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cache_read_tokens", pa.int64()),
        ("cache_write_tokens", pa.int64()),
        ("billed", pa.bool_()),
        ("effective", pa.bool_()),
        ("waste", pa.string()),
        # Of cache_write_tokens, the one-hour writes, where the transcript says (Claude
        # Code); null for vak, whose ledgers do not.
        ("cache_write_1h_tokens", pa.int64()),
        # The speed the provider served the request at, where the transcript says one
        # other than the standard (Claude Code's ``usage.speed``: ``fast``, Anthropic's
        # fast mode, priced apart); null otherwise.
        ("speed", pa.string()),
        *_PROVENANCE,
    ]
)

#: The subagents a session started, each linked to the tool call it answered.
SUBAGENTS_SCHEMA = pa.schema(
    [
        ("session_path", pa.string()),
        ("subagent", pa.string()),
        ("tool_use_id", pa.string()),
        ("entry_id", pa.string()),
        ("line", pa.int64()),
        ("subagent_path", pa.string()),
    ]
)

#: Dataset name -> schema, in the order a run writes them.
DATASETS: dict[str, pa.Schema] = {
    "integrity/sessions": SESSIONS_SCHEMA,
    "integrity/findings": FINDINGS_SCHEMA,
    "usage": USAGE_SCHEMA,
    "subagents": SUBAGENTS_SCHEMA,
}


#: What Arrow raises converting a Python value its column's type cannot hold (an integer
#: past int64 or int32, a list or a number where a string goes, a bool in an integer).
_MISFITS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError)


def rows_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """A table of ``schema`` from dict rows: missing columns are null, and so is every
    value its column's type cannot hold.

    vak writes no such value, but a hostile ledger can make a row hold one (a figure
    summed past int64, a saturation past int32, a payload field of another type copied
    into a string column): that cell is null, the row and the rest of the task stay.
    The rows are converted in one pass (by the C kernel where every value is what its
    column holds: :func:`built_columns`); only when that fails is each column converted
    apart, and a column that fails value by value.
    """
    made = built_columns(rows, schema)
    if made is not None:
        return pa.Table.from_arrays(made, schema=schema)
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except _MISFITS:
        pass
    return pa.Table.from_arrays([_column(rows, f) for f in schema], schema=schema)


def _column(rows: list[dict[str, Any]], column: pa.Field) -> pa.Array:
    values = [row.get(column.name) for row in rows]
    try:
        return pa.array(values, column.type)
    except _MISFITS:
        return pa.array([v if _fits(v, column.type) else None for v in values], column.type)


def _fits(value: Any, kind: pa.DataType) -> bool:
    try:
        pa.array([value], kind)
    except _MISFITS:
        return False
    return True


def sessions_table(rows: list[dict[str, Any]]) -> pa.Table:
    """One ``integrity/sessions`` table from audit rows (missing columns are null, and so
    is a value its column cannot hold: :func:`rows_table`)."""
    return rows_table(rows, SESSIONS_SCHEMA)


def subagents_table(audits: Iterable[SessionAudit]) -> pa.Table:
    """One ``subagents`` table from the links of session audits."""
    rows = [dict(zip(SUBAGENTS_SCHEMA.names[:5], link, strict=True)) for a in audits
            for link in a.links]
    for row in rows:
        # Where Claude Code writes the subagent's transcript (docs/formats.md).
        parent = str(row["session_path"])
        row["subagent_path"] = (f"{parent.removesuffix('.jsonl')}/subagents/"
                                f"agent-{row['subagent']}.jsonl")
    return rows_table(rows, SUBAGENTS_SCHEMA)


def _timestamps(texts: pa.Array) -> pa.Array:
    try:
        return texts.cast(_TS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        # A valid RFC 3339 instant outside what nanoseconds hold (year 2262 on) is null.
        out = []
        for t in texts:
            try:
                out.append(t.cast(_TS))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                out.append(pa.scalar(None, _TS))
        return pa.array(out, _TS)


#: Usage rows converted at a time: a large session's rows are freed as its table grows.
USAGE_CHUNK = 1 << 16
_USAGE_RECORD = pa.struct([(n, pa.string() if n == "ts" else USAGE_SCHEMA.field(n).type)
                           for n in USAGE_FIELDS])


#: The usage columns taken from the session's row, the same on all its records.
SESSION_COLUMNS = ("session_path", "session_id", "agent", "source", "parent_session_path")


#: The C kernel's letter for each column type it builds (``columns_c``); a timestamp's
#: values are int64 in its unit, as an ``int`` converts to it.
_KINDS = {pa.string(): "s", pa.int32(): "i", pa.int64(): "l", pa.bool_(): "b"}


def _kind(arrow_type: pa.DataType) -> str:
    """The kernel's letter for a column type, ``?`` for a type it does not build."""
    return "l" if pa.types.is_timestamp(arrow_type) else _KINDS.get(arrow_type, "?")


def built_columns(rows: list[tuple[Any, ...]] | list[dict[str, Any]],
                  fields: Iterable[pa.Field]) -> list[pa.Array] | None:
    """The columns of ``rows`` (tuples, one value per field; or dicts, a field's value
    under its name, null where missing), built by the C kernel (``columns_c``) as the
    Arrow arrays pyarrow converts the same values into.

    ``None`` where pyarrow must convert them: a field of a type other than string,
    int32, int64, bool or timestamp, a value other than what its column holds as it is
    (a ``str`` subclass, an ``int`` past its column, a ``bool`` where an integer goes, a
    datetime), or no kernel. The kernel takes a third to a half of pyarrow's time, which
    takes each value through its converters (docs/scaling.md, "Tables built in C").
    """
    fields = list(fields)
    kinds = "".join(_kind(field.type) for field in fields)
    if columns_c is None or "?" in kinds:
        return None
    names = tuple(field.name for field in fields) if rows and type(rows[0]) is dict else None
    made = columns_c(rows, kinds.encode(), names)
    if made is None:
        return None
    return [pa.Array.from_buffers(field.type, len(rows),
                                  [None if validity is None else pa.py_buffer(validity),
                                   pa.py_buffer(values),
                                   *([] if data is None else [pa.py_buffer(data)])],
                                  null_count=nulls)
            for field, (nulls, validity, values, data) in zip(fields, made, strict=True)]


def _usage_batch(rows: list[tuple[Any, ...]], sessions: list[tuple[Any, ...]],
                 which: list[int]) -> pa.RecordBatch:
    # The row tuples' columns, by the C kernel or as structs (a C++ pass), then flattened.
    made = built_columns(rows, _USAGE_RECORD)
    if made is None:
        made = pa.array(rows, type=_USAGE_RECORD).flatten()
    data = dict(zip(USAGE_FIELDS, made, strict=True))
    # The session's own columns are the same on all its rows: taken, not converted per row.
    index = pa.array(which, pa.int32())
    for name, values in zip(SESSION_COLUMNS, zip(*sessions, strict=True), strict=True):
        data[name] = pa.array(values, pa.string()).take(index)
    data["ts"] = _timestamps(data["ts"])
    data["day"] = data["ts"].cast(pa.date32())
    return pa.RecordBatch.from_arrays([data[n] for n in USAGE_SCHEMA.names], schema=USAGE_SCHEMA)


def usage_table(audits: Iterable[SessionAudit]) -> pa.Table:
    """One ``usage`` table from the usage rows of session audits (one per record).

    Consumes the rows: each audit's ``usage`` list is emptied as it is converted,
    ``USAGE_CHUNK`` rows at a time, so the rows of a large session and its table are never
    both whole in memory (a 1 GB session has ~3·10⁵ rows).
    """
    batches: list[pa.RecordBatch] = []
    rows: list[tuple[Any, ...]] = []
    sessions: list[tuple[Any, ...]] = []
    which: list[int] = []

    def flush() -> None:
        if rows:
            batches.append(_usage_batch(rows, sessions, which))
        rows.clear()
        sessions.clear()
        which.clear()

    for a in audits:
        usage = a.usage
        if not usage:
            continue
        session = tuple(a.row.get(c) for c in SESSION_COLUMNS)
        if len(usage) <= USAGE_CHUNK:  # small sessions travel together
            if len(rows) + len(usage) > USAGE_CHUNK:
                flush()
            which += [len(sessions)] * len(usage)
            sessions.append(session)
            rows += usage
            usage.clear()
            continue
        flush()
        parts = []
        while usage:  # from the end: each chunk's tuples are freed once converted
            chunk = usage[-USAGE_CHUNK:]
            del usage[-USAGE_CHUNK:]
            parts.append(_usage_batch(chunk, [session], [0] * len(chunk)))
        batches += reversed(parts)
    flush()
    return pa.Table.from_batches(batches, schema=USAGE_SCHEMA)


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

TURNS_SCHEMA = pa.schema(
    [
        ("session_path", pa.string()),
        ("turn", pa.int32()),
        ("scope", pa.string()),
        ("turn_id", pa.string()),
        ("state", pa.string()),
        ("iterations", pa.int32()),
        ("forms", pa.int32()),
        ("has_card", pa.bool_()),
        ("tokens_full", pa.int64()),
        ("tokens_card", pa.int64()),
        ("recorded_tokens_full", pa.int64()),
        ("recorded_tokens_card", pa.int64()),
        ("reported_input_tokens", pa.int64()),
        ("reported_output_tokens", pa.int64()),
        ("first_ts", _TS),
    ]
)

REQUESTS_SCHEMA = pa.schema(
    [
        ("session_path", pa.string()),
        ("scope", pa.string()),
        ("turn", pa.int32()),
        ("iteration", pa.int32()),
        ("entry_id", pa.string()),
        ("model", pa.string()),
        ("provider", pa.string()),
        ("model_known", pa.bool_()),
        ("rules", pa.string()),
        ("replayed_tokens", pa.int64()),
        ("reported_input_tokens", pa.int64()),
        ("reported_output_tokens", pa.int64()),
        ("drift_tokens", pa.int64()),
        ("recorded_prefix_digest", pa.string()),
        ("replayed_prefix_digest", pa.string()),
        ("prefix_digest_match", pa.bool_()),
        ("recorded_prefix_tokens", pa.int64()),
        ("replayed_prefix_tokens", pa.int64()),
        ("plan_source", pa.string()),
        ("plan_full", pa.int32()),
        ("plan_card", pa.int32()),
        ("plan_packet_range", pa.string()),
        ("request_digest", pa.string()),
        ("last_request_tokens", pa.int64()),
        ("model_input_limit", pa.int64()),
        ("saturation", pa.int32()),
        ("headroom_tokens", pa.int64()),
        ("auto_compress_above", pa.int64()),
        ("turn_total_tokens", pa.int64()),
        ("hint_level", pa.string()),
        ("hint_text", pa.string()),
        ("now_line", pa.string()),
    ]
)

#: The replay datasets, committed with the integrity ones when a run replays.
REPLAY_DATASETS: dict[str, pa.Schema] = {"turns": TURNS_SCHEMA, "requests": REQUESTS_SCHEMA}

COMPACTION_SCHEMA = pa.schema(
    [
        ("session_path", pa.string()),
        ("session_id", pa.string()),
        ("packet_id", pa.string()),
        ("scope", pa.string()),
        ("first_turn", pa.int32()),
        ("last_turn", pa.int32()),
        ("first_turn_id", pa.string()),
        ("last_turn_id", pa.string()),
        ("turns_covered", pa.int32()),
        ("tokens_before", pa.int64()),
        ("tokens_after", pa.int64()),
        ("summary", pa.string()),
        ("summary_tokens", pa.int64()),
        ("summary_detail", pa.string()),
        ("summariser", pa.string()),
        ("summariser_version", pa.string()),
        ("seeded_from", pa.string()),
        ("needed_by_scope", pa.string()),
        ("needed_by_entry_id", pa.string()),
        ("fits", pa.bool_()),
        ("superseded", pa.bool_()),
        ("archived", pa.bool_()),
        ("profile", pa.string()),
        ("model", pa.string()),
        ("model_input_limit", pa.int64()),
    ]
)

COMPACTION_DATASETS: dict[str, pa.Schema] = {"compaction": COMPACTION_SCHEMA}


def compaction_counts(table: pa.Table) -> dict[str, int]:
    """Sessions needing packets, packets planned and superseded, in a compaction table."""
    needing = pc.count_distinct(table["session_path"]).as_py() if table.num_rows else 0
    superseded = pc.sum(table["superseded"]).as_py() or 0 if table.num_rows else 0
    return {"sessions_needing_packets": needing, "packets": table.num_rows,
            "packets_superseded": superseded}


CHECKPOINTS_SCHEMA = pa.schema(
    [
        ("session_path", pa.string()),
        ("verified_bytes", pa.int64()),
        ("prefix_sha256", pa.string()),
        ("entries", pa.int64()),
        ("head_hash", pa.string()),
        ("etag", pa.string()),
        ("size", pa.int64()),
        # A segment ledger's checkpoint (JSON: seal entries, sealed segments verified,
        # the open segment's verified frames; docs/segments.md); null for JSONL.
        ("segments", pa.string()),
    ]
)


#: Every Parquet dataset a run may write, by name (a run writes those its options ask).
OUTPUT_DATASETS: dict[str, pa.Schema] = {
    **DATASETS, **REPLAY_DATASETS, **COMPACTION_DATASETS, "checkpoints": CHECKPOINTS_SCHEMA}


def schemas_digest() -> str:
    """A digest of every output dataset's columns and types.

    Rows carried forward from an earlier run (the nightly audit) must have the columns
    of tonight's tables: a column renamed or retyped since makes them stale, so the
    nightly fingerprint includes this and such a night reads everything again.
    """
    text = "\n".join(f"{name}: {schema.field(i).name} {schema.field(i).type}"
                     for name, schema in sorted(OUTPUT_DATASETS.items())
                     for i in range(len(schema)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
