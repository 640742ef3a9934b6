"""The test data travels with the project: ``tests/data`` holds everything the tests read
(no ``../shared`` needed), with its licences and source notes.

A missing or emptied folder must fail here, not turn into skips or into parametrized tests
with an empty parameter set elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.data_paths import CONFORMANCE, DATA, REAL, SPEC

CLAUDE = REAL / "claude-code"
CODEX = REAL / "codex"


def jsonl(root: Path) -> list[Path]:
    return sorted(root.rglob("*.jsonl"))


def test_real_transcripts_are_in_the_project() -> None:
    # 6 sessions and 6 subagent files; 4 Codex rollouts (tests/data/README.md).
    assert len(jsonl(CLAUDE / "projects")) == 12
    assert len(list(CLAUDE.glob("projects/*/*/subagents/agent-*.jsonl"))) == 6
    assert len(list(CODEX.glob("sessions/2026/02/23/rollout-*.jsonl"))) == 4


def test_sample_ledger_and_conformance_corpus_are_in_the_project() -> None:
    assert (SPEC / "example-ledger.jsonl").stat().st_size > 0
    corpus = CONFORMANCE / "corpus"
    expected = json.loads((CONFORMANCE / "expected.json").read_text(encoding="utf-8"))
    assert len(expected) == 84
    assert {p.relative_to(corpus).as_posix() for p in jsonl(corpus)} == set(expected)


def test_every_folder_names_its_source_and_licence() -> None:
    for note in ("README.md", "real/README.md", "real/claude-code/LICENSE",
                 "real/claude-code/SOURCE-README.md", "real/codex/LICENSE",
                 "real/codex/SOURCE-README.md", "spec/SOURCE.md", "conformance/SOURCE.md"):
        assert (DATA / note).read_text(encoding="utf-8").strip(), note
    assert "MIT License" in (CLAUDE / "LICENSE").read_text(encoding="utf-8")
    assert "MIT" in (CODEX / "LICENSE").read_text(encoding="utf-8")


def test_no_test_reads_shared_any_more() -> None:
    # The one place that names the data is data_paths.py; a path into ../shared or an
    # absolute /work/shared path would skip or fail in a clone elsewhere.
    project = DATA.parents[1]
    offenders = [
        p.relative_to(project).as_posix()
        for folder in ("tests", "bench")
        for p in sorted((project / folder).rglob("*.py"))
        if p.name != Path(__file__).name
        and any(s in p.read_text(encoding="utf-8")
                for s in ('"shared"', "/work/shared", "'shared'"))
    ]
    assert offenders == []
