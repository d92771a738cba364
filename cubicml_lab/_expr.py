"""A restricted evaluator for the constraint and derived-value strings of a :class:`~cubicml_lab.Space`.

A space's ``constraints`` and ``derived`` values are short arithmetic strings such as
``"tp * pp <= world_size"`` or ``"world_size // (tp * pp)"``. They are parsed with :mod:`ast` and
compiled into a tree of small closures that understands only:

* numbers, strings, ``True``/``False`` and names of parameters, constants and derived values;
* ``+ - * / // % **`` (exponents limited to :data:`MAX_EXPONENT`), unary ``-``/``+``/``not``;
* comparisons (``< <= > >= == !=``, chained), ``and``/``or``, ``x if cond else y``;
* calls of ``min``, ``max`` and ``abs`` only.

Anything else (attributes, subscripts, other calls, lambdas, comprehensions, keyword arguments) is
refused when the space is built, with a :class:`~cubicml_lab.errors.SpaceError` naming the
expression and the construct. Python's ``eval`` is never used.

Example:
    >>> e = Expr("world_size // (tp * pp)")
    >>> sorted(e.names)
    ['pp', 'tp', 'world_size']
    >>> e.evaluate({"world_size": 8, "tp": 2, "pp": 2})
    2
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from .errors import SpaceError

__all__ = ["MAX_EXPONENT", "Expr"]

#: Largest exponent magnitude accepted by ``**`` (``2 ** 10_000_000`` would stall the kernel).
MAX_EXPONENT = 64
#: Largest base magnitude accepted by ``**`` together with MAX_EXPONENT.
_MAX_POW_BASE = 1 << 64

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}
_ALLOWED = "numbers, names, + - * / // % **, comparisons, and/or/not, 'x if c else y', min/max/abs"

_Node = Callable[[Mapping[str, Any]], Any]


def _safe_pow(base: Any, exp: Any) -> Any:
    if abs(exp) > MAX_EXPONENT or abs(base) > _MAX_POW_BASE:
        raise OverflowError(f"{base!r} ** {exp!r} is refused (|exponent| <= {MAX_EXPONENT})")
    return base**exp


class Expr:
    """A parsed, validated expression over named values.

    Args:
        source: The expression text, e.g. ``"tp * pp <= world_size"``.

    Raises:
        SpaceError: If the text does not parse or uses a construct outside the allowed set.
    """

    def __init__(self, source: str) -> None:
        if not isinstance(source, str) or not source.strip():
            raise SpaceError(
                f"expression {source!r} must be a non-empty string",
                hint="write it as text, e.g. 'tp * pp <= world_size'",
            )
        self.source = source.strip()
        try:
            tree = ast.parse(self.source, mode="eval")
        except SyntaxError as err:
            raise SpaceError(
                f"expression {self.source!r} does not parse: {err.msg} at column {err.offset}",
                hint=f"allowed: {_ALLOWED}",
            ) from None
        self.names: frozenset[str] = frozenset()
        names: set[str] = set()
        self._fn = self._compile(tree.body, names)
        self.names = frozenset(names)

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """Evaluate with ``env`` mapping every name in :attr:`names` to a value.

        Raises:
            SpaceError: On a missing name, division by zero, a refused power or a type error,
                naming the expression and the values it saw.
        """
        try:
            return self._fn(env)
        except KeyError as err:
            raise SpaceError(
                f"expression {self.source!r} needs {err.args[0]!r}, which has no value",
                hint="define it as a parameter, a constant or an earlier derived value",
            ) from None
        except (ZeroDivisionError, OverflowError, TypeError, ValueError) as err:
            shown = ", ".join(f"{k}={env[k]!r}" for k in sorted(self.names) if k in env)
            raise SpaceError(
                f"expression {self.source!r} failed for {shown}: {err}",
                hint="guard it with a constraint or change the expression",
            ) from None

    # -- compilation -------------------------------------------------------------------------
    def _refuse(self, node: ast.AST, what: str) -> SpaceError:
        col = getattr(node, "col_offset", 0) + 1
        return SpaceError(
            f"expression {self.source!r}: {what} at column {col} is not allowed",
            hint=f"allowed: {_ALLOWED}",
        )

    def _compile(self, node: ast.AST, names: set[str]) -> _Node:  # noqa: C901 (one case per node)
        if isinstance(node, ast.Constant):
            value = node.value
            if not isinstance(value, (int, float, str, bool)):
                raise self._refuse(node, f"the constant {value!r}")
            return lambda env: value
        if isinstance(node, ast.Name):
            name = node.id
            names.add(name)
            return lambda env: env[name]
        if isinstance(node, ast.BinOp):
            left, right = self._compile(node.left, names), self._compile(node.right, names)
            if isinstance(node.op, ast.Pow):
                return lambda env: _safe_pow(left(env), right(env))
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise self._refuse(node, f"the operator {type(node.op).__name__}")
            return lambda env: op(left(env), right(env))
        if isinstance(node, ast.UnaryOp):
            operand = self._compile(node.operand, names)
            if isinstance(node.op, ast.USub):
                return lambda env: -operand(env)
            if isinstance(node.op, ast.UAdd):
                return lambda env: +operand(env)
            if isinstance(node.op, ast.Not):
                return lambda env: not operand(env)
            raise self._refuse(node, f"the operator {type(node.op).__name__}")
        if isinstance(node, ast.BoolOp):
            parts = [self._compile(v, names) for v in node.values]
            if isinstance(node.op, ast.And):
                return lambda env: all(p(env) for p in parts)
            return lambda env: any(p(env) for p in parts)
        if isinstance(node, ast.Compare):
            first = self._compile(node.left, names)
            ops = []
            for op_node, comp in zip(node.ops, node.comparators):
                op = _CMPOPS.get(type(op_node))
                if op is None:
                    raise self._refuse(node, f"the comparison {type(op_node).__name__}")
                ops.append((op, self._compile(comp, names)))

            def compare(env: Mapping[str, Any]) -> bool:
                left = first(env)
                for op, right_fn in ops:
                    right = right_fn(env)
                    if not op(left, right):
                        return False
                    left = right
                return True

            return compare
        if isinstance(node, ast.IfExp):
            test = self._compile(node.test, names)
            body, orelse = self._compile(node.body, names), self._compile(node.orelse, names)
            return lambda env: body(env) if test(env) else orelse(env)
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
                shown = node.func.id if isinstance(node.func, ast.Name) else "this"
                raise self._refuse(node, f"calling {shown!r} (only min, max, abs)")
            if node.keywords or not node.args:
                raise self._refuse(node, f"{node.func.id}() with keywords or no arguments")
            if any(isinstance(a, ast.Starred) for a in node.args):
                raise self._refuse(node, "a starred argument")
            func = _FUNCS[node.func.id]
            args = [self._compile(a, names) for a in node.args]
            if func is abs and len(args) != 1:
                raise self._refuse(node, "abs() with more than one argument")
            if func is not abs and len(args) < 2:
                raise self._refuse(node, f"{node.func.id}() with fewer than two arguments")
            return lambda env: func(*(a(env) for a in args))
        raise self._refuse(node, f"the construct {type(node).__name__!r}")
