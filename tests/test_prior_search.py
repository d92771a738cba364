"""BayesianSearch with a physics prior: cost model, memory model, history, observed noise."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import cubicml_lab as cml
from cubicml_lab.errors import ConfigError, SearchError
from cubicml_lab.search import BayesianSearch
from cubicml_lab.search.bayesian import BO_P_FEASIBLE
from cubicml_lab.search.describe import searcher_from_dict, searcher_to_dict
from cubicml_lab.space import Choice, Int, PowerOfTwo, Space

LIMIT = 12.0


@pytest.fixture
def space() -> Space:
    return Space([Int("layers", 1, 8), PowerOfTwo("micro_batch", 1, 16),
                  Choice("recompute", ["none", "full"])])


def memory_gib(cfg: dict) -> float:
    """Made-up peak memory: layers x micro-batch, a quarter of it with full recompute."""
    return 0.5 * cfg["layers"] * cfg["micro_batch"] * (0.25 if cfg["recompute"] == "full" else 1)


def cost_terms(cfg: dict) -> list[float]:
    """Seconds per sample: compute (1/3 more with recompute) and a per-micro-batch overhead."""
    return [cfg["layers"] * (4 / 3 if cfg["recompute"] == "full" else 1.0),
            2.0 / cfg["micro_batch"]]


def throughput(cfg: dict) -> float:
    return 1000.0 / sum(cost_terms(cfg))


def measure(cfg: dict, true_memory=memory_gib) -> tuple[dict | None, str]:
    if true_memory(cfg) > LIMIT:
        return None, "oom"
    return {"throughput": throughput(cfg), "peak_mem_gib": true_memory(cfg)}, "ok"


def test_memory_model_keeps_predicted_oom_configs_out_of_the_first_proposals(space):
    with_prior = BayesianSearch(space, seed=0, cost_model=cost_terms, memory_model=memory_gib,
                                memory_limit_gib=LIMIT)
    first = with_prior.ask(4)
    assert with_prior.last_ask_info["phase"] == "prior"
    assert all(memory_gib(c) <= LIMIT for c in first)
    assert all(p >= 0.5 for p in with_prior.last_ask_info["p_feasible_of_picks"])
    # diverse: every pair differs in at least 2 knobs
    assert all(sum(a[k] != b[k] for k in space.names) >= 2
               for i, a in enumerate(first) for b in first[i + 1:])
    # the first pick is the prior's best among those predicted to fit
    fits = [c for c in space.enumerate() if memory_gib(c) <= LIMIT]
    assert throughput(first[0]) == max(throughput(c) for c in fits)
    # a memory model alone (no cost model) keeps the space-filling design inside the limit
    memory_only = BayesianSearch(space, seed=1, memory_model=memory_gib, memory_limit_gib=LIMIT)
    assert all(memory_gib(c) <= LIMIT for c in memory_only.ask(4))


def test_ooms_are_learned_from_the_first_trial(space):
    # the true peak is 1.6x what the memory model says: its best pick runs out of memory
    def true_memory(cfg):
        return 1.6 * memory_gib(cfg)

    s = BayesianSearch(space, seed=0, cost_model=cost_terms, memory_model=memory_gib,
                       memory_limit_gib=LIMIT)
    [cfg] = s.ask()
    values, status = measure(cfg, true_memory)
    assert status == "oom"
    s.tell(cfg, values, status=status)
    s.ask()
    fm = s.feasibility_model
    assert fm is not None and fm.memory_ratio > math.log(LIMIT / memory_gib(cfg))
    # one oom taught it that configurations needing as much memory do not fit
    assert fm.predict([cfg], memory_limit=LIMIT)[0] < 0.5
    ooms = 1
    for _ in range(6):
        [cfg] = s.ask()
        values, status = measure(cfg, true_memory)
        ooms += status == "oom"
        s.tell(cfg, values, status=status)
    assert ooms <= 3
    # without a memory model, the first oom (and one ok) already weigh the space-filling design
    plain = BayesianSearch(space, seed=0, n_init=6)
    plain.tell({"layers": 8, "micro_batch": 16, "recompute": "none"}, None, status="oom")
    plain.tell({"layers": 1, "micro_batch": 1, "recompute": "full"}, {"throughput": 300.0})
    plain.ask()
    assert plain.last_ask_info["phase"] == "initial" and plain.feasibility_model is not None


def replay(s: BayesianSearch, obj: cml.TableObjective, budget: int) -> int:
    """Trials until the table's best was found (budget + 1 if never)."""
    runs = obj.replay(s, budget)
    hit = runs.index[runs["regret"] <= 1e-12]
    return int(hit[0]) + 1 if len(hit) else budget + 1


def table(space: Space, noise: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for c in space.enumerate():
        values, status = measure(c)
        rows.append({**c, "status": status, "throughput":
                     values["throughput"] * math.exp(rng.normal(0, noise)) if values else None})
    return pd.DataFrame(rows)


def test_a_memory_limit_without_a_memory_model_learns_from_measured_memory(space):
    # no memory model: P(fits) comes from a GP of the measured peak memory of ok trials
    s = BayesianSearch(space, seed=0, n_init=6, memory_limit_gib=LIMIT)
    assert s.memory_model is None
    configs = [{"layers": n, "micro_batch": b, "recompute": "none"}
               for n, b in ((1, 1), (2, 4), (4, 2), (4, 8), (8, 4), (2, 16), (6, 1))]
    for cfg in configs:
        s.tell(cfg, {"throughput": throughput(cfg), "peak_mem_gib": memory_gib(cfg)})
    s.ask()
    fm = s.feasibility_model
    assert fm is not None and fm.memory is not None
    small = {"layers": 1, "micro_batch": 1, "recompute": "none"}
    large = {"layers": 8, "micro_batch": 16, "recompute": "none"}  # 64 GiB against 12
    p_small, p_large = fm.predict([small, large], memory_limit=LIMIT)
    assert p_small > 0.5 > p_large


def test_an_oom_keeps_its_neighbours_out_where_the_memory_model_is_wrong_in_structure(space):
    """Without recompute the truth holds the activations twice (the model prices them once);
    with full recompute it needs 0.8 of the model. Trials mostly with recompute measure 0.8,
    then a layout without it runs out of memory at two thirds of the limit predicted: the
    memory part alone (its ratio GP) still lets that layout's neighbour in, the classifier,
    which learns out-of-memory trials too, keeps it out."""
    import copy

    from cubicml_lab.surrogate import FeasibilityModel

    def truth(cfg):
        return memory_gib(cfg) * (2.0 if cfg["recompute"] == "none" else 0.8)

    told = [{"layers": la, "micro_batch": mb, "recompute": "full"} for la, mb in
            [(1, 1), (2, 4), (4, 8), (8, 2), (6, 16), (3, 2), (8, 8), (5, 4)]]
    told += [{"layers": 1, "micro_batch": 2, "recompute": "none"},
             {"layers": 6, "micro_batch": 4, "recompute": "none"}]  # predicted 12, needs 24
    statuses = ["ok" if truth(c) <= LIMIT else "oom" for c in told]
    assert statuses.count("oom") == 1
    peaks = [truth(c) if st == "ok" else math.nan for c, st in zip(told, statuses)]
    fm = FeasibilityModel(space, memory_model=memory_gib).fit(told, statuses, peaks,
                                                              memory_limit=LIMIT)
    neighbour = {"layers": 4, "micro_batch": 4, "recompute": "none"}  # predicted 8, needs 16
    memory_only = copy.copy(fm)
    memory_only.classifier = None
    assert fm.classifier is not None
    [p], [p_memory] = (m.predict([neighbour], memory_limit=LIMIT) for m in (fm, memory_only))
    assert p < BO_P_FEASIBLE < 0.9 < p_memory, (p, p_memory)
    # far from the failure (recompute on, measured) the classifier leaves the memory part be
    far = {"layers": 4, "micro_batch": 4, "recompute": "full"}
    assert fm.predict([far], memory_limit=LIMIT)[0] > 0.9
    # a search that floors whatever is under BO_P_FEASIBLE skips the classifier where the
    # memory part alone is under it: an upper bound there, the exact log P elsewhere
    configs = space.enumerate()
    X, prior = fm.classifier.encode(configs), fm.prior_gib(configs)
    exact = fm.predict_encoded(X, len(X), LIMIT, prior_gib=prior, log=True)
    floor = math.log(BO_P_FEASIBLE)
    bound = fm.predict_encoded(X, len(X), LIMIT, prior_gib=prior, log=True, skip_below=floor)
    skipped = bound < floor
    assert np.allclose(bound[~skipped], exact[~skipped], rtol=1e-9, atol=1e-12)
    assert np.all(bound >= exact - 1e-9 * np.abs(exact) - 1e-12)  # rows solved apart
    assert skipped.any() and np.all(exact[skipped] < floor)
    assert np.any(bound[skipped] > exact[skipped])  # the classifier was left out there


def test_the_screens_weigher_asks_exact_weights_only_where_the_floor_is_lifted():
    """Rows under BO_P_FEASIBLE get an upper bound while the floor holds (enough likely rows);
    with too few likely rows the bounds are weighed again, exactly."""
    import torch

    from cubicml_lab.search.phases import _Weigher

    exact = np.log([0.9, 0.3, 0.2, 0.8])
    floor = math.log(BO_P_FEASIBLE)
    asked = []

    def log_p(rows, skip_below):
        asked.append((list(rows), skip_below))
        out = exact[rows].copy()
        if skip_below is not None:  # a bound: above the exact value, still under the floor
            under = out < skip_below
            out[under] = (out[under] + skip_below) / 2
        return out

    held = _Weigher(log_p, 4, 2, torch.float64, cut=True)
    w = held.kept(np.arange(4))
    assert asked == [([0, 1, 2, 3], floor)]
    assert torch.allclose(w[[0, 3]], torch.tensor(exact[[0, 3]])) and bool((w[1:3] < -100).all())
    asked.clear()
    lifted = _Weigher(log_p, 4, 3, torch.float64, cut=True)
    w = lifted.kept(np.arange(4))
    assert asked == [([0, 1, 2, 3], floor), ([1, 2], None)]
    assert torch.allclose(w, torch.tensor(exact))


def test_bo_with_a_memory_model_proposes_only_likely_runs():
    # speed grows with x and so does memory (x GiB, measured within 10 %): the expected
    # improvement points past the 10 GiB limit, where the probability of running falls
    one = Space([Int("x", 1, 20)])
    s = BayesianSearch(one, seed=0, memory_model=lambda c: float(c["x"]), memory_limit_gib=10.0,
                       n_init=3)
    for i, x in enumerate((1, 3, 5, 7, 9)):
        s.tell({"x": x}, {"throughput": 100.0 * x, "peak_mem_gib": x * (1.1 if i % 2 else 0.9)})
    picks = s.ask(2)
    assert s.last_ask_info["phase"] == "bo"
    assert min(s.last_ask_info["p_feasible_of_picks"]) >= BO_P_FEASIBLE
    assert max(c["x"] for c in picks) <= 10
    # it is a bound on the bets, not on the pool: with too few likely runs left, the rest stay
    s.ask(len(one.enumerate()) - 5)
    assert min(s.last_ask_info["p_feasible_of_picks"]) < BO_P_FEASIBLE


@pytest.mark.slow  # about 50 GP fits
def test_history_of_the_same_table_speeds_convergence(space):
    target = table(space, 0.01, 1)
    obj = cml.TableObjective(target, "throughput", status_col="status", space=space)
    history = table(space, 0.01, 2).sample(30, random_state=0)
    plain, helped = [], []
    for seed in range(2):
        obj.reset()
        plain.append(replay(BayesianSearch(space, seed=seed, candidates=obj.configs()), obj, 15))
        obj.reset()
        s = BayesianSearch(space, seed=seed, candidates=obj.configs(), history=[history])
        helped.append(replay(s, obj, 15))
        assert s.history_model.active
    assert sum(helped) < sum(plain), (helped, plain)


def test_unrelated_history_is_dropped_once_it_does_not_rank_the_trials(space):
    history = table(space, 0.0, 3)
    ok = history["status"] == "ok"
    history.loc[ok, "throughput"] = 1e4 / history.loc[ok, "throughput"]  # upside down
    s = BayesianSearch(space, seed=0, history=[history], memory_model=memory_gib,
                       memory_limit_gib=LIMIT)
    for _ in range(6):
        [cfg] = s.ask()
        values, status = measure(cfg)
        s.tell(cfg, values, status=status)
    s.ask()
    assert not s.history_model.active and s.history_model.tau < 0.2


def test_history_from_a_campaign_of_a_store(space, tmp_path):
    store = cml.TrialStore(tmp_path / "lab.sqlite")
    store.create_campaign("old", workload="gpt")
    for cfg in space.enumerate()[::3]:
        values, status = measure(cfg)
        store.record_trial("old", cfg, status=status, metrics=values or {}, workload="gpt")
    s = BayesianSearch(space, seed=0, history=["old"], store=store)
    assert s.history_model.n_used > 5 and s.history_names == ["old"]
    [cfg] = s.ask()
    assert s.last_ask_info["phase"] == "prior"
    assert searcher_to_dict(s)["history"] == ["old"]
    back = searcher_from_dict(space, {**searcher_to_dict(s)})
    assert back.history_names == ["old"] and back.history_model.n_used == s.history_model.n_used


@pytest.mark.parametrize("kwargs, field", [
    ({"memory_model": memory_gib}, "memory_limit_gib"),
    ({"memory_model": 80.0, "memory_limit_gib": 80}, "memory_model"),
    ({"cost_model": "physics"}, "cost_model"),
    ({"history": [42]}, "history[0]"),
    ({"history": "gpt-13b"}, "history"),
    ({"history": ["gpt-13b"], "store": "/nonexistent/dir/none.sqlite"}, "gpt-13b"),
])
def test_bad_arguments_raise_errors_naming_the_field_and_the_fix(space, kwargs, field):
    with pytest.raises(SearchError) as err:
        BayesianSearch(space, **kwargs)
    assert field in err.value.message and err.value.hint


def test_history_names_need_a_store(space, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/lab.sqlite here
    with pytest.raises(SearchError, match="no store was given") as err:
        BayesianSearch(space, history=["gpt-13b"])
    assert "store=" in err.value.hint
    store = cml.TrialStore(tmp_path / "lab.sqlite")
    with pytest.raises(SearchError, match="is not a campaign"):
        BayesianSearch(space, history=["gpt-13b"], store=store)


def test_functions_cannot_be_written_to_a_campaign_file(space):
    s = BayesianSearch(space, memory_model=memory_gib, memory_limit_gib=LIMIT)
    with pytest.raises(ConfigError, match="memory_model"):
        searcher_to_dict(s)
    plain = BayesianSearch(space, memory_limit_gib=LIMIT, seed=3)
    assert searcher_to_dict(searcher_from_dict(space, searcher_to_dict(plain))) == \
        searcher_to_dict(plain)


def test_observed_noise_and_contended_trials_enter_the_gp(space):
    s = BayesianSearch(space, seed=0, n_init=3)
    cfgs = space.enumerate()[:5]
    s.tell(cfgs[0], {"throughput": 100.0, "throughput_rel_ci": 0.02})
    s.tell(cfgs[1], {"throughput": 120.0})  # no CI: the median of the others
    s.tell(cfgs[2], {"throughput": 90.0, "throughput_rel_ci": 0.04, "contended": True})
    configs, values, rel, _ = s._gp_data()
    assert len(configs) == 3 and rel.tolist() == [0.02, 0.03, 0.1]
    s.tell(cfgs[3], {"throughput": 95.0, "throughput_rel_ci": math.nan})  # one window: unknown
    s.tell(cfgs[4], {"throughput": 97.0, "throughput_rel_ci": 0.05})
    assert s._gp_data()[2].tolist() == [0.02, 0.04, 0.1, 0.05, 0.05]  # the largest known
    s.ask()
    assert s.last_ask_info["phase"] == "bo" and s.predictor._fixed_noise
    # contended without any spread told: left out of the objective GP while 2 others remain
    t = BayesianSearch(space, seed=0, n_init=3)
    t.tell(cfgs[0], {"throughput": 100.0})
    t.tell(cfgs[1], {"throughput": 120.0})
    t.tell(cfgs[2], {"throughput": 10.0, "contended": 1.0})
    configs, values, rel, _ = t._gp_data()
    assert rel is None and values.tolist() == [100.0, 120.0]


def test_recommend_weighs_a_noisy_winner_by_its_noise_and_neighbours(space):
    """A smooth surface measured with small noise, but for two configurations: the true best
    (layers 1, micro-batch 16) read 10% low with a 10% CI, and its neighbour (micro-batch 8,
    7% slower) read 3% high. best() takes the neighbour's lucky figure; recommend() takes the true best,
    estimated near its true value; a second objective falls back to best()."""
    def truth(c):
        return 1000.0 * c["micro_batch"] ** 0.1 / c["layers"] ** 0.5 * (
            0.8 if c["recompute"] == "full" else 1.0)

    rng = np.random.default_rng(1)
    s = BayesianSearch(space, seed=0, n_init=3)
    top = {"layers": 1, "micro_batch": 16, "recompute": "none"}
    near = {"layers": 1, "micro_batch": 8, "recompute": "none"}
    others = [c for c in space.enumerate() if c not in (top, near)]
    for c in [others[i] for i in rng.choice(len(others), 14, replace=False)]:
        s.tell(c, {"throughput": truth(c) * float(np.exp(rng.normal(0, 0.01))),
                   "throughput_rel_ci": 0.01})
    s.tell(top, {"throughput": truth(top) * 0.90, "throughput_rel_ci": 0.10})
    s.tell(near, {"throughput": truth(near) * 1.03, "throughput_rel_ci": 0.01})
    assert s.best()[0] == near
    cfg, est = s.recommend()
    assert cfg == top and est == pytest.approx(truth(top), rel=0.06)
    two = BayesianSearch(space, seed=0, second_objective="peak_mem_gib")
    two.tell(top, {"throughput": 1.0, "peak_mem_gib": 1.0})
    two.tell(near, {"throughput": 2.0, "peak_mem_gib": 1.0})
    assert two.recommend() == two.best()


def test_recommend_passes_over_a_configuration_measured_only_under_contention(space):
    s = BayesianSearch(space, seed=0, n_init=3)
    cfgs = space.enumerate()[:6]
    for i, c in enumerate(cfgs):
        s.tell(c, {"throughput": 150.0 if i == 5 else 100.0 + i, "throughput_rel_ci": 0.01,
                   "contended": float(i == 5)})
    s.tell(cfgs[4], {"throughput": 104.0, "throughput_rel_ci": 0.01})
    assert s.recommend()[0] != cfgs[5]


def _drifting_trials(share: float, n: int = 14, seed: int = 0) -> list[tuple[dict, dict]]:
    """Trials of a smooth objective on a machine whose speed wanders: the drift reference saw a
    slowdown ``exp(-c)`` in each, the trial itself ``exp(-share * c)``; the stored figure takes
    the reference's whole slowdown out (exponent 1), as the timing layer stores it."""
    rng = np.random.default_rng(seed)
    sp = Space([Int("layers", 1, 8), PowerOfTwo("micro_batch", 1, 16)])
    configs = [dict(c) for c in rng.permutation(sp.enumerate())[:n]]
    out = []
    for cfg in configs:
        true = 1e4 * cfg["micro_batch"] ** 0.4 / (1 + 0.1 * cfg["layers"])
        c = float(rng.uniform(0.0, 0.3))
        raw = true * math.exp(-share * c) * math.exp(rng.normal(0, 0.005))
        out.append((cfg, {"throughput": raw * math.exp(c), "throughput_raw": raw,
                          "throughput_rel_ci": 0.01, "true": true}))
    return out


@pytest.mark.parametrize("share", [0.4, 1.0])
def test_the_search_learns_how_much_drift_correction_to_keep(share):
    """A machine whose trials share 0.4 of the reference's slowdown: the stored figures are
    over-corrected, and the search learns an exponent near 0.4 (the prior pulls it towards 1);
    where the trials share all of it, it stays near 1. The figures at the learned exponent are
    closer to the truth than the stored ones where those were over-corrected."""
    from cubicml_lab.search.bayesian import drift_covariate

    trials = _drifting_trials(share)
    sp = Space([Int("layers", 1, 8), PowerOfTwo("micro_batch", 1, 16)])
    s = BayesianSearch(sp, seed=0, n_init=2)
    for cfg, m in trials:
        s.tell(cfg, m)
    s.ask()
    assert s.last_ask_info["phase"] == "bo"
    assert s.drift_exponent == pytest.approx(share, abs=0.2)
    c = drift_covariate([m for _, m in trials])
    stored = np.log([m["throughput"] / m["true"] for _, m in trials])
    learned = stored + (s.drift_exponent - 1.0) * c
    if share < 1:  # the over-correction mostly gone
        assert np.abs(learned).mean() < 0.5 * np.abs(stored).mean()
    else:  # already right: no worse than the measurements' own noise (0.5 %)
        assert np.abs(learned).mean() < np.abs(stored).mean() + 0.003
    off = BayesianSearch(sp, seed=0, n_init=2, learn_drift=False)
    for cfg, m in trials:
        off.tell(cfg, m)
    off.ask()
    assert off.drift_exponent is None


def test_no_raw_figure_means_no_drift_to_learn(space):
    from cubicml_lab.search.bayesian import drift_covariate

    assert drift_covariate([{"throughput": 5.0}, {"throughput": 6.0, "throughput_raw": 6.0}]) \
        is None
    s = BayesianSearch(space, seed=0, n_init=2)
    for cfg, m in _drifting_trials(0.5)[:6]:
        cfg = {**cfg, "recompute": "none", "layers": cfg["layers"]}
        s.tell(cfg, {"throughput": m["throughput"]})  # a GPU's trials: no CPU reference
    s.ask()
    assert s.last_ask_info["phase"] == "bo" and s.drift_exponent is None


def test_covariate_slope_checks_its_input():
    from cubicml_lab.errors import PredictorError
    from cubicml_lab.surrogate import GPPredictor

    sp = Space([Int("layers", 1, 8)])
    pred = GPPredictor(sp)
    with pytest.raises(PredictorError, match="before fit"):
        pred.covariate_slope([0.1, 0.2], 1.0, (1.0, 0.5))
    pred.fit([{"layers": i} for i in (1, 3, 5, 7)], [10.0, 12.0, 13.0, 13.5])
    with pytest.raises(PredictorError, match="4 configs but 3"):
        pred.covariate_slope([0.1, 0.2, 0.3], 1.0, (1.0, 0.5))
    with pytest.raises(PredictorError, match="NaN or inf"):
        pred.covariate_slope([0.1, 0.2, math.nan, 0.0], 1.0, (1.0, 0.5))
    # a covariate of zeros carries no information: the prior's mean comes back
    assert pred.covariate_slope([0.0] * 4, 1.0, (0.7, 0.5)) == pytest.approx(0.7)


def test_the_screen_keeps_the_top_of_log_ei_times_p_running_over_the_whole_pool(monkeypatch):
    """A pool larger than the screen: the rows handed to the exact acquisition are the top of
    analytic log EI plus log P(runs) over every untried row, as computed eagerly, while the
    memory model's probability was computed only for the rows the screen scored."""
    import torch

    from cubicml_lab.search import acquisition as acq
    from cubicml_lab.surrogate import fitted

    monkeypatch.setattr(acq, "SCREEN_SIZE", 24)
    monkeypatch.setattr(fitted, "SCREEN_BLOCK", 16)
    big = Space([Int("layers", 1, 40), PowerOfTwo("micro_batch", 1, 64),
                 Choice("recompute", ["none", "full"])])
    s = BayesianSearch(big, seed=0, memory_model=memory_gib, memory_limit_gib=4 * LIMIT,
                       n_init=4)
    rng = np.random.default_rng(0)
    for cfg in big.sample(40, seed=1):
        values, status = measure(cfg, lambda c: memory_gib(c) * rng.uniform(0.9, 1.1) / 4)
        s.tell(cfg, values, status=status)
    seen: dict = {}
    real_screen, real_greedy = acq.screen, acq.greedy_picks

    def screen(predictor, X_pool, best_mean, keep, weight=None):
        seen.update(predictor=predictor, X=X_pool, best=best_mean, keep=keep, weight=weight)
        return real_screen(predictor, X_pool, best_mean, keep, weight)

    def greedy(make, X_pool, X_pend, n, chunk, log_w):
        seen.update(kept=X_pool.clone(), unweighed=int(np.isnan(seen["weight"].__self__._p).sum()))
        return real_greedy(make, X_pool, X_pend, n, chunk, log_w)

    monkeypatch.setattr(acq, "screen", screen)
    monkeypatch.setattr(acq, "greedy_picks", greedy)
    s.ask()
    assert s.last_ask_info["phase"] == "bo" and seen["keep"] == 24
    X, weigher = seen["X"], seen["weight"].__self__
    assert len(X) > 400 and seen["unweighed"] > len(X) / 2  # most rows never asked the model
    mu, var = (torch.as_tensor(a) for a in seen["predictor"].posterior_encoded(X))
    sigma = var.clamp_min(1e-18).sqrt()
    log_ei = acq.log_ei_standard((mu - seen["best"]) / sigma) + sigma.log()
    log_w = acq.feasibility_weights(weigher._raw(np.arange(len(X))), 1, X.dtype, True)
    want = torch.topk(log_ei + log_w, 24).indices.sort().values
    assert torch.equal(seen["kept"], X[want])
