"""Synthetic fleets of vak session ledgers, with optional ground-truth faults. Pure.

Drives the demo, the tests and the benchmarks. Output is byte-identical for the same
arguments and is produced line by line: a session is never held in memory, so a 1 GB
session costs a few megabytes. Lines are written as vak writes them (see
:mod:`pipeline.synth.faults`, :mod:`pipeline.synth.content` and
``spec/vak-wire-format.md``), with turns built as in
spec section 4: directive, tool iterations (assistant ``tool_use`` -> receipt -> user
``tool_result``), a final answer, its receipt, then the turn card.

Each turn draws its *structure* (the list of entries it will write) from its own RNG
before drawing any content, so the number of entries of a session is known without
generating it; that is what places a fault anywhere in a session before streaming it.

By default the token figures vak records (``meta.usage``, receipts' ``prefix_digest`` and
``prefix_tokens``, turn cards' ``tokens_full``/``tokens_card``) are those a replay under
projection rule set ``v1`` computes (:mod:`pipeline.synth.replay`), so replaying a
generated session reproduces them exactly; ``consistent=False`` draws them instead, which
is several times faster (benchmarks), and ``noise`` adds provider-like drift to usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from random import Random
from typing import Any

from pipeline.ledger.layout import session_path
from pipeline.ledger.wire import RawEntry, uuid7
from pipeline.synth.content import WORDS, Builder, SessionPlan, mix
from pipeline.synth.faults import (
    FAULTS,
    PATH_FAULTS,
    FaultSpec,
    InjectedFault,
    expected_findings,
    plan_fault,
    write,
)

__all__ = [
    "FAULTS", "GeneratedSession", "InjectedFault", "generate_fleet", "generate_session",
    "ground_truth",
]

_BASE_S = 1_793_491_200  # 2026-11-01T00:00:00Z: sessions start within the 28 days after
_FAULT_SALT = 1 << 41
_MODELS = (("anthropic", "claude-sonnet-4-5"), ("anthropic", "claude-opus-4-1"),
           ("openai", "gpt-5"), ("ollama", "gemma4:e2b-mlx"))


def _plan(seed: int, agent: str, size_scale: float, turns: int | None,
          target_bytes: int | None, t13: bool | None, consistent: bool = True,
          noise: float = 0.0) -> SessionPlan:
    """Session-level decisions: start, model, project, wire version, number of turns."""
    rng = Random(seed)
    start = (_BASE_S + rng.randrange(28 * 86_400)) * 10**9 + rng.randrange(10**9)
    provider, model = rng.choices(_MODELS, weights=(4, 2, 3, 1))[0]
    user = rng.choice(("me", "ana", "bo", "kai", "lin"))
    # Few projects, so several sessions share a cwd directory as in a real archive.
    proj = rng.choice(WORDS[2:14])
    cwd = rng.choice((f"/home/{user}/{proj}", f"/Users/{user}/src/{proj}"))
    sid = uuid7(start // 10**6 - rng.randrange(1, 900), rng.getrandbits(74))
    legacy = rng.random() < 0.15
    if turns is None and target_bytes is None:
        turns = max(1, min(400, round(rng.lognormvariate(1.3, 1.0))))
    pre = tuple(op for op, p in (("goal", 0.3), ("activity", 0.3)) if rng.random() < p)
    post = tuple(op for op, p in (("activity", 0.1), ("child_run", 0.1)) if rng.random() < p)
    return SessionPlan(seed, agent, size_scale, start, provider, model, cwd, sid,
                       legacy if t13 is None else t13, turns, target_bytes or 0, pre, post,
                       rng.random() < 0.5, consistent, noise)


def _turn_ops(plan: SessionPlan, j: int) -> tuple[list[tuple[str, int]], Random]:
    """Turn ``j``'s entries as ``(op, arg)``; the returned RNG then draws its content."""
    rng = Random(mix(plan.seed, j))
    r, new = rng.random, not plan.t13
    ops = [("directive", int(j > 0 and r() < 0.07))]  # arg 1: re-ask the previous turn
    for op, p in (("intent", 1.0 if j == 0 else 0.3), ("goal_update", 1.0 if j == 0 else 0.08),
                  ("goal", 0.5 if j == 0 else 0.04), ("activity", 0.1), ("work", 0.05)):
        if r() < p:
            ops.append((op, 0))
    if j == 0 or r() < 0.03:
        ops.append(("caps_bound", 0))
    elif new and r() < 0.15:
        ops.append(("caps_ref", 0))
    if new and j > 0 and r() < 0.4:
        ops.append(("context_selection", 0))
    for _ in range(min(int(rng.expovariate(1 / 1.8)), 15)):
        n_tools = 1 + (r() < 0.25) + (r() < 0.08)
        ops += [("step", n_tools), ("receipt", 0), ("results", n_tools)]
        for t in range(n_tools):
            if new and r() < 0.35:
                ops.append(("call_effect", t))
            if new and r() < 0.2:
                ops.append(("evidence_body", t))
        if r() < 0.1:
            ops.append(("presentation", 0))
        if r() < 0.1:
            ops.append(("control", 0))
    ops += [("final", 0), ("receipt", 0)]
    if r() < 0.15:
        ops.append(("presentation", 0))
    ops.append(("turn_card", 0))
    if j >= 2 and r() < 0.1:
        ops.append(("compaction", int(r() < 0.2)))
    if r() < 0.02:
        ops.append(("child_run", 0))
    return ops, rng


def _entry_count(plan: SessionPlan) -> int:
    """Entries of the clean session, from its structure alone (no content generated)."""
    assert plan.turns is not None
    body = sum(len(_turn_ops(plan, j)[0]) for j in range(plan.turns))
    return 1 + len(plan.pre) + body + len(plan.post)


def _entries(plan: SessionPlan, written: list[int]) -> Iterator[RawEntry]:
    """The clean session: header, entries before the first turn, the turns, the tail."""
    b = Builder(plan)
    yield b.header()
    for op in plan.pre:
        yield b.ops[op](b.rng, 0)
    j = 0
    ahead = _turn_ops(plan, 0)
    while j < plan.turns if plan.turns is not None else written[0] < plan.target_bytes:
        (ops, rng), ahead = ahead, _turn_ops(plan, j + 1)
        # Whether the next turn re-asks this one, abandoning it (the builder's replay
        # engine must not carry this turn into the active chain).
        b.abandoned_next = ahead[0][0] == ("directive", 1)
        for op, arg in ops:
            yield b.ops[op](rng, arg)
        j += 1
    for op in plan.post:
        yield b.ops[op](b.rng, 0)


@dataclass(frozen=True, slots=True)
class GeneratedSession:
    """One generated session: where it goes, how to stream it, and its ground truth.

    Attributes
    ----------
    path:
        Relative path ``agents/<agent>/sessions/<cwd_hash>/<session_id>.jsonl``.
    session_id, cwd:
        The header's values (the path disagrees with them for path faults).
    fault:
        Name of the injected fault (one of :data:`FAULTS`), or ``None``.
    faults:
        The findings a correct audit must report (primary ones only).
    """

    path: str
    session_id: str
    cwd: str
    fault: str | None
    faults: tuple[InjectedFault, ...]
    _plan: SessionPlan = field(repr=False)
    _spec: FaultSpec | None = field(repr=False)

    def lines(self) -> Iterator[bytes]:
        """Stream the session's physical lines (each with its ``\\n``, but a torn tail).

        Every call regenerates the same bytes; memory stays bounded by the largest line.
        """
        written = [0]
        return write(_entries(self._plan, written), self._spec, written)


def generate_session(seed: int, *, target_bytes: int | None = None, turns: int | None = None,
                     fault: str | None = None, agent: str = "vak", size_scale: float = 1.0,
                     t13: bool | None = None, consistent: bool = True,
                     noise: float = 0.0) -> GeneratedSession:
    """Generate one session.

    Parameters
    ----------
    seed:
        Everything about the session follows from it.
    target_bytes:
        Write turns until the session has at least this many bytes (it overshoots by at
        most one turn). Exclusive with ``turns`` and ``fault``.
    turns:
        Number of turns; by default drawn from a heavy-tailed (lognormal) distribution.
    fault:
        Inject this fault (one of :data:`FAULTS`).
    agent:
        Agent id in the path and the header.
    size_scale:
        Multiplies the size of tool results, thinking, answers and the system prompt.
    t13:
        Force (or forbid) the seed's T13 wire version; drawn (15%) by default.
    consistent:
        Take every figure vak measures from a replay of the session under projection
        rule set ``v1`` (:mod:`pipeline.synth.replay`): each assistant message's
        ``meta.usage`` input (``input + cache read + cache creation``) and its
        receipt's winning attempt usage equal the replayed request's tokens, the
        receipt's ``prefix_digest``/``prefix_tokens`` the replayed prefix, and each
        ``turn_card``'s ``tokens_full``/``tokens_card`` the replayed Full rendering and
        Card line. Tokenizing runs at a few MB/s; ``False`` draws the figures instead
        (no tokenizer, tens of MB/s, same content otherwise).
    noise:
        Relative drift of the reported usage, as a provider with another tokenizer
        would report it: a per-session bias plus per-request jitter, never more than
        ``noise`` (``0.03``: within 3%) off, deterministic from the seed. Prefix and card
        figures stay exact (vak measures them itself). ``0`` (default): exact.

    Returns
    -------
    GeneratedSession
        Lazy: its bytes are produced only by :meth:`GeneratedSession.lines`.
    """
    if target_bytes is not None and (turns is not None or fault is not None):
        raise ValueError("target_bytes excludes turns and fault")
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"noise must be in [0, 1), not {noise!r}")
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    if fault == "unchained_legacy":
        t13 = True  # entries written before chaining are old: the seed's version
    plan = _plan(seed, agent, size_scale, turns, target_bytes, t13, consistent, noise)
    path = session_path(agent, plan.cwd, plan.session_id)
    spec: FaultSpec | None = None
    found: tuple[InjectedFault, ...] = ()
    if fault is not None:
        rng = Random(mix(seed, _FAULT_SALT))
        token = uuid7(plan.start_ns // 10**6 + rng.randrange(1, 10**6), rng.getrandbits(74))
        if fault == "cwd_hash_mismatch":  # the project moved; its ledger did not
            path = session_path(agent, plan.cwd + "-old", plan.session_id)
        elif fault == "session_id_mismatch":
            path = session_path(agent, plan.cwd, token)
        spec = (FaultSpec(fault) if fault in PATH_FAULTS
                else plan_fault(fault, _entry_count(plan), rng, token))
        found = expected_findings(spec)
    return GeneratedSession(path, plan.session_id, plan.cwd, fault, found, plan, spec)


def generate_fleet(sessions: int, seed: int, *, faults: bool = False, agent: str = "vak",
                   size_scale: float = 1.0, consistent: bool = True,
                   noise: float = 0.0) -> Iterator[GeneratedSession]:
    """Generate a fleet of sessions, lazily.

    Parameters
    ----------
    sessions:
        How many.
    seed:
        The fleet's seed; the same arguments give byte-identical sessions.
    faults:
        Inject exactly one fault into about 30% of the sessions, cycling through
        :data:`FAULTS` so that every fault appears in a fleet of 60 or more. The sessions
        are the same as without faults, but for the injected damage.
    agent:
        Agent id of every session.
    size_scale, consistent, noise:
        See :func:`generate_session`.

    Yields
    ------
    GeneratedSession
        In a deterministic order.
    """
    rng, frng = Random(seed), Random(mix(seed, _FAULT_SALT))
    offset = frng.randrange(len(FAULTS))
    for _ in range(sessions):
        s = rng.getrandbits(63)
        fault = None
        if faults and frng.random() < 0.3:
            fault, offset = FAULTS[offset % len(FAULTS)], offset + 1
        yield generate_session(s, fault=fault, agent=agent, size_scale=size_scale,
                               consistent=consistent, noise=noise)


def ground_truth(sessions: Iterable[GeneratedSession]) -> dict[str, dict[str, Any]]:
    """Expected audit results, in the shape of the conformance ``expected.json``.

    Parameters
    ----------
    sessions:
        Generated sessions; each is streamed once to count its lines and bytes.

    Returns
    -------
    dict
        ``{path: {"fault": name | None, "findings": [{"line", "code"}], "lines", "bytes"}}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for s in sessions:
        n_lines = n_bytes = 0
        for line in s.lines():
            n_lines += 1
            n_bytes += len(line)
        out[s.path] = {"fault": s.fault,
                       "findings": [{"line": f.line, "code": f.code} for f in s.faults],
                       "lines": n_lines, "bytes": n_bytes}
    return out

