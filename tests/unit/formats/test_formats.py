"""Claude Code and Codex transcripts (docs/formats.md): detection by content, the tree,
streamed requests, subagents, compaction, usage, and the cost rules of
docs/cost-rules.md ("Other agents' transcripts") on the real transcripts in
``tests/data/real`` and on hand-made lines.

Every usage figure is checked against an independent recount of the JSON (written here
the plain way: final streamed line per ``message.id``+``requestId``; Codex: totals that
moved), never against what the adapter produced before.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.nightly_audit import partition, run_nightly
from pipeline.audit.session import USAGE_FIELDS, SessionAudit, audit_session
from pipeline.cli import EXIT_OK, run
from pipeline.costs.pricing import TokenUsage, load_prices, price
from pipeline.costs.report import drop_copies, price_usage
from pipeline.formats import base, detect
from pipeline.io.commit import read_dataset
from pipeline.io.storage import resolve
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import Entry
from pipeline.replay.catalog import load_catalog
from pipeline.replay.reported import reported_requests
from pipeline.run.replay_batches import ReplayOptions
from pipeline.tables.schemas import usage_table
from tests.helpers.data_paths import REAL
from tests.helpers.ledgers import sample_session, session_key
from tests.helpers.storage import committed_rows

CLAUDE = REAL / "claude-code" / "projects" / "-home-marco-projects-spotter"
CODEX = REAL / "codex" / "sessions" / "2026" / "02" / "23"


def audit_file(path: Path, relative: str | None = None) -> SessionAudit:
    rel = relative or path.relative_to(REAL).as_posix()
    key = parse_session_path(rel)
    assert key is not None, rel
    with path.open("rb") as f:
        return audit_session(key, f, size=path.stat().st_size)


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def streamed_usage(path: Path) -> Iterator[tuple[tuple[str, str], dict[str, Any]]]:
    """``(message.id, requestId)`` and ``usage`` of every assistant line, in file order
    (Claude Code streams one request over several lines)."""
    for obj in lines_of(path):
        if obj.get("type") == "assistant":
            yield (obj["message"]["id"], obj["requestId"]), obj["message"]["usage"]


def claude_recount(path: Path) -> tuple[int, tuple[int, int, int, int]]:
    """Requests and (input, output, cache read, cache write) the plain way."""
    final: dict[tuple[str, str], dict[str, int]] = {}
    for obj in lines_of(path):
        msg = obj.get("message")
        if obj.get("type") == "assistant" and msg.get("model") != "<synthetic>":
            final[(msg["id"], obj["requestId"])] = msg["usage"]
    sums = [sum(u.get(k, 0) or 0 for u in final.values()) for k in (
        "input_tokens", "output_tokens", "cache_read_input_tokens",
        "cache_creation_input_tokens")]
    return len(final), (sums[0], sums[1], sums[2], sums[3])


def usage_sums(audit: SessionAudit) -> tuple[int, int, int, int]:
    row = audit.row
    return tuple(row[f"{k}_tokens"] + row[f"{k}_tokens_abandoned"]  # type: ignore[return-value]
                 for k in ("input", "output", "cache_read", "cache_write"))


CLAUDE_FILES = sorted(CLAUDE.glob("*.jsonl")) + sorted(CLAUDE.glob("*/subagents/*.jsonl")) \
    if CLAUDE.is_dir() else []


@pytest.mark.parametrize("path", CLAUDE_FILES, ids=lambda p: p.name)
def test_claude_code_streamed_lines_are_one_request_with_the_final_usage(path: Path) -> None:
    audit = audit_file(path)
    requests, sums = claude_recount(path)
    assert audit.row["source"] == "claude-code"
    assert audit.row["requests"] + audit.row["requests_abandoned"] == requests
    assert usage_sums(audit) == sums
    assert sum(r[2] == "message" for r in audit.usage) == requests
    assert audit.row["errors"] == 0, audit.findings


def test_claude_code_final_streamed_line_is_not_the_first() -> None:
    """What de-duplicating on the first line (as ccusage does) would miss here."""
    path = CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d.jsonl"
    first: dict[tuple[str, str], int] = {}
    for request, usage in streamed_usage(path):
        first.setdefault(request, usage["output_tokens"])
    audit = audit_file(path)
    assert audit.row["output_tokens"] > sum(first.values())


def test_compaction_boundaries_keep_the_history_on_the_active_chain() -> None:
    for path in sorted(CLAUDE.glob("*-*-*.jsonl")):
        audit = audit_file(path)
        # Parallel tool calls branch the uuid tree; the request stays on the chain.
        assert audit.row["output_tokens_abandoned"] == 0
        assert audit.row["requests"] > 50
    broken = audit_file(CLAUDE / "4d5611e5-241a-462a-8d15-5122611a9569.jsonl")
    assert [f.code.text for f in broken.findings] == ["logical_parent_missing"]


def test_subagents_link_to_the_tool_call_and_to_their_parent_session() -> None:
    parent = audit_file(CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d.jsonl")
    (link,) = parent.links
    assert link[1:3] == ("a881341", "toolu_01VmaERAwhb19LGUwu9GenaK")
    child = audit_file(CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d" / "subagents"
                       / "agent-a881341.jsonl")
    assert child.row["parent_session_path"] == parent.row["session_path"]
    assert child.row["subagent"] == "a881341"
    assert child.row["session_id"] == parent.row["session_id"]
    assert child.findings == []  # its first parent lives in the parent session


#: Where a usage row (``SessionAudit.usage``) holds its subagent.
SUBAGENT = USAGE_FIELDS.index("subagent")


def test_subagent_requests_copied_into_the_parent_are_its_records_priced_once() -> None:
    parent = audit_file(CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d.jsonl")
    child = audit_file(CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d" / "subagents"
                       / "agent-a881341.jsonl")
    mirrors = {r[1] for r in parent.usage if r[2] == "mirror"}
    own = {r[1] for r in child.usage}
    assert mirrors and mirrors <= own and len(own) == 3  # the last one is not copied
    assert {r[SUBAGENT] for r in parent.usage if r[2] == "mirror"} == {"a881341"}
    usage = usage_table([parent, child])
    once, copies = drop_copies(usage)
    assert copies == len(mirrors)
    by = price_usage(once, load_prices(), ("subagent",)).table.to_pylist()
    assert {r["subagent"]: r["records"] for r in by}["a881341"] == 3
    # A subagent whose own file is missing: the copies are its only record.
    lone = audit_file(CLAUDE / "subagent.jsonl")
    orphans = [r for r in lone.usage if r[2] == "mirror"]
    assert {r[SUBAGENT] for r in orphans} == {"afb92ff"} and len({r[1] for r in orphans}) == 5
    assert lone.row["requests"] == sum(r[2] == "message" for r in lone.usage)


CODEX_FILES = sorted(CODEX.glob("*.jsonl")) if CODEX.is_dir() else []


@pytest.mark.parametrize("path", CODEX_FILES, ids=lambda p: p.name[:32])
def test_codex_requests_are_token_counts_that_moved(path: Path) -> None:
    totals = None
    moved = 0
    for obj in lines_of(path):
        info = obj["payload"].get("info") if obj["type"] == "event_msg" else None
        if (obj["payload"].get("type") == "token_count" and info
                and info["total_token_usage"] != totals):
            moved += 1
            totals = info["total_token_usage"]
    audit = audit_file(path)
    assert audit.row["source"] == "codex" and audit.row["errors"] == 0
    assert audit.row["requests"] == moved
    assert totals is not None
    assert usage_sums(audit) == (totals["input_tokens"] - totals["cached_input_tokens"],
                                 totals["output_tokens"], totals["cached_input_tokens"], 0)
    assert audit.row["model"] == "gpt-5.3-codex" and audit.row["provider"] == "openai"


def codex_line(kind: str, payload: dict[str, Any], ts: str = "2026-02-23T11:54:52.352Z") -> bytes:
    return json.dumps({"timestamp": ts, "type": kind, "payload": payload}).encode() + b"\n"


def token_count(total: tuple[int, int, int], last: tuple[int, int, int] | None) -> bytes:
    def usage(t: tuple[int, int, int]) -> dict[str, int]:
        return {"input_tokens": t[0], "cached_input_tokens": t[1], "output_tokens": t[2]}
    info: dict[str, Any] = {"total_token_usage": usage(total)}
    if last is not None:
        info["last_token_usage"] = usage(last)
    return codex_line("event_msg", {"type": "token_count", "info": info})


SID = "019c8a70-dda7-7f33-98ea-f30553347322"
CODEX_REL = f"codex/sessions/2026/02/23/rollout-2026-02-23T13-19-38-{SID}.jsonl"


def test_codex_without_last_usage_falls_back_to_differences_of_totals() -> None:
    lines = [codex_line("session_meta", {"id": SID, "model_provider": "openai"}),
             codex_line("turn_context", {"model": "gpt-5.1-codex"}),
             token_count((100, 40, 10), None), token_count((100, 40, 10), None),
             token_count((250, 140, 30), None)]
    key = parse_session_path(CODEX_REL)
    assert key is not None
    audit = audit_session(key, lines)
    assert audit.row["requests"] == 2 and audit.findings == []
    assert usage_sums(audit) == (110, 30, 140, 0)


@pytest.mark.parametrize("where", ["last_token_usage", "total_token_usage"])
def test_a_codex_count_of_another_kind_is_a_finding_and_its_request_unpriced(
    where: str
) -> None:
    bad = orjson.loads(token_count((100, 40, 10), (100, 40, 10)))
    bad["payload"]["info"][where]["cached_input_tokens"] = "40"
    lines = [codex_line("session_meta", {"id": SID, "model_provider": "openai"}),
             codex_line("turn_context", {"model": "gpt-5.1-codex"}),
             orjson.dumps(bad) + b"\n", token_count((250, 140, 30), (150, 100, 20))]
    key = parse_session_path(CODEX_REL)
    assert key is not None
    audit = audit_session(key, lines)
    (finding,) = audit.findings
    assert (finding.code.text, finding.line) == ("bad_field", 3)
    assert finding.detail == (f"payload.info.{where}.cached_input_tokens is a string, not "
                              "a token count (an integer from 0 to 2^63 - 1): read as absent")
    # Two requests; the one with the bad count is not priced.
    assert audit.row["requests"] == 2 and usage_sums(audit) == (50, 20, 100, 0)


def test_a_torn_tail_and_a_damaged_line_are_reported_on_their_lines() -> None:
    lines = [codex_line("session_meta", {"id": SID}), b'{"timestamp": "x", "ty\n',
             codex_line("turn_context", {"model": "gpt-5.1-codex"}), b'{"timestamp": "2026-']
    key = parse_session_path(CODEX_REL)
    assert key is not None
    audit = audit_session(key, lines)
    assert [(f.code.text, f.line) for f in audit.findings] == [
        ("damaged_entry", 2), ("torn_tail", 4)]
    assert audit.row["lines"] == 4 and audit.row["entries"] == 2


def claude_line(uuid: str, parent: str | None, **fields: Any) -> bytes:
    obj = {"uuid": uuid, "parentUuid": parent, "sessionId": "s1", "cwd": "/w",
           "timestamp": "2026-02-11T20:31:53.375Z", "type": "user",
           "message": {"role": "user", "content": "hello"}, **fields}
    return json.dumps(obj).encode() + b"\n"


def test_claude_code_duplicate_uuids_and_orphans_are_tree_findings() -> None:
    lines = [claude_line("u1", None), claude_line("u2", "u1"), claude_line("u2", "u1"),
             claude_line("u3", "nowhere")]
    key = parse_session_path("projects/-w/s1.jsonl")
    assert key is not None
    audit = audit_session(key, lines)
    assert sorted(f.code.text for f in audit.findings) == ["duplicate_id", "orphan_parent"]
    assert audit.row["turns"] >= 1 and audit.row["source"] == "claude-code"


def test_the_content_decides_the_format_not_the_path() -> None:
    ledger = sample_session().to_bytes().splitlines(keepends=True)
    fmt, _ = detect(ledger)
    assert fmt is None  # a vak ledger, wherever it lies
    key = parse_session_path("projects/-w/s1.jsonl")
    assert key is not None
    assert audit_session(key, ledger).row["source"] == "vak"
    claude = [claude_line("u1", None)]
    vak_key = session_key("s1")
    assert audit_session(vak_key, claude).row["source"] == "claude-code"


@pytest.mark.skipif(base.valid_c is None, reason="the C kernel did not build here")
def test_a_vak_header_is_told_without_parsing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader parses it once; detection only looks at its first keys and its grammar.
    ledger = sample_session().to_bytes().splitlines(keepends=True)

    def no_parse(raw: bytes) -> Any:
        raise AssertionError("parsed")

    monkeypatch.setattr(base.orjson, "loads", no_parse)
    assert detect(ledger)[0] is None


VAK_LINE_EDITS = st.sampled_from([b"", b"\r", b" ", b"x", b"}", b'"', b"1e400",
                                  b"\xff", b"\\ud800", b"[" * 600])


@given(cut=st.floats(0, 1), edit=VAK_LINE_EDITS, where=st.floats(0, 1),
       newline=st.booleans())
@settings(max_examples=300)
def test_a_line_told_vak_without_parsing_is_one_the_parse_calls_vak(
        cut: float, edit: bytes, where: float, newline: bool) -> None:
    # Only ever the parsed line's answer: a line it is unsure of is parsed.
    header = sample_session().to_bytes().splitlines()[0]
    line = header[: max(40, int(cut * len(header)))]
    at = int(where * len(line))
    line = line[:at] + edit + line[at:] + (b"\n" if newline else b"")
    if base._vak_line(line):
        obj = orjson.loads(line)
        assert type(obj) is dict and base.is_vak_entry(obj)


def test_reported_requests_measure_utilization_against_the_transcripts_window() -> None:
    path = CODEX_FILES[2]
    key = parse_session_path(path.relative_to(REAL).as_posix())
    assert key is not None
    kept: list[Entry] = []
    with path.open("rb") as f:
        audit = audit_session(key, f, keep=kept)
    rows = reported_requests(audit, load_catalog(),
                             [e for e in kept if (e.line, e.id) in audit.active])
    assert len(rows) == audit.row["requests"]
    assert {r["rules"] for r in rows} == {"reported"}
    # Codex's own model_context_window wins over the catalog's 272,000.
    assert load_catalog().lookup("gpt-5.3-codex") is not None
    assert all(r["model_input_limit"] == 258400 for r in rows)
    assert max(r["saturation"] for r in rows) > 70
    assert "mandatory" in {r["hint_level"] for r in rows}


def test_a_resumed_copy_of_a_request_is_priced_once_and_subagents_under_the_parent(
        tmp_path: Path) -> None:
    src = CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d.jsonl"
    audits = [audit_file(src),
              audit_file(src, "projects/-home-marco-projects-spotter/resumed-copy.jsonl"),
              audit_file(CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d" / "subagents"
                         / "agent-a881341.jsonl")]
    usage = usage_table(audits)
    once, copies = drop_copies(usage)
    distinct = set(usage["request_id"].to_pylist())
    assert copies >= audits[0].row["requests"] and once.num_rows == len(distinct)
    assert sorted(once["request_id"].to_pylist()) == sorted(distinct)
    by_session = price_usage(once, load_prices(), ("session", "subagent")).table.to_pylist()
    parents = {r["session_path"] for r in by_session}
    assert parents == {audits[0].row["session_path"]}
    assert {r["subagent"] for r in by_session} == {None, "a881341"}


def test_mixed_archive_audit_replay_and_cost_through_the_cli(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "archive"
    shutil.copytree(REAL, root)
    vak = root / session_key().path
    vak.parent.mkdir(parents=True)
    vak.write_bytes(sample_session().to_bytes())
    out = tmp_path / "out"
    assert run(["audit", str(root), "--out", str(out), "--replay", "--workers", "1",
                "--no-progress"]) == EXIT_OK
    sessions = read_dataset(resolve(str(out)), "integrity/sessions")
    assert sorted(set(sessions["source"].to_pylist())) == ["claude-code", "codex", "vak"]
    assert read_dataset(resolve(str(out)), "subagents").num_rows == 4
    requests = read_dataset(resolve(str(out)), "requests")
    assert {"reported", "v1"} <= set(requests["rules"].to_pylist())
    capsys.readouterr()
    assert run(["cost", str(out), "--by", "source,model"]) == EXIT_OK
    captured = capsys.readouterr()
    # Every model of the real transcripts is priced (gpt-5.3-codex by genai-prices); an
    # unknown one is named (tests/integration/test_price_sources.py), never priced at zero silently.
    assert "unknown model" not in captured.err
    costs = pa.Table.from_pylist(
        [r for r in read_costs(out) if r["source"] == "claude-code"])
    assert costs.num_rows >= 3 and all(v > 0 for v in costs["billed_usd"].to_pylist())


def read_costs(out: Path) -> list[dict[str, Any]]:
    return pq.read_table(out / "cost" / "costs.parquet").to_pylist()


def test_nightly_checks_transcript_history_like_a_ledger(tmp_path: Path, scheduler: str) -> None:
    root = tmp_path / "archive"
    shutil.copytree(REAL / "codex", root / "codex")
    shutil.copytree(REAL / "claude-code", root / "claude-code")
    rollouts = sorted((root / "codex").rglob("rollout-*.jsonl"))
    grown, truncated, rewritten = rollouts[0], rollouts[1], rollouts[2]
    out = resolve(str(tmp_path / "out"))

    def night(day: int) -> dict[str, str]:
        run_nightly(resolve(str(root)), out, ReplayOptions(), day=date(2026, 12, day),
                    scheduler=scheduler, progress=False)
        return {r["session_path"].rsplit("/", 1)[1]: r["code"]
                for r in committed_rows(partition(out, date(2026, 12, day)),
                                        "integrity/findings")
                if r["code"].startswith(("history", "session_missing"))}

    assert night(1) == {}
    with grown.open("ab") as f:  # a valid append: read again, no finding
        f.write(codex_line("event_msg", {"type": "user_message", "message": "more"}))
    data = truncated.read_bytes()
    truncated.write_bytes(data[:data.rindex(b"\n", 0, len(data) - 1) + 1])
    data = rewritten.read_bytes()
    at = data.index(b'"cwd"') + 10
    rewritten.write_bytes(data[:at] + b"X" + data[at + 1:] + codex_line("compacted", {}))
    assert night(2) == {truncated.name: "history_truncated",
                        rewritten.name: "history_rewritten"}


SHORT = CLAUDE / "short.jsonl"


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_damaged_line_of_a_transcript_is_reported_on_its_line(data: st.DataObject) -> None:
    lines = SHORT.read_bytes().splitlines(keepends=True)
    at = data.draw(st.integers(0, len(lines) - 1))
    cut = data.draw(st.integers(1, len(lines[at]) - 2))
    lines[at] = lines[at][:cut] + b"\n"  # a line cut short: never valid JSON
    key = parse_session_path("projects/-w/55604662-cf2a-4331-851a-ec234028f8ca.jsonl")
    assert key is not None
    audit = audit_session(key, lines)
    code = "torn_tail" if at == len(lines) - 1 else "damaged_entry"  # nothing follows it
    assert (code, at + 1) in {(f.code.text, f.line) for f in audit.findings}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=60), max_size=8), st.sampled_from(
    [b'{"type":"user","uuid":"u","parentUuid":null}\n',
     b'{"timestamp":"t","type":"session_meta","payload":{}}\n']))
def test_any_bytes_after_a_transcript_line_never_crash_the_audit(
        tail: list[bytes], first: bytes) -> None:
    key = parse_session_path("projects/-w/s.jsonl")
    assert key is not None
    audit = audit_session(key, [first, *tail])
    assert audit.row["source"] in ("claude-code", "codex")
    assert audit.row["lines"] == 1 + len(tail)


def test_one_hour_cache_writes_are_priced_at_their_own_rate() -> None:
    rule = load_prices().lookup("anthropic", "claude-opus-4-6")
    assert rule is not None and rule.base.cache_write_1h == 2 * rule.base.input
    five = price(TokenUsage(cache_write=1_000_000), rule).total
    hour = price(TokenUsage(cache_write=1_000_000, cache_write_1h=400_000), rule).total
    assert hour - five == 400_000 * (rule.base.cache_write_1h - rule.base.cache_write) / 10**6


def test_claude_code_one_hour_writes_come_from_the_final_streamed_line() -> None:
    path = CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d.jsonl"
    final = {request: (usage.get("cache_creation") or {}).get("ephemeral_1h_input_tokens", 0)
             for request, usage in streamed_usage(path)}  # the last line of each wins
    audit = audit_file(path)
    usage = usage_table([audit])
    hour = [h for h, k in zip(usage["cache_write_1h_tokens"].to_pylist(),
                              usage["kind"].to_pylist(), strict=True) if k == "message"]
    assert sum(hour) == sum(final.values()) > 0


# --- issue 17: detection, unknown formats, abandoned branches (hand-made lines) ---------

NEW_CLAUDE_TYPES = ("custom-title", "ai-title", "agent-name", "mode", "permission-mode",
                    "last-prompt")


@pytest.mark.parametrize("kind", NEW_CLAUDE_TYPES)
def test_a_claude_code_file_opening_with_a_metadata_line_is_claude_code(kind: str) -> None:
    meta = json.dumps({"type": kind, "sessionId": "s1", "value": "x"}).encode() + b"\n"
    lines = [meta, claude_line("u1", None),
             claude_line("a1", "u1", type="assistant", message={
                 "id": "m1", "role": "assistant", "model": "claude-opus-4-6",
                 "content": [{"type": "text", "text": "hi"}],
                 "usage": {"input_tokens": 5, "output_tokens": 2}}, requestId="r1")]
    key = parse_session_path("projects/-w/s1.jsonl")
    assert key is not None
    audit = audit_session(key, lines)
    assert audit.row["source"] == "claude-code" and audit.row["status"] == "ok"
    assert audit.findings == [] and audit.row["requests"] == 1


@pytest.mark.parametrize("bad", ["100", 1.5, True, -1, 2**63, [5]])
def test_a_claude_code_count_of_another_kind_is_a_finding_and_its_request_unpriced(
    bad: Any
) -> None:
    # As a vak usage is read (docs/audit.md, bad_field); it was read as 0, silently.
    def assistant(uuid: str, parent: str, n: int, usage: dict[str, Any]) -> bytes:
        return claude_line(uuid, parent, type="assistant", requestId=f"r{n}", message={
            "id": f"m{n}", "role": "assistant", "model": "claude-opus-4-6",
            "content": [{"type": "text", "text": "hi"}], "usage": usage})

    lines = [claude_line("u1", None),
             assistant("a1", "u1", 1, {"input_tokens": bad, "output_tokens": 2}),
             assistant("a2", "a1", 2, {"input_tokens": 7, "output_tokens": None})]
    key = parse_session_path("projects/-w/s1.jsonl")
    assert key is not None
    audit = audit_session(key, lines)
    (finding,) = audit.findings
    assert (finding.code.text, finding.line) == ("bad_field", 2)
    assert finding.detail.startswith("meta.usage.input_tokens is ")
    assert audit.row["status"] == "warning" and audit.row["requests"] == 2
    # The other request is priced (a null count reads as 0); the bad one is not.
    rows = usage_table([audit]).to_pylist()
    assert [(r["input_tokens"], r["output_tokens"]) for r in rows] == [(7, 0)]


def test_an_unknown_line_type_with_a_uuid_is_activity_never_damaged() -> None:
    lines = [claude_line("u1", None),
             claude_line("x1", "u1", type="some-future-type", message=None)]
    audit = audit_session(session_key("s1"), lines)
    assert audit.row["source"] == "claude-code" and audit.findings == []
    assert audit.row["entries"] == 2


def test_a_file_nobody_claims_is_one_unknown_format_finding() -> None:
    lines = [json.dumps({"event": "tick", "n": i}).encode() + b"\n" for i in range(2000)]
    audit = audit_session(session_key("s1"), lines)
    assert audit.row["source"] == "unknown" and audit.row["status"] == "error"
    assert [f.code.text for f in audit.findings] == ["unknown_format"]
    assert audit.row["lines"] == 2000 and audit.row["entries"] == 0 and audit.usage == []


def test_a_vak_ledger_with_a_broken_header_is_still_vak() -> None:
    ledger = sample_session().to_bytes().splitlines(keepends=True)
    broken = [b'{"id": "h", "kind": "header", "ts": \n', *ledger[1:]]
    fmt, _ = detect(broken)
    assert fmt is None
    assert audit_session(session_key("s1"), broken).row["source"] == "vak"


def assistant(uuid: str, parent: str, mid: str, blocks: list[dict[str, Any]]) -> bytes:
    return claude_line(uuid, parent, type="assistant", requestId=f"r-{mid}", message={
        "id": mid, "role": "assistant", "model": "claude-opus-4-6", "content": blocks,
        "usage": {"input_tokens": 5, "output_tokens": 2}})


def test_abandoned_entries_are_prompts_and_requests_off_the_chain_not_side_lines() -> None:
    tool = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}
    lines = [
        claude_line("u1", None),
        claude_line("p1", "u1", type="progress", data={"type": "hook_progress"}),
        claude_line("p2", "p1", type="progress", data={"type": "hook_progress"}),
        assistant("a1", "u1", "m1", [tool]),
        claude_line("r1", "a1", message=result),
        assistant("a2", "r1", "m2", [{"type": "text", "text": "done"}]),
        # the user rewinds: a prompt and its answer left behind, then a new prompt
        claude_line("u2", "a2", message={"role": "user", "content": "try this"}),
        assistant("a3", "u2", "m3", [{"type": "text", "text": "ok"}]),
        claude_line("u3", "a2", message={"role": "user", "content": "no, that"}),
        assistant("a4", "u3", "m4", [{"type": "text", "text": "fine"}]),
    ]
    audit = audit_session(session_key("s1"), lines)
    assert audit.row["abandoned_entries"] == 2  # u2 and a3; never the progress lines
    assert audit.row["requests_abandoned"] == 1
