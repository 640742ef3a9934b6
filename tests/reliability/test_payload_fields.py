"""Issue 16, item 3: payload fields of another type than vak writes, through the real CLI.

A fleet whose ledgers hold the values that crashed a stage (a receipt's ``attempts: 5``
after a message without usage, a turn card's ``answered.presentations: 1``, a
``context_selection``'s ``plan.per_turn: 1``, and more) is audited with ``--replay`` and
compacted in a separate process: every session is read in full (exit 0, no
``audit_failed``), and the field the figures rest on is a ``bad_field`` warning.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from pipeline.io.commit import read_dataset
from pipeline.io.storage import resolve
from pipeline.synth.generator import generate_session
from tests.helpers.ledgers import dumps
from tests.helpers.storage import vakpipe_exe

#: ``(kind, path, value)``: set on every entry of that kind of one session each.
RETYPED: list[tuple[str, tuple[str, ...], Any]] = [
    ("receipt", ("attempts",), 5),
    ("turn_card", ("card", "answered", "presentations"), 1),
    ("context_selection", ("plan", "per_turn"), 1),
    ("turn_card", ("card",), [1, "a"]),
    ("message", ("message", "content"), {"a": 1}),
    ("turn_capabilities_bound", ("tool_schemas",), "x"),
]


def retyped_fleet(root: Path) -> int:
    """One generated session per :data:`RETYPED` row; returns how many were written."""
    for seed, (kind, where, value) in enumerate(RETYPED):
        s = generate_session(seed, turns=4, consistent=False)
        objs = [json.loads(line) for line in s.lines()]
        for o in objs:
            if kind == "receipt" and isinstance(o.get("meta"), dict):
                o["meta"].pop("usage", None)  # the receipt's winning attempt is read then
            if o["kind"] != kind:
                continue
            parent = o
            for k in where[:-1]:
                parent = parent.get(k) if isinstance(parent, dict) else None
            if isinstance(parent, dict):
                parent[where[-1]] = value
        path = root / s.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(dumps(o) + b"\n" for o in objs))
    return len(RETYPED)


def test_audit_replay_and_compact_read_every_session_of_a_retyped_fleet(
        tmp_path: Path, dask_scheduler: str) -> None:
    root = tmp_path / "archive"
    sessions = retyped_fleet(root)
    for command in (["audit", "--replay"], ["compact"]):
        out = tmp_path / "-".join(command)
        done = subprocess.run(
            [vakpipe_exe(), command[0], str(root), "--out", str(out), *command[1:],
             "--scheduler", dask_scheduler, "--no-progress"],
            capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, (command, done.stderr[-3000:])
        findings = read_dataset(resolve(str(out)), "integrity/findings").to_pylist()
        assert not [f for f in findings if f["code"] == "audit_failed"], command
        entries = read_dataset(resolve(str(out)), "integrity/sessions")["entries"].to_pylist()
        assert len(entries) == sessions and all(n > 0 for n in entries), command
        bad = {f["detail"].split(" is ")[0] for f in findings if f["code"] == "bad_field"}
        assert {"attempts", "message.content"} <= bad, command
        assert all(f["severity"] == "warning" for f in findings if f["code"] == "bad_field")
    turns = read_dataset(resolve(str(tmp_path / "audit---replay")), "turns")
    assert turns.num_rows > 0
