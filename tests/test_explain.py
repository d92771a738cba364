"""What a fitted predictor learned: partial dependence, slices, knob importance, the feasibility
map, and the GP's own views (cost shares, kernel relevance). Real BoTorch fits on small spaces
with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cubicml_lab.errors import PredictorError
from cubicml_lab.space import Choice, Float, Int, PowerOfTwo, Space
from cubicml_lab.surrogate import (
    FeasibilityModel,
    GPPredictor,
    MLPPredictor,
    feasibility_map,
    knob_importance,
    knob_values,
    partial_dependence,
    slices,
)

PENALTY = {"none": 1.0, "selective": 0.9, "full": 0.7}


def speed(cfg: dict) -> float:
    """Separable samples/s: micro_batch matters most, recompute some, ``layers`` a little and
    ``noise_knob`` not at all."""
    mb = math.log2(cfg["micro_batch"])
    return 1e4 * PENALTY[cfg["recompute"]] * (1.0 + 0.5 * math.tanh(mb - 2.5)) \
        * math.exp(-0.03 * cfg["layers"])


@pytest.fixture(scope="module")
def space() -> Space:
    return Space([Int("layers", 1, 6), PowerOfTwo("micro_batch", 1, 32),
                  Choice("recompute", ["none", "selective", "full"]), Int("noise_knob", 0, 3)])


@pytest.fixture(scope="module")
def train(space: Space) -> list[dict]:
    cfgs = space.enumerate()
    order = np.random.default_rng(0).permutation(len(cfgs))
    return [cfgs[i] for i in order[:70]]


@pytest.fixture(scope="module")
def gp(space: Space, train: list[dict]) -> GPPredictor:
    return GPPredictor(space).fit(train, [speed(c) for c in train])


def test_partial_dependence_recovers_a_separable_effect(gp, train):
    pdp = partial_dependence(gp, train, "micro_batch")
    assert list(pdp.columns) == ["knob", "position", "value", "mean", "lo", "hi", "n"]
    assert pdp["value"].tolist() == [1, 2, 4, 8, 16, 32]
    assert pdp["position"].tolist() == list(range(6))
    assert (pdp["n"] == len(train)).all()
    assert (pdp["lo"] <= pdp["mean"]).all() and (pdp["mean"] <= pdp["hi"]).all()
    # with a log model, the ratio of two values' partial dependence is the true factor
    ratio = pdp["mean"].iloc[-1] / pdp["mean"].iloc[0]
    truth = speed({"layers": 1, "micro_batch": 32, "recompute": "none"}) / speed(
        {"layers": 1, "micro_batch": 1, "recompute": "none"})
    assert ratio == pytest.approx(truth, rel=0.1)
    # in the objective's units: the geometric mean of predictions near the measured speeds
    assert 1e3 < pdp["mean"].median() < 2e4
    every = partial_dependence(gp, train)
    assert list(dict.fromkeys(every["knob"])) == ["layers", "micro_batch", "recompute",
                                                  "noise_knob"]
    assert every[every["knob"] == "recompute"]["value"].tolist() == ["none", "selective", "full"]


def test_partial_dependence_subsamples_and_skips_invalid_configs():
    space = Space([PowerOfTwo("tp", 1, 8), PowerOfTwo("pp", 1, 8)], constants={"world": 8},
                  constraints=["tp * pp <= world"])
    cfgs = space.enumerate()
    pred = GPPredictor(space).fit(cfgs, [10.0 * c["tp"] + c["pp"] for c in cfgs])
    pdp = partial_dependence(pred, cfgs, "tp")
    # tp = 8 keeps only the 4 background configurations with pp = 1, tp = 1 all 10
    assert pdp.set_index("value")["n"].to_dict() == {1: 10, 2: 9, 4: 7, 8: 4}
    assert len(partial_dependence(pred, cfgs, "tp", max_configs=3)) == 4
    assert partial_dependence(pred, cfgs, "tp", max_configs=3)["n"].max() <= 3


def test_a_wide_knob_is_evaluated_on_a_grid():
    space = Space([Int("steps", 1, 1000), PowerOfTwo("mb", 1, 4)])
    grid = knob_values(space, "steps", max_values=5)
    assert len(grid) == 5 and grid[0] == 1 and grid[-1] == 1000
    assert np.ptp(np.diff(grid)) <= 1  # evenly spaced
    logged = knob_values(Space([Int("steps", 1, 1000, log=True)]), "steps", max_values=4)
    assert logged == [1, 10, 100, 1000]  # evenly spaced on the knob's log scale
    assert knob_values(space, "mb") == [1, 2, 4]
    floats = knob_values(Space([Float("lr", 1e-4, 1e-2, log=True)]), "lr", max_values=3)
    np.testing.assert_allclose(floats, [1e-4, 1e-3, 1e-2])


def test_slices_pass_through_the_reference(gp, train):
    ref = train[0]
    out = slices(gp, ref)
    assert out["n"].eq(1).all()
    marked = out[out["reference"]]
    assert sorted(marked["knob"]) == sorted(ref)  # one reference value per knob
    mean, _ = gp.predict([ref])
    np.testing.assert_allclose(marked["mean"], mean[0], rtol=1e-9)


def test_knob_importance_ranks_knobs_by_their_effect(gp, train):
    imp = knob_importance(gp, train)
    assert imp.index.tolist()[:2] == ["micro_batch", "recompute"]
    assert imp.index[-1] in ("noise_knob", "layers")
    assert imp["importance"].is_monotonic_decreasing
    assert imp.loc["micro_batch", "value_at_max"] == 32
    assert imp.loc["micro_batch", "value_at_min"] == 1
    assert imp.loc["recompute", "value_at_min"] == "full"
    assert imp.loc["recompute", "max_over_min"] == pytest.approx(1 / 0.7, rel=0.1)
    assert imp.loc["noise_knob", "max_over_min"] < 1.1


@pytest.mark.slow  # an MLP ensemble and a raw-scale GP on noise-free data
def test_knob_importance_works_for_an_mlp_and_a_raw_scale(space, train):
    y = [speed(c) for c in train]
    mlp = MLPPredictor(space, members=2, epochs=150).fit(train, y)
    assert knob_importance(mlp, train).index[0] == "micro_batch"
    raw = GPPredictor(space, log_objective=False).fit(train, y)
    imp = knob_importance(raw, train)
    assert imp.index[0] == "micro_batch" and imp["max_over_min"].isna().all()


def test_explain_refuses_bad_input(space, gp, train):
    with pytest.raises(PredictorError, match="not fitted"):
        partial_dependence(GPPredictor(space), train)
    with pytest.raises(PredictorError, match="not in the space") as err:
        partial_dependence(gp, train, "tp")
    assert "micro_batch" in err.value.hint
    with pytest.raises(PredictorError, match="empty"):
        knob_importance(gp, [])
    with pytest.raises(PredictorError, match="one dict"):
        partial_dependence(gp, train[0])
    with pytest.raises(PredictorError, match="not a cubicml_lab predictor"):
        partial_dependence(object(), train)
    with pytest.raises(PredictorError, match="not in the space"):
        slices(gp, {**train[0], "layers": 99})
    with pytest.raises(PredictorError, match="one configuration dict"):
        slices(gp, train[:2])


def test_feasibility_map_follows_the_memory_boundary(space, train):
    def status(cfg):  # runs out of memory when micro_batch * layers is large
        return "oom" if cfg["micro_batch"] * cfg["layers"] > 40 else "ok"

    fm = FeasibilityModel(space).fit(train, [status(c) for c in train])
    grid = feasibility_map(fm, train, "micro_batch", "layers")
    assert list(grid.columns) == ["micro_batch", "layers", "p_runs", "n"]
    assert len(grid) == 6 * 6 and grid["n"].eq(len(train)).all()
    assert grid["p_runs"].between(0, 1).all()
    p = grid.set_index(["micro_batch", "layers"])["p_runs"]
    assert p[(1, 1)] > 0.8 and p[(32, 6)] < 0.5  # a least-squares classifier: not calibrated
    assert p[(32, 6)] < p[(4, 6)] and p[(32, 6)] < p[(32, 1)]
    # a predictor with the same feasibility model attached gives the same map
    pred = GPPredictor(space)
    pred.feasibility = FeasibilityModel(space).fit(train, [status(c) for c in train])
    np.testing.assert_allclose(feasibility_map(pred, train, "micro_batch", "layers")["p_runs"],
                               grid["p_runs"], atol=1e-9)
    with pytest.raises(PredictorError, match="two different knobs"):
        feasibility_map(fm, train, "layers", "layers")
    with pytest.raises(PredictorError, match="not in the space"):
        feasibility_map(fm, train, "layers", "tp")
    with pytest.raises(PredictorError, match="cannot predict feasibility"):
        feasibility_map(object(), train, "layers", "micro_batch")


# -- the GP's own views ----------------------------------------------------------------------------
def roofline(cfg: dict) -> float:
    """Samples/s: time per sample = layers + 16 / micro_batch (made up)."""
    return 1e4 * PENALTY[cfg["recompute"]] / (cfg["layers"] + 16.0 / cfg["micro_batch"])


def roofline_terms(cfg: dict) -> list[float]:
    return [float(cfg["layers"]), 1.0 / cfg["micro_batch"]]


roofline_terms.term_names = ("layers", "overhead")


def test_cost_shares_recover_where_the_time_goes(space, train):
    pred = GPPredictor(space, cost_model=roofline_terms).fit(train, [roofline(c) for c in train])
    assert pred.term_names() == ["layers", "overhead"]
    test = [{"layers": 1, "micro_batch": 1, "recompute": "none", "noise_knob": 0},
            {"layers": 6, "micro_batch": 32, "recompute": "full", "noise_knob": 2}]
    shares = pred.cost_shares(test)
    assert list(shares.columns) == ["layers", "overhead"] and shares.shape == (2, 2)
    np.testing.assert_allclose(shares.sum(axis=1), 1.0)
    for row, cfg in zip(shares.to_numpy(), test, strict=True):  # true share: 16/mb / total
        true = (16.0 / cfg["micro_batch"]) / (cfg["layers"] + 16.0 / cfg["micro_batch"])
        assert row[1] == pytest.approx(true, abs=0.1)


def test_cost_term_names_fall_back_and_are_checked(space, train):
    y = [roofline(c) for c in train]
    plain = GPPredictor(space, cost_model=lambda c: roofline_terms(c)).fit(train, y)
    assert list(plain.cost_shares(train[:3]).columns) == ["term 0", "term 1"]

    def bad(cfg):
        return roofline_terms(cfg)

    bad.term_names = ("only one",)
    with pytest.raises(PredictorError, match="1 names for 2 values"):
        GPPredictor(space, cost_model=bad).fit(train, y).cost_shares(train[:3])


def test_cost_shares_refuse_without_a_cost_model_or_a_fit(space, gp, train):
    with pytest.raises(PredictorError, match="needs a cost model") as err:
        gp.cost_shares(train)
    assert "cost_model=" in err.value.hint
    with pytest.raises(PredictorError, match="before fit"):
        GPPredictor(space, cost_model=roofline_terms).cost_shares(train)
    pred = GPPredictor(space, cost_model=roofline_terms).fit(train, [roofline(c) for c in train])
    with pytest.raises(PredictorError, match="not in the space"):
        pred.cost_shares([{**train[0], "layers": 0}])


def test_kernel_relevance_per_knob(space, gp, train):
    rel = gp.importance()
    assert rel.name == "relevance" and set(rel.index) == set(space.names)  # one-hots folded
    assert rel.is_monotonic_decreasing and (rel > 0).all()
    assert rel.index[-1] == "noise_knob" or rel["noise_knob"] < rel["micro_batch"]
    costed = GPPredictor(space, cost_model=roofline_terms,
                         features=lambda c: [float(c["micro_batch"] * c["layers"])]).fit(
        train, [roofline(c) for c in train])
    assert {"cost layers", "cost overhead", "feature 0"} <= set(costed.importance().index)
    with pytest.raises(PredictorError, match="before fit"):
        GPPredictor(space).importance()
    mixed = GPPredictor(space, categorical="mixed").fit(train, [speed(c) for c in train])
    with pytest.raises(PredictorError, match="onehot") as err:
        mixed.importance()
    assert "knob_importance" in err.value.hint


def test_shipped_cost_models_name_their_terms():
    import cubicml_lab as cml
    from cubicml_lab.workloads import dlrm, gpt

    for fn, knobs in ((gpt.cost_terms, gpt.KNOBS), (dlrm.cost_terms, dlrm.KNOBS),
                      (gpt.shape_features, gpt.KNOBS)):
        names = getattr(fn, "term_names", None) or fn.feature_names
        assert len(names) == len(fn({k: knob.default for k, knob in knobs.items()}))
    for name in ("mpt_llmfoundry", "lucie7b_seq2k", "gpt_cpu_sweep", "dlrm_cpu_sweep"):
        try:
            ds = cml.datasets.load(name)
        except cml.errors.DataError:  # a sweep not collected on this machine
            continue
        assert len(ds.cost_model.term_names) == len(ds.cost_model(ds.configs()[0])), name


def test_knob_values_of_wide_knobs_are_spaced_without_listing_them():
    import time

    space = Space([Int("x", 0, 10**12), Int("y", 1, 10**8, log=True), PowerOfTwo("m", 1, 2**20),
                   Choice("c", list("abcdefghijklmnop"))])
    t0 = time.perf_counter()
    x, y, m, c = (knob_values(space, k) for k in "xymc")
    assert time.perf_counter() - t0 < 1.0  # listing 10**12 values would never finish
    assert x[0] == 0 and x[-1] == 10**12 and len(x) == 12 and x == sorted(x)
    assert y[0] == 1 and y[-1] == 10**8 and y[5] < 10**4  # log-spaced, not 10**8 / 11 apart
    assert all(space.contains({"x": a, "y": b, "m": 2, "c": "a"}) for a, b in zip(x, y))
    assert m[0] == 1 and m[-1] == 2**20 and all(v & (v - 1) == 0 for v in m)
    assert c[0] == "a" and c[-1] == "p" and len(c) == 12
