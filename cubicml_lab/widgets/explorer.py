"""`PredictorExplorer`: one control per knob -> the predicted objective, its 95% interval and
P(fits)."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from .._html import fmt
from ..errors import CubicMLError, SearchError, SpaceError
from ..space import Space
from ._common import _FONT, _error_html, _interval, _knob_control, _unit

if TYPE_CHECKING:
    pass


class PredictorExplorer(W.VBox):
    """One control per knob -> the predictor's objective, 95% interval and P(fits).

    Ordered parameters get a slider over their values, choices a dropdown, bools a checkbox,
    floats a float slider. A combination outside the space shows the constraint it breaks
    instead of a number.

    Args:
        predictor: A fitted predictor with ``predict`` and ``predict_interval`` (e.g.
            :class:`~cubicml_lab.surrogate.GPPredictor`).
        space: The space of its configurations.
        reference: A configuration to start from; predictions are also shown relative to its
            prediction.
        memory_limit: Device memory in GiB for P(fits) (with a memory model).
        feasibility: A fitted :class:`~cubicml_lab.surrogate.FeasibilityModel` for P(fits);
            default: the predictor's own (its ``feasibility`` attribute), if any. Without one P(fits) is
            omitted.
        unit: Unit of the objective shown after the numbers, e.g. ``"tokens/s"``; default:
            what the objective's name says (``step_time_s``: s); :meth:`from_search` also
            reads it from the metrics told to the search (``tokens_per_s``: tokens/s).

    Attributes:
        controls: Knob name -> control widget.
        prediction: The last prediction: ``predicted``, ``lower``, ``upper``, ``p_fits`` (None
            when not known), ``relative`` (to the reference's prediction) and ``error``.
    """

    def __init__(self, predictor: Any, space: Space, *,
                 reference: Mapping[str, Any] | None = None, memory_limit: float | None = None,
                 feasibility: Any = None, unit: str | None = None) -> None:
        self.predictor, self.space = predictor, space
        objective = getattr(predictor, "objective", "objective")
        self.memory_limit, self.unit = memory_limit, unit or _unit(objective)
        self.feasibility = feasibility  # else the predictor's own, if it has one
        if feasibility is None and getattr(predictor, "feasibility", None) is not None:
            self._p_fits: Callable[..., Any] | None = predictor.predict_feasibility
        else:
            self._p_fits = None if feasibility is None else feasibility.predict
        self.reference = space.project(reference) if reference is not None else None
        self.prediction: dict[str, Any] = {}
        self._flip: str | None = None  # "inverse" / "negate": the model predicts 1/y or -y
        self._holding = False
        start = self.reference or space.sample(1, seed=0)[0]
        self.controls = {p.name: _knob_control(p, start[p.name], slider=True)
                         for p in space.parameters}
        for c in self.controls.values():
            c.observe(lambda _: self.update(), names="value")
        self.output = W.HTML()
        title = (f"predicted {objective}" + (f" ({self.unit})" if self.unit else "")
                 + f" · {type(predictor).__name__}")
        if getattr(predictor, "n_train", None):
            title += f" on {predictor.n_train} trials"
        super().__init__([W.HTML(f"<b style='{_FONT}'>{html.escape(title)}</b>"),
                          *self.controls.values(), self.output])
        self.add_class("cubicml-predictor-explorer")
        self.update()

    @classmethod
    def from_search(cls, search: Any, **kwargs: Any) -> PredictorExplorer:
        """The GP and feasibility model of a Bayesian search, fitted on every trial told to it
        (``search.fit_predictor()``, where the search has it; else its last ask's), in the
        objective's units (a minimising search's model predicts 1/y, or -y, and is turned
        back).

        Raises:
            SearchError: While the search has no GP yet, saying why.
        """
        fit = getattr(search, "fit_predictor", None)
        if callable(fit):
            fit()  # up to date with every trial told; raises with the reason where it cannot
        if getattr(search, "predictor", None) is None:
            raise SearchError("the search has no fitted predictor yet",
                             hint="it fits one at its first Bayesian-optimisation ask")
        kwargs.setdefault("feasibility", search.feasibility_model)
        told = {name for h in getattr(search, "history", []) for name in h.get("values", {})}
        kwargs.setdefault("unit", _unit(getattr(search, "objective", "throughput"), told))
        kwargs.setdefault("memory_limit", getattr(search, "memory_limit_gib", None))
        out = cls(search.predictor, search.space, **kwargs)
        if getattr(search, "direction", "maximize") == "minimize":
            out._flip = "inverse" if search.log_objective else "negate"
            out.update()
        return out

    # -- state -----------------------------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        """The configuration the controls show."""
        return {name: c.value for name, c in self.controls.items()}

    def set_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Set some or all knobs at once (one prediction) and return :attr:`prediction`."""
        self._holding = True
        try:
            for name, value in config.items():
                if name not in self.controls:
                    raise SpaceError(f"no knob {name!r}",
                                     hint=f"knobs: {', '.join(self.controls)}")
                self.controls[name].value = value
        finally:
            self._holding = False
        return self.update()

    def _predict(self, config: dict[str, Any]) -> tuple[float, float, float]:
        mid, _ = self.predictor.predict([config])
        lo, hi = self.predictor.predict_interval([config])
        m, lo_, hi_ = float(mid[0]), float(lo[0]), float(hi[0])
        if self._flip == "inverse":
            return 1.0 / m, 1.0 / hi_, 1.0 / lo_
        if self._flip == "negate":
            return -m, -hi_, -lo_
        return m, lo_, hi_

    def update(self) -> dict[str, Any]:
        """Predict for the controls' configuration and redraw; returns :attr:`prediction`."""
        if self._holding:
            return self.prediction
        config = self.config
        out: dict[str, Any] = {"config": config, "predicted": None, "lower": None,
                               "upper": None, "p_fits": None, "relative": None, "error": None}
        try:
            self.space.validate(config)
            out["predicted"], out["lower"], out["upper"] = self._predict(config)
            if self._p_fits is not None:
                out["p_fits"] = float(self._p_fits([config], memory_limit=self.memory_limit)[0])
            if self.reference is not None:
                out["relative"] = out["predicted"] / self._predict(self.reference)[0]
        except CubicMLError as err:
            out["error"] = err
        self.prediction = out
        self._draw()
        return out

    # -- drawing ---------------------------------------------------------------------------------
    def _draw(self) -> None:
        p = self.prediction
        if p["error"] is not None:
            prefix = "not a valid configuration: " if isinstance(p["error"], SpaceError) else ""
            self.output.value = _error_html(p["error"], prefix)
            return
        unit = f" {self.unit}" if self.unit else ""
        parts = [f"<b>{html.escape(fmt(p['predicted']))}{html.escape(unit)}</b> (95%: "
                 f"{html.escape(_interval(p['lower'], p['upper']))})"]
        if p["p_fits"] is not None:
            parts.append(f"P(fits) {p['p_fits']:.2f}")
        if p["relative"] is not None:
            parts.append(f"{p['relative']:.2f}× the reference's prediction")
        self.output.value = f"<div style='{_FONT}'>{' · '.join(parts)}</div>"
