"""Tests of cubicml_lab.search: ask/tell bookkeeping, RandomSearch, BayesianSearch (real fits)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from cubicml_lab.errors import SearchError
from cubicml_lab.search import BayesianSearch, RandomSearch, Searcher
from cubicml_lab.space import Bool, Float, Int, PowerOfTwo, Space

SEARCHERS = [RandomSearch, BayesianSearch]


def make_space() -> Space:
    """10 * 5 * 2 = 100 configurations."""
    return Space([Int("layers", 1, 10), PowerOfTwo("micro_batch", 1, 16), Bool("compile")])


def throughput(cfg: dict) -> float:
    """A smooth, made-up surface in samples/s with a single best configuration."""
    mb = math.log2(cfg["micro_batch"])
    return 1e4 * math.exp(-((cfg["layers"] - 6.6) / 3.5) ** 2 - ((mb - 2.7) / 2.0) ** 2) \
        * (1.25 if cfg["compile"] else 1.0)


@pytest.fixture(scope="module")
def space() -> Space:
    return make_space()


def run(searcher: Searcher, steps: int, fn=throughput, batch: int = 1) -> None:
    for _ in range(steps):
        for cfg in searcher.ask(batch):
            searcher.tell(cfg, {searcher.objective: fn(cfg)})


def keys(space: Space, cfgs: list[dict]) -> set[str]:
    return {space.key(c) for c in cfgs}


# -- the ask/tell contract, for every searcher --------------------------------------------------
@pytest.mark.parametrize("cls", SEARCHERS)
def test_ask_returns_distinct_valid_configs(cls, space):
    s = cls(space, seed=1)
    batch = s.ask(7)
    assert len(batch) == 7 and len(keys(space, batch)) == 7
    assert all(space.contains(c) for c in batch)
    assert len(s.pending) == 7


@pytest.mark.parametrize("cls", SEARCHERS)
def test_pending_configs_are_not_proposed_twice(cls, space):
    s = cls(space, seed=2)
    first, second = s.ask(5), s.ask(5)
    assert not keys(space, first) & keys(space, second)
    s.tell(first[0], {"throughput": throughput(first[0])})
    assert len(s.pending) == 9 and s.n_told == 1


@pytest.mark.parametrize("cls", SEARCHERS)
def test_told_failures_are_never_proposed_again(cls, space):
    s = cls(space, seed=3)
    everything = space.enumerate()
    left = everything[10], everything[55], everything[99]
    for cfg in everything:
        if cfg not in left:
            s.tell(cfg, None, status="oom" if cfg["layers"] % 2 else "failed")
    proposed = s.ask(10)
    assert keys(space, proposed) == keys(space, list(left))  # fewer than asked: the pool ran out
    with pytest.raises(SearchError, match="all 100 configurations"):
        s.ask()


def test_bayesian_search_never_reproposes_failures_in_the_bo_phase(space):
    s = BayesianSearch(space, seed=4, n_init=4)
    failed: set[str] = set()
    for _ in range(10):
        for cfg in s.ask(2):
            assert space.key(cfg) not in failed
            if cfg["micro_batch"] == 16:
                s.tell(cfg, None, status="oom")
                failed.add(space.key(cfg))
            else:
                s.tell(cfg, {"throughput": throughput(cfg)})
    assert s.last_ask_info["phase"] == "bo"
    assert len(keys(space, [h["config"] for h in s.history])) == 20


@pytest.mark.parametrize("cls", SEARCHERS)
def test_enqueued_config_comes_first(cls, space):
    s = cls(space, seed=5)
    default = {"layers": 3, "micro_batch": 2, "compile": False}
    s.enqueue(default)
    s.enqueue(default)  # queued once
    batch = s.ask(3)
    assert batch[0] == default and len(keys(space, batch)) == 3
    s.tell(default, {"throughput": 5.0})
    s.enqueue(default)  # already told: not queued again
    assert space.key(default) not in keys(space, s.ask(4))
    with pytest.raises(SearchError, match="'micro_batch': 3.*not in the space"):
        s.enqueue({"layers": 3, "micro_batch": 3, "compile": False})


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_best_respects_direction(space, direction):
    s = RandomSearch(space, objective="step_time_s", direction=direction)
    with pytest.raises(SearchError, match="no ok trial"):
        s.best()
    cfgs = space.enumerate()[:4]
    for cfg, v in zip(cfgs, [0.5, 0.2, 0.9, 0.4]):
        s.tell(cfg, {"step_time_s": v, "other": 1.0})
    s.tell(cfgs[3], None, status="timeout")
    config, value = s.best()
    expected = 2 if direction == "maximize" else 1
    assert (config, value) == (cfgs[expected], [0.5, 0.2, 0.9, 0.4][expected])


def test_history_keeps_every_observation(space):
    s = RandomSearch(space)
    cfg = space.enumerate()[7]
    s.tell(cfg, {"throughput": 10.0})
    s.tell(cfg, {"throughput": 12.0})
    s.tell(space.enumerate()[8], None, status="oom")
    assert [(h["status"], h["value"]) for h in s.history] == [("ok", 10.0), ("ok", 12.0),
                                                             ("oom", None)]
    assert s.n_told == 3 and s.best()[1] == 12.0
    assert space.key(cfg) not in keys(space, s.ask(98))


def test_random_search_is_deterministic_given_seed_and_history(space):
    a, b, c = RandomSearch(space, seed=7), RandomSearch(space, seed=7), RandomSearch(space, seed=8)
    assert a.ask(5) == b.ask(5) != c.ask(5)


def test_explicit_candidates_bound_the_pool(space):
    pool = space.enumerate()[::10]
    s = BayesianSearch(space, candidates=pool + pool[:2], seed=0, n_init=3)
    seen = []
    for _ in range(5):
        batch = s.ask(2)
        seen += batch
        for cfg in batch:
            s.tell(cfg, {"throughput": throughput(cfg)})
    assert keys(space, seen) == keys(space, pool)
    with pytest.raises(SearchError, match="all 10 configurations"):
        s.ask()


def test_a_space_too_large_to_enumerate_uses_a_sampled_pool():
    space = Space([Float("lr", 1e-4, 1e-1, log=True), PowerOfTwo("micro_batch", 1, 64)])
    s = RandomSearch(space, seed=0, num_candidates=50)
    batch = s.ask(5)
    assert len(keys(space, batch)) == 5 and all(space.contains(c) for c in batch)


# -- Bayesian optimisation ------------------------------------------------------------------------
def trials_to_top(searcher: Searcher, top: dict, budget: int) -> int:
    for i in range(1, budget + 1):
        [cfg] = searcher.ask()
        searcher.tell(cfg, {"throughput": throughput(cfg)})
        if cfg == top:
            return i
    return budget + 1


@pytest.mark.slow
def test_bayesian_search_finds_the_optimum_faster_than_random(space):
    top = max(space.enumerate(), key=throughput)
    bo = [trials_to_top(BayesianSearch(space, seed=s), top, budget=35) for s in range(5)]
    rnd = [trials_to_top(RandomSearch(space, seed=s), top, budget=100) for s in range(5)]
    assert np.median(bo) < np.median(rnd)
    assert np.median(bo) <= 25  # random needs about 50 on average


@pytest.mark.slow
def test_bayesian_search_minimises(space):
    def step_time_s(cfg: dict) -> float:
        return 64.0 / throughput(cfg)

    s = BayesianSearch(space, objective="step_time_s", direction="minimize", seed=1)
    run(s, 20, fn=step_time_s)
    best = min(step_time_s(c) for c in space.enumerate())
    assert s.best()[1] == pytest.approx(best)


def test_the_initial_design_spreads_out_then_bo_takes_over(space):
    s = BayesianSearch(space, seed=0, n_init=4)
    first = s.ask(4)
    assert s.last_ask_info["phase"] == "initial"
    lo, hi = space.encoded_bounds()
    X = (space.encode_array(first) - lo) / (hi - lo)
    d = np.sqrt(((X[:, None] - X[None]) ** 2).sum(-1))[np.triu_indices(4, 1)]
    assert d.min() > 0.5  # maximin: no two initial points are near each other
    for cfg in first:
        s.tell(cfg, {"throughput": throughput(cfg)})
    batch = s.ask(3)
    info = s.last_ask_info
    assert info["phase"] == "bo" and info["n_ok"] == 4 and info["n_pool"] == 96
    assert len(info["acquisition"]) == 3 and info["max_acquisition"] == info["acquisition"][0]
    assert info["fit_s"] > 0 and info["ask_s"] >= info["fit_s"]
    assert len(keys(space, batch)) == 3 and s.predictor is not None


def test_identical_values_fall_back_to_space_filling(space):
    s = BayesianSearch(space, seed=0, n_init=3)
    for cfg in s.ask(3):
        s.tell(cfg, {"throughput": 100.0})
    batch = s.ask(2)
    assert s.last_ask_info["phase"] == "fallback"
    assert "identical" in s.last_ask_info["reason"]
    assert len(keys(space, batch)) == 2


def replay(searcher: Searcher, history: list[dict]) -> Searcher:
    for h in history:
        values = None if h["value"] is None else {searcher.objective: h["value"]}
        searcher.tell(h["config"], values, status=h["status"])
    return searcher


@pytest.mark.parametrize("cls", SEARCHERS)
def test_a_resumed_search_proposes_what_the_original_would(cls, space):
    original = cls(space, seed=11, n_init=4) if cls is BayesianSearch else cls(space, seed=11)
    for _ in range(4):
        batch = original.ask(3)
        original.tell(batch[0], None, status="oom")
        for cfg in batch[1:]:
            original.tell(cfg, {"throughput": throughput(cfg)})
    history = original.history
    expected = original.ask(3)
    info = dict(getattr(original, "last_ask_info", {}))
    fresh = cls(space, seed=11, n_init=4) if cls is BayesianSearch else cls(space, seed=11)
    resumed = replay(fresh, history)
    assert resumed.ask(3) == expected
    if cls is BayesianSearch:  # the same seeded MC samples give the same acquisition values
        assert info["phase"] == "bo"
        assert resumed.last_ask_info["acquisition"] == info["acquisition"]


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", SEARCHERS)
def test_bad_input_is_refused_with_a_reason(cls, space):
    cfg = space.enumerate()[0]
    with pytest.raises(SearchError, match="direction = 'max' is not one of"):
        cls(space, direction="max")
    with pytest.raises(SearchError, match=r"candidates\[1\].*'layers': 11"):
        cls(space, candidates=[cfg, {**cfg, "layers": 11}])
    s = cls(space)
    with pytest.raises(SearchError, match="status = 'crashed'.*'ok', 'oom', 'failed', 'timeout'"):
        s.tell(cfg, None, status="crashed")
    with pytest.raises(SearchError, match=r"needs values\['throughput'\]; got \['tokens_per_s'\]"):
        s.tell(cfg, {"tokens_per_s": 3.0})
    with pytest.raises(SearchError, match=r"needs values\['throughput'\]"):
        s.tell(cfg, None)
    with pytest.raises(SearchError, match="= nan is not a finite number"):
        s.tell(cfg, {"throughput": float("nan")})
    with pytest.raises(SearchError, match=r"ask\(n\) = 0 is outside"):
        s.ask(0)
    with pytest.raises(SearchError, match="not in the space"):
        s.tell({**cfg, "micro_batch": 5}, {"throughput": 1.0})
    assert s.n_told == 0  # nothing half-recorded


def test_log_model_needs_positive_values(space):
    cfg = space.enumerate()[0]
    with pytest.raises(SearchError, match="-1.0 is not positive.*log\\(throughput\\)"):
        BayesianSearch(space).tell(cfg, {"throughput": -1.0})
    BayesianSearch(space, log_objective=False).tell(cfg, {"throughput": -1.0})
    RandomSearch(space).tell(cfg, {"throughput": -1.0})


def test_importing_search_does_not_import_torch():
    code = ("import sys, cubicml_lab.search, cubicml_lab.surrogate; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("cls", SEARCHERS)
def test_a_constrained_space_is_searched_to_exhaustion(cls, tiny_space):
    s = cls(tiny_space, seed=0)
    seen = []
    for _ in range(5):
        batch = s.ask(4)
        seen += batch
        for cfg in batch:
            s.tell(cfg, {"throughput": 100.0 * cfg["tp"] + 10.0 * cfg["pp"]
                         + (5.0 if cfg["recompute"] == "none" else 1.0)})
    assert keys(tiny_space, seen) == keys(tiny_space, tiny_space.enumerate())
    assert all(c["tp"] * c["pp"] <= 8 for c in seen)
    assert s.best()[1] == 815.0
    with pytest.raises(SearchError, match="all 20 configurations"):
        s.ask()


# -- #5: failures teach a feasibility model, stopping, repeats, neighbours, two objectives -------
def memory_gib(cfg: dict) -> float:
    """Made-up peak memory: grows with layers and micro-batch."""
    return 0.5 * cfg["layers"] * cfg["micro_batch"]


def run_with_oom(searcher: Searcher, steps: int, limit: float = 12.0) -> int:
    """Run ``steps`` single asks where configs above ``limit`` GiB fail with oom; count ooms."""
    ooms = 0
    for _ in range(steps):
        [cfg] = searcher.ask()
        if memory_gib(cfg) > limit:
            ooms += 1
            searcher.tell(cfg, None, status="oom")
        else:
            searcher.tell(cfg, {"throughput": throughput(cfg), "peak_mem_gib": memory_gib(cfg)})
    return ooms


@pytest.mark.slow  # 6 searches of 14 asks, the last 10 of each a real GP fit
def test_told_failures_teach_the_search_to_avoid_the_oom_region(space):
    # the unconstrained optimum (layers 7, micro_batch 8: 28 GiB) does not fit in 12 GiB; a search
    # that ignores failures keeps proposing its neighbours
    # (when written: 17 ooms against 23 after 14 asks, 27 against 39 after 20)
    weighted = [run_with_oom(BayesianSearch(space, seed=s, n_init=4), 14) for s in range(3)]
    blind = [run_with_oom(BayesianSearch(space, seed=s, n_init=4, feasibility=False), 14)
             for s in range(3)]
    assert sum(weighted) < sum(blind), (weighted, blind)


def test_feasibility_weights_enter_the_acquisition(space):
    s = BayesianSearch(space, seed=0, n_init=4)
    run_with_oom(s, 7)
    assert s.feasibility_model is not None
    info = s.last_ask_info
    assert info["phase"] == "bo" and 0 <= info["p_feasible_of_picks"][0] <= 1


def test_should_stop_fires_on_a_flat_problem_and_says_why(space):
    s = BayesianSearch(space, seed=3, n_init=4, stop_patience=2)
    flat = lambda cfg: 1000.0 * (1 + 1e-5 * cfg["layers"])  # noqa: E731
    steps = 0
    while not s.should_stop() and steps < 12:
        run(s, 1, fn=flat)
        steps += 1
    assert s.should_stop(), s.improvement_trace
    assert steps <= 8 and "below 0.5% for 2 asks in a row" in s.stop_reason
    assert all(r < 0.005 for r in s.improvement_trace[-2:])


def test_should_stop_does_not_fire_while_improvement_is_expected(space):
    s = BayesianSearch(space, seed=0, n_init=4)
    run(s, 6)
    assert s.improvement_trace and not s.should_stop() and s.stop_reason is None


def test_repeats_only_when_asked_for(space):
    s = RandomSearch(space, seed=0)
    [cfg] = s.ask()
    s.tell(cfg, {"throughput": 5.0})
    s.enqueue(cfg)  # already told: ignored
    assert s.ask() != [cfg]
    s.enqueue(cfg, repeat=True)
    assert s.ask() == [cfg]
    s.tell(cfg, {"throughput": 6.0})
    assert [h["value"] for h in s.history if h["config"] == cfg] == [5.0, 6.0]


def test_a_sampled_pool_holds_the_neighbours_of_the_best(monkeypatch, space):
    import cubicml_lab.search.base as base

    monkeypatch.setattr(base, "ENUMERATE_POOL_LIMIT", 10)  # force the sampled pool
    s = RandomSearch(space, seed=0, num_candidates=5)
    best = {"layers": 5, "micro_batch": 4, "compile": True}
    s.tell(best, {"throughput": 9.0})
    pool = {k for k, _ in s._pool()}
    near = [{**best, "layers": 4}, {**best, "layers": 6}, {**best, "micro_batch": 2},
            {**best, "micro_batch": 8}, {**best, "compile": False}]
    assert {space.key(c) for c in near} <= pool
    assert {space.key(c) for c in s.neighbours(best)} == {space.key(c) for c in near}


def test_two_objectives_search_and_pareto_front(space, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    s = BayesianSearch(space, seed=0, n_init=4, second_objective="peak_mem_gib")
    for _ in range(6):
        for cfg in s.ask(2):
            s.tell(cfg, {"throughput": throughput(cfg), "peak_mem_gib": memory_gib(cfg)})
    assert s.last_ask_info["phase"] == "bo" and s.second_predictor is not None
    assert s.last_ask_info["relative_improvement"] > 0
    front = s.pareto()
    assert front and all(set(p) == {"config", "throughput", "peak_mem_gib"} for p in front)
    told = [(h["value"], h["values"]["peak_mem_gib"]) for h in s.history]
    for p in front:  # nothing told is both faster and smaller
        assert not any(t > p["throughput"] and m < p["peak_mem_gib"] for t, m in told)
    assert [p["throughput"] for p in front] == sorted((p["throughput"] for p in front),
                                                      reverse=True)
    with pytest.raises(SearchError, match="pareto\\(\\) needs two objectives"):
        BayesianSearch(space).pareto()
    assert not (tmp_path / "ext").exists(), "BoTorch's fused C++ kernel was compiled"


def test_initial_design_is_at_most_a_tenth_of_an_explicit_pool(space):
    from cubicml_lab.search.bayesian import default_n_init

    assert default_n_init(space) == 4  # d = 3 encoded columns: max(4, d + 1)
    assert default_n_init(space, pool_size=40) == 4 and default_n_init(space, 10) == 3
    pool = space.enumerate()[:30]
    assert BayesianSearch(space, candidates=pool).n_init == 3
    assert BayesianSearch(space, candidates=pool, n_init=6).n_init == 6


def test_log_ei_standard_matches_botorch_and_stays_finite_in_the_tail():
    import torch
    from botorch.acquisition.analytic import _log_ei_helper  # the reference, private to BoTorch

    from cubicml_lab.search.bayesian import log_ei_standard

    z = torch.cat([torch.linspace(-60, 60, 4001, dtype=torch.float64),
                   torch.tensor([-1.0, -0.999, -9999.0, -1e4, -1.0001e4, -1e7, -1e12],
                                dtype=torch.float64)])
    ours, theirs = log_ei_standard(z), _log_ei_helper(z)
    assert torch.isfinite(ours).all()
    assert ((ours - theirs).abs() / theirs.abs().clamp_min(1.0)).max() < 1e-9
    assert (ours[1:4001] >= ours[:4000]).all()  # expected improvement grows with z


def test_recommend_from_another_thread_leaves_the_proposals_as_they_were(space):
    """A dashboard's poll thread calls recommend() while the run loop asks: the asks propose
    what a searcher nobody polled proposes (both fit on the searcher's caches, under a lock)."""
    import threading

    quiet, polled = (BayesianSearch(space, seed=5, n_init=4) for _ in range(2))
    run(quiet, 4)
    run(polled, 4)
    done = threading.Event()
    answers = []

    def poll() -> None:  # every 2 ms (a dashboard polls far less often): a loop that never
        while not done.wait(0.002):  # waits holds the GIL from the asks' fits, ~10x slower
            answers.append(polled.recommend())

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        for _ in range(4):
            a, b = quiet.ask(), polled.ask()
            assert a == b
            for searcher, cfg in ((quiet, a[0]), (polled, b[0])):
                searcher.tell(cfg, {"throughput": throughput(cfg)})
    finally:
        done.set()
        thread.join()
    assert answers and polled.recommend() == quiet.recommend()


def test_should_stop_holds_off_while_every_figure_is_flagged(space):
    """The flat problem that stops within 8 asks above, every figure told contended: the rule
    holds off (and says why) for as long as no clean figure exists, then fires once one does."""
    s = BayesianSearch(space, seed=3, n_init=4, stop_patience=2)
    flat = lambda cfg: 1000.0 * (1 + 1e-5 * cfg["layers"])  # noqa: E731
    for _ in range(10):
        for cfg in s.ask(1):
            s.tell(cfg, {"throughput": flat(cfg), "contended": 1.0})
        assert not s.should_stop()
    assert all(r < 0.005 for r in s.improvement_trace[-2:])  # it would have fired
    assert s.stop_reason.startswith("held off: all 10 ok figures are flagged")
    cfg = s.ask(1)[0]
    s.tell(cfg, {"throughput": flat(cfg)})
    assert s.should_stop() and "below 0.5%" in s.stop_reason
