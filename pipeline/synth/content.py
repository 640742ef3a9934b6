"""Content of generated vak sessions: text, ids, timestamps and one builder per entry kind.

Pure (stdlib + orjson; with consistent figures, the replay engine of
:mod:`pipeline.synth.replay`). The builder turns a turn's *structure* (a list of ops chosen by
:mod:`pipeline.synth.generator`) into :class:`~pipeline.synth.faults.RawEntry` values whose
payloads follow ``spec/vak-wire-format.md`` section 5, field by field and in order. Text
is sliced from prebuilt buffers rather than composed character by character: that is
what makes generation run at tens of MB/s.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from random import Random
from typing import Any

import orjson

from pipeline.ledger.wire import LongText, RawEntry, uuid7
from pipeline.ledger.wire import rfc3339_ns as _ts
from pipeline.synth.replay import GeneratedReplay

_M64 = (1 << 64) - 1
_SESSION_SALT = 1 << 40
_NOISE_SALT = 1 << 42
_TOOLS = ("read_file", "bash", "grep", "webfetch", "recall", "write_file")
_CONTROLS = ("stop_hook", "stop_guard", "grounding_check", "fence_check",
             "duplicate_card_check", "presentation_check", "freshness_check", "empty_step",
             "steering_drift", "topic_mismatch_check", "repair_directive")
# Non-ASCII words stay within Latin-1, so Python keeps text at one byte per character.
WORDS = ("the", "a", "parser", "budget", "cache", "receipt", "schema", "turn", "fold",
         "tail", "chain", "digest", "retry", "latency", "archive", "summary", "prefix",
         "context", "tool", "usage", "branch", "verify", "tests", "model", "request",
         "and", "so", "when", "we", "holds", "fails", "add", "rerun", "compaction",
         "naïve", "café", "°C", "résumé", "½", "deadline", "window", "ledger", "shard")


def mix(seed: int, j: int) -> int:
    """A 64-bit seed for stream ``j`` of the session seeded ``seed``."""
    return (seed * 0x9E3779B97F4A7C15 + j * 0xBF58476D1CE4E5B9 + 1) & _M64


def _build_buffers() -> tuple[str, str, str]:
    """Prose, code and log text that content is sliced from (slicing is what makes
    generation fast: no per-character Python work)."""
    rng = Random(20261101)
    prose = [" ".join(rng.choices(WORDS, k=rng.randint(5, 18))).capitalize() + ". "
             for _ in range(8_000)]
    code = [f"\ndef {rng.choice(WORDS[2:24])}_{k}(data, limit={k % 97}):\n" if k % 23 == 0
            else f"    v{k % 23} = compute(v{k % 23 - 1}, {rng.randrange(999)})  "
                 f"# {rng.choice(WORDS)}\n" for k in range(9_000)]
    log = [f"2026-11-{k % 28 + 1:02d}T{k % 24:02d}:{k % 60:02d}:{k * 7 % 60:02d}Z "
           f"{rng.choice(('INFO', 'INFO', 'WARN', 'DEBUG'))} {rng.choice(WORDS[2:24])}: "
           f"processed {rng.randrange(9999)} items in {rng.randrange(900)} ms\n"
           for k in range(6_000)]
    return "".join(prose), "".join(code), "".join(log)


_PROSE, _CODE, _LOG = _build_buffers()


def _slice(buf: str, rng: Random, n: int, sep: str = ". ") -> str:
    """``n`` characters of ``buf`` from a random place, starting after a ``sep``."""
    if n < len(buf) - 400:
        off = rng.randrange(len(buf) - n - 400)
        off = buf.find(sep, off, off + 400) + len(sep)  # 400 > any sentence or line
        return buf[off : off + n]
    reps, rest = divmod(n, len(buf))
    return buf * reps + buf[:rest]


def _long(text: str) -> str | LongText:
    """Big texts bypass orjson, whose output buffer is several times their size."""
    return LongText(text) if len(text) > 16_384 else text


def _sentence(rng: Random, lo: int, hi: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(lo, hi))).capitalize() + "."





def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """What a session is, decided before any entry is generated (by
    :mod:`pipeline.synth.generator`)."""

    seed: int
    agent: str
    size_scale: float
    start_ns: int
    provider: str
    model: str
    cwd: str
    session_id: str
    t13: bool  # the seed's version: no at_turn, none of the T14-T17 kinds
    turns: int | None  # None: write turns until target_bytes
    target_bytes: int
    pre: tuple[str, ...]  # entries before the first directive
    post: tuple[str, ...]  # entries after the last turn
    agent_block: bool
    consistent: bool  # usage, prefix and card tokens from a replay engine (else drawn)
    noise: float  # relative provider-like drift of reported usage (0: exact)


def _result_len(rng: Random, scale: float) -> int:
    """Heavy-tailed tool result size: median ~900 chars, a few up to 1 MB (times scale)."""
    n = (rng.randint(200_000, 1_000_000) if rng.random() < 0.004
         else min(1_000_000, int(rng.lognormvariate(6.8, 1.5))))
    return max(1, int(n * scale))


_SCHEMAS = [{"name": t, "description": f"{t.replace('_', ' ')} tool",
             "input_schema": {"properties": {"arg": {"type": "string"}}, "required": ["arg"],
                              "type": "object"}} for t in _TOOLS]


class Builder:
    """Builds one session's entries, one op at a time, keeping only bounded state.

    ``ops[name](rng, arg)`` returns the next entry for a turn-structure op (see
    ``pipeline.synth.generator._turn_ops``); content is drawn from ``rng``.
    """

    def __init__(self, plan: SessionPlan) -> None:
        self.p = plan
        self.rng = Random(mix(plan.seed, _SESSION_SALT))
        self.ns, self.turn = plan.start_ns, ""
        self.tail: str | None = None
        self.turn_parent: str | None = None
        self.asked, self.act, self.narration = "", "answer", ""
        self.ctx = self.ctx0 = self.cached = 0
        self.system = _slice(_PROSE, self.rng, int(2500 * plan.size_scale) + 200)
        self.prefix_tokens = len(self.system) // 4 + 600
        self.prefix_digest = _sha(self.system.encode() + orjson.dumps(_SCHEMAS))
        self.goals = self.acts = self.works = self.epoch = self.n_turn = 0
        self.bound, self.bound_digest = "", ""
        self.pending: list[str] = []  # closed turns no packet covers yet
        self.recent: deque[str] = deque(maxlen=8)
        self.tools: list[tuple[str, str, dict[str, str]]] = []
        self.results: list[str] = []
        self.did: list[dict[str, Any]] = []
        self.pres: list[dict[str, Any]] = []
        self.usage: dict[str, int] = {}
        # Consistent figures (pipeline.synth.replay): the engine following the active
        # chain, and whether the turn about to start will be abandoned by a re-ask.
        self.replay = GeneratedReplay() if plan.consistent else None
        self.abandoned_next = False
        self.seen_digests: set[str] = set()
        self.noise_rng = Random(mix(plan.seed, _NOISE_SALT))
        self.bias = self.noise_rng.uniform(-0.75, 0.75) * plan.noise
        self.ops: dict[str, Callable[[Random, int], RawEntry]] = {
            name[4:]: getattr(self, name) for name in dir(self) if name.startswith("_op_")}

    def _new(self, rng: Random, kind: str, payload: dict[str, Any], gap_ms: tuple[int, int],
             parent: str | None = None, event: dict[str, Any] | None = None,
             directive: bool = False) -> RawEntry:
        """The next entry: ``gap_ms`` after the previous one, child of the tail by default."""
        lo, hi = gap_ms
        self.ns += int((lo + (hi - lo) * rng.random()) * 1_000_000)
        eid = uuid7(self.ns // 1_000_000, rng.getrandbits(74))
        if directive:
            self.turn = eid  # a directive's at_turn is its own id
        at = None if self.p.t13 or not self.turn else self.turn
        e = RawEntry(eid, parent or self.tail, _ts(self.ns), at, kind, payload, event)
        self.tail = eid
        if self.replay is not None:
            self.replay.feed(e)
        return e

    def header(self) -> RawEntry:
        """The session's first entry."""
        p, rng = self.p, self.rng
        payload: dict[str, Any] = {}
        if p.agent_block:
            payload["agent"] = {"id": p.agent, "revision": 3, "name": p.agent}
        payload.update(
            session_id=p.session_id, created_at=_ts(p.start_ns)[:19] + "Z", cwd=p.cwd,
            conversation={"conversation_id": p.session_id, "audience_id": "local",
                          "origin": {"surface": "cli", "address": "local"}},
            contract={"app_version": "3.4.9" if p.t13 else "3.5.0", "provider": p.provider,
                      "model": p.model, "route_ladder": [], "route_objective": "balanced",
                      "route_annotations": [], "system_prompt": self.system,
                      "permission_mode": rng.choice(("workspace-write", "read-only")),
                      "capabilities": [{"name": t, "kind": "tool", "invocation": "builtin",
                                        "description": s["description"], "configuration": {}}
                                       for t, s in zip(_TOOLS, _SCHEMAS, strict=True)],
                      "prompt_layers": []})
        return self._new(rng, "header", payload, (0, 1))

    # -- one method per op; each returns exactly one entry -----------------------------

    def _op_directive(self, rng: Random, branch: int) -> RawEntry:
        parent = None
        if branch and self.turn_parent:  # re-ask: the previous turn becomes abandoned
            parent, text = self.turn_parent, "Again, more carefully: " + self.asked
            self.ctx = self.ctx0
            for ids in (self.pending, self.recent):
                if ids and ids[-1] == self.turn:
                    ids.pop()
        else:
            text = _sentence(rng, 5, 28)
        if self.replay is not None:
            if parent is not None:  # back to the state before the abandoned turn
                self.replay.rewind()
            if self.abandoned_next:  # this turn will be abandoned: keep the state before it
                self.replay.checkpoint()
        self.turn_parent = parent or self.tail
        self.asked, self.ctx0 = text, self.ctx
        self.ctx += len(text) // 4 + 8
        self.n_turn += 1
        self.did, self.pres, self.tools = [], [], []
        self.act = rng.choice(("answer", "investigate", "change", "explain"))
        message = {"role": "user", "content": [{"type": "text", "text": text}]}
        return self._new(rng, "message", {"message": message}, (4_000, 600_000), parent,
                         directive=True)

    def _op_intent(self, rng: Random, _: int) -> RawEntry:
        conf = round(rng.random(), 2)
        reading = {"act": self.act, "horizon": "turn", "stakes": "reversible",
                   "evidence": rng.choice(("none", "workspace", "live")), "clarity": "clear",
                   "input_modalities": ["text"], "output_modalities": ["text"],
                   "attendance": "interactive", "alternate_acts": [], "domains": [],
                   "confidence": conf, "axis_confidence": {"act": conf, "horizon": 0.5,
                                                           "stakes": 0.5, "evidence": 0.25}}
        payload: dict[str, Any] = {"reading": reading}
        if not self.p.t13:
            payload["strands"] = []
        payload["engagement"] = {
            "limits": {"capabilities": {"kind": "all"}, "required_modalities": [],
                       "approval_ceiling": "auto-approve", "permission_ceiling": "full-access",
                       "min_satisfaction": "asserted"},
            "posture": {"managed": False, "open_commitment": False,
                        "checkpoint_before_effect": False, "hil": "interrupt",
                        "gate_fallback": "deny", "clarify": "proceed",
                        "delivery": {"shape": "prose", "cadence": "live", "urgency": "notify"},
                        "demand": {"reasoning_required": self.act != "answer",
                                   "evidence_required": False, "structured_output": False},
                        "stop": "message", "context": "recall"}}
        payload["provenance"] = {"tier": "general", "resolver_version": 2, "signals": [],
                                 "reproducible": True}
        if rng.random() < 0.4:
            payload["model_visible"] = f"[intent] act={self.act}; stakes=reversible"
        return self._new(rng, "intent", payload, (1, 40))

    def _op_goal_update(self, rng: Random, _: int) -> RawEntry:
        self.goals += 1
        payload: dict[str, Any] = {"revision": self.goals, "relation": "new"
                                   if self.goals == 1 else rng.choice(("adds_to", "corrects",
                                                                       "replaces", "status")),
                                   "request": self.asked or _sentence(rng, 4, 12)}
        if payload["relation"] in ("corrects", "replaces"):
            payload["supersedes_revision"] = self.goals - 1
        if rng.random() < 0.3:
            payload["explicit"] = True
        return self._new(rng, "goal_update", payload, (1, 30))

    def _op_goal(self, rng: Random, _: int) -> RawEntry:
        status: Any = rng.choice(("active", {"done": {"audited": rng.random() < 0.5}},
                                  {"unverified": {"reason": "no test evidence"}}))
        return self._new(rng, "goal", {"goal_id": f"g{self.goals + 1}",
                                       "objective": _sentence(rng, 3, 10),
                                       "criteria": [_sentence(rng, 2, 5)], "status": status},
                         (1, 30))

    def _op_activity(self, rng: Random, _: int) -> RawEntry:
        self.acts += 1
        kind = rng.choice(("diagnostic", "capacity_probe", "tool", "index"))
        payload: dict[str, Any] = {"activity_id": f"act-{self.acts}"}
        if self.p.t13:
            payload["turn"] = self.n_turn
        data = ({"key": self.p.model, "profile": orjson.dumps(
            {"declared_window": 200_000, "tokens_per_char": 0.27, "output_reserve": 4096,
             "needs_reprobe": False}).decode()} if kind == "capacity_probe" else {})
        payload.update(activity_kind=kind, status=rng.choice(("succeeded", "running", "failed")),
                       label=rng.choice(("prefix-changed", "probe", "reindex")), data=data)
        return self._new(rng, "activity", payload, (1, 200))

    def _op_work(self, rng: Random, _: int) -> RawEntry:
        self.works += 1
        event = {"kind": "contract_status_changed", "from": "draft", "to": "active",
                 "reason": "admitted"}
        return self._new(rng, "work", {"contract_id": f"w{self.works}", "revision": 0},
                         (1, 50), event=event)

    def _op_caps_bound(self, rng: Random, _: int) -> RawEntry:
        self.epoch += 1
        core = ["recall", "find_tools", *_TOOLS[:3]]
        body = {"capability_ids": [f"tool:{t}" for t in _TOOLS], "excluded_ids": [],
                "system_prompt": self.system, "tool_schemas": _SCHEMAS[:3],
                "core_tool_names": core, "deferred_tool_names": list(_TOOLS[3:]),
                "tool_index": "".join(f"- {t}: {t.replace('_', ' ')}\n" for t in _TOOLS),
                "tool_domains": {}}
        self.bound_digest = _sha(orjson.dumps(body))
        e = self._new(rng, "turn_capabilities_bound", {"epoch": self.epoch, **body}, (1, 20))
        self.bound = e.id
        return e

    def _op_caps_ref(self, rng: Random, _: int) -> RawEntry:
        self.epoch += 1
        return self._new(rng, "turn_capabilities_ref", {"entry": self.bound,
                         "digest": self.bound_digest, "epoch": self.epoch}, (1, 20))

    def _op_context_selection(self, rng: Random, _: int) -> RawEntry:
        per_turn = [[t, rng.choice(("Full", "Card", "Card", "Packet"))] for t in self.recent]
        plan: dict[str, Any] = {
            "per_turn": per_turn, "selected_records": None, "packet_range": None,
            "retrieved": [], "links": {}, "budget": 120_000, "spent": self.ctx}
        return self._new(rng, "context_selection", {"policy_version": 3,
                         "leaf_id": self.tail, "plan": plan}, (1, 20))

    def _reported(self, total: int) -> int:
        """``total`` as a provider reports it: ``noise`` adds a drift, per session and
        per request, within ``±noise`` of the true count."""
        noise = self.p.noise
        if not noise or not total:
            return total
        rel = self.bias + self.noise_rng.uniform(-0.25, 0.25) * noise
        return max(1, round(total * (1 + rel)))

    def _usage(self, rng: Random, total: int, out: int) -> dict[str, int]:
        """Split a request's input of ``total`` tokens as the provider reports it."""
        total = self._reported(total)
        self.ctx += out
        if self.p.provider == "ollama":
            u = {"input_tokens": total, "output_tokens": out}
        elif self.p.provider == "openai":
            read = min(self.cached, total) // 128 * 128
            u = {"input_tokens": total - read, "output_tokens": out,
                 "cache_read_input_tokens": read}
        else:
            read = min(self.cached, total)
            inp = min(total - read, rng.randint(1, 40))
            u = {"input_tokens": inp, "output_tokens": out, "cache_read_input_tokens": read,
                 "cache_creation_input_tokens": total - read - inp}
        self.cached = total
        self.usage = u
        return u

    def _assistant(self, rng: Random, blocks: list[dict[str, Any]], stop: str,
                   chars: int) -> RawEntry:
        if self.p.provider != "ollama" and rng.random() < 0.6:
            text = _slice(_PROSE, rng, int(rng.lognormvariate(5.5, 0.8) * self.p.size_scale) + 1)
            think: dict[str, Any] = {"type": "thinking", "text": _long(text)}
            if self.p.provider == "anthropic":
                think["signature"] = f"{rng.getrandbits(256):064x}"
            blocks.insert(0, think)
            chars += len(text)
        out = chars // 4 + rng.randint(5, 60)
        usage: dict[str, int] = {}  # filled once the request is known
        meta = {"model": self.p.model, "stop_reason": stop, "usage": usage}
        e = self._new(rng, "message", {"message": {"role": "assistant", "content": blocks},
                                       "meta": meta}, (800, 30_000))
        if self.replay is not None:
            req = self.replay.request()
            total = req.replayed_tokens
            self.prefix_tokens, self.prefix_digest = req.prefix_tokens, req.prefix_digest
        else:
            total = self.ctx + self.prefix_tokens  # input grows along the session
        usage.update(self._usage(rng, total, out))
        return e

    def _op_step(self, rng: Random, n_tools: int) -> RawEntry:
        self.tools = []
        for _ in range(n_tools):
            name, word = rng.choice(_TOOLS), rng.choice(WORDS[2:24])
            # Tool inputs are serde_json Values: without preserve_order, keys come sorted.
            arg = {"read_file": {"path": f"src/{word}.py"},
                   "bash": {"command": f"pytest -q tests/test_{word}.py"},
                   "grep": {"path": "src", "pattern": f"def {word}"},
                   "webfetch": {"url": f"https://example.com/{word}"},
                   "recall": {"query": f"{word} {rng.choice(WORDS[2:24])}"},
                   "write_file": {"content": f"# {word}\n", "path": f"src/{word}.py"}}[name]
            tid = (f"toolu_{rng.getrandbits(64):016x}" if self.p.provider == "anthropic"
                   else f"call_{rng.getrandbits(48):012x}")
            self.tools.append((tid, name, arg))
        blocks: list[dict[str, Any]] = []
        if rng.random() < 0.5:
            blocks.append({"type": "text", "text": _sentence(rng, 4, 20)})
        blocks += [{"type": "tool_use", "id": t, "name": n, "input": a} for t, n, a in self.tools]
        return self._assistant(rng, blocks, "tool_use", 60 * len(blocks))

    def _op_final(self, rng: Random, _: int) -> RawEntry:
        text = _slice(_PROSE, rng, int(rng.lognormvariate(5.8, 0.9) * self.p.size_scale) + 1)
        self.narration = text[:200]
        return self._assistant(rng, [{"type": "text", "text": _long(text)}], "end_turn",
                               len(text))

    def _op_receipt(self, rng: Random, _: int) -> RawEntry:
        p = self.p
        attempts: list[dict[str, Any]] = []
        failures = rng.choice((1, 2)) if rng.random() < 0.08 else 0
        for k in range(failures):  # failed attempts first, then the winning one
            attempts.append({"ordinal": k, "reason": "retry" if k else "initial",
                             "domain": rng.choice(("provider", "network", "deadline")),
                             "settlement": "failed", "latency_ms": rng.randint(200, 30_000),
                             "error": rng.choice(("overloaded_error: Overloaded",
                                                  "connection reset by peer",
                                                  "deadline exceeded after 30s"))})
        attempts.append({"ordinal": failures, "reason": "retry" if failures else "initial",
                         "domain": "unknown", "settlement": "ok",
                         "latency_ms": rng.randint(300, 25_000), "usage": self.usage})
        payload: dict[str, Any] = {"purpose": "execute", "provider": p.provider,
                                   "model": p.model, "winning_attempt": failures,
                                   "attempts": attempts, "prefix_digest": self.prefix_digest}
        if self.prefix_digest not in self.seen_digests:  # measured on the first request
            self.seen_digests.add(self.prefix_digest)     # seen with a digest only
            payload["prefix_tokens"] = self.prefix_tokens
        return self._new(rng, "receipt", payload, (1, 20))

    def _op_results(self, rng: Random, _: int) -> RawEntry:
        blocks, self.results = [], []
        for tid, name, arg in self.tools:
            n = _result_len(rng, self.p.size_scale)
            err = rng.random() < 0.04
            if err:
                text = f"error: {name}: no such file or directory: {next(iter(arg.values()))}"
            elif name == "webfetch" and n < 3000:
                text = orjson.dumps([{"title": _sentence(rng, 2, 6), "url":
                                      f"https://example.com/r/{i}"} for i in range(n // 90 + 1)]
                                    ).decode()
            elif name == "write_file":
                text = f"wrote {n} bytes to {arg['path']}"
            else:
                buf = {"read_file": _CODE, "grep": _CODE, "bash": _LOG}.get(name, _PROSE)
                text = _slice(buf, rng, n, "\n" if buf is not _PROSE else ". ")
                if name == "bash":
                    text = f"exit code: {int(rng.random() < 0.1)}\n{text}"
            self.results.append(text)
            self.ctx += len(text) // 4
            self.did.append({"tool": name, "args_digest": arg, "evidence_id": tid,
                             "shape": f"{text.count(chr(10)) + 1} lines, {len(text)} chars"})
            blocks.append({"type": "tool_result", "tool_use_id": tid, "content": _long(text),
                           "is_error": err})
        return self._new(rng, "message", {"message": {"role": "user", "content": blocks}},
                         (50, 8_000))

    def _op_call_effect(self, rng: Random, t: int) -> RawEntry:
        tid, name, arg = self.tools[t]
        if name in ("webfetch", "recall"):
            eff: dict[str, Any] = {"kind": "mcp", "server": "web", "tool": name,
                                   "schema_digest": _sha(name.encode())}
        else:
            eff = {"kind": "file_write" if name == "write_file" else "file_read",
                   "path": arg.get("path", "."), "digest": _sha(self.results[t][:64].encode()),
                   "bytes": len(self.results[t])}
        return self._new(rng, "call_effect", {"tool_use_id": tid, "effect": eff}, (1, 5))

    def _op_evidence_body(self, rng: Random, t: int) -> RawEntry:
        return self._new(rng, "evidence_body", {"tool_use_id": self.tools[t][0],
                                                "content": _long(self.results[t])}, (1, 5))

    def _op_presentation(self, rng: Random, _: int) -> RawEntry:
        sem = rng.choice(("metric", "table", "code", "link_list"))
        body = {"label": rng.choice(WORDS[2:24]), "value": rng.randrange(1000), "unit": "ms"}
        body = dict(sorted(body.items()))  # vak stores the payload key-sorted
        title = body["label"]
        derived = [t[0] for t in self.tools[:2]]
        src = ({"kind": "tool_call", "tool_use_id": self.tools[0][0]} if self.tools
               else {"kind": "fence", "message_entry_id": self.tail})
        digest = _sha(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
        ident = f"{title}: {body['value']} ms"
        e = self._new(rng, "presentation", {
            "turn_id": self.turn, "source": src, "semantic_type": sem, "skill_id": "core",
            "skill_version": "1.0.0", "schema_version": 2, "payload": body,
            "payload_digest": digest, "derived_from": derived, "title": title,
            "identity_digest": ident}, (1, 20))
        self.pres.append({"id": e.id, "semantic_type": sem, "title": title, "digest": ident,
                          "derived_from": derived})
        return e

    def _op_control(self, rng: Random, _: int) -> RawEntry:
        kind = rng.choice(_CONTROLS[:6] if self.p.t13 else _CONTROLS)
        marker = kind.replace("_check", "-check").replace("_", "-")
        marker = "topic-mismatch" if kind == "topic_mismatch_check" else marker
        text = f"[{marker}]: {_sentence(rng, 4, 14)}"
        self.ctx += len(text) // 4
        return self._new(rng, "message", {
            "message": {"role": "user", "content": [{"type": "text", "text": text}]},
            "meta": {"control": kind}}, (1, 50))

    def _op_turn_card(self, rng: Random, _: int) -> RawEntry:
        card = {"turn_id": self.turn, "asked": self.asked[:160], "did": self.did,
                "answered": {"presentations": self.pres, "narration": self.narration},
                "outcome": "completed", "reading": {"act": self.act, "domains": [],
                                                    "modalities": ["text"]},
                "tokens_full": 0, "tokens_card": 0}  # set below: the card line omits them
        self.pending.append(self.turn)
        self.recent.append(self.turn)
        e = self._new(rng, "turn_card", {"turn_id": self.turn, "card": card}, (1, 40))
        if self.replay is not None:
            card["tokens_full"], card["tokens_card"] = self.replay.card_tokens(self.turn)
        else:
            card["tokens_full"] = max(40, self.ctx - self.ctx0)
            card["tokens_card"] = 12 + len(self.asked) // 8 + 6 * len(self.did)
        return e

    def _op_compaction(self, rng: Random, reset: int) -> RawEntry:
        first, last = (self.pending[0], self.pending[-1]) if self.pending else ("", "")
        payload: dict[str, Any] = {
            "summary": ("Objective: " if reset else "") + _slice(_PROSE, rng, 600),
            "first_turn_id": "" if reset else first, "last_turn_id": "" if reset else last,
            "model": "" if reset else self.p.model, "tokens_before": self.ctx,
            "reset_all": bool(reset)}
        if not self.p.t13:
            payload["keeps_open_turn"] = False
        self.pending = []
        if reset:  # the reset replaces the whole context with its summary
            self.ctx = self.ctx0 = 160
            self.cached = 0
        return self._new(rng, "compaction", payload, (2_000, 20_000))

    def _op_child_run(self, rng: Random, _: int) -> RawEntry:
        status = rng.choice(("completed", "completed", "failed", "aborted", "max_turns"))
        return self._new(rng, "child_run", {"status": status, "outcome": _sentence(rng, 3, 9)},
                         (100, 60_000))
