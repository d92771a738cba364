"""The pool a searcher proposes from: configurations keyed, checked and gathered.

A :class:`~cubicml_lab.search.Searcher` proposes from one of three pools:

* an explicit ``candidates`` list (:func:`explicit_pool`: each checked to be in the space,
  duplicates dropped, at most :data:`MAX_CANDIDATES`);
* every valid configuration, when the space is small enough to list (the searcher decides, by
  ``ENUMERATE_POOL_LIMIT``);
* else a seeded sample of valid configurations plus the valid :func:`neighbours` of the best
  ok configurations so far (:func:`sampled_pool`), so a search can refine around its best finds
  in a space too large to list.

A pool is a list of ``(space.key(config), config)`` pairs. :func:`exhausted` says, in words,
why nothing of a pool is left to propose.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._bounds import check_count
from .._params import brief
from ..errors import SearchError, SearchExhausted, SpaceError

if TYPE_CHECKING:
    from ..space import Space

__all__ = ["MAX_CANDIDATES", "NEIGHBOUR_BEST", "config_key", "exhausted", "explicit_pool",
           "neighbours", "sampled_pool"]

#: Sampled pools (spaces too large to list) also hold the neighbours of this many best configs.
NEIGHBOUR_BEST = 5
#: Largest sampled pool (``num_candidates``) and largest ``ask(n)``: every ask scores the whole
#: pool (a GP's posterior over 200,000 candidates takes seconds and a few GiB).
MAX_CANDIDATES = 200_000


def config_key(space: Space, config: Any, where: str) -> str:
    """``space.key(config)`` of a valid configuration.

    Raises:
        SearchError: If ``config`` is not in ``space``, naming it as ``where``.
    """
    try:
        space.validate(config)
        return space.key(config)
    except SpaceError as err:
        raise SearchError(f"{where} = {brief(config)} is not in the space: {err.message}",
                          hint=err.hint or "pass a configuration of this space") from None


def explicit_pool(space: Space, candidates: Any) -> list[tuple[str, dict]]:
    """The pool of an explicit ``candidates`` list: each projected onto ``space``, the first of
    duplicates kept, in order.

    Raises:
        SearchError: If ``candidates`` is not a list of configurations of ``space``, is empty,
            or holds more than :data:`MAX_CANDIDATES`.
    """
    if isinstance(candidates, Mapping):
        raise SearchError("candidates must be a list of configuration dicts, got one dict",
                          hint="wrap it in a list: [config]")
    pool: dict[str, dict] = {}
    if not isinstance(candidates, Sequence) or isinstance(candidates, (str, bytes)):
        raise SearchError(f"candidates = {brief(candidates)} is not a list of "
                          "configuration dicts", hint="pass a list, or None")
    check_count("len(candidates)", len(candidates), high=MAX_CANDIDATES,
                error=SearchError, why="MAX_CANDIDATES: every ask scores the whole pool")
    for i, cfg in enumerate(candidates):
        key = config_key(space, cfg, f"candidates[{i}]")
        if key not in pool:
            pool[key] = space.project(cfg)
    if not pool:
        raise SearchError("candidates is empty", hint="pass configurations, or None")
    return list(pool.items())


def neighbours(space: Space, config: dict) -> list[dict]:
    """Valid configurations one parameter step from ``config``: the next value up and down
    of an ordered discrete parameter (int, power of two, ordinal, bool), every other value of
    a choice; continuous parameters are left as they are."""
    out = []
    for p in space.parameters:
        if not p.is_discrete:
            continue
        vals = p.values()
        if config[p.name] not in vals:
            continue
        i = vals.index(config[p.name])
        others = ([v for v in vals if v != config[p.name]] if p.kind == "choice"
                  else [vals[j] for j in (i - 1, i + 1) if 0 <= j < len(vals)])
        for v in others:
            cand = {**config, p.name: v}
            if space.contains(cand):
                out.append(space.project(cand))
    return out


def sampled_pool(space: Space, num_candidates: int, seed: int, ok_configs: list[dict],
                 ok_values: np.ndarray, direction: str) -> list[tuple[str, dict]]:
    """A pool for a space too large to list: ``num_candidates`` valid configurations sampled
    with ``seed``, then the :func:`neighbours` of the :data:`NEIGHBOUR_BEST` best ok
    configurations (``ok_configs``, ``ok_values`` by ``direction``; first told first on ties).

    Raises:
        SearchError: If the space cannot draw the sample (e.g. constraints too tight).
    """
    try:
        sample = space.sample(num_candidates, seed=seed)
    except SpaceError as err:
        raise SearchError(f"cannot draw a pool of {num_candidates} candidates: "
                          f"{err.message}", hint=err.hint or "pass candidates=[...]") from None
    pool = {space.key(c): c for c in sample}
    if ok_configs:
        order = np.argsort(-ok_values if direction == "maximize" else ok_values, kind="stable")
        for i in order[:NEIGHBOUR_BEST]:
            for cfg in neighbours(space, ok_configs[int(i)]):
                pool.setdefault(space.key(cfg), cfg)
    return list(pool.items())


def exhausted(pool: list[tuple[str, dict]], told: set[str], pending: Mapping[str, Any],
              skipped: set[str]) -> SearchExhausted:
    """Why nothing of ``pool`` is left to propose: the untried configurations were all skipped
    (and un-skipping them helps), or the pool itself is used up."""
    n_told, n_pending = len(told), len(pending)
    n_skipped = sum(k in skipped and k not in told and k not in pending for k, _ in pool)
    if n_skipped:
        return SearchExhausted(
            f"nothing left to propose: every configuration not yet tried was skipped "
            f"({n_skipped} skipped, by hand or by a review rule; {n_told} distinct told, "
            f"{n_pending} pending, of a pool of {len(pool)})",
            hint="un-skip them to have them proposed again: search.unskip() (or "
                 "campaign.unskip(), which also forgets the skips kept in the store); "
                 "or widen the space", skipped=n_skipped)
    return SearchExhausted(
        f"nothing left to propose: all {len(pool)} configurations of the pool have been "
        f"tried or are pending ({n_told} distinct told, {n_pending} pending)",
        hint="widen the space or pass more candidates")
