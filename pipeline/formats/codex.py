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
* a ``compacted`` line is a compaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pipeline.formats.base import ROOT_ID, count, json_lines, root_entry, text
from pipeline.layout import CODEX
from pipeline.reader import Entry, LineStats
from pipeline.types import Finding

_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context",
                    "compacted"})
_TOTALS = ("input_tokens", "cached_input_tokens", "output_tokens")


def _totals(usage: Any) -> tuple[int, int, int] | None:
    if type(usage) is not dict:
        return None
    return count(usage.get(_TOTALS[0])), count(usage.get(_TOTALS[1])), count(usage.get(_TOTALS[2]))


def vak_usage(total_input: int, cached: int, output: int) -> dict[str, int]:
    """OpenAI's counts in vak's (Anthropic's) fields: cached input apart from input."""
    cached = min(cached, total_input)
    return {"input_tokens": total_input - cached, "output_tokens": output,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


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
        for item in json_lines(lines, stats):
            if isinstance(item, Finding):
                yield item
                continue
            number, digest, obj = item
            kind, payload = obj.get("type"), obj.get("payload")
            payload = payload if type(payload) is dict else {}
            ptype = payload.get("type")
            data: dict[str, Any] = obj
            entry_kind = "activity"
            if kind == "session_meta" and "session_id" not in header:
                header.update(session_id=text(payload.get("id")), cwd=text(payload.get("cwd")),
                              provider=text(payload.get("model_provider")),
                              app_version=text(payload.get("cli_version")))
            elif kind == "turn_context":
                model = text(payload.get("model")) or model
                if model and not header.get("model"):
                    header["model"] = model
            elif kind == "compacted":
                entry_kind = "compaction"
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
                    ts = text(obj.get("timestamp")) or ""
                    entry_kind = "message"
                    data = {"message": {"role": "assistant", "content": []}, "meta": {
                        "usage": vak_usage(*last), "model": model,
                        "request_key": f"{ts}:{now[0]}:{now[2]}",
                        "window": count(info.get("model_context_window")) or None}}
            ident = f"L{number}"
            yield Entry(number, ident, parent, entry_kind, text(obj.get("timestamp")) or "",
                        None, None, digest, data)
            parent = ident
