"""Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``) read as vak
entries. Pure.

The rules, decided in docs/formats.md:

* a rollout is linear: each line's parent is the line before it, the first
  (``session_meta``) hangs from the synthetic root;
* a model request is a ``token_count`` event whose ``total_token_usage`` moved: Codex
  repeats the same event (same totals) after a request, and those repeats are not
  requests. Its usage is ``last_token_usage``, else the difference of the totals;
  OpenAI counts cached input inside ``input_tokens``, so uncached input is
  ``input_tokens - cached_input_tokens`` and ``cached_input_tokens`` is the cache read;
  reasoning tokens are inside ``output_tokens`` (billed as output);
* the model is the newest ``turn_context``'s, the provider ``session_meta``'s
  ``model_provider``; ``model_context_window`` travels with the request;
* a turn starts at an ``event_msg`` ``user_message`` (the ``response_item`` user
  messages repeat it with the environment context and are not turns);
* a request's entry holds what the model answered with: the assistant text and the
  tool calls (``function_call``, ``custom_tool_call``, ``local_shell_call``,
  ``web_search_call``) written since the request before, as ``text`` and ``tool_use``
  blocks (the forms of its iteration);
* a request's key (``meta.request_key``) is its turn's id (``task_started`` /
  ``turn_context`` ``turn_id``) and the totals it moved to, never the line's outer
  timestamp: a fork copies its parent's history with every outer timestamp rewritten;
* a fork (``session_meta.forked_from_id``) starts with its parent's history: the
  requests of turns started before the fork (``task_started.started_at``, else the
  time in the turn's UUIDv7 id) are copies (``meta.copied``), reported by one
  ``fork_history`` finding; the cost report bills each once (its key is the parent's);
* the context window is Codex's own ``model_context_window`` (``token_count`` info,
  else the turn's ``task_started``), carried with the request (``meta.window``);
* a ``compacted`` line is a compaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from pipeline.formats.base import ROOT_ID, count, json_lines, root_entry, text
from pipeline.ledger.layout import CODEX
from pipeline.ledger.reader import Entry, LineStats
from pipeline.ledger.redact import quote
from pipeline.ledger.types import TOKEN_COUNT_WANTED, Code, Finding, bad_field_detail, token_count

_sha256 = hashlib.sha256
_new_entry = tuple.__new__
_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context",
                    "compacted"})
_TOTALS = ("input_tokens", "cached_input_tokens", "output_tokens")
#: ``response_item`` types that are a call of a tool by the model (a form).
_CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call",
                    "web_search_call"})


def _totals(usage: Any) -> tuple[int, int, int] | None:
    if type(usage) is not dict:
        return None
    return count(usage.get(_TOTALS[0])), count(usage.get(_TOTALS[1])), count(usage.get(_TOTALS[2]))


def _bad_count(info: dict[str, Any]) -> str | None:
    """The ``bad_field`` detail of the first count of a ``token_count`` event's usages
    present as anything but a token count (absent or null: 0), else ``None``."""
    for name in ("last_token_usage", "total_token_usage"):
        usage = info.get(name)
        if type(usage) is dict:
            for key in _TOTALS:
                v = usage.get(key)
                if v is not None and token_count(v) is None:
                    return bad_field_detail(f"payload.info.{name}.{key}", v,
                                            TOKEN_COUNT_WANTED)
    return None


def vak_usage(total_input: int, cached: int, output: int) -> dict[str, int]:
    """OpenAI's counts in vak's (Anthropic's) fields: cached input apart from input."""
    cached = min(cached, total_input)
    return {"input_tokens": total_input - cached, "output_tokens": output,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def iso_ms(value: Any) -> int | None:
    """Milliseconds since the epoch of an ISO 8601 time with an offset, else ``None``."""
    if type(value) is not str:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return int(when.timestamp() * 1000) if when.tzinfo is not None else None


def uuid7_ms(value: Any) -> int | None:
    """The creation time (ms since the epoch) a UUIDv7 holds in its first 48 bits."""
    if type(value) is not str or len(value) != 36 or value[14:15] != "7":
        return None
    try:
        return int(value[:8] + value[9:13], 16)
    except ValueError:
        return None


def _started_ms(payload: dict[str, Any], turn_id: str | None) -> int | None:
    """When a turn started: ``started_at`` (seconds), else its UUIDv7 id's time."""
    started = payload.get("started_at")
    if isinstance(started, (int, float)) and not isinstance(started, bool) and started > 0:
        return int(started * 1000) if started < 2**40 else None
    return uuid7_ms(turn_id)


def _answer(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The blocks a ``response_item`` adds to the model's answer (text, a tool call)."""
    ptype = payload.get("type")
    if ptype == "message" and payload.get("role") == "assistant":
        content = payload.get("content")
        return [{"type": "text", "text": b["text"]} for b in content
                if type(b) is dict and type(b.get("text")) is str] \
            if type(content) is list else []
    if ptype in _CALLS:
        name = text(payload.get("name")) or str(ptype)
        args = payload.get("arguments", payload.get("input", payload.get("action")))
        return [{"type": "tool_use", "id": text(payload.get("call_id")) or "", "name": name,
                 "input": args if args is not None else {}}]
    return []


class Codex:
    """The Codex CLI adapter (:class:`~pipeline.formats.base.TranscriptFormat`)."""

    name = CODEX

    def sniff(self, obj: dict[str, Any]) -> bool:
        """Codex lines are ``{timestamp, type, payload}`` with a type of its own."""
        return obj.get("type") in _TYPES and "payload" in obj

    def read(self, lines: Iterable[bytes], stats: LineStats,
             header: dict[str, Any]) -> Iterator[Entry | Finding]:
        """Stream a Codex rollout as entries (see the module's rules)."""
        header["links"] = []
        yield root_entry()
        parent = ROOT_ID
        model: str | None = None
        totals: tuple[int, int, int] | None = None
        turn: str | None = None  # the current turn's id
        started: int | None = None  # when it started (ms)
        window: int | None = None  # the turn's model_context_window
        answer: list[dict[str, Any]] = []  # the model's blocks since the last request
        forked: str | None = None
        fork_ms: int | None = None
        fork_line = 0
        copied = 0
        head: bytes | None = None  # the newest entry's stored bytes
        for item in json_lines(lines, stats):
            if isinstance(item, Finding):
                yield item
                continue
            number, body, obj = item
            get = obj.get
            kind, payload = get("type"), get("payload")
            payload = payload if type(payload) is dict else {}
            ptype = payload.get("type")
            data: dict[str, Any] = obj
            entry_kind = "activity"
            ts = get("timestamp")
            if type(ts) is not str:  # text(...) or "", inlined: once a line
                ts = ""
            if kind == "response_item":
                answer.extend(_answer(payload))
            elif kind == "session_meta":
                if "session_id" not in header:
                    # The first is the rollout's own; a fork copies its parent's after it.
                    header.update(session_id=text(payload.get("id")),
                                  cwd=text(payload.get("cwd")),
                                  provider=text(payload.get("model_provider")),
                                  app_version=text(payload.get("cli_version")))
                    forked = text(payload.get("forked_from_id"))
                    fork_ms = iso_ms(payload.get("timestamp")) or iso_ms(ts)
                    fork_line = number
            elif kind == "turn_context":
                model = text(payload.get("model")) or model
                if model and not header.get("model"):
                    header["model"] = model
                now_turn = text(payload.get("turn_id"))
                if now_turn is not None and now_turn != turn:
                    turn, started = now_turn, _started_ms(payload, now_turn)
            elif kind == "compacted":
                entry_kind = "compaction"
            elif kind == "event_msg" and ptype == "task_started":
                turn = text(payload.get("turn_id")) or turn
                started = _started_ms(payload, turn)
                window = count(payload.get("model_context_window")) or None
            elif kind == "event_msg" and ptype == "user_message":
                entry_kind = "message"
                data = {"message": {"role": "user", "content": [
                    {"type": "text", "text": text(payload.get("message")) or ""}]}, "meta": {}}
            elif kind == "event_msg" and ptype == "token_count":
                info = payload.get("info")
                info = info if type(info) is dict else {}
                now = _totals(info.get("total_token_usage"))
                if now is not None and now != totals:
                    last = _totals(info.get("last_token_usage"))
                    if last is None:
                        before = totals or (0, 0, 0)
                        last = (max(now[0] - before[0], 0), max(now[1] - before[1], 0),
                                max(now[2] - before[2], 0))
                    totals = now
                    entry_kind = "message"
                    # The turn and the totals name the request in every file that holds
                    # it; the outer time does not (a fork rewrites it).
                    key = f"{turn}:{now[0]}:{now[1]}:{now[2]}" if turn else \
                        f"{ts}:{now[0]}:{now[2]}"
                    # A count of another kind: the request without usage, as a vak or
                    # Claude Code one is (docs/formats.md, "Usage counts").
                    bad = _bad_count(info)
                    if bad is not None:
                        yield Finding(Code.BAD_FIELD, number, f"L{number}", bad)
                    meta: dict[str, Any] = {
                        "usage": vak_usage(*last) if bad is None else None, "model": model,
                        "request_key": key,
                        "window": count(info.get("model_context_window")) or window}
                    if (forked is not None and fork_ms is not None and started is not None
                            and started < fork_ms):
                        meta["copied"] = True
                        copied += 1
                    data = {"message": {"role": "assistant", "content": answer}, "meta": meta}
                    answer = []
            ident = f"L{number}"
            head = body
            # No hash chain: only the head entry is hashed (the row's head_hash), below.
            # Entry(...) without the Python frame of a named tuple's ``__new__``.
            yield _new_entry(Entry, (number, ident, parent, entry_kind, ts, None, None, "",
                                     data))
            parent = ident
        header["head_hash"] = _sha256(head).hexdigest() if head is not None else None
        if forked is not None:
            yield Finding(Code.FORK_HISTORY, fork_line, None,
                          f"forked from {quote(forked, 40)!r}: {copied} requests copied from "
                          "its history (turns started before the fork); billed once")
