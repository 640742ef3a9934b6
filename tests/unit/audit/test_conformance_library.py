"""The conformance corpus (``tests/data/conformance``) through the library
(``audit_session``), no CLI.

Same rule as ``../shared/conformance/compare.py``: every expected finding is reported at
the same 1-based line with the same code (an entry with ``any`` passes when one of its
alternatives is; a null line matches any line), and a session with no expected finding
reports nothing of severity warning or error. Paths are relative to the corpus root.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.audit.session import audit_session
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.types import Severity
from tests.helpers.data_paths import CONFORMANCE

CORPUS: Path = CONFORMANCE / "corpus"
EXPECTED: Path = CONFORMANCE / "expected.json"


def load_expected() -> dict[str, Any]:
    if not EXPECTED.is_file():
        return {}
    data: dict[str, Any] = json.loads(EXPECTED.read_text(encoding="utf-8"))
    return data


def corpus_paths() -> list[str]:
    if not CORPUS.is_dir():
        return []
    return sorted(p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*.jsonl"))


EXPECTED_DATA = load_expected()


def test_corpus_and_expectations_name_the_same_sessions() -> None:
    paths = corpus_paths()
    assert paths, "the corpus holds no ledger"
    assert set(paths) == set(EXPECTED_DATA)


@pytest.mark.parametrize("path", sorted(EXPECTED_DATA) or ["<no corpus>"])
def test_conformance_session(path: str) -> None:
    expected = EXPECTED_DATA[path]
    key = parse_session_path(path)
    assert key is not None, f"{path} is not a session path"
    with (CORPUS / path).open("rb") as f:
        audit = audit_session(key, f)
    have = {(f.line, f.code.text) for f in audit.findings}
    reported_codes = {c for _, c in have}
    missing = [
        want for want in expected["findings"]
        if not any(
            (alt["line"], alt["code"]) in have
            or (alt["line"] is None and alt["code"] in reported_codes)
            for alt in want.get("any") or [want]
        )
    ]
    assert not missing, (
        f"{path} ({expected['fault']}): expected {missing}, got {sorted(have, key=str)}"
    )
    if not expected["findings"]:
        serious = sorted(
            ((f.line, f.code.text) for f in audit.findings if f.severity >= Severity.WARNING),
            key=str,
        )
        assert not serious, f"{path}: clean session, got {serious}"
    # The row agrees with the corpus' own record of the file.
    assert audit.row["lines"] == expected["lines"]
    assert audit.row["bytes"] == expected["bytes"]
    assert audit.row["session_path"] == path
