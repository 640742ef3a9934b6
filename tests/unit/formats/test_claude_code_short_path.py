"""The Claude Code adapter's short paths (issue 21): a ``progress`` line goes to its
activity entry without :func:`~pipeline.formats.claude_code._kind_data_py`, and a usage
object's counts are read without a call per field. Both must read every line as the
general path does: the kind and data of each entry are compared with what
``_kind_data_py`` makes of the same line, on hand-picked and fuzzed progress lines, and the
inlined usage read with :func:`~pipeline.formats.base.count` field by field.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.formats.claude_code as cc
from pipeline.formats.base import count
from pipeline.ledger.entry import usage_of
from pipeline.ledger.reader import Entry, LineStats
from pipeline.ledger.types import MAX_TOKEN_COUNT, token_count

TS = "2026-02-11T20:31:53.375Z"
USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens",
              "cache_creation_input_tokens")


def progress(n: int, data: Any, **extra: Any) -> bytes:
    line = {"parentUuid": f"u{n - 1}" if n else None, "isSidechain": False,
            "sessionId": "s1", "type": "progress", "data": data, "timestamp": TS,
            "uuid": f"u{n}", **extra}
    return json.dumps(line).encode() + b"\n"


def assert_kinds_as_general_path(lines: list[bytes]) -> None:
    """Every entry's kind and data are what ``_kind_data_py`` gives for its line."""
    items = list(cc.ClaudeCode().read(iter(lines), LineStats(), {}))
    entries = [i for i in items if isinstance(i, Entry) and i.kind != "header"]
    assert len(entries) == len(lines)
    for entry, raw in zip(entries, lines, strict=True):
        kind, data = cc._kind_data_py(orjson.loads(raw))
        assert (entry.kind, entry.data) == (kind, data)


AGENT_LINE = {"type": "assistant", "requestId": "req_1",
              "message": {"id": "msg_1", "model": "claude-opus-4-6", "role": "assistant",
                          "usage": {"input_tokens": 3, "output_tokens": 5}}}

ODD_DATA: list[Any] = [
    {"type": "hook_progress", "hookEvent": "SessionStart"},
    {"type": "bash_progress"},
    {},
    {"type": None},
    {"type": ["agent_progress"]},
    None, 5, "agent_progress", ["agent_progress"],
    {"type": "agent_progress"},  # no message: activity
    {"type": "agent_progress", "agentId": "a1", "message": "text"},
    {"type": "agent_progress", "agentId": "a1", "message": {"type": "user", "message": {}}},
    {"type": "agent_progress", "agentId": "a1",
     "message": {**AGENT_LINE, "message": {**AGENT_LINE["message"], "model": "<synthetic>"}}},
    {"type": "agent_progress", "agentId": "a1", "message": AGENT_LINE},  # a mirror
    {"type": "agent_progress", "message": AGENT_LINE},  # a mirror, no agent id
]


def test_every_progress_line_reads_as_the_general_path_reads_it() -> None:
    assert_kinds_as_general_path([progress(n, data) for n, data in enumerate(ODD_DATA)])


def test_a_mirror_is_still_a_message_and_the_rest_activity() -> None:
    lines = [progress(0, ODD_DATA[0]), progress(1, ODD_DATA[-2])]
    items = [i for i in cc.ClaudeCode().read(iter(lines), LineStats(), {})
             if isinstance(i, Entry)]
    assert [e.kind for e in items] == ["header", "activity", "message"]
    assert items[2].data["meta"]["mirror"] == "a1"


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["type", "message", "agentId", "x"]),
                                      inner, max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(st.lists(JSON | st.sampled_from(ODD_DATA), min_size=1, max_size=6))
def test_any_fuzzed_progress_line_reads_as_the_general_path_reads_it(data: list[Any]) -> None:
    assert_kinds_as_general_path([progress(n, d) for n, d in enumerate(data)])


COUNTS = (st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=3)
          | st.integers(min_value=-5, max_value=10**6)
          | st.sampled_from([0, MAX_TOKEN_COUNT, MAX_TOKEN_COUNT + 1, -1, 2**64]))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from([*USAGE_KEYS, "other"]), COUNTS))
def test_a_usage_object_reads_as_count_reads_each_field(usage: dict[str, Any]) -> None:
    # Its counts, absent or null read as 0; a count of another kind leaves the object as
    # it is, for the audit to refuse (a bad_field finding) as it refuses vak's.
    refused = any(usage.get(k) is not None and token_count(usage[k]) is None
                  for k in USAGE_KEYS)
    assert cc._usage(usage) == (usage if refused else
                                {k: count(usage.get(k)) for k in USAGE_KEYS})
    assert (usage_of(cc._usage(usage)) is None) is refused


def test_a_usage_that_is_no_object_is_none() -> None:
    assert cc._usage([1, 2]) is None
    assert cc._usage(None) is None
