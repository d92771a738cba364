"""History from related jobs for :class:`~cubicml_lab.search.BayesianSearch`: read, map, model.

``BayesianSearch(history=[...])`` takes finished trials of *other* jobs (another model size,
GPU count or device): campaign names of a :class:`~cubicml_lab.store.TrialStore`, pandas
DataFrames (knob columns, the objective, optionally ``status``) or
:class:`~cubicml_lab.datasets.Dataset` objects. This module turns them into one model of what
the history says about the target's configurations:

1. :func:`history_records` reads every entry as ``(config, status, value)`` records.
2. :func:`project_config` maps a history configuration onto the target space: a value the
   target space has is kept; an ordered knob's value it lacks (e.g. ``hidden = 5120`` of a 13B
   job in a 70B space) is mapped by its rank among the history's own values (the narrowest
   hidden size to the narrowest); a knob the history lacks, a choice the target lacks, or a
   mapped configuration that breaks the target's constraints makes the record unusable.
3. :class:`HistoryModel` fits a :class:`~cubicml_lab.surrogate.GPPredictor` on the log objective
   of the history's ok records (their own scale: levels of other jobs differ) and predicts its
   posterior mean ``h(x)`` for target configurations.

How the searcher uses ``h`` (its module doc): as the ranking of the first proposals when there is
no physics prior, and as one more term of the objective GP's prior mean, whose weight the GP fits
to the target's own trials. A history that does not rank the target's trials (Kendall tau of
``h`` against the observed values at most :data:`MIN_HISTORY_TAU` once
:data:`HISTORY_CHECK_MIN_OK` ok trials exist) is dropped from then on: related history helps,
unrelated history is caught after a few trials.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._params import brief
from ..errors import PredictorError, SearchError, SpaceError

if TYPE_CHECKING:
    from ..space import Space

__all__ = ["HISTORY_CHECK_MIN_OK", "MIN_HISTORY_TAU", "HistoryModel", "history_records",
           "project_config"]

#: Ok target trials needed before the history's ranking is checked against them.
HISTORY_CHECK_MIN_OK = 4
#: History whose prediction ranks the target's ok trials with a Kendall tau at most this is
#: dropped (0 would keep a coin flip; noise on a handful of trials puts tau near 0.2 by chance).
MIN_HISTORY_TAU = 0.2
#: The default store a campaign uses, read when ``history`` names campaigns and no store is given.
DEFAULT_STORE = "data/lab.sqlite"


def history_records(entries: Sequence[Any], objective: str, store: Any = None
                    ) -> list[tuple[str, list[dict[str, Any]]]]:
    """``(label, records)`` per history entry; each record ``{"config", "status", "value"}``.

    Args:
        entries: Campaign names (read from ``store``), DataFrames or Datasets.
        objective: The metric to read (a Dataset's own objective is used for a Dataset).
        store: A TrialStore, or the path of one; None: ``data/lab.sqlite`` if it exists.

    Raises:
        SearchError: An entry of another type, an unknown campaign, a missing store or
            objective column (the message names the entry and the fix).
    """
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise SearchError(f"history = {brief(entries)} must be a list of campaign names, "
                          "DataFrames or Datasets", hint="e.g. history=['gpt-13b-h100']")
    out = []
    for i, entry in enumerate(entries):
        where = f"history[{i}]"
        if isinstance(entry, str):
            store = _open_store(store, where, entry)
            if entry not in store.campaigns():
                raise SearchError(f"{where} = {entry!r} is not a campaign of {store.path}; it "
                                  f"has {store.campaigns()}",
                                  hint="name a campaign of that store, or pass store=...")
            recs = [{"config": dict(t.config), "status": t.status,
                     "value": _number(t.metrics.get(objective))}
                    for t in store.trials(entry, status=["ok", "oom", "failed", "timeout"])]
            out.append((entry, recs))
        elif hasattr(entry, "table") and hasattr(entry, "knobs") and hasattr(entry, "objective"):
            out.append((getattr(entry, "name", where),
                        _frame_records(entry.table, list(entry.knobs), entry.objective, where)))
        elif hasattr(entry, "columns") and hasattr(entry, "to_dict"):
            knobs = [c for c in entry.columns if c not in (objective, "status")
                     and not str(entry[c].dtype).startswith("float")]
            out.append((where, _frame_records(entry, knobs, objective, where)))
        else:
            raise SearchError(f"{where} is a {type(entry).__name__}, not a campaign name, "
                              "DataFrame or Dataset",
                              hint="pass campaign names (with store=...), DataFrames or Datasets")
    return out


def _open_store(store: Any, where: str, name: str) -> Any:
    from ..store import TrialStore

    if store is None:
        if not Path(DEFAULT_STORE).is_file():
            raise SearchError(f"{where} = {name!r} names a campaign, but no store was given and "
                              f"{DEFAULT_STORE} does not exist",
                              hint="pass store=cml.TrialStore(path) (or its path) with history")
        store = DEFAULT_STORE
    return store if isinstance(store, TrialStore) else TrialStore(store)


def _frame_records(df: Any, knobs: list[str], objective: str, where: str) -> list[dict]:
    if objective not in df.columns:
        raise SearchError(f"{where} has no column {objective!r} (columns: {list(df.columns)[:12]})",
                          hint="give the history the target's objective column")
    status = df["status"].tolist() if "status" in df.columns else [None] * len(df)
    recs = []
    for cfg, value, st in zip(df[knobs].to_dict("records"), df[objective].tolist(), status):
        value = _number(value)
        st = st if st is not None else ("ok" if value is not None else "failed")
        recs.append({"config": {k: _plain(v) for k, v in cfg.items()}, "status": str(st),
                     "value": value if st == "ok" else None})
    return recs


def _number(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _plain(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def project_config(space: Space, config: dict[str, Any],
                   seen: dict[str, list[Any]]) -> dict[str, Any] | None:
    """``config`` of another job as a configuration of ``space``, or None (module doc, step 2).

    Args:
        space: The target space.
        config: A history configuration.
        seen: Per knob, the sorted distinct values the history has (for the rank mapping).
    """
    out = {}
    for p in space.parameters:
        if p.name not in config:
            return None
        value, values = config[p.name], p.values() if p.is_discrete else None
        if values is None or value in values:
            out[p.name] = value
            continue
        if p.kind in ("choice", "bool") or p.name not in seen or len(seen[p.name]) < 1:
            return None
        own = seen[p.name]
        rank = own.index(value) / max(len(own) - 1, 1) if value in own else 0.5
        out[p.name] = values[int(round(rank * (len(values) - 1)))]
    try:
        out = space.project(out)
    except SpaceError:
        return None
    return out if space.contains(out) else None  # e.g. layers that pp no longer divides


class HistoryModel:
    """What the history says about the target's configurations: ``h(x)``, the posterior mean of
    a GP on the log objective of the history's ok trials (module doc).

    Args:
        space: The target space.
        entries, objective, store: As :func:`history_records`.
        direction: The objective's direction ("minimize" models ``log(1 / y)``).
        seed: Seed of the GP fit.

    Attributes:
        labels: One label per entry (campaign name, dataset name or ``history[i]``).
        n_used: History ok trials the GP was fitted on.
        active: False once the check against the target's trials dropped it.
        tau: The last Kendall tau of ``h`` against the target's ok trials (None before).

    Raises:
        SearchError: No usable ok trial in an entry (the message says why).
    """

    def __init__(self, space: Space, entries: Sequence[Any], objective: str, *,
                 direction: str = "maximize", store: Any = None, seed: int = 0) -> None:
        self.space = space
        recs = history_records(entries, objective, store)
        self.labels = [label for label, _ in recs]
        configs, values = [], []
        for i, (label, rows) in enumerate(recs):
            seen: dict[str, set[Any]] = {}
            for r in rows:
                for k, v in r["config"].items():
                    if isinstance(v, (int, float, str)):
                        seen.setdefault(k, set()).add(v)
            ordered = {k: sorted(v, key=_sort_key) for k, v in seen.items()}
            n = 0
            for r in rows:
                if r["status"] != "ok" or r["value"] is None or r["value"] <= 0:
                    continue
                cfg = project_config(space, r["config"], ordered)
                if cfg is not None:
                    configs.append(cfg)
                    values.append(r["value"] if direction == "maximize" else 1.0 / r["value"])
                    n += 1
            if n == 0:
                raise SearchError(
                    f"history[{i}] ({label!r}): none of its {len(rows)} trials is an ok trial "
                    f"whose configuration maps onto this space (knobs {space.names})",
                    hint="give history with the same knob names and a positive objective")
        self.n_used = len(configs)
        self.active = True
        self.tau: float | None = None
        self.seed = seed
        self.gp: Any = None
        self._train = (configs, values)
        self._cache: dict[str, float] = {}

    def _fit(self) -> None:
        from ..surrogate import GPPredictor

        try:
            self.gp = GPPredictor(self.space, "history", seed=self.seed).fit(*self._train)
        except PredictorError as err:
            raise SearchError(f"cannot model the history ({self.n_used} ok trials): "
                              f"{err.message}", hint="give more varied history") from None

    def predict(self, configs: Sequence[dict], keys: Sequence[str] | None = None) -> np.ndarray:
        """``h(x)`` (log objective of the history, larger is better) per configuration, cached
        by key (a search scores the same pool at every ask)."""
        keys = list(keys) if keys is not None else [self.space.key(c) for c in configs]
        new = [i for i, k in enumerate(keys) if k not in self._cache]
        if new and self.gp is None:
            self._fit()
        if new:
            X = self.space.encode([configs[i] for i in new])
            mu, _ = self.gp.posterior_encoded(X)
            self._cache.update({keys[i]: float(m) for i, m in zip(new, mu)})
        return np.array([self._cache[k] for k in keys], dtype=np.float64)

    def check(self, configs: Sequence[dict], model_values: np.ndarray) -> bool:
        """Keep the history only while it ranks the target's ok trials: once
        :data:`HISTORY_CHECK_MIN_OK` exist, a Kendall tau of ``h`` against ``model_values``
        (larger is better) at most :data:`MIN_HISTORY_TAU` drops it for good."""
        from ..surrogate.metrics import kendall_tau

        if not self.active or len(configs) < HISTORY_CHECK_MIN_OK:
            return self.active
        tau = kendall_tau(model_values, self.predict(configs))
        self.tau = float(tau) if np.isfinite(tau) else 0.0
        if self.tau <= MIN_HISTORY_TAU:
            self.active = False
        return self.active


def _sort_key(v: Any) -> tuple:
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))
