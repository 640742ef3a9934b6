"""Tests of pipeline.synth.generator: determinism, wire format, coverage, ground truth,
streaming."""

from __future__ import annotations

import hashlib
import itertools
import re
import statistics
import tracemalloc
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson
import pytest

from pipeline.audit.session import SessionAudit, audit_session
from pipeline.ledger.layout import cwd_hash, parse_session_path
from pipeline.ledger.reader import KNOWN_KINDS, Entry, read_ledger
from pipeline.ledger.tree import TreeIndex
from pipeline.ledger.types import Code, Severity
from pipeline.ledger.wire import LongText, RawEntry, serialize
from pipeline.replay.engine import ReplayEngine, RequestReplay
from pipeline.replay.projection import get_rule_set
from pipeline.replay.tokens import get_tokenizer
from pipeline.synth.generator import (
    FAULTS,
    GeneratedSession,
    generate_fleet,
    generate_session,
    ground_truth,
)

TS = re.compile(r"\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z\Z")
UUID7 = re.compile(r"\A[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")


def audit(s: GeneratedSession) -> SessionAudit:
    key = parse_session_path(s.path)
    assert key is not None, s.path
    return audit_session(key, s.lines())


def reported(a: SessionAudit) -> set[tuple[int | None, str]]:
    return {(f.line, f.code.text) for f in a.findings}


def entries(lines: Iterable[bytes]) -> list[Entry]:
    return [e for e in read_ledger(lines) if isinstance(e, Entry)]


@pytest.fixture(scope="module")
def fleet() -> list[GeneratedSession]:
    return list(generate_fleet(30, seed=11))


@pytest.fixture(scope="module")
def faulty_fleet() -> list[GeneratedSession]:
    return list(generate_fleet(90, seed=5, faults=True, size_scale=0.3))


def test_same_arguments_give_identical_bytes() -> None:
    def digest(sessions: Iterable[GeneratedSession]) -> list[tuple[str, str]]:
        return [(s.path, hashlib.sha256(b"".join(s.lines())).hexdigest()) for s in sessions]

    a = digest(generate_fleet(12, seed=3, faults=True))
    assert a == digest(generate_fleet(12, seed=3, faults=True))
    assert a != digest(generate_fleet(12, seed=4, faults=True))
    s = generate_session(99, target_bytes=300_000)
    assert b"".join(s.lines()) == b"".join(s.lines())  # lines() regenerates, identically


def test_faults_leave_the_rest_of_the_fleet_unchanged() -> None:
    clean = list(generate_fleet(20, seed=8))
    faulty = list(generate_fleet(20, seed=8, faults=True))
    for c, f in zip(clean, faulty, strict=True):
        if f.fault is None:
            assert (c.path, b"".join(c.lines())) == (f.path, b"".join(f.lines()))
    assert any(f.fault for f in faulty)


def test_wire_format_and_chain(fleet: list[GeneratedSession]) -> None:
    for s in fleet[:10]:
        lines = list(s.lines())
        assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)
        header = orjson.loads(lines[0])
        assert list(header)[:4] == ["id", "parent_id", "ts", "kind"]
        assert header["parent_id"] is None and header["kind"] == "header"
        assert header["session_id"] == s.session_id and header["cwd"] == s.cwd
        assert list(header["contract"]) == [
            "app_version", "provider", "model", "route_ladder", "route_objective",
            "route_annotations", "system_prompt", "permission_mode", "capabilities",
            "prompt_layers"]
        assert s.path == f"agents/vak/sessions/{cwd_hash(s.cwd)}/{s.session_id}.jsonl"
        prev_ts = ""
        for before, line in itertools.pairwise(lines):
            obj = orjson.loads(line)  # keeps the document's key order
            envelope = ["id", "parent_id", "ts", "prev_hash"] + ["at_turn"] * ("at_turn" in obj)
            assert list(obj)[: len(envelope) + 1] == [*envelope, "kind"]
            assert obj["prev_hash"] == hashlib.sha256(before[:-1]).hexdigest()
            assert UUID7.match(obj["id"]) and TS.match(obj["ts"])
            assert obj["ts"] > prev_ts
            prev_ts = obj["ts"]
            # orjson is compact and keeps insertion order: re-serialising changes nothing
            # (but for work lines, whose second kind orjson collapses).
            if isinstance(obj["kind"], str):
                assert orjson.dumps(obj) + b"\n" == line


def test_work_lines_carry_two_kind_keys_as_vak_writes_them(fleet: list[GeneratedSession]) -> None:
    works = [line for s in fleet for line in s.lines() if b'"kind":"work"' in line]
    assert works
    for line in works:
        assert line.count(b'"kind":') >= 2
        assert re.search(rb'"revision":\d+,"kind":\{"kind":"contract_status_changed",', line)


def test_every_kind_and_feature_appears_in_a_30_session_fleet(
    fleet: list[GeneratedSession],
) -> None:
    kinds: Counter[str] = Counter()
    controls: set[str] = set()
    features: Counter[str] = Counter()
    for s in fleet:
        es = entries(s.lines())
        kinds.update(e.kind for e in es)
        features["t13"] += all(e.at_turn is None for e in es)
        for e in es:
            d = e.data
            controls.add(e.meta.get("control", ""))
            features["model_visible"] += "model_visible" in d
            features["reset_all"] += d.get("reset_all") is True
            features["packet"] += d.get("reset_all") is False
            features["thinking"] += any(b.get("type") == "thinking" for b in e.content)
            features["failed_retry"] += any(
                a.get("reason") == "retry" and a.get("settlement") == "failed"
                for a in d.get("attempts", []))
        features["branched"] += audit(s).row["abandoned_entries"] > 0
    assert set(kinds) == KNOWN_KINDS
    assert "freshness_check" in controls or len(controls) > 3
    assert all(features[f] > 0 for f in (
        "t13", "model_visible", "reset_all", "packet", "thinking", "branched",
        "failed_retry")), features


def test_turn_structure_and_growing_usage() -> None:
    s = generate_session(21, turns=6, t13=False)
    es = entries(s.lines())
    directives = [e for e in es if e.role == "user" and e.content[0].get("type") == "text"
                  and not e.meta.get("control")]
    assert len(directives) == 6
    assert all(e.at_turn == e.id for e in directives)
    first = es.index(directives[0])
    assert all(e.at_turn is None for e in es[:first])
    assert all(e.at_turn is not None for e in es[first:])
    # each assistant message is followed by its receipt; cards close turns
    for a, b in itertools.pairwise(es):
        if a.role == "assistant":
            assert b.kind == "receipt"
            assert b.data["attempts"][-1]["usage"] == a.meta["usage"]
    totals = [sum(v for k, v in e.meta["usage"].items() if k != "output_tokens")
              for e in es if e.role == "assistant"]
    assert totals[-1] > totals[0]
    assert sum(e.kind == "turn_card" for e in es) == 6


def test_clean_fleet_audits_clean(fleet: list[GeneratedSession]) -> None:
    for s in fleet:
        a = audit(s)
        assert s.faults == () and s.fault is None
        assert [f for f in a.findings if f.severity > Severity.INFO] == [], s.path
        assert {f.code for f in a.findings} <= {Code.DUPLICATE_KIND_KEY}


def test_faulty_fleet_ground_truth_is_reported(faulty_fleet: list[GeneratedSession]) -> None:
    names = Counter(s.fault for s in faulty_fleet)
    assert set(FAULTS) <= set(names)  # a 90-session fleet cycles through all of them
    assert 0.15 < (len(faulty_fleet) - names[None]) / len(faulty_fleet) < 0.45
    for s in faulty_fleet:
        a = audit(s)
        want = {(f.line, f.code) for f in s.faults}
        assert want <= reported(a), (s.fault, sorted(want), a.findings)
        if s.fault is None:
            assert a.row["status"] == "ok", a.findings
        else:
            assert len(s.faults) >= 1


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_each_fault_is_reported_at_its_line(fault: str, seed: int) -> None:
    s = generate_session(seed, fault=fault, size_scale=0.2)
    assert s.fault == fault and s.faults
    assert {(f.line, f.code) for f in s.faults} <= reported(audit(s))


def _diff(seed: int, fault: str) -> tuple[list[bytes], list[bytes], GeneratedSession]:
    f = generate_session(seed, fault=fault, size_scale=0.2)
    return list(generate_session(seed, size_scale=0.2).lines()), list(f.lines()), f


def test_fault_bytes() -> None:
    clean, bad, s = _diff(7, "torn_tail")
    assert len(bad) == len(clean) and not bad[-1].endswith(b"\n")
    assert clean[-1].startswith(bad[-1]) and bad[:-1] == clean[:-1]

    clean, bad, s = _diff(7, "recovered_torn")
    k = s.faults[0].line
    assert k is not None and len(bad) == len(clean) + 1
    assert bad[k - 1].endswith(b"\n") and bad[k].startswith(bad[k - 1][:-1])

    clean, bad, s = _diff(7, "torn_merge")
    k = s.faults[0].line
    assert k is not None and len(bad) == len(clean) - 1
    start = bad[k - 1].find(b'{"id":', 1)
    merged = orjson.loads(bad[k - 1][start:])
    assert merged["prev_hash"] == hashlib.sha256(bad[k - 2][:-1]).hexdigest()

    for fault, check in (("not_object", lambda b: b.startswith(b"[{")),
                         ("deep_nesting", lambda b: b"[" * 2000 in b),
                         ("nan_literal", lambda b: b'"ts":NaN' in b),
                         ("invalid_utf8", lambda b: b"\xc3\x28" in b),
                         ("missing_field", lambda b: b',"kind":"' not in b[:200]),
                         ("damaged_middle", lambda b: b"\0" in b),
                         ("tamper_edit", lambda b: orjson.loads(b) is not None)):
        clean, bad, s = _diff(7, fault)
        changed = [i for i, (c, b) in enumerate(zip(clean, bad, strict=True)) if c != b]
        assert len(changed) == 1 and check(bad[changed[0]]), fault

    clean, bad, s = _diff(7, "delete_line")
    k = s.faults[0].line
    assert k is not None and bad == clean[: k - 1] + clean[k:]

    clean, bad, s = _diff(7, "swap_lines")
    k = s.faults[0].line
    assert k is not None and bad[k - 1] == clean[k] and bad[k] == clean[k - 1]

    clean, bad, s = _diff(7, "unchained_legacy")
    assert [f.line for f in s.faults] == list(range(2, len(s.faults) + 2))
    assert all(b'"prev_hash"' not in line for line in bad[1 : len(s.faults) + 1])


def test_path_faults_move_the_file_not_the_bytes() -> None:
    for fault in ("cwd_hash_mismatch", "session_id_mismatch"):
        s = generate_session(5, fault=fault)
        clean = generate_session(5)
        assert s.path != clean.path and b"".join(s.lines()) == b"".join(clean.lines())
        assert s.faults[0].line == 1


def test_ground_truth_has_the_conformance_shape(faulty_fleet: list[GeneratedSession]) -> None:
    sessions = faulty_fleet[:15]
    truth = ground_truth(sessions)
    assert list(truth) == [s.path for s in sessions]
    for s in sessions:
        t = truth[s.path]
        assert set(t) == {"fault", "findings", "lines", "bytes"}
        lines = list(s.lines())
        assert (t["lines"], t["bytes"]) == (len(lines), sum(map(len, lines)))
        assert t["fault"] == s.fault
        assert t["findings"] == [{"line": f.line, "code": f.code} for f in s.faults]
        assert all(f["code"] in {c.text for c in Code} for f in t["findings"])


def test_streaming_keeps_memory_far_below_the_session_size() -> None:
    # The benchmarks' path. With consistent figures, the replay engine adds state per
    # turn (never per byte) and the tokenizer a few copies of the largest line.
    s = generate_session(4, target_bytes=20_000_000, consistent=False)
    size = largest = 0
    tracemalloc.start()
    try:
        for line in s.lines():
            size += len(line)
            largest = max(largest, len(line))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size >= 20_000_000
    # Bounded by a few copies of the largest line (~1 MB), not by the session.
    assert peak < 8_000_000, (peak, largest)


def test_sizes_are_heavy_tailed() -> None:
    sizes = [sum(map(len, s.lines())) for s in generate_fleet(100, seed=2)]
    assert max(sizes) > 10 * statistics.median(sizes)
    scaled = [sum(map(len, s.lines())) for s in generate_fleet(20, seed=2, size_scale=3.0)]
    assert sum(scaled) > 1.5 * sum(sizes[:20])


def test_target_bytes_session() -> None:
    s = generate_session(8, target_bytes=1_000_000)
    assert s.faults == ()
    size = sum(map(len, s.lines()))
    assert size >= 1_000_000
    a = audit(s)
    assert a.row["status"] == "ok" and a.row["turns"] > 1


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        generate_session(1, target_bytes=10, fault="torn_tail")
    with pytest.raises(ValueError):
        generate_session(1, fault="no_such_fault")


def test_long_text_serialises_as_orjson_would() -> None:
    text = 'q"b\\s\n\t\x01\x1f\x7f é ½ → 😀 \u2028 \b\f\r' * 50
    plain = RawEntry("i", None, "t", "a", "message", {"x": [{"c": text}, text]})
    spliced = plain._replace(payload={"x": [{"c": LongText(text)}, LongText(text)]})
    assert serialize(spliced, "h") == serialize(plain, "h")
    work = RawEntry("i", "p", "t", None, "work", {"contract_id": "w", "revision": 0},
                    {"kind": "contract_status_changed"})
    line = serialize(work, None)
    assert line.endswith(b'"revision":0,"kind":{"kind":"contract_status_changed"}}\n')


# -- consistency with replay (projection rule set v1) ----------------------------------


@dataclass
class Replayed:
    """What a replay of a session's active chain finds against the recorded figures."""

    requests: list[RequestReplay] = field(default_factory=list)
    #: (entry id, recorded input of the receipt's winning attempt, replayed input)
    receipts: list[tuple[str, int, int]] = field(default_factory=list)
    #: (turn id, recorded tokens_full, replayed, recorded tokens_card, replayed)
    cards: list[tuple[str, int, int, int, int | None]] = field(default_factory=list)
    abandoned: int = 0


def replay(lines: Iterable[bytes]) -> Replayed:
    """Replay the active chain (as the audit finds it) with a fresh engine."""
    es = entries(lines)
    tree = TreeIndex()
    for e in es:
        tree.add(e)
    tree.finish()
    active = {n.line for n in tree.active_chain()}
    engine = ReplayEngine(get_rule_set("v1"), get_tokenizer())
    out = Replayed(abandoned=len(es) - len(active))
    assistants: dict[str, RequestReplay] = {}
    for e in es:
        if e.line not in active:
            continue
        out.requests += engine.feed(e)
        if engine.pending is not None:
            assistants[engine.pending.entry_id] = engine.pending
        if e.kind == "receipt":
            att = e.data["attempts"][e.data["winning_attempt"]]
            u = att["usage"]
            rec = (u["input_tokens"] + u.get("cache_read_input_tokens", 0)
                   + u.get("cache_creation_input_tokens", 0))
            assert e.parent_id is not None
            out.receipts.append((e.id, rec, assistants[e.parent_id].replayed_tokens))
        elif e.kind == "turn_card":
            turn = engine.index.current
            assert turn is not None and turn.id == e.data["turn_id"]
            costs, card = engine.costs[turn.number - 1], e.data["card"]
            out.cards.append((turn.id, card["tokens_full"], costs.full.tokens,
                              card["tokens_card"], costs.card_tokens))
    out.requests += engine.finish()
    return out


def assert_consistent(r: Replayed, where: str) -> None:
    assert r.requests and r.cards, where
    for q in r.requests:
        assert q.reported_input == q.replayed_tokens, (where, q)
        assert q.recorded_prefix_digest == q.prefix_digest, (where, q)
        assert q.recorded_prefix_tokens in (None, q.prefix_tokens), (where, q)
    for rid, recorded, replayed in r.receipts:
        assert recorded == replayed, (where, rid)
    for tid, full, want_full, card, want_card in r.cards:
        assert (full, card) == (want_full, want_card), (where, tid)


@pytest.fixture(scope="module")
def consistent_fleet() -> list[GeneratedSession]:
    return list(generate_fleet(20, seed=11))


def test_replay_reproduces_every_generated_figure(
    consistent_fleet: list[GeneratedSession],
) -> None:
    features: Counter[str] = Counter()
    for s in consistent_fleet:
        lines = list(s.lines())
        r = replay(lines)
        assert_consistent(r, s.path)
        # vak measures prefix_tokens once per prefix digest: the first request has it
        assert r.requests[0].recorded_prefix_tokens is not None
        features["abandoned"] += r.abandoned > 0
        features["selection"] += any(q.plan_source for q in r.requests)
        features["cards in a request"] += any(q.plan_card_turns for q in r.requests)
        features["t13"] += all(b'"at_turn"' not in line for line in lines)
        features["reset"] += any(b'"reset_all":true' in line for line in lines)
    # the fleet exercises branches, plans, card lines and resets
    assert all(features[f] > 0 for f in (
        "abandoned", "selection", "cards in a request", "t13", "reset")), features


def test_consistent_and_drawn_figures_share_the_content() -> None:
    exact = entries(generate_session(31, turns=12).lines())
    drawn = entries(generate_session(31, turns=12, consistent=False).lines())
    assert [(e.id, e.kind, e.content) for e in exact] == [(e.id, e.kind, e.content)
                                                          for e in drawn]
    assert [e.meta.get("usage") for e in exact] != [e.meta.get("usage") for e in drawn]
    # the drawn figures are only plausible: a replay does not reproduce them
    r = replay(generate_session(31, turns=12, consistent=False).lines())
    assert any(q.reported_input != q.replayed_tokens for q in r.requests)


def test_noise_perturbs_reported_usage_by_a_few_percent(
    consistent_fleet: list[GeneratedSession],
) -> None:
    noisy = list(generate_fleet(20, seed=11, noise=0.03))
    assert b"".join(noisy[0].lines()) == b"".join(  # deterministic from the seed
        generate_session(noisy[0]._plan.seed, noise=0.03).lines())
    off = total = 0
    for s, exact in zip(noisy, consistent_fleet, strict=True):
        r = replay(s.lines())
        assert [q.entry_id for q in r.requests] == [q.entry_id for q in replay(
            exact.lines()).requests]  # same sessions, only the reported figures moved
        for q in r.requests:
            assert q.reported_input is not None
            assert abs(q.reported_input - q.replayed_tokens) <= 0.03 * q.replayed_tokens + 1
            assert q.recorded_prefix_digest == q.prefix_digest  # vak's own measures stay
            off += q.reported_input != q.replayed_tokens
            total += 1
        for _, recorded, replayed in r.receipts:
            assert abs(recorded - replayed) <= 0.03 * replayed + 1
        for _, full, want_full, card, want_card in r.cards:
            assert (full, card) == (want_full, want_card)
    assert off > 0.9 * total


def test_faults_do_not_break_consistency_elsewhere() -> None:
    for s in generate_fleet(40, seed=5, faults=True, size_scale=0.3):
        if s.fault is None or s.fault in ("cwd_hash_mismatch", "session_id_mismatch"):
            assert_consistent(replay(s.lines()), s.path)


def test_a_forked_engine_is_independent() -> None:
    s = generate_session(3, turns=4, t13=False)
    es = entries(s.lines())
    cut = max(i for i, e in enumerate(es) if e.role == "user" and not e.meta.get("control")
              and e.content[0].get("type") == "text")  # the last directive
    rules, tok = get_rule_set("v1"), get_tokenizer()
    engine = ReplayEngine(rules, tok)
    for e in es[:cut]:
        list(engine.feed(e))

    def state(en: ReplayEngine) -> tuple[object, ...]:
        return (len(en.index.turns), [c.full.hexdigest() for c in en.costs],
                en.costs[-1].open.tokens, en.costs[-1].open.hexdigest(), dict(en.packets))

    before = state(engine)
    fork = engine.fork()
    forked = [r for e in es[cut:] for r in fork.feed(e)] + list(fork.finish())
    assert state(engine) == before and len(fork.index.turns) == len(engine.index.turns) + 1
    # Feeding the original afterwards gives what a replay that never forked gives, and so
    # does the fork: neither saw the other's entries.
    alone = ReplayEngine(rules, tok)
    whole = [r for e in es for r in alone.feed(e)] + list(alone.finish())
    rest = [r for e in es[cut:] for r in engine.feed(e)] + list(engine.finish())
    assert rest == forked and rest == whole[-len(rest):]


def test_a_fork_refuses_state_it_does_not_know() -> None:
    engine = ReplayEngine(get_rule_set("v1"), get_tokenizer())
    engine.extra = []  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="does not know its state"):
        engine.fork()
