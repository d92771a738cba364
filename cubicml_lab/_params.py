"""Parameter types of a :class:`~cubicml_lab.Space`: what values each knob takes and how it encodes.

Each parameter checks a value (normalising JSON/NumPy scalars: ``4.0`` for an Int becomes ``4``),
lists its values when discrete, draws one uniformly, and encodes to floats for a Gaussian process:

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

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import SpaceError

__all__ = ["PARAM_TYPES", "Bool", "Choice", "Float", "Int", "Ordinal", "Parameter", "PowerOfTwo",
           "param_from_dict"]

Scalar = int | float | str | bool


def _scalar(value: Any) -> Any:
    """Plain Python scalar from NumPy/pandas scalars."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def _as_int(name: str, value: Any) -> int:
    value = _scalar(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpaceError(f"parameter {name!r}: {value!r} is not an integer", hint="give an int")
    if isinstance(value, float):
        if not value.is_integer():
            raise SpaceError(f"parameter {name!r}: {value!r} is not an integer", hint="give an int")
        value = int(value)
    return value


@dataclass(frozen=True)
class Parameter:
    """Base of every parameter type. ``name`` must be a Python identifier."""

    name: str
    kind: ClassVar[str] = ""

    @property
    def is_discrete(self) -> bool:
        return True

    def values(self) -> list[Any]:
        """Every allowed value, in order."""
        raise NotImplementedError

    def check(self, value: Any) -> Any:
        """Return ``value`` normalised, or raise SpaceError saying what is allowed."""
        value = _scalar(value)
        for allowed in self.values():
            if type(allowed) is type(value) and allowed == value:
                return allowed
            if isinstance(allowed, (int, float)) and not isinstance(allowed, bool) and \
                    isinstance(value, (int, float)) and not isinstance(value, bool) and allowed == value:
                return allowed
        raise SpaceError(f"parameter {self.name!r}: {value!r} is not allowed",
                         hint=f"allowed values: {self.values()}")

    def draw(self, rng: random.Random) -> Any:
        return rng.choice(self.values())

    def encoded_names(self) -> list[str]:
        return [self.name]

    def encoded_bounds(self) -> list[tuple[float, float]]:
        return [(0.0, float(len(self.values()) - 1))]

    def encode(self, value: Any) -> list[float]:
        return [float(self.values().index(value))]

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
        object.__setattr__(self, "low", _as_int(self.name, self.low))
        object.__setattr__(self, "high", _as_int(self.name, self.high))
        if self.low > self.high:
            raise SpaceError(f"Int {self.name!r}: low = {self.low} > high = {self.high}",
                             hint="swap the bounds")
        if self.log and self.low < 1:
            raise SpaceError(f"Int {self.name!r}: log=True needs low >= 1, got {self.low}",
                             hint="raise low or drop log=True")

    def values(self) -> list[int]:
        return list(range(self.low, self.high + 1))

    def check(self, value: Any) -> int:
        v = _as_int(self.name, value)
        if not self.low <= v <= self.high:
            raise SpaceError(f"parameter {self.name!r}: {v} is outside [{self.low}, {self.high}]",
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
        x = math.exp(row[0]) if self.log else row[0]
        return min(max(int(round(float(x))), self.low), self.high)


@dataclass(frozen=True)
class PowerOfTwo(Parameter):
    """Powers of two from ``low`` to ``high`` (both powers of two), encoded as log2."""

    low: int = 1
    high: int = 1
    kind: ClassVar[str] = "power_of_two"

    def __post_init__(self) -> None:
        for bound in ("low", "high"):
            v = _as_int(self.name, getattr(self, bound))
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
        k = int(round(float(row[0])))
        return min(max(1 << max(k, 0), self.low), self.high)


def _check_values(kind: str, name: str, values: Sequence[Any]) -> tuple[Any, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise SpaceError(f"{kind} {name!r}: values must be a non-empty list, got {values!r}",
                         hint=f"e.g. {kind}({name!r}, ['a', 'b'])")
    out = tuple(_scalar(v) for v in values)
    for v in out:
        if not isinstance(v, (int, float, str, bool)):
            raise SpaceError(f"{kind} {name!r}: value {v!r} is not a number, string or bool",
                             hint="values are JSON scalars")
    keys = [(type(v), v) for v in out]
    if len(set(keys)) != len(keys):
        raise SpaceError(f"{kind} {name!r}: values {list(out)} contain duplicates",
                         hint="list each value once")
    return out


@dataclass(frozen=True)
class Ordinal(Parameter):
    """An ordered list of values (e.g. d_model in [512, 768, 1024]), encoded as the index."""

    choices: tuple[Scalar, ...] = field(default=())
    kind: ClassVar[str] = "ordinal"

    def __init__(self, name: str, values: Sequence[Scalar]) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "choices", _check_values("Ordinal", name, values))

    def values(self) -> list[Any]:
        return list(self.choices)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "name": self.name, "values": list(self.choices)}


@dataclass(frozen=True)
class Choice(Ordinal):
    """Unordered categories, encoded one-hot (one column per value)."""

    kind: ClassVar[str] = "choice"

    def __init__(self, name: str, values: Sequence[Scalar]) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "choices", _check_values("Choice", name, values))

    def encoded_names(self) -> list[str]:
        return [f"{self.name}={v}" for v in self.choices]

    def encoded_bounds(self) -> list[tuple[float, float]]:
        return [(0.0, 1.0)] * len(self.choices)

    def encode(self, value: Any) -> list[float]:
        idx = [i for i, v in enumerate(self.choices) if type(v) is type(value) and v == value][0]
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
        for bound in ("low", "high"):
            v = _scalar(getattr(self, bound))
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SpaceError(f"Float {self.name!r}: {bound} = {v!r} is not a finite number",
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
        v = _scalar(value)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SpaceError(f"parameter {self.name!r}: {v!r} is not a finite number",
                             hint=f"choose a number in [{self.low}, {self.high}]")
        if not self.low <= v <= self.high:
            raise SpaceError(f"parameter {self.name!r}: {v} is outside [{self.low}, {self.high}]",
                             hint=f"choose {self.low} <= {self.name} <= {self.high}")
        return float(v)

    def draw(self, rng: random.Random) -> float:
        if self.log:
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)

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


def param_from_dict(data: Mapping[str, Any]) -> Parameter:
    """Build a parameter from its :meth:`Parameter.to_dict` form."""
    if not isinstance(data, Mapping) or "type" not in data or "name" not in data:
        raise SpaceError(f"parameter description {data!r} needs 'type' and 'name'",
                         hint=f"types: {', '.join(PARAM_TYPES)}")
    kind = data["type"]
    cls = PARAM_TYPES.get(kind)
    if cls is None:
        raise SpaceError(f"parameter {data['name']!r}: unknown type {kind!r}",
                         hint=f"types: {', '.join(PARAM_TYPES)}")
    kwargs = {k: v for k, v in data.items() if k != "type"}
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise SpaceError(f"parameter {data['name']!r} ({kind}): {err}",
                         hint="see Parameter.to_dict() for the fields of each type") from None
