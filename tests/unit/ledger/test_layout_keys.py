"""A session key's characters (``pipeline.ledger.layout``): the one regex search over the
whole key refuses exactly the keys the per-segment rule refused (a segment that is
empty, ``.`` or ``..``, or holds a control character or a backslash)."""

from __future__ import annotations

import dataclasses
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.io.storage import SessionObject
from pipeline.ledger.layout import SessionKey, cwd_hash, parse_session_path, segment_member


def refused_by_segment_rule(relative: str) -> bool:
    """The rule as it was written per segment (before the regex)."""
    return any(segment in ("", ".", "..") or any(ord(c) < 0x20 or c == "\\" for c in segment)
               for segment in relative.split("/"))


SEGMENT = st.text(alphabet=st.sampled_from(["a", "-", ".", "\\", "\x00", "\n", "\x1f", "\x7f",
                                            " ", "é"]), max_size=4)
#: Keys of every shape read, the drawn segments where any safe one is accepted.
SHAPES = [("{1}", "projects", "{0}", "s.jsonl"), ("agents", "{0}", "sessions", "{1}", "s.jsonl"),
          ("projects", "{0}", "{1}", "subagents", "agent-x.jsonl"),
          ("agents", "{0}", "sessions", "{1}", "s", "seg-1.log")]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(SHAPES), SEGMENT, SEGMENT)
def test_a_key_is_refused_exactly_when_a_segment_is_unsafe(shape: tuple[str, ...], a: str,
                                                           b: str) -> None:
    relative = "/".join(shape).format(a, b)
    parsed = parse_session_path(relative) or segment_member(relative)
    if refused_by_segment_rule(relative):
        assert parsed is None
    else:
        assert parsed is not None, relative


OPTIONAL_TEXT = st.none() | st.text(max_size=20)


@given(st.builds(SessionKey, path=st.text(max_size=20), agent=st.text(max_size=8),
                 cwd_hash=st.text(max_size=8), session_id=st.text(max_size=8),
                 parent=OPTIONAL_TEXT, parent_missing=st.booleans(),
                 storage=st.sampled_from(["jsonl", "segments"])),
       st.text(max_size=20), st.integers(0, 2**63 - 1), OPTIONAL_TEXT, OPTIONAL_TEXT)
@settings(max_examples=200)
def test_keys_and_objects_travel_to_workers_whole(key: SessionKey, full_path: str, size: int,
                                                   etag: str | None,
                                                   unreadable: str | None) -> None:
    """A batch is pickled to its worker with its own ``__reduce__`` (faster than a slots
    dataclass's default): every field comes back, whatever its value, and no field is
    left out of it (the constructor's order is the slots')."""
    obj = SessionObject(key, full_path, size, etag, unreadable)
    for value in (key, obj):
        back = pickle.loads(pickle.dumps(value, protocol=5))
        assert back == value and type(back) is type(value)
        assert [f.name for f in dataclasses.fields(value)] == list(type(value).__slots__)


def fnv1a_64(text: str) -> str:
    """FNV-1a 64 as the spec gives it (offset basis, prime, over the UTF-8 bytes)."""
    h = 0xCBF29CE484222325
    for byte in text.encode("utf-8", "surrogatepass"):
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    return f"{h:016x}"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40) | st.text(min_size=500, max_size=700), st.integers(1, 3))
def test_a_directory_hash_is_fnv1a_however_often_it_is_asked(cwd: str, asks: int) -> None:
    # Short paths are remembered, long ones computed each time: the same hash either way.
    assert all(cwd_hash(cwd) == fnv1a_64(cwd) for _ in range(asks))
