"""Real transcripts read right (issue 17): detection that holds whatever a file opens
with, forked Codex rollouts billed once, turns and scopes of transcripts, ``vakpipe
show`` on them, abandoned branches that are branches, and Codex's own context window.

On the real files of ``tests/data/real`` and the forks made from them in
``tests/data/forks`` (see its README). Figures are checked against the files' own
fields, never against what the adapters produced before.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.audit.session import SessionAudit, audit_session
from pipeline.costs.report import drop_copies
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.reader import Entry
from pipeline.ledger.types import Severity
from pipeline.replay.catalog import load_catalog
from pipeline.replay.reported import reported_replay
from pipeline.tables.schemas import usage_table
from tests.helpers.data_paths import DATA, REAL
from tests.helpers.storage import vakpipe_exe

CLAUDE = REAL / "claude-code" / "projects" / "-home-marco-projects-spotter"
CODEX = REAL / "codex" / "sessions" / "2026" / "02" / "23"
FORKS = DATA / "forks"
FORK = next(FORKS.rglob("rollout-*.jsonl"))
PARENT = CODEX / "rollout-2026-02-23T12-40-23-019c8a4c-ed82-79a1-aa28-7738fc5ab61a.jsonl"
ALL_FILES = sorted(REAL.rglob("*.jsonl"))
#: Line types a transcript format knows; a prepended line takes any other.
KNOWN_TYPES = {"user", "assistant", "system", "summary", "progress", "file-history-snapshot",
               "queue-operation", "attachment", "session_meta", "response_item", "event_msg",
               "turn_context", "compacted"}


def audit_of(lines: list[bytes], relative: str,
             kept: list[Entry] | None = None) -> SessionAudit:
    key = parse_session_path(relative)
    assert key is not None, relative
    return audit_session(key, lines, keep=kept)


def file_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def rel(path: Path, root: Path = REAL) -> str:
    return path.relative_to(root).as_posix()


# --- detection ---------------------------------------------------------------------------

#: Small real files of both formats, for the property (the big ones take seconds each).
SMALL = [CLAUDE / "short.jsonl", CLAUDE / "tool_heavy.jsonl",
         CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d" / "subagents" / "agent-a881341.jsonl",
         CODEX / "rollout-2026-02-23T13-19-38-019c8a70-dda7-7f33-98ea-f30553347322.jsonl",
         CODEX / "rollout-2026-02-23T12-41-04-019c8a4d-8f45-7010-8b5d-7fad920aa6f9.jsonl"]
BASELINE = {p: audit_of(file_lines(p), rel(p)) for p in SMALL}

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
unknown_type = st.text(min_size=1, max_size=20).filter(lambda t: t not in KNOWN_TYPES)


def usage_without_ids(audit: SessionAudit) -> list[tuple[Any, ...]]:
    # Codex ids are line numbers (L<n>): a prepended line shifts them, nothing else.
    return [row[1:] for row in audit.usage]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(SMALL), kind=unknown_type,
       fields=st.dictionaries(st.text(min_size=1, max_size=10).filter(
           lambda k: k not in {"type", "uuid", "parentUuid", "payload", "id", "kind",
                               "parent_id", "ts", "hash", "prev_hash"}),
           json_scalars, max_size=4),
       with_session=st.booleans())
def test_prepending_a_line_of_an_unknown_type_changes_neither_usage_nor_status(
        path: Path, kind: str, fields: dict[str, Any], with_session: bool) -> None:
    before = BASELINE[path]
    line: dict[str, Any] = {**fields, "type": kind}
    if path.parent == CODEX:
        line.update(timestamp="2026-02-23T11:00:00.000Z", payload={"type": kind})
    elif with_session:
        line["sessionId"] = before.row["session_id"]
    after = audit_of([json.dumps(line).encode() + b"\n", *file_lines(path)], rel(path))
    assert after.row["source"] == before.row["source"]
    assert after.row["status"] == before.row["status"]
    assert [f.code for f in after.findings] == [f.code for f in before.findings]
    if path.parent == CODEX:
        assert usage_without_ids(after) == usage_without_ids(before)
    else:
        assert after.usage == before.usage


def test_no_real_transcript_is_read_as_a_vak_ledger_or_has_damaged_lines() -> None:
    for path in ALL_FILES:
        audit = audit_of(file_lines(path), rel(path))
        assert audit.row["source"] in ("claude-code", "codex"), path
        assert not any(f.code.text == "damaged_entry" for f in audit.findings), path


# --- forks ---------------------------------------------------------------------------------

def copied_turns(path: Path) -> set[str]:
    """The turn ids of a fork's history copied from its parent: those the parent has."""
    def turns(p: Path) -> set[str]:
        return {o["payload"]["turn_id"] for o in map(json.loads, file_lines(p))
                if o["type"] == "event_msg" and o["payload"].get("type") == "task_started"}
    return turns(path) & turns(PARENT)


def moved_totals(path: Path) -> list[tuple[str | None, tuple[int, ...]]]:
    """``(turn id, totals)`` of every token_count whose totals moved (an independent
    recount of Codex's requests)."""
    out: list[tuple[str | None, tuple[int, ...]]] = []
    turn: str | None = None
    last: tuple[int, ...] | None = None
    for o in map(json.loads, file_lines(path)):
        p = o.get("payload") or {}
        if o["type"] == "event_msg" and p.get("type") == "task_started":
            turn = p["turn_id"]
        if o["type"] == "event_msg" and p.get("type") == "token_count" and p.get("info"):
            t = p["info"]["total_token_usage"]
            now = (t["input_tokens"], t["cached_input_tokens"], t["output_tokens"])
            if now != last:
                out.append((turn, now))
                last = now
    return out


def test_a_fork_is_billed_once_with_its_parent_and_says_how_many_it_copied() -> None:
    parent = audit_of(file_lines(PARENT), rel(PARENT))
    fork = audit_of(file_lines(FORK), rel(FORK, FORKS))
    copied_ids = copied_turns(FORK)
    copied = sum(1 for turn, _ in moved_totals(FORK) if turn in copied_ids)
    assert copied == 59 and fork.row["requests"] == 76
    (finding,) = [f for f in fork.findings if f.code.text == "fork_history"]
    assert finding.severity is Severity.INFO and f" {copied} requests copied" in finding.detail
    assert fork.row["status"] == "ok" and fork.row["session_id"] == FORK.stem[-36:]
    once, dropped = drop_copies(usage_table([parent, fork]))
    assert dropped == copied
    # Kept: every request of the parent, and the fork's own turn (its totals equal the
    # parent's fourth turn's: only the turn id tells them apart).
    assert once.num_rows == parent.row["requests"] + fork.row["requests"] - copied
    kept_fork = [p for p in once["session_path"].to_pylist() if p == fork.row["session_path"]]
    assert len(kept_fork) == fork.row["requests"] - copied


def test_a_fork_without_its_parent_is_billed_whole() -> None:
    fork = audit_of(file_lines(FORK), rel(FORK, FORKS))
    once, dropped = drop_copies(usage_table([fork]))
    assert dropped == 0 and once.num_rows == fork.row["requests"]


# --- turns, scopes, abandoned, windows --------------------------------------------------------

@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.name[:40])
def test_every_transcript_request_has_a_scope_and_turns_rows_match_the_audit(
        path: Path) -> None:
    kept: list[Entry] = []
    audit = audit_of(file_lines(path), rel(path), kept)
    turns, requests = reported_replay(audit, load_catalog(),
                                      [e for e in kept if (e.line, e.id) in audit.active])
    assert len(requests) == audit.row["requests"] > 0
    assert len(turns) == audit.row["turns"]
    assert all(r["scope"] == f"t{r['turn']}/i{r['iteration']}" for r in requests)
    assert len({r["scope"] for r in requests}) == len(requests)
    assert sum(t["iterations"] for t in turns) == len(requests)
    if path.parent == CODEX:
        assert {r["model_input_limit"] for r in requests} == {258400}


@pytest.mark.parametrize("path", sorted(CLAUDE.glob("*-*-*-*-*.jsonl")), ids=lambda p: p.name)
def test_side_lines_of_real_sessions_are_not_abandoned(path: Path) -> None:
    audit = audit_of(file_lines(path), rel(path))
    progress = sum(1 for o in map(json.loads, file_lines(path)) if o.get("type") == "progress")
    assert progress > 1000  # the side lines the old count took for abandoned branches
    assert audit.row["abandoned_entries"] == 0 and audit.row["requests_abandoned"] == 0


# --- vakpipe show through the real CLI ---------------------------------------------------------

@pytest.mark.parametrize(("path", "scope"), [
    (CLAUDE / "tool_heavy.jsonl", "t5/i2"),
    (CODEX / "rollout-2026-02-23T12-40-23-019c8a4c-ed82-79a1-aa28-7738fc5ab61a.jsonl",
     "t2/i3"),
])
def test_show_prints_a_transcript_request(tmp_path: Path, path: Path, scope: str) -> None:
    copy = tmp_path / rel(path)
    copy.parent.mkdir(parents=True)
    shutil.copyfile(path, copy)
    done = subprocess.run([vakpipe_exe(), "show", str(copy), "--scope", scope],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"request   {scope} · entry " in out and "rules     reported" in out
    assert "provider-reported" in out and "saturation" in out
    assert "messages  " in out and "[1] user" in out


def test_compact_says_transcripts_get_no_plan(tmp_path: Path) -> None:
    """No compaction is planned for a transcript (docs/formats.md): the summary and the
    manifest count them, so "0 of N sessions need packets" is not read as a verdict."""
    out = tmp_path / "out"
    done = subprocess.run([vakpipe_exe(), "compact", str(REAL), "--out", str(out),
                           "--window", "20000", "--workers", "0", "--no-progress"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    counts = json.loads((out / "_manifest.json").read_text())["compaction"]
    sessions = json.loads((out / "_manifest.json").read_text())["sessions"]
    assert counts["sessions_needing_packets"] == 0 and counts["packets"] == 0
    assert counts["transcripts_not_planned"] == sessions > 0
    assert f"transcripts: {sessions:,} (Claude Code, Codex) get no plan" in done.stdout
