"""What a search tells a person about its physics prior: prior_report, a proposal's why."""

from __future__ import annotations

import math

import pytest

from cubicml_lab.errors import SearchError
from cubicml_lab.search import BayesianSearch, PriorReport, prior_report
from cubicml_lab.search.calibration import MIN_OK, MOVED_FACTOR
from cubicml_lab.space import Choice, Int, PowerOfTwo, Space


@pytest.fixture(scope="module")
def space() -> Space:
    return Space([Int("layers", 1, 8), PowerOfTwo("micro_batch", 1, 16),
                  Choice("recompute", ["none", "full"])])


def cost_terms(cfg: dict) -> dict[str, float]:
    """The model: seconds per sample of compute (1/3 more with full recompute) and of a
    per-micro-batch overhead."""
    return {"compute": cfg["layers"] * (4 / 3 if cfg["recompute"] == "full" else 1.0),
            "overhead": 2.0 / cfg["micro_batch"]}


def run(space: Space, overhead_factor: float, n: int = 14) -> BayesianSearch:
    """A search with the model as its prior, on a truth whose overhead costs
    ``overhead_factor`` times what the model says."""
    search = BayesianSearch(space, seed=0, cost_model=cost_terms)
    for _ in range(n):
        (cfg,) = search.ask(1)
        t = cost_terms(cfg)
        search.tell(cfg, {"throughput": 1000.0 / (t["compute"]
                                                  + overhead_factor * t["overhead"])})
    return search


@pytest.fixture(scope="module")
def off(space) -> BayesianSearch:
    return run(space, overhead_factor=6.0)


@pytest.fixture(scope="module")
def holds(space) -> BayesianSearch:
    return run(space, overhead_factor=1.0)


def test_a_term_the_cluster_prices_differently_is_named_with_its_factor(off):
    report = off.prior_report()
    assert isinstance(report, PriorReport) and report.n_ok == 14
    terms = report.terms
    assert list(terms.index) == ["compute", "overhead"]
    # relative to the whole step: overhead went up, compute down, their ratio near 6
    ratio = terms.loc["overhead", "multiplier"] / terms.loc["compute", "multiplier"]
    assert 3.0 < ratio < 12.0, terms
    assert report.prior_is_off and "overhead" in report.headline, report.headline
    assert dict(report.moved)["overhead"] > MOVED_FACTOR
    assert terms.loc["overhead", "95% low"] > 1.0 > terms.loc["compute", "95% high"]
    q = report.quality["kendall_tau"]
    assert q["calibrated"] > q["model as given"], report.quality
    # the report is what str() and the notebook show
    assert "overhead" in str(report) and "multiplier" in report._repr_html_()


def test_a_prior_that_holds_is_said_to_hold(holds):
    report = prior_report(holds)
    assert not report.moved and report.headline.startswith("the prior holds"), report
    assert not report.prior_is_off
    assert math.isclose(report.quality.loc["model as given", "median_abs_error_pct"], 0.0,
                        abs_tol=1.0)


def test_a_bo_proposal_says_the_prior_is_off(off, holds):
    (p,) = off.propose(1)
    assert p.phase == "bo" and "the prior is off" in p.reason and "overhead" in p.reason, p.reason
    (q,) = holds.propose(1)
    assert q.phase == "bo" and "prior" not in q.reason.split(")")[-1], q.reason


def test_a_report_needs_a_cost_model_and_enough_trials(space):
    with pytest.raises(SearchError, match="cost_model"):
        BayesianSearch(space, seed=0).prior_report()
    with pytest.raises(SearchError, match=f"needs {MIN_OK} ok trials"):
        run(space, 1.0, n=MIN_OK - 1).prior_report()



def test_two_terms_the_trials_cannot_tell_apart_are_not_identified(space):
    def twins(cfg: dict) -> dict[str, float]:  # the overhead split in two halves of one shape
        t = cost_terms(cfg)
        return {"compute": t["compute"], "launch": t["overhead"] / 2, "sync": t["overhead"] / 2}

    search = BayesianSearch(space, seed=0, cost_model=twins)
    for _ in range(12):
        (cfg,) = search.ask(1)
        t = cost_terms(cfg)
        search.tell(cfg, {"throughput": 1000.0 / (t["compute"] + 6.0 * t["overhead"])})
    terms = search.prior_report().terms
    assert terms.loc["compute", "identified"], terms
    assert not terms.loc["launch", "identified"] and not terms.loc["sync", "identified"], terms
