"""Claude Code transcripts (``~/.claude/projects/<dir>/<session>.jsonl``, with
``<session>/subagents/agent-<id>.jsonl``) read as vak entries. Pure.

The rules, decided in docs/formats.md:

* the tree is ``uuid``/``parentUuid``; a ``compact_boundary`` starts a new root
  (``parentUuid`` null) and names the entry it follows in ``logicalParentUuid``, which
  is taken as its parent, so the active chain runs across compactions;
* an assistant message is streamed as several lines (one per content block) that share
  ``message.id`` and ``requestId``; earlier lines carry partial usage (their
  ``output_tokens`` are a running count), so the request's usage is the one of the
  *final* line of the pair (:mod:`pipeline.audit.session` keeps the last line of each
  ``request_key``);
* the one-hour share of a request's cache writes
  (``usage.cache_creation.ephemeral_1h_input_tokens``) goes with it (``meta.write_1h``),
  so that it is priced at the one-hour rate;
* ``<synthetic>`` assistant messages (written by Claude Code itself, never sent) are not
  requests;
* a subagent file's first entries name parents in the parent session: in a sidechain
  file a parent not seen yet is the transcript's root, not an orphan;
* a parent's ``agent_progress`` lines copy its subagent's lines; the assistant ones are
  the subagent's requests (``meta.mirror``): usage records of that subagent, never
  requests of the parent, priced once with the subagent file's own copy
  (:func:`pipeline.costs.report.drop_copies`) and the only record when that file is missing;
* a user line whose ``toolUseResult`` has an ``agentId`` links that subagent to the
  ``tool_use`` it answers (``header["links"]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pipeline.formats.base import ROOT_ID, count, json_lines, root_entry, text
from pipeline.ledger.layout import CLAUDE_CODE
from pipeline.ledger.reader import Entry, LineStats
from pipeline.ledger.redact import quote
from pipeline.ledger.types import Code, Finding

#: Line types of a Claude Code transcript known when this was written; any other type
#: (``custom-title``, ``mode``, ...: a new version adds some) is read as activity.
_TYPES = frozenset({"user", "assistant", "system", "summary", "progress",
                    "file-history-snapshot", "queue-operation", "attachment"})
#: Model name Claude Code writes on messages it made up itself (API errors, interrupts).
SYNTHETIC_MODEL = "<synthetic>"
PROVIDER = "anthropic"


def _blocks(content: Any) -> list[Any]:
    if type(content) is str:
        return [{"type": "text", "text": content}]
    return content if type(content) is list else []


def _usage(usage: Any) -> dict[str, int] | None:
    if type(usage) is not dict:
        return None
    return {k: count(usage.get(k)) for k in (
        "input_tokens", "output_tokens", "cache_read_input_tokens",
        "cache_creation_input_tokens")}


def _hour_writes(usage: Any) -> int | None:
    """Of a request's cache writes, the one-hour ones (priced apart), when it says."""
    if type(usage) is not dict or type(usage.get("cache_creation")) is not dict:
        return None
    hour = count(usage["cache_creation"].get("ephemeral_1h_input_tokens"))
    return min(hour, count(usage.get("cache_creation_input_tokens")))


def _request_meta(line: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    """The request an assistant line is part of: usage, model, key (none if synthetic)."""
    model = text(message.get("model"))
    if model == SYNTHETIC_MODEL:
        return {}
    usage = message.get("usage")
    return {"usage": _usage(usage), "write_1h": _hour_writes(usage), "model": model,
            "request_key": f"{text(message.get('id'))}:{text(line.get('requestId'))}"}


def _mirrored_request(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A subagent's assistant line as its parent's ``agent_progress`` line copies it: a
    request of the subagent (``meta.mirror``: its id), or ``None``."""
    data = obj.get("data")
    if obj.get("type") != "progress" or type(data) is not dict or \
            data.get("type") != "agent_progress":
        return None
    line = data.get("message")
    if type(line) is not dict or line.get("type") != "assistant" or \
            type(line.get("message")) is not dict:
        return None
    meta = _request_meta(line, line["message"])
    if not meta:
        return None
    meta["mirror"] = text(data.get("agentId")) or "?"
    return {"message": {"role": "assistant", "content": []}, "meta": meta}


class ClaudeCode:
    """The Claude Code adapter (:class:`~pipeline.formats.base.TranscriptFormat`)."""

    name = CLAUDE_CODE

    def sniff(self, obj: dict[str, Any]) -> bool:
        """A Claude Code line: no ``payload``, and ``sessionId`` with a tree id
        (``uuid``/``parentUuid``) whatever its ``type`` (Claude Code adds line types
        from version to version), or a ``uuid`` on a line type of its own."""
        if "payload" in obj:
            return False
        if type(obj.get("sessionId")) is str and ("uuid" in obj or "parentUuid" in obj):
            return True
        return obj.get("type") in _TYPES and type(obj.get("uuid")) is str

    def read(self, lines: Iterable[bytes], stats: LineStats,
             header: dict[str, Any]) -> Iterator[Entry | Finding]:
        """Stream a Claude Code transcript as entries (see the module's rules)."""
        header["provider"] = PROVIDER
        links: list[tuple[str, str | None, str | None, int]] = []
        header["links"] = links
        yield root_entry()
        seen: set[str] = {ROOT_ID}
        previous = ROOT_ID
        for item in json_lines(lines, stats):
            if isinstance(item, Finding):
                yield item
                continue
            number, digest, obj = item
            uuid = text(obj.get("uuid"))
            if uuid is None:
                continue
            if "session_id" not in header:
                header["session_id"] = text(obj.get("sessionId"))
                header["cwd"] = text(obj.get("cwd"))
                header["app_version"] = text(obj.get("version"))
            parent = obj.get("parentUuid")
            if parent is None:
                parent = text(obj.get("logicalParentUuid")) or ROOT_ID
                if parent not in seen:
                    # Written in order: a logical parent not read yet is not in the file.
                    # The conversation went on from the entry before: its history stays
                    # on the active chain, not counted as abandoned.
                    yield Finding(Code.LOGICAL_PARENT_MISSING, number, uuid,
                                  f"logicalParentUuid {quote(parent, 40)!r} is not in the file; "
                                  "linked to the entry before it")
                    parent = previous
            elif type(parent) is not str or (parent not in seen and obj.get("isSidechain") is True):
                parent = ROOT_ID
            seen.add(uuid)
            previous = uuid
            ts = text(obj.get("timestamp")) or ""
            kind, data = self._mapped(obj, header, links, number)
            yield Entry(number, uuid, parent, kind, ts, None, None, digest, data)

    @staticmethod
    def _mapped(obj: dict[str, Any], header: dict[str, Any], links: list[Any],
                number: int) -> tuple[str, dict[str, Any]]:
        kind = obj.get("type")
        message = obj.get("message")
        if kind in ("user", "assistant") and type(message) is dict:
            blocks = _blocks(message.get("content"))
            meta: dict[str, Any] = {}
            if kind == "assistant":
                meta = _request_meta(obj, message)
                if meta.get("model") and not header.get("model"):
                    header["model"] = meta["model"]
            else:
                if obj.get("isMeta") is True:
                    meta["control"] = "meta"
                elif obj.get("isCompactSummary") is True:
                    meta["control"] = "compact_summary"
                result = obj.get("toolUseResult")
                agent = text(result.get("agentId")) if type(result) is dict else None
                if agent is not None:
                    use = next((text(b.get("tool_use_id")) for b in blocks
                                if type(b) is dict and b.get("type") == "tool_result"), None)
                    links.append((agent, use, text(obj.get("uuid")), number))
            return "message", {"message": {"role": kind, "content": blocks}, "meta": meta}
        if kind == "system" and obj.get("subtype") == "compact_boundary":
            return "compaction", obj
        mirrored = _mirrored_request(obj)
        if mirrored is not None:
            return "message", mirrored
        return "activity", obj
