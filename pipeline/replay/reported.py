"""Turns, scopes and utilization of the requests of a transcript vakpipe cannot
replay. Pure.

Claude Code and Codex do not freeze the contract and projection that would let a
request be rebuilt, but they record what the provider reported for each one. Their
``requests`` rows are those reported sizes (input + cache read + cache write) against
the model's window: the transcript's own (Codex's ``model_context_window``), else the
catalog's. ``rules`` is ``"reported"``, the replay columns are null (docs/formats.md).

Their ``turns`` rows and the ``tN/iM`` scope of every request come from the active
chain as the adapter reads it: a user prompt (a directive) starts turn ``tN``; every
model request after it, until the next, is iteration ``tN/iM`` (a request streamed over
several lines is one iteration; its tool calls are its forms); a subagent's requests
copied into its parent are not the parent's. A request before any prompt (a transcript
cut at its start) opens turn ``t1`` itself, rooted at the transcript's root.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pipeline.audit.session import USAGE_FIELDS, SessionAudit
from pipeline.formats import detect
from pipeline.formats.base import ROOT_ID
from pipeline.ledger.entry import is_directive, ts_nanos
from pipeline.ledger.reader import Entry, LineStats
from pipeline.ledger.types import token_count
from pipeline.replay.catalog import ModelCatalog
from pipeline.replay.scopes import turn_range
from pipeline.replay.turns import Iteration, Turn, TurnIndex
from pipeline.replay.utilization import HintLevel, HintState, hint_text, limit_columns, utilization

#: The ``rules`` of a request row measured from reported usage, not replayed.
REPORTED = "reported"


def transcript_entries(lines: Iterable[bytes],
                       active: frozenset[tuple[int, str]]) -> Iterator[Entry]:
    """The active-chain entries of a transcript (``active``: the audit's
    :attr:`~pipeline.audit.session.SessionAudit.active`), read again with its adapter."""
    fmt, rest = detect(lines)
    if fmt is None:
        return iter(())
    return (e for e in fmt.read(rest, LineStats(), {})
            if isinstance(e, Entry) and (e.line, e.id) in active)


def _opening(entry: Entry) -> Entry:
    """The turn a request before any prompt opens: rooted at the transcript's root."""
    return Entry(0, ROOT_ID, None, "message", entry.ts, None, None, "",
                 {"message": {"role": "user", "content": []}})


def reported_replay(audit: SessionAudit, catalog: ModelCatalog,
                    entries: Iterable[Entry]) -> tuple[list[dict[str, Any]],
                                                       list[dict[str, Any]]]:
    """The ``turns`` and ``requests`` rows of a transcript.

    Parameters
    ----------
    audit : SessionAudit
        The transcript's audit (its usage rows say which line carries each request).
    catalog : ModelCatalog
        Model windows, for a request whose transcript does not name its own.
    entries : iterable of Entry
        The transcript's active chain, root first, as its adapter reads it.

    Returns
    -------
    tuple of (list of dict, list of dict)
        Turn rows and request rows (one per request on the active chain, file order).
    """
    path = audit.row["session_path"]
    usage: dict[str, dict[str, Any]] = {}
    for values in audit.usage:
        rec = dict(zip(USAGE_FIELDS, values, strict=True))
        if rec["kind"] == "message" and rec["on_active_chain"]:
            usage[rec["entry_id"]] = rec
    index = TurnIndex()
    requests: list[dict[str, Any]] = []
    # A streamed request's lines share a key: one iteration (of the turn it started in).
    iterations: dict[str, tuple[Turn, Iteration]] = {}
    hint = HintState()
    turn_total: dict[int, int] = {}
    for entry in entries:
        role = entry.role
        if role == "user":
            if is_directive(entry):
                index.start_turn(entry)
            else:
                index.add_user(entry)
            continue
        meta = entry.meta
        key = meta.get("request_key")
        if role != "assistant" or meta.get("mirror") is not None or type(key) is not str:
            continue  # a subagent's copy, or a message no request made (<synthetic>)
        if index.current is None:
            index.start_turn(_opening(entry))
        known = iterations.get(key)
        if known is not None and known[0] is index.current:
            turn, it = known
            index.add_part(entry, it)
        else:
            added = index.add_assistant(entry)
            assert added is not None and index.current is not None
            turn, it = index.current, added
            iterations[key] = (turn, it)
        carried = usage.get(entry.id)
        if carried is None:
            continue  # not the line that carries the request's usage
        rec = carried
        size = rec["input_tokens"] + rec["cache_read_tokens"] + rec["cache_write_tokens"]
        it.reported_input, it.reported_output = size, rec["output_tokens"]
        turn_total[turn.number] = turn_total.get(turn.number, 0) + size
        cap = catalog.lookup(rec["model"])
        # The window the agent itself reported for the request wins over the catalog's.
        limit = token_count(meta.get("window")) or (cap.input_limit if cap else None)
        util = utilization(size, limit, turn_total[turn.number])
        level = hint.update(util)
        n = turn.number
        settled = turn_range(1, n - 1) if n > 1 else None
        requests.append({
            "session_path": path, "scope": f"t{n}/i{it.number}", "turn": n,
            "iteration": it.number, "entry_id": rec["entry_id"], "model": rec["model"],
            "provider": rec["provider"], "model_known": cap is not None, "rules": REPORTED,
            "reported_input_tokens": size, "reported_output_tokens": rec["output_tokens"],
            "last_request_tokens": size, **limit_columns(util),
            "turn_total_tokens": turn_total[n], "hint_level": level.label,
            "hint_text": (hint_text(level, util, settled=settled, open_scope=f"t{n}")
                          if util is not None and level is not HintLevel.NONE else None),
        })
    turns = []
    for t in index.turns:
        inputs = [i.reported_input for i in t.iterations if i.reported_input is not None]
        outputs = [i.reported_output for i in t.iterations if i.reported_output is not None]
        turns.append({
            "session_path": path, "turn": t.number, "scope": t.scope, "turn_id": t.id,
            "state": t.state.value, "iterations": len(t.iterations), "forms": t.forms,
            "has_card": False,
            "reported_input_tokens": sum(inputs) if inputs else None,
            "reported_output_tokens": sum(outputs) if outputs else None,
            "first_ts": ts_nanos(t.first_ts),
        })
    return turns, requests


def reported_requests(audit: SessionAudit, catalog: ModelCatalog,
                      entries: Iterable[Entry]) -> list[dict[str, Any]]:
    """The ``requests`` rows of :func:`reported_replay`."""
    return reported_replay(audit, catalog, entries)[1]
