"""The demo's prior: the gpt cost model with this CPU's cost of an fp32 FLOP."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from cubicml_lab.demo import (DEFAULT_CONFIG, _max_threads, cpu_thread_scaling, demo_prior,
                              demo_space)
from cubicml_lab.surrogate import GPPredictor
from cubicml_lab.workloads import WithDefaults


@pytest.fixture
def rates(tmp_path, monkeypatch):
    """A cache of matmul rates in which this CPU runs bf16 3x as fast as fp32, and of attention
    scores in which a bf16 score costs 4 fp32 ones."""
    import torch

    from cubicml_lab.hardware import cpu_model

    monkeypatch.setenv("CUBICML_LAB_CACHE_DIR", str(tmp_path))
    key = f"{cpu_model()}|threads={torch.get_num_threads()}"
    score = f"{key}|attention_score seq=128 d=128"
    cache = {f"{score}|fp32": {"seconds": 1e-9}, f"{score}|bf16": {"seconds": 4e-9}}
    for n in {torch.get_num_threads(), _max_threads()}:
        cache.update({f"{cpu_model()}|threads={n}|fp32": {"flops": 1e11},
                      f"{cpu_model()}|threads={n}|bf16": {"flops": 3e11}})
    if _max_threads() > 1:  # one thread: 1.6x slower in either precision
        cache.update({f"{cpu_model()}|threads=1|fp32": {"flops": 1e11 / 1.6},
                      f"{cpu_model()}|threads=1|bf16": {"flops": 3e11 / 1.6}})
    (tmp_path / "cpu_peak.json").write_text(json.dumps(cache))
    return 3.0


def test_the_demo_prior_weighs_an_fp32_attention_score_by_this_cpus_attention_kernel(rates):
    cost = demo_prior()["cost_model"]
    fp32, bf16 = cost(DEFAULT_CONFIG), cost({**DEFAULT_CONFIG, "precision": "bf16"})
    assert fp32[5] == pytest.approx(bf16[6] / 4) and fp32[6] == bf16[5] == 0.0
    assert demo_prior(fp32_score_cost=1.0)["cost_model"](DEFAULT_CONFIG)[5] == bf16[6]


def test_the_demo_prior_splits_work_among_threads_as_this_cpus_matmuls_speed_up(rates):
    """Cached rates of 1.6x at the most threads over 1: the threads' split work (FLOPs,
    activations, scores) costs 1.6x as much at 1 thread, the per-step and per-micro-batch
    terms the same; ``thread_scaling=1.0`` splits it evenly among the threads."""
    n = _max_threads()
    if n == 1:
        assert cpu_thread_scaling() == 1.0
        pytest.skip("one CPU thread here: no split to price")
    assert cpu_thread_scaling() == pytest.approx(math.log(1.6) / math.log(n))
    for scaling, speedup in ((None, 1.6), (1.0, n)):
        cost = demo_prior(thread_scaling=scaling)["cost_model"]
        many, one = cost(DEFAULT_CONFIG), cost({**DEFAULT_CONFIG, "threads": 1})
        for i in (0, 3, 5):
            assert one[i] == pytest.approx(speedup * many[i])
        assert one[2] == many[2] and one[4] == many[4]


def test_this_cpus_thread_scaling_is_measured_and_leaves_torchs_threads_as_they_were(
        tmp_path, monkeypatch):
    import torch

    from cubicml_lab.hardware import cpu_model

    monkeypatch.setenv("CUBICML_LAB_CACHE_DIR", str(tmp_path))
    before = torch.get_num_threads()
    assert cpu_thread_scaling(1) == 1.0 and not (tmp_path / "cpu_peak.json").exists()
    scaling = cpu_thread_scaling(2)
    assert torch.get_num_threads() == before
    path = tmp_path / "cpu_peak.json"
    cached = json.loads(path.read_text()) if path.exists() else {}
    # a rate that could not be measured (its timing shared the cores) is not cached, and its
    # precision is left out of the mean; with none left the scaling is the even split, 1.0
    rate = {(n, p): cached[key]["flops"] for n in (1, 2) for p in ("fp32", "bf16")
            if (key := f"{cpu_model()}|threads={n}|{p}") in cached}
    assert all(r > 0 for r in rate.values())
    logs = [math.log2(rate[2, p] / rate[1, p]) for p in ("fp32", "bf16")
            if (1, p) in rate and (2, p) in rate]
    # the mean log speed-up of the precisions' cached rates, in log2 units, within [0, 1]
    expected = min(1.0, max(0.0, sum(logs) / len(logs))) if logs else 1.0
    assert scaling == pytest.approx(expected)


def test_the_demo_prior_weighs_an_fp32_flop_by_this_cpus_matmul_rates(rates):
    cost = demo_prior()["cost_model"]
    fp32, bf16 = cost(DEFAULT_CONFIG), cost({**DEFAULT_CONFIG, "precision": "bf16"})
    assert fp32[0] == pytest.approx(rates * bf16[1]) and fp32[1] == bf16[0] == 0.0


def test_fp32_is_predicted_from_bf16_trials_at_the_machines_flop_cost(rates):
    """A machine on which an fp32 FLOP costs 3 bf16 ones, 70% of a bf16 step in FLOPs: a GP
    that saw bf16 trials only predicts the fp32 configurations from the measured rates; with
    an fp32 FLOP costing a bf16 one it puts them far too fast."""
    plain, priced = WithDefaults("gpt", "cost_terms"), demo_prior()["cost_model"]
    base = np.array(plain({**DEFAULT_CONFIG, "precision": "bf16"}))
    shares = np.array([0.0, 0.7, 0.1, 0.05, 0.1, 0.0, 0.05])  # of a bf16 step at the default
    weights = np.divide(shares, base, out=np.zeros_like(base), where=base > 0)
    weights[0] = weights[1]  # FLOP for FLOP: the 3x is in the priced terms
    weights[5] = weights[6]  # a score as the priced terms weigh it: an fp32 one a quarter

    def truth(cfg):
        return 1e4 / float(weights @ np.array(priced(cfg)))

    space = demo_space()
    configs = space.enumerate()
    train = [c for c in configs if c["precision"] == "bf16"][::3]  # every thread and recompute
    unseen = [c for c in configs if c["precision"] == "fp32"]
    ratios = {}
    for name, cost in (("priced", priced), ("plain", plain)):
        pred = GPPredictor(space, cost_model=cost).fit(train, [truth(c) for c in train])
        ratios[name] = pred.predict(unseen)[0] / np.array([truth(c) for c in unseen])
    off = {name: abs(np.log(np.median(r))) for name, r in ratios.items()}
    assert np.median(ratios["plain"]) > 1.5, ratios["plain"]  # fp32 as fast as bf16
    assert off["priced"] < min(np.log(1.4), off["plain"] / 2), ratios["priced"]


def test_each_precision_gets_its_own_cost_per_attention_score(monkeypatch):
    """A machine on which a bf16 attention score costs 4 fp32 ones (a CPU converting each to
    fp32 and back): fitted on the bf16 configurations and three fp32 ones of 8, 4 and 2 heads,
    the cost model with an attention term per precision predicts the other fp32
    configurations closer than one whose two attention terms are summed into one, which
    gives fp32 the bf16 weight. Where the fp32 trials all have 2 heads (their scores per
    token never vary), the unit prior draws the fp32 score weight towards the bf16 one, as
    close as its width says."""
    from botorch.optim.utils import sample_all_priors

    import cubicml_lab.surrogate.gp as gp

    cost = demo_prior(fp32_flop_cost=2.0, fp32_score_cost=1.0, thread_scaling=1.0)["cost_model"]
    base = np.array(cost({**DEFAULT_CONFIG, "precision": "bf16"}))
    shares = np.array([0.0, 0.5, 0.05, 0.05, 0.1, 0.0, 0.3])  # of a bf16 step at the default
    weights = np.divide(shares, base, out=np.zeros_like(base), where=base > 0)
    weights[0], weights[5] = weights[1], weights[6] / 4

    def truth(cfg):
        return 1e4 / float(weights @ np.array(cost(cfg)))

    def merged(cfg):
        t = cost(cfg)
        return [*t[:5], t[5] + t[6]]

    merged.term_units = cost.term_units[:6]
    space = demo_space()
    configs = [c for c in space.enumerate() if c["threads"] == DEFAULT_CONFIG["threads"]
               and c["recompute"] == "none"]
    bf16 = [c for c in configs if c["precision"] == "bf16"]
    fp32 = [c for c in configs if c["precision"] == "fp32"]

    def fit(model, shapes):
        train = bf16 + [c for c in fp32 if (c["micro_batch"], c["n_heads"]) in shapes]
        assert len(train) == len(bf16) + 3
        pred = GPPredictor(space, cost_model=model).fit(train, [truth(c) for c in train])
        unseen = [c for c in fp32 if c not in train]
        ratio = pred.predict(unseen)[0] / np.array([truth(c) for c in unseen])
        return pred, float(np.median(np.abs(np.log(ratio))))

    varied = {(2, 8), (8, 4), (32, 2)}
    errors = {name: fit(model, varied)[1] for name, model in (("split", cost), ("merged", merged))}
    assert errors["split"] < errors["merged"] / 2, errors

    def score_gap(pred):  # log cost of an fp32 score over a bf16 one, as fitted
        mean = pred.model.mean_module
        return float((mean.a[5] - mean.shift[5]) - (mean.a[6] - mean.shift[6]))

    def unit_priors(pred):
        return [name for name, *_ in pred.model.mean_module.named_priors() if "unit" in name]

    two_heads = {(4, 2), (16, 2), (32, 2)}
    drawn = fit(cost, two_heads)[0]
    gap = score_gap(drawn)
    assert sorted(unit_priors(drawn)) == ["unit_prior_1_0", "unit_prior_6_5"]  # FLOPs, scores
    sample_all_priors(drawn.model)  # BoTorch's fit retries can sample the unit prior too
    assert score_gap(drawn) != gap and math.isfinite(score_gap(drawn))
    # how far the fit goes is the prior's width: at 1 the data may move it by about 1 either
    # way (where depends on the optimiser's path), a narrow prior holds it at the bf16 weight,
    # and without one the fit leaves it wherever the data let it drift
    monkeypatch.setattr(gp, "UNIT_PRIOR_SD", 0.1)
    tight = score_gap(fit(cost, two_heads)[0])
    monkeypatch.setattr(gp, "UNIT_PRIOR_SD", None)
    free = fit(cost, two_heads)[0]
    assert not unit_priors(free)
    assert abs(tight) < min(0.1, abs(score_gap(free)) / 4), (tight, gap, score_gap(free))


def test_the_report_scores_the_gp_told_the_noise_the_search_tells_it():
    """predictor_report's folds are fitted with each trial's measured noise, as the search's GP
    is (a flagged trial at 10 % at least); observed_noise=False infers one noise level."""
    import pandas as pd

    from cubicml_lab.demo import predictor_report
    from cubicml_lab.search.bayesian import observed_noise

    space = demo_space()
    configs = space.enumerate()[::9][:8]
    rng = np.random.default_rng(0)
    y = [1e4 * c["micro_batch"] ** 0.3 * (1.5 if c["precision"] == "bf16" else 1.0)
         * float(np.exp(rng.normal(0, 0.03))) for c in configs]
    rel = [0.01, 0.02, 0.015, 0.05, 0.01, 0.03, 0.02, 0.01]
    df = pd.DataFrame([{**c, "status": "ok", "throughput": v, "throughput_rel_ci": r,
                        "contended": float(i == 3)}
                       for i, (c, v, r) in enumerate(zip(configs, y, rel))])
    told, _ = observed_noise([{"throughput_rel_ci": r, "contended": float(i == 3)}
                              for i, r in enumerate(rel)])
    assert told[3] == 0.1 and told[0] == 0.01
    report = predictor_report(df, space)
    plain = predictor_report(df, space, observed_noise=False)
    # the fold that leaves out trial 0, by hand, with the told noise
    pred = GPPredictor(space, "throughput", seed=0).fit(configs[1:], y[1:], noise=told[1:])
    assert report["mean"][0] == pytest.approx(float(pred.predict([configs[0]])[0][0]), rel=1e-6)
    assert not np.allclose(report["mean"], plain["mean"], rtol=1e-4)


def test_the_report_never_lets_a_left_out_trial_shape_its_own_prediction():
    """With the drift exponent learned, each fold learns it without the trial it leaves out:
    changing that trial's figure and drift correction changes no prediction of it (when the
    exponent was learned once on all trials it did, and the left-out figure was scored at an
    exponent chosen partly to fit it)."""
    import pandas as pd

    from cubicml_lab.demo import predictor_report

    space = demo_space()
    configs = space.enumerate()[::9][:8]
    rng = np.random.default_rng(1)
    slow = rng.uniform(0.8, 1.0, len(configs))  # the machine's speed at each trial
    raw = [1e4 * c["micro_batch"] ** 0.3 * (1.5 if c["precision"] == "bf16" else 1.0) * s
           * float(np.exp(rng.normal(0, 0.02))) for c, s in zip(configs, slow)]
    rows = [{**c, "status": "ok", "throughput_raw": r, "throughput": r / s ** 0.6,
             "throughput_rel_ci": 0.01} for c, r, s in zip(configs, raw, slow)]
    report = predictor_report(pd.DataFrame(rows), space)
    assert report["drift_exponent"] is not None and report["drift_exponent"] != 1.0
    k = 2
    rows[k] = {**rows[k], "throughput_raw": rows[k]["throughput_raw"] * 0.5,
               "throughput": rows[k]["throughput_raw"] * 0.5 / 0.7}
    moved = predictor_report(pd.DataFrame(rows), space)
    assert moved["mean"][k] == pytest.approx(report["mean"][k], rel=1e-6)
    assert not np.allclose(np.delete(moved["mean"], k), np.delete(report["mean"], k), rtol=1e-4)


def test_summary_table_shows_the_ci_of_the_figure_it_shows():
    """The figure's CI (what the search is told, NaN when unknown), not the timer's stopping CI
    (inf under 6 windows); a table without it keeps the stopping CI."""
    from cubicml_lab.demo import demo_space, summary_table

    space = demo_space()
    cfg = {"micro_batch": 8, "n_heads": 4, "precision": "fp32", "recompute": "none", "threads": 1}
    df = pd.DataFrame([{"trial_id": 1, "status": "ok", **cfg, "tokens_per_s": 1234.4,
                        "step_time_s": 0.1, "step_time_rel_ci": math.inf,
                        "throughput_rel_ci": 0.0234}])
    out = summary_table(df, space)
    assert "step_time_rel_ci" not in out and out.loc[1, "throughput_rel_ci"] == 0.023
    assert out.loc[1, "tokens_per_s"] == 1234.0
    old = summary_table(df.drop(columns="throughput_rel_ci"), space)
    assert old.loc[1, "step_time_rel_ci"] == math.inf


def test_a_bad_wait_for_idle_cores_is_refused_before_the_store_is_made(tmp_path):
    from cubicml_lab.demo import run_demo
    from cubicml_lab.errors import MeasurementError

    store = tmp_path / "demo.sqlite"
    with pytest.raises(MeasurementError, match="wait_for_idle_s"):
        run_demo(store=store, out=tmp_path, wait_for_idle_s=-3)
    assert not store.exists()
