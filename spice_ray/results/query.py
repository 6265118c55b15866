"""A restricted row filter for result tables: ``metric == 'cumulative_regret' and x == 500``.

``DataFrame.query`` evaluates Python: ``@``-names, attributes and calls reach anything in the
interpreter (``@sys.modules['os'].system(...)``). :func:`filter_rows` parses the expression with
:mod:`ast` and evaluates only this grammar over the table's columns:

* names: the table's columns (a column whose name is not an identifier, such as a sweep
  table's ``fusion.tau``, is written in backticks: ```fusion.tau` == 0.5``);
* literals: strings, numbers, True/False/None, and lists/tuples/sets of them (for ``in``);
* comparisons ``== != < <= > >=`` (chains like ``10 <= x < 50`` too), ``in`` / ``not in``;
* ``and`` / ``or`` / ``not`` (and pandas' ``&`` / ``|`` / ``~``);
* arithmetic ``+ - * / // % **`` and unary ``-``/``+``.

Anything else (calls, attributes, subscripts, lambdas, comprehensions, other names) is refused
before anything is evaluated, with a message naming what was found.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

import numpy as np
import pandas as pd
from pyarrow import ArrowException as ArrowError


class QueryError(ValueError):
    """The filter expression is not in the allowed grammar or does not fit the table."""


_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
            ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
          ast.Pow: operator.pow}
_BOOL_BINOP = {ast.BitAnd: operator.and_, ast.BitOr: operator.or_}
_BACKTICK = re.compile(r"`([^`]*)`")
_MAX_LENGTH = 2000
_MAX_DEPTH = 64
"""The deepest a filter's expression tree may nest (a real filter nests a handful of levels;
1,990 unary minuses exhausted the evaluator's recursion)."""


def _quote_backticks(expr: str) -> tuple[str, dict[str, str]]:
    """Backticked names to placeholder identifiers: (expression, {placeholder: name})."""
    names: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        key = f"__col{len(names)}__"
        names[key] = m.group(1)
        return key

    return _BACKTICK.sub(sub, expr), names


class _Evaluator:
    def __init__(self, df: pd.DataFrame, aliases: dict[str, str]) -> None:
        self.df = df
        self.aliases = aliases

    def visit(self, node: ast.AST) -> Any:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise QueryError(f"{_describe(node)} is not allowed; use column names, literals, "
                             "comparisons, and/or/not, in, and arithmetic")
        return method(node)

    def _Expression(self, node: ast.Expression) -> Any:
        return self.visit(node.body)

    def _Name(self, node: ast.Name) -> pd.Series:
        column = self.aliases.get(node.id, node.id)
        if column not in self.df.columns:
            raise QueryError(f"unknown column {column!r}; columns are {list(self.df.columns)}")
        return self.df[column]

    def _Constant(self, node: ast.Constant) -> Any:
        if node.value is None or isinstance(node.value, (str, int, float, bool)):
            return node.value
        raise QueryError(f"literal {node.value!r} is not allowed")

    def _literal_list(self, node: ast.List | ast.Tuple | ast.Set) -> list[Any]:
        values = []
        for elt in node.elts:
            value = self.visit(elt)
            if isinstance(value, pd.Series | list):
                raise QueryError("a list in the filter may only hold single literals (strings, "
                                 f"numbers, True/False/None): {_text(node)}")
            values.append(value)
        return values

    _List = _Tuple = _Set = _literal_list

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(node.op, (ast.Not, ast.Invert)):
            if isinstance(value, list):
                raise QueryError(f"a list cannot be negated: {_text(node)}")
            return ~_as_bool(value) if isinstance(value, pd.Series) else not value
        if isinstance(node.op, (ast.USub, ast.UAdd)):
            _check_number(node, value)
            return -value if isinstance(node.op, ast.USub) else +value
        raise QueryError(f"operator {type(node.op).__name__} is not allowed")

    def _BoolOp(self, node: ast.BoolOp) -> Any:
        values = [_as_bool(self.visit(v)) for v in node.values]
        combine = operator.and_ if isinstance(node.op, ast.And) else operator.or_
        out = values[0]
        for value in values[1:]:
            out = combine(out, value)
        return out

    def _BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        if type(node.op) in _BOOL_BINOP:
            return _BOOL_BINOP[type(node.op)](_as_bool(left), _as_bool(right))
        op = _ARITH.get(type(node.op))
        if op is None:
            raise QueryError(f"operator {type(node.op).__name__} is not allowed")
        _check_operands(node, left, right)
        try:
            with np.errstate(all="ignore"):
                out = op(left, right)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
            raise QueryError(f"cannot compute {_text(node)}: {exc}") from exc
        _check_result(node, out)
        return out

    def _Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        result: Any = None
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = self.visit(right_node)
            if isinstance(op, (ast.In, ast.NotIn)):
                if not isinstance(right, list):
                    raise QueryError(f"'in' needs a list of literals on its right: "
                                     f"{ast.unparse(right_node)}")
                if not isinstance(left, pd.Series):
                    raise QueryError("'in' needs a column on its left")
                try:
                    part = left.isin(right)
                except (TypeError, ValueError, OverflowError, ArrowError) as exc:
                    raise QueryError(f"cannot test {_text(node)}: {exc}") from exc
                part = ~part if isinstance(op, ast.NotIn) else part
            elif type(op) in _COMPARE:
                if isinstance(left, list) or isinstance(right, list):
                    raise QueryError(f"a list is only allowed on the right of 'in': "
                                     f"{_text(node)}")
                try:
                    with np.errstate(all="ignore"):
                        part = _COMPARE[type(op)](left, right)
                except (TypeError, ValueError, OverflowError, ArrowError) as exc:
                    raise QueryError(f"cannot compare {_text(node)}: {exc}") from exc
            else:
                raise QueryError(f"comparison {type(op).__name__} is not allowed")
            result = part if result is None else result & part
            left = right
        return result


_MAX_INT_BITS = 256
_MAX_EXPONENT = 64


def _text(node: ast.AST) -> str:
    """An expression's source for a message, cut to 120 characters."""
    text = _describe(node).partition(" (")[2][:-1] or type(node).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def _check_number(node: ast.AST, value: Any) -> None:
    """A unary sign needs a number or a numeric column."""
    if isinstance(value, pd.Series):
        if pd.api.types.is_numeric_dtype(value.dtype) and not pd.api.types.is_bool_dtype(
                value.dtype):
            return
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return
    raise QueryError(f"a sign needs a number or a numeric column: {_text(node)}")


def _check_result(node: ast.AST, value: Any) -> None:
    """Arithmetic that stays within bounds: an integer of at most :data:`_MAX_INT_BITS` bits,
    a finite float (an overflow is an error, not an infinity that compares)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        raise QueryError(f"number too large in {_text(node)}")
    if isinstance(value, float) and not np.isfinite(value):
        raise QueryError(f"{_text(node)} is not a finite number")


def _check_operands(node: ast.BinOp, left: Any, right: Any) -> None:
    """Arithmetic on numbers and numeric columns only, with bounded sizes: no string
    repetition, no huge integers, no huge powers (a filter must not exhaust memory or time)."""
    for value in (left, right):
        if isinstance(value, pd.Series):
            if not pd.api.types.is_numeric_dtype(value.dtype) or pd.api.types.is_bool_dtype(
                    value.dtype):
                raise QueryError(f"arithmetic needs numeric columns: {ast.unparse(node)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise QueryError(f"arithmetic needs numbers: {ast.unparse(node)}")
        elif isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
            raise QueryError(f"number too large in {ast.unparse(node)}")
    if isinstance(node.op, ast.Pow) and (isinstance(right, pd.Series)
                                         or abs(right) > _MAX_EXPONENT):
        raise QueryError(f"exponents are limited to literals within +-{_MAX_EXPONENT}: "
                         f"{ast.unparse(node)}")


def _as_bool(value: Any) -> Any:
    if isinstance(value, pd.Series):
        if pd.api.types.is_bool_dtype(value.dtype):
            return value.fillna(False).astype(bool)
        raise QueryError("and/or/not need conditions (comparisons), not plain values")
    return bool(value)


def _describe(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001 - only used to word the error
        text = type(node).__name__
    return f"{type(node).__name__} ({text})"


def parse(expr: str) -> tuple[ast.Expression, dict[str, str]]:
    """Parse ``expr`` (with backtick-quoted column names) into an expression tree.

    Raises:
        QueryError: a syntax error or an over-long expression.
    """
    if len(expr) > _MAX_LENGTH:
        raise QueryError(f"the filter is longer than {_MAX_LENGTH} characters")
    text, aliases = _quote_backticks(expr)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise QueryError(f"cannot parse the filter: {exc.msg}") from exc
    except (RecursionError, MemoryError):
        raise QueryError(f"the filter is nested too deeply (at most {_MAX_DEPTH} levels)"
                         ) from None
    depth = _depth(tree)
    if depth > _MAX_DEPTH:
        raise QueryError(f"the filter is nested {depth} levels deep: at most {_MAX_DEPTH}")
    return tree, aliases


def _depth(tree: ast.AST) -> int:
    """How deeply ``tree`` nests (without recursion: a deep tree must not exhaust the stack)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(node))
    return deepest


def filter_rows(df: pd.DataFrame, expr: str) -> pd.DataFrame:
    """The rows of ``df`` for which ``expr`` holds.

    Raises:
        QueryError: the expression uses anything outside the grammar in the module docstring,
            names an unknown column, or is not a condition.
    """
    tree, aliases = parse(expr)
    mask = _Evaluator(df, aliases).visit(tree)
    if isinstance(mask, (bool, np.bool_)):
        return df if mask else df.iloc[:0]
    if (not isinstance(mask, pd.Series) or len(mask) != len(df)
            or not pd.api.types.is_bool_dtype(mask.dtype)):
        raise QueryError("the filter must be a condition on the rows, e.g. x == 500")
    return df[_as_bool(mask).to_numpy()]


def columns_named(expr: str) -> list[str]:
    """The column names ``expr`` reads, in order of first use (backticked names unquoted)."""
    tree, aliases = parse(expr)
    names = [aliases.get(n.id, n.id) for n in ast.walk(tree) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(n for n in names if n not in ("True", "False", "None")))


def values_hint(df: pd.DataFrame, columns: list[str], limit: int = 8) -> str:
    """What each of ``columns`` holds in ``df``, for a filter that matched nothing: its range
    and count of values for a numeric column with many, else up to ``limit`` values."""
    parts = []
    for col in columns:
        if col not in df.columns:
            continue
        values = pd.unique(df[col].dropna())
        if len(values) == 0:
            parts.append(f"{col} is always missing")
        elif pd.api.types.is_numeric_dtype(df[col]) and len(values) > limit:
            parts.append(f"{col} from {values.min():g} to {values.max():g} ({len(values)} "
                         "values)")
        else:
            shown = sorted(values.tolist(), key=str)[:limit]
            more = f", ... ({len(values)} values)" if len(values) > limit else ""
            parts.append(f"{col} in {{{', '.join(map(repr, shown))}{more}}}")
    return "; ".join(parts)
