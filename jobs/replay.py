"""The replay job (``vakpipe replay``) and the single-request view (``vakpipe show``).

Thin: the logic lives in :mod:`pipeline` (:func:`pipeline.run.orchestrate.run_audit` with
replay options, :mod:`pipeline.replay.show`); this module wires storage to it and prints.
"""

from __future__ import annotations

import posixpath
import tempfile
from typing import Any

import click

from jobs.audit import print_summary
from pipeline.audit.segments import audit_lines
from pipeline.errors import UsageError
from pipeline.formats import VAK
from pipeline.io.storage import (
    Location,
    SessionObject,
    open_lines,
    resolve,
    storage_error,
    storage_errors,
)
from pipeline.ledger.layout import SEGMENTS, SessionKey, parse_session_path, segment_member
from pipeline.ledger.segments import is_ledger
from pipeline.replay.projection import get_rule_set
from pipeline.replay.scopes import parse_scope
from pipeline.replay.show import (
    capture_request,
    find_request,
    format_reported_request,
    format_request,
)
from pipeline.replay.tokens import get_tokenizer
from pipeline.run.orchestrate import RunSummary, run_audit
from pipeline.run.replay_batches import (
    SPOOL_MEMORY_BYTES,
    ReplayOptions,
    active_entries,
    replay_spooled,
)


def replay_job(root: Location, out: Location, options: ReplayOptions, *,
               sessions: frozenset[str] | None = None, scheduler: str | None = None,
               workers: int | None = None, progress: bool | None = None) -> RunSummary:
    """Audit and replay the sessions under ``root`` (all, or those with the ids in
    ``sessions``) and commit the integrity, ``turns`` and ``requests`` tables under
    ``out`` (see :func:`pipeline.run.orchestrate.run_audit`)."""
    return run_audit(root, out, scheduler=scheduler, workers=workers, progress=progress,
                     replay=options, sessions=sessions)


def print_replay_summary(summary: RunSummary) -> None:
    """Print a replay run's summary: the audit's, and where the replay tables are."""
    print_summary(summary)
    click.echo(f"  replay: {summary.out}/turns, {summary.out}/requests")


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
    if info.get("type", "file") != "file":
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
             storage_options: dict[str, Any] | None = None, full: bool = False) -> str:
    """Audit and replay the ledger at ``url``; render its request at ``scope``.

    The object is read once, as a run reads it: through the line limit of ``options``
    (``--max-line-bytes``: a longer line is a damaged line, never held whole), the audit
    reading the lines as they come while its bytes go to a local spool (memory, then
    disk). The batch replay (which gives the request's row, so ``show`` prints what the
    ``requests`` table holds) and the rendering pass (which stops at the request) read
    the spool through the same limit.

    Returns
    -------
    str
        The text to print (:func:`pipeline.replay.show.format_request`).
    """
    loc, obj = session_object(url, storage_options)
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as spool:
        limit = options.max_line_bytes
        try:
            # The spool gets the object's exact bytes (an over-long line in pieces), the
            # audit the guarded lines: the same findings as `vakpipe replay` gives.
            with open_lines(loc, obj, max_line_bytes=limit, tap=spool.write) as lines:
                audit = audit_lines(obj.key, lines, size=obj.size)
        except storage_errors() as err:
            raise storage_error(err, url) from err
        row = find_request(replay_spooled(obj, audit, spool, options).requests, scope, url)
        if audit.row.get("source", VAK) != VAK:
            # Another agent's transcript: nothing to rebuild, what it holds is printed.
            return format_reported_request(row, active_entries(spool, audit, limit),
                                           session=url, audit=audit.row, full=full)
        capacity = options.catalog.lookup(row["model"])
        rendered = capture_request(
            active_entries(spool, audit, limit), row["entry_id"],
            rules=get_rule_set(options.rules),
            tokenizer=get_tokenizer(),
            planner=options.catalog.lookup(audit.row.get("model")) if options.planner else None)
    parsed = parse_scope(scope)
    note = (f"{scope} is a tool call (form) of request {row['scope']}"
            if parsed is not None and parsed.form is not None else None)
    return format_request(row, rendered, session=url, audit=audit.row, capacity=capacity,
                          full=full, note=note)
