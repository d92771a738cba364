"""What a search has learned about its prior: which cost terms the trials moved, by how much,
and how well the calibrated model predicts now.

A :class:`~cubicml_lab.search.BayesianSearch` with a ``cost_model`` (e.g.
``LLMTrainingModel.cost_terms``) fits the objective GP's prior mean ``b + c log(sum_i w_i t_i)``
to its trials (:mod:`~cubicml_lab.surrogate.gp`). The model as given weighs every term 1 and
has slope -1 (a speed goes as one over the summed seconds). :func:`prior_report` reads what the
fit made of that, so a person learns something about their cluster and not only a layout:

* **Multipliers.** ``m_i = w_i / K``, with ``K`` the geometric mean over the ok trials of
  ``sum w t / sum t``: on the trials, term ``i`` costs ``m_i`` times what the model says,
  relative to the step as a whole (a pipeline bubble at 0.4 is one that another schedule
  shrank). Each comes with a 95% interval: the Laplace approximation of the mean as a
  regression on the trials, with what the calibrated mean leaves unexplained as its noise (at
  least a measurement's own noise, as the GP has it) and the mean's prior on each weight
  (``UNIT_PRIOR_SD`` with ``term_units``); a table replayed without noise still has that
  residual. A term is **identified** when it carries at least
  ``MIN_SHARE`` of some trial's calibrated cost and its interval spans at most
  ``IDENTIFIED_FACTOR`` either way: the trials tell its weight apart from the others' (two
  terms that move together across the trials, or one that never matters, are not). It
  **moved** when identified, outside ``[1 / MOVED_FACTOR, MOVED_FACTOR]`` and its interval
  excludes 1.
* **Slope.** The fitted ``c``; away from -1 by more than ``SLOPE_TOL`` the model's
  differences between layouts are too large (``|c| < 1``) or too small.
* **How well each predicts the ok trials**: Kendall tau and the median absolute error of the
  objective, for the model as given and the calibrated mean alone (each with its one free
  scale fitted to the trials),
  and the GP (leave-one-out, closed form). A GP that ranks the trials much better than the
  calibrated mean is modelling structure the cost model lacks (another formula, not another
  constant): the report says so (``STRUCTURE_TAU_GAP``).
* **Memory**: with a ``memory_model``, the told trials the model said fit that ran out of
  memory, and those it said would not fit that ran.

The report is the search's view after its last fit: it needs at least ``MIN_OK`` ok trials
and a cost model. :attr:`PriorReport.headline` is the one line that a proposal's "why" and the
dashboard quote.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._html import card
from ..errors import SearchError
from ..surrogate.gp import UNIT_PRIOR_SD

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["IDENTIFIED_FACTOR", "MIN_OK", "MIN_SHARE", "MOVED_FACTOR", "SLOPE_TOL",
           "STRUCTURE_TAU_GAP", "WEIGHT_PRIOR_SD", "PriorReport", "prior_report"]

#: Ok trials a report needs (fewer say nothing about the terms' weights).
MIN_OK = 4
#: A multiplier outside ``[1 / MOVED_FACTOR, MOVED_FACTOR]`` is a term the trials moved.
MOVED_FACTOR = 1.5
#: A term carrying less than this share of every trial's calibrated cost is not identified.
MIN_SHARE = 0.05
#: Nor is one whose multiplier's 95% interval spans more than this factor either way.
IDENTIFIED_FACTOR = 4.0
#: The width of the prior on a log weight without ``term_units`` (the cost mean's own prior).
WEIGHT_PRIOR_SD = 4.0
#: A slope further than this from the model's -1 is reported.
SLOPE_TOL = 0.25
#: The GP ranking the trials better than the calibrated mean by this much Kendall tau: the cost
#: model misses structure that no re-weighting of its terms expresses.
STRUCTURE_TAU_GAP = 0.15


@dataclass(frozen=True)
class PriorReport:
    """What the trials taught a search about its cost model (module doc).

    Attributes:
        n_ok: Ok trials the GP was fitted on.
        terms: One row per cost term: ``model share`` (the model's median share of a trial's
            cost), ``calibrated share`` (the same under the fitted weights), ``multiplier``,
            ``identified`` and ``moved``.
        slope: The fitted log-slope ``c`` (the model as given: -1).
        quality: One row per predictor (``model as given``, ``calibrated``, ``GP (leave-one-out)``):
            ``kendall_tau`` and ``median_abs_error_pct`` over the ok trials.
        memory: With a memory model: ``{"said fits": n, "of which oom": n, "said oom": n,
            "of which ran": n}``; else None.
        moved: ``(term, multiplier)`` of each moved term, largest change first.
        headline: One line: what moved, or that the prior holds.
    """

    n_ok: int
    terms: pd.DataFrame
    slope: float
    quality: pd.DataFrame
    memory: dict[str, int] | None
    moved: list[tuple[str, float]] = field(default_factory=list)
    headline: str = ""

    @property
    def prior_is_off(self) -> bool:
        """True when a term moved, the slope is off, the GP ranks much better than the
        calibrated model, or the memory model was wrong about a told trial."""
        return bool(self.moved) or abs(self.slope + 1.0) > SLOPE_TOL or self._structure() \
            or bool(self.memory and (self.memory["of which oom"] or self.memory["of which ran"]))

    def _structure(self) -> bool:
        q = self.quality["kendall_tau"]
        gp, cal = q.get("GP (leave-one-out)"), q.get("calibrated")
        return bool(gp is not None and cal is not None and np.isfinite(gp) and np.isfinite(cal)
                    and gp - cal >= STRUCTURE_TAU_GAP)

    def _facts(self) -> list[tuple[str, Any]]:
        facts: list[tuple[str, Any]] = [("verdict", self.headline), ("ok trials", self.n_ok),
                                        ("slope (model: -1)", f"{self.slope:.2f}")]
        for name, row in self.quality.iterrows():
            facts.append((f"{name}: Kendall tau, median error",
                          f"{row['kendall_tau']:.2f}, {row['median_abs_error_pct']:.1f}%"))
        if self.memory is not None:
            m = self.memory
            facts.append(("memory model", f"said fits {m['said fits']} ({m['of which oom']} ran "
                          f"out of memory); said oom {m['said oom']} ({m['of which ran']} ran)"))
        return facts

    def _rows(self) -> list[list[str]]:
        """One readable row per term: shares in %, the multiplier and its interval, a verdict."""
        out = []
        for name, r in self.terms.iterrows():
            seen = np.isfinite(r["multiplier"])
            verdict = ("no trial showed it" if not seen else "moved" if r["moved"] else
                       "holds" if r["identified"] else "not identified")
            out.append([str(name), f"{100 * r['model share']:.1f}%",
                        f"{100 * r['calibrated share']:.1f}%",
                        f"x{r['multiplier']:.2g}" if seen else "",
                        f"{r['95% low']:.2g} – {r['95% high']:.2g}" if seen else "", verdict])
        return out

    _COLUMNS = ("term", "model share", "calibrated share", "multiplier", "95% interval", "")

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        import pandas as pd

        lines = ["PriorReport"] + [f"  {k}: {v}" for k, v in self._facts()]
        table = pd.DataFrame(self._rows(), columns=list(self._COLUMNS)).set_index("term")
        lines.append(table.to_string())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return card("What the trials taught the prior", self._facts(),
                    table=(self._COLUMNS, self._rows()),
                    note="share: of a trial's modelled cost (median over the trials); "
                         "multiplier: what a term costs on the trials against what the model "
                         "says, relative to the whole step; report.terms holds the figures")


def _tau(a: np.ndarray, b: np.ndarray) -> float:
    from ..surrogate.metrics import kendall_tau

    return float(kendall_tau(a, b)) if len(a) >= 2 else math.nan


def _quality(y: np.ndarray, preds: dict[str, np.ndarray]) -> pd.DataFrame:
    """Kendall tau and median absolute error (% of the objective) of each prediction of the
    model-unit targets ``y`` (logs: the error of a log is a ratio)."""
    import pandas as pd

    rows = {name: {"kendall_tau": _tau(y, p),
                   "median_abs_error_pct": 100.0 * float(np.median(np.abs(np.expm1(p - y))))}
            for name, p in preds.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def _memory(search: Any) -> dict[str, int] | None:
    """The memory model's verdicts on the told trials (module doc), or None without one."""
    from ..surrogate.terms import evaluate_many

    if search.memory_model is None or search.memory_limit_gib is None:
        return None
    told = [h for h in search._history if h["status"] in ("ok", "oom")]
    if not told:
        return {"said fits": 0, "of which oom": 0, "said oom": 0, "of which ran": 0}
    gib = np.asarray(evaluate_many("memory_model", search.memory_model,
                                   [h["config"] for h in told]), dtype=float).reshape(-1)
    fits = gib <= float(search.memory_limit_gib)
    oom = np.array([h["status"] == "oom" for h in told])
    return {"said fits": int(fits.sum()), "of which oom": int((fits & oom).sum()),
            "said oom": int((~fits).sum()), "of which ran": int((~fits & ~oom).sum())}


def _headline(moved: list[tuple[str, float]], slope: float, structure: bool,
              memory: dict[str, int] | None, gp_tau: float) -> str:
    parts = [f"{name} x{m:.2g}" for name, m in moved[:3]]
    if abs(slope + 1.0) > SLOPE_TOL:
        parts.append(f"slope {slope:.2f} (model -1)")
    if structure:
        parts.append(f"structure the terms lack (GP tau {gp_tau:.2f})")
    if memory and memory["of which oom"]:
        parts.append(f"{memory['of which oom']} of {memory['said fits']} said to fit ran out "
                     "of memory")
    if memory and memory["of which ran"]:
        parts.append(f"{memory['of which ran']} said not to fit ran")
    if not parts:
        return "the prior holds: no term moved by more than " \
               f"x{MOVED_FACTOR:g} on the trials"
    return "the prior is off: " + "; ".join(parts)


def prior_report(search: Any) -> PriorReport:
    """What ``search`` (a :class:`~cubicml_lab.search.BayesianSearch` with a ``cost_model``)
    has learned about its cost model from the trials told so far (module doc).

    Raises:
        SearchError: Without a cost model, with fewer than :data:`MIN_OK` ok trials, or when
            the GP cannot be fitted (the message says why).
    """
    import pandas as pd

    if getattr(search, "cost_model", None) is None:
        raise SearchError("prior_report() needs a search with a cost_model",
                          hint="BayesianSearch(space, cost_model=job.cost_terms, ...)")
    n_ok = sum(h["status"] == "ok" for h in search._history)
    if n_ok < MIN_OK:
        raise SearchError(f"prior_report() needs {MIN_OK} ok trials, the search has {n_ok}",
                          hint="run more trials first")
    with search._fit_lock:  # the fit and its rows together, whatever another thread tells
        pred = search.fit_predictor()
        configs = list(search._current_data()[0])
        y, mean, loo = pred.at_training()
    mean = mean + float(np.mean(y - mean))  # the kernel may hold a constant: scale refitted
    if len(y) != len(configs):
        raise SearchError(f"the GP holds {len(y)} rows, the search {len(configs)}",
                          hint="ask for the report again")
    weights, slope = pred.cost_calibration()
    names = _term_names(pred, len(weights), configs[0])
    logs = pred._logs("cost_model", pred.cost_model, configs, "configs", len(weights)).numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        raw = np.logaddexp.reduce(logs, axis=1)
        cal = np.logaddexp.reduce(logs + np.log(weights), axis=1)
        mult = weights / math.exp(float(np.mean(cal - raw)))
        share_model = np.exp(logs - raw[:, None])
        share_cal = np.exp(logs + np.log(weights) - cal[:, None])
    mult = np.where(np.nanmax(share_model, axis=0) > 0, mult, np.nan)  # no trial showed it
    units = getattr(pred.cost_model, "term_units", None)
    noise = float(getattr(pred, "_new_noise_var", 0.0) or 0.0)  # a new measurement's
    se = _log_multiplier_se(share_cal, cal, slope, max(float(np.mean((y - mean) ** 2)), noise),
                            UNIT_PRIOR_SD if units is not None else WEIGHT_PRIOR_SD)
    low, high = mult * np.exp(-1.96 * se), mult * np.exp(1.96 * se)
    identified = (np.nanmax(share_cal, axis=0) >= MIN_SHARE) & (1.96 * se <= math.log(
        IDENTIFIED_FACTOR))
    moved_mask = identified & (((mult > MOVED_FACTOR) & (low > 1.0))
                               | ((mult < 1.0 / MOVED_FACTOR) & (high < 1.0)))
    terms = pd.DataFrame({"model share": np.nanmedian(share_model, axis=0),
                          "calibrated share": np.nanmedian(share_cal, axis=0),
                          "multiplier": mult, "95% low": low, "95% high": high,
                          "identified": identified, "moved": moved_mask},
                         index=pd.Index(names, name="term"))
    moved = sorted(((n, float(m)) for n, m, mv in zip(names, mult, moved_mask) if mv),
                   key=lambda t: -abs(math.log(t[1])))
    as_given = -raw + float(np.mean(y + raw))  # the model's one free scale fitted
    quality = _quality(y, {"model as given": as_given, "calibrated": mean,
                           "GP (leave-one-out)": loo})
    memory = _memory(search)
    report = PriorReport(n_ok=len(configs), terms=terms, slope=slope, quality=quality,
                         memory=memory, moved=moved)
    headline = _headline(moved, slope, report._structure(), memory,
                         float(quality.loc["GP (leave-one-out)", "kendall_tau"]))
    return PriorReport(n_ok=len(configs), terms=terms, slope=slope, quality=quality,
                       memory=memory, moved=moved, headline=headline)


def _log_multiplier_se(shares: np.ndarray, log_total: np.ndarray, slope: float,
                       resid_var: float, prior_sd: float) -> np.ndarray:
    """Standard errors of the terms' log multipliers (module doc, "Multipliers"): the Laplace
    approximation of the mean ``g = b + c log sum_i w_i t_i`` as a regression on the trials,
    with what the calibrated mean leaves unexplained as its noise and a normal prior of width
    ``prior_sd`` on each log weight. The derivative of ``g`` in ``log w_i`` is ``c`` times
    term ``i``'s share; ``b`` and ``c`` are fitted alongside (their uncertainty is taken in),
    and the multipliers are normalised by the shares' mean (the common factor ``b`` absorbs)."""
    n, k = shares.shape
    shares = np.nan_to_num(shares)
    jac = np.column_stack([np.ones(n), log_total - log_total.mean(), slope * shares])
    info = jac.T @ jac / max(resid_var, 1e-6)
    info[2:, 2:] += np.eye(k) / prior_sd**2
    info += 1e-9 * np.eye(k + 2)
    cov = np.linalg.pinv(info)[2:, 2:]
    contrast = np.eye(k) - np.outer(np.ones(k), shares.mean(0))
    return np.sqrt(np.clip(np.diag(contrast @ cov @ contrast.T), 0.0, None))


def _term_names(pred: Any, count: int, config: dict) -> list[str]:
    """The cost model's term names: its ``term_names``, else the keys of the mapping it
    returns, else ``term 0``, ...; a history term appended by the search is ``history``."""
    from .prior import PriorTerms

    fn, extra = pred.cost_model, []
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, PriorTerms):
        fn, extra = owner.cost_model, ["history"]
    names = None if fn is None else getattr(fn, "term_names", None)
    if names is None and fn is not None:
        try:
            row = fn(dict(config))
        except Exception:  # noqa: BLE001 - a user's function: the fit already called it
            row = None
        names = list(row) if isinstance(row, Mapping) else None
    names = [str(n) for n in (names or [])]
    if len(names) + len(extra) != count:
        names = [f"term {i}" for i in range(count - len(extra))]
    return names + extra
