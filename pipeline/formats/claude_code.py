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
  so that it is priced at the one-hour rate; so does a speed other than ``standard``
  (``usage.speed``, ``meta.speed``: ``fast`` is Anthropic's fast mode, priced apart);
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

import hashlib
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import chain
from typing import Any

import simdjson

from pipeline.formats.base import (
    ROOT_ID,
    LineRun,
    Scanned,
    count,
    json_lines,
    root_entry,
    text,
)
from pipeline.ledger import kernel
from pipeline.ledger.entry import usage_of
from pipeline.ledger.kernel import parse_object
from pipeline.ledger.layout import CLAUDE_CODE
from pipeline.ledger.reader import Entry, LineStats, lazy_entry
from pipeline.ledger.redact import quote
from pipeline.ledger.types import Code, Finding

#: Line types of a Claude Code transcript known when this was written; any other type
#: (``custom-title``, ``mode``, ...: a new version adds some) is read as activity.
_TYPES = frozenset({"user", "assistant", "system", "summary", "progress",
                    "file-history-snapshot", "queue-operation", "attachment"})
#: Model name Claude Code writes on messages it made up itself (API errors, interrupts).
SYNTHETIC_MODEL = "<synthetic>"
#: ``usage.speed`` of a request served at the model's standard speed (not recorded).
STANDARD_SPEED = "standard"
PROVIDER = "anthropic"


def _blocks(content: Any) -> list[Any]:
    if type(content) is str:
        return [{"type": "text", "text": content}]
    return content if type(content) is list else []


def _usage(usage: Any) -> dict[str, Any] | None:
    """A request's ``usage`` as vak's ``meta.usage``: its four counts as
    :func:`~pipeline.ledger.entry.usage_of` reads them (absent or null: 0); ``None``
    when it is no object. A count present as anything but a token count (a string, a
    float, a bool, a negative or too large integer) leaves the object as it is, which
    the audit refuses as it refuses vak's: a ``bad_field`` finding naming the count, and
    the request without usage, so unpriced (ccusage skips such a line). It was read as
    0, silently."""
    if type(usage) is not dict:
        return None
    counts = usage_of(usage)
    if counts is None:
        return usage
    i, o, r, c = counts
    return {"input_tokens": i, "output_tokens": o, "cache_read_input_tokens": r,
            "cache_creation_input_tokens": c}


def _hour_writes(usage: Any) -> int | None:
    """Of a request's cache writes, the one-hour ones (priced apart), when it says."""
    if type(usage) is not dict or type(usage.get("cache_creation")) is not dict:
        return None
    hour = count(usage["cache_creation"].get("ephemeral_1h_input_tokens"))
    return min(hour, count(usage.get("cache_creation_input_tokens")))


def _speed(usage: Any) -> str | None:
    """The speed the provider served a request at, when not its standard one
    (``usage.speed``: ``"fast"`` is Anthropic's fast mode, priced apart); else ``None``."""
    speed = usage.get("speed") if type(usage) is dict else None
    return speed if type(speed) is str and speed and speed != STANDARD_SPEED else None


def _request_meta(line: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    """The request an assistant line is part of: usage, model, key (none if synthetic)."""
    model = text(message.get("model"))
    if model == SYNTHETIC_MODEL:
        return {}
    usage = message.get("usage")
    meta = {"usage": _usage(usage), "write_1h": _hour_writes(usage), "model": model,
            "request_key": f"{text(message.get('id'))}:{text(line.get('requestId'))}"}
    speed = _speed(usage)
    if speed is not None:  # rare: the key only where the line states another speed
        meta["speed"] = speed
    return meta


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


def _kind_data_py(obj: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The entry kind and data of a parsed line (no side effects)."""
    kind = obj.get("type")
    message = obj.get("message")
    if kind in ("user", "assistant") and type(message) is dict:
        meta: dict[str, Any] = {}
        if kind == "assistant":
            meta = _request_meta(obj, message)
        elif obj.get("isMeta") is True:
            meta["control"] = "meta"
        elif obj.get("isCompactSummary") is True:
            meta["control"] = "compact_summary"
        return "message", {"message": {"role": kind, "content": _blocks(message.get("content"))},
                           "meta": meta}
    if kind == "progress":
        # Most lines of a transcript: only an agent_progress one is looked into.
        data = obj.get("data")
        if type(data) is dict and data.get("type") == "agent_progress":
            mirrored = _mirrored_request(obj)
            if mirrored is not None:
                return "message", mirrored
    elif kind == "system" and obj.get("subtype") == "compact_boundary":
        return "compaction", obj
    return "activity", obj


#: :func:`_kind_data_py`, with the message lines' (a user's or an assistant's, the ones
#: that are not activity) built in C where the kernel built (``kind_data``: the same
#: data, a test holds the two alike; every other line is handed to the Python).
_kind_data: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]] = _kind_data_py
if kernel.kind_data_c is not None and kernel.configure_kind_data_c is not None:
    kernel.configure_kind_data_c(_kind_data_py, SYNTHETIC_MODEL)
    _kind_data = kernel.kind_data_c


def _message_data(obj: dict[str, Any]) -> dict[str, Any]:
    """A message line's entry data, from the whole parsed line (a lazy entry's mapper)."""
    return _kind_data(obj)[1]


# ----------------------------------------------------------------- the per-line scan
#: Lines shorter than this are parsed by orjson whole: the scan costs ~10 us a line
#: (simdjson's proxies, ~20 top-level keys looked up, the key lists that catch repeated
#: keys), orjson ~4 us a KB; on the real transcripts the two cross near 16 KB (orjson
#: 74 us, the scan 30 us a line of 16-64 KB; 4.4 against 11 us at 1-4 KB).
SCAN_MIN_BYTES = 16384
#: Top-level fields the adapter reads as plain values (an object or array there reads
#: as :data:`_OPAQUE`, which the adapter treats as it treats any non-string).
_SCALARS = frozenset({"uuid", "parentUuid", "logicalParentUuid", "isSidechain", "sessionId",
                      "cwd", "version", "timestamp", "type", "requestId", "isMeta",
                      "isCompactSummary", "subtype"})
_OPAQUE: Any = ()  # an empty tuple: neither a string, a dict, None nor True
_Object = simdjson.Object
_Array = simdjson.Array
_PROXIES = (_Object, _Array)
_new_entry = tuple.__new__
_sha256 = hashlib.sha256


def _plain(value: Any) -> Any:
    return _OPAQUE if type(value) in _PROXIES else value


def _unique(obj: Any) -> list[str] | None:
    """An object's keys, or ``None`` when one repeats (orjson keeps the last value,
    simdjson's look-up finds the first: such a line is left to orjson)."""
    keys = list(obj.keys())
    return keys if len(keys) == len(set(keys)) else None


def _request_fields(message: Any, keys: list[str], cut: dict[str, Any]) -> None:
    """A message's model, id and usage (whole), as they are, into ``cut``."""
    for key in ("model", "id"):
        if key in keys:
            cut[key] = _plain(message.get(key))
    if "usage" in keys:
        usage = message.get("usage")
        cut["usage"] = usage.as_dict() if type(usage) is _Object else _plain(usage)


def _copy(data: Any, keys: list[str], cut: dict[str, Any]) -> bool:
    """An ``agent_progress`` line's copy of a subagent's line into ``cut`` (its data's):
    ``agentId``, and ``message`` cut to its ``type``, ``requestId`` and ``message``
    (model, id, usage); ``False`` when a key of the copy repeats."""
    if "agentId" in keys:
        cut["agentId"] = _plain(data.get("agentId"))
    if "message" not in keys:
        return True
    line = data.get("message")
    if type(line) is not _Object:
        cut["message"] = _plain(line)
        return True
    lkeys = _unique(line)
    if lkeys is None:
        return False
    copied: dict[str, Any] = {}
    for key in ("type", "requestId"):
        if key in lkeys:
            copied[key] = _plain(line.get(key))
    if "message" in lkeys:
        message = line.get("message")
        if type(message) is _Object:
            mkeys = _unique(message)
            if mkeys is None:
                return False
            copied["message"] = {}
            _request_fields(message, mkeys, copied["message"])
        else:
            copied["message"] = _plain(message)
    cut["message"] = copied
    return True


def scan(body: bytes) -> Scanned | None:
    """What the audit reads of one stored transcript line, validated by simdjson
    without building the rest, or ``None`` (the line is then read by orjson, which
    decides; see :func:`~pipeline.formats.base.json_lines`).

    The result holds the fields the adapter reads, as orjson would give them, but for
    a message's content, cut to its blocks' ``type`` (a user's; an assistant's to none),
    and ``data`` cut to its ``type`` (a subagent's copied line, ``agent_progress``, to
    its ``type``, ``agentId`` and ``message``, that cut to its ``type``, ``requestId``
    and ``message``'s model, id and usage). Left to orjson: a line simdjson refuses, one
    with a byte order mark (simdjson skips it, orjson refuses it), a repeated key in an
    object read and a ``toolUseResult`` naming a subagent (read whole, rare).
    """
    obj = parse_object(body)
    if obj is None:
        return None
    keys = _unique(obj)
    if keys is None:
        return None
    out = Scanned()
    get = obj.get
    for key in keys:
        if key in _SCALARS:
            out[key] = _plain(get(key))
    if "toolUseResult" in keys:
        result = get("toolUseResult")
        if type(result) is _Object and "agentId" in result:
            return None
    if "message" in keys:
        message = get("message")
        if type(message) is _Object:
            mkeys = _unique(message)
            if mkeys is None:
                return None
            cut: dict[str, Any] = {}
            _request_fields(message, mkeys, cut)
            if "content" in mkeys:
                content = message.get("content")
                if out.get("type") != "user":
                    cut["content"] = []  # only a user's blocks are read
                elif type(content) is str:
                    cut["content"] = ""  # a text block, whatever it says
                elif type(content) is _Array:
                    blocks: list[Any] = []
                    for block in content:
                        if type(block) is not _Object:
                            blocks.append(_plain(block))
                            continue
                        bkeys = _unique(block)
                        if bkeys is None:
                            return None
                        kind = block.get("type") if "type" in bkeys else None
                        blocks.append({"type": kind} if type(kind) is str else {})
                    cut["content"] = blocks
                else:
                    cut["content"] = content
            out["message"] = cut
        else:
            out["message"] = _plain(message)
    if "data" in keys:
        data = get("data")
        if type(data) is _Object:
            dkeys = _unique(data)
            if dkeys is None:
                return None
            dtype = _plain(data.get("type")) if "type" in dkeys else None
            cut_data: dict[str, Any] = {"type": dtype}
            if dtype == "agent_progress" and not _copy(data, dkeys, cut_data):
                return None
            out["data"] = cut_data
        else:
            out["data"] = _plain(data)
    return out


def scanner() -> tuple[Callable[[bytes], Scanned | None], int]:
    """The scan the adapter reads lines with, and the length from which it tries it:
    the C kernel's (``scan_transcript``, the same contract as :func:`scan`: faster
    than orjson at every length on the real transcripts, so every line) where it built
    and is the kernel in use (``VAKPIPE_KERNEL``), else :func:`scan` from
    :data:`SCAN_MIN_BYTES`."""
    if kernel.IMPLEMENTATION == "c" and kernel.scan_transcript_c is not None:
        return partial(kernel.scan_transcript_c, Scanned), 0
    return scan, SCAN_MIN_BYTES


def activity_run(seen: set[str], batch: list[Entry]) -> LineRun | None:
    """The adapter's activity lines in C (``activity_run`` of the kernel, given to
    :func:`~pipeline.formats.base.json_lines` as its ``run``) where the C scan is the one
    in use: the progress lines (two thirds of a transcript's lines) whose entry is read
    from their uuid, parentUuid (one in ``seen``) and timestamp alone, made into the
    entries the loop below would make and appended to ``batch``, each uuid added to
    ``seen``; any other line stays with the loop (docs/formats.md, "Activity lines in
    one loop"). ``None`` elsewhere."""
    if kernel.IMPLEMENTATION == "c" and kernel.activity_run_c is not None:
        return partial(kernel.activity_run_c, seen, batch)
    return None


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
        remember = seen.add
        previous = ROOT_ID
        last: bytes | None = None  # the newest entry's stored bytes
        first = True
        batch: list[Entry] = []  # what the run took after the line before
        run = activity_run(seen, batch)
        # None ends the lines: the run's last batch is yielded at the top of the loop too.
        for item in chain(json_lines(lines, stats, *scanner(), run), (None,)):
            if batch:
                yield from batch
                payload: Any = tuple.__getitem__(batch[-1], 8)  # a lazy entry's, unparsed
                previous, last = batch[-1].id, payload.body
                batch.clear()
            if item is None:
                break
            if isinstance(item, Finding):
                yield item
                continue
            number, body, obj = item
            get = obj.get
            uuid = get("uuid")
            if type(uuid) is not str or not uuid:  # text(), inlined: once a line
                continue
            if first:
                first = False
                header["session_id"] = text(get("sessionId"))
                header["cwd"] = text(get("cwd"))
                header["app_version"] = text(get("version"))
            parent = get("parentUuid")
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
            elif type(parent) is not str or (parent not in seen and get("isSidechain") is True):
                parent = ROOT_ID
            remember(uuid)
            previous = uuid
            ts = get("timestamp")
            if type(ts) is not str:
                ts = ""
            last = body
            if get("type") == "progress":
                # Most lines of a transcript: activity, unless a subagent's line copied
                # (what _kind_data says of them, without its calls).
                data = get("data")
                if type(data) is not dict or data.get("type") != "agent_progress":
                    yield (lazy_entry(number, uuid, parent, "activity", ts, "", body, None)
                           if type(obj) is Scanned else
                           _new_entry(Entry, (number, uuid, parent, "activity", ts, None, None,
                                              "", obj)))
                    continue
            kind, data = _kind_data(obj)
            if kind == "message":
                line_type = obj.get("type")
                if line_type == "assistant":
                    model = data["meta"].get("model")
                    if model and not header.get("model"):
                        header["model"] = model
                elif line_type == "user":
                    result = obj.get("toolUseResult")
                    agent = text(result.get("agentId")) if type(result) is dict else None
                    if agent is not None:
                        use = next((text(b.get("tool_use_id")) for b in data["message"]["content"]
                                    if type(b) is dict and b.get("type") == "tool_result"), None)
                        links.append((agent, use, uuid, number))
            # No hash chain here: an entry's digest is left empty, and only the head's is
            # computed (the row's head_hash), once the file is read.
            if type(obj) is Scanned:
                # Read by the scan: the payload stays as its bytes until a stage reads it.
                yield (lazy_entry(number, uuid, parent, kind, ts, "", body, data, _message_data)
                       if kind == "message" else
                       lazy_entry(number, uuid, parent, kind, ts, "", body, None))
            else:
                # Entry(...) without the Python frame of a named tuple's ``__new__``.
                yield _new_entry(Entry, (number, uuid, parent, kind, ts, None, None, "", data))
        header["head_hash"] = _sha256(last).hexdigest() if last is not None else None
