"""Build valid vak ledgers in memory, in vak's wire format (spec ``vak-wire-format.md``).

A :class:`LedgerBuilder` appends entries the way vak's writer does: one compact JSON
object per line, envelope keys first (``id, parent_id, ts, prev_hash?, at_turn?, kind``)
and the payload flattened after them; ``prev_hash`` is the lowercase hex SHA-256 of the
previous written line's exact bytes (newline excluded); ``parent_id`` is the active tail
unless given (``branch_at`` moves the tail, as vak's does).

Raw lines (torn fragments, garbage) can be written too; like vak's writer they do not move
the hash tail, so the next entry chains to the last *valid* line.

Helpers at the bottom split bytes into physical lines the way iterating a binary file
does, and run the reader or the audit on bytes.
"""

from __future__ import annotations

import calendar
import hashlib
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pipeline.audit.session import SessionAudit, audit_session
from pipeline.ledger.layout import SessionKey, parse_session_path, session_path
from pipeline.ledger.reader import Entry, read_ledger
from pipeline.ledger.types import Finding, Severity

DEFAULT_CWD = "/home/me/proj"
DEFAULT_SESSION_ID = "0199a1f2-5f00-7000-8000-00000000abcd"
#: 2026-09-21T14:13:20Z, the base instant of the generated timestamps.
BASE_SECONDS = calendar.timegm((2026, 9, 21, 14, 13, 20, 0, 0, 0))
TS_STEP_NS = 123_456_789


def sha(line: bytes) -> str:
    """Lowercase hex SHA-256 of a stored line (without its newline)."""
    return hashlib.sha256(line).hexdigest()


def dumps(obj: Any) -> bytes:
    """Compact JSON as ``serde_json::to_string`` writes it (UTF-8, no spaces)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def ts_text(ns: int, digits: int = 9) -> str:
    """RFC 3339 ``...Z`` text of ``ns`` nanoseconds since the epoch with 0/3/6/9 digits."""
    secs, frac = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(secs, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if digits == 0:
        return base + "Z"
    return f"{base}.{frac:09d}"[: len(base) + 1 + digits] + "Z"


def make_id(n: int) -> str:
    """A UUIDv7-looking, lowercase, hyphenated id numbered ``n``."""
    return f"0199a1f2-6a00-7000-8000-{n:012x}"


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(call_id: str, name: str = "bash", inp: Any = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": inp or {"cmd": "ls"}}


def tool_result_block(call_id: str, content: str = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": False}


def usage(inp: int, out: int, cache_read: int | None = None,
          cache_creation: int | None = None) -> dict[str, int]:
    """A ``usage`` object; cache fields are omitted when ``None``, as serde does."""
    u = {"input_tokens": inp, "output_tokens": out}
    if cache_read is not None:
        u["cache_read_input_tokens"] = cache_read
    if cache_creation is not None:
        u["cache_creation_input_tokens"] = cache_creation
    return u


def attempt(ordinal: int, settlement: str = "ok", u: dict[str, int] | None = None,
            reason: str = "initial", domain: str = "unknown") -> dict[str, Any]:
    """One receipt attempt."""
    a: dict[str, Any] = {"ordinal": ordinal, "reason": reason, "domain": domain,
                         "settlement": settlement, "latency_ms": 100 + ordinal}
    if u is not None:
        a["usage"] = u
    if settlement != "ok":
        a["error"] = "overloaded"
    return a


@dataclass
class Written:
    """One line the builder wrote: its bytes (no newline) and the entry id, if any."""

    data: bytes
    id: str | None
    newline: bool = True


@dataclass
class LedgerBuilder:
    """Append-only writer of one in-memory ledger, chaining like vak's writer.

    Parameters
    ----------
    chained:
        Write ``prev_hash`` (vak after hash chaining); ``False`` writes legacy entries.
    """

    chained: bool = True
    lines: list[Written] = field(default_factory=list)
    tail_id: str | None = None
    tail_hash: str | None = None
    _n: int = 0
    _turn: str | None = None

    # -- low level -----------------------------------------------------------------

    def next_id(self) -> str:
        self._n += 1
        return make_id(self._n)

    def ts_ns(self) -> int:
        return BASE_SECONDS * 1_000_000_000 + self._n * TS_STEP_NS

    def envelope(self, kind: str, *, parent: str | bool | None = True,
                 ident: str | None = None, ts: str | None = None,
                 prev_hash: str | bool | None = True, at_turn: str | None = None,
                 ) -> dict[str, Any]:
        """Envelope of the next entry, in vak's key order (``kind`` last).

        ``parent=True`` means the active tail; ``prev_hash=True`` means the chain's
        tail hash (omitted when unchained or when there is none yet).
        """
        ident = ident or self.next_id()
        env: dict[str, Any] = {
            "id": ident,
            "parent_id": self.tail_id if parent is True else parent,
            "ts": ts or ts_text(self.ts_ns()),
        }
        if prev_hash is True:
            if self.chained and self.tail_hash is not None:
                env["prev_hash"] = self.tail_hash
        elif prev_hash is not None and prev_hash is not False:
            env["prev_hash"] = prev_hash
        if at_turn is not None:
            env["at_turn"] = at_turn
        env["kind"] = kind
        return env

    def write(self, data: bytes, ident: str | None, *, valid: bool = True,
              newline: bool = True) -> str | None:
        """Store a line; a valid entry moves the hash tail and the active tail."""
        self.lines.append(Written(data, ident, newline))
        if valid:
            self.tail_hash = sha(data)
            if ident is not None:
                self.tail_id = ident
        return ident

    def entry(self, kind: str, payload: dict[str, Any] | None = None, **env: Any) -> str:
        """Append an entry of ``kind`` with ``payload`` flattened after the envelope."""
        obj = self.envelope(kind, **env)
        obj.update(payload or {})
        self.write(dumps(obj), obj["id"])
        return str(obj["id"])

    def raw(self, data: bytes, *, newline: bool = True) -> None:
        """Append a line that is not a valid entry (the hash tail does not move)."""
        self.write(data, None, valid=False, newline=newline)

    def branch_at(self, entry_id: str) -> None:
        """Make ``entry_id`` the parent of the next append (vak's ``branch_at``)."""
        self.tail_id = entry_id

    # -- kinds -----------------------------------------------------------------------

    def header(self, session_id: str = DEFAULT_SESSION_ID, cwd: str = DEFAULT_CWD,
               **env: Any) -> str:
        env.setdefault("parent", None)
        env.setdefault("prev_hash", None)
        return self.entry("header", {
            "session_id": session_id,
            "created_at": "2026-09-21T14:13:20Z",
            "cwd": cwd,
            "contract": {
                "app_version": "3.5.0", "provider": "ollama", "model": "gemma4:e2b-mlx",
                "route_ladder": [], "route_objective": "balanced", "route_annotations": [],
                "system_prompt": "You are vak…", "permission_mode": "workspace-write",
                "capabilities": [], "prompt_layers": [],
            },
        }, **env)

    def message(self, role: str, content: list[dict[str, Any]],
                meta: dict[str, Any] | None = None, **env: Any) -> str:
        payload: dict[str, Any] = {"message": {"role": role, "content": content}}
        if meta is not None:
            payload["meta"] = meta
        return self.entry("message", payload, **env)

    def user(self, text: str = "hello", **env: Any) -> str:
        """A directive: starts a turn."""
        return self.message("user", [text_block(text)], **env)

    def tool_results(self, *call_ids: str, content: str = "ok", **env: Any) -> str:
        return self.message("user", [tool_result_block(c, content) for c in call_ids], **env)

    def control(self, text: str = "[stop-hook]: keep going", **env: Any) -> str:
        return self.message("user", [text_block(text)], {"control": "stop_hook"}, **env)

    def assistant(self, text: str = "done", *, tools: Iterable[str] = (),
                  u: dict[str, int] | None = None, **env: Any) -> str:
        content = [text_block(text)] + [tool_use_block(t) for t in tools]
        meta: dict[str, Any] = {"model": "gemma4:e2b-mlx",
                                "stop_reason": "tool_use" if tools else "end_turn"}
        if u is not None:
            meta["usage"] = u
        return self.message("assistant", content, meta, **env)

    def receipt(self, attempts: list[dict[str, Any]], winning: int | None = None,
                **env: Any) -> str:
        payload: dict[str, Any] = {"purpose": "execute", "provider": "ollama",
                                   "model": "gemma4:e2b-mlx"}
        if winning is not None:
            payload["winning_attempt"] = winning
        payload["attempts"] = attempts
        payload["prefix_digest"] = ""
        return self.entry("receipt", payload, **env)

    def activity(self, label: str = "note", **env: Any) -> str:
        return self.entry("activity", {"activity_id": "act", "activity_kind": "diagnostic",
                                       "status": "succeeded", "label": label, "data": {}},
                          **env)

    def work(self, event: dict[str, Any] | None = None, **env: Any) -> str:
        """A ``work`` entry with two ``kind`` keys, exactly as vak writes it."""
        obj = self.envelope("work", **env)
        obj.update({"contract_id": "w1", "revision": 0})
        event = event or {"kind": "contract_status_changed", "from": "draft", "to": "active",
                          "reason": "admitted"}
        data = dumps(obj)[:-1] + b',"kind":' + dumps(event) + b"}"
        self.write(data, obj["id"])
        return str(obj["id"])

    # -- output ----------------------------------------------------------------------

    def bodies(self) -> list[bytes]:
        """Stored lines without newlines."""
        return [w.data for w in self.lines]

    def physical(self) -> list[bytes]:
        """Physical lines as iterating the file yields them."""
        return [w.data + (b"\n" if w.newline else b"") for w in self.lines]

    def to_bytes(self) -> bytes:
        return b"".join(self.physical())


def sample_session(b: LedgerBuilder | None = None, *, turns: int = 2,
                   text: str = "what is the weather") -> LedgerBuilder:
    """A small, valid, closed session: header, then ``turns`` turns of tool use."""
    b = b or LedgerBuilder()
    b.header()
    for t in range(turns):
        b.user(f"{text} #{t}")
        a = b.assistant("looking", tools=[f"call_{t}"], u=usage(100 + t, 10))
        b.receipt([attempt(0, u=usage(100 + t, 10))], winning=0, parent=a)
        b.tool_results(f"call_{t}")
        a2 = b.assistant("answer", u=usage(150 + t, 20))
        b.receipt([attempt(0, u=usage(150 + t, 20))], winning=0, parent=a2)
    return b


def split_lines(data: bytes) -> list[bytes]:
    """Physical lines of ``data`` as iterating a binary file yields them."""
    return list(io.BytesIO(data))


def read_bytes(data: bytes | Iterable[bytes]) -> tuple[list[Entry], list[Finding]]:
    """Run the reader; return its entries and findings apart."""
    lines = split_lines(data) if isinstance(data, bytes) else data
    entries: list[Entry] = []
    findings: list[Finding] = []
    for item in read_ledger(lines):
        if isinstance(item, Entry):
            entries.append(item)
        else:
            findings.append(item)
    return entries, findings


def session_key(session_id: str = DEFAULT_SESSION_ID, cwd: str = DEFAULT_CWD,
                agent: str = "vak") -> SessionKey:
    """The key of the session stored where vak would store it."""
    key = parse_session_path(session_path(agent, cwd, session_id))
    assert key is not None
    return key


def audit_bytes(data: bytes, key: SessionKey | None = None) -> SessionAudit:
    """Audit ``data`` as the session ``key`` (default: where vak stores the builder's)."""
    return audit_session(key or session_key(), split_lines(data))


def codes(findings: Iterable[Finding]) -> set[tuple[int | None, str]]:
    """``{(line, code)}`` of findings."""
    return {(f.line, f.code.text) for f in findings}


def serious(findings: Iterable[Finding]) -> list[Finding]:
    """Findings of severity warning or error."""
    return [f for f in findings if f.severity >= Severity.WARNING]


def message_with_roles(*roles: str) -> tuple[bytes, int]:
    """A session whose assistant message holds ``roles`` as its ``role`` keys, and that
    message's line number."""
    b = LedgerBuilder()
    b.header()
    b.user("hi")
    b.assistant("hello")
    line = b.lines[-1]
    keys = ",".join(f'"role":{json.dumps(r)}' for r in roles)
    line.data = line.data.replace(b'"role":"assistant"', keys.encode(), 1)
    b.tail_hash = sha(line.data)
    b.user("next")
    return b.to_bytes(), 3
