"""Tests of cubicml_lab.surrogate: GPPredictor (real BoTorch fits) and the predictor metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from cubicml_lab.errors import PredictorError
from cubicml_lab.space import Choice, Int, PowerOfTwo, Space
from cubicml_lab.surrogate import (
    FeasibilityModel,
    GPPredictor,
    cross_val_predict,
    evaluate_predictor,
    interval_coverage,
    kendall_tau,
    mape,
    spearman,
)


def make_space() -> Space:
    return Space([Int("layers", 1, 12), PowerOfTwo("micro_batch", 1, 64),
                  Choice("recompute", ["none", "selective", "full"])])


def throughput(cfg: dict) -> float:
    """A smooth, made-up throughput surface in samples/s, about 1e4."""
    mb = math.log2(cfg["micro_batch"])
    penalty = {"none": 1.0, "selective": 0.9, "full": 0.7}[cfg["recompute"]]
    return 1e4 * penalty * (1.0 + 0.5 * math.tanh(mb - 2.5)) * math.exp(-0.06 * cfg["layers"])


@pytest.fixture(scope="module")
def space() -> Space:
    return make_space()


@pytest.fixture(scope="module")
def split(space: Space) -> tuple[list[dict], list[dict]]:
    cfgs = space.enumerate()
    order = np.random.default_rng(0).permutation(len(cfgs))
    return [cfgs[i] for i in order[:50]], [cfgs[i] for i in order[50:]]


@pytest.fixture(scope="module")
def fitted(space: Space, split) -> GPPredictor:
    train, _ = split
    return GPPredictor(space, seed=0).fit(train, [throughput(c) for c in train])


# -- GPPredictor: accuracy and units ---------------------------------------------------------------
def test_gp_ranks_held_out_configs_of_a_smooth_function(fitted, split):
    _, test = split
    mean, std = fitted.predict(test)
    truth = np.array([throughput(c) for c in test])
    assert mean.shape == std.shape == (len(test),)
    assert stats.kendalltau(truth, mean).statistic > 0.9
    assert fitted.n_train == 50


def test_predictions_come_back_in_the_objectives_units(fitted, split):
    _, test = split
    mean, std = fitted.predict(test)
    truth = np.array([throughput(c) for c in test])
    assert 1e3 < np.median(mean) < 1e5  # ~1e4, not log units (~9) or standardised (~0)
    assert np.median(np.abs(mean - truth) / truth) < 0.05
    assert np.all(std > 0) and np.median(std / mean) < 0.2


def test_point_estimate_is_the_median_of_the_log_normal(fitted, space, split):
    import torch

    _, test = split
    mean, std = fitted.predict(test)
    with torch.no_grad():
        post = fitted.model.posterior(space.encode(test))
        mu = post.mean.squeeze(-1).numpy()
        var = post.variance.squeeze(-1).numpy()
    assert fitted.point_estimate == "median"
    np.testing.assert_allclose(mean, np.exp(mu), rtol=1e-10)
    np.testing.assert_allclose(std, np.sqrt(np.expm1(var) * np.exp(2 * mu + var)), rtol=1e-8)
    lo, hi = fitted.predict_interval(test, level=0.9, observation_noise=False)
    z = stats.norm.ppf(0.95)
    np.testing.assert_allclose(lo, np.exp(mu - z * np.sqrt(var)), rtol=1e-8)
    np.testing.assert_allclose(hi, np.exp(mu + z * np.sqrt(var)), rtol=1e-8)
    lo_n, hi_n = fitted.predict_interval(test, level=0.9)  # a new measurement: wider
    assert np.all(lo_n < lo) and np.all(hi_n > hi)


def test_raw_scale_model_reports_the_mean(space, split):
    train, test = split
    pred = GPPredictor(space, log_objective=False).fit(train, [throughput(c) for c in train])
    mean, _ = pred.predict(test)
    assert pred.point_estimate == "mean"
    assert stats.kendalltau([throughput(c) for c in test], mean).statistic > 0.85


def test_fits_are_deterministic_for_a_seed(space, split):
    train, test = split
    y = [throughput(c) * (1 + 0.03 * math.sin(i)) for i, c in enumerate(train)]
    a = GPPredictor(space, seed=3).fit(train, y).predict(test)
    b = GPPredictor(space, seed=3).fit(train, y).predict(test)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def _noisy(cfgs: list[dict], sigma: float, rng: np.random.Generator) -> np.ndarray:
    return np.array([throughput(c) for c in cfgs]) * np.exp(sigma * rng.standard_normal(len(cfgs)))


@pytest.mark.slow
@pytest.mark.parametrize("stated_noise,categorical", [(False, "onehot"), (True, "onehot"),
                                                       (False, "mixed")])
def test_fast_exact_posterior_agrees_with_gpytorch(space, split, stated_noise, categorical):
    import gpytorch
    import torch

    cfgs = split[0]
    noise = [0.02 + 0.01 * (i % 3) for i in range(len(cfgs))] if stated_noise else None
    pred = GPPredictor(space, categorical=categorical).fit(cfgs, [throughput(c) for c in cfgs],
                                                           noise=noise)
    X = pred.encode(split[1])
    mu, var = pred.posterior_encoded(X)
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(5000):
        post = pred.model.posterior(X)
    np.testing.assert_allclose(mu, post.mean.squeeze(-1).numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(var, post.variance.squeeze(-1).numpy(), rtol=1e-6, atol=1e-10)


def _cost_terms(cfg: dict) -> list[float]:
    return [cfg["layers"] / cfg["micro_batch"], 1.0 + (cfg["recompute"] != "none")]


@pytest.mark.parametrize("cost_model", [None, _cost_terms])
def test_the_factor_posterior_is_gpytorchs_joint_posterior(space, split, cost_model):
    """botorch_model(): the same joint posterior as the BoTorch model's, batches sharing rows
    (noisy EI's baseline) included, and the same qLogNEI values and pick."""
    import gpytorch
    import torch
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.sampling import SobolQMCNormalSampler

    cfgs = split[0]
    pred = GPPredictor(space, cost_model=cost_model).fit(cfgs, [throughput(c) for c in cfgs])
    fast, X_base, X = pred.botorch_model(), pred.encode(cfgs[:6]), pred.encode(split[1])
    Xq = torch.cat([X_base.expand(len(X), -1, -1), X.unsqueeze(1)], dim=1)  # (b, 7, d)
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(5000):
        ref, got = pred.model.posterior(Xq), fast.posterior(Xq)
        np.testing.assert_allclose(got.mean.numpy(), ref.mean.numpy(), rtol=1e-8, atol=1e-8)
        np.testing.assert_allclose(got.distribution.covariance_matrix.numpy(),
                                   ref.distribution.covariance_matrix.numpy(), atol=1e-8)
        vals = [torch.cat([qLogNoisyExpectedImprovement(
            m, X_baseline=X_base, sampler=SobolQMCNormalSampler(torch.Size([64]), seed=1),
            prune_baseline=True)(X[i:i + 16].unsqueeze(1)) for i in range(0, len(X), 16)])
            for m in (pred.model, fast)]
    np.testing.assert_allclose(vals[1].numpy(), vals[0].numpy(), rtol=1e-6, atol=1e-6)
    assert int(vals[0].argmax()) == int(vals[1].argmax())


def test_a_warm_start_with_no_iterations_keeps_its_hyperparameters(space, split):
    cfgs, y = split[0], [throughput(c) for c in split[0]]
    anchor = GPPredictor(space).fit(cfgs[:30], y[:30])
    warm = GPPredictor(space).fit(cfgs, y, warm_start=anchor, max_iter=0)
    assert warm.n_train == len(cfgs)
    np.testing.assert_allclose(warm.importance().sort_index().to_numpy(),
                               anchor.importance().sort_index().to_numpy())


def test_a_warm_started_feasibility_model_keeps_the_anchors_memory_gp(space, split):
    cfgs = split[0]
    statuses = ["oom" if c["micro_batch"] * c["layers"] > 96 else "ok" for c in cfgs]
    mem = [0.1 * c["micro_batch"] * c["layers"] for c in cfgs]
    anchor = FeasibilityModel(space, max_iter=20).fit(cfgs[:30], statuses[:30], mem[:30])
    warm = FeasibilityModel(space, max_iter=20).fit(cfgs, statuses, mem, warm_start=anchor)
    cold = FeasibilityModel(space, max_iter=20).fit(cfgs, statuses, mem)
    assert warm.memory.n_train == cold.memory.n_train
    np.testing.assert_allclose(warm.memory.importance().sort_index().to_numpy(),
                               anchor.memory.importance().sort_index().to_numpy())
    p_warm, p_cold = warm.predict(split[1], 8.0), cold.predict(split[1], 8.0)
    assert np.mean((p_warm > 0.5) == (p_cold > 0.5)) > 0.9


def test_a_warm_started_fit_matches_a_cold_one(space, split):
    cfgs, y = split[0], [throughput(c) for c in split[0]]
    cold = GPPredictor(space).fit(cfgs, y)
    warm = GPPredictor(space, seed=1).fit(cfgs, y, warm_start=cold, max_iter=5)
    a, _ = cold.predict(split[1])
    b, _ = warm.predict(split[1])
    np.testing.assert_allclose(a, b, rtol=0.02)  # starts at the optimum, stays there


def test_interval_coverage_with_known_log_normal_noise(space):
    rng = np.random.default_rng(1)
    cfgs = space.enumerate()
    train = [cfgs[i] for i in rng.choice(len(cfgs), 80, replace=False)]
    test = [cfgs[i] for i in rng.choice(len(cfgs), 200, replace=True)]
    sigma = 0.08  # 8 % relative spread per measurement
    y_train, y_test = _noisy(train, sigma, rng), _noisy(test, sigma, rng)
    pred = GPPredictor(space).fit(train, y_train)
    assert 0.8 <= interval_coverage(y_test, *pred.predict_interval(test)) <= 1.0
    assert 0.5 * sigma < pred.noise_std < 2.0 * sigma  # the inferred noise is about right
    # Known per-trial noise enters as fixed observation noise and gives the same calibration.
    fixed = GPPredictor(space).fit(train, y_train, noise=[sigma] * len(train))
    assert 0.8 <= interval_coverage(y_test, *fixed.predict_interval(test)) <= 1.0
    assert fixed.noise_std == pytest.approx(sigma)
    # Without the noise the interval would cover far fewer new measurements.
    latent = interval_coverage(y_test, *pred.predict_interval(test, observation_noise=False))
    assert latent < 0.8


def test_larger_stated_noise_gives_wider_intervals(space, split):
    train, test = split
    y = [throughput(c) for c in train]
    small = GPPredictor(space).fit(train, y, noise=[0.01] * len(train))
    large = GPPredictor(space).fit(train, y, noise=[0.2] * len(train))
    lo_s, hi_s = small.predict_interval(test)
    lo_l, hi_l = large.predict_interval(test)
    assert np.median(hi_l / lo_l) > np.median(hi_s / lo_s) * 1.5


# -- GPPredictor: bad input --------------------------------------------------------------------
def test_one_trial_is_refused(space, split):
    train, _ = split
    with pytest.raises(PredictorError, match="at least 2 trials"):
        GPPredictor(space).fit(train[:1], [1.0])


def test_two_copies_of_one_config_are_refused(space, split):
    cfg = split[0][0]
    with pytest.raises(PredictorError, match="same configuration"):
        GPPredictor(space).fit([cfg, dict(cfg)], [1.0, 1.1])


@pytest.mark.parametrize("bad, match", [(math.nan, "values\\[1\\] = nan is not finite"),
                                        (math.inf, "values\\[1\\] = inf is not finite"),
                                        (-5.0, "values\\[1\\] = -5.0 is not positive"),
                                        (0.0, "values\\[1\\] = 0.0 is not positive")])
def test_unusable_values_are_refused(space, split, bad, match):
    train = split[0][:3]
    with pytest.raises(PredictorError, match=match) as err:
        GPPredictor(space).fit(train, [1.0, bad, 2.0])
    assert err.value.hint


def test_negative_values_are_fine_on_the_raw_scale(space, split):
    train = split[0][:5]
    pred = GPPredictor(space, log_objective=False).fit(train, [-1.0, -2.0, 0.5, 1.0, 3.0])
    assert pred.predict(train)[0].shape == (5,)


def test_a_config_outside_the_space_is_named(space, split):
    train = list(split[0][:3])
    train[1] = {**train[1], "micro_batch": 3}
    with pytest.raises(PredictorError, match=r"configs\[1\].*'micro_batch': 3.*not in the space"):
        GPPredictor(space).fit(train, [1.0, 2.0, 3.0])
    with pytest.raises(PredictorError, match=r"configs\[0\].*unknown key"):
        GPPredictor(space).fit([{**train[0], "bogus": 1}, train[2]], [1.0, 2.0])


def test_mismatched_lengths_are_refused(space, split):
    train = split[0][:4]
    with pytest.raises(PredictorError, match="4 configs but 3 values"):
        GPPredictor(space).fit(train, [1.0, 2.0, 3.0])
    with pytest.raises(PredictorError, match="4 configs but 2 noise"):
        GPPredictor(space).fit(train, [1.0, 2.0, 3.0, 4.0], noise=[0.1, 0.1])
    with pytest.raises(PredictorError, match="noise\\[0\\] = -0.1"):
        GPPredictor(space).fit(train, [1.0, 2.0, 3.0, 4.0], noise=[-0.1, 0.1, 0.1, 0.1])


def test_predict_before_fit_is_refused(space, split):
    pred = GPPredictor(space)
    with pytest.raises(PredictorError, match="before fit"):
        pred.predict(split[1][:2])
    with pytest.raises(PredictorError, match="before fit"):
        pred.predict_interval(split[1][:2])


def test_bad_level_and_bad_predict_configs_are_refused(fitted, split):
    with pytest.raises(PredictorError, match="level = 1.5"):
        fitted.predict_interval(split[1][:2], level=1.5)
    with pytest.raises(PredictorError, match="one dict"):
        fitted.predict(split[1][0])


# -- metrics and cross-validation ----------------------------------------------------------------
def test_metric_functions_agree_with_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=15), rng.normal(size=15)
    b[3] = b[4]  # a tie: tau-b must match scipy's default
    assert kendall_tau(a, b) == pytest.approx(stats.kendalltau(a, b).statistic)
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    assert mape([100.0, 200.0, 50.0], [110.0, 150.0, 50.0]) == pytest.approx((0.1 + 0.25) / 3)
    assert interval_coverage([1, 2, 3, 4], [0, 2.5, 3, 0], [1.5, 3, 3, 3.9]) == pytest.approx(0.5)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(PredictorError, match="y_true has 2 values but y_pred has 3"):
        kendall_tau([1, 2], [1, 2, 3])
    with pytest.raises(PredictorError, match="true value is 0"):
        mape([0.0, 1.0], [1.0, 1.0])


@pytest.mark.slow  # noise-free data: the fitted noise sits at its floor and L-BFGS works hard
def test_evaluate_predictor_on_a_smooth_function(space, split):
    cfgs = split[0] + split[1][:30]
    vals = [throughput(c) for c in cfgs]
    res = evaluate_predictor(lambda: GPPredictor(space), cfgs, vals, folds=5, seed=0)
    assert set(res) == {"kendall_tau", "spearman", "mape", "coverage95", "top5_recall", "regret",
                        "fit_s", "predict_s", "n", "folds"}
    assert res["n"] == 80 and res["folds"] == 5
    assert 0 <= res["top5_recall"] <= 1 and 0 <= res["regret"] < 0.1
    assert res["fit_s"] > 0 and res["predict_s"] > 0
    assert res["kendall_tau"] > 0.85 and res["spearman"] > 0.95
    assert 0 <= res["mape"] < 0.1
    assert 0 <= res["coverage95"] <= 1


def test_evaluate_predictor_on_pure_noise_finds_no_ranking(space, split):
    cfgs = split[0] + split[1][:30]
    vals = 1e4 * np.exp(0.3 * np.random.default_rng(5).standard_normal(len(cfgs)))
    res = evaluate_predictor(lambda: GPPredictor(space), cfgs, vals, folds=5, seed=0)
    assert abs(res["kendall_tau"]) < 0.2
    assert res["mape"] > 0.1


def test_cross_val_predict_is_out_of_fold(space, split):
    cfgs = split[0][:12]
    vals = np.array([throughput(c) for c in cfgs])
    vals[5] *= 10.0  # an outlier: in-sample it is fitted, out-of-fold it cannot be predicted
    cv = cross_val_predict(lambda: GPPredictor(space), cfgs, vals, folds="loo")
    assert set(cv) == {"y", "mean", "std", "lo", "hi", "fold", "fit_s", "predict_s"}
    assert cv["fit_s"] > 0 and cv["predict_s"] > 0
    assert sorted(cv["fold"]) == list(range(12))
    assert np.all(cv["lo"] <= cv["mean"]) and np.all(cv["mean"] <= cv["hi"])
    in_sample = GPPredictor(space).fit(cfgs, vals).predict([cfgs[5]])[0][0]
    assert cv["mean"][5] < 0.5 * vals[5] < in_sample
    k3 = cross_val_predict(lambda: GPPredictor(space), cfgs, vals, folds=3, seed=1)
    assert sorted(np.bincount(k3["fold"])) == [4, 4, 4]


def test_cross_validation_refuses_bad_folds(space, split):
    cfgs = split[0][:6]
    vals = [throughput(c) for c in cfgs]
    with pytest.raises(PredictorError, match="folds = 7 is more than the 6 trials"):
        evaluate_predictor(lambda: GPPredictor(space), cfgs, vals, folds=7)
    with pytest.raises(PredictorError, match="folds = 1"):
        evaluate_predictor(lambda: GPPredictor(space), cfgs, vals, folds=1)
    with pytest.raises(PredictorError, match="6 configs, 5 values"):
        cross_val_predict(lambda: GPPredictor(space), cfgs, vals[:5])


# -- categorical kernel, MLP ensemble --------------------------------------------------------------
@pytest.mark.slow
def test_mixed_categorical_kernel_ranks_held_out_configs(space, split):
    train, test = split
    pred = GPPredictor(space, categorical="mixed").fit(train, [throughput(c) for c in train])
    assert pred.model.__class__.__name__ == "MixedSingleTaskGP"
    mean, _ = pred.predict(test)
    assert stats.kendalltau([throughput(c) for c in test], mean).statistic > 0.85
    lo, hi = pred.predict_interval(test)
    assert (lo < mean).all() and (mean < hi).all()


def test_mixed_encoding_collapses_each_choice_to_its_index(space):
    from cubicml_lab.surrogate.gp import _one_hot_to_index

    pred = GPPredictor(space, categorical="mixed")
    X = pred._encode([{"layers": 3, "micro_batch": 8, "recompute": "full"},
                      {"layers": 1, "micro_batch": 1, "recompute": "none"}], "configs")
    assert X.tolist() == [[3.0, 3.0, 2.0], [1.0, 0.0, 0.0]]
    assert pred._bounds().tolist() == [[1.0, 0.0, 0.0], [12.0, 6.0, 2.0]]
    onehot = space.encode([{"layers": 3, "micro_batch": 8, "recompute": "selective"}])
    assert _one_hot_to_index(onehot, [(2, 3)]).tolist() == [[3.0, 3.0, 1.0]]
    with pytest.raises(PredictorError, match="categorical = 'embed'"):
        GPPredictor(space, categorical="embed")


@pytest.mark.slow
def test_mlp_ensemble_ranks_held_out_configs_and_brackets_them(space, split):
    from cubicml_lab.surrogate import MLPPredictor

    train, test = split
    pred = MLPPredictor(space, seed=1, epochs=300).fit(train, [throughput(c) for c in train])
    mean, std = pred.predict(test)
    truth = np.array([throughput(c) for c in test])
    assert stats.kendalltau(truth, mean).statistic > 0.8
    assert (std > 0).all() and pred.point_estimate == "median"
    lo, hi = pred.predict_interval(test)
    assert interval_coverage(truth, lo, hi) > 0.7
    again = MLPPredictor(space, seed=1, epochs=300).fit(train, [throughput(c) for c in train])
    assert again.predict(test)[0] == pytest.approx(mean), "a seed fixes the fit"
    with pytest.raises(PredictorError, match="members = 0"):
        MLPPredictor(space, members=0)
    with pytest.raises(PredictorError, match="not positive"):
        MLPPredictor(space).fit(train[:3], [1.0, -2.0, 3.0])


# -- feasibility -----------------------------------------------------------------------------------
def memory_gib(cfg: dict) -> float:
    return 0.05 * cfg["micro_batch"] * cfg["layers"] * (0.6 if cfg["recompute"] == "full" else 1)


def test_feasibility_learns_the_memory_boundary_of_a_device(space, split):
    train, test = split
    limit = 4.0  # GiB: micro_batch * layers above about 80 does not fit
    status = ["ok" if memory_gib(c) <= limit else "oom" for c in train]
    mem = [memory_gib(c) if s == "ok" else 3 * limit for c, s in zip(train, status)]
    pred = GPPredictor(space)
    pred.feasibility = FeasibilityModel(space).fit(train, status, mem)
    p = pred.predict_feasibility(test, memory_limit=limit)
    fits = np.array([memory_gib(c) <= limit for c in test])
    assert ((p > 0.5) == fits).mean() > 0.9
    # The memory of the trials that ran carries over to a device with a quarter of the memory.
    p_small = pred.predict_feasibility(test, memory_limit=limit / 4)
    fits_small = np.array([memory_gib(c) <= limit / 4 for c in test])
    assert ((p_small > 0.5) == fits_small).mean() > 0.9
    assert fits.sum() > fits_small.sum() + 10
    assert pred.feasibility.memory.n_train == status.count("ok"), "oom figures are lower bounds"


@pytest.mark.slow
def test_failures_without_memory_figures_feed_the_classifier(space, split):
    train, test = split
    status = ["failed" if c["recompute"] == "selective" and c["micro_batch"] >= 8 else "ok"
              for c in train]
    pred = GPPredictor(space)
    pred.feasibility = FeasibilityModel(space).fit(train, status)
    p = pred.predict_feasibility(test)
    bad = np.array([c["recompute"] == "selective" and c["micro_batch"] >= 8 for c in test])
    assert p[bad].mean() < 0.3 < 0.7 < p[~bad].mean()


def test_feasibility_edge_cases_and_bad_input(space, split):
    from cubicml_lab.surrogate import FeasibilityModel

    train, test = split
    assert (GPPredictor(space).predict_feasibility(test[:3]) == 1).all(), "no model: no evidence"
    assert (FeasibilityModel(space).fit(train[:4], ["ok"] * 4).predict(test[:2]) == 1).all()
    assert (FeasibilityModel(space).fit(train[:4], ["oom"] * 4).predict(test[:2]) == 0).all()
    with pytest.raises(PredictorError, match="unknown status 'crashed'"):
        FeasibilityModel(space).fit(train[:2], ["ok", "crashed"])
    with pytest.raises(PredictorError, match="2 configs but 1 statuses"):
        FeasibilityModel(space).fit(train[:2], ["ok"])
    with pytest.raises(PredictorError, match="memory_limit = -1"):
        FeasibilityModel(space).fit(train[:4], ["ok"] * 4).predict(test[:1], memory_limit=-1)


# -- ranking metrics and learning curves -----------------------------------------------------------
def test_top_k_recall_and_regret():
    from cubicml_lab.surrogate import regret, top_k_recall

    y = np.arange(1.0, 101.0)
    assert top_k_recall(y, y) == 1.0 and top_k_recall(y, -y) == 0.0
    swapped = y.copy()
    swapped[[99, 0]] = swapped[[0, 99]]  # the best is predicted worst, the worst best
    assert top_k_recall(y, swapped, 0.05) == pytest.approx(4 / 5)
    assert regret(y, y) == 0.0 and regret(y, swapped) == pytest.approx(0.99)
    with pytest.raises(PredictorError, match="frac = 0"):
        top_k_recall(y, y, 0)


@pytest.mark.slow
def test_learning_curve_uses_the_same_splits_and_loo_for_small_tables(space, split):
    from cubicml_lab.surrogate import learning_curve

    train, _ = split
    y = [throughput(c) for c in train[:16]]
    rows = learning_curve({"gp": lambda: GPPredictor(space)}, train[:16], y, sizes=(8, 13, 50),
                          repeats=2, min_test=4)
    assert [(r["n"], r["split"], r["repeat"]) for r in rows] == [(8, "random", 0),
                                                                  (8, "random", 1),
                                                                  (15, "loo", 0)]
    assert all(-1 <= r["kendall_tau"] <= 1 and r["fit_s"] > 0 for r in rows)
    assert rows[-1]["kendall_tau"] > rows[0]["kendall_tau"] - 0.3


def test_hyperparameters_from_a_subset_then_conditioning_on_every_trial(space, split):
    train, test = split
    y = [throughput(c) for c in train]
    pred = GPPredictor(space, max_fit_points=20).fit(train, y)
    assert pred.model.train_inputs[0].shape[0] == len(train), "conditions on all 50 trials"
    mean, _ = pred.predict(train)
    assert mape(y, mean) < 0.05, "and interpolates them, not only the 20 of the fit"
    held_out, _ = pred.predict(test)
    assert stats.kendalltau([throughput(c) for c in test], held_out).statistic > 0.85
    with pytest.raises(PredictorError, match="max_fit_points = 1"):
        GPPredictor(space, max_fit_points=1)


# -- GPPredictor with an analytical cost model as its prior mean ----------------------------------
def roofline(cfg: dict) -> float:
    """Samples/s of a made-up step: a per-layer cost plus a per-micro-batch overhead per sample,
    and a recompute penalty the cost model does not know."""
    penalty = {"none": 1.0, "selective": 0.9, "full": 0.75}[cfg["recompute"]]
    return 1e4 * penalty / (cfg["layers"] + 16.0 / cfg["micro_batch"])


def roofline_terms(cfg: dict) -> list[float]:
    return [float(cfg["layers"]), 1.0 / cfg["micro_batch"]]


def test_a_cost_model_mean_ranks_well_from_few_trials(space):
    cfgs = space.enumerate()
    order = np.random.default_rng(3).permutation(len(cfgs))
    train, test = [cfgs[i] for i in order[:8]], [cfgs[i] for i in order[8:]]
    truth = np.array([roofline(c) for c in test])
    y = [roofline(c) for c in train]
    plain = GPPredictor(space).fit(train, y)
    costed = GPPredictor(space, cost_model=roofline_terms).fit(train, y)
    tau_plain = kendall_tau(plain.predict(test)[0], truth)
    tau_cost = kendall_tau(costed.predict(test)[0], truth)
    assert tau_cost > 0.85 and tau_cost > tau_plain + 0.1, (tau_cost, tau_plain)
    # the fitted weights recover the ratio of the two terms: 16 per unit of 1/micro_batch
    mean = costed.model.mean_module
    ratio = float((mean.a[1] - mean.a[0] - mean.shift[1] + mean.shift[0]).exp().detach())
    assert 14 < ratio < 18, ratio
    # the fast exact posterior and GPyTorch's agree with the cost columns too
    import torch

    X = costed.encode(test)
    mu, _ = costed.posterior_encoded(X)
    with torch.no_grad():
        np.testing.assert_allclose(mu, costed.model.posterior(X).mean.squeeze(-1).numpy(),
                                   rtol=1e-8, atol=1e-8)


def test_the_floored_matern_is_gpytorchs_matern_with_and_without_gradients():
    """The derived-input kernel rewrites GPyTorch's Matern-5/2 (in place when no gradient is
    needed): same matrix, same diagonal, and -inf inputs (zero cost terms) land at -1."""
    import torch
    from gpytorch.kernels import MaternKernel

    from cubicml_lab.surrogate.gp import _matern_with_floor

    torch.manual_seed(0)
    x1, x2 = torch.rand(40, 3, dtype=torch.float64), torch.rand(7, 3, dtype=torch.float64)
    ours = _matern_with_floor([0, 1, 2]).double()
    ref = MaternKernel(nu=2.5, ard_num_dims=3).double()
    ref.lengthscale = ours.lengthscale = torch.tensor([[0.3, 1.2, 0.7]], dtype=torch.float64)
    want = ref(x1, x2).to_dense()
    with torch.no_grad():  # the in-place path
        np.testing.assert_allclose(ours(x1, x2).to_dense(), want.detach(), atol=1e-12)
    np.testing.assert_allclose(ours(x1, x2).to_dense().detach(), want.detach(), atol=1e-12)
    np.testing.assert_allclose(ours(x1, x1, diag=True).detach(), 1.0, atol=1e-12)
    floored = x1.clone()
    floored[:, 2] = -torch.inf
    x1[:, 2] = -1.0
    with torch.no_grad():
        np.testing.assert_allclose(ours(floored, x2).to_dense(), ref(x1, x2).to_dense(),
                                   atol=1e-12)


@pytest.mark.parametrize("arg,fn,match", [
    ("cost_model", lambda c: [-1.0, 2.0], "finite number"),
    ("cost_model", lambda c: [float("nan")], "finite number"),
    ("cost_model", lambda c: [0.0, 0.0], "at least one > 0"),
    ("cost_model", lambda c: [1.0] * (1 + c["layers"] % 2), "finite number"),
    ("cost_model", lambda c: c["no_such_knob"], "raised KeyError"),
    ("features", lambda c: [0.0], "finite number"),  # features must be > 0: logs
    ("features", lambda c: [-2.0, 1.0], "finite number"),
    ("features", lambda c: [float("inf")], "finite number"),
    ("features", lambda c: [1.0] * (1 + c["layers"] % 2), "finite number"),
    ("features", lambda c: c["no_such_knob"], "raised KeyError"),
])
def test_a_bad_cost_model_or_features_function_is_named(space, split, arg, fn, match):
    cfgs = split[0][:10]
    with pytest.raises(PredictorError, match=match) as err:
        GPPredictor(space, **{arg: fn}).fit(cfgs, [roofline(c) for c in cfgs])
    assert f"{arg}(configs[" in str(err.value)


def test_the_cost_slope_prior_carries_the_physics_to_knobs_the_fit_never_varied():
    """Trials at one thread count, of three micro-batch sizes: the objective's slope in the cost
    model is hardly pinned by them, and held near -1 (a speed, costs per unit) the GP predicts
    the other thread counts from the physics; left to the data it drifts and misses by more."""
    space = Space([PowerOfTwo("micro_batch", 1, 64), PowerOfTwo("threads", 1, 4),
                   Choice("act", ["a", "b"])])

    def terms(cfg):
        return [1.0 / cfg["threads"], 8.0 / cfg["micro_batch"], 0.5 if cfg["act"] == "b" else 0.1]

    cfgs = space.enumerate()
    train = [c for c in cfgs if c["threads"] == 4 and c["micro_batch"] in (8, 16, 32)]
    truth = np.array([1e4 / sum(terms(c)) for c in cfgs])
    off = {}
    for exponent in (-1.0, None):
        pred = GPPredictor(space, cost_model=terms, cost_exponent=exponent).fit(
            train, [1e4 / sum(terms(c)) for c in train])
        off[exponent] = float(np.abs(np.log(pred.predict(cfgs)[0] / truth)).max())
    assert off[-1.0] < np.log(1.05) and off[-1.0] < off[None], off


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "-1", True])
def test_a_bad_cost_exponent_is_named(space, bad):
    with pytest.raises(PredictorError, match="cost_exponent") as err:
        GPPredictor(space, cost_model=roofline_terms, cost_exponent=bad)
    assert "+1 for a time" in err.value.hint


def test_a_cost_term_that_is_zero_where_it_does_not_apply(space):
    """Recompute costs a term only when it is on (0 otherwise): the mean skips the zeros."""
    def truth(cfg):
        extra = {"none": 0.0, "selective": 2.0, "full": 6.0}[cfg["recompute"]]
        return 1e4 / (cfg["layers"] + 16.0 / cfg["micro_batch"] + extra)

    def terms(cfg):
        return [float(cfg["layers"]), 1.0 / cfg["micro_batch"],
                {"none": 0.0, "selective": 1.0, "full": 3.0}[cfg["recompute"]]]

    cfgs = space.enumerate()
    order = np.random.default_rng(4).permutation(len(cfgs))
    train, test = [cfgs[i] for i in order[:10]], [cfgs[i] for i in order[10:]]
    assert any(terms(c)[2] == 0 for c in train) and any(terms(c)[2] > 0 for c in train)
    pred = GPPredictor(space, cost_model=terms).fit(train, [truth(c) for c in train])
    mean, _ = pred.predict(test)
    assert np.isfinite(mean).all()
    assert kendall_tau(mean, [truth(c) for c in test]) > 0.9


def test_a_cost_term_no_trial_of_the_fit_had_is_left_out_of_the_mean(space):
    """A term that is 0 on every trial (say, bf16 FLOPs when only fp32 ran) has no weight to
    learn: a configuration that has it is predicted from the other terms, not swamped by it."""
    def truth(cfg):
        return 1e4 / (cfg["layers"] + 16.0 / cfg["micro_batch"])

    def terms(cfg):  # the layers' cost in one of two terms, by recompute setting
        full = cfg["recompute"] == "full"
        return [0.0 if full else float(cfg["layers"]), 1e6 * cfg["layers"] if full else 0.0,
                1.0 / cfg["micro_batch"]]

    ratio = fit_without_full_recompute(space, terms, truth, every=5)[0]
    assert np.isfinite(ratio).all() and (ratio > 0.5).all(), ratio  # was ~1e-6


def fit_without_full_recompute(space, terms, truth, every):
    """Fit a cost-model GP on every ``every``-th configuration without full recomputation;
    return its predictions over the truth on those with it, the predictor and those."""
    cfgs = space.enumerate()
    train = [c for c in cfgs if c["recompute"] == "none"][::every]
    unseen = [c for c in cfgs if c["recompute"] == "full"]
    pred = GPPredictor(space, cost_model=terms).fit(train, [truth(c) for c in train])
    return pred.predict(unseen)[0] / np.array([truth(c) for c in unseen]), pred, unseen


def test_a_cost_term_no_trial_had_is_weighed_as_a_seen_term_of_its_unit(space):
    """Full recomputation's layer cost in its own term, never measured: with ``term_units`` it
    costs per unit what the measured term of its unit costs; without, it is left out (and the
    configurations that have it are predicted too fast)."""
    def truth(cfg):
        return 1e4 / (cfg["layers"] * (2.0 if cfg["recompute"] == "full" else 1.0)
                      + 16.0 / cfg["micro_batch"])

    def terms(cfg):
        full = cfg["recompute"] == "full"
        return [0.0 if full else float(cfg["layers"]), 2.0 * cfg["layers"] if full else 0.0,
                1.0 / cfg["micro_batch"]]

    ratio_alone = fit_without_full_recompute(space, terms, truth, every=3)[0]
    terms.term_units = ("layer", "layer", "launch")
    ratio_paired, paired, unseen = fit_without_full_recompute(space, terms, truth, every=3)
    assert np.median(ratio_alone) > 1.5, ratio_alone  # the layers' cost left out: too fast
    assert 0.7 < np.median(ratio_paired) < 1.3, ratio_paired
    assert np.median(abs(np.log(ratio_paired))) < 0.5 * np.median(abs(np.log(ratio_alone)))
    big = [c for c in unseen if c["layers"] == 12 and c["micro_batch"] == 64]
    shares = paired.cost_shares(big)
    assert shares.shape == (1, 3) and shares.iloc[0, 1] > 0.5  # the borrowed term weighs in
    terms.term_units = ("layer", "launch")
    with pytest.raises(PredictorError, match="term_units has 2 names for 3 values"):
        fit_without_full_recompute(space, terms, truth, every=3)


# -- GPPredictor with derived inputs (features) ----------------------------------------------------
def diagonal(cfg: dict) -> float:
    """A surface that oscillates along log2(a * b): one smooth function of a product of knobs."""
    return 100 * math.exp(math.sin(0.9 * math.log2(cfg["a"] * cfg["b"]))) * \
        (1.2 if cfg["kind"] == "x" else 1.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_derived_feature_makes_a_product_of_knobs_one_input(seed):
    space = Space([PowerOfTwo("a", 1, 64), PowerOfTwo("b", 1, 64), Choice("kind", ["x", "y"])])
    cfgs = space.enumerate()
    order = np.random.default_rng(seed).permutation(len(cfgs))
    train, test = [cfgs[i] for i in order[:12]], [cfgs[i] for i in order[12:]]
    y, truth = [diagonal(c) for c in train], [diagonal(c) for c in test]
    plain = GPPredictor(space).fit(train, y)
    derived = GPPredictor(space, features=lambda c: [c["a"] * c["b"]]).fit(train, y)
    tau_plain = kendall_tau(plain.predict(test)[0], truth)
    tau_derived = kendall_tau(derived.predict(test)[0], truth)
    assert tau_derived > 0.7 and tau_derived > tau_plain + 0.2, (tau_derived, tau_plain)
    # the features' log column is the kernel's, normalised to the fit's range; the fast
    # posterior matches GPyTorch's on configurations outside that range too
    import torch

    X = derived.encode(test)
    assert X.shape[1] == space.encoded_bounds().shape[1] + 1
    with torch.no_grad():
        np.testing.assert_allclose(derived.posterior_encoded(X)[0],
                                   derived.model.posterior(X).mean.squeeze(-1).numpy(),
                                   rtol=1e-8, atol=1e-8)


def test_features_and_a_cost_model_together(space, split):
    """Features join the kernel, the cost terms join it too and also make the mean."""
    train, test = split
    pred = GPPredictor(space, cost_model=roofline_terms,
                       features=lambda c: [c["layers"] * c["micro_batch"]])
    pred.fit(train[:12], [roofline(c) for c in train[:12]])
    n_space = space.encoded_bounds().shape[1]
    assert pred.encode(test).shape[1] == n_space + 1 + 2 * 2
    assert kendall_tau(pred.predict(test)[0], [roofline(c) for c in test]) > 0.85


def test_features_give_the_same_number_of_values_at_prediction(space, split):
    train, test = split
    calls = {"n": 0}

    def grows(cfg):  # one value during the fit, two afterwards
        calls["n"] += 1
        return [float(cfg["layers"])] * (1 if calls["n"] <= len(train) + 1 else 2)

    pred = GPPredictor(space, features=grows).fit(train, [roofline(c) for c in train])
    with pytest.raises(PredictorError, match="features returned 2 values, the fit had 1"):
        pred.predict(test)


def test_cost_model_settings_are_checked(space):
    with pytest.raises(PredictorError, match="not callable"):
        GPPredictor(space, cost_model=[1.0, 2.0])
    with pytest.raises(PredictorError, match="onehot"):
        GPPredictor(space, categorical="mixed", cost_model=roofline_terms)
    with pytest.raises(PredictorError, match="features = 3 is not callable"):
        GPPredictor(space, features=3)
    with pytest.raises(PredictorError, match="features needs categorical='onehot'"):
        GPPredictor(space, categorical="mixed", features=lambda c: [1.0])


@pytest.mark.parametrize("keep", [1, 10, 60])
def test_the_bounded_top_rows_are_the_exact_top_rows(space, split, monkeypatch, keep):
    """top_encoded bounds each row's variance by a block of the training points, then scores
    exactly in the bound's order: the rows it keeps and their scores are those of ranking every
    row by the exact posterior, and the bound is never below the exact variance."""
    import torch

    from cubicml_lab.search.acquisition import log_ei_standard
    from cubicml_lab.surrogate import fitted as fitted_module

    monkeypatch.setattr(fitted_module, "SCREEN_BLOCK", 16)
    train, rest = split
    noisy = [throughput(c) * (1.0 + 0.05 * math.sin(i)) for i, c in enumerate(train)]
    pred = GPPredictor(space, seed=0).fit(train, noisy)
    X = pred.encode(rest)
    mu, var = (torch.as_tensor(a) for a in pred.posterior_encoded(X))
    mu_b, var_b = pred._fast_posterior(X, bound_only=True)
    torch.testing.assert_close(mu_b, mu)
    assert bool((var_b >= var - 1e-12).all()) and bool((var_b > var + 1e-9).any())

    best = float(mu.max()) - 0.05

    def log_ei(m, v):
        s = v.clamp_min(1e-18).sqrt()
        return log_ei_standard((m - best) / s) + s.log()

    full = log_ei(mu, var)
    want = torch.topk(full, keep).indices.sort().values
    got, scores = pred.top_encoded(X, log_ei, keep)
    assert got.tolist() == want.tolist()
    torch.testing.assert_close(scores, full[want])
    if keep <= 10:  # the bound is tight enough to leave most rows unscored
        assert pred.last_top_scored < len(X) / 4
