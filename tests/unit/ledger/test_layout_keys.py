"""A session key's characters (``pipeline.ledger.layout``): the one regex search over the
whole key refuses exactly the keys the per-segment rule refused (a segment that is
empty, ``.`` or ``..``, or holds a control character or a backslash)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ledger.layout import parse_session_path, segment_member


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
