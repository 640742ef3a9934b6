"""Rows to tables (pipeline/tables/schemas.py): the columns the C kernel builds are
pyarrow's, for any row (docs/scaling.md, "Tables built in C")."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pipeline.audit.session import audit_session
from pipeline.ledger import kernel
from pipeline.tables import schemas
from pipeline.tables.schemas import built_columns, rows_table, usage_table
from tests.helpers.ledgers import sample_session, session_key

needs_c = pytest.mark.skipif(kernel.columns_c is None, reason="the C kernel did not build here")


class Text(str):
    """A str subclass: pyarrow converts it, the kernel leaves it to pyarrow."""


def pyarrows(rows: list[tuple[Any, ...]], record: pa.StructType) -> list[pa.Array] | str:
    """What pyarrow makes of ``rows``: its columns, or the name of what it raised."""
    try:
        return list(pa.array(rows, type=record).flatten())
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
        return type(err).__name__


def ours(rows: list[tuple[Any, ...]], record: pa.StructType) -> list[pa.Array] | str:
    """The kernel's columns, or pyarrow's where it leaves them."""
    made = built_columns(rows, record)
    return pyarrows(rows, record) if made is None else made


def assert_alike(got: list[pa.Array] | str, want: list[pa.Array] | str) -> None:
    if isinstance(want, str):
        assert got == want
        return
    assert not isinstance(got, str), got
    for column, expected in zip(got, want, strict=True):
        column.validate(full=True)
        assert column.type == expected.type
        assert column.null_count == expected.null_count
        assert column.to_pylist() == expected.to_pylist()
        assert column.equals(expected)


INT32, INT64 = 2**31, 2**63
#: Values a column of each type holds as it is.
FITTING = {
    pa.string(): st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["", "é", "😀"])),
    pa.int32(): st.one_of(st.none(), st.integers(-INT32, INT32 - 1)),
    pa.int64(): st.one_of(st.none(), st.integers(-INT64, INT64 - 1)),
    pa.bool_(): st.one_of(st.none(), st.booleans()),
}
#: Anything else, which the kernel leaves to pyarrow: a subclass, a lone surrogate, an
#: int past its column, a bool where an int goes, an int where a bool goes, a float.
ODD = st.one_of(st.builds(Text, st.text(max_size=4)), st.just("\ud800"),
                st.sampled_from([INT32, -INT32 - 1, INT64, -INT64 - 1, 2**70]),
                st.booleans(), st.integers(-2, 2), st.floats(allow_nan=False),
                st.binary(max_size=3))


def records() -> st.SearchStrategy[pa.StructType]:
    """Small struct types of the four column types."""
    return st.lists(st.sampled_from(list(FITTING)), min_size=1, max_size=5).map(
        lambda types: pa.struct([(f"f{i}", t) for i, t in enumerate(types)]))


@st.composite
def table_rows(draw: st.DrawFn) -> tuple[pa.StructType, list[tuple[Any, ...]]]:
    """A struct type and rows of it: every value fitting its column, or (half the
    cases) one in ~30 of any other kind."""
    record = draw(records())
    odd = draw(st.booleans())

    def value(kind: pa.DataType) -> Any:
        return draw(ODD if odd and draw(st.integers(0, 29)) == 0 else FITTING[kind])
    return record, [tuple(value(f.type) for f in record)
                    for _ in range(draw(st.integers(0, 40)))]


@needs_c
@given(table_rows())
@settings(max_examples=400)
def test_the_columns_of_any_rows_are_pyarrows(case: tuple[pa.StructType, list[Any]]) -> None:
    record, rows = case
    kinds = "".join(schemas._kind(f.type) for f in record).encode()
    event("kernel" if kernel.columns_c is not None and kernel.columns_c(rows, kinds) is not None
          else "pyarrow")
    assert_alike(ours(rows, record), pyarrows(rows, record))


@needs_c
def test_the_kernel_builds_the_columns_of_rows_of_fitting_values() -> None:
    rows = [("a", 1, 2**40, True), (None, None, None, None), ("ünï", -(2**31), -1, False),
            ("", 2**31 - 1, 2**63 - 1, None)]
    record = pa.struct([("s", pa.string()), ("i", pa.int32()), ("l", pa.int64()),
                        ("b", pa.bool_())])
    assert kernel.columns_c is not None and kernel.columns_c(rows, b"silb") is not None
    assert_alike(built_columns(rows, record) or [], pyarrows(rows, record))
    assert_alike(built_columns([], record) or [], pyarrows([], record))


@needs_c
@pytest.mark.parametrize("rows", [[("a", 1)], [["a", 1, True]], [("a", 1, True, None)], ("x",)])
def test_rows_of_another_shape_are_left_to_pyarrow(rows: Any) -> None:
    columns_c = kernel.columns_c
    assert columns_c is not None
    if not isinstance(rows, list):
        with pytest.raises(TypeError):
            columns_c(rows, b"sib")
        return
    assert columns_c(rows, b"sib") is None


@needs_c
def test_the_kernel_builds_the_columns_of_dict_rows_by_name() -> None:
    schema = pa.schema([("s", pa.string()), ("n", pa.int64()),
                        ("t", pa.timestamp("ns", tz="UTC"))])
    rows = [{"s": "a", "n": 1, "t": 10**18, "other": [1]}, {"n": None}, {}]
    assert built_columns(rows, schema) is not None
    assert rows_table(rows, schema).equals(pa.Table.from_pylist(rows, schema=schema))
    assert kernel.columns_c is not None
    assert kernel.columns_c([{"s": 1}], b"s", ("s",)) is None
    assert kernel.columns_c([("a",)], b"s", ("s",)) is None  # a tuple where dicts go
    with pytest.raises(TypeError):
        kernel.columns_c([{}], b"s", ("s", "t"))


@needs_c
def test_a_kind_the_kernel_does_not_know_is_an_error() -> None:
    assert kernel.columns_c is not None
    with pytest.raises(ValueError, match="a kind is one of"):
        kernel.columns_c([], b"sx")
    with pytest.raises(TypeError):
        kernel.columns_c([], b"s" * 65)


def test_the_usage_table_is_the_same_without_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    def audits() -> list[Any]:
        # Rows of a message without a receipt (billed, its own usage) and of receipts.
        return [audit_session(session_key(f"s{turns}"),
                              sample_session(turns=turns).physical()) for turns in (1, 3)]
    with_kernel = usage_table(audits())
    monkeypatch.setattr(schemas, "columns_c", None)
    without = usage_table(audits())
    assert with_kernel.num_rows > 0
    assert with_kernel.equals(without)


def test_a_column_type_the_kernel_does_not_build_is_left_to_pyarrow() -> None:
    record = pa.struct([("s", pa.string()), ("d", pa.float64())])
    assert built_columns([("a", 1.5), (None, None)], record) is None


@given(table_rows())
@settings(max_examples=200)
def test_a_table_of_any_dict_rows_is_the_same_without_the_kernel(
        case: tuple[pa.StructType, list[Any]]) -> None:
    record, rows = case
    schema = pa.schema(list(record))
    # Dict rows as the stages make them: a None is sometimes a missing key.
    dicts = [{f.name: v for f, v in zip(record, row, strict=True)
              if v is not None or i % 2} for i, row in enumerate(rows)]

    def table() -> pa.Table | str:
        try:
            return rows_table(dicts, schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
            return type(err).__name__  # a lone surrogate, either way
    with_kernel = table()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(schemas, "columns_c", None)
        without = table()
    if isinstance(without, str):
        assert with_kernel == without
        return
    assert isinstance(with_kernel, pa.Table)
    with_kernel.validate(full=True)
    assert with_kernel.equals(without)
