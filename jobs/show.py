"""The single-request view (``vakpipe show``): one ledger's object read and replayed
through the per-object pipeline of every run, one request rendered by that replay.

The logic lives in :mod:`pipeline` (:func:`pipeline.run.replay_batches.audit_and_replay`,
:mod:`pipeline.replay.show`); this module finds the object and builds the text.
"""

from __future__ import annotations

import posixpath
import tempfile
from typing import Any

from pipeline.errors import PipelineError, StorageError, UsageError
from pipeline.formats import VAK
from pipeline.io.storage import (
    MAX_LINE_BYTES,
    Location,
    SessionObject,
    resolve,
    storage_error,
    storage_errors,
)
from pipeline.ledger.layout import SEGMENTS, SessionKey, parse_session_path, segment_member
from pipeline.ledger.redact import redact
from pipeline.ledger.segments import is_ledger
from pipeline.ledger.types import Code
from pipeline.replay.projection import get_rule_set
from pipeline.replay.scopes import parse_scope
from pipeline.replay.show import (
    RenderingEngine,
    find_request,
    format_reported_request,
    format_request,
)
from pipeline.replay.tokens import get_tokenizer
from pipeline.run.batches import RunContext
from pipeline.run.replay_batches import (
    SPOOL_MEMORY_BYTES,
    ReplayOptions,
    active_entries,
    audit_and_replay,
)


def session_object(url: str, storage_options: dict[str, Any] | None = None
                   ) -> tuple[Location, SessionObject]:
    """The one ledger object at ``url``, as a location and a listed object.

    Its key comes from the archive layout when the URL ends with it
    (``agents/<agent>/sessions/<dir>/<id>.jsonl``); a file kept anywhere else is keyed
    by its name only, so the audit reports its directory as ``cwd_hash_mismatch``.

    Raises
    ------
    StorageError
        The object cannot be found or read.
    UsageError
        ``url`` names a folder, not a ledger.
    """
    loc = resolve(url, dict(storage_options or {}))
    try:
        info = loc.filesystem().info(loc.path)
    except storage_errors() as err:
        raise storage_error(err, url) from err
    kind = info.get("type", "file")
    if kind not in ("file", "directory"):
        # A FIFO, a device, a socket on a local disk: never opened (a FIFO would wait
        # for a writer).
        raise UsageError(f"{url}: not a regular file (a FIFO, a device or a socket); "
                         "vakpipe reads ledger files")
    if kind != "file":
        try:
            names = [posixpath.basename(n.rstrip("/"))
                     for n in loc.filesystem().ls(loc.path, detail=False)]
        except storage_errors() as err:
            raise storage_error(err, url) from err
        if is_ledger(names):
            # A segment ledger directory (docs/segments.md): one ledger too.
            name = posixpath.basename(loc.path.rstrip("/"))
            tail = "/".join([*loc.path.rstrip("/").split("/")[-5:], "KEY"])
            key = segment_member(tail) or SessionKey(name, "vak", "-", name,
                                                     storage=SEGMENTS)
            return loc, SessionObject(key, loc.path.rstrip("/"), 0, None)
        raise UsageError(f"{url}: a folder, not one ledger (vakpipe replay reads a whole "
                         "archive)")
    name = posixpath.basename(loc.path)
    tail = "/".join(loc.path.split("/")[-5:])
    key = parse_session_path(tail) or SessionKey(name, "", "", name.removesuffix(".jsonl"))
    etag = info.get("ETag") or info.get("etag")
    return loc, SessionObject(key, loc.path, int(info.get("size") or 0),
                              etag.strip('"') if etag else None)


def show_job(url: str, scope: str, options: ReplayOptions, *,
             storage_options: dict[str, Any] | None = None, full: bool = False,
             max_line_bytes: int = MAX_LINE_BYTES,
             record: dict[str, Any] | None = None) -> str:
    """Audit and replay the ledger at ``url``; render its request at ``scope``.

    The object goes through the per-object pipeline of a run
    (:func:`~pipeline.run.replay_batches.audit_and_replay`: the same line limit, the same
    findings as ``vakpipe replay`` gives, its bytes read once into a local spool), and
    the replay that makes the request's row renders the request
    (:class:`~pipeline.replay.show.RenderingEngine`): the figures and the text printed
    are those of one replay.

    ``record``, when given, gets the request's ``requests`` row (``request``; its texts
    redacted as the table's are) and the session's source, id, model and status
    (``session``): what ``vakpipe show --json`` prints beside the text.

    Returns
    -------
    str
        The text to print (:func:`pipeline.replay.show.format_request`).

    Raises
    ------
    StorageError
        The object could not be read (or changed under both reads).
    PipelineError
        Its audit or replay failed (``audit_failed``).
    UsageError
        No request at ``scope``.
    """
    loc, obj = session_object(url, storage_options)
    context = RunContext(max_line_bytes=max_line_bytes)
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as spool:
        # The model the planner plans for is known once the header is read: the engine
        # is made then (replay_spooled makes its own for another agent's transcript).
        engines: list[RenderingEngine] = []

        def rendering(model: str | None) -> RenderingEngine:
            cap = options.catalog.lookup(model) if options.planner else None
            engines.append(RenderingEngine(get_rule_set(options.rules), get_tokenizer(),
                                           planner=cap, scope=scope))
            return engines[-1]

        read, replayed, _ = audit_and_replay(loc, obj, options, context, spool=spool,
                                             new_engine=rendering)
        audit = read.audit
        if replayed is None:
            finding = audit.findings[0] if audit.findings else None
            detail = f"{finding.code.text}: {finding.detail}" if finding else "not read"
            if finding is not None and finding.code is Code.AUDIT_FAILED:
                raise PipelineError(f"{url}: {detail}")
            raise StorageError(f"{url}: {detail}")
        row = find_request(replayed.requests, scope, url)
        if record is not None:
            record["request"] = {k: redact(v) if isinstance(v, str) else v
                                 for k, v in row.items()}
            record["session"] = {k: audit.row.get(k) for k in
                                 ("session_id", "source", "agent", "model", "provider",
                                  "status")}
        if audit.row.get("source", VAK) != VAK:
            # Another agent's transcript: nothing to rebuild, what it holds is printed.
            return format_reported_request(
                row, active_entries(spool, audit, max_line_bytes, read.kept),
                session=url, audit=audit.row, full=full)
    rendered = engines[0].rendered if engines else None
    if rendered is None:  # a row the rendering replay did not rebuild: a bug
        raise PipelineError(f"{url}: request {row['scope']} was replayed but not rendered")
    parsed = parse_scope(scope)
    note = (f"{scope} is a tool call (form) of request {row['scope']}"
            if parsed is not None and parsed.form is not None else None)
    return format_request(row, rendered, session=url, audit=audit.row,
                          capacity=options.catalog.lookup(row["model"]), full=full, note=note)
