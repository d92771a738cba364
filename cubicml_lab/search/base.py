"""The ask/tell interface every searcher shares, and the bookkeeping behind it.

A :class:`Searcher` proposes configurations (:meth:`~Searcher.ask`) and learns what happened to them
(:meth:`~Searcher.tell`), like Optuna's ``study.ask``/``study.tell`` or Ax's ``get_next_trials`` /
``complete_trial``. This base class owns everything that does not depend on the strategy:

* the **pool** of proposable configurations (:mod:`~cubicml_lab.search.pool`): ``candidates``
  if given; else every valid configuration (``space.enumerate()``) when ``space.size() <=
  ENUMERATE_POOL_LIMIT``; else a seeded sample of ``num_candidates`` valid configurations,
  redrawn at each ask, plus the valid neighbours of the best ok configurations so far;
* what was **told** (never proposed again, failures included; telling the same configuration twice
  keeps both observations), what is **pending** (asked, not yet told: never proposed twice), and
  the **enqueued** configurations that the next asks return first (e.g. a user's default; with
  ``repeat=True`` a configuration already told, to measure it again: the only way a searcher
  proposes a repeat);
* input checks with messages that name the bad value, the :attr:`~Searcher.history` and
  :meth:`~Searcher.best`.

A subclass implements only ``_propose(n, pool, rng)``: pick up to ``n`` of the untried ``pool``.
The ``rng`` is seeded from ``(seed, n_told)``, so a searcher told the same history proposes the same
configurations (a resumed campaign continues as if it had never stopped).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from itertools import compress
from typing import TYPE_CHECKING, Any

import numpy as np

from .._bounds import check_count
from .._params import brief
from ..errors import SearchError, SpaceError
from ..trials import FINISHED, figure_flag, is_stopped_early
from . import pool as _pools
from .cost import told_cost
from .pool import MAX_CANDIDATES, NEIGHBOUR_BEST, config_key
from .proposal import Proposal
from .told import FLAG_METRICS, told_numbers

if TYPE_CHECKING:
    from ..space import Space

__all__ = ["DIRECTIONS", "ENUMERATE_POOL_LIMIT", "FLAG_METRICS", "MAX_CANDIDATES", "MAX_SEED",
           "NEIGHBOUR_BEST", "STATUSES", "Searcher", "check_seed"]

#: Alias of :data:`cubicml_lab.trials.FINISHED` (the four statuses a trial ends in, the ones
#: a searcher is told; only "ok" carries an objective value), kept for older imports. Not
#: :data:`cubicml_lab.trials.STATUSES`, which adds "pending" and "running": use ``FINISHED``.
STATUSES = FINISHED
#: Optimisation directions.
DIRECTIONS = ("maximize", "minimize")
#: Spaces with at most this many valid configurations are searched exhaustively.
ENUMERATE_POOL_LIMIT = 100_000
#: Largest seed (NumPy's generators take seeds in 0..2**63 - 1 here).
MAX_SEED = 2**63 - 1


def check_seed(seed: Any, error: type[Exception] = SearchError) -> int:
    """``seed`` as an int in ``0..MAX_SEED``, else ``error`` naming it.

    Example:
        >>> check_seed(7)
        7
    """
    return check_count("seed", seed, low=0, high=MAX_SEED, error=error,
                       why="a seed is a non-negative int")


class Searcher:
    """Ask/tell search over a :class:`~cubicml_lab.space.Space` (base class).

    Args:
        space: The configurations to search.
        objective: Name of the metric in the dicts passed to :meth:`tell`, e.g. "throughput".
        direction: "maximize" or "minimize".
        candidates: Optional explicit pool of configurations (each must be in ``space``;
            duplicates are dropped). Default: the whole space or a sample of it (module doc).
        seed: Seed of every random choice.
        num_candidates: Size of the sampled pool for spaces too large to enumerate.

    Raises:
        SearchError: On a bad direction, an empty pool or a candidate outside the space.

    Example:
        >>> from cubicml_lab.space import Space, Int
        >>> from cubicml_lab.search import RandomSearch
        >>> s = RandomSearch(Space([Int("micro_batch", 1, 8)]), seed=0)
        >>> [cfg] = s.ask()
        >>> s.tell(cfg, {"throughput": 100.0 * cfg["micro_batch"]})
        >>> s.best()[1] == 100.0 * cfg["micro_batch"]
        True
    """

    #: Whether ok values must be > 0 (searchers that model log(objective) set this).
    requires_positive: bool = False

    def __init__(self, space: Space, objective: str = "throughput", direction: str = "maximize",
                 candidates: Sequence[dict] | None = None, seed: int = 0, *,
                 num_candidates: int = 5000) -> None:
        if not isinstance(direction, str) or direction not in DIRECTIONS:
            raise SearchError(f"direction = {brief(direction)} is not one of {list(DIRECTIONS)}",
                              hint="use 'maximize' for throughput, 'minimize' for step time")
        if not isinstance(objective, str) or not objective:
            raise SearchError(f"objective = {brief(objective)} must be a metric name",
                              hint="e.g. 'throughput' or 'tokens_per_s'")
        if len(objective) > 200 or not objective.isprintable():
            raise SearchError(f"objective = {brief(objective)} is not a metric name (at most "
                              "200 printable characters)", hint="e.g. 'tokens_per_s'")
        from ..space import Space

        if not isinstance(space, Space):
            raise SearchError(f"space = {brief(space)} is a {type(space).__name__}, not a Space",
                              hint="pass cml.Space([...])")
        num_candidates = check_count("num_candidates", num_candidates, high=MAX_CANDIDATES,
                                     error=SearchError, why="MAX_CANDIDATES: every ask scores "
                                     "the whole pool")
        seed = check_seed(seed)
        self.space = space
        self.objective = objective
        self.direction = direction
        self.seed = int(seed)
        self.num_candidates = num_candidates
        self._history: list[dict[str, Any]] = []
        self._told: set[str] = set()
        self._pending: dict[str, dict] = {}
        self._queue: list[tuple[str, dict, bool]] = []
        self._candidates: list[tuple[str, dict]] | None = None
        self._fixed_pool: list[tuple[str, dict]] | None = None
        self._untried_keys: list[str] = []
        self._skipped: set[str] = set()
        self._last_enqueued: set[str] = set()
        #: What the search was told it may spend (:meth:`plan_budget`), or None.
        self.budget_plan: dict[str, Any] | None = None
        if candidates is not None:
            self._candidates = _pools.explicit_pool(space, candidates)

    def plan_budget(self, trials: int | None = None, device_s: float | None = None) -> None:
        """Tell the search what it may spend from now on: ``trials`` more trials, or
        ``device_s`` more device-seconds (``Campaign.run`` does, from its ``budget`` or
        ``budget_device_hours``). A search that weighs prices
        (:mod:`~cubicml_lab.search.cost`) cools the price's weight as the budget is spent;
        other searchers only keep it (:attr:`budget_plan`).

        Raises:
            SearchError: A budget that is not a positive number.
        """
        if device_s is not None:
            ok = isinstance(device_s, (int, float)) and not isinstance(device_s, bool) \
                and 0 < device_s < math.inf
            if not ok:
                raise SearchError(f"device_s = {brief(device_s)} must be a finite number > 0",
                                  hint="e.g. plan_budget(device_s=3600.0) for one device-hour")
            spent = sum(told_cost(h["values"]) or 0.0 for h in self._history)
            self.budget_plan = {"device_s": float(device_s), "spent_at_start": spent}
        elif trials is not None:
            trials = check_count("trials", trials, high=10**9, error=SearchError)
            self.budget_plan = {"trials": trials, "n_told_at_start": self.n_told}
        else:
            self.budget_plan = None

    # -- bookkeeping ----------------------------------------------------------------------------
    def _key(self, config: Any, where: str) -> str:
        return config_key(self.space, config, where)

    @property
    def n_told(self) -> int:
        """Number of tell() calls so far (all statuses)."""
        return len(self._history)

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every told trial in order: ``{"config", "status", "value", "values"}`` (value: the
        objective, None unless ok; values: every finite number told with it, and inf for a CI
        that could not be measured)."""
        return [{"config": dict(h["config"]), "status": h["status"], "value": h["value"],
                 "values": dict(h["values"])} for h in self._history]

    @property
    def pending(self) -> list[dict]:
        """Configurations asked but not yet told."""
        return [dict(c) for c in self._pending.values()]

    def _ok(self) -> tuple[list[dict], np.ndarray]:
        """Configurations and values of the ok observations, in tell order."""
        ok = [h for h in self._history if h["status"] == "ok"]
        return [h["config"] for h in ok], np.array([h["value"] for h in ok], dtype=np.float64)

    def _not_ready(self, configs: list[dict], values: np.ndarray, n_init: int,
                   model: str) -> tuple[str, str] | None:
        """Why a model-based searcher cannot fit ``model`` on the ok history yet, as
        ``(phase, reason)``: ``"initial"`` before ``n_init`` ok observations, ``"fallback"`` with
        fewer than 2 distinct configurations or identical values; None when it can."""
        if len(configs) < n_init:
            return "initial", f"{len(configs)} of n_init = {n_init} ok observations so far"
        n_distinct = len({self.space.key(c) for c in configs})
        if n_distinct < 2:
            return "fallback", f"only {n_distinct} distinct ok configuration; {model} needs 2"
        if np.ptp(values) == 0:
            return "fallback", (f"all {len(values)} ok values are identical ({values[0]:g}); "
                                f"{model} has nothing to learn")
        return None

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.n_told])

    def _pool(self) -> list[tuple[str, dict]]:
        """``(key, config)`` of all proposable configurations for this ask (told and pending not
        yet removed)."""
        if self._candidates is not None:
            return self._candidates
        if self._fixed_pool is None:
            try:
                size = self.space.size()
            except SpaceError:
                size = math.inf
            if size <= ENUMERATE_POOL_LIMIT:
                self._fixed_pool = [(self.space.key(c), c) for c in self.space.enumerate()]
        if self._fixed_pool is not None:
            return self._fixed_pool
        seed = int(np.random.default_rng([self.seed, self.n_told, 1]).integers(2**31))
        return _pools.sampled_pool(self.space, self.num_candidates, seed, *self._ok(),
                                   self.direction)

    def neighbours(self, config: dict) -> list[dict]:
        """Valid configurations one parameter step from ``config``: the next value up and down
        of an ordered discrete parameter (int, power of two, ordinal, bool), every other value of
        a choice; continuous parameters are left as they are."""
        return _pools.neighbours(self.space, config)

    # -- the interface --------------------------------------------------------------------------
    def ask(self, n: int = 1) -> list[dict]:
        """Propose up to ``n`` distinct configurations to measure next.

        Enqueued configurations come first. A proposal is never one already told or still
        pending; fewer than ``n`` come back only when the pool runs out.

        Raises:
            SearchError: If ``n`` is not a positive int.
            SearchExhausted: If nothing is left to propose (a :class:`SearchError`); its
                ``skipped`` counts the untried configurations that were skipped, which
                :meth:`unskip` gives back.
        """
        n = check_count("ask(n)", n, high=MAX_CANDIDATES, error=SearchError,
                        why="MAX_CANDIDATES: at most the pool")
        out: list[dict] = []
        self._last_enqueued = set()
        while self._queue and len(out) < n:
            key, cfg, repeat = self._queue.pop(0)
            if (repeat or key not in self._told) and key not in self._pending:
                self._pending[key] = cfg
                self._last_enqueued.add(key)
                out.append(dict(cfg))
        if len(out) < n:
            pool = self._pool()
            # a flag per configuration, then references: no new object per configuration (a
            # pair each, 50,000 an ask, set off the interpreter's full garbage collections)
            told, pending, skipped = self._told, self._pending, self._skipped
            open_ = [k not in told and k not in pending and k not in skipped for k, _ in pool]
            untried = list(compress([c for _, c in pool], open_))
            #: keys of the configurations handed to ``_propose``, in the same order
            self._untried_keys = list(compress([k for k, _ in pool], open_))
            if not untried and not out:
                raise _pools.exhausted(pool, self._told, self._pending, self._skipped)
            if untried:
                for cfg in self._propose(n - len(out), untried, self._rng()):
                    self._pending[self.space.key(cfg)] = dict(cfg)
                    out.append(dict(cfg))
        return out

    def propose(self, n: int = 1) -> list[Proposal]:
        """:meth:`ask`, with what the searcher expects of each configuration.

        The configurations are the same as ``ask(n)`` would return (and are pending in the same
        way); each comes as a :class:`~cubicml_lab.search.Proposal` carrying the prediction and
        its 95% interval, the probability of running, the acquisition value and the reason, as
        far as the searcher knows them.

        Example:
            >>> from cubicml_lab.space import Space, Int
            >>> from cubicml_lab.search import RandomSearch
            >>> [p] = RandomSearch(Space([Int("micro_batch", 1, 8)]), seed=0).propose()
            >>> p.phase, p.predicted
            ('random', None)
        """
        configs = self.ask(n)
        return self._explain(configs, [self.space.key(c) in self._last_enqueued
                                       for c in configs])

    def _explain(self, configs: list[dict], enqueued: list[bool]) -> list[Proposal]:
        """Proposals for ``configs`` just asked (``enqueued[i]``: it came from the queue).
        Subclasses with a model add their figures; this base gives the phase and reason."""
        info = getattr(self, "last_ask_info", None) or {}
        phase = info.get("phase") or type(self).__name__.lower().replace("search", "") or "random"
        out = []
        for cfg, queued in zip(configs, enqueued):
            if queued:
                out.append(Proposal(config=cfg, objective=self.objective, phase="enqueued",
                                    reason="enqueued (e.g. the default configuration)"))
            else:
                out.append(Proposal(config=cfg, objective=self.objective, phase=phase,
                                    reason=info.get("reason") or "drawn uniformly from the "
                                    "untried configurations"))
        return out

    def skip(self, config: dict) -> None:
        """Never propose ``config`` (a person looked at it and decided not to run it).

        It leaves the pending set; it is not told as a trial, so the models learn nothing
        from it. :attr:`skipped` lists what was skipped.

        Raises:
            SearchError: If ``config`` is not in the space.
        """
        key = self._key(config, "config")
        self._pending.pop(key, None)
        self._queue = [q for q in self._queue if q[0] != key]
        self._skipped.add(key)

    def release(self, config: dict) -> None:
        """Drop ``config`` from the pending set without telling anything (a proposal that was
        not launched after all, e.g. edited or interrupted): it may be proposed again."""
        self._pending.pop(self._key(config, "config"), None)

    def mark_pending(self, config: dict) -> None:
        """Hold ``config`` as pending (running elsewhere, e.g. an interrupted trial run again),
        so that no ask proposes it until it is told or released."""
        key = self._key(config, "config")
        self._pending[key] = self.space.project(config)

    def unskip(self, config: dict | None = None) -> int:
        """Let the search propose skipped configurations again: ``config``, or every one
        skipped (None). The way back from :meth:`skip`, e.g. after a review rule skipped all
        that was left (:class:`~cubicml_lab.errors.SearchExhausted` with ``skipped`` > 0).

        Returns:
            How many configurations were un-skipped (0 where ``config`` was not skipped).

        Raises:
            SearchError: If ``config`` is not in the space.

        Example:
            >>> from cubicml_lab.space import Space, Int
            >>> from cubicml_lab.search import RandomSearch
            >>> s = RandomSearch(Space([Int("micro_batch", 1, 2)]), seed=0)
            >>> s.skip({"micro_batch": 1}); s.skip({"micro_batch": 2})
            >>> s.unskip()
            2
        """
        if config is None:
            n, self._skipped = len(self._skipped), set()
            return n
        key = self._key(config, "config")
        if key not in self._skipped:
            return 0
        self._skipped.discard(key)
        return 1

    @property
    def skipped(self) -> list[str]:
        """Keys (``space.key``) of the configurations passed to :meth:`skip`."""
        return sorted(self._skipped)

    def _propose(self, n: int, pool: list[dict], rng: np.random.Generator) -> list[dict]:
        """Pick ``min(n, len(pool))`` distinct configurations of the untried ``pool``."""
        raise NotImplementedError

    def tell(self, config: dict, values: Mapping[str, float] | None, status: str = "ok") -> None:
        """Report a trial's outcome.

        Args:
            config: The measured configuration (any configuration of the space).
            values: Metrics of the trial (metric name -> number), or None. With status "ok"
                ``values[objective]`` must be a finite number (and > 0 for searchers that model
                the log objective). Other entries that are not finite numbers (NaN, text,
                lists) are kept out of the history, but a CI (``*_rel_ci``) NaN or inf, kept as
                inf: unknown, a figure from a single window. A bool or an int too large for
                a float is refused wherever it is, except a flag of :data:`FLAG_METRICS`
                (``contended``), kept as 1.0 / 0.0.
            status: One of "ok", "oom", "failed", "timeout".

        Raises:
            SearchError: On an unknown status, a configuration outside the space, values that
                are not a dict, a bool or oversized int among them, or an ok trial without a
                usable objective value. Nothing is told then.
        """
        if status not in FINISHED:
            raise SearchError(f"status = {brief(status)} is not one of {list(FINISHED)}",
                              hint="report a crash as 'failed', out-of-memory as 'oom'")
        key = self._key(config, "config")
        told = told_numbers(values)
        value = self._objective_value(values) if status == "ok" else None
        self._pending.pop(key, None)
        self._queue = [q for q in self._queue if q[0] != key or q[2]]
        self._told.add(key)
        self._history.append({"config": self.space.project(config), "status": status,
                              "value": value, "values": told})

    def _objective_value(self, values: Mapping[str, Any] | None) -> float:
        """``values[objective]`` of an ok trial as a float, checked (see :meth:`tell`)."""
        if values is None or self.objective not in values:
            got = None if values is None else sorted(map(str, values))
            raise SearchError(f"an ok trial needs values[{self.objective!r}]; got {brief(got)}",
                              hint=f"tell(config, {{{self.objective!r}: 1234.5}}), or pass "
                                   "status='failed' for a trial without a measurement")
        raw = values[self.objective]
        if not isinstance(raw, numbers.Real):
            raise SearchError(f"values[{self.objective!r}] = {brief(raw)} is a "
                              f"{type(raw).__name__}, not a number",
                              hint="tell the measured value as a float; a trial without a "
                                   "measurement is status='failed'")
        try:
            value = float(raw)
        except (OverflowError, ValueError, TypeError):
            value = math.nan
        if not math.isfinite(value):
            raise SearchError(f"values[{self.objective!r}] = {brief(raw)} is not a finite number",
                              hint="tell a trial without a measurement as status='failed'")
        if self.requires_positive and value <= 0:
            raise SearchError(f"values[{self.objective!r}] = {value!r} is not positive, but "
                              f"{type(self).__name__} models log({self.objective})",
                              hint="pass log_objective=False for objectives that can be <= 0")
        return value

    def enqueue(self, config: dict, *, repeat: bool = False) -> None:
        """Have the next ask return ``config`` first (before any proposal), like Optuna's
        ``enqueue_trial``; e.g. the user's default configuration.

        A configuration already told, pending or enqueued is not queued again (so a resumed
        campaign may enqueue its default every time it starts), unless ``repeat=True``: then a
        told configuration is asked once more (a repeat measurement, e.g. to confirm the best).
        It need not be in ``candidates``.

        Raises:
            SearchError: If ``config`` is not in the space.
        """
        key = self._key(config, "config")
        queued = any(q[0] == key for q in self._queue)
        if key in self._pending or queued or (key in self._told and not repeat):
            return
        self._queue.append((key, self.space.project(config), bool(repeat)))

    def best(self) -> tuple[dict, float]:
        """The best ok observation by direction: ``(config, value)`` (the first one on ties).

        A flagged figure (:func:`~cubicml_lab.trials.figure_flag`: told ``contended``, or
        with an unknown CI) is not the best while an unflagged ok observation exists.

        Raises:
            SearchError: If no trial has been told with status "ok".
        """
        ok = [h for h in self._history if h["status"] == "ok"]
        if not ok:
            n_bad = len(self._history)
            raise SearchError(f"no ok trial yet ({n_bad} told, none ok)",
                              hint="tell a measured trial with status='ok' first")
        ok = [h for h in ok if not is_stopped_early(h["values"])] or ok  # never the best
        ok = [h for h in ok if figure_flag(h["values"], self.objective) is None] or ok
        values = np.array([h["value"] for h in ok], dtype=np.float64)
        i = int(np.argmax(values) if self.direction == "maximize" else np.argmin(values))
        return dict(ok[i]["config"]), float(values[i])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(objective={self.objective!r}, direction="
                f"{self.direction!r}, n_told={self.n_told}, pending={len(self._pending)})")
