"""What a fitted predictor has learned: how speed depends on each knob, and which knobs matter.

Model-agnostic views of any fitted :class:`~cubicml_lab.surrogate.base.BasePredictor`
(:class:`~cubicml_lab.surrogate.GPPredictor` or :class:`~cubicml_lab.surrogate.MLPPredictor`),
computed only from its public ``predict`` and ``predict_interval``:

* :func:`partial_dependence`: for each value of a knob, the prediction averaged over a set of
  background configurations (e.g. the measured ones) with that knob set to the value;
* :func:`slices`: the same around one reference configuration (one knob changed at a time);
* :func:`knob_importance`: how much each knob's partial dependence varies, one row per knob;
* :func:`feasibility_map`: the probability that a configuration runs, averaged the same way,
  over a grid of two knobs.

Averages are taken in the model's units (the log of the objective by default), so with a log
model the partial dependence is the geometric mean of the predicted medians: a knob that halves
speed everywhere halves it. A configuration made invalid by changing a knob (a constraint of the
space fails) is left out of that value's average (``n`` counts those kept). :meth:`GPPredictor
.cost_shares <cubicml_lab.surrogate.GPPredictor.cost_shares>` and :meth:`GPPredictor.importance
<cubicml_lab.surrogate.GPPredictor.importance>` give the GP's own views.

Example:
    >>> from cubicml_lab.space import Space, PowerOfTwo, Bool
    >>> from cubicml_lab.surrogate import GPPredictor
    >>> space = Space([PowerOfTwo("micro_batch", 1, 16), Bool("compile")])
    >>> cfgs = space.enumerate()
    >>> pred = GPPredictor(space).fit(cfgs, [100.0 * c["micro_batch"] for c in cfgs])
    >>> knob_importance(pred, cfgs).index.tolist()
    ['micro_batch', 'compile']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._params import brief
from ..errors import PredictorError

if TYPE_CHECKING:
    import pandas as pd

    from ..space import Space

__all__ = ["MAX_GRID", "feasibility_map", "knob_importance", "knob_values", "partial_dependence",
           "slices"]

#: Most values per knob: a knob with more (a wide ``Int``, a ``Float``) is evaluated at this many
#: evenly spaced values (on the knob's log scale where it has one).
MAX_GRID = 12


def knob_values(space: Space, knob: str, max_values: int = MAX_GRID) -> list[Any]:
    """The values at which :func:`partial_dependence` evaluates ``knob``: all of a discrete
    knob's values, or ``max_values`` evenly spaced ones when it has more (or is a ``Float``)."""
    param = space[knob]
    if param.is_discrete and len(param.values()) <= max_values:
        return param.values()
    if param.is_discrete and len(param.encoded_names()) == 1:
        # evenly spaced in the knob's encoding (log for Int(log=True)), decoded to the nearest
        # allowed value: a wide Int is never listed
        (lo, hi), = param.encoded_bounds()
        out = [param.decode([float(t)]) for t in np.linspace(lo, hi, max_values)]
        return list(dict.fromkeys(out))
    if param.is_discrete:  # one-hot categories: evenly spaced positions in their order
        values = param.values()
        idx = np.unique(np.linspace(0, len(values) - 1, max_values).round().astype(int))
        return [values[i] for i in idx]
    lo, hi = param.encoded_bounds()[0]
    grid = np.linspace(lo, hi, max_values)
    return [float(math.exp(g)) if param.log else float(g) for g in grid]


def _background(configs: Sequence[dict], max_configs: int, seed: int) -> list[dict]:
    if isinstance(configs, dict):
        raise PredictorError("configs must be a list of configuration dicts, got one dict",
                             hint="wrap it in a list: [config]")
    configs = [dict(c) for c in configs]
    if not configs:
        raise PredictorError("configs is empty",
                             hint="pass the background configurations, e.g. the measured ones")
    if len(configs) > max_configs:
        keep = np.sort(np.random.default_rng(seed).permutation(len(configs))[:max_configs])
        configs = [configs[i] for i in keep]
    return configs


def _knobs(space: Space, knobs: str | Sequence[str] | None) -> list[str]:
    names = list(space.names) if knobs is None else [knobs] if isinstance(knobs, str) \
        else list(knobs)
    unknown = [k for k in names if k not in space.names]
    if unknown or not names:
        raise PredictorError(f"knob(s) {unknown or names} not in the space",
                             hint=f"choose among {', '.join(space.names)}")
    return names


def _check_predictor(predictor: Any) -> Space:
    space = getattr(predictor, "space", None)
    if space is None or not hasattr(predictor, "predict_interval"):
        raise PredictorError(f"{type(predictor).__name__} is not a cubicml_lab predictor",
                             hint="pass a fitted GPPredictor or MLPPredictor")
    if getattr(predictor, "model", None) is None:
        raise PredictorError(f"{type(predictor).__name__} is not fitted",
                             hint="call pred.fit(configs, values) first")
    return space


def _varied(space: Space, background: list[dict], knobs: list[str], max_values: int
            ) -> tuple[list[tuple[str, int, Any]], list[dict], list[int]]:
    """Every (knob, position, value) and the valid background configs with it set: the
    configs, and for each the index of its (knob, position, value)."""
    cells, varied, owner = [], [], []
    for knob in knobs:
        for pos, value in enumerate(knob_values(space, knob, max_values)):
            cells.append((knob, pos, value))
            for cfg in background:
                new = {**cfg, knob: value}
                if space.contains(new):
                    varied.append(new)
                    owner.append(len(cells) - 1)
    return cells, varied, owner


def partial_dependence(predictor: Any, configs: Sequence[dict],
                       knobs: str | Sequence[str] | None = None, *, level: float = 0.95,
                       max_configs: int = 200, max_values: int = MAX_GRID,
                       seed: int = 0) -> pd.DataFrame:
    """How the predicted objective depends on each knob, averaged over the other knobs.

    For each knob and each of its values (:func:`knob_values`), every background configuration
    gets that value and the predictions are averaged: in log units with ``log_objective``
    (geometric means), else plainly. The band averages the per-configuration central
    ``level`` intervals of the noise-free objective the same way: the interval of the average
    if the model's errors at the background configurations moved together, so at most that
    wide.

    Args:
        predictor: A fitted GPPredictor or MLPPredictor.
        configs: Background configurations, e.g. the measured ones; more than ``max_configs``
            are subsampled (seeded).
        knobs: One knob, several, or None for every knob of the space, in the space's order.
        level: Coverage of the band, in (0, 1).
        max_configs: Most background configurations used.
        max_values: Most values evaluated per knob.
        seed: Seed of the subsample.

    Returns:
        DataFrame, one row per (knob, value): ``knob``, ``position`` (index of the value in
        the knob's grid), ``value``, ``mean``, ``lo``, ``hi`` (objective units, e.g. tokens/s)
        and ``n`` (background configurations that stay valid with that value; NaN means
        where ``n == 0``).

    Raises:
        PredictorError: An unfitted predictor, an unknown knob, empty ``configs`` or
            configurations outside the space.
    """
    import pandas as pd

    space = _check_predictor(predictor)
    names = _knobs(space, knobs)
    background = _background(configs, max_configs, seed)
    cells, varied, owner = _varied(space, background, names, max_values)
    point = lo = hi = np.zeros(0)
    if varied:
        point, _ = predictor.predict(varied)
        lo, hi = predictor.predict_interval(varied, level=level, observation_noise=False)
    log = bool(getattr(predictor, "log_objective", False))
    to, back = (np.log, np.exp) if log else (np.asarray, np.asarray)
    owner_arr = np.asarray(owner, dtype=np.int64)
    rows = []
    for i, (knob, pos, value) in enumerate(cells):
        mask = owner_arr == i
        n = int(mask.sum())
        avg = [float(back(np.mean(to(a[mask])))) if n else math.nan for a in (point, lo, hi)]
        rows.append({"knob": knob, "position": pos, "value": value, "mean": avg[0],
                     "lo": avg[1], "hi": avg[2], "n": n})
    return pd.DataFrame(rows, columns=["knob", "position", "value", "mean", "lo", "hi", "n"])


def slices(predictor: Any, reference: dict, knobs: str | Sequence[str] | None = None, *,
           level: float = 0.95, max_values: int = MAX_GRID) -> pd.DataFrame:
    """The prediction along each knob through one reference configuration, the others fixed.

    Args:
        predictor: A fitted GPPredictor or MLPPredictor.
        reference: The configuration the slices pass through (e.g. the best measured).
        knobs, level, max_values: As :func:`partial_dependence`.

    Returns:
        As :func:`partial_dependence` (``n`` is 1, or 0 where the changed configuration is not
        in the space), plus ``reference``: True on the reference's own value of each knob.
        ``lo``/``hi`` are the central ``level`` interval of the noise-free objective there.

    Raises:
        PredictorError: As :func:`partial_dependence`, or a reference outside the space.
    """
    if not isinstance(reference, dict):
        raise PredictorError(f"reference must be one configuration dict, got "
                             f"{type(reference).__name__}", hint="e.g. configs[0]")
    space = _check_predictor(predictor)
    if not space.contains(reference):
        raise PredictorError(f"reference {brief(reference)} is not in the space",
                             hint="pass a valid configuration, e.g. a measured one")
    out = partial_dependence(predictor, [reference], knobs, level=level, max_configs=1,
                             max_values=max_values)
    out["reference"] = [_same(v, reference[k]) for k, v in zip(out["knob"], out["value"],
                                                                strict=True)]
    return out


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (
        isinstance(a, (int, float)) and isinstance(b, (int, float))
        and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def knob_importance(predictor: Any, configs: Sequence[dict],
                    knobs: str | Sequence[str] | None = None, *, max_configs: int = 200,
                    max_values: int = MAX_GRID, seed: int = 0) -> pd.DataFrame:
    """Which knobs matter: the spread of each knob's partial dependence.

    ``importance`` is the standard deviation, over the knob's values (equally weighted), of its
    :func:`partial_dependence` in the model's units. With a log model that is in log units:
    about the relative change, 0.1 ~ +/-10 %. ``max_over_min`` says the same as a factor: the
    partial dependence at the knob's best value over that at its worst (with a log model; NaN
    on a raw scale). Works for any fitted predictor, and includes what a GP's cost-model mean
    and derived inputs explain (unlike :meth:`GPPredictor.importance
    <cubicml_lab.surrogate.GPPredictor.importance>`, the kernel's view).

    Args:
        predictor, configs, knobs, max_configs, max_values, seed: As
            :func:`partial_dependence`.

    Returns:
        DataFrame indexed by knob, sorted by ``importance`` descending, with columns
        ``importance``, ``max_over_min``, ``value_at_max`` and ``value_at_min`` (the knob's
        values with the highest and lowest partial dependence).

    Raises:
        PredictorError: As :func:`partial_dependence`.
    """
    import pandas as pd

    pdp = partial_dependence(predictor, configs, knobs, max_configs=max_configs,
                             max_values=max_values, seed=seed)
    log = bool(getattr(predictor, "log_objective", False))
    rows = {}
    for knob, part in pdp.groupby("knob", sort=False):
        part = part[part["n"] > 0]
        vals = np.log(part["mean"].to_numpy()) if log else part["mean"].to_numpy()
        hi, lo = int(np.argmax(vals)), int(np.argmin(vals))
        rows[knob] = {"importance": float(np.std(vals)),
                      "max_over_min": float(np.exp(vals[hi] - vals[lo])) if log else math.nan,
                      "value_at_max": part["value"].iloc[hi],
                      "value_at_min": part["value"].iloc[lo]}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "knob"
    return out.sort_values("importance", ascending=False, kind="stable")


def feasibility_map(model: Any, configs: Sequence[dict], x: str, y: str, *,
                    memory_limit: float | None = None, max_configs: int = 200,
                    max_values: int = MAX_GRID, seed: int = 0) -> pd.DataFrame:
    """Probability that a configuration runs, over a grid of two knobs.

    For each pair of values of ``x`` and ``y``, every background configuration gets them and
    the predicted probabilities are averaged (a partial dependence of P(runs)).

    Args:
        model: A fitted :class:`~cubicml_lab.surrogate.FeasibilityModel`, or a predictor after
            a ``feasibility`` model attached (its ``predict_feasibility`` is used).
        configs: Background configurations, e.g. every measured one (failed ones included).
        x, y: Two different knobs of the space.
        memory_limit: Device memory in GiB: also ask that the peak memory fit in it.
        max_configs, max_values, seed: As :func:`partial_dependence`.

    Returns:
        DataFrame, one row per (x value, y value) in grid order: columns ``x`` and ``y`` (named
        after the knobs), ``p_runs`` (0-1; NaN where no configuration stays valid) and ``n``.

    Raises:
        PredictorError: A model without either prediction method, unknown or equal knobs,
            empty ``configs`` or configurations outside the space.
    """
    import pandas as pd

    predict = getattr(model, "predict_feasibility", None) or getattr(model, "predict", None)
    space = getattr(model, "space", None)
    if predict is None or space is None:
        raise PredictorError(f"{type(model).__name__} cannot predict feasibility",
                             hint="pass a fitted FeasibilityModel, or a predictor with one "
                                  "attached: pred.feasibility = FeasibilityModel(space).fit(...)")
    _knobs(space, [x, y])
    if x == y:
        raise PredictorError(f"x and y are both {x!r}", hint="choose two different knobs")
    background = _background(configs, max_configs, seed)
    cells, varied, owner = [], [], []
    for vx in knob_values(space, x, max_values):
        for vy in knob_values(space, y, max_values):
            cells.append((vx, vy))
            for cfg in background:
                new = {**cfg, x: vx, y: vy}
                if space.contains(new):
                    varied.append(new)
                    owner.append(len(cells) - 1)
    p = np.asarray(predict(varied, memory_limit=memory_limit) if varied else [], dtype=float)
    owner_arr = np.asarray(owner, dtype=np.int64)
    rows = []
    for i, (vx, vy) in enumerate(cells):
        mask = owner_arr == i
        rows.append({x: vx, y: vy, "p_runs": float(p[mask].mean()) if mask.any() else math.nan,
                     "n": int(mask.sum())})
    return pd.DataFrame(rows, columns=[x, y, "p_runs", "n"])
