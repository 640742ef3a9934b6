"""How deep a JSON text nests (:mod:`pipeline.ledger.nesting`), and the checks that ask
it before parsing a line again with Python's ``json``: they read the same on every
Python (3.11's ``json`` stops near 1,000 levels, 3.13's goes far deeper)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ledger.nesting import MAX_NESTING, nested_deeper_than
from pipeline.ledger.reader import _work_quirk, parse_entry
from pipeline.replay.projection import digest_result

#: Strings that look like nesting: brackets, quotes and backslashes inside them.
_TRICKY = st.text(alphabet='[]{}"\\ab\u00e9', max_size=8)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _TRICKY,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(_TRICKY, inner, max_size=3),
    max_leaves=30)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(_VALUES, st.integers(min_value=0, max_value=6))
def test_the_depth_told_is_the_values_depth(value: Any, limit: int) -> None:
    text = orjson.dumps(value)
    assert nested_deeper_than(text, limit) is (depth(value) > limit)
    assert nested_deeper_than(text.decode(), limit) is (depth(value) > limit)


def test_brackets_in_strings_do_not_nest() -> None:
    assert not nested_deeper_than(b'{"a":"[[[[{{{{\\"[[["}', 1)
    assert nested_deeper_than(b'[[["]"]]]', 2)
    assert not nested_deeper_than(b"[" * MAX_NESTING + b"]" * MAX_NESTING)
    assert nested_deeper_than(b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1))


def test_the_limit_is_the_c_kernels() -> None:
    ckernel = pytest.importorskip("pipeline.ledger._ckernel")
    assert ckernel.MAX_DEPTH == MAX_NESTING


def _quirk_line(levels: int) -> bytes:
    return (b'{"id":"0199a1f2-6a00-7000-8000-0000000000ff","parent_id":null,'
            b'"ts":"2026-09-21T14:13:20Z","kind":"work","kind":' + b'{"a":' * levels
            + b"1" + b"}" * (levels + 1))


def test_a_quirk_line_nested_past_the_limit_is_no_quirk_on_any_python() -> None:
    """600 levels: Python 3.11's json parsed it (the quirk), 1,000 it did not (a damaged
    line), while 3.13 parses both: now neither is the quirk, everywhere."""
    assert _work_quirk(_quirk_line(10))
    for levels in (MAX_NESTING, 600, 1000):
        assert not _work_quirk(_quirk_line(levels))
        entry, ok, _ = parse_entry(_quirk_line(levels), 1)
        assert entry is None and not ok


def test_a_tool_result_nested_past_the_limit_is_digested_as_text() -> None:
    shallow = digest_result('[{"a": 1}]', tool="x", is_error=False, evidence_id="e")
    assert shallow.startswith("array, 1 items")
    deep = "[" * 600 + "]" * 600
    assert not digest_result(deep, tool="x", is_error=False,
                             evidence_id="e").startswith("array")
