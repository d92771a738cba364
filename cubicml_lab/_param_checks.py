"""How a parameter's arguments are checked: knob names, bounds, flags, value lists, and ``brief``.

Every check raises a :class:`~cubicml_lab.errors.SpaceError` that names the parameter, what it
got and what would do. Values are first normalised from NumPy/pandas scalars to plain Python
(:func:`scalar`). Limits: integer bounds within ``±2**53`` (:data:`MAX_INT`), at most
:data:`MAX_VALUES` listed values of at most :data:`MAX_VALUE_CHARS` characters each, names of at
most :data:`MAX_NAME_CHARS` characters. :func:`brief` is the cut-short ``repr`` that every message
of the lab shows a value with.

Example:
    >>> check_name("parameter", "micro_batch")
    'micro_batch'
    >>> check_values("Ordinal", "d_model", [512, 768, 1024])
    (512, 768, 1024)
"""

from __future__ import annotations

import keyword
import math
import reprlib
import unicodedata
from collections.abc import Sequence
from typing import Any

from .errors import SpaceError

__all__ = ["MAX_INT", "MAX_NAME_CHARS", "MAX_VALUES", "MAX_VALUE_CHARS", "as_int", "brief",
           "check_flag", "check_name", "check_values", "finite", "int_bound", "scalar"]

#: Largest magnitude of an Int or PowerOfTwo bound: float64 (the encoding) holds every integer up
#: to 2**53 exactly, and no integer beyond it.
MAX_INT = 2**53
#: Most values an Ordinal or Choice may list.
MAX_VALUES = 100_000
#: Longest string value of an Ordinal or Choice (as an expression's strings).
MAX_VALUE_CHARS = 10_000
#: Longest knob name (parameter, constant, derived value), in characters.
MAX_NAME_CHARS = 100


class _Brief(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:  # repr() itself refuses past 4,300 digits
            return f"<an int of {x.bit_length():,} bits>"
        return super().repr_int(x, level)


_REPR = _Brief()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlong = 40
_REPR.maxlevel = 3


def brief(value: Any) -> str:
    """``repr(value)`` cut short (long strings, big ints, deep or long containers elided).

    Example:
        >>> brief("x" * 1000)
        "'xxxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxxxxxxxxxxxx'"
        >>> brief(10 ** 5000)
        '<an int of 16,610 bits>'
    """
    return _REPR.repr(value)


def finite(value: Any) -> bool:
    """Whether ``value`` is a real number (not a bool) that a float holds finitely."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) <= 2**1023
    return math.isfinite(value)


def scalar(value: Any) -> Any:
    """Plain Python scalar from NumPy/pandas scalars."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def as_int(name: str, value: Any) -> int:
    """``value`` as an int (``4.0`` becomes ``4``), or a SpaceError naming parameter ``name``."""
    value = scalar(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpaceError(f"parameter {name!r}: {brief(value)} is not an integer",
                         hint="give an int")
    if isinstance(value, float):
        if not value.is_integer():
            raise SpaceError(f"parameter {name!r}: {brief(value)} is not an integer",
                             hint="give an int")
        value = int(value)
    return value


def int_bound(kind: str, name: str, which: str, value: Any) -> int:
    """An integer bound (low or high) of an Int or PowerOfTwo, within ±MAX_INT."""
    v = as_int(name, value)
    if abs(v) > MAX_INT:
        raise SpaceError(f"{kind} {name!r}: {which} = {brief(v)} is beyond ±2**53 = ±{MAX_INT:,}, "
                         "the integers the float64 encoding holds exactly",
                         hint="use Float(..., log=True) or count in larger units")
    return v


def check_flag(kind: str, name: str, field_name: str, value: Any) -> bool:
    """``value`` if it is True or False (a NumPy bool included), else a SpaceError."""
    value = scalar(value)
    if not isinstance(value, bool):
        raise SpaceError(f"{kind} {name!r}: {field_name} = {brief(value)} is not True or False",
                         hint=f"write {field_name}=True or {field_name}=False")
    return value


def _name_hint(name: str) -> str:
    """A fix for a refused knob name: its ASCII spelling, a trailing underscore for a keyword."""
    ascii_form = unicodedata.normalize("NFKC", name)
    if keyword.iskeyword(ascii_form) or ascii_form in ("True", "False", "None"):
        return f"use {ascii_form.lower()}_ or a longer name, e.g. 'use_{ascii_form.lower()}'"
    if ascii_form.isascii() and ascii_form.isidentifier():
        return f"use the ASCII spelling {ascii_form!r}"
    return "use ASCII letters, digits and underscores, e.g. 'tp_degree' or 'micro_batch'"


def check_name(kind: str, name: Any) -> str:
    """``name`` if it may name a knob: an ASCII Python identifier, not a keyword, at most
    :data:`MAX_NAME_CHARS` characters.

    ASCII only, because Python's parser (which reads constraints and derived values) folds
    identifiers by NFKC: a constraint on the full-width ``ｔｐ`` would constrain ``tp``.
    Keywords (``if``, ``True``, ``None``) cannot appear as names in an expression.

    Raises:
        SpaceError: Naming the name, with a hint (an ASCII spelling, ``if_`` for ``if``).
    """
    if not isinstance(name, str):
        raise SpaceError(f"{kind} name {brief(name)} is not a string ({type(name).__name__})",
                         hint="use letters, digits and underscores, e.g. 'tp_degree'")
    if len(name) > MAX_NAME_CHARS:
        raise SpaceError(f"{kind} name {brief(name)} has {len(name):,} characters, more than "
                         f"MAX_NAME_CHARS = {MAX_NAME_CHARS}", hint="use a short name, e.g. "
                         "'tp_degree'")
    if not name.isascii() or not name.isidentifier():
        raise SpaceError(f"{kind} name {brief(name)} is not an ASCII Python identifier "
                         "(letters a-z, A-Z, digits and _, not starting with a digit)",
                         hint=_name_hint(name))
    if keyword.iskeyword(name):
        raise SpaceError(f"{kind} name {name!r} is a Python keyword, which an expression "
                         "cannot use as a name", hint=_name_hint(name))
    return name


def check_values(kind: str, name: str, values: Sequence[Any]) -> tuple[Any, ...]:
    """The values of an Ordinal or Choice as a tuple of plain scalars: a non-empty list of at
    most MAX_VALUES finite numbers, short strings or bools, each listed once."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise SpaceError(f"{kind} {name!r}: values must be a non-empty list, got {brief(values)}",
                         hint=f"e.g. {kind}({name!r}, ['a', 'b'])")
    if len(values) > MAX_VALUES:
        raise SpaceError(f"{kind} {name!r}: {len(values):,} values, more than MAX_VALUES = "
                         f"{MAX_VALUES:,}", hint="use Int or Float for a wide range")
    out = tuple(scalar(v) for v in values)
    for v in out:
        _check_value(kind, name, v)
    # 1 and 1.0 are one value (a config may carry either); True and 1 are two
    keys = [("number", v) if isinstance(v, (int, float)) and not isinstance(v, bool)
            else (type(v), v) for v in out]
    if len(set(keys)) != len(keys):
        raise SpaceError(f"{kind} {name!r}: values {brief(list(out))} contain duplicates",
                         hint="list each value once")
    return out


def _check_value(kind: str, name: str, v: Any) -> None:
    """One listed value: a JSON scalar, finite, and small enough for an expression."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 1024 or \
            isinstance(v, str) and len(v) > MAX_VALUE_CHARS:
        raise SpaceError(f"{kind} {name!r}: value {brief(v)} is too large for an expression "
                         f"(ints below 2**1024, strings up to {MAX_VALUE_CHARS:,} "
                         "characters)", hint="list short labels or numbers")
    if not isinstance(v, (int, float, str, bool)):
        raise SpaceError(f"{kind} {name!r}: value {brief(v)} is not a number, string or bool",
                         hint="values are JSON scalars")
    if isinstance(v, float) and not math.isfinite(v):
        raise SpaceError(f"{kind} {name!r}: value {brief(v)} is not a finite number",
                         hint="list finite numbers, strings or bools")
