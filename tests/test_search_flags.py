"""Tests that a flagged figure never steers alone, and that a search whose untried
configurations were all skipped says so and can be given them back.
Real searchers, real GP fits, a real store; no mocks."""

from __future__ import annotations

import math

import pytest

import cubicml_lab as cml
from cubicml_lab.errors import SearchError, SearchExhausted
from cubicml_lab.search import BayesianSearch, RandomSearch
from cubicml_lab.trials import figure_flag
from test_search_fits import _speed, space  # noqa: F401 (space: the fixture)

BEST_CLEAN = {"micro_batch": 16, "heads": 2, "precision": "fp32"}  # 2000 units/s
LUCKY = {"micro_batch": 3, "heads": 4, "precision": "fp32"}  # about 430 truly, told 6000


def _told_with_a_lucky_figure(space: cml.Space, flag: str | None) -> BayesianSearch:
    """Six clean trials (2 % CIs), then LUCKY told at 3x the best clean figure, flagged as
    ``flag`` says ("contended", "no interval") or not at all (None)."""
    s = BayesianSearch(space, seed=0, n_init=4)
    for mb, heads, prec in [(2, 2, "fp32"), (8, 4, "bf16"), (16, 2, "fp32"), (4, 1, "fp32"),
                            (1, 3, "bf16"), (12, 3, "fp32")]:
        c = {"micro_batch": mb, "heads": heads, "precision": prec}
        s.tell(c, {"throughput": _speed(c), "throughput_rel_ci": 0.02})
    m = {"throughput": 6000.0, "throughput_rel_ci": math.inf if flag == "no interval" else 0.02}
    if flag == "contended":
        m["contended"] = 1.0
    s.tell(LUCKY, m)
    return s


def test_figure_flag_names_contended_and_interval_less_figures():
    assert figure_flag({"throughput": 1.0, "contended": 1.0}) == "contended"
    assert figure_flag({"throughput": 1.0, "throughput_rel_ci": math.nan}) == "no interval"
    assert figure_flag({"throughput": 1.0, "step_time_rel_ci": math.inf}) == "no interval"
    assert figure_flag({"throughput": 1.0, "throughput_rel_ci": 0.01}) is None
    assert figure_flag({"throughput": 1.0}) is None  # no CI reported at all: nothing to flag


@pytest.mark.parametrize("flag", ["contended", "no interval"])
def test_a_flagged_figure_sets_no_incumbent_while_a_clean_one_exists(space, flag):
    """best(), recommend() and the acquisition's incumbent pass over the flagged 6000: the
    next ask still expects to improve on 2000 (relative EI near 1, not the 0.08 it has when
    6000 is a clean figure and the bar)."""
    s = _told_with_a_lucky_figure(space, flag)
    assert s.best() == (BEST_CLEAN, 2000.0)
    assert s.recommend()[0] == BEST_CLEAN
    s.ask(1)
    flagged = s.last_ask_info["relative_improvement"]
    clean = _told_with_a_lucky_figure(space, None)
    assert clean.best() == (LUCKY, 6000.0)
    clean.ask(1)
    assert flagged > 5 * clean.last_ask_info["relative_improvement"]


def test_flagged_figures_alone_still_give_a_best(space):
    s = RandomSearch(space, seed=0)
    s.tell(LUCKY, {"throughput": 600.0, "contended": 1.0})
    s.tell(BEST_CLEAN, {"throughput": 500.0, "throughput_rel_ci": math.inf})
    assert s.best() == (LUCKY, 600.0)


def test_everything_skipped_is_told_apart_from_an_exhausted_space_and_can_be_unskipped():
    space = cml.Space([cml.Int("micro_batch", 1, 3)])
    s = RandomSearch(space, seed=0)
    s.tell({"micro_batch": 1}, {"throughput": 5.0})
    s.skip({"micro_batch": 2})
    s.skip({"micro_batch": 3})
    with pytest.raises(SearchExhausted, match=r"every configuration not yet tried was skipped "
                                              r"\(2 skipped") as got:
        s.ask()
    assert got.value.skipped == 2 and "unskip()" in got.value.hint
    assert s.unskip({"micro_batch": 2}) == 1 and s.unskip({"micro_batch": 2}) == 0
    assert s.ask() == [{"micro_batch": 2}]
    s.tell({"micro_batch": 2}, {"throughput": 6.0})
    assert s.unskip() == 1 and s.skipped == []
    s.tell(s.ask()[0], {"throughput": 7.0})
    with pytest.raises(SearchExhausted, match=r"all 3 configurations of the pool have been "
                                              r"tried") as got:
        s.ask()
    assert got.value.skipped == 0 and "widen the space" in got.value.hint
    with pytest.raises(SearchError, match="not in the space"):
        s.unskip({"micro_batch": 9})


def test_review_widget_offers_to_unskip_when_everything_left_was_skipped(tmp_store):
    """A campaign whose every untried configuration was skipped: ProposalReview shows why
    with an *un-skip all* button; pressing it gives them back, in the store too."""
    from cubicml_lab.widgets import ProposalReview

    space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 4)])
    camp = cml.Campaign("skipped", space, workload="gpt", searcher=RandomSearch(space, seed=0),
                        store=tmp_store, launcher=cml.launch.InProcess())
    for mb in (2, 4):
        camp.skip({"micro_batch": mb})
    tmp_store.record_trial("skipped", {"micro_batch": 1}, status="ok",
                           metrics={"throughput": 100.0})
    review = ProposalReview(cml.Campaign.from_store(tmp_store, "skipped",
                                                    searcher=RandomSearch(space, seed=0)))
    assert isinstance(review.error, SearchExhausted) and review.error.skipped == 2
    assert review.unskip_button.layout.display == "flex" and not review.unskip_button.disabled
    assert review.unskip() == 2
    assert review.error is None and review.unskip_button.layout.display == "none"
    assert review.proposals and review.proposals[0].config["micro_batch"] in (2, 4)
    assert tmp_store.campaign_info("skipped")["metadata"]["skipped"] == []
