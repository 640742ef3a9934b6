"""Every transcript format of ``pipeline.formats`` runs the format contract
(``tests/contracts/formats.py``) on a real transcript of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.formats import FORMATS
from pipeline.formats.base import TranscriptFormat
from pipeline.formats.claude_code import ClaudeCode
from pipeline.formats.codex import Codex
from tests.contracts.formats import FormatContract
from tests.helpers.data_paths import REAL


def test_every_adapter_has_a_contract_subclass() -> None:
    tested = {cls.impl for cls in (TestClaudeCodeContract, TestCodexContract)}
    assert {type(f) for f in FORMATS} == tested


class TestClaudeCodeContract(FormatContract):
    impl = ClaudeCode

    @pytest.fixture
    def adapter(self) -> TranscriptFormat:
        return ClaudeCode()

    @pytest.fixture
    def sample(self) -> Path:
        return REAL / "claude-code" / "projects" / "-home-marco-projects-spotter" / "short.jsonl"


class TestCodexContract(FormatContract):
    impl = Codex

    @pytest.fixture
    def adapter(self) -> TranscriptFormat:
        return Codex()

    @pytest.fixture
    def sample(self) -> Path:
        return min((REAL / "codex" / "sessions").rglob("rollout-*.jsonl"))
