"""Issue 16 (items 3 and 10): no payload value of another type crashes a stage; RFC 3339
timestamps with offsets; a duplicated ``role``; bytes before a line's JSON.

The property replaces fields of a generated ledger (containers as well as leaves, at any
depth) by arbitrary JSON values and runs what a replay task runs for one session, in
process: the audit, then the replay with the planner and the compaction planning. A
field of another type is read as absent (``bad_field`` where the audit's figures rest
on it): never an exception, which a task would report as ``audit_failed``.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta, timezone
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.audit.session import audit_session
from pipeline.compaction.engine import CompactionOptions
from pipeline.compaction.registry import get_summariser
from pipeline.io.storage import SessionObject
from pipeline.ledger.entry import ts_nanos
from pipeline.ledger.layout import parse_session_path
from pipeline.ledger.types import Code, Severity
from pipeline.run.replay_batches import ReplayOptions, replay_spooled
from pipeline.synth.generator import generate_session
from tests.helpers.ledgers import (
    LedgerBuilder,
    audit_bytes,
    codes,
    dumps,
    message_with_roles,
    read_bytes,
    sample_session,
    session_key,
)

ENVELOPE = frozenset({"id", "parent_id", "ts", "prev_hash", "at_turn", "kind"})

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6,
)


@cache
def base_ledger(seed: int) -> tuple[str, tuple[str, ...]]:
    """A generated session (path, lines as JSON text) with every kind the stages read."""
    s = generate_session(seed, turns=4, consistent=False)
    return s.path, tuple(line.decode() for line in s.lines())


def field_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a parsed line a value sits at, the envelope excepted."""
    found = [path] if path else []
    if isinstance(value, dict):
        for k, v in value.items():
            if not (path == () and k in ENVELOPE):
                found += field_paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += field_paths(v, (*path, i))
    return found


def replaced(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


OPTIONS = [ReplayOptions(planner=planner, compaction=CompactionOptions(
    get_summariser("cards"), window=3000)) for planner in (True, False)]


def audit_and_replay(path: str, data: bytes) -> None:
    """What a replay task does with one session, in process: exceptions propagate."""
    key = parse_session_path(path)
    assert key is not None
    kept: list[Any] = []
    audit = audit_session(key, io.BytesIO(data), keep=kept)
    assert not any(f.code is Code.AUDIT_FAILED for f in audit.findings)
    obj = SessionObject(key, "unused", len(data))
    for options in OPTIONS:
        replay_spooled(obj, audit, io.BytesIO(data), options, kept)
        replay_spooled(obj, audit, io.BytesIO(data), options)  # re-read from the bytes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 3), st.data())
def test_a_field_of_any_type_never_crashes_audit_replay_or_compaction(
        seed: int, data: st.DataObject) -> None:
    path, lines = base_ledger(seed)
    objs = [json.loads(line) for line in lines]
    for _ in range(data.draw(st.integers(1, 12), label="fields")):
        i = data.draw(st.integers(0, len(objs) - 1), label="line")
        paths = field_paths(objs[i])
        if paths:
            where = data.draw(st.sampled_from(paths), label="path")
            replaced(objs[i], where, data.draw(JSON, label="value"))
    audit_and_replay(path, b"".join(dumps(o) + b"\n" for o in objs))


#: The fields the issue found crashing a stage, each given values of every JSON type.
CRASHED: list[tuple[str, tuple[str, ...]]] = [
    ("receipt", ("attempts",)),
    ("turn_card", ("card", "answered", "presentations")),
    ("turn_card", ("card", "answered")),
    ("turn_card", ("card", "did")),
    ("context_selection", ("plan", "per_turn")),
    ("context_selection", ("plan",)),
    ("message", ("message", "content")),
    ("message", ("meta", "usage")),
]


@pytest.mark.parametrize(("kind", "where"), CRASHED)
@pytest.mark.parametrize("value", [5, 1.5, True, "x", None, {"a": 1}, [1, "a"]])
def test_the_fields_that_crashed_are_read_as_absent(kind: str, where: tuple[str, ...],
                                                    value: Any) -> None:
    path, lines = base_ledger(0)
    objs = [json.loads(line) for line in lines]
    hits = 0
    for o in objs:
        if kind == "receipt" and isinstance(o.get("meta"), dict):
            o["meta"].pop("usage", None)  # the receipt's winning attempt is read then
        if o["kind"] == kind:
            parent = o
            for k in where[:-1]:
                parent = parent.get(k) if isinstance(parent, dict) else None
            if isinstance(parent, dict):
                parent[where[-1]] = value
                hits += 1
    assert hits
    audit_and_replay(path, b"".join(dumps(o) + b"\n" for o in objs))


def test_a_bad_field_the_figures_rest_on_is_a_warning_on_its_line() -> None:
    b = sample_session(turns=1)
    b.entry("receipt", {"purpose": "chat", "attempts": 5})
    b.message("assistant", [{"type": "text", "text": "again"}],
              {"usage": {"input_tokens": "12", "output_tokens": 3}})
    audit = audit_bytes(b.to_bytes())
    bad = [(f.line, f.severity, f.detail.split(":")[0]) for f in audit.findings
           if f.code is Code.BAD_FIELD]
    n = len(b.lines)
    assert bad == [(n - 1, Severity.WARNING, "attempts is an integer, not an array"),
                   (n, Severity.WARNING, "meta.usage.input_tokens is a string, not a token "
                    "count (an integer from 0 to 2^63 - 1)")]
    assert audit.row["status"] == "warning"


# -- timestamps ---------------------------------------------------------------------------

OFFSETS = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timedelta(minutes=m))


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2262, 1, 1)),
       OFFSETS, st.sampled_from([0, 1, 3, 6, 9]), st.sampled_from(["Z", "z", "offset"]),
       st.sampled_from("Tt "))
def test_any_rfc3339_form_round_trips_to_the_same_utc_nanoseconds(
        moment: datetime, offset: timedelta, digits: int, zone: str, sep: str) -> None:
    utc = moment.replace(tzinfo=UTC)
    local = utc.astimezone(timezone(offset if zone == "offset" else timedelta(0)))
    frac = f"{local.microsecond:06d}000"[:digits]
    text = local.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + (f".{frac}" if digits else "")
    if zone == "offset":
        minutes = int(offset.total_seconds()) // 60
        text += f"{'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    else:
        text += zone
    expected = (int((utc - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 10**9
                + int(f"{utc.microsecond:06d}000"[:digits].ljust(9, "0")))
    assert ts_nanos(text) == expected


@pytest.mark.parametrize(("ts", "ns"), [
    ("2026-02-23T11:54:52.438+00:00", 1771847692438000000),
    ("2026-02-23T06:54:52.438-05:00", 1771847692438000000),
    ("2026-02-23T11:54:52.438z", 1771847692438000000),
    ("2026-02-23T11:54:52.4380000001Z", 1771847692438000000),  # past 9 digits: cut
    ("2026-02-23T11:54:52.4Z", 1771847692400000000),
    ("2016-12-31T23:59:60Z", 1483228800 * 10**9),  # a leap second: the instant after :59
])
def test_timestamps_with_offsets_and_any_fraction(ts: str, ns: int) -> None:
    assert ts_nanos(ts) == ns


@pytest.mark.parametrize("ts", [
    "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-02-23T24:00:00Z",
    "2026-02-23T11:60:00Z", "2026-02-23T11:54:61Z", "2026-02-23T11:54:52+24:00",
    "2026-02-23T11:54:52", "2026-02-23T11:54:52.Z", "2026-02-23", "garbage", "",
    "２０２６-02-23T11:54:52Z", "2026-02-23T11:54:52+0000", 5, None, ["2026"],
])
def test_invalid_timestamps_are_none(ts: Any) -> None:
    assert ts_nanos(ts) is None


def test_a_claude_code_transcript_with_offset_timestamps_is_audited() -> None:
    sid = "0199a1f2-5f00-7000-8000-00000000abcd"
    line = {"type": "user", "uuid": "u1", "parentUuid": None, "sessionId": sid,
            "timestamp": "2026-02-23T11:54:52.438+00:00", "cwd": "/p",
            "message": {"role": "user", "content": "hi"}}
    answer = {"type": "assistant", "uuid": "a1", "parentUuid": "u1", "sessionId": sid,
              "timestamp": "2026-02-23T06:54:53-05:00", "requestId": "r1",
              "message": {"id": "m1", "role": "assistant", "model": "claude-sonnet-4-5",
                          "content": [{"type": "text", "text": "hello"}],
                          "usage": {"input_tokens": 5, "output_tokens": 2}}}
    key = parse_session_path(f"claude-code/projects/-p/{sid}.jsonl")
    assert key is not None
    audit = audit_session(key, io.BytesIO(dumps(line) + b"\n" + dumps(answer) + b"\n"))
    assert audit.row["first_ts"] == 1771847692438000000
    assert audit.row["last_ts"] == 1771847693000000000
    assert audit.row["status"] == "ok" and audit.row["requests"] == 1


# -- a duplicated role ------------------------------------------------------------------


def test_a_duplicated_role_of_different_values_is_a_warning() -> None:
    data, line = message_with_roles("assistant", "user")
    entries, findings = read_bytes(data)
    assert codes(findings) == {(line, "duplicate_key")}
    assert findings[0].severity is Severity.WARNING
    assert "assistant, user" in findings[0].detail
    assert entries[2].role == "user"  # read as the last, as orjson does


def test_a_repeated_role_of_the_same_value_and_role_inside_content_are_no_finding() -> None:
    data, _ = message_with_roles("assistant", "assistant")
    assert read_bytes(data)[1] == []
    b = LedgerBuilder()
    b.header()
    b.message("user", [{"type": "tool_use", "id": "c", "name": "x",
                        "input": {"role": "admin", "nested": {"role": "x"}}},
                       {"type": "text", "text": '"role" "role"'}])
    assert read_bytes(b.to_bytes())[1] == []


def test_a_hostile_role_value_is_not_echoed() -> None:
    data, line = message_with_roles("assistant", "sk-ant-" + "A" * 40)
    _, findings = read_bytes(data)
    assert codes(findings) == {(line, "duplicate_key")}
    assert "AAAA" not in findings[0].detail and "another value" in findings[0].detail


# -- bytes before a line's JSON ---------------------------------------------------------


def with_prefix(prefix: bytes, line: int = 2) -> bytes:
    b = sample_session(turns=1)
    b.lines[line - 1].data = prefix + b.lines[line - 1].data
    return b.to_bytes()


@pytest.mark.parametrize(("prefix", "what"), [
    (b"\xef\xbb\xbf", "byte order mark"),
    (b"injected text ", "do not start like any line vak writes"),
    (b'{"x":1}', "do not start like any line vak writes"),
])
@pytest.mark.parametrize("line", [1, 2])
def test_bytes_vak_never_writes_before_an_entry_are_damage(prefix: bytes, what: str,
                                                           line: int) -> None:
    """Spec 2.1: a torn fragment starts like every line vak writes; other bytes before an
    entry were put there after it was written (``damaged_entry``). The entry after them
    is intact and chained: it is recovered."""
    clean = audit_bytes(with_prefix(b""))
    audit = audit_bytes(with_prefix(prefix, line))
    assert codes(audit.findings) == {(line, "damaged_entry")}
    (finding,) = audit.findings
    assert what in finding.detail and finding.entry_id is not None
    assert audit.row["entries"] == clean.row["entries"]
    assert audit.row["requests"] == clean.row["requests"]


@pytest.mark.parametrize("fragment", [b"{", b'{"i', b'{"id":"0199a1f2-6a00-70'])
def test_a_fragment_that_starts_like_a_vak_line_is_still_a_torn_merge(fragment: bytes) -> None:
    audit = audit_bytes(with_prefix(fragment))
    assert codes(audit.findings) == {(2, "torn_merge")}


def test_a_prefixed_session_replays_from_its_bytes() -> None:
    """The replay of a large session reads its bytes again: an entry recovered after a
    prefix is found again by the reader, not parsed from the whole line."""
    data = with_prefix(b"\xef\xbb\xbf")
    key = session_key()
    audit = audit_session(key, io.BytesIO(data))
    obj = SessionObject(key, "unused", len(data))
    replayed = replay_spooled(obj, audit, io.BytesIO(data), ReplayOptions())
    assert len(replayed.requests) == audit.row["requests"] > 0
