"""A Claude Code line's entry kind and data from the C kernel (``kind_data``: its user and
assistant lines built in C, every other line handed to the Python) against
:func:`pipeline.formats.claude_code._kind_data_py`: the same values of the same types,
on generated lines with every field the function reads of every JSON type (counts out
of range, booleans where counts go, the synthetic model, empty and missing ids, a speed
of every kind), on the
real transcripts' lines parsed by orjson and by the C scan, and on odd inputs.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeline.formats.claude_code as cc
from pipeline.formats.base import Scanned
from pipeline.ledger import kernel
from pipeline.ledger.types import MAX_TOKEN_COUNT
from tests.helpers.data_paths import REAL

pytestmark = pytest.mark.skipif(kernel.kind_data_c is None,
                                reason="the C kernel did not build here")


def typed(value: Any) -> Any:
    """``value`` with every scalar paired with its type (``1 == True`` in Python, and a
    count must stay an int), dicts with their key order."""
    if type(value) is dict:
        return ("dict", [(k, typed(v)) for k, v in value.items()])
    if type(value) in (list, tuple):
        return (type(value).__name__, [typed(v) for v in value])
    return (type(value).__name__, value)


def assert_same(obj: Any) -> None:
    assert kernel.kind_data_c is not None
    try:
        want = cc._kind_data_py(obj)
    except Exception as err:  # the C hands such an input to the Python: the same error
        with pytest.raises(type(err)):
            kernel.kind_data_c(obj)
        return
    got = kernel.kind_data_c(obj)
    assert typed(got) == typed(want)
    content = obj.get("message", {}).get("content") if type(obj.get("message")) is dict \
        else None
    if type(content) is list and got[0] == "message" and type(obj.get("type")) is str \
            and obj["type"] in ("user", "assistant"):
        assert got[1]["message"]["content"] is content  # as the Python: the list itself


COUNTS = (st.integers(-5, 10**6) | st.sampled_from([MAX_TOKEN_COUNT, MAX_TOKEN_COUNT + 1,
                                                    -(2**70), 2**70])
          | st.booleans() | st.none() | st.floats(allow_nan=False) | st.text(max_size=3))
ANY = st.none() | st.booleans() | st.integers() | st.text(max_size=5) \
    | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3),
                                                            st.integers(), max_size=2)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value, or the field absent (``...``)."""
    return st.just(...) | strategy


@st.composite
def usage(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 5)) == 0:
        return draw(ANY)
    fields = {"input_tokens": draw(maybe(COUNTS)), "output_tokens": draw(maybe(COUNTS)),
              "cache_read_input_tokens": draw(maybe(COUNTS)),
              "cache_creation_input_tokens": draw(maybe(COUNTS)),
              "cache_creation": draw(maybe(
                  st.fixed_dictionaries({}, optional={"ephemeral_1h_input_tokens": COUNTS,
                                                      "ephemeral_5m_input_tokens": COUNTS})
                  | ANY)),
              # the speed (Anthropic's fast mode): kept unless "standard" or not a text
              "speed": draw(maybe(st.sampled_from(["fast", "standard", "", "Fast"]) | ANY))}
    return {k: v for k, v in fields.items() if v is not ...}


@st.composite
def line(draw: st.DrawFn) -> dict[str, Any]:
    message: Any = {k: v for k, v in {
        "role": draw(maybe(ANY)),
        "model": draw(maybe(st.sampled_from(["claude-opus-4-6", "<synthetic>", ""]) | ANY)),
        "id": draw(maybe(st.sampled_from(["msg_1", ""]) | ANY)),
        "usage": draw(maybe(usage())),
        "content": draw(maybe(st.text(max_size=5) | st.lists(ANY, max_size=2) | ANY)),
    }.items() if v is not ...}
    if draw(st.integers(0, 9)) == 0:
        message = draw(ANY)
    fields = {
        "type": draw(maybe(st.sampled_from(["user", "assistant", "progress", "system",
                                            "summary"]) | ANY)),
        "message": draw(maybe(st.just(message))),
        "requestId": draw(maybe(st.sampled_from(["req_1", ""]) | ANY)),
        "isMeta": draw(maybe(st.booleans() | st.integers(0, 1) | st.none())),
        "isCompactSummary": draw(maybe(st.booleans() | st.integers(0, 1) | st.none())),
        "subtype": draw(maybe(st.just("compact_boundary"))),
        "data": draw(maybe(st.just({"type": "hook_progress"}))),
        "uuid": "u1",
    }
    return {k: v for k, v in fields.items() if v is not ...}


@settings(max_examples=500, deadline=None)
@given(obj=line(), scanned=st.booleans())
@example(obj={"type": "assistant", "message": {"model": "<synthetic>", "usage": {}}},
         scanned=False)
@example(obj={"type": "assistant", "message": {"usage": {
    "input_tokens": True, "output_tokens": MAX_TOKEN_COUNT + 1,
    "cache_creation_input_tokens": 5, "cache_creation": {"ephemeral_1h_input_tokens": 9}}}},
    scanned=False)
@example(obj={"type": "assistant", "message": {"usage": {
    "cache_creation_input_tokens": 9, "cache_creation": {"ephemeral_1h_input_tokens": 4}}}},
    scanned=False)
@example(obj={"type": "assistant", "message": {"id": "", "usage": {
    "input_tokens": -3, "output_tokens": 2.0, "cache_read_input_tokens": None,
    "cache_creation_input_tokens": -(2**70), "cache_creation": {
        "ephemeral_1h_input_tokens": -1}}}, "requestId": 7}, scanned=True)
@example(obj={"type": "user", "message": {"content": "hi"}, "isMeta": 1,
              "isCompactSummary": True}, scanned=True)
def test_kind_data_in_c_is_the_python_one(obj: dict[str, Any], scanned: bool) -> None:
    assert_same(Scanned(obj) if scanned else obj)


def test_the_real_transcripts_lines_get_the_same_kind_and_data() -> None:
    scan = kernel.scan_transcript_c
    messages = 0
    for path in sorted((REAL / "claude-code").rglob("*.jsonl")):
        for raw in path.read_bytes().splitlines():
            obj = orjson.loads(raw)
            assert_same(obj)
            messages += obj.get("type") in ("user", "assistant")
            if scan is not None:
                found = scan(Scanned, raw)
                if found is not None:
                    assert_same(found)
    assert messages > 1000


@pytest.mark.parametrize("obj", [5, None, [1], "x", {}, {"type": "user"},
                                 {"type": "assistant", "message": []}])
def test_odd_inputs_get_what_the_python_gives(obj: Any) -> None:
    assert_same(obj)


def test_the_adapter_reads_with_the_c_one() -> None:
    assert cc._kind_data is kernel.kind_data_c
