"""Predictor-guided search, the CubicML paper's loop: fit a speed predictor, launch its top-k.

:class:`PredictorGuidedSearch` is the baseline after CubicML (Wen et al., Meta, 2024): measure a few
configurations, fit a cheap regression model of the objective on every ok trial so far (by
default an ensemble :class:`~cubicml_lab.surrogate.MLPPredictor` on ``log(objective)``), let a
proposer search the space *on the predictor*, and launch the configurations with the best
predicted values. It runs in two phases.

1. **Initial**: until ``n_init`` ok observations exist, configurations are drawn uniformly from
   the untried pool (as :class:`~cubicml_lab.search.RandomSearch` does).
2. **Guided**: a fresh predictor from ``predictor_factory`` is fitted on the ok observations and a
   proposer returns the ``n`` untried configurations with the best predicted objective (highest
   when maximising, lowest when minimising): pure exploitation, no uncertainty bonus, as the
   paper launches the predictor's top-k.

Proposers (``proposer=``):

* ``"exhaustive"``: predict every configuration of the untried pool and take the top ``n``.
* ``"evolution"`` (default): the same when the pool holds at most ``exhaustive_limit``
  configurations (the exact top-k is cheap there); otherwise batched regularised evolution (Real et
  al., 2019) with the predicted objective as fitness. The population starts from the best told
  ok configurations and random untried pool configurations; each generation picks parents by
  tournament, optionally crosses two of them over (each parameter from either parent), mutates
  one or two parameters (to the next value up or down of an ordered parameter or to any other
  allowed value; a new draw for a Float), keeps the children that are valid and untried, and
  drops the oldest members. With explicit ``candidates`` a child must be one of them; otherwise
  any valid configuration of the space may be proposed, also outside a sampled pool. The answer
  is the top ``n`` of every untried configuration scored along the way.

Where this differs from the paper: there the predictor is trained with a (margin) ranking loss
and the searcher is a REINFORCE policy whose samples the predictor scores; here the predictor is
the regression ensemble shared with the rest of the library, and the proposer is an evolutionary
search (or exhaustive scoring), which needs no policy training.

Failed trials (oom, failed, timeout) do not enter the predictor (a made-up value would distort
the regression); they are only never proposed again. If the predictor cannot be fitted (fewer than
2 distinct ok configurations, all ok values identical, or a
:class:`~cubicml_lab.errors.PredictorError`) that ask draws at random, and
:attr:`~PredictorGuidedSearch.last_ask_info` says why.

Known weakness (it is a baseline): pure top-k exploitation has no exploration bonus, so an early
wrong belief can stick, e.g. a categorical value that was only ever measured in a poor region is
not tried again in the good one until the predictor's favourites there are used up.

Determinism: every random choice (initial draws, the predictor's seed, evolution) comes from the
``rng`` that :class:`~cubicml_lab.search.Searcher` seeds from ``(seed, n_told)``, so a searcher told
the same history proposes the same configurations. Importing this module does not import torch.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._bounds import check_count
from .._params import brief
from ..errors import PredictorError, SearchError
from ..space import Int
from .base import Searcher
from .bayesian import default_n_init

if TYPE_CHECKING:
    from ..space import Space

__all__ = ["PROPOSERS", "PredictorGuidedSearch"]

#: What proposes configurations from the fitted predictor (module doc).
PROPOSERS = ("evolution", "exhaustive")
#: Full-batch Adam steps and learning rate of the default MLP ensemble: a fit of 100 trials takes
#: ~0.5 s on one busy CPU core; on a smooth test problem it searches as well as 300 steps at 3e-3.
DEFAULT_EPOCHS = 150
DEFAULT_LR = 1e-2
#: Parents are the best of this many population members drawn at random.
TOURNAMENT_SIZE = 4


#: Largest ``n_init``, ``exhaustive_limit``, ``population`` and ``generations``: each bounds
#: the predictor's fits or scoring.
MAX_GUIDED_ARG = 1_000_000


def _int_arg(name: str, value: Any, low: int, example: str) -> int:
    return check_count(name, value, low=low, high=MAX_GUIDED_ARG, error=SearchError)


class PredictorGuidedSearch(Searcher):
    """CubicML-style search: fit a predictor of the objective, launch its predicted top-k.

    Args:
        space, objective, direction, candidates, seed, num_candidates: as :class:`Searcher`.
        n_init: Ok observations to collect by random sampling before the predictor is used
            (default :func:`~cubicml_lab.search.bayesian.default_n_init`).
        predictor_factory: Builds an unfitted predictor (``fit(configs, values)``,
            ``predict(configs) -> (mean, std)`` in objective units), called once per guided ask,
            like the factories of :func:`~cubicml_lab.surrogate.evaluate_predictor`. Default: an
            :class:`~cubicml_lab.surrogate.MLPPredictor` with ``epochs=DEFAULT_EPOCHS`` and
            ``lr=DEFAULT_LR``, seeded from the search's random stream.
        proposer: "evolution" (default) or "exhaustive" (module doc).
        log_objective: Ok values must be > 0 (default), and the default predictor models
            ``log(objective)``. Pass False for objectives that can be <= 0.
        exhaustive_limit: With "evolution", pools of at most this many untried configurations
            are scored whole instead.
        population: Evolution population size.
        generations: Evolution generations (each breeds ``population // 2`` children).
        crossover: Probability that a child mixes two parents before it is mutated, in [0, 1].

    Attributes:
        last_ask_info: What the last proposing ask did: ``phase`` ("initial", "guided" or
            "fallback"), ``reason``, ``proposer`` ("random", "exhaustive" or "evolution"),
            ``fit_s`` and ``ask_s`` (seconds), ``n_ok``, ``n_pool`` (untried pool
            configurations), ``n_scored`` (configurations the predictor scored) and
            ``predicted`` (the predicted objective of each pick, objective units; empty unless
            guided).
        predictor: The predictor fitted at the last guided ask, or None.

    Raises:
        SearchError: On a bad argument, naming it and a valid value.

    Example:
        >>> from cubicml_lab.space import Space, PowerOfTwo, Bool
        >>> space = Space([PowerOfTwo("micro_batch", 1, 64), Bool("compile")])
        >>> s = PredictorGuidedSearch(space, seed=0, n_init=4)
        >>> for _ in range(3):
        ...     for cfg in s.ask(2):
        ...         s.tell(cfg, {"throughput": cfg["micro_batch"] * (2.0 if cfg["compile"] else 1)})
        >>> s.last_ask_info["phase"], s.last_ask_info["n_ok"]
        ('guided', 4)
    """

    def __init__(self, space: Space, objective: str = "throughput", direction: str = "maximize",
                 candidates: Sequence[dict] | None = None, seed: int = 0,
                 n_init: int | None = None, num_candidates: int = 5000, *,
                 predictor_factory: Callable[[], Any] | None = None,
                 proposer: str = "evolution", log_objective: bool = True,
                 exhaustive_limit: int = 4096, population: int = 64, generations: int = 20,
                 crossover: float = 0.5) -> None:
        super().__init__(space, objective, direction, candidates, seed,
                         num_candidates=num_candidates)
        pool = None if self._candidates is None else len(self._candidates)
        self.n_init = _int_arg("n_init", default_n_init(space, pool) if n_init is None else n_init,
                               0, "n_init=8")
        if predictor_factory is not None and not callable(predictor_factory):
            raise SearchError(f"predictor_factory = {brief(predictor_factory)} is not callable",
                              hint="pass a function that builds an unfitted predictor, e.g. "
                                   "lambda: MLPPredictor(space), or None for the default")
        if not isinstance(proposer, str) or proposer not in PROPOSERS:
            raise SearchError(f"proposer = {brief(proposer)} is not one of {list(PROPOSERS)}",
                              hint="use 'evolution' (default) or 'exhaustive' for small pools")
        self.exhaustive_limit = _int_arg("exhaustive_limit", exhaustive_limit, 0,
                                         "exhaustive_limit=4096")
        self.population = _int_arg("population", population, 2, "population=64")
        self.generations = _int_arg("generations", generations, 0, "generations=20")
        if isinstance(crossover, bool) or not isinstance(crossover, (int, float)) \
                or not 0.0 <= crossover <= 1.0:
            raise SearchError(f"crossover = {brief(crossover)} must be a probability in [0, 1]",
                              hint="e.g. crossover=0.5, or 0 for mutation only")
        self.predictor_factory = predictor_factory
        self.proposer = proposer
        self.crossover = float(crossover)
        self.log_objective = bool(log_objective)
        self.requires_positive = self.log_objective
        self.last_ask_info: dict[str, Any] = {}
        self.predictor: Any = None

    # -- the predictor --------------------------------------------------------------------------
    def _new_predictor(self, seed: int) -> Any:
        if self.predictor_factory is not None:
            return self.predictor_factory()
        from ..surrogate import MLPPredictor

        return MLPPredictor(self.space, self.objective, log_objective=self.log_objective,
                            seed=seed, epochs=DEFAULT_EPOCHS, lr=DEFAULT_LR)

    def _score(self, configs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        """Predicted objective (objective units) and fitness (larger is better), shape (n,)."""
        if not configs:
            return np.zeros(0), np.zeros(0)
        with np.errstate(over="ignore", invalid="ignore"):  # only the mean is used, not the std
            mean = np.asarray(self.predictor.predict(configs)[0], dtype=np.float64).reshape(-1)
        fitness = mean if self.direction == "maximize" else -mean
        return mean, np.nan_to_num(fitness, nan=-np.inf)

    # -- proposers ------------------------------------------------------------------------------
    def _exhaustive(self, n: int, pool: list[dict], rng: np.random.Generator,
                    info: dict[str, Any]) -> list[dict]:
        order = rng.permutation(len(pool))  # random, seeded tie-breaks
        mean, fitness = self._score([pool[int(i)] for i in order])
        top = np.argsort(-fitness, kind="stable")[:n]
        info["n_scored"] = len(pool)
        info["predicted"] = [float(mean[j]) for j in top]
        return [dict(pool[int(order[j])]) for j in top]

    def _mutate(self, cfg: dict, rng: np.random.Generator,
                values: list[Sequence[Any] | None]) -> dict:
        """Change one or two parameters of ``cfg`` (fewer if a parameter has a single value)."""
        child = dict(cfg)
        params = self.space.parameters
        k = 2 if len(params) > 1 and rng.random() < 0.5 else 1
        for j in rng.choice(len(params), size=k, replace=False):
            p, vals = params[int(j)], values[int(j)]
            if vals is None:  # a Float: a fresh draw
                child[p.name] = p.draw(random.Random(int(rng.integers(2**31))))
                continue
            if len(vals) < 2:
                continue
            i = vals.index(child[p.name])
            if p.kind not in ("choice", "bool") and rng.random() < 0.5:  # a step up or down
                step = int(rng.choice([-1, 1]))
                i2 = i + step if 0 <= i + step < len(vals) else i - step
            else:  # any other value
                i2 = int(rng.integers(len(vals) - 1))
                i2 += i2 >= i
            child[p.name] = vals[i2]
        return child

    def _evolve(self, n: int, pool: list[dict], rng: np.random.Generator,
                info: dict[str, Any]) -> list[dict]:
        space = self.space
        values: list[Sequence[Any] | None] = [
            range(p.low, p.high + 1) if isinstance(p, Int) else p.values() if p.is_discrete
            else None for p in space.parameters]  # a range: O(1) index() for wide Ints
        allowed = None if self._candidates is None else {k for k, _ in self._candidates}
        seen = set(self._told) | set(self._pending)  # never scored as answers
        archive: dict[str, tuple[dict, float, float]] = {}  # untried: config, mean, fitness

        # initial population: the best told ok configurations, then random untried ones
        ok_cfgs, ok_vals = self._ok()
        order = np.argsort(-ok_vals if self.direction == "maximize" else ok_vals, kind="stable")
        elite: dict[str, dict] = {}
        for i in order:
            if len(elite) >= self.population // 4:
                break
            elite.setdefault(space.key(ok_cfgs[int(i)]), ok_cfgs[int(i)])
        n_random = min(self.population - len(elite), len(pool))
        fresh = [pool[int(i)] for i in rng.choice(len(pool), size=n_random, replace=False)]
        members = list(elite.values()) + fresh
        mean, fitness = self._score(members)
        for cfg, m, f in zip(fresh, mean[len(elite):], fitness[len(elite):]):
            archive[space.key(cfg)] = (cfg, float(m), float(f))
        population = list(zip(members, fitness.tolist()))

        def parent() -> dict:
            idx = rng.choice(len(population), size=min(TOURNAMENT_SIZE, len(population)),
                             replace=False)
            return population[max(idx, key=lambda i: population[int(i)][1])][0]

        for _ in range(self.generations):
            children: dict[str, dict] = {}
            for _ in range(20 * self.population):  # attempts: constraints may reject many
                if len(children) >= max(1, self.population // 2):
                    break
                child = parent()
                if self.crossover and rng.random() < self.crossover:
                    other = parent()
                    pick = rng.random(len(space.names)) < 0.5
                    child = {name: (other if b else child)[name]
                             for name, b in zip(space.names, pick)}
                child = self._mutate(child, rng, values)
                key = space.key(child)
                if key in seen or key in archive or key in children:
                    continue
                if (key not in allowed) if allowed is not None else not space.contains(child):
                    continue
                children[key] = space.project(child)
            if not children:
                break
            kids = list(children.values())
            mean, fitness = self._score(kids)
            for key, cfg, m, f in zip(children, kids, mean, fitness):
                archive[key] = (cfg, float(m), float(f))
            population = (population + list(zip(kids, fitness.tolist())))[-self.population:]

        ranked = sorted(archive.values(), key=lambda t: -t[2])[:n]  # stable: first found wins
        info["n_scored"] = len(archive)
        info["predicted"] = [m for _, m, _ in ranked]
        return [dict(cfg) for cfg, _, _ in ranked]

    # -- the Searcher hook ----------------------------------------------------------------------
    def _propose(self, n: int, pool: list[dict], rng: np.random.Generator) -> list[dict]:
        t0 = time.perf_counter()
        seed = int(rng.integers(2**31 - 1))
        configs, values = self._ok()
        info: dict[str, Any] = {"phase": "initial", "reason": "", "proposer": "random",
                                "fit_s": 0.0, "ask_s": 0.0, "n_ok": len(configs),
                                "n_pool": len(pool), "n_scored": 0, "predicted": []}
        self.last_ask_info = info
        blocked = self._not_ready(configs, values, self.n_init, "the predictor")
        if blocked:
            info["phase"], info["reason"] = blocked
        else:
            try:
                pred = self._new_predictor(seed)
                t_fit = time.perf_counter()
                pred.fit(configs, values)
                info["fit_s"] = time.perf_counter() - t_fit
                self.predictor = pred
                info["phase"] = "guided"
                info["reason"] = f"predictor fitted on {len(configs)} ok observations"
            except PredictorError as err:
                info["reason"] = f"predictor fit failed: {err.message}"
                info["phase"] = "fallback"
        if info["phase"] != "guided":
            idx = rng.choice(len(pool), size=min(n, len(pool)), replace=False)
            out = [dict(pool[int(i)]) for i in idx]
        elif self.proposer == "exhaustive" or len(pool) <= self.exhaustive_limit:
            info["proposer"] = "exhaustive"
            out = self._exhaustive(n, pool, rng, info)
        else:
            info["proposer"] = "evolution"
            out = self._evolve(n, pool, rng, info)
            if len(out) < n:  # evolution found too few untried configurations: fill from pool
                got = {self.space.key(c) for c in out}
                rest = [c for c in pool if self.space.key(c) not in got]
                idx = rng.choice(len(rest), size=min(n - len(out), len(rest)), replace=False)
                out += [dict(rest[int(i)]) for i in idx]
        info["ask_s"] = time.perf_counter() - t0
        return out
