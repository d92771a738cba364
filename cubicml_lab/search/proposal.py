"""A proposal: the next configuration to measure, with what the searcher expects of it.

``Searcher.ask(n)`` returns bare configurations; ``Searcher.propose(n)`` returns
:class:`Proposal` records that also carry the prediction in the objective's units with its 95%
interval, the probability that the configuration runs (fits in memory), the acquisition value and
why it was picked, in words. A person reviewing a search reads these before a trial is launched
(``Campaign.propose`` / ``Campaign.launch`` / ``Campaign.skip``, or the ``ProposalReview``
widget); the same records serve a script.

Example:
    >>> p = Proposal(config={"micro_batch": 8}, phase="initial", reason="space-filling design")
    >>> p.config, p.predicted is None
    ({'micro_batch': 8}, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .._html import card, fmt

__all__ = ["PHASES", "Proposal"]

#: Where a proposal came from.
PHASES = ("enqueued", "resumed", "prior", "initial", "bo", "fallback", "random", "guided",
          "edited")


@dataclass(frozen=True, kw_only=True)
class Proposal:
    """One proposed configuration and the searcher's view of it.

    Attributes:
        config: The configuration (the space's parameters).
        objective: Name of the metric the figures below are in, e.g. ``"throughput"``.
        predicted: Predicted objective (the GP's posterior median, objective units), or None
            while the searcher has no model.
        lower: Lower end of the 95% prediction interval of a new measurement, or None.
        upper: Upper end of that interval, or None.
        p_feasible: Probability that the trial runs (and fits under the memory limit), or None
            when the searcher has learned nothing about failures yet.
        acquisition: The log acquisition value it was picked by (log expected improvement,
            feasibility-weighted), or None outside Bayesian optimisation.
        phase: Where it came from, one of :data:`PHASES`.
        reason: Why it was picked, in words.
        trial_id: The stored trial it resumes (an interrupted trial), else None.
    """

    config: dict[str, Any]
    objective: str = "throughput"
    predicted: float | None = None
    lower: float | None = None
    upper: float | None = None
    p_feasible: float | None = None
    acquisition: float | None = None
    phase: str = "initial"
    reason: str = ""
    trial_id: int | None = field(default=None)

    def with_config(self, config: dict[str, Any], reason: str) -> Proposal:
        """A copy for an edited configuration: the figures no longer apply and are dropped."""
        return replace(self, config=dict(config), predicted=None, lower=None, upper=None,
                       p_feasible=None, acquisition=None, phase="edited", reason=reason)

    def summary(self) -> dict[str, Any]:
        """The figures as one flat dict (for a DataFrame row or a widget)."""
        return {**self.config, f"predicted {self.objective}": self.predicted,
                "95% low": self.lower, "95% high": self.upper, "P(fits)": self.p_feasible,
                "log acquisition": self.acquisition, "phase": self.phase, "why": self.reason}

    def _facts(self) -> list[tuple[str, Any]]:
        facts: list[tuple[str, Any]] = [("config", ", ".join(f"{k}={fmt(v)}"
                                                          for k, v in self.config.items()))]
        if self.predicted is not None:
            shown = f"{fmt(self.predicted)}"
            if self.lower is not None and self.upper is not None:
                shown += f"  (95%: {fmt(self.lower)} – {fmt(self.upper)})"
            facts.append((f"predicted {self.objective}", shown))
        if self.p_feasible is not None:
            facts.append(("P(fits)", f"{self.p_feasible:.2f}"))
        if self.acquisition is not None:
            facts.append(("log acquisition", f"{self.acquisition:.3g}"))
        facts.append(("phase", self.phase))
        if self.reason:
            facts.append(("why", self.reason))
        return facts

    def __str__(self) -> str:
        return "Proposal\n" + "\n".join(f"  {k}: {v}" for k, v in self._facts())

    def _repr_html_(self) -> str:
        return card("Proposal", self._facts())
