"""Parameter types of a :class:`~cubicml_lab.Space`: what values each knob takes and how it encodes.

Each parameter checks a value (normalising JSON/NumPy scalars: ``4.0`` for an Int becomes ``4``),
lists its values when discrete, draws one uniformly, and encodes to floats for a Gaussian process.
An :class:`Int` never lists its range: its ``values()`` is a lazy ``range`` (length, membership and
index in constant time), so ``Int("x", 0, 10**12)`` samples, checks and encodes as fast as
``Int("x", 0, 10)``. Integer bounds stay within ``±2**53`` (:data:`MAX_INT`), the integers a
float64 encoding holds exactly. The checks of a parameter's arguments (names, bounds, value
lists) are in :mod:`cubicml_lab._param_checks`.

========== ============================== ==========================
type       values                         encoded as
========== ============================== ==========================
Int        low..high                      value (log(value) if log)
PowerOfTwo low, 2*low, ..., high          log2(value)
Ordinal    an ordered list                index in the list
Choice     unordered categories           one-hot, one column each
Bool       False, True                    0 / 1
Float      [low, high]                    value (log(value) if log)
========== ============================== ==========================

Example:
    >>> PowerOfTwo("micro_batch", 1, 16).values()
    [1, 2, 4, 8, 16]
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ._param_checks import (
    MAX_INT,
    MAX_NAME_CHARS,
    MAX_VALUE_CHARS,
    MAX_VALUES,
    as_int,
    brief,
    check_flag,
    check_name,
    check_values,
    finite,
    int_bound,
    scalar,
)
from .errors import SpaceError

__all__ = ["MAX_INT", "MAX_NAME_CHARS", "MAX_VALUES", "MAX_VALUE_CHARS", "PARAM_TYPES", "Bool",
           "Choice", "Float", "Int", "Ordinal", "Parameter", "PowerOfTwo", "brief", "check_name",
           "param_from_dict"]

Scalar = int | float | str | bool


def _index(values: Sequence[Any], value: Any) -> int:
    """Position of ``value`` in ``values``, telling False from 0 and True from 1."""
    for i, v in enumerate(values):
        if type(v) is type(value) and v == value:
            return i
    return values.index(value)  # 4.0 for 4: numbers of another type (check() has normalised)


@dataclass(frozen=True)
class Parameter:
    """Base of every parameter type. ``name`` must be a Python identifier."""

    name: str
    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_name(type(self).__name__, self.name)

    @property
    def is_discrete(self) -> bool:
        return True

    def values(self) -> Sequence[Any]:
        """Every allowed value, in order (a list, or a lazy ``range`` for :class:`Int`)."""
        raise NotImplementedError

    def check(self, value: Any) -> Any:
        """Return ``value`` normalised, or raise SpaceError saying what is allowed."""
        value = scalar(value)
        for allowed in self.values():
            if type(allowed) is type(value) and allowed == value:
                return allowed
            if isinstance(allowed, (int, float)) and not isinstance(allowed, bool) and \
                    isinstance(value, (int, float)) and not isinstance(value, bool) and allowed == value:
                return allowed
        raise SpaceError(f"parameter {self.name!r}: {brief(value)} is not allowed",
                         hint=f"allowed values: {brief(self.values())}")

    def draw(self, rng: random.Random) -> Any:
        return rng.choice(self.values())

    def encoded_names(self) -> list[str]:
        return [self.name]

    def encoded_bounds(self) -> list[tuple[float, float]]:
        return [(0.0, float(len(self.values()) - 1))]

    def encode(self, value: Any) -> list[float]:
        return [float(_index(self.values(), value))]

    def decode(self, row: Sequence[float]) -> Any:
        values = self.values()
        return values[min(max(int(round(float(row[0]))), 0), len(values) - 1)]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind, "name": self.name}
        for key, value in self.__dict__.items():
            if key != "name":
                out[key] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class Int(Parameter):
    """An integer in ``[low, high]``; ``log=True`` encodes it on a log scale (low >= 1)."""

    low: int = 0
    high: int = 1
    log: bool = False
    kind: ClassVar[str] = "int"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "low", int_bound("Int", self.name, "low", self.low))
        object.__setattr__(self, "high", int_bound("Int", self.name, "high", self.high))
        object.__setattr__(self, "log", check_flag("Int", self.name, "log", self.log))
        if self.low > self.high:
            raise SpaceError(f"Int {self.name!r}: low = {self.low} > high = {self.high}",
                             hint="swap the bounds")
        if self.log and self.low < 1:
            raise SpaceError(f"Int {self.name!r}: log=True needs low >= 1, got {self.low}",
                             hint="raise low or drop log=True")

    def values(self) -> range:
        """``range(low, high + 1)``: lazy, so a wide Int is never listed."""
        return range(self.low, self.high + 1)

    def check(self, value: Any) -> int:
        v = as_int(self.name, value)
        if not self.low <= v <= self.high:
            raise SpaceError(f"parameter {self.name!r}: {brief(v)} is outside "
                             f"[{self.low}, {self.high}]",
                             hint=f"choose {self.low} <= {self.name} <= {self.high}")
        return v

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def _f(self, v: float) -> float:
        return math.log(v) if self.log else float(v)

    def encoded_bounds(self) -> list[tuple[float, float]]:
        return [(self._f(self.low), self._f(self.high))]

    def encode(self, value: Any) -> list[float]:
        return [self._f(value)]

    def decode(self, row: Sequence[float]) -> int:
        if not self.log:
            return min(max(int(round(float(row[0]))), self.low), self.high)
        x = min(max(math.exp(min(float(row[0]), 40.0)), self.low), self.high)
        near = {min(max(round(x) + d, self.low), self.high) for d in (-1, 0, 1)}
        # the int whose log is nearest: exact up to ~1e14, past which neighbours share a float log
        return min(near, key=lambda v: (abs(math.log(v) - float(row[0])), v))


@dataclass(frozen=True)
class PowerOfTwo(Parameter):
    """Powers of two from ``low`` to ``high`` (both powers of two), encoded as log2."""

    low: int = 1
    high: int = 1
    kind: ClassVar[str] = "power_of_two"

    def __post_init__(self) -> None:
        super().__post_init__()
        for bound in ("low", "high"):
            v = int_bound("PowerOfTwo", self.name, bound, getattr(self, bound))
            if v < 1 or v & (v - 1):
                raise SpaceError(f"PowerOfTwo {self.name!r}: {bound} = {v} is not a power of two",
                                 hint="use 1, 2, 4, 8, ...")
            object.__setattr__(self, bound, v)
        if self.low > self.high:
            raise SpaceError(f"PowerOfTwo {self.name!r}: low = {self.low} > high = {self.high}",
                             hint="swap the bounds")

    def values(self) -> list[int]:
        return [1 << k for k in range(self.low.bit_length() - 1, self.high.bit_length())]

    def encoded_bounds(self) -> list[tuple[float, float]]:
        return [(math.log2(self.low), math.log2(self.high))]

    def encode(self, value: Any) -> list[float]:
        return [math.log2(value)]

    def decode(self, row: Sequence[float]) -> int:
        k = round(min(max(float(row[0]), math.log2(self.low)), math.log2(self.high)))
        return 1 << k  # clamped before shifting: 1 << 10**300 would not end


@dataclass(frozen=True)
class Ordinal(Parameter):
    """An ordered list of values (e.g. d_model in [512, 768, 1024]), encoded as the index."""

    choices: tuple[Scalar, ...] = field(default=())
    kind: ClassVar[str] = "ordinal"

    def __init__(self, name: str, values: Sequence[Scalar]) -> None:
        check_name("Ordinal", name)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "choices", check_values("Ordinal", name, values))

    def values(self) -> list[Any]:
        return list(self.choices)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "name": self.name, "values": list(self.choices)}


@dataclass(frozen=True)
class Choice(Ordinal):
    """Unordered categories, encoded one-hot (one column per value)."""

    kind: ClassVar[str] = "choice"

    def __init__(self, name: str, values: Sequence[Scalar]) -> None:
        check_name("Choice", name)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "choices", check_values("Choice", name, values))

    def encoded_names(self) -> list[str]:
        return [f"{self.name}={v}" for v in self.choices]

    def encoded_bounds(self) -> list[tuple[float, float]]:
        return [(0.0, 1.0)] * len(self.choices)

    def encode(self, value: Any) -> list[float]:
        idx = _index(self.choices, value)
        return [1.0 if i == idx else 0.0 for i in range(len(self.choices))]

    def decode(self, row: Sequence[float]) -> Any:
        return self.choices[max(range(len(self.choices)), key=lambda i: float(row[i]))]


@dataclass(frozen=True)
class Bool(Parameter):
    """False or True, encoded as 0/1."""

    kind: ClassVar[str] = "bool"

    def values(self) -> list[bool]:
        return [False, True]

    def decode(self, row: Sequence[float]) -> bool:
        return bool(float(row[0]) >= 0.5)


@dataclass(frozen=True)
class Float(Parameter):
    """A real number in ``[low, high]``; ``log=True`` samples and encodes it on a log scale."""

    low: float = 0.0
    high: float = 1.0
    log: bool = False
    kind: ClassVar[str] = "float"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "log", check_flag("Float", self.name, "log", self.log))
        for bound in ("low", "high"):
            v = scalar(getattr(self, bound))
            if not finite(v):
                raise SpaceError(f"Float {self.name!r}: {bound} = {brief(v)} is not a finite "
                                 "number",
                                 hint="give a number")
            object.__setattr__(self, bound, float(v))
        if self.low > self.high:
            raise SpaceError(f"Float {self.name!r}: low = {self.low} > high = {self.high}",
                             hint="swap the bounds")
        if self.log and self.low <= 0:
            raise SpaceError(f"Float {self.name!r}: log=True needs low > 0, got {self.low}",
                             hint="raise low or drop log=True")

    @property
    def is_discrete(self) -> bool:
        return False

    def values(self) -> list[Any]:
        raise SpaceError(f"Float {self.name!r} has no finite list of values",
                         hint="use Ordinal for a fixed list of numbers")

    def check(self, value: Any) -> float:
        v = scalar(value)
        if not finite(v):
            raise SpaceError(f"parameter {self.name!r}: {brief(v)} is not a finite number",
                             hint=f"choose a number in [{self.low}, {self.high}]")
        if not self.low <= v <= self.high:
            raise SpaceError(f"parameter {self.name!r}: {brief(v)} is outside "
                             f"[{self.low}, {self.high}]",
                             hint=f"choose {self.low} <= {self.name} <= {self.high}")
        return float(v)

    def draw(self, rng: random.Random) -> float:
        x = rng.uniform(math.log(self.low), math.log(self.high)) if self.log else \
            rng.uniform(self.low, self.high)
        # exp(log(3.0)) is 3.0000000000000004: clamp, so a draw never falls outside [low, high]
        return min(max(math.exp(x) if self.log else x, self.low), self.high)

    def _f(self, v: float) -> float:
        return math.log(v) if self.log else float(v)

    def encoded_bounds(self) -> list[tuple[float, float]]:
        return [(self._f(self.low), self._f(self.high))]

    def encode(self, value: Any) -> list[float]:
        return [self._f(value)]

    def decode(self, row: Sequence[float]) -> float:
        x = math.exp(row[0]) if self.log else float(row[0])
        return min(max(x, self.low), self.high)


PARAM_TYPES: dict[str, type[Parameter]] = {
    cls.kind: cls for cls in (Int, PowerOfTwo, Ordinal, Choice, Bool, Float)
}


def _fields(cls: type[Parameter]) -> list[str]:
    """The keys a parameter of type ``cls`` takes in its dict form, besides type and name."""
    if issubclass(cls, Ordinal):
        return ["values"]
    return [f.name for f in dataclasses.fields(cls) if f.name != "name"]


def param_from_dict(data: Mapping[str, Any], where: str = "parameter") -> Parameter:
    """Build a parameter from its :meth:`Parameter.to_dict` form.

    Args:
        data: E.g. ``{"type": "int", "name": "micro_batch", "low": 1, "high": 16}``.
        where: How messages name it, e.g. ``"parameters[2]"``.

    Raises:
        SpaceError: On a non-mapping, a missing or unknown type, an unknown key or a bad value,
            naming the field.
    """
    example = "{'type': 'int', 'name': 'micro_batch', 'low': 1, 'high': 16}"
    if not isinstance(data, Mapping):
        raise SpaceError(f"{where} must be a mapping, got {type(data).__name__} {brief(data)}",
                         hint=f"write each parameter as a mapping, e.g. {example}")
    missing = [k for k in ("type", "name") if k not in data]
    if missing:
        raise SpaceError(f"{where} {brief(dict(data))} has no {' or '.join(map(repr, missing))}",
                         hint=f"e.g. {example}; types: {', '.join(PARAM_TYPES)}")
    kind, name = data["type"], data["name"]
    cls = PARAM_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise SpaceError(f"{where} {brief(name)}: unknown type {brief(kind)}",
                         hint=f"types: {', '.join(PARAM_TYPES)}")
    allowed = _fields(cls)
    extra = [k for k in data if k not in ("type", "name", *allowed)]
    if extra:
        raise SpaceError(f"{where} {brief(name)} ({kind}): unknown key(s) "
                         f"{', '.join(map(brief, extra))}",
                         hint=f"a {kind} parameter takes: type, name, {', '.join(allowed)}"
                         if allowed else f"a {kind} parameter takes only type and name")
    try:
        return cls(**{k: v for k, v in data.items() if k != "type"})
    except TypeError as err:  # a required key missing (Ordinal/Choice 'values')
        hint = f"a {kind} parameter takes: type, name, {', '.join(allowed)}"
        raise SpaceError(f"{where} {brief(name)} ({kind}): {err}", hint=hint) from None
