"""The ``--where`` language under generated input: every expression gives a table or one
``QueryError``, never another exception (``spice_ray.results.query``)."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spice_ray.results.query import QueryError, filter_rows

TABLE = pd.DataFrame({
    "method": pd.array(["SPICE", "DPT", "UCB", "SPICE"], dtype="string[pyarrow]"),
    "metric": pd.array(["cumulative_regret"] * 4, dtype="string[pyarrow]"),
    "x": [1, 10, 100, 500], "seed": [0, 1, -1, 2], "value": [0.5, -2.0, 1e300, float("nan")],
    "fusion.tau": [0.3, 0.5, 0.7, 1.0], "flag": [True, False, True, False]})
"""Columns of every kind a result table has: Arrow strings, ints, floats (NaN, huge), a
dotted name and booleans."""

ATOMS = st.one_of(
    st.sampled_from(["method", "metric", "x", "seed", "value", "`fusion.tau`", "flag",
                     "nope", "True", "False", "None", "__import__", "os"]),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.floats(allow_nan=False).map(repr),
    st.text(alphabet="abcSPICE _'\\", max_size=6).map(repr),
)
OPS = ["==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "//", "%", "**", "and", "or",
       "&", "|", "in", "not in", "@", ".", "<<", "is"]


def _expressions() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(OPS), inner).map(" ".join),
            st.tuples(st.sampled_from(["-", "+", "not ", "~"]), inner).map("".join),
            inner.map(lambda e: f"({e})"),
            st.lists(inner, max_size=3).map(lambda es: f"[{', '.join(es)}]"),
            st.tuples(inner, inner).map(lambda p: f"{p[0]}({p[1]})"),
            st.tuples(inner, st.sampled_from(["x", "method"])).map(lambda p: f"{p[0]}[{p[1]}]"),
        )

    return st.recursive(ATOMS, extend, max_leaves=12)


def _one_line(expr: str) -> None:
    try:
        out = filter_rows(TABLE, expr)
    except QueryError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
        return
    assert isinstance(out, pd.DataFrame) and list(out.columns) == list(TABLE.columns)
    assert len(out) <= len(TABLE)


@settings(max_examples=1500, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(_expressions())
def test_generated_expressions_give_a_table_or_one_query_error(expr: str) -> None:
    _one_line(expr)


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.text(max_size=80))
def test_any_text_gives_a_table_or_one_query_error(expr: str) -> None:
    _one_line(expr)


@pytest.mark.parametrize("expr", [
    "(10.0**64)**64 == value", "(2**64)**64 == value", "-'a' == method", "+None == value",
    "-" * 1990 + "1 == x", "not " * 495 + "x == 1", "[1] == value", "method in [(1,(2,3))]",
    "1e308 * 10 > x", "x in [[1]]", "not [1]",
])
def test_the_inputs_that_raised_other_errors_give_one_query_error(expr: str) -> None:
    """Each of these was an OverflowError, TypeError, RecursionError, ValueError or
    ArrowInvalid traceback."""
    with pytest.raises(QueryError):
        filter_rows(TABLE, expr)
