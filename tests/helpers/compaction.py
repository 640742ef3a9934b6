"""Helpers of the compaction tests: generated sessions as active chains, a compaction
engine driven request by request, and re-sending a ledger's last request.

Plain functions (fixtures are in the test modules); everything here is pure and reads
bytes held in memory.
"""

from __future__ import annotations

import functools
import io
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.audit.session import SessionAudit, audit_session
from pipeline.compaction.cards import CardsSummariser
from pipeline.compaction.engine import DEFAULT_SUMMARY_TOKENS, CompactionEngine, PlannedPacket
from pipeline.compaction.summaries import Summariser, Summary, SummaryRequest
from pipeline.io.storage import Location
from pipeline.ledger.layout import SessionKey, parse_session_path
from pipeline.ledger.reader import Entry, read_ledger
from pipeline.replay.catalog import Capacity
from pipeline.replay.engine import ReplayEngine, RequestReplay
from pipeline.replay.projection import get_rule_set
from pipeline.replay.tokens import get_tokenizer
from pipeline.synth.generator import generate_session

RULES = get_rule_set("v1")


@dataclass(frozen=True)
class Chain:
    """One ledger held in memory: its bytes, audit and active chain (root first)."""

    path: str
    key: SessionKey
    data: bytes
    audit: SessionAudit
    entries: tuple[Entry, ...]

    @property
    def session_id(self) -> str:
        """The header's session id (the file's stem without a header)."""
        return str(self.audit.row.get("session_id") or self.key.session_id)


def chain_of(path: str, data: bytes) -> Chain:
    """Audit ``data`` (the ledger at ``path``, relative to its root) and keep its active
    chain, as the batch replay does (``replay_batches``: same bytes, read twice)."""
    key = parse_session_path(path)
    assert key is not None, path
    audit = audit_session(key, io.BytesIO(data), size=len(data))
    entries = tuple(e for e in read_ledger(io.BytesIO(data))
                    if isinstance(e, Entry) and (e.line, e.id) in audit.active)
    return Chain(path, key, data, audit, entries)


@functools.lru_cache(maxsize=64)
def generated(seed: int, turns: int, fault: str | None = None) -> Chain:
    """A generated session (``generate_session(seed, turns=turns)``) as a :class:`Chain`."""
    s = generate_session(seed, turns=turns, fault=fault)
    return chain_of(s.path, b"".join(s.lines()))


def budget(cap: Capacity) -> int:
    """What a request may hold under ``cap``: input limit minus the output reserve."""
    return cap.input_limit - cap.output_reserve


@dataclass
class Planning:
    """A compaction engine's replay of one chain, with what it knew at each request.

    Attributes
    ----------
    engine:
        The engine, after the whole chain and ``finish()``.
    requests:
        Every replayed request, by entry id.
    at_request:
        Per assistant message (entry id): the number of turns behind the newest reset
        when its request was planned, the turns then closed (numbers) and the packets
        planned by that request.
    """

    engine: CompactionEngine
    requests: dict[str, RequestReplay] = field(default_factory=dict)
    at_request: dict[str, tuple[int, tuple[int, ...], list[PlannedPacket]]] = field(
        default_factory=dict)

    @property
    def planned(self) -> list[PlannedPacket]:
        """Every packet planned, in planning order."""
        return self.engine.planned


def plan(chain: Chain, cap: Capacity, *, summariser: Summariser | None = None,
         inject: dict[str, Sequence[Entry]] | None = None,
         summary_tokens: int = DEFAULT_SUMMARY_TOKENS) -> Planning:
    """Replay ``chain`` with a :class:`CompactionEngine` for ``cap``, one entry at a time.

    ``inject`` maps an entry id to entries fed just before it (stored packets a test
    places in the ledger).
    """
    engine = CompactionEngine(RULES, get_tokenizer(), capacity=cap,
                              summariser=summariser or CardsSummariser(),
                              session_id=chain.session_id, summary_tokens=summary_tokens)
    out = Planning(engine)
    for entry in chain.entries:
        for extra in (inject or {}).get(entry.id, ()):
            for req in engine.feed(extra):
                out.requests[req.entry_id] = req
        if entry.kind == "message" and entry.role == "assistant" and engine.index.current:
            behind = engine.reset[2] if engine.reset is not None else 0
            closed = tuple(t.number for t in engine.index.turns[behind:-1] if t.closed)
            before = len(engine.planned)
            for req in engine.feed(entry):
                out.requests[req.entry_id] = req
            out.at_request[entry.id] = (behind, closed, engine.planned[before:])
            continue
        for req in engine.feed(entry):
            out.requests[req.entry_id] = req
    for req in engine.finish():
        out.requests[req.entry_id] = req
    return out


def packet_entry(first_turn_id: str, last_turn_id: str, summary: str, n: int = 0) -> Entry:
    """A stored (ledger) packet over ``first_turn_id``..``last_turn_id``, as the reader
    would give it (the engine reads only its kind and payload)."""
    eid = f"0199a1f2-6a00-7000-8000-{0xfeed0000 + n:012x}"
    data = {"id": eid, "parent_id": None, "ts": "2026-11-01T00:00:00Z", "kind": "compaction",
            "summary": summary, "first_turn_id": first_turn_id, "last_turn_id": last_turn_id,
            "model": "m", "tokens_before": 0, "reset_all": False}
    return Entry(0, eid, None, "compaction", data["ts"], None, None, "", data)


@dataclass
class RecordingSummariser:
    """A :class:`CardsSummariser` that keeps every request it was asked."""

    inner: CardsSummariser = field(default_factory=CardsSummariser)
    seen: list[SummaryRequest] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The wrapped summariser's name."""
        return self.inner.name

    @property
    def version(self) -> str:
        """The wrapped summariser's version."""
        return self.inner.version

    def summarise(self, request: SummaryRequest) -> Summary:
        """Record ``request``, then summarise it."""
        self.seen.append(request)
        return self.inner.summarise(request)


def last_assistant(entries: Iterable[Entry]) -> tuple[int, Entry]:
    """Index and entry of the last assistant message of an active chain."""
    found = [(i, e) for i, e in enumerate(entries)
             if e.kind == "message" and e.role == "assistant"]
    assert found, "no request in the chain"
    return found[-1]


def resend_last(chain: Chain, appended: int, cap: Capacity) -> tuple[ReplayEngine,
                                                                      RequestReplay]:
    """The last request of a compacted copy exactly as it was sent, but with the
    ``appended`` packets (the chain's last entries) in place: a plain planner-v1 engine
    fed the chain up to that assistant message, then the packets, then ``peek``.

    (``peek`` after the *whole* chain would be another request: the one after the last,
    with the last assistant message already in its open turn.)"""
    engine = ReplayEngine(RULES, get_tokenizer(), planner=cap)
    i, last = last_assistant(chain.entries[:len(chain.entries) - appended])
    for entry in (*chain.entries[:i], *chain.entries[len(chain.entries) - appended:]):
        for _ in engine.feed(entry):
            pass
    req = engine.peek(last)
    assert req is not None
    return engine, req


def packet_found(engine: ReplayEngine, req: RequestReplay) -> bool | None:
    """Whether the packet range ``req``'s plan names has a stored packet (``None``: the
    plan names none)."""
    if not req.plan_packet_turns:
        return None
    turns = engine.index.turns
    rng = (turns[req.plan_packet_turns[0] - 1].id, turns[req.plan_packet_turns[-1] - 1].id)
    return rng in engine.packets


def write_chains(root: Location, chains: Iterable[Chain]) -> None:
    """Store ``chains`` under the archive root ``root`` (any fsspec location)."""
    fs = root.filesystem()
    for chain in chains:
        path = root.join(chain.path)
        if root.protocol == "file":
            fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.pipe_file(path, chain.data)


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: relative path -> (size, mtime in ns)."""
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}
