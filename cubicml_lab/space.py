"""Search spaces: the knobs of a training configuration, their constraints and derived values.

A :class:`Space` is a list of parameters (:class:`Int`, :class:`PowerOfTwo`, :class:`Ordinal`,
:class:`Choice`, :class:`Bool`, :class:`Float`), optional ``constants`` (e.g. the world size),
``derived`` values computed from them (e.g. the data-parallel degree) and ``constraints`` that a valid
configuration satisfies. Constraint and derived strings go through the restricted evaluator in
:mod:`cubicml_lab._expr`, never ``eval``. A space validates itself when it is built, so a mistake
shows up in the notebook cell that defined it.

A space samples uniformly over its valid configurations, enumerates them, counts them, encodes
configurations as a float matrix for a Gaussian process (and decodes back), and round-trips through
YAML and JSON. This module imports no torch; :meth:`Space.encode` imports it when called. Its
parts live in private modules: ``_space_input`` checks the arguments and files, ``_space_rules``
the names and expressions, ``_space_encoding`` maps configurations to columns and back, and
``_space_view`` shows a space as text and as a notebook card.

Example:
    >>> space = Space(
    ...     [PowerOfTwo("tp", 1, 8), PowerOfTwo("pp", 1, 8), Choice("recompute", ["none", "full"])],
    ...     constants={"world_size": 8},
    ...     derived={"dp": "world_size // (tp * pp)"},
    ...     constraints=["tp * pp <= world_size"],
    ... )
    >>> space.size()
    20
    >>> space.resolve({"tp": 2, "pp": 2, "recompute": "none"})["dp"]
    2
"""

from __future__ import annotations

import itertools
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import _space_encoding
from ._bounds import check_count, load_yaml
from ._expr import Expr
from ._params import (
    PARAM_TYPES,
    Bool,
    Choice,
    Float,
    Int,
    Ordinal,
    Parameter,
    PowerOfTwo,
    brief,
    param_from_dict,
)
from ._space_input import (
    MAX_FILE_BYTES,
    MAX_NAMED,
    description_parameters,
    mapping_arg,
    parameter_list,
    parse_file,
    read_text,
    shown_path,
    string_list,
)
from ._space_rules import (
    check_names,
    compile_constraints,
    compile_derived,
    environment,
    first_violated,
    shown_values,
)
from ._space_view import SpaceView
from .errors import SpaceError

if TYPE_CHECKING:
    import numpy as np
    import torch

#: Distinct configurations whose projection and key a space remembers (then it starts afresh).
_PROJECTED_MAX = 1 << 18

__all__ = ["ENUMERATE_LIMIT", "MAX_FILE_BYTES", "MAX_NAMED", "MAX_SAMPLE", "PARAM_TYPES", "Bool",
           "Choice", "Float", "Int",
           "Ordinal", "Parameter", "PowerOfTwo", "Space"]

#: Spaces whose unconstrained product is at most this big are enumerated exactly.
ENUMERATE_LIMIT = 2_000_000
#: Most configurations one :meth:`Space.sample` call draws (a search's pool is a few thousand).
MAX_SAMPLE = 1_000_000


class Space(SpaceView):
    """A set of valid training configurations.

    Args:
        parameters: The knobs to search (a list), each with a unique name that is an ASCII
            Python identifier and not a keyword (Python's parser folds Unicode names by NFKC,
            so ``ｔｐ`` would be read as ``tp``); so are constant and derived names.
        constants: Fixed values usable in expressions and passed to the workload (e.g. world_size).
        derived: ``name -> expression`` computed from parameters, constants and earlier derived
            values, in order (e.g. ``{"dp": "world_size // (tp * pp)"}``).
        constraints: A list of expressions that every valid configuration makes true; each
            gives True or False (a number, a string or NaN is refused, not read as true).

    Raises:
        SpaceError: On an argument of the wrong type (a bare string as ``constraints``, say),
            duplicate or invalid names, bad or oversized expressions (limits in
            :mod:`cubicml_lab._expr`), names an expression does not know, a derived value that
            fails, or constraints that no configuration satisfies.
    """

    def __init__(
        self,
        parameters: Iterable[Parameter],
        constants: Mapping[str, Any] | None = None,
        derived: Mapping[str, str] | None = None,
        constraints: Sequence[str] | None = None,
    ) -> None:
        self.parameters: list[Parameter] = parameter_list(parameters)
        self.names: list[str] = [p.name for p in self.parameters]
        self.constants: dict[str, Any] = mapping_arg("constants", constants, "value",
                                                  "{'world_size': 8}")
        self.derived: dict[str, str] = mapping_arg("derived", derived, "expression",
                                                "{'dp': 'world_size // (tp * pp)'}")
        self.constraints: list[str] = string_list("constraints", constraints)
        self._by_name = {p.name: p for p in self.parameters}
        check_names(self.names, self.constants, self.derived)
        self._derived_exprs: list[tuple[str, Expr]] = compile_derived(
            self.names, self.constants, self.derived)
        self._constraint_exprs: list[Expr] = compile_constraints(
            set(self.names) | set(self.constants) | set(self.derived), self.constraints)
        self._valid: list[dict[str, Any]] | None = None
        self._projected: dict[tuple, tuple[dict[str, Any], str]] = {}
        self._check_satisfiable()

    # -- construction checks ------------------------------------------------------------------
    def _check_satisfiable(self) -> None:
        if not self._constraint_exprs:
            if self._derived_exprs:  # evaluate them once: a broken one fails where it is defined
                import random

                self._env({p.name: p.draw(random.Random(0)) for p in self.parameters})
            return
        if self._enumerable():
            if not self._valid_list():
                raise SpaceError(
                    f"no configuration of the {self._product_size()} in the grid satisfies the "
                    f"constraints {self.constraints}",
                    hint="relax a constraint or widen a parameter's range",
                )
        else:
            self.sample(1, seed=0)  # raises SpaceError when nothing valid is found

    # -- basic facts ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.size()

    def __getitem__(self, name: str) -> Parameter:
        try:
            return self._by_name[name]
        except KeyError:
            raise SpaceError(f"no parameter {name!r}",
                             hint=f"parameters: {', '.join(self.names)}") from None

    @property
    def is_discrete(self) -> bool:
        """True when every parameter takes finitely many values."""
        return all(p.is_discrete for p in self.parameters)

    def _product_size(self) -> float:
        if not self.is_discrete:
            return math.inf
        return math.prod(len(p.values()) for p in self.parameters)

    def _enumerable(self) -> bool:
        return self._product_size() <= ENUMERATE_LIMIT

    # -- configurations ------------------------------------------------------------------------
    def _env(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return environment(self.constants, self._derived_exprs, values)

    def _violated(self, env: Mapping[str, Any]) -> Expr | None:
        return first_violated(self._constraint_exprs, env)

    def project(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The parameter values of ``config``, checked and normalised (ints stay ints, etc.).

        Keys that are constants or derived values are dropped; any other unknown key is an error.

        Raises:
            SpaceError: On a missing or unknown key or a value the parameter does not allow.
        """
        if not isinstance(config, Mapping):
            raise SpaceError(f"a configuration must be a dict, got {type(config).__name__}",
                             hint="e.g. {'micro_batch': 4}")
        extra = set(config) - set(self.names) - set(self.constants) - set(self.derived)
        if extra:
            raise SpaceError(f"configuration has unknown key(s) "
                             f"{', '.join(sorted(map(brief, extra)))}",
                             hint=f"parameters are {self.names}")
        missing = [n for n in self.names if n not in config]
        if missing:
            raise SpaceError(f"configuration is missing parameter(s) {missing}",
                             hint="give every parameter a value (space.sample(1) shows one)")
        return {p.name: p.check(config[p.name]) for p in self.parameters}

    def _projection(self, config: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        """``(project(config), key(config))``, remembered per distinct configuration (its
        items with their types, so ``True`` is not ``1``): a search projects and keys its
        whole history at every ask. The caller must not change the dict it gets."""
        try:
            sig = tuple((k, type(v), v) for k, v in config.items())
            hit = self._projected.get(sig)
        except (TypeError, AttributeError):  # unhashable values, not a mapping: no memory
            values = self.project(config)
            return values, json.dumps(values, sort_keys=True)
        if hit is None:
            values = self.project(config)
            if len(self._projected) >= _PROJECTED_MAX:
                self._projected.clear()
            hit = self._projected[sig] = (values, json.dumps(values, sort_keys=True))
        return hit

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_projected": {}}  # a copy (pickle, processes) starts afresh

    def validate(self, config: Mapping[str, Any]) -> None:
        """Raise :class:`SpaceError` saying why ``config`` is not in the space; else return None."""
        values = self._projection(config)[0]
        env = self._env(values)
        bad = self._violated(env)
        if bad is not None:
            raise SpaceError(f"constraint {brief(bad.source)} is false for "
                             f"{shown_values(bad, env)}",
                             hint="choose values that satisfy every constraint of the space")

    def contains(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` is a valid configuration of this space."""
        try:
            self.validate(config)
        except SpaceError:
            return False
        return True

    def resolve(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Parameters plus constants plus derived values: what a workload receives.

        Example:
            >>> Space([Int("a", 1, 4)], constants={"b": 10}, derived={"c": "a * b"}).resolve({"a": 2})
            {'b': 10, 'a': 2, 'c': 20}
        """
        self.validate(config)
        return self._env(self.project(config))

    def key(self, config: Mapping[str, Any]) -> str:
        """A canonical JSON string of the parameter values, for de-duplication and dict keys."""
        return self._projection(config)[1]

    def _valid_list(self) -> list[dict[str, Any]]:
        if self._valid is None:
            grids = [p.values() for p in self.parameters]
            valid = []
            for combo in itertools.product(*grids):
                values = dict(zip(self.names, combo))
                if not self._constraint_exprs or self._violated(self._env(values)) is None:
                    valid.append(values)
            self._valid = valid
        return self._valid

    def enumerate(self) -> list[dict[str, Any]]:
        """Every valid configuration, in a deterministic (grid) order.

        Raises:
            SpaceError: If a parameter is continuous or the grid is larger than ENUMERATE_LIMIT.
        """
        if not self.is_discrete:
            cont = [p.name for p in self.parameters if not p.is_discrete]
            raise SpaceError(f"cannot enumerate: {cont} are continuous",
                             hint="use space.sample(n) instead")
        if not self._enumerable():
            raise SpaceError(f"the grid has {self._product_size():,} points, more than the "
                             f"{ENUMERATE_LIMIT:,} that are enumerated",
                             hint="use space.sample(n) instead")
        return [dict(c) for c in self._valid_list()]

    def size(self) -> int:
        """The number of valid configurations.

        Raises:
            SpaceError: If the space is continuous, or constrained and too large to count exactly.
        """
        if not self.is_discrete:
            raise SpaceError("a space with Float parameters has infinitely many configurations",
                             hint="use Ordinal or Int parameters to make it countable")
        if self._enumerable():
            return len(self._valid_list())
        if not self._constraint_exprs:
            return int(self._product_size())
        raise SpaceError(f"the constrained grid has {self._product_size():,} points; too many "
                         "to count exactly", hint="estimate with len(space.sample(n)) ratios")

    def sample(self, n: int, seed: int | None = 0) -> list[dict[str, Any]]:
        """``n`` distinct valid configurations drawn uniformly over the valid ones.

        Args:
            n: How many configurations.
            seed: Seed of the random generator (None: fresh randomness).

        Raises:
            SpaceError: If ``n`` exceeds the number of valid configurations, or valid
                configurations are too rare to find by rejection.
        """
        import random

        n = check_count("sample(n)", n, low=0, high=MAX_SAMPLE, error=SpaceError,
                        why="MAX_SAMPLE: draw a pool of a few thousand")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise SpaceError(f"sample(seed={brief(seed)}): the seed must be an int or None",
                             hint="e.g. seed=0")
        rng = random.Random(None if seed is None else int(seed))
        if self.is_discrete and self._enumerable():
            valid = self._valid_list()
            if n > len(valid):
                raise SpaceError(f"cannot draw {n} distinct configurations: the space has "
                                 f"{len(valid)}", hint="use space.enumerate() to get them all")
            return [dict(valid[i]) for i in rng.sample(range(len(valid)), n)]
        if n > self._product_size():
            raise SpaceError(f"cannot draw {n:,} distinct configurations: the grid has "
                             f"{self._product_size():,} points", hint="ask for fewer")
        out: dict[str, dict[str, Any]] = {}
        tries, max_tries = 0, 10_000 + 100 * n
        while len(out) < n:
            if tries >= max_tries:
                raise SpaceError(
                    f"found only {len(out)} of {n} valid configurations in {tries:,} random draws",
                    hint="the constraints exclude almost everything; relax them or narrow the ranges",
                )
            tries += 1
            values = {p.name: p.draw(rng) for p in self.parameters}
            if self._violated(self._env(values)) is None:
                out.setdefault(json.dumps(values, sort_keys=True), values)
        return list(out.values())

    # -- encoding ------------------------------------------------------------------------------
    @property
    def encoded_names(self) -> list[str]:
        """One name per encoded column (Choice parameters take one column per value)."""
        return _space_encoding.encoded_names(self.parameters)

    def encoded_bounds(self) -> np.ndarray:
        """Lower and upper bound of each encoded column, shape (2, d), float64."""
        return _space_encoding.encoded_bounds(self.parameters)

    def encode_array(self, configs: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """Encode configurations as a float64 array of shape (n, d) without importing torch."""
        return _space_encoding.encode_rows(self.parameters,
                                           (self._projection(cfg)[0] for cfg in configs))

    def encode(self, configs: Iterable[Mapping[str, Any]]) -> torch.Tensor:
        """Encode configurations as a float64 tensor of shape (n, d) for a GP.

        Int: value (log(value) if ``log``); PowerOfTwo: log2(value); Ordinal: index; Bool: 0/1;
        Float: value (or log); Choice: one-hot columns.
        """
        import torch

        return torch.from_numpy(self.encode_array(configs))

    def decode(self, X: Any) -> list[dict[str, Any]]:
        """Nearest parameter values for each row of ``X`` (array or tensor of shape (n, d)).

        Each parameter is rounded to its nearest allowed value independently; constraints are not
        enforced (check with :meth:`contains`).
        """
        return _space_encoding.decode_rows(self.parameters, X)

    # -- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON/YAML-ready description of the space."""
        return {"parameters": [p.to_dict() for p in self.parameters],
                "constants": dict(self.constants), "derived": dict(self.derived),
                "constraints": list(self.constraints)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Space:
        """Build a space from :meth:`to_dict` output (or a hand-written YAML/JSON file).

        Raises:
            SpaceError: On anything but a mapping with a 'parameters' list of parameter mappings
                and the optional keys constants, derived and constraints, naming the field.
        """
        params = description_parameters(data)
        try:
            return cls([param_from_dict(d, f"parameters[{i}]") for i, d in enumerate(params)],
                       constants=data.get("constants"), derived=data.get("derived"),
                       constraints=data.get("constraints"))
        except SpaceError:
            raise
        except (TypeError, ValueError, ArithmeticError, RecursionError) as err:  # a safety net
            raise SpaceError(f"the space description is malformed: {type(err).__name__}: {err}",
                             hint="see Space.to_dict() for the format") from None

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write the space as JSON."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2)

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> Space:
        """Read a space written by :meth:`to_json`.

        Raises:
            SpaceError: If the file cannot be read, is larger than MAX_FILE_BYTES, is not UTF-8
                or JSON, or does not describe a space (see :meth:`from_dict`).
        """
        # ValueError: JSONDecodeError, a 5,000-digit number
        return cls._from_file(path, json.loads, "JSON", (ValueError, RecursionError))

    def to_yaml(self, path: str | os.PathLike[str]) -> None:
        """Write the space as YAML."""
        import yaml

        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(self.to_dict(), f, sort_keys=False)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> Space:
        """Read a space from YAML (safe loader only).

        Raises:
            SpaceError: If the file cannot be read, is larger than MAX_FILE_BYTES, is not UTF-8
                or YAML, or does not describe a space (see :meth:`from_dict`).
        """
        def parse(text: str) -> Any:
            return load_yaml(text, what=shown_path(path), error=SpaceError)

        return cls._from_file_data(path, parse(read_text(path)))

    @classmethod
    def _from_file(cls, path: str | os.PathLike[str], parse: Any, what: str,
                   errors: tuple[type[BaseException], ...]) -> Space:
        """Read ``path`` (checked), ``parse`` its text, refuse a parse error, build the space."""
        return cls._from_file_data(path, parse_file(path, parse, what, errors))

    @classmethod
    def _from_file_data(cls, path: str | os.PathLike[str], data: Any) -> Space:
        try:
            return cls.from_dict(data)
        except SpaceError as err:
            raise SpaceError(f"{shown_path(path)}: {err.message}", hint=err.hint) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Space) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]
