"""Tests of cubicml_lab.search.guided: PredictorGuidedSearch, the CubicML-style top-k searcher.

Most tests plug in :class:`Oracle`, a perfect torch-free predictor, so they check the search logic
(phases, top-k, evolution, bookkeeping) in milliseconds; the tests that fit the default MLP
ensemble say so in their name or docstring.
"""

from __future__ import annotations

import doctest
import math
import subprocess
import sys

import numpy as np
import pytest

from cubicml_lab.errors import PredictorError, SearchError
from cubicml_lab.search import PredictorGuidedSearch, RandomSearch, Searcher
from cubicml_lab.search import guided
from cubicml_lab.space import Bool, Choice, Float, Int, Ordinal, PowerOfTwo, Space

SPEEDUP = {"fp32": 1.0, "bf16": 1.6, "fp16": 1.45}


def make_space() -> Space:
    """9 * 7 * 3 = 189 configurations."""
    return Space([PowerOfTwo("micro_batch", 1, 256),
                  Ordinal("d_model", [128, 192, 256, 384, 512, 768, 1024]),
                  Choice("precision", ["fp32", "bf16", "fp16"])])


def throughput(cfg: dict) -> float:
    """A smooth, made-up surface in samples/s; one configuration is within 5% of the best."""
    mb, d = math.log2(cfg["micro_batch"]), math.log2(cfg["d_model"])
    return 1e4 * math.exp(-((mb - 5.3) / 2.2) ** 2 - ((d - 8.6) / 1.2) ** 2) \
        * SPEEDUP[cfg["precision"]]


def step_time_s(cfg: dict) -> float:
    return 64.0 / throughput(cfg)


class Oracle:
    """A perfect predictor of ``fn`` (no torch): isolates the search logic from the fit."""

    def __init__(self, fn=throughput) -> None:
        self.fn = fn
        self.n_train = 0

    def fit(self, configs, values) -> Oracle:
        self.n_train = len(configs)
        return self

    def predict(self, configs) -> tuple[np.ndarray, np.ndarray]:
        mean = np.array([self.fn(c) for c in configs])
        return mean, np.zeros_like(mean)


@pytest.fixture(scope="module")
def space() -> Space:
    return make_space()


@pytest.fixture
def one_torch_thread():
    """Fit the tiny MLPs on one thread: intra-op threads gain nothing at this size and, on a
    2-core machine that is busy with something else, make each fit about 10 times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def keys(space: Space, cfgs: list[dict]) -> set[str]:
    return {space.key(c) for c in cfgs}


def run(searcher: Searcher, asks: int, batch: int, fn=throughput) -> list[dict]:
    """Ask and tell ``asks`` batches; return every proposal in order."""
    seen = []
    for _ in range(asks):
        for cfg in searcher.ask(batch):
            seen.append(cfg)
            searcher.tell(cfg, {searcher.objective: fn(cfg)})
    return seen


def untried_top(space: Space, s: Searcher, n: int, fn=throughput, reverse=True) -> list[dict]:
    told = keys(space, [h["config"] for h in s.history])
    rest = [c for c in space.enumerate() if space.key(c) not in told]
    return sorted(rest, key=fn, reverse=reverse)[:n]


# -- phases and the top-k ---------------------------------------------------------------------
def test_batches_are_distinct_valid_configs_in_both_phases(space):
    s = PredictorGuidedSearch(space, seed=1, n_init=4, predictor_factory=Oracle)
    first = s.ask(6)
    assert s.last_ask_info["phase"] == "initial" and s.last_ask_info["proposer"] == "random"
    assert len(keys(space, first)) == 6 and all(space.contains(c) for c in first)
    for cfg in first:
        s.tell(cfg, {"throughput": throughput(cfg)})
    second = s.ask(5)
    info = s.last_ask_info
    assert info["phase"] == "guided" and info["n_ok"] == 6 and info["n_pool"] == 183
    assert len(keys(space, second)) == 5 and not keys(space, first) & keys(space, second)
    assert not keys(space, second) & keys(space, s.ask(5))  # pending is never proposed again


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
@pytest.mark.parametrize("limit", [4096, 0], ids=["exhaustive", "evolution"])
def test_guided_asks_launch_the_predicted_top_k(space, direction, limit):
    fn = throughput if direction == "maximize" else step_time_s
    s = PredictorGuidedSearch(space, objective="y", direction=direction, seed=2, n_init=5,
                              predictor_factory=lambda: Oracle(fn), exhaustive_limit=limit)
    run(s, 1, 5, fn)
    want = untried_top(space, s, 3, fn, reverse=direction == "maximize")
    got = s.ask(3)
    info = s.last_ask_info
    assert info["proposer"] == ("exhaustive" if limit else "evolution")
    assert info["predicted"] == pytest.approx([fn(c) for c in got])
    if limit:  # exact top-3
        assert got == want
        assert info["n_scored"] == 184
    else:  # evolution on a perfect predictor finds the best, and the rest near it
        assert got[0] == want[0] and 0 < info["n_scored"] <= 184
        worst = max if direction == "maximize" else min
        assert worst(fn(c) for c in got) == pytest.approx(fn(want[2]), rel=0.2)


@pytest.mark.parametrize("limit", [4096, 0], ids=["exhaustive", "evolution"])
def test_told_configs_and_failures_are_never_proposed_again(space, limit):
    """The predicted best region fails (out of memory): the search must move on, not retry."""
    def oom(cfg):
        return cfg["precision"] == "bf16" and cfg["micro_batch"] >= 32

    s = PredictorGuidedSearch(space, seed=3, n_init=4, predictor_factory=Oracle,
                              exhaustive_limit=limit)
    told: set[str] = set()
    for _ in range(12):
        batch = s.ask(4)
        assert not keys(space, batch) & told and len(keys(space, batch)) == len(batch)
        for cfg in batch:
            told.add(space.key(cfg))
            if oom(cfg):
                s.tell(cfg, None, status="oom")
            else:
                s.tell(cfg, {"throughput": throughput(cfg)})
    n_ok = sum(h["status"] == "ok" for h in s.history)
    assert 0 < n_ok < len(told) and not keys(space, s.ask(4)) & told
    assert s.last_ask_info["phase"] == "guided" and s.last_ask_info["n_ok"] == n_ok
    best = max((c for c in space.enumerate() if not oom(c)), key=throughput)
    assert s.best()[0] == best


def test_explicit_candidates_bound_the_evolution(space):
    rng = np.random.default_rng(0)
    everything = space.enumerate()
    candidates = [everything[int(i)] for i in rng.choice(len(everything), 40, replace=False)]
    s = PredictorGuidedSearch(space, seed=4, n_init=3, candidates=candidates,
                              predictor_factory=Oracle, exhaustive_limit=0)
    proposed = run(s, 8, 4)
    assert s.last_ask_info["proposer"] == "evolution"
    assert keys(space, proposed) <= keys(space, candidates) and len(proposed) == 32
    assert s.best()[0] == max(candidates, key=throughput)


def test_a_constrained_space_is_searched_to_exhaustion_by_evolution(tiny_space):
    def fn(cfg):
        return 100.0 * cfg["tp"] + 10.0 * cfg["pp"] + (5.0 if cfg["recompute"] == "none" else 1)

    s = PredictorGuidedSearch(tiny_space, seed=0, n_init=2, exhaustive_limit=0,
                              predictor_factory=lambda: Oracle(fn))
    seen = run(s, 5, 4, fn)
    assert keys(tiny_space, seen) == keys(tiny_space, tiny_space.enumerate())
    assert all(c["tp"] * c["pp"] <= 8 for c in seen)
    assert s.best()[1] == 815.0
    with pytest.raises(SearchError, match="all 20 configurations"):
        s.ask()


def test_evolution_leaves_a_sampled_pool_for_valid_configs_of_a_large_space():
    space = Space([PowerOfTwo("tp", 1, 64), PowerOfTwo("pp", 1, 64), Int("micro_batch", 1, 512),
                   Choice("recompute", ["none", "selective", "full"]), Bool("compile"),
                   Float("lr", 1e-4, 1e-2, log=True)],
                  constants={"world_size": 64}, constraints=["tp * pp <= world_size"])

    def fn(c):
        return 1e3 * math.exp(-((math.log2(c["micro_batch"]) - 6.3) / 2) ** 2
                              - (math.log2(c["tp"]) - 2) ** 2 / 4
                              - (math.log2(c["pp"]) - 1) ** 2 / 4) \
            * (1.3 if c["compile"] else 1.0) * (1.2 if c["recompute"] == "none" else 1.0)

    s = PredictorGuidedSearch(space, seed=5, n_init=4, num_candidates=500, exhaustive_limit=100,
                              predictor_factory=lambda: Oracle(fn))
    proposed = run(s, 4, 4, fn)
    assert s.last_ask_info["proposer"] == "evolution" and s.last_ask_info["n_scored"] > 0
    assert all(space.contains(c) for c in proposed) and len(keys(space, proposed)) == 16
    top = 1e3 * 1.3 * 1.2 * max(math.exp(-((math.log2(mb) - 6.3) / 2) ** 2)
                                for mb in range(1, 513))
    assert s.best()[1] >= 0.97 * top  # a random pool of 500 holds nothing this good


def test_unusable_observations_fall_back_to_random_draws(space):
    s = PredictorGuidedSearch(space, seed=0, n_init=3, predictor_factory=Oracle)
    for cfg in s.ask(3):
        s.tell(cfg, {"throughput": 100.0})
    assert len(keys(space, s.ask(2))) == 2
    assert s.last_ask_info["phase"] == "fallback" and "identical" in s.last_ask_info["reason"]

    class Broken(Oracle):
        def fit(self, configs, values):
            raise PredictorError("singular", hint="none")

    s = PredictorGuidedSearch(space, seed=0, n_init=3, predictor_factory=Broken)
    run(s, 1, 3)
    assert len(s.ask(2)) == 2
    assert s.last_ask_info["phase"] == "fallback"
    assert s.last_ask_info["reason"] == "predictor fit failed: singular"


# -- the default MLP predictor ------------------------------------------------------------------
def test_same_seed_and_history_propose_the_same_with_the_mlp(space, one_torch_thread):
    """Two searchers told the same history, and a third resumed from it, agree (real MLP fits)."""
    a = PredictorGuidedSearch(space, seed=7, n_init=5)
    b = PredictorGuidedSearch(space, seed=7, n_init=5)
    for _ in range(2):
        batch = a.ask(3)
        assert b.ask(3) == batch
        a.tell(batch[0], None, status="oom")
        b.tell(batch[0], None, status="oom")
        for cfg in batch[1:]:
            a.tell(cfg, {"throughput": throughput(cfg)})
            b.tell(cfg, {"throughput": throughput(cfg)})
    run(a, 1, 3)
    run(b, 1, 3)
    history = a.history
    expected = a.ask(3)
    info = a.last_ask_info
    assert info["phase"] == "guided" and info["proposer"] == "exhaustive"
    assert info["n_ok"] == 7 and len(info["predicted"]) == 3
    assert 0 < info["fit_s"] <= info["ask_s"] and a.predictor.n_train == 7
    assert b.ask(3) == expected and b.last_ask_info["predicted"] == info["predicted"]
    c = PredictorGuidedSearch(space, seed=7, n_init=5)
    for h in history:
        c.tell(h["config"], None if h["value"] is None else {"throughput": h["value"]},
               status=h["status"])
    assert c.ask(3) == expected


def test_the_mlp_guided_search_minimises(space, one_torch_thread):
    """8 asks of 4 (6 MLP fits) bring the best step time within 15% of the minimum."""
    s = PredictorGuidedSearch(space, objective="step_time_s", direction="minimize", seed=3)
    run(s, 8, 4, step_time_s)
    assert s.last_ask_info["phase"] == "guided"
    assert s.best()[1] <= 1.15 * min(step_time_s(c) for c in space.enumerate())


def trials_to_near_best(searcher: Searcher, fn, budget: int, batch: int) -> int:
    """Trials until one within 5% of the best of ``fn`` is measured (budget + 1 if never)."""
    target = 0.95 * max(fn(c) for c in searcher.space.enumerate())
    n = 0
    while n < budget:
        for cfg in searcher.ask(batch):
            n += 1
            searcher.tell(cfg, {"throughput": fn(cfg)})
            if fn(cfg) >= target:
                return n
    return budget + 1


@pytest.mark.slow
def test_the_mlp_guided_search_finds_a_near_best_config_faster_than_random(one_torch_thread):
    """About 30 s: 3 guided campaigns of at most 45 trials (11 MLP fits) on 10 * 9 * 3 = 270
    configurations, two of them within 5% of the best. Random search needs about 90 trials
    (measured: median 104 over 20 seeds); guided search about 30 (seeds 0-11 on 2026-11-27: 25,
    23, 41, 29, 97, 24, 78, 19, 42, 34, 40, 25), though pure top-k exploitation sometimes sticks
    to the wrong precision for a while: a campaign is cut at 45 trials, the most the median may
    be, and counts as 46. The median of 3 seeds fails only where 2 of 3 stick (2 of those 12
    seeds did). benchmarks/search_efficiency.py compares the searchers on the shipped
    tables."""
    space = Space([PowerOfTwo("micro_batch", 1, 512),
                   Ordinal("d_model", [128, 192, 256, 320, 384, 512, 640, 768, 1024]),
                   Choice("precision", ["fp32", "bf16", "fp16"])])

    def fn(cfg: dict) -> float:
        mb, d = math.log2(cfg["micro_batch"]), math.log2(cfg["d_model"])
        return 1e4 * math.exp(-((mb - 5.6) / 1.8) ** 2 - ((d - 8.4) / 0.9) ** 2) \
            * SPEEDUP[cfg["precision"]]

    guided_n = [trials_to_near_best(PredictorGuidedSearch(space, seed=s), fn, 45, 4)
                for s in range(3)]
    random_n = [trials_to_near_best(RandomSearch(space, seed=s), fn, 270, 4) for s in range(20)]
    assert np.median(guided_n) <= min(45, 0.5 * np.median(random_n)), (guided_n, random_n)


# -- input checks, imports, exports ------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"n_init": -1}, r"n_init = -1 is outside 0\.\."),
    ({"n_init": 2.5}, r"n_init = 2.5 must be an int"),
    ({"predictor_factory": 42}, r"predictor_factory = 42 is not callable"),
    ({"proposer": "reinforce"}, r"proposer = 'reinforce' is not one of \['evolution', "),
    ({"exhaustive_limit": "all"}, r"exhaustive_limit = 'all' must be an int from 0"),
    ({"population": 1}, r"population = 1 is outside 2\.\."),
    ({"generations": -3}, r"generations = -3 is outside 0\.\."),
    ({"crossover": 1.5}, r"crossover = 1.5 must be a probability in \[0, 1\]"),
    ({"direction": "max"}, r"direction = 'max' is not one of"),
])
def test_bad_arguments_are_refused_with_a_hint(space, kwargs, match):
    with pytest.raises(SearchError, match=match) as err:
        PredictorGuidedSearch(space, **kwargs)
    assert err.value.hint


def test_the_log_objective_needs_positive_values(space):
    cfg = space.enumerate()[0]
    with pytest.raises(SearchError, match="-1.0 is not positive"):
        PredictorGuidedSearch(space).tell(cfg, {"throughput": -1.0})
    PredictorGuidedSearch(space, log_objective=False).tell(cfg, {"throughput": -1.0})


def test_importing_guided_search_does_not_import_torch():
    code = ("import sys, cubicml_lab, cubicml_lab.search.guided; "
            "assert cubicml_lab.PredictorGuidedSearch.__name__ == 'PredictorGuidedSearch'; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_exported_from_the_package():
    import cubicml_lab as cml

    assert cml.PredictorGuidedSearch is PredictorGuidedSearch
    assert "PredictorGuidedSearch" in cml.__all__


def test_docstring_example_runs(one_torch_thread):
    result = doctest.testmod(guided, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
