"""A restricted evaluator for the constraint and derived-value strings of a :class:`~cubicml_lab.Space`.

A space's ``constraints`` and ``derived`` values are short arithmetic strings such as
``"tp * pp <= world_size"`` or ``"world_size // (tp * pp)"``. They are parsed with :mod:`ast` and
compiled into a tree of small closures that understands only:

* numbers, strings, ``True``/``False`` and names of parameters, constants and derived values;
* ``+ - * / // % **``, unary ``-``/``+``/``not``;
* comparisons (``< <= > >= == !=``, chained), ``and``/``or``, ``x if cond else y``;
* calls of ``min``, ``max`` and ``abs`` only.

Anything else (attributes, subscripts, other calls, lambdas, comprehensions, keyword arguments) is
refused when the space is built, with a :class:`~cubicml_lab.errors.SpaceError` naming the
expression and the construct. Python's ``eval`` is never used.

Every expression is bounded, so a hostile or mistyped one is refused in microseconds instead of
stalling the kernel or ending in a bare ``MemoryError``/``RecursionError``:

* when parsed: at most :data:`MAX_SOURCE_CHARS` characters, :data:`MAX_NODES` parts (names,
  numbers, operations) and :data:`MAX_DEPTH` levels of nesting;
* when evaluated: every value, intermediate ones included, is an int of at most
  :data:`MAX_INT_BITS` bits, a float, a bool or a string of at most :data:`MAX_STR_CHARS`
  characters. ``**`` and ``str * int`` are checked *before* they compute; ``str % x`` (string
  formatting) is refused.

Example:
    >>> e = Expr("world_size // (tp * pp)")
    >>> sorted(e.names)
    ['pp', 'tp', 'world_size']
    >>> e.evaluate({"world_size": 8, "tp": 2, "pp": 2})
    2
    >>> Expr("'x' * 10 ** 10").evaluate({})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    cubicml_lab.errors.SpaceError: ... 10,000,000,000 characters, more than the limit ...
      hint: strings are for comparing choices (recompute == 'full'), not for building text
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from .errors import SpaceError

__all__ = ["MAX_DEPTH", "MAX_INT_BITS", "MAX_NODES", "MAX_SOURCE_CHARS", "MAX_STR_CHARS", "Expr",
           "check_value"]

#: Longest expression text, in characters (checked before parsing).
MAX_SOURCE_CHARS = 4_096
#: Most parts (names, numbers, operations, calls) an expression may have.
MAX_NODES = 1_000
#: Deepest nesting of an expression (``a + b + c`` nests 2 levels below the top, ``-(-a)`` 2).
MAX_DEPTH = 100
#: Largest int, in bits, that an expression may hold at any step (2**1024 > the largest float).
MAX_INT_BITS = 1_024
#: Longest string, in characters, that an expression may hold at any step.
MAX_STR_CHARS = 10_000

_SPLIT_HINT = ("split it into derived values (derived={'part': '...'}) and use their names, "
               "or simplify it")
_INT_HINT = ("keep values below 2**1024: compute in floats (2.0 ** n) or in larger units "
             "(GiB rather than bytes)")
_STR_HINT = "strings are for comparing choices (recompute == 'full'), not for building text"

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


class _Refused(Exception):
    """A bound was hit while evaluating; :meth:`Expr.evaluate` turns it into a SpaceError."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


def _show(value: Any) -> str:
    """A short description of ``value`` (a huge int or string is described, not printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an int of {value.bit_length():,} bits"
    if isinstance(value, str) and len(value) > 40:
        return f"a string of {len(value):,} characters"
    return repr(value)


def _bounded(value: Any, what: str = "an intermediate value") -> Any:
    """Return ``value`` if it is a scalar within the size limits, else raise _Refused."""
    if isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise _Refused(f"{what} has {value.bit_length():,} bits, more than the limit "
                           f"MAX_INT_BITS = {MAX_INT_BITS:,}", _INT_HINT)
        return value
    if isinstance(value, str):
        if len(value) > MAX_STR_CHARS:
            raise _Refused(f"{what} has {len(value):,} characters, more than the limit "
                           f"MAX_STR_CHARS = {MAX_STR_CHARS:,}", _STR_HINT)
        return value
    raise _Refused(f"{what} is {_show(value)} ({type(value).__name__}), not a number, string or "
                   "bool", "use real numbers (a negative number ** a fraction is complex)")


def _truth(value: Any, what: str) -> bool:
    """``value`` if it is a bool, else _Refused: ``and``/``or``/``not`` and a condition take
    True or False only (a NaN, a number or a string is not quietly read as true)."""
    if isinstance(value, bool):
        return value
    raise _Refused(f"{what} gave {_show(value)} ({type(value).__name__}), not True or False",
                   "compare it, e.g. 'x > 0' or \"recompute == 'full'\"")


def check_value(value: Any, where: str) -> Any:
    """Check that ``value`` may enter an expression (a constant, a parameter value).

    Args:
        value: The value to check.
        where: What it is, for the message (e.g. ``"constant 'world_size'"``).

    Returns:
        ``value`` itself.

    Raises:
        SpaceError: If it is not an int, float, bool or str, or is larger than the limits.
    """
    try:
        return _bounded(value, "it")
    except _Refused as err:
        raise SpaceError(f"{where}: {err.message}", hint=err.hint) from None


def _safe_pow(base: Any, exp: Any) -> Any:
    """``base ** exp``, refused before computing when an int result would exceed MAX_INT_BITS."""
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1:
        bits = (abs(base).bit_length() - 1) * exp + 1  # a lower bound of the result's bit length
        if bits > MAX_INT_BITS:
            raise _Refused(f"{_show(base)} ** {_show(exp)} is refused: the result would have about "
                           f"{bits:,} bits, more than the limit MAX_INT_BITS = {MAX_INT_BITS:,}",
                           _INT_HINT)
    return base**exp


def _safe_mul(left: Any, right: Any) -> Any:
    """``left * right``, refused before computing when it would repeat a string too often."""
    for text, times in ((left, right), (right, left)):
        if isinstance(text, str) and isinstance(times, int) and len(text) * times > MAX_STR_CHARS:
            raise _Refused(f"{_show(text)} * {_show(times)} would build a string of "
                           f"{len(text) * times:,} characters, more than the limit "
                           f"MAX_STR_CHARS = {MAX_STR_CHARS:,}", _STR_HINT)
    return left * right


def _safe_mod(left: Any, right: Any) -> Any:
    """``left % right`` for numbers only (``str % x`` is string formatting, which is refused)."""
    if isinstance(left, str):
        raise _Refused(f"{_show(left)} % {_show(right)} is string formatting, which is refused",
                       "use % on numbers only")
    return left % right


#: Operators whose result size is checked before they compute (they take precedence over _BINOPS).
_CHECKED: dict[type, Callable[[Any, Any], Any]] = {
    ast.Pow: _safe_pow, ast.Mult: _safe_mul, ast.Mod: _safe_mod}


def _measure(tree: ast.AST) -> tuple[int, int]:
    """Count the expression nodes of ``tree`` and its nesting depth, without recursion."""
    count, depth, stack = 0, 0, [(tree, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, ast.expr):
            count, level = count + 1, level + 1
            depth = max(depth, level)
        stack.extend((child, level) for child in ast.iter_child_nodes(node))
    return count, depth - 1


def _kind(node: ast.AST) -> str:
    """What an expression's top node gives: "bool", "other" (never a bool) or "maybe"."""
    if isinstance(node, (ast.Compare, ast.BoolOp)) or \
            isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return "bool"
    if isinstance(node, ast.Constant):
        return "bool" if isinstance(node.value, bool) else "other"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return "other"
    if isinstance(node, ast.IfExp):
        kinds = {_kind(node.body), _kind(node.orelse)}
        return kinds.pop() if len(kinds) == 1 else "maybe"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "abs":
        return "other"
    return "maybe"


class Expr:
    """A parsed, validated expression over named values.

    Args:
        source: The expression text, e.g. ``"tp * pp <= world_size"``.

    Raises:
        SpaceError: If the text is not a string, does not parse, is longer, larger or deeper than
            the limits (module doc), or uses a construct outside the allowed set.
    """

    def __init__(self, source: str) -> None:
        if not isinstance(source, str) or not source.strip():
            raise SpaceError(
                f"expression {_show(source)} must be a non-empty string",
                hint="write it as text, e.g. 'tp * pp <= world_size'",
            )
        self.source = source.strip()
        shown = self.source if len(self.source) <= 80 else f"{self.source[:60]}..."
        self._quoted = repr(shown)
        tree = self._parse()
        names: set[str] = set()
        self._fn = self._compile(tree.body, names)
        self.names: frozenset[str] = frozenset(names)
        #: "bool" (always True or False), "other" (never: a number or a string) or "maybe" (a
        #: name, ``x if c else y``, ``min``/``max``: known only when evaluated).
        self.result_kind: str = _kind(tree.body)

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"

    def _parse(self) -> ast.Expression:
        """Parse :attr:`source` and check its length, part count and depth against the limits."""
        if len(self.source) > MAX_SOURCE_CHARS:
            raise SpaceError(f"expression {self._quoted} has {len(self.source):,} "
                             f"characters, more than the limit MAX_SOURCE_CHARS = "
                             f"{MAX_SOURCE_CHARS:,}", hint=_SPLIT_HINT)
        try:
            tree = ast.parse(self.source, mode="eval")
        except SyntaxError as err:
            raise SpaceError(
                f"expression {self._quoted} does not parse: {err.msg} at column {err.offset}",
                hint=f"allowed: {_ALLOWED}",
            ) from None
        except (RecursionError, MemoryError):  # the parser's own stack: e.g. 4,000 unary minuses
            raise SpaceError(f"expression {self._quoted} nests too deeply for Python's "
                             f"parser (limit MAX_DEPTH = {MAX_DEPTH})", hint=_SPLIT_HINT) from None
        count, depth = _measure(tree)
        if count > MAX_NODES:
            raise SpaceError(f"expression {self._quoted} has {count:,} parts (names, "
                             f"numbers, operations), more than the limit MAX_NODES = "
                             f"{MAX_NODES:,}", hint=_SPLIT_HINT)
        if depth > MAX_DEPTH:
            raise SpaceError(f"expression {self._quoted} nests {depth:,} levels deep, "
                             f"more than the limit MAX_DEPTH = {MAX_DEPTH}", hint=_SPLIT_HINT)
        return tree

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """Evaluate with ``env`` mapping every name in :attr:`names` to a value.

        Raises:
            SpaceError: On a missing name, division by zero, a value beyond the size limits, a
                type error or an overflow, naming the expression and the values it saw.
        """
        try:
            return self._fn(env)
        except _Refused as err:
            raise SpaceError(f"expression {self._quoted}: {err.message}", hint=err.hint) from None
        except KeyError as err:
            raise SpaceError(
                f"expression {self._quoted} needs {err.args[0]!r}, which has no value",
                hint="define it as a parameter, a constant or an earlier derived value",
            ) from None
        except (ArithmeticError, TypeError, ValueError, RecursionError, MemoryError) as err:
            shown = ", ".join(f"{k}={_show(env[k])}" for k in sorted(self.names) if k in env)
            raise SpaceError(
                f"expression {self._quoted} failed for {shown or 'no names'}: "
                f"{type(err).__name__}: {err}",
                hint="guard it with a constraint or change the expression",
            ) from None

    # -- compilation -------------------------------------------------------------------------
    def _refuse(self, node: ast.AST, what: str) -> SpaceError:
        col = getattr(node, "col_offset", 0) + 1
        return SpaceError(
            f"expression {self._quoted}: {what} at column {col} is not allowed",
            hint=f"allowed: {_ALLOWED}",
        )

    def _compile(self, node: ast.AST, names: set[str]) -> _Node:
        """One closure per node; :meth:`_parse` has bounded the depth of this recursion."""
        if isinstance(node, ast.Constant):
            value = node.value
            if not isinstance(value, (int, float, str, bool)):
                raise self._refuse(node, f"the constant {value!r}")
            try:
                _bounded(value, "the literal")
            except _Refused as err:
                raise SpaceError(f"expression {self._quoted}: {err.message}",
                                 hint=err.hint) from None
            return lambda env: value
        if isinstance(node, ast.Name):
            name = node.id
            written = None if self.source.isascii() else \
                ast.get_source_segment(self.source, node)
            if written is not None and written != name:  # the parser folds names by NFKC
                raise SpaceError(f"expression {self._quoted}: the name {written!r} is read by "
                                 f"Python as {name!r}",
                                 hint=f"write names in ASCII: {name!r}")
            names.add(name)
            return lambda env: _bounded(env[name])
        if isinstance(node, ast.BinOp):
            return self._binop(node, names)
        if isinstance(node, ast.UnaryOp):
            return self._unaryop(node, names)
        if isinstance(node, ast.BoolOp):
            parts = [self._compile(v, names) for v in node.values]
            word = "and" if isinstance(node.op, ast.And) else "or"
            what = f"an operand of {word!r}"
            if word == "and":
                return lambda env: all(_truth(p(env), what) for p in parts)
            return lambda env: any(_truth(p(env), what) for p in parts)
        if isinstance(node, ast.Compare):
            return self._compare(node, names)
        if isinstance(node, ast.IfExp):
            test = self._compile(node.test, names)
            body, orelse = self._compile(node.body, names), self._compile(node.orelse, names)
            return lambda env: body(env) if _truth(test(env), "the condition of 'if'") \
                else orelse(env)
        if isinstance(node, ast.Call):
            return self._call(node, names)
        raise self._refuse(node, f"the construct {type(node).__name__!r}")

    def _binop(self, node: ast.BinOp, names: set[str]) -> _Node:
        left, right = self._compile(node.left, names), self._compile(node.right, names)
        op = _CHECKED.get(type(node.op)) or _BINOPS.get(type(node.op))
        if op is None:
            raise self._refuse(node, f"the operator {type(node.op).__name__}")
        return lambda env: _bounded(op(left(env), right(env)))

    def _unaryop(self, node: ast.UnaryOp, names: set[str]) -> _Node:
        operand = self._compile(node.operand, names)
        if isinstance(node.op, ast.USub):
            return lambda env: -operand(env)
        if isinstance(node.op, ast.UAdd):
            return lambda env: +operand(env)
        if isinstance(node.op, ast.Not):
            return lambda env: not _truth(operand(env), "the operand of 'not'")
        raise self._refuse(node, f"the operator {type(node.op).__name__}")

    def _compare(self, node: ast.Compare, names: set[str]) -> _Node:
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

    def _call(self, node: ast.Call, names: set[str]) -> _Node:
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
