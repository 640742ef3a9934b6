"""Make the forked Codex rollouts of this folder from a real rollout (run from the
project root: ``python tests/data/forks/make_forks.py``; the output is committed).

The shape is that of ccusage's public fork fixtures (repository ``ccusage/ccusage``,
``rust/crates/ccusage/tests/fixtures/codex/replay-multisecond-*.jsonl``): the fork's own
``session_meta`` (with ``forked_from_id``), then its parent's ``session_meta`` copied,
then the parent's history copied line for line with every outer ``timestamp`` rewritten
to the fork instant (a burst, a millisecond apart), then the fork's own turns.

Parent: ``tests/data/real/codex/.../rollout-2026-02-23T12-40-23-019c8a4c-....jsonl``
(5 turns). The fork copies its first three turns and then runs one turn of its own: the
parent's fourth turn's lines under a new turn id (a UUIDv7 minted after the fork
instant) and later timestamps. Its totals continue the copied ones, as Codex's do, so
they equal the parent's own fourth turn's: only the turn id tells them apart.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
REAL = HERE.parent / "real" / "codex" / "sessions" / "2026" / "02" / "23"
PARENT = REAL / "rollout-2026-02-23T12-40-23-019c8a4c-ed82-79a1-aa28-7738fc5ab61a.jsonl"
#: The fork's id: a UUIDv7 of the fork instant, 2026-02-23T13:00:00Z.
FORK_MS = 1771851600000
FORK_ID = f"{FORK_MS:012x}"[:8] + "-" + f"{FORK_MS:012x}"[8:] + "-7000-8000-00000000f0c1"
FORK_TS = "2026-02-23T13:00:00.000Z"
#: The fork's own turn: minted 5 s after the fork instant.
OWN_MS = FORK_MS + 5000
OWN_TURN = f"{OWN_MS:012x}"[:8] + "-" + f"{OWN_MS:012x}"[8:] + "-7000-8000-00000000f0c2"
COPIED_TURNS = 3


def stamp(ms: int) -> str:
    """An ISO time of ``ms`` after the fork instant's minute (under one minute)."""
    return f"2026-02-23T13:00:{ms // 1000:02d}.{ms % 1000:03d}Z"


def main() -> None:
    lines = [json.loads(line) for line in PARENT.read_text().splitlines() if line.strip()]
    meta = lines[0]
    starts = [i for i, o in enumerate(lines)
              if o["type"] == "event_msg" and o["payload"].get("type") == "task_started"]
    copied = lines[1:starts[COPIED_TURNS]]
    own = lines[starts[COPIED_TURNS]:starts[COPIED_TURNS + 1]]
    parent_turn = own[0]["payload"]["turn_id"]
    fork_meta = {"timestamp": FORK_TS, "type": "session_meta",
                 "payload": {**meta["payload"], "id": FORK_ID, "timestamp": FORK_TS,
                             "forked_from_id": meta["payload"]["id"]}}
    out = [fork_meta, {**meta, "timestamp": stamp(1)}]
    out += [{**o, "timestamp": stamp(2 + i // 100)} for i, o in enumerate(copied)]
    for i, o in enumerate(own):
        text = json.dumps(o).replace(parent_turn, OWN_TURN)
        out.append({**json.loads(text), "timestamp": stamp(10_000 + 100 * i)})
    name = f"rollout-2026-02-23T14-00-00-{FORK_ID}.jsonl"
    target = HERE / "codex" / "sessions" / "2026" / "02" / "23" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(json.dumps(o, separators=(",", ":")) + "\n" for o in out))


if __name__ == "__main__":
    main()
