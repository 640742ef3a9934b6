"""Where the tests' data lives: ``tests/data`` inside the project (see its README.md).

The one place test modules and benches name it, so a clone anywhere, with no
``../shared`` beside it, runs every test that reads real transcripts, vak's sample
ledger or the conformance corpus.
"""

from __future__ import annotations

from pathlib import Path

#: ``tests/data``: copies of the data once read from ``../shared``, with licences.
DATA = Path(__file__).resolve().parents[1] / "data"
#: Real, sanitized Claude Code (``claude-code/``) and Codex (``codex/``) transcripts (MIT).
REAL = DATA / "real"
#: vak's sample ledger, ``example-ledger.jsonl``.
SPEC = DATA / "spec"
#: The conformance corpus (``corpus/``) and the findings it should give (``expected.json``).
CONFORMANCE = DATA / "conformance"
#: ccusage 20.0.24's JSON reports of ``real/claude-code`` (the figures ``cost`` must equal).
CCUSAGE = DATA / "ccusage"
