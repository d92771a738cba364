"""How a :class:`~cubicml_lab.search.BayesianSearch` is tuned: :class:`BayesianOptions`.

The search's knobs (initial design, acquisition sampling, feasibility, a second objective,
stopping, observed noise, drift) are one frozen record, checked here and only here when it is
built, so a bad value fails in the cell that wrote it; :meth:`BayesianOptions.check_given`
checks what the search is given against them. What the search is *given* (a cost
model, derived features, a memory model, history and its store) stays an argument of the
search: those are functions and tables, not settings. Every field is a plain value, so a
campaign file holds the options as they are (:mod:`cubicml_lab.search.describe`).

Example:
    >>> opts = BayesianOptions(n_init=4, stop_patience=5)
    >>> opts.n_init, opts.mc_samples
    (4, 128)
    >>> opts.changed()
    {'n_init': 4, 'stop_patience': 5}
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from .._bounds import check_count
from .._params import brief
from ..errors import SearchError
from .base import MAX_CANDIDATES

if TYPE_CHECKING:
    from ..space import Space

__all__ = ["BayesianOptions", "default_n_init"]

#: Largest ``n_init`` and ``stop_patience`` (trials).
MAX_N_INIT = 100_000
#: Largest ``mc_samples`` (each draws a posterior sample of every scored candidate).
MAX_MC_SAMPLES = 4_096


def default_n_init(space: Space, pool_size: int | None = None) -> int:
    """Initial-design size: ``min(max(4, d + 1), 8)`` with ``d`` the encoded dimension, and at
    most a tenth of an explicit candidate pool of ``pool_size`` (but at least 3): on a table of
    40 configurations, 8 random trials would already be a fifth of it."""
    n = min(max(4, len(space.encoded_names) + 1), 8)
    return n if pool_size is None else min(n, max(3, pool_size // 10))


@dataclass(frozen=True, kw_only=True)
class BayesianOptions:
    """The tuning knobs of a :class:`~cubicml_lab.search.BayesianSearch`, validated when built.

    ``BayesianSearch(space, options=BayesianOptions(n_init=4))`` and the keyword shorthand
    ``BayesianSearch(space, n_init=4)`` build the same search; a shorthand overrides the field
    of ``options`` it names. :meth:`replace` gives a changed copy.

    Raises:
        SearchError: On a bad value, naming the field, the value and the fix.
    """

    #: Trials (any status) of the space-filling design before the GP takes over, without a
    #: prior; None: :func:`default_n_init` (``min(max(4, d + 1), 8)``, ``d`` = encoded
    #: dimension, and at most a tenth of an explicit candidate pool).
    n_init: int | None = None
    #: Configurations sampled into the pool when the space is too large to enumerate.
    num_candidates: int = 5000
    #: Model ``log(objective)`` (ok values must then be > 0).
    log_objective: bool = True
    #: Quasi-Monte-Carlo samples of the acquisition function.
    mc_samples: int = 128
    #: Pool configurations evaluated per acquisition call (memory vs. speed).
    chunk_size: int = 1024
    #: Weight the acquisition by the probability of running (failures told, memory limit).
    feasibility: bool = True
    #: Device memory per GPU, GiB; the feasibility weight then includes P(peak <= limit).
    memory_limit_gib: float | None = None
    #: Name of the told peak-memory metric (GiB).
    memory_metric: str = "peak_mem_gib"
    #: A second metric to optimise (Pareto search), e.g. ``"peak_mem_gib"``.
    second_objective: str | None = None
    #: Its direction: ``"minimize"`` or ``"maximize"``.
    second_direction: str = "minimize"
    #: Relative expected improvement (0.005 = 0.5 %) under which a BO ask counts as flat.
    stop_threshold: float = 0.005
    #: Flat BO asks in a row after which ``should_stop()`` fires.
    stop_patience: int = 3
    #: A told metric holding each trial's relative spread (e.g. ``"step_time_rel_ci"``);
    #: None reads ``"<objective>_rel_ci"`` and the usual spreads, else infers one noise level.
    noise_metric: str | None = None
    #: Learn how much of the drift reference's slowdown to take out of the objective (needs
    #: ``log_objective``); False fits the stored figures as they are.
    learn_drift: bool = True
    #: Weigh expected improvement against each candidate's predicted price (its told
    #: ``device_s``) where prices differ: cost-cooled EI (:mod:`~cubicml_lab.search.cost`).
    #: Without told prices, or where they differ by less than x1.5, it changes nothing.
    cost_aware: bool = True

    def __post_init__(self) -> None:
        if self.n_init is not None:
            self._set("n_init", check_count("n_init", self.n_init, low=0, high=MAX_N_INIT,
                                            error=SearchError))
        self._set("num_candidates", check_count(
            "num_candidates", self.num_candidates, high=MAX_CANDIDATES, error=SearchError,
            why="MAX_CANDIDATES: every ask scores the whole pool"))
        for name, low, high in (("mc_samples", 1, MAX_MC_SAMPLES),
                                ("chunk_size", 1, MAX_CANDIDATES),
                                ("stop_patience", 1, MAX_N_INIT)):
            self._set(name, check_count(name, getattr(self, name), low=low, high=high,
                                        error=SearchError))
        for name in ("stop_threshold", "memory_limit_gib"):
            v = getattr(self, name)
            number = isinstance(v, (int, float)) and not isinstance(v, bool) and \
                0 < v <= 1e12 and math.isfinite(v)
            if (v is not None or name == "stop_threshold") and not number:
                raise SearchError(f"{name} = {brief(v)} must be a finite number > 0",
                                  hint="e.g. stop_threshold=0.005 (0.5 %), memory_limit_gib=80")
        self._set("stop_threshold", float(self.stop_threshold))
        if self.second_direction not in ("maximize", "minimize"):
            raise SearchError(f"second_direction = {brief(self.second_direction)} is not "
                              "'maximize' or 'minimize'", hint="peak memory is minimised: "
                              "'minimize'")
        for name in ("memory_metric", "second_objective", "noise_metric"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, str) and v and len(v) <= 200):
                raise SearchError(f"{name} = {brief(v)} must be a metric name",
                                  hint="e.g. 'peak_mem_gib' or 'step_time_rel_ci'")
        for name in ("log_objective", "feasibility", "learn_drift", "cost_aware"):
            self._set(name, bool(getattr(self, name)))

    def check_given(self, objective: str, **given: Any) -> None:
        """What a search is given (``cost_model``, ``features``, ``memory_model``, ``history``)
        checked against itself, these options and the search's ``objective``.

        Raises:
            SearchError: Naming the argument and the fix.
        """
        memory_model = given["memory_model"]
        if memory_model is not None and not callable(memory_model):
            raise SearchError(f"memory_model = {brief(memory_model)} is not callable",
                              hint="pass a function config -> predicted peak GiB per GPU, e.g. "
                                   "cml.analytical.LLMTrainingModel(...).memory_gib")
        if memory_model is not None and self.memory_limit_gib is None:
            raise SearchError("memory_model is given but memory_limit_gib is not: the memory "
                              "model's predictions need a device memory to compare with",
                              hint="add memory_limit_gib=80 (GiB per GPU, e.g. an 80 GB H100)")
        if memory_model is not None and not self.feasibility:
            raise SearchError("memory_model needs feasibility=True (it seeds the feasibility "
                              "model)", hint="drop feasibility=False or memory_model")
        for name in ("cost_model", "features", "history"):
            fn = given[name]
            if self.second_objective is not None and fn is not None:
                raise SearchError(f"{name} works with one objective, not with second_objective",
                                  hint="drop one of them")
            if fn is not None and name != "history" and not callable(fn):
                raise SearchError(f"{name} = {brief(fn)} is not callable",
                                  hint="pass a function config -> list of numbers, or None")
        if self.second_objective is not None and self.second_objective == objective:
            raise SearchError(f"second_objective = {brief(self.second_objective)} is the "
                              "objective itself", hint="name another metric, e.g. 'peak_mem_gib'")

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def replace(self, **changes: Any) -> BayesianOptions:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def changed(self) -> dict[str, Any]:
        """The fields that differ from their defaults, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != f.default}

    def as_dict(self) -> dict[str, Any]:
        """Every field as plain data (a campaign file's form)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The field names, in order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def build(cls, options: BayesianOptions | None, shorthands: dict[str, Any]) -> BayesianOptions:
        """``options`` (default: all defaults) with the keyword shorthands filled in.

        Raises:
            SearchError: ``options`` is not a BayesianOptions, or a shorthand names no field.
        """
        if options is not None and not isinstance(options, cls):
            raise SearchError(f"options = {brief(options)} is not a BayesianOptions",
                              hint="pass cml.BayesianOptions(n_init=4, ...)")
        unknown = sorted(set(shorthands) - set(cls.names()))
        if unknown:
            raise SearchError(f"BayesianSearch got unknown option(s) {unknown}",
                              hint=f"its options: {', '.join(cls.names())}")
        base = options if options is not None else cls()
        return dataclasses.replace(base, **shorthands) if shorthands else base

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.changed().items())
        return f"BayesianOptions({shown})"

    def _repr_html_(self) -> str:
        from .._html import card

        changed = self.changed()
        return card("BayesianOptions", [(k, f"{v!r}" + ("" if k in changed else " (default)"))
                                        for k, v in self.as_dict().items()])
