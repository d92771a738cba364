"""Compare searchers offline: replay each one with several seeds on a table, then summarise.

:func:`compare_searchers` runs the loop every search study repeats: for each searcher and each
seed, build the searcher on the table's space with the table's configurations as its pool
(``candidates=obj.configs()``), replay it with :meth:`TableObjective.replay
<cubicml_lab.search.table.TableObjective.replay>` for ``budget`` trials, and stack the replays in
one DataFrame, one row per (searcher, seed, trial). :func:`summarize_searches` turns that into the
figures a person reads, one row per searcher: how many trials it took to get within 5 % and 1 % of
the table's best (median and quartiles over seeds), and the regret (in percent) left after
10, 25 and 50 trials. :func:`searcher_factory` builds the ``seed -> searcher`` callables that
:func:`compare_searchers` takes, with options (a cost model, an ``n_init``) bound.

Regret is in percent wherever it is shown (``regret_pct``: how much slower the best found is
than the table's best, 0 once the best was found); the fraction stays in ``regret`` for
:func:`cubicml_lab.plots.plot_regret_curves`.

Example:
    >>> import cubicml_lab as cml
    >>> from cubicml_lab.search import compare_searchers, summarize_searches
    >>> obj = cml.TableObjective.from_dataset(cml.datasets.load("lucie7b_seq2k"))
    >>> runs = compare_searchers(obj, ["RandomSearch"], budget=5, seeds=2, progress=False)
    >>> runs.groupby("seed")["trial"].max().tolist()
    [5, 5]
    >>> summarize_searches(runs).index.tolist()
    ['RandomSearch']
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import pickle
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any

import numpy as np

from .._bounds import check_count
from .._params import brief
from ..errors import SearchError
from ..surrogate.metrics import quartiles
from .base import MAX_SEED
from .bayesian import BayesianSearch
from .guided import PredictorGuidedSearch
from .random import RandomSearch
from .table import TableObjective

if TYPE_CHECKING:
    import pandas as pd

    from .base import Searcher

__all__ = ["SEARCHERS", "compare_searchers", "searcher_factory", "summarize_searches"]

#: The searchers :func:`compare_searchers` knows by name (built with their defaults).
SEARCHERS: dict[str, type] = {"BayesianSearch": BayesianSearch, "RandomSearch": RandomSearch,
                              "PredictorGuidedSearch": PredictorGuidedSearch}

Factory = Callable[[int], "Searcher"]


def _build(cls: type, space: Any, objective: str, candidates: list[dict],
           options: dict[str, Any], seed: int) -> Any:
    return cls(space, objective=objective, candidates=candidates, seed=seed, **options)


def searcher_factory(obj: TableObjective, kind: str | type, **options: Any) -> Factory:
    """A ``seed -> searcher`` callable that replays on ``obj``: the searcher is built on
    ``obj.space`` with ``objective=obj.objective``, ``candidates=obj.configs()`` and ``options``.

    The result can be sent to worker processes (``compare_searchers(..., workers=2)``) when
    ``kind`` is a class defined at module level and ``options`` hold such objects too.

    Args:
        obj: The table the searcher will replay on.
        kind: A name of :data:`SEARCHERS` or a searcher class (``cls(space, objective=...,
            candidates=..., seed=..., **options)``).
        **options: Further keyword arguments of the searcher, e.g. ``cost_model=ds.cost_model``.

    Raises:
        SearchError: If ``obj`` is not a TableObjective or ``kind`` is not a known name or class.

    Example:
        >>> import cubicml_lab as cml
        >>> ds = cml.datasets.load("lucie7b_seq2k")
        >>> obj = cml.TableObjective.from_dataset(ds)
        >>> make = searcher_factory(obj, "BayesianSearch", cost_model=ds.cost_model, n_init=4)
        >>> make(3).seed, make(3).n_init
        (3, 4)
    """
    _check_objective(obj)
    if isinstance(kind, str):
        if kind not in SEARCHERS:
            raise SearchError(f"kind = {brief(kind)} is not a known searcher; known: "
                              f"{', '.join(SEARCHERS)}",
                              hint="pass one of those names, or the searcher class itself")
        cls = SEARCHERS[kind]
    elif isinstance(kind, type):
        cls = kind
    else:
        raise SearchError(f"kind = {brief(kind)} must be a searcher name or class",
                          hint=f"e.g. 'BayesianSearch' (known: {', '.join(SEARCHERS)})")
    return functools.partial(_build, cls, obj.space, obj.objective, obj.configs(), dict(options))


def compare_searchers(objective: TableObjective,
                      searchers: Mapping[str, Factory | str] | Sequence[str], budget: int,
                      seeds: int | Sequence[int], *, batch: int = 1, progress: bool = True,
                      workers: int = 1) -> pd.DataFrame:
    """Replay every searcher with every seed on a table and stack the replays.

    Each (searcher, seed) replay builds a fresh searcher and starts from a fresh oracle (the
    objective's call counts are reset, so ``reduce="random"`` draws do not depend on what ran
    before, nor on ``workers``).

    Args:
        objective: The table as an oracle (:class:`~cubicml_lab.search.TableObjective`).
        searchers: Names of :data:`SEARCHERS` (each built with its defaults), or a mapping from
            the label shown in the results to a ``seed -> searcher`` callable
            (:func:`searcher_factory`) or to a name of :data:`SEARCHERS`. A searcher is anything
            with ``ask(n)`` and ``tell(config, values, status=...)`` whose pool is the table's.
        budget: Trials per replay (fewer if the table runs out of configurations).
        seeds: Number of seeds (seeds ``0 .. seeds - 1``) or the seeds themselves.
        batch: Configurations per ask.
        progress: Show a tqdm bar over the replays.
        workers: Processes that run replays side by side (1: in this process). With more, the
            workers are forked from this process (on Linux and macOS; elsewhere they are spawned,
            which needs picklable searchers and space and, in a script, the ``if __name__ ==
            "__main__":`` guard), each uses one torch thread, and the result is the same as with
            ``workers=1``.

    Returns:
        DataFrame, one row per trial, ordered by searcher (as given), seed and trial:
        ``searcher``, ``seed``, ``trial`` (1-based), ``status``, ``value``, ``best``, ``regret``
        (fraction), ``regret_pct`` (percent), ``elapsed_s`` (the searcher's own seconds so far)
        and one column per knob (:meth:`TableObjective.replay`).

    Raises:
        SearchError: On a bad argument (naming it and a valid value), an unknown searcher name,
            a factory that fails or returns something that is not a searcher, or (spawned
            workers) a searcher that cannot be sent to a worker process.

    Example:
        >>> import cubicml_lab as cml
        >>> obj = cml.TableObjective.from_dataset(cml.datasets.load("lucie7b_seq2k"))
        >>> runs = compare_searchers(obj, {"random": "RandomSearch"}, budget=3, seeds=[7],
        ...                          progress=False)
        >>> runs[["searcher", "seed", "trial"]].values.tolist()
        [['random', 7, 1], ['random', 7, 2], ['random', 7, 3]]
    """
    import pandas as pd
    from tqdm.auto import tqdm

    _check_objective(objective)
    clash = [k for k in ("searcher", "seed") if k in objective.knobs]
    if clash:
        raise SearchError(f"the table has knob(s) named {clash}, which the results use for the "
                          "searcher's label and seed", hint="rename those knob columns")
    factories = _factories(objective, searchers)
    for name, v in (("budget", budget), ("batch", batch), ("workers", workers)):
        _positive_int(name, v)
    seed_list = _seeds(seeds)
    jobs = [(name, seed) for name in factories for seed in seed_list]
    bar = tqdm(total=len(jobs), desc="replays", unit="replay", disable=not progress)
    results: dict[tuple[str, int], pd.DataFrame] = {}
    if workers == 1 or len(jobs) == 1:
        for name, seed in jobs:
            results[name, seed] = _replay_one(objective, name, factories[name], seed, budget,
                                              batch)
            bar.update()
    else:
        context = _context()
        if context.get_start_method() != "fork":
            _check_sendable(objective, factories)
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context,
                                 initializer=_init_worker,
                                 initargs=(objective, factories)) as pool:
            futures = {pool.submit(_worker_replay, name, seed, budget, batch): (name, seed)
                       for name, seed in jobs}
            for future in as_completed(futures):
                got = future.result()
                if isinstance(got, tuple):  # a SearchError in the worker: (message, hint)
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise SearchError(*got)
                results[futures[future]] = got
                bar.update()
    bar.close()
    frames = [results[job].assign(searcher=job[0], seed=job[1]) for job in jobs]
    runs = pd.concat(frames, ignore_index=True)
    first = ["searcher", "seed", "trial"]
    return runs[first + [c for c in runs.columns if c not in first]]


def summarize_searches(runs: pd.DataFrame, *, within_pct: Sequence[float] = (5.0, 1.0),
                       after: Sequence[int] = (10, 25, 50),
                       baseline: float | None = None) -> pd.DataFrame:
    """Per searcher, over seeds: trials to get within ``within_pct`` of the best, and the regret
    left after ``after`` trials (median and quartiles).

    A seed that never got within ``p`` % counts as ``budget + 1`` trials (its replay's length
    plus one), so a median above the budget means most seeds did not get there; ``reached``
    says how many did. A checkpoint past a replay's last trial (the table ran out) takes its
    last trial's regret; checkpoints past every replay's length are left out.

    Args:
        runs: Output of :func:`compare_searchers` (columns ``searcher``, ``seed``, ``trial``,
            ``regret_pct``, optionally ``best`` and ``elapsed_s``).
        within_pct: Regret thresholds, percent.
        after: Trial counts at which to report the regret.
        baseline: A reference objective value (e.g. a default configuration's, or the table's
            median): adds ``best_found`` (median over seeds of the best value found in the whole
            replay) and ``speedup_x`` (median over seeds of best found / baseline). Needs a
            ``best`` column and a maximised objective.

    Returns:
        DataFrame indexed by searcher (in order of appearance) with columns ``seeds``,
        ``trials``; per ``p`` in ``within_pct``: ``to_{p}pct`` (median trials), ``to_{p}pct_q25``,
        ``to_{p}pct_q75``, ``to_{p}pct_reached`` (seeds); per ``k`` in ``after``:
        ``regret_pct_at_{k}`` (median), ``..._q25``, ``..._q75``; ``search_s`` (median seconds
        the searcher spent per replay) when ``elapsed_s`` is there; and the baseline columns.
        ``p`` is written without a trailing ``.0`` (``to_5pct``, ``to_0.5pct``).

    Raises:
        SearchError: If ``runs`` lacks a column, or on a bad threshold, checkpoint or baseline.

    Example:
        >>> import pandas as pd
        >>> runs = pd.DataFrame({"searcher": ["a"] * 4, "seed": [0, 0, 1, 1],
        ...                      "trial": [1, 2, 1, 2], "regret_pct": [10.0, 0.0, 3.0, 3.0]})
        >>> s = summarize_searches(runs, within_pct=[5], after=[1])
        >>> s.loc["a", ["to_5pct", "to_5pct_reached", "regret_pct_at_1"]].tolist()
        [1.5, 2.0, 6.5]
    """
    import pandas as pd

    _check_runs(runs, baseline)
    within = [_threshold(p) for p in within_pct]
    horizon = int(runs.groupby(["searcher", "seed"])["trial"].max().max())
    checkpoints = [_positive_int("after", k) for k in after]
    checkpoints = [k for k in checkpoints if k <= horizon]
    rows = {}
    for name, d in runs.groupby("searcher", sort=False):
        per_seed = [g.sort_values("trial") for _, g in d.groupby("seed", sort=True)]
        row: dict[str, Any] = {"seeds": len(per_seed),
                               "trials": int(max(len(g) for g in per_seed))}
        for p in within:
            hits = [_first_within(g, p) for g in per_seed]
            n = [h if h is not None else len(g) + 1 for h, g in zip(hits, per_seed)]
            row.update(_quartiles(f"to_{_pct_name(p)}pct", n))
            row[f"to_{_pct_name(p)}pct_reached"] = sum(h is not None for h in hits)
        for k in checkpoints:
            left = [float(g["regret_pct"].iloc[min(k, len(g)) - 1]) for g in per_seed]
            row.update(_quartiles(f"regret_pct_at_{k}", left))
        if "elapsed_s" in d.columns:
            row["search_s"] = float(np.median([g["elapsed_s"].iloc[-1] for g in per_seed]))
        if baseline is not None:
            found = np.array([g["best"].max() for g in per_seed], dtype=float)
            found = np.where(np.isfinite(found), found, np.nan)
            row["best_found"] = float(np.nanmedian(found)) if np.isfinite(found).any() else math.nan
            row["speedup_x"] = (float(np.nanmedian(found / baseline))
                                if np.isfinite(found).any() else math.nan)
        rows[name] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "searcher"
    return out


# -- one replay, here or in a worker --------------------------------------------------------------
def _replay_one(obj: TableObjective, name: str, factory: Factory, seed: int, budget: int,
                batch: int) -> pd.DataFrame:
    try:
        searcher = factory(seed)
    except SearchError:
        raise
    except Exception as err:  # noqa: BLE001 - a user's factory: say which one failed
        raise SearchError(f"searcher {name!r}: its factory failed for seed {seed}: "
                          f"{type(err).__name__}: {err}",
                          hint="a factory takes the seed and returns a searcher whose pool is "
                               "the table's; see searcher_factory(obj, kind, **options)") from err
    if not (callable(getattr(searcher, "ask", None)) and callable(getattr(searcher, "tell", None))):
        raise SearchError(f"searcher {name!r}: its factory returned {type(searcher).__name__}, "
                          "which has no ask/tell methods",
                          hint="return a searcher, e.g. cml.BayesianSearch(obj.space, ..., "
                               "candidates=obj.configs(), seed=seed)")
    obj.reset()
    df = obj.replay(searcher, budget, batch=batch)
    if len(df) == 0:
        raise SearchError(f"searcher {name!r} (seed {seed}) proposed no configuration",
                          hint="its pool must be the table's: candidates=obj.configs()")
    return df


_WORKER: dict[str, Any] = {}


def _init_worker(obj: TableObjective, factories: dict[str, Factory]) -> None:
    import torch

    torch.set_num_threads(1)  # replays run side by side: one thread each
    _WORKER["obj"], _WORKER["factories"] = obj, factories


def _worker_replay(name: str, seed: int, budget: int,
                   batch: int) -> pd.DataFrame | tuple[str, str | None]:
    try:
        return _replay_one(_WORKER["obj"], name, _WORKER["factories"][name], seed, budget, batch)
    except SearchError as err:  # sent back whole: message and hint apart
        return err.message, err.hint


def _context() -> Any:
    """Fork where the platform can (nothing is pickled on the way in: lambdas and constrained
    spaces travel as they are); the workers then use one torch thread, as a DataLoader's do, which
    keeps the parent's thread pool out of their way. Elsewhere spawn, which pickles."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _check_sendable(obj: TableObjective, factories: dict[str, Factory]) -> None:
    for name, factory in factories.items():
        try:
            pickle.dumps(factory)
        except Exception as err:  # noqa: BLE001 - lambdas, closures, local classes
            raise SearchError(f"searcher {name!r} cannot be sent to a worker process "
                              f"({type(err).__name__}: {err})",
                              hint="pass a name (e.g. 'BayesianSearch'), use "
                                   "searcher_factory(obj, kind, **options) or a module-level "
                                   "function, or workers=1") from None
    try:
        pickle.dumps(obj)
    except Exception as err:  # noqa: BLE001
        raise SearchError(f"the objective cannot be sent to a worker process "
                          f"({type(err).__name__}: {err})", hint="use workers=1") from None


# -- argument checks -----------------------------------------------------------------------------
def _check_objective(obj: Any) -> None:
    if not isinstance(obj, TableObjective):
        raise SearchError(f"objective must be a TableObjective, got {type(obj).__name__}",
                          hint="e.g. cml.TableObjective.from_dataset(cml.datasets.load(name))")


def _factories(obj: TableObjective, searchers: Any) -> dict[str, Factory]:
    if isinstance(searchers, str) or not isinstance(searchers, (Mapping, Sequence)):
        raise SearchError(f"searchers = {brief(searchers)} must be a list of names or a mapping "
                          "label -> factory",
                          hint=f"e.g. [{', '.join(repr(k) for k in SEARCHERS)}]")
    items = (list(searchers.items()) if isinstance(searchers, Mapping)
             else [(s, s) for s in searchers])
    if not items:
        raise SearchError("searchers is empty: nothing to compare",
                          hint="e.g. ['BayesianSearch', 'RandomSearch']")
    labels = [label for label, _ in items]
    dupes = sorted({str(x) for x in labels if labels.count(x) > 1})
    if dupes:
        raise SearchError(f"searchers: label(s) {dupes} appear more than once",
                          hint="give each a distinct label: {'bo': ..., 'bo-cost': ...}")
    out: dict[str, Factory] = {}
    for label, factory in items:
        if not isinstance(label, str) or not label:
            raise SearchError(f"searcher label {brief(label)} must be a non-empty string",
                              hint="e.g. {'bo': 'BayesianSearch'}")
        if isinstance(factory, str):
            out[label] = searcher_factory(obj, factory)
        elif callable(factory) and not isinstance(factory, type):
            out[label] = factory
        else:
            raise SearchError(f"searchers[{label!r}] = {brief(factory)} is neither a known name "
                              "nor "
                              "a seed -> searcher callable",
                              hint=f"use one of {', '.join(SEARCHERS)}, or "
                                   "searcher_factory(obj, kind, **options)")
    return out


#: Most seeds, trials per replay or workers of one comparison.
MAX_REPLAYS = 100_000


def _positive_int(name: str, value: Any) -> int:
    return check_count(name, value, high=MAX_REPLAYS, error=SearchError)


def _seeds(seeds: Any) -> list[int]:
    if isinstance(seeds, (int, np.integer)) and not isinstance(seeds, bool):
        return list(range(_positive_int("seeds", seeds)))
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not seeds:
        raise SearchError(f"seeds = {brief(seeds)} must be a positive int or a non-empty list "
                          "of ints",
                          hint="e.g. seeds=5 (seeds 0..4) or seeds=[0, 1, 2]")
    _positive_int("len(seeds)", len(seeds))
    bad = [s for s in seeds if not isinstance(s, (int, np.integer)) or isinstance(s, bool)
           or not 0 <= s <= MAX_SEED]
    if bad:
        raise SearchError(f"seeds {brief(bad)} are not ints in 0..2**63 - 1",
                          hint="e.g. seeds=[0, 1, 2]")
    out = [int(s) for s in seeds]
    if len(set(out)) != len(out):
        raise SearchError(f"seeds = {out} repeats a seed: the replays would be identical",
                          hint="pass distinct seeds")
    return out


def _check_runs(runs: Any, baseline: float | None) -> None:
    import pandas as pd

    if not isinstance(runs, pd.DataFrame):
        raise SearchError(f"runs must be a DataFrame, got {type(runs).__name__}",
                          hint="pass the output of compare_searchers(...)")
    need = ["searcher", "seed", "trial", "regret_pct"] + (["best"] if baseline is not None else [])
    missing = [c for c in need if c not in runs.columns]
    if missing:
        raise SearchError(f"runs lacks column(s) {missing}",
                          hint="pass the output of compare_searchers(...)")
    if len(runs) == 0:
        raise SearchError("runs is empty", hint="pass the output of compare_searchers(...)")
    if baseline is not None:
        try:
            ok = math.isfinite(float(baseline)) and float(baseline) > 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise SearchError(f"baseline = {brief(baseline)} must be a positive finite number",
                              hint="e.g. the default configuration's measured throughput")


def _threshold(p: Any) -> float:
    try:
        v = float(p)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and 0 <= v < 100):
        raise SearchError(f"within_pct = {p!r} must be a percentage in [0, 100)",
                          hint="e.g. within_pct=(5, 1)")
    return v


def _pct_name(p: float) -> str:
    return f"{p:g}"


def _first_within(g: pd.DataFrame, pct: float) -> int | None:
    hit = np.flatnonzero(g["regret_pct"].to_numpy(dtype=float) <= pct + 1e-9)
    return int(g["trial"].iloc[hit[0]]) if len(hit) else None


def _quartiles(name: str, values: Sequence[float]) -> dict[str, float]:
    q25, med, q75 = quartiles(values)
    return {name: med, f"{name}_q25": q25, f"{name}_q75": q75}
