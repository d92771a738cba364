"""The rules of a :class:`~cubicml_lab.space.Space`: its names, constants, derived values and
constraints, checked and compiled when the space is built, and applied to a configuration.

Every parameter, constant and derived value has its own name, an ASCII identifier
(:func:`~cubicml_lab._param_checks.check_name`). A constant is a finite JSON scalar that an
expression can hold. A derived value is an expression over the parameters, the constants and the
derived values before it; a constraint is an expression over all of them that gives True or
False. Expressions go through :class:`~cubicml_lab._expr.Expr`, never ``eval``; a name an
expression does not know is refused with the list of known names.

Example:
    >>> derived = compile_derived(["tp"], {"world_size": 8}, {"dp": "world_size // tp"})
    >>> environment({"world_size": 8}, derived, {"tp": 2})
    {'world_size': 8, 'tp': 2, 'dp': 4}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ._expr import Expr, check_value
from ._params import brief, check_name
from .errors import SpaceError

__all__ = ["check_names", "compile_constraints", "compile_derived", "environment",
           "first_violated", "shown_values"]


def check_names(names: Sequence[str], constants: Mapping[str, Any],
                derived: Mapping[str, Any]) -> None:
    """Refuse a name that is invalid or used twice, a constant that is not a finite JSON scalar
    an expression can hold, and a derived value that is not a string."""
    seen: dict[str, str] = {}
    groups = [("parameter", list(names)), ("constant", list(constants)),
              ("derived value", list(derived))]
    for kind, group in groups:
        for name in group:
            check_name(kind, name)
            if name in seen:
                raise SpaceError(f"name {name!r} is used twice (as {seen[name]} and {kind})",
                                 hint="give every parameter, constant and derived value its own name")
            seen[name] = kind
    for name, value in constants.items():
        _check_constant(name, value)
    for name, source in derived.items():
        if not isinstance(source, str):
            raise SpaceError(f"derived value {name!r} = {brief(source)} is not a string",
                             hint=f"write it as an expression, e.g. derived={{{name!r}: "
                             "'world_size // (tp * pp)'}")


def _check_constant(name: str, value: Any) -> None:
    if not isinstance(value, (int, float, str, bool)):
        raise SpaceError(f"constant {name!r} = {brief(value)} is not a number, string or "
                         "bool", hint="constants are JSON scalars")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpaceError(f"constant {name!r} = {value!r} is not a finite number",
                         hint="constants are JSON scalars: give a finite number")
    check_value(value, f"constant {name!r}")


def _refuse_unknown(expr: Expr, known: set[str], where: str) -> None:
    missing = sorted(expr.names - known)
    if missing:
        raise SpaceError(
            f"{where} {brief(expr.source)} uses unknown name(s) "
            f"{', '.join(map(repr, missing))}",
            hint=f"known names: {', '.join(sorted(known))}",
        )


def compile_derived(names: Sequence[str], constants: Mapping[str, Any],
                    derived: Mapping[str, str]) -> list[tuple[str, Expr]]:
    """``(name, expression)`` of each derived value, in order; each may use the parameters, the
    constants and the derived values before it."""
    known = set(names) | set(constants)
    out = []
    for name, source in derived.items():
        expr = Expr(source)
        _refuse_unknown(expr, known, f"derived value {name!r} =")
        out.append((name, expr))
        known.add(name)
    return out


def compile_constraints(known: set[str], constraints: Sequence[str]) -> list[Expr]:
    """Each constraint compiled; it may use only ``known`` names and must give True or False."""
    out = []
    for source in constraints:
        expr = Expr(source)
        _refuse_unknown(expr, known, "constraint")
        if expr.result_kind == "other":
            raise SpaceError(f"constraint {brief(expr.source)} gives a number or a string, "
                             "not True or False", hint="write a comparison, e.g. "
                             "'world_size % (tp * pp) == 0' rather than 'world_size % (tp "
                             "* pp)'")
        out.append(expr)
    return out


def environment(constants: Mapping[str, Any], derived: Sequence[tuple[str, Expr]],
                values: Mapping[str, Any]) -> dict[str, Any]:
    """The constants, then the parameter ``values``, then each derived value computed in order."""
    env = dict(constants)
    env.update(values)
    for name, expr in derived:
        env[name] = expr.evaluate(env)
    return env


def shown_values(expr: Expr, env: Mapping[str, Any]) -> str:
    """``a=1, b=2``: the values of the names ``expr`` uses, for a message."""
    return ", ".join(f"{n}={brief(env[n])}" for n in sorted(expr.names))


def first_violated(constraints: Sequence[Expr], env: Mapping[str, Any]) -> Expr | None:
    """The first constraint that is false in ``env``, or None when all hold.

    Raises:
        SpaceError: If a constraint gives something other than True or False.
    """
    for expr in constraints:
        result = expr.evaluate(env)
        if not isinstance(result, bool):
            raise SpaceError(f"constraint {brief(expr.source)} gave {brief(result)} "
                             f"({type(result).__name__}) for "
                             f"{shown_values(expr, env) or 'no names'}, not True or False",
                             hint="write a comparison, e.g. 'flag == True' or 'x > 0'")
        if not result:
            return expr
    return None
