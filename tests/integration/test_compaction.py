"""Compaction planning (``pipeline.compaction.engine``) and ``vakpipe compact``.

The engine tests replay generated sessions (recorded packets, resets, cards) with a
:class:`~pipeline.compaction.engine.CompactionEngine` fed the active chain one entry at a time.
The command tests run ``vakpipe compact`` in-process (``pipeline.cli.run``) on the
session's LocalCluster of worker processes: a local fleet, a round trip through the
compacted archive (audit it, re-send its last requests), the commit of ``OUT/archive``,
the http summariser against a test server, and one smoke test on moto's S3 server.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.cli import EXIT_OK, EXIT_UNUSABLE, run
from pipeline.compaction import cards as summarise
from pipeline.compaction.cards import CardsSummariser
from pipeline.compaction.engine import (
    CapacityProfile,
    CompactionOptions,
    compaction_rows,
    packet_lines,
    supersede,
)
from pipeline.io.commit import read_dataset, read_manifest
from pipeline.io.storage import Location, resolve
from pipeline.replay.catalog import Capacity, load_catalog
from pipeline.replay.scopes import supersede_summaries
from pipeline.replay.tokens import get_tokenizer
from pipeline.synth.local_s3 import LocalS3
from tests.helpers.compaction import (
    Chain,
    Planning,
    RecordingSummariser,
    budget,
    chain_of,
    generated,
    packet_entry,
    packet_found,
    plan,
    resend_last,
    tree_state,
    write_chains,
)
from tests.helpers.http import Reply, Server
from tests.helpers.storage import BUCKET, plain_rows

#: Sessions of the engine tests: (seed, turns). 0, 4 and 6 have resets; 2 and 10 have
#: stored (ledger) packets, 2's over the first turn a planned packet starts at.
SESSIONS = [(0, 24), (2, 24), (4, 24), (6, 24), (10, 24)]
#: Tight capacities: most of these sessions need packets under them.
TIGHT = [Capacity("m", 4000, 500), Capacity("m", 8000, 1000)]
RUN_NS = 1_800_000_000_123_456_789


def sessions() -> Iterator[Chain]:
    for seed, turns in SESSIONS:
        yield generated(seed, turns)


def _strings(value: Any) -> Iterator[str]:
    """Every string inside ``value``, but tool results' content."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not (k == "content" and value.get("type") == "tool_result"):
                yield from _strings(v)


def tool_output(*chains: Chain) -> set[str]:
    """Tool results of ``chains`` that appear nowhere else in them (the generator draws
    texts from a pool: a stored summary may quote another session's tool output)."""
    results = {str(b["content"]) for chain in chains for e in chain.entries
               for b in e.content if b.get("type") == "tool_result"
               and len(str(b.get("content", ""))) >= 24}
    elsewhere = "\x00".join(t for chain in chains for e in chain.entries
                            for t in _strings(e.data))
    return {t for t in results if t not in elsewhere}


@functools.cache
def tight_plans() -> list[tuple[Chain, Capacity, Planning]]:
    """Every session of ``SESSIONS`` planned under every ``TIGHT`` capacity (read only)."""
    return [(chain, cap, plan(chain, cap)) for chain in sessions() for cap in TIGHT]


# --- the engine -------------------------------------------------------------------------


def test_generous_capacity_plans_nothing() -> None:
    for chain in sessions():
        planning = plan(chain, Capacity("m", 10_000_000, 8192))
        assert planning.planned == []
        assert planning.requests
        assert all(not r.plan_packet_turns for r in planning.requests.values())


def test_tight_capacity_packets_cover_closed_turns_from_the_oldest_after_a_reset() -> None:
    firsts = set()
    for _chain, _cap, planning in tight_plans():
        turns = planning.engine.index.turns
        costs = planning.engine.costs
        for entry_id, (behind, closed, new) in planning.at_request.items():
            assert len(new) <= 1  # one packet per request at most
            for p in new:
                req = planning.requests[entry_id]
                assert (p.needed_by_entry, p.needed_by) == (entry_id, req.scope)
                # Whole closed turns, contiguous, from the oldest one after the reset.
                assert p.first_turn == behind + 1 == closed[0]
                assert set(p.turns) <= set(closed) and p.last_turn < req.turn
                assert (p.first_turn_id, p.last_turn_id) == (
                    turns[p.first_turn - 1].id, turns[p.last_turn - 1].id)
                assert p.tokens_before == sum(costs[n - 1].full.tokens for n in p.turns)
                assert p.model == "m" and p.label.startswith(f"t{p.first_turn}")
                firsts.add(p.first_turn)
    assert 1 in firsts and len(firsts) > 1  # sessions with and without a reset planned


def test_a_fitting_packet_makes_its_request_fit() -> None:
    fitting = unfit = 0
    for chain, cap, planning in tight_plans():
        for p in planning.planned:
            req = planning.requests[p.needed_by_entry]
            _, closed, _ = planning.at_request[p.needed_by_entry]
            # The request was counted with the packet in place.
            assert req.plan_packet_turns == tuple(p.turns)
            if p.fits:
                fitting += 1
                assert req.replayed_tokens <= budget(cap), (chain.path, cap, p.label)
            else:
                # Only when packing every closed turn cannot make room.
                unfit += 1
                assert p.last_turn == closed[-1]
    assert fitting > 20 and unfit > 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), turns=st.integers(6, 30),
       limit=st.sampled_from([3000, 5000, 8000, 12000]))
def test_supersession_never_loses_coverage(seed: int, turns: int, limit: int) -> None:
    planning = plan(generated(seed, turns), Capacity("m", limit, limit // 8))
    result = supersede(planning.planned)
    survivors = result.survivors
    covered = {n for p in planning.planned for n in p.turns}
    assert covered == {n for p in survivors for n in p.turns}
    # Nothing kept is covered by another survivor; everything dropped is covered.
    for a in survivors:
        assert not any(a is not b and set(a.turns) <= set(b.turns) for b in survivors)
    for i in result.superseded:
        assert any(set(planning.planned[i].turns) <= set(b.turns) for b in survivors)
    assert survivors == [p for i, p in enumerate(planning.planned) if i not in result.superseded]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 6)), max_size=25))
def test_supersession_is_seed_001s_supersede_summaries(ranges: list[tuple[int, int]]) -> None:
    # The sweep against the reference on arbitrary ranges, equal ones and nested ones.
    template = plan(generated(0, 16), TIGHT[1]).planned[0]
    packets = [dataclasses.replace(template, first_turn=a, last_turn=a + n)
               for a, n in ranges]
    live = supersede_summaries({"index": i, "turns": list(p.turns)}
                               for i, p in enumerate(packets))
    assert supersede(packets).superseded == frozenset(range(len(packets))) - {
        s["index"] for s in live}


def test_supersession_of_thousands_of_packets_is_quick() -> None:
    # A 256 MB session under an 8k window plans ~6,000 packets; the cubic reference took
    # hours on them. No clock here: a sweep this size only has to finish.
    template = plan(generated(0, 16), TIGHT[1]).planned[0]
    # 500 chains of 40 ever broader packets, each chain starting 10 turns after the last:
    # only each chain's broadest survives.
    packets = [dataclasses.replace(template, first_turn=1 + 10 * (i // 40),
                                   last_turn=1 + 10 * (i // 40) + i % 40)
               for i in range(20_000)]
    result = supersede(packets)
    assert [p.turns for p in result.survivors] == [range(1 + 10 * g, 41 + 10 * g)
                                                   for g in range(500)]


def test_rows_and_packet_lines_are_deterministic() -> None:
    chain = generated(0, 24)
    cap = TIGHT[0]
    profile = CapacityProfile("window=4000", cap)
    runs = []
    for _ in range(2):
        result = supersede(plan(chain, cap).planned)
        rows = compaction_rows(chain.key, chain.session_id, result, profile)
        lines = packet_lines(result.survivors, chain.session_id,
                             head_id=str(chain.audit.row["head_id"]),
                             head_hash=str(chain.audit.row["head_hash"]), now_ns=RUN_NS)
        runs.append((rows, lines))
    assert runs[0] == runs[1]
    rows, lines = runs[0]
    assert rows and len(lines) == sum(not r["superseded"] for r in rows)
    assert len({r["packet_id"] for r in rows}) == len(rows)
    assert all(r["archived"] is False and r["profile"] == "window=4000" for r in rows)


def test_summaries_are_built_from_the_cards_never_from_tool_output() -> None:
    seen_any = False
    for chain in sessions():
        cards = {e.data["turn_id"]: e.data["card"] for e in chain.entries
                 if e.kind == "turn_card"}
        raw = tool_output(chain)
        assert raw
        recorder = RecordingSummariser()
        planning = plan(chain, TIGHT[0], summariser=recorder)
        turns = planning.engine.index.turns
        for request in recorder.seen:
            ids = [turns[n - 1].id for n in range(request.first_turn, request.last_turn + 1)]
            assert list(request.cards) == [cards[i] for i in ids]
        for p in planning.planned:
            seen_any = True
            assert not [text for text in raw if text in p.summary.text], p.label
            assert p.summary.summariser == "cards"
    assert seen_any


def test_a_ledger_packet_over_the_same_first_turn_seeds_the_next_one() -> None:
    chain = generated(2, 24)
    stored = [e for e in chain.entries if e.kind == "compaction"
              and not e.data.get("reset_all")]
    planning = plan(chain, TIGHT[0])
    seeded = [p for p in planning.planned if p.seeded_from == "ledger"]
    assert seeded
    p = seeded[0]
    ledger = next(e for e in stored if e.data["first_turn_id"] == p.first_turn_id)
    assert p.summary.seeded
    assert "from an earlier summary" in p.summary.text.splitlines()[0]
    # The stored summary is kept verbatim (its own header line dropped).
    body = ledger.data["summary"].split("\n", 1)[-1].strip()
    assert body and body in p.summary.text


def test_a_stored_packet_over_the_range_means_no_new_packet() -> None:
    chain = generated(0, 16)
    cap = TIGHT[1]
    first = plan(chain, cap)
    # The first packet that fits with closed turns left after it (to store broader).
    p = next(p for p in first.planned
             if p.fits and first.at_request[p.needed_by_entry][1][-1] > p.last_turn)
    req = first.requests[p.needed_by_entry]
    _, closed, _ = first.at_request[p.needed_by_entry]
    turns = first.engine.index.turns
    # The same range, stored in the ledger just before the request: nothing to plan.
    exact = plan(chain, cap, inject={p.needed_by_entry: [
        packet_entry(p.first_turn_id, p.last_turn_id, p.summary.text)]})
    assert exact.at_request[p.needed_by_entry][2] == []
    again = exact.requests[p.needed_by_entry]
    assert (again.plan_packet_turns, again.replayed_tokens) == (
        req.plan_packet_turns, req.replayed_tokens)
    # A broader one over the same first turn covers it: its extra turns go in too.
    broader = plan(chain, cap, inject={p.needed_by_entry: [
        packet_entry(p.first_turn_id, turns[closed[-1] - 1].id, p.summary.text)]})
    assert broader.at_request[p.needed_by_entry][2] == []
    wider = broader.requests[p.needed_by_entry]
    assert wider.plan_packet_turns == tuple(range(p.first_turn, closed[-1] + 1))
    assert wider.replayed_tokens <= req.replayed_tokens <= budget(cap)


# --- capacity profiles ------------------------------------------------------------------


def test_profile_labels_and_capacities() -> None:
    catalog = load_catalog()
    cards = CardsSummariser()
    bound = CompactionOptions(cards).profile(catalog, "gemma4:e2b-mlx")
    assert bound == CapacityProfile("bound", Capacity("gemma4:e2b-mlx", 32768, 2048))
    window = CompactionOptions(cards, window=20_000).profile(catalog, "claude-sonnet-4-5")
    assert window is not None and window.label == "window=20000"
    assert (window.capacity.input_limit, window.capacity.output_reserve) == (20_000, 5_000)
    # A window what-if applies to models the catalog does not know too.
    unknown = CompactionOptions(cards, window=20_000).profile(catalog, "my-own-model")
    assert unknown is not None and unknown.capacity.input_limit == 20_000
    model = CompactionOptions(cards, model="gpt-4o").profile(catalog, "gemma4:e2b-mlx")
    assert model == CapacityProfile("model=gpt-4o", Capacity("gpt-4o", 128000, 4096))
    half = CompactionOptions(cards, scale=0.5).profile(catalog, "claude-opus-4-1")
    assert half == CapacityProfile("boundx0.5", Capacity("claude-opus-4-1", 100000, 4096))
    half_window = CompactionOptions(cards, window=8000, scale=0.5).profile(catalog, "gpt-5")
    assert half_window is not None and half_window.label == "window=8000x0.5"
    assert half_window.capacity.input_limit == 4000


def test_unknown_model_has_no_profile() -> None:
    catalog = load_catalog()
    cards = CardsSummariser()
    assert CompactionOptions(cards).profile(catalog, "my-own-model") is None
    assert CompactionOptions(cards).profile(catalog, None) is None
    assert CompactionOptions(cards, model="no-such-model").profile(catalog, "gpt-5") is None


# --- vakpipe compact --------------------------------------------------------------------

#: The what-if window of the command tests: most sessions of ``FLEET`` need packets.
WINDOW = 8000
#: (seed, turns, fault): long clean sessions, and sessions with a fault of each kind that
#: still leaves requests to plan (a torn tail among them).
FLEET = [(seed, 24, None) for seed in range(8)] + [
    (20, 24, "torn_tail"), (21, 24, "recovered_torn"), (22, 24, "torn_merge"),
    (27, 24, "missing_field"), (29, 24, "tamper_edit"), (31, 24, "swap_lines"),
    (32, 24, "orphan_parent"), (33, 24, "duplicate_id"), (34, 24, "second_header"),
    (36, 24, "cwd_hash_mismatch"), (37, 24, "session_id_mismatch"),
]
TORN = generated(20, 24, "torn_tail").path


def compact(root: Path | str, out: Path | str, scheduler: str, *extra: str) -> Any:
    """``vakpipe compact ROOT --out OUT`` on the session's cluster; the exit code."""
    return run(["compact", str(root), "--out", str(out), "--scheduler", scheduler,
                "--no-progress", *extra])


def rows(out: Path | Location, dataset: str) -> list[dict[str, Any]]:
    loc = out if isinstance(out, Location) else resolve(str(out))
    return plain_rows(read_dataset(loc, dataset))


def by_session(table: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in table:
        out[row["session_path"]].append(row)
    return out


def archive_files(out: Path) -> set[str]:
    return {p.relative_to(out / "archive").as_posix()
            for p in (out / "archive").rglob("*") if p.is_file()}


def one_error_line(capsys: pytest.CaptureFixture[str], *names: str) -> str:
    """The single ``vakpipe: error:`` line on stderr, naming ``names``."""
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vakpipe: error: "), err
    for name in names:
        assert name in lines[0], (name, err)
    return lines[0]


@dataclasses.dataclass(frozen=True)
class Compacted:
    """The fleet, and one ``vakpipe compact --write-archive`` run of it."""

    root: Path
    out: Path
    chains: dict[str, Chain]
    before: dict[str, tuple[int, int]]  # the source folder before the run
    after: dict[str, tuple[int, int]]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Chain]]:
    root = tmp_path_factory.mktemp("fleet")
    chains = {c.path: c for c in (generated(*spec) for spec in FLEET)}
    write_chains(resolve(str(root)), chains.values())
    return root, chains


@pytest.fixture(scope="module")
def compacted(fleet: tuple[Path, dict[str, Chain]], dask_scheduler: str,
              tmp_path_factory: pytest.TempPathFactory) -> Compacted:
    root, chains = fleet
    out = tmp_path_factory.mktemp("compacted")
    before = tree_state(root)
    assert compact(root, out, dask_scheduler, "--window", str(WINDOW),
                   "--write-archive") == EXIT_OK
    return Compacted(root, out, chains, before, tree_state(root))


def test_compact_writes_the_tables_and_the_archive(compacted: Compacted) -> None:
    out = compacted.out
    manifest = read_manifest(resolve(str(out)))
    assert manifest is not None
    table = rows(out, "compaction")
    per_session = by_session(table)
    assert len(per_session) >= 12  # most of the fleet needs packets at this window
    counts = manifest["compaction"]
    assert counts["sessions_needing_packets"] == len(per_session)
    assert counts["packets"] == len(table) == manifest["datasets"]["compaction"]["rows"]
    assert counts["packets_superseded"] == sum(r["superseded"] for r in table)
    # Every session with surviving packets is copied, but the one with a torn tail.
    copied = {p for p, rs in per_session.items() if any(not r["superseded"] for r in rs)}
    assert TORN in copied
    assert archive_files(out) == copied - {TORN}
    assert set(manifest["datasets"]["archive"]["files"]) == copied - {TORN}
    assert counts["archive_sessions"] == len(copied) - 1
    for row in table:
        assert row["profile"] == f"window={WINDOW}"
        assert row["model_input_limit"] == WINDOW
        assert row["summariser"] == "cards"
        assert row["archived"] == (not row["superseded"] and row["session_path"] != TORN)
    assert not (out / "_staging").exists()


def test_a_torn_tail_is_not_copied(compacted: Compacted) -> None:
    torn = by_session(rows(compacted.out, "compaction"))[TORN]
    assert torn and all(row["archived"] is False for row in torn)
    assert not (compacted.out / "archive" / TORN).exists()


def test_the_source_archive_is_never_written(compacted: Compacted) -> None:
    assert compacted.after == compacted.before
    assert TORN in compacted.before


def test_round_trip_audit_of_the_copies_finds_nothing_new(compacted: Compacted,
                                                          dask_scheduler: str,
                                                          tmp_path: Path) -> None:
    audited = tmp_path / "audit"
    assert run(["audit", str(compacted.out / "archive"), "--out", str(audited),
                "--scheduler", dask_scheduler, "--no-progress"]) == EXIT_OK
    copies = archive_files(compacted.out)
    sessions = {r["session_path"] for r in rows(audited, "integrity/sessions")}
    assert sessions == copies

    def findings(out: Path) -> dict[str, list[tuple[str, int | None]]]:
        return {path: sorted((r["code"], r["line"]) for r in rs)
                for path, rs in by_session(rows(out, "integrity/findings")).items()}

    source, copied = findings(compacted.out), findings(audited)
    assert any(source.get(p) for p in copies)  # faults are copied along
    for path in copies:
        assert copied.get(path, []) == source.get(path, []), path


def copies(compacted: Compacted) -> Iterator[tuple[Chain, int, Capacity]]:
    """Each compacted copy as a chain, how many packets were appended, its capacity."""
    table = by_session(rows(compacted.out, "compaction"))
    catalog = load_catalog().with_window(WINDOW)
    for path in sorted(archive_files(compacted.out)):
        chain = chain_of(path, (compacted.out / "archive" / path).read_bytes())
        appended = sum(r["archived"] for r in table[path])
        cap = catalog.lookup(chain.audit.row["model"])
        assert cap is not None
        # The packets are the chain's last entries, the head's descendants.
        assert [e.kind for e in chain.entries[-appended:]] == ["compaction"] * appended
        yield chain, appended, cap


def test_round_trip_the_last_request_of_each_copy_fits(compacted: Compacted) -> None:
    table = by_session(rows(compacted.out, "compaction"))
    requests = by_session(rows(compacted.out, "requests"))
    checked = with_packet = 0
    for chain, appended, cap in copies(compacted):
        engine, req = resend_last(chain, appended, cap)
        # The same request as the run's last one for that session.
        run_last = max(requests[chain.path], key=lambda r: (r["turn"], r["iteration"]))
        assert req.scope == run_last["scope"]
        if packet_found(engine, req):  # the plan's range is one of the copy's packets
            with_packet += 1
            assert (req.replayed_tokens, req.request_digest) == (
                run_last["replayed_tokens"], run_last["request_digest"])
        if all(r["fits"] for r in table[chain.path]):
            checked += 1
            assert req.replayed_tokens <= budget(cap), chain.path
    assert checked >= 3 and with_packet >= 1


@pytest.mark.xfail(strict=True, reason=(
    "rule set v1 matches a packet by its exact range (docs/projection-rules.md, item 3) "
    "while compaction lets a broader stored packet over the same first turn cover a "
    "plan's range (docs/compaction.md, 'Covered already?') and supersession keeps only "
    "the broadest: re-sent from a copy, a request whose plan names a narrower range "
    "finds no packet and omits those turns"))
def test_round_trip_every_last_request_is_what_the_run_counted(compacted: Compacted) -> None:
    requests = by_session(rows(compacted.out, "requests"))
    for chain, appended, cap in copies(compacted):
        _, req = resend_last(chain, appended, cap)
        run_last = max(requests[chain.path], key=lambda r: (r["turn"], r["iteration"]))
        assert (req.replayed_tokens, req.request_digest) == (
            run_last["replayed_tokens"], run_last["request_digest"]), chain.path


def test_a_new_run_replaces_the_copies_and_a_failed_one_changes_nothing(
        compacted: Compacted, dask_scheduler: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, chains = compacted.root, compacted.chains
    out = tmp_path / "out"
    shutil.copytree(compacted.out, out)  # the first run's output, at WINDOW
    first = archive_files(out)
    # A wider window: fewer sessions need packets, and those that do need other ones.
    assert compact(root, out, dask_scheduler, "--window", str(2 * WINDOW),
                   "--write-archive") == EXIT_OK
    second = archive_files(out)
    assert second and second < first  # the copies this run did not write are gone
    manifest = read_manifest(resolve(str(out)))
    assert manifest is not None
    assert set(manifest["datasets"]["archive"]["files"]) == second
    assert manifest["compaction"]["archive_sessions"] == len(second)
    table = rows(out, "compaction")
    assert {r["profile"] for r in table} == {f"window={2 * WINDOW}"}
    for path in second:
        data = (out / "archive" / path).read_bytes()
        source = chains[path].data
        assert data.startswith(source)
        appended = [json.loads(line) for line in data[len(source):].splitlines()]
        assert [p["first_turn_id"] for p in appended] == [
            r["first_turn_id"] for r in table if r["session_path"] == path and r["archived"]]
    # A summariser that fails (an endpoint refusing the key): exit 2, one line, and the
    # previous output (tables, copies, manifest) untouched.
    before = tree_state(out)
    capsys.readouterr()
    server = Server()
    server.replies = [Reply(401, b'{"error": {"message": "invalid api key"}}')]
    try:
        code = compact(root, out, dask_scheduler, "--window", str(WINDOW), "--write-archive",
                       "--summariser", "http", "--summariser-url", server.base,
                       "--summariser-model", "m")
    finally:
        server.close()
    assert code == EXIT_UNUSABLE
    one_error_line(capsys, f"summariser endpoint {server.base}/chat/completions",
                   "HTTP 401 (not retried)", "invalid api key")
    assert tree_state(out) == before
    assert not (out / "_staging").exists()


def test_the_http_summariser_writes_the_summaries(fleet: tuple[Path, dict[str, Chain]],
                                                  dask_scheduler: str,
                                                  tmp_path: Path) -> None:
    root, chains = fleet
    server = Server()
    try:
        assert compact(root, tmp_path / "out", dask_scheduler, "--window", str(WINDOW),
                       "--summariser", "http", "--summariser-url", server.base,
                       "--summariser-model", "m") == EXIT_OK
    finally:
        server.close()
    table = rows(tmp_path / "out", "compaction")
    assert table
    assert {(r["summariser"], r["summariser_version"]) for r in table} == {("http", "1:m")}
    assert {r["summary"] for r in table} == {Reply().text}
    assert {r["summary_detail"] for r in table} == {"model"}
    assert len(server.seen) >= len(table)
    assert {s.path for s in server.seen} == {"/v1/chat/completions"}
    assert {s.body["model"] for s in server.seen} == {"m"}
    # What the model is given: the turn cards, never the tool output.
    raw = tool_output(*chains.values())
    assert raw
    for seen in server.seen:
        content = seen.body["messages"][1]["content"]
        assert "Turn cards, oldest first, as JSON:" in content
        assert not [text for text in raw if text in content]


def test_compact_on_s3_with_a_distributed_cluster(s3: LocalS3, scheduler: str,
                                                  fleet: tuple[Path, dict[str, Chain]]
                                                  ) -> None:
    _, chains = fleet
    archive = resolve(f"s3://{BUCKET}/archive")
    chosen = [chains[generated(seed, 24).path] for seed in (0, 2, 5)]
    write_chains(archive, chosen)
    out = f"s3://{BUCKET}/compacted"
    assert compact(archive.url, out, scheduler, "--window", str(WINDOW),
                   "--write-archive") == EXIT_OK
    loc = resolve(out)
    table = rows(loc, "compaction")
    archived = {r["session_path"] for r in table if r["archived"]}
    assert archived == {c.path for c in chosen}
    fs = loc.filesystem()
    keys = {k.split("/compacted/archive/", 1)[1] for k in fs.find(loc.join("archive"))}
    assert keys == archived
    manifest = read_manifest(loc)
    assert manifest is not None and set(manifest["datasets"]["archive"]["files"]) == archived
    for chain in chosen:
        assert fs.cat_file(loc.join("archive", chain.path)).startswith(chain.data)
        assert fs.cat_file(archive.join(chain.path)) == chain.data
    assert not fs.exists(loc.join("_staging"))


# --- the cards summariser's memos (pipeline/compaction/cards.py) -------------------------------
# A compaction engine summarises ever broader ranges of the same turns; the summariser
# memoises normalised cards and the token counts of lines. Neither may change a byte.

PIECES = ["a", "Zq", "é", "e\u0301", "7", "2026", " ", "  ", "\t", "\n", "\n\n", "\r",
          "\r\n", ".", "'s", "'ll", "!", '"', "…", "→", "×", "²", "\u00a0", "\u2028",
          "\x1c", "日本", "🙂", "[ev:call_1]", "  did: ", "#1 asked: ", "{", "}"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=40))
def test_line_memoised_counts_are_exact(pieces: list[str]) -> None:
    tok = get_tokenizer()
    text = "".join(pieces)
    assert summarise._counter(tok)(text) == tok.count(text)


def test_memos_change_no_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    def summaries() -> list[tuple[str, str, int]]:
        return [(p.label, p.summary.text, p.summary.tokens)
                for chain in sessions() for p in plan(chain, TIGHT[0]).planned]

    fast = summaries()
    monkeypatch.setattr(summarise, "_counter", lambda tok: tok.count)
    monkeypatch.setattr(summarise, "_normalised", summarise._card)
    assert summaries() == fast
