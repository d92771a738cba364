"""Tests that no fit of BayesianSearch is stale: every caller of its cached GP fits (ask,
propose's "why" and predictions, recommend, fit_predictor, PredictorExplorer.from_search) gets a
GP fitted on exactly the observations the search holds at that moment.
Real GP fits, no mocks."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cubicml_lab as cml
from cubicml_lab.errors import SearchError
from cubicml_lab.search import BayesianSearch


@pytest.fixture
def space() -> cml.Space:
    return cml.Space([cml.Int("micro_batch", 1, 16), cml.Int("heads", 1, 4),
                      cml.Choice("precision", ["fp32", "bf16"])])


def _speed(c: dict) -> float:
    return 1000.0 * c["micro_batch"] ** 0.5 / c["heads"] * (1.3 if c["precision"] == "bf16"
                                                           else 1.0)


def _tell(s: BayesianSearch, configs: list[dict], *, drift: bool = False,
          contended: tuple[int, ...] = ()) -> None:
    """Tell ``configs`` measured; with ``drift`` each carries a raw figure 0-10 % below its
    stored one (a drift covariate), those at ``contended`` indices (of the search's whole
    history) the contention flag."""
    for c in configs:
        i = s.n_told
        m = {"throughput": _speed(c), "throughput_rel_ci": 0.02}
        if drift:
            m["throughput_raw"] = m["throughput"] / (1.0 + 0.05 * (i % 3))
        if i in contended:
            m["contended"] = 1.0
        s.tell(c, m)


def _n_ok(s: BayesianSearch) -> int:
    return sum(h["status"] == "ok" for h in s.history)


@pytest.mark.parametrize("drift", [False, True])
def test_recommend_before_bo_leaves_no_stale_fit_for_the_first_bo_ask(space, drift):
    """The issue's sequence: tell 2, recommend(), tell 3, ask(1). The proposal was 'GP on 5 ok
    observations' from a GP of 2 (with a drift covariate: a failed fit and a fallback)."""
    s = BayesianSearch(space, seed=0, n_init=5)
    _tell(s, s.ask(2), drift=drift)
    s.recommend()
    _tell(s, s.ask(3), drift=drift)
    [p] = s.propose(1)
    assert s.last_ask_info["phase"] == "bo", s.last_ask_info["reason"]
    assert s.predictor.n_train == 5
    assert p.phase == "bo" and "GP on 5 ok observations" in p.reason


def test_proposals_do_not_depend_on_who_asked_for_a_fit_before(space):
    """A search that answered recommend() and fit_predictor() between its tells proposes what
    a search told the same trials without them proposes, ask after ask."""
    quiet, busy = BayesianSearch(space, seed=3, n_init=4), BayesianSearch(space, seed=3, n_init=4)
    for _ in range(5):
        a, b = quiet.ask(2), busy.ask(2)
        assert a == b
        _tell(quiet, a, drift=True)
        _tell(busy, b, drift=True)
        busy.recommend()
        try:
            busy.fit_predictor()
        except SearchError:
            assert _n_ok(busy) < 4  # before the GP: says why instead
    assert quiet.ask(1) == busy.ask(1)


def test_recommend_and_fit_predictor_fit_on_everything_told(space):
    """After a BO ask, the trials told since are in recommend()'s GP and fit_predictor()'s: both
    agree with a fresh search told the same history, which has nothing cached."""
    s = BayesianSearch(space, seed=1, n_init=4)
    _tell(s, s.ask(4), drift=True)
    s.ask(1)  # the GP of 4
    assert s.predictor.n_train == 4
    s.recommend()
    _tell(s, s.pending + [c for c in s.ask(2)], drift=True)
    fresh = BayesianSearch(space, seed=1, n_init=4)
    for h in s.history:
        fresh.tell(h["config"], h["values"], h["status"])
    assert s.recommend() == fresh.recommend()
    pred = s.fit_predictor()
    assert pred.n_train == _n_ok(s) == 7 and s.predictor is pred
    probe = [{"micro_batch": 3, "heads": 2, "precision": "bf16"}]
    assert np.allclose(pred.predict(probe)[0], fresh.fit_predictor().predict(probe)[0])
    assert s.drift_exponent == pytest.approx(fresh.drift_exponent)


def test_an_enqueued_proposal_is_predicted_by_the_gp_of_everything_told(space):
    """propose() that returns only an enqueued configuration makes no new ask; its prediction
    comes from a GP of every trial told, not from the last ask's."""
    s = BayesianSearch(space, seed=2, n_init=4)
    _tell(s, s.ask(4))
    _tell(s, s.ask(1))  # a BO ask on 4, then its trial told: 5 observations
    again = s.history[0]["config"]
    s.enqueue(again, repeat=True)
    [p] = s.propose(1)
    assert p.phase == "enqueued" and p.config == again
    assert s.predictor.n_train == 5
    mid, _ = s.predictor.predict([again])
    assert p.predicted == pytest.approx(float(mid[0]))


def test_a_prior_search_never_proposes_from_a_gp_of_fewer_trials(space):
    """With a cost model the GP starts at 2 ok trials, before the first anchor size (n_init):
    every BO ask's GP holds every ok trial, and the proposal's "why" gives that count."""
    s = BayesianSearch(space, seed=0, n_init=5,
                       cost_model=lambda c: [1.0 / c["micro_batch"], 0.1 * c["heads"]])
    for _ in range(6):
        [p] = s.propose(1)
        if p.phase == "bo":
            assert s.predictor.n_train == _n_ok(s)
            assert f"GP on {_n_ok(s)} ok observations" in p.reason
        _tell(s, [p.config])
    assert s.predictor.n_train == 5


def test_why_counts_the_observations_the_gp_used(space):
    """Contended trials without any spread told are left out of the GP: the "why" says how
    many it used and how many it left out."""
    s = BayesianSearch(space, seed=0, n_init=4)
    for c in s.ask(5):
        m = {"throughput": _speed(c)} | ({"contended": 1.0} if s.n_told == 1 else {})
        s.tell(c, m)
    [p] = s.propose(1)
    assert s.predictor.n_train == 4
    assert "GP on 4 ok observations (1 contended left out" in p.reason


def test_fit_predictor_says_why_there_is_no_gp_yet(space):
    s = BayesianSearch(space, seed=0, n_init=4)
    _tell(s, s.ask(2))
    with pytest.raises(SearchError, match=r"no GP yet: 2 of n_init = 4 ok observations"):
        s.fit_predictor()


def test_predictor_explorer_from_search_shows_the_gp_of_every_trial(space):
    """PredictorExplorer.from_search reads the GP fitted on every trial told, not the one of
    the last ask (which lacks the trial that ask proposed)."""
    from cubicml_lab.widgets import PredictorExplorer

    s = BayesianSearch(space, seed=0, n_init=4)
    _tell(s, s.ask(4))
    _tell(s, s.ask(1))
    assert s.predictor.n_train == 4  # the last ask's
    ex = PredictorExplorer.from_search(s)
    assert ex.predictor.n_train == 5
    assert math.isfinite(ex.set_config(s.history[-1]["config"])["predicted"])


def test_recommend_between_asks_leaves_the_history_check_to_the_asks(space):
    """Only an ask checks related-job history against the trials (and may drop it for good):
    recommend() and fit_predictor() between asks neither check nor drop it, so a search that
    answered them proposes what a quiet one proposes."""
    import pandas as pd

    rows = [{**c, "status": "ok", "throughput": 1e6 / _speed(c)}  # upside down: unrelated
            for c in space.enumerate()[::3]]
    quiet, busy = (BayesianSearch(space, seed=0, n_init=4, history=[pd.DataFrame(rows)])
                   for _ in range(2))
    for _ in range(3):
        a, b = quiet.ask(2), busy.ask(2)
        assert a == b
        _tell(quiet, a)
        _tell(busy, b)
        tau = busy.history_model.tau
        busy.recommend()
        busy.fit_predictor()
        assert busy.history_model.tau == tau  # not checked again
    assert quiet.ask(1) == busy.ask(1)
    assert not busy.history_model.active  # the asks dropped it


def test_asks_between_two_tells_share_their_fits_and_a_tell_renews_them(space):
    """A review rule that skips proposal after proposal asks again with nothing new told: the
    GP and the feasibility model are reused; the next tell brings new ones, on every trial."""
    s = BayesianSearch(space, seed=0, n_init=4, memory_limit_gib=2.0)
    for c in s.ask(4):
        s.tell(c, {"throughput": _speed(c), "peak_mem_gib": 0.3 + 0.01 * c["micro_batch"]})
    [first] = s.ask(1)
    gp, feasibility = s.predictor, s.feasibility_model
    s.skip(first)
    [second] = s.ask(1)
    assert second != first and s.predictor is gp and s.feasibility_model is feasibility
    s.tell(second, {"throughput": _speed(second), "peak_mem_gib": 0.5})
    s.ask(1)
    assert s.predictor is not gp and s.feasibility_model is not feasibility
    assert s.predictor.n_train == 5
