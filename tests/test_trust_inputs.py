"""Hostile inputs to spaces, searchers, the physics model and the workload registry: every bad
input raises a :class:`~cubicml_lab.errors.CubicMLError` (never a bare exception, never a hang)
and every good one still works.

Property tests draw the inputs (Unicode names, constraint results, counts and seeds, physics
facts, layouts, YAML alias trees, bytes as space files, told values, workload names); a few
example tests cover the files a generator cannot draw (a FIFO, ``/dev/zero``, a directory, a
name over 255 bytes). The whole file runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import keyword
import math
import os
import time
import unicodedata
import warnings

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cubicml_lab as cml
from cubicml_lab.analytical import GPUSpec, LLMTrainingModel, PhysicsConstants
from cubicml_lab.errors import ConfigError, CubicMLError, SearchError, SpaceError
from cubicml_lab.workloads import registry

FAST = settings(max_examples=40, deadline=2_000,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

#: Numbers and non-numbers a count, seed or fact may be given as.
ANY_NUMBER = st.one_of(
    st.integers(-(10**6), 10**6), st.integers(10**15, 10**20), st.just(10**5000),
    st.just(-(10**5000)), st.booleans(), st.none(),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
    st.lists(st.integers(), max_size=2), st.just(np.int64(3)), st.just(np.float64("nan")))


def refused(fn, *args, **kwargs):
    """Call ``fn``; return the CubicMLError it raised, or None. Any other exception fails."""
    try:
        fn(*args, **kwargs)
    except CubicMLError as err:
        assert str(err) and err.message, "an error without a message"
        assert len(str(err)) < 2_000, "a message that prints a whole input"
        return err
    return None


def _job(**facts):
    base = dict(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000, global_batch=16,
                n_gpus=8, gpu="H100-80GB")
    return LLMTrainingModel(**{**base, **facts})


# -- names --------------------------------------------------------------------------------------
def _good_name(name: object) -> bool:
    return (isinstance(name, str) and name.isascii() and name.isidentifier()
            and not keyword.iskeyword(name) and len(name) <= 100)


@FAST
@given(st.one_of(st.text(max_size=12), st.sampled_from(keyword.kwlist),
                 st.sampled_from(["ｔｐ", "ﬁle", "Ⅸ", "tp\u200b", "x" * 101, "tp_degree"]),
                 st.integers(), st.none()))
def test_knob_names_are_ascii_identifiers_not_keywords(name):
    for build in (lambda: cml.Int(name, 1, 4),
                  lambda: cml.Space([cml.Int("a", 1, 4)], constants={name: 1}),
                  lambda: cml.Space([cml.Int("a", 1, 4)], derived={name: "a + 1"})):
        err = refused(build)
        assert (err is None) == _good_name(name), name
        if err is not None:
            assert isinstance(err, SpaceError) and err.hint


def test_names_that_fold_together_and_keywords_get_a_hint():
    err = refused(lambda: cml.Space([cml.Int("tp", 1, 4), cml.Int("ｔｐ", 1, 4)]))
    assert "ASCII" in err.message and "'tp'" in err.hint
    err = refused(cml.Bool, "if")
    assert "keyword" in err.message and "if_" in err.hint
    assert refused(cml.Bool, "True") is not None and refused(cml.Bool, "None") is not None
    # a constraint written with a full-width name does not quietly constrain the ASCII knob
    err = refused(cml.Space, [cml.Int("tp", 1, 4)], constraints=["ｔｐ <= 2"])
    assert "read by Python as 'tp'" in err.message


def test_the_shipped_spaces_still_build():
    from cubicml_lab import datasets
    from cubicml_lab.analytical import llm_cluster_model

    for name in datasets.names():
        assert len(datasets.load(name).space.names) >= 1
    assert llm_cluster_model(n_gpus=16, model="7b").space.size() > 0


# -- constraints evaluate to a bool -------------------------------------------------------------
CONSTANT_VALUES = st.one_of(st.booleans(), st.integers(-5, 5), st.floats(), st.text(max_size=4))


@FAST
@given(CONSTANT_VALUES)
def test_a_constraint_gives_true_or_false_or_is_refused(value):
    err = refused(cml.Space, [cml.Int("a", 1, 4)], constants={"c": value}, constraints=["c"])
    if isinstance(value, float) and not math.isfinite(value):
        assert err is not None and "finite" in err.message
    elif isinstance(value, bool):
        assert (err is None) == value  # False: no configuration satisfies it
    else:
        assert err is not None and "not True or False" in err.message


@FAST
@given(st.sampled_from(["a + 1", "'x'", "3", "-a", "abs(a)", "a % 2", "a if a > 1 else 0"]))
def test_a_constraint_that_never_gives_a_bool_is_refused_where_it_is_defined(source):
    err = refused(cml.Space, [cml.Int("a", 1, 4)], constraints=[source])
    assert isinstance(err, SpaceError) and "True or False" in err.message
    assert source[:3] in err.message


@FAST
@given(st.sampled_from(["a and b", "a or b", "not a", "b if a else b"]),
       st.one_of(st.integers(0, 3), st.floats(), st.text(max_size=3)))
def test_logic_takes_bools_only(source, a):
    space = refused(cml.Space, [cml.Bool("b")], constants={"a": a}, constraints=[source])
    assert space is not None  # a number, NaN or a string is not read as true


def test_the_usual_constraints_still_work():
    space = cml.Space([cml.PowerOfTwo("tp", 1, 8), cml.PowerOfTwo("pp", 1, 8), cml.Bool("sp")],
                      constants={"world_size": 8}, derived={"dp": "world_size // (tp * pp)"},
                      constraints=["world_size % (tp * pp) == 0", "tp > 1 or not sp",
                                   "dp >= 1 and (pp == 1 or dp % 1 == 0)", "sp == sp"])
    assert space.size() == 16 and all(c["tp"] > 1 or not c["sp"] for c in space.enumerate())


# -- counts -------------------------------------------------------------------------------------
def _good_count(n, low, high):
    return (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and low <= n <= high)


@FAST
@given(ANY_NUMBER)
def test_sample_n_is_bounded(n):
    space = cml.Space([cml.Int("a", 0, 10**9), cml.Int("b", 0, 10**9)])
    assume(not _good_count(n, 21, 10**6))  # valid, but slow to draw here
    t0 = time.perf_counter()
    err = refused(space.sample, n)
    assert time.perf_counter() - t0 < 1.0
    assert (err is None) == _good_count(n, 0, 20)
    if err is None:
        assert len(space.sample(n)) == n
    else:
        assert "sample(n)" in err.message


def test_sample_counts_name_the_limit():
    tiny = cml.Space([cml.Int("a", 1, 4)])
    assert "the space has 4" in refused(tiny.sample, 5).message
    assert "MAX_SAMPLE" in refused(cml.Space([cml.Float("x", 0, 1)]).sample, 10**8).message
    assert "seed" in refused(tiny.sample, 1, seed=[1]).message


@FAST
@given(st.sampled_from(["RandomSearch", "BayesianSearch", "PredictorGuidedSearch"]),
       st.sampled_from(["num_candidates", "seed"]), ANY_NUMBER)
def test_searcher_counts_and_seeds_are_checked_when_built(kind, arg, value):
    space = cml.Space([cml.Int("a", 1, 10**6)])
    low, high = (1, 200_000) if arg == "num_candidates" else (0, 2**63 - 1)
    err = refused(getattr(cml, kind), space, **{arg: value})
    assert (err is None) == _good_count(value, low, high), (kind, arg, value)
    if err is not None:
        assert isinstance(err, SearchError) and arg in err.message


@FAST
@given(ANY_NUMBER)
def test_ask_n_is_bounded(n):
    s = cml.RandomSearch(cml.Space([cml.Int("a", 1, 8)]))
    err = refused(s.ask, n)
    assert (err is None) == _good_count(n, 1, 200_000)
    if err is None:
        assert len(s.ask.__self__.pending) == min(int(n), 8)


def test_a_billion_candidates_is_refused_before_any_ask():
    err = refused(cml.BayesianSearch, cml.Space([cml.Int("a", 1, 10**9)]), num_candidates=10**9)
    assert "num_candidates" in err.message and "200,000" in err.message
    assert "seed = -1" in refused(cml.RandomSearch, cml.Space([cml.Bool("b")]), seed=-1).message


@FAST
@given(st.sampled_from(["n_init", "mc_samples", "chunk_size", "stop_patience",
                        "memory_limit_gib", "stop_threshold"]), ANY_NUMBER)
def test_bayesian_options_are_bounded(arg, value):
    err = refused(cml.BayesianSearch, cml.Space([cml.Int("a", 1, 8)]), **{arg: value})
    if err is not None:
        assert arg in err.message


@FAST
@given(ANY_NUMBER, ANY_NUMBER)
def test_table_objective_seed_and_replay_counts(seed, budget):
    df = pd.DataFrame({"a": [1, 2, 3], "throughput": [1.0, 2.0, 3.0], "status": ["ok"] * 3})
    err = refused(cml.TableObjective, df, seed=seed)
    assert (err is None) == _good_count(seed, 0, 2**63 - 1)
    obj = cml.TableObjective(df)
    s = cml.RandomSearch(obj.space, candidates=obj.configs())
    err = refused(obj.replay, s, budget)
    assert (err is None) == _good_count(budget, 1, 10**7)


# -- told values and configs ---------------------------------------------------------------------
@FAST
@given(st.one_of(st.just(10**5000), st.just(-(10**5000)), st.floats(), st.text(max_size=3),
                 st.integers(-(10**30), 10**30)),
       st.sampled_from(["config", "objective", "other metric", "metric name"]))
def test_tell_refuses_huge_or_odd_values_with_a_search_error(value, where):
    space = cml.Space([cml.Int("a", 1, 8), cml.Float("f", 0.0, 1.0)])
    s = cml.RandomSearch(space)
    config, values = {"a": 2, "f": 0.5}, {"throughput": 1.0}
    if where == "config":
        config = {**config, "f": value}
    elif where == "objective":
        values = {"throughput": value}
    elif where == "other metric":
        values = {**values, "x": value}
    else:
        values = {**values, value: 1.0} if not isinstance(value, str) else values
    refused(s.tell, config, values)  # no bare OverflowError / ValueError


# -- space files ------------------------------------------------------------------------------
def _alias_tree(depth: int, width: int) -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, depth):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@FAST
@given(st.integers(1, 12), st.integers(1, 12), st.sampled_from(["yaml"]))
def test_yaml_alias_trees_load_or_are_refused_quickly(tmp_path_factory, depth, width, fmt):
    path = tmp_path_factory.mktemp("alias") / f"space.{fmt}"
    path.write_text(_alias_tree(depth, width) + "parameters: [{type: bool, name: b}]\n")
    t0 = time.perf_counter()
    err = refused(cml.Space.from_yaml, path)
    assert time.perf_counter() - t0 < 1.5
    assert err is not None
    if width ** depth > 100_000:
        assert "expands to more than" in err.message
    elif 3 * width ** depth < 100_000:  # data the description does not know: an unknown key
        assert "unknown key" in err.message


@FAST
@given(st.binary(max_size=300), st.sampled_from(["yaml", "json"]))
def test_random_bytes_as_a_space_file(tmp_path_factory, data, fmt):
    path = tmp_path_factory.mktemp("bytes") / f"space.{fmt}"
    path.write_bytes(data)
    load = cml.Space.from_yaml if fmt == "yaml" else cml.Space.from_json
    refused(load, path)  # a Space or a SpaceError, nothing else


def test_files_that_are_not_regular_are_refused_at_once(tmp_path):
    fifo = tmp_path / "space.yaml"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    assert "FIFO" in refused(cml.Space.from_yaml, fifo).message
    assert "device" in refused(cml.Space.from_yaml, "/dev/zero").message
    assert "directory" in refused(cml.Space.from_json, tmp_path).message
    assert time.perf_counter() - t0 < 2
    long = tmp_path / ("x" * 300 + ".yaml")
    err = refused(cml.Space.from_yaml, long)
    assert "File name too long" in err.message and len(err.message) < 400
    assert "not a path" in refused(cml.Space.from_yaml, 3).message
    big = tmp_path / "big.json"
    big.write_text("[" + "1," * 600_000 + "1]")
    assert "allowed" in refused(cml.Space.from_json, big).message


def test_a_good_space_file_still_round_trips(tmp_path):
    space = cml.Space([cml.PowerOfTwo("tp", 1, 8), cml.Choice("recompute", ["none", "full"])],
                      constants={"world_size": 8}, constraints=["tp <= world_size"])
    space.to_yaml(tmp_path / "s.yaml")
    space.to_json(tmp_path / "s.json")
    assert cml.Space.from_yaml(tmp_path / "s.yaml") == space
    assert cml.Space.from_json(tmp_path / "s.json") == space


# -- parameters beyond the names ----------------------------------------------------------------
@FAST
@given(st.lists(st.one_of(st.integers(), st.just(10**400), st.floats(), st.text(max_size=3)),
                min_size=1, max_size=6))
def test_ordinal_values_are_scalars_within_limits(values):
    err = refused(cml.Ordinal, "v", values)
    bad = any(isinstance(v, float) and not math.isfinite(v) or
              isinstance(v, int) and v.bit_length() > 1024 for v in values)
    if bad:
        assert err is not None


@FAST
@given(ANY_NUMBER, ANY_NUMBER)
def test_float_bounds_and_checks(low, high):
    err = refused(cml.Float, "x", low, high)
    if err is None:
        refused(cml.Float("x", low, high).check, 10**5000)


def test_too_many_knobs_are_refused():
    assert "MAX_NAMED" in refused(cml.Space,
                                  [cml.Bool(f"b{i}") for i in range(1_001)]).message
    assert "MAX_NAMED" in refused(cml.Space, [cml.Bool("b")],
                                  constraints=["b or not b"] * 1_001).message


# -- the physics model ------------------------------------------------------------------------
FACTS = ["layers", "hidden", "heads", "seq_len", "vocab", "global_batch", "n_gpus",
         "gpus_per_node"]


@FAST
@given(st.sampled_from(FACTS), ANY_NUMBER)
def test_physics_facts_are_positive_finite_integers(fact, value):
    err = refused(_job, **{fact: value})
    whole = (isinstance(value, (int, float, np.integer, np.floating))
             and not isinstance(value, bool) and 1 <= value <= 2**53 and value == int(value))
    if not whole:
        assert isinstance(err, ConfigError) and fact in err.message


GPU_FIELDS = ["peak_tflops", "memory_gib", "hbm_tb_s", "nvlink_gb_s", "internode_gb_s",
              "gemm_efficiency", "fp8_tflops", "pcie_gb_s", "nvlink_latency_s"]
CONST_FIELDS = ["gemm_half_size", "gemm_curve_power", "elementwise_efficiency", "dp_overlap",
                "memory_fragmentation", "memory_reserved_gib", "step_overhead_s"]


@FAST
@given(st.sampled_from(GPU_FIELDS + CONST_FIELDS),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(10**5000),
                 st.booleans(), st.text(max_size=2), st.none()))
def test_hardware_figures_and_constants_are_finite_and_in_range(field, value):
    if field in GPU_FIELDS:
        base = dict(name="mine", peak_tflops=100.0, memory_gib=40.0, hbm_tb_s=1.0,
                    nvlink_gb_s=100.0, internode_gb_s=10.0, gemm_efficiency=0.7)
        err = refused(GPUSpec, **{**base, field: value})
    else:
        err = refused(PhysicsConstants, **{field: value})
    finite = isinstance(value, float) and math.isfinite(value)
    if not finite:
        assert isinstance(err, ConfigError) and field in err.message
    if err is None and 1e-3 <= value <= 1e3:
        spec = GPUSpec(**{**base, field: value}) if field in GPU_FIELDS else None
        job = _job(gpu=spec) if spec else _job(constants=PhysicsConstants(**{field: value}))
        assert math.isfinite(job.step_time_s({"tp": 2}))


@FAST
@given(st.sampled_from([1, 2, 3, 4, 8, 16, 32]), st.sampled_from([1, 2, 3, 4, 8, 16]),
       st.sampled_from([1, 2, 6, 8, 12, 64]))
def test_a_layout_the_gpus_cannot_hold_is_refused_not_modelled(tp, pp, n_gpus):
    job = _job(n_gpus=n_gpus)
    config = {"tp": tp, "pp": pp}
    holds = n_gpus % (tp * pp) == 0
    assert job.holds_frame([config]).tolist() == [holds]
    err = refused(job.cost_terms, config)
    if holds:
        assert err is None and job.resolve(config)["dp"] == n_gpus // (tp * pp)
    else:
        assert isinstance(err, ConfigError) and f"n_gpus = {n_gpus}" in err.message
        assert "n_gpus % (tp * pp) == 0" in err.hint
        assert refused(job.memory_gib_frame, [config, {"tp": 1}]) is not None


def test_a_search_over_a_space_without_the_layout_constraint_does_not_crash():
    job = _job(n_gpus=8, layers=8, hidden=512, heads=8)
    space = cml.Space([cml.PowerOfTwo("tp", 1, 16), cml.PowerOfTwo("pp", 1, 16),
                       cml.PowerOfTwo("micro_batch", 1, 2)])
    s = cml.BayesianSearch(space, seed=0, n_init=2, cost_model=job.cost_terms,
                           memory_model=job.memory_gib, memory_limit_gib=80)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (2, 1):  # the initial design, then the GP's pick
            for config in s.ask(n):
                assert job.holds_frame([config])[0], config
                s.tell(config, {"throughput": job.throughput(config),
                                "peak_mem_gib": job.memory_gib(config)})
    assert s.last_ask_info["layouts_left_out"] > 0


@FAST
@given(st.dictionaries(st.one_of(st.sampled_from(["tp", "pp", "dp", "micro_batch", "recompute",
                                                  "zero_stage", "n_gpus", "hidden"]),
                                 st.text(max_size=3), st.integers(0, 3).map(lambda k: 10**5000 + k),
                                 st.integers()),
                       st.one_of(ANY_NUMBER, st.sampled_from(["none", "full", "x"])),
                       max_size=4))
def test_physics_configs_give_numbers_or_a_config_error(config):
    job = _job()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        err = refused(job.cost_terms, config)
        if err is None:
            assert all(math.isfinite(v) for v in job.cost_terms(config).values())
        else:
            assert isinstance(err, ConfigError)
        refused(job.memory_gib_frame, [config, {"tp": 2}])


@FAST
@given(ANY_NUMBER, ANY_NUMBER, st.one_of(st.text(max_size=4), st.lists(st.integers()),
                                         st.none()))
def test_the_modelled_table_arguments(n_gpus, seed, model):
    from cubicml_lab.analytical import llm_cluster_model

    err = refused(llm_cluster_model, n_gpus=n_gpus, seed=seed, model=model)
    assert err is not None or _good_count(n_gpus, 1, 1 << 20)


# -- the workload registry -------------------------------------------------------------------
@FAST
@given(st.one_of(st.text(max_size=8), st.lists(st.text(), max_size=2),
                 st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
                 st.integers(), st.just(10**5000), st.none(), st.just("x" * 101)))
def test_workload_names_are_words(name):
    good = (isinstance(name, str) and name.isascii() and len(name) <= 100
            and name.replace("-", "_").isidentifier())
    assert (refused(registry.lookup, name) is None) == good
    assert (refused(registry.unregister, name) is None) == good
    if good and name not in ("gpt", "dlrm"):
        try:
            assert refused(registry.register, name, "json:loads") is None
        finally:
            registry.unregister(name)
    err = refused(registry.register, name, "json:loads") if not good else None
    if not good:
        assert isinstance(err, ConfigError) and "workload name" in err.message
    if name not in ("gpt", "dlrm"):  # a name nothing registered: refused by the lookup too
        assert isinstance(refused(cml.workloads.get, name), ConfigError)


@FAST
@given(st.one_of(st.lists(st.integers(), max_size=2), st.just(10**5000), st.none(),
                 st.text(max_size=8), st.just("x" * 10**5)))
def test_dataset_names(name):
    from cubicml_lab import datasets

    err = refused(datasets.load, name)
    assert (err is None) == (name in datasets.names())
    if err is not None:
        assert len(err.message) < 600


def test_registry_messages_stay_short():
    err = refused(registry.register, "fine", [0] * 10**6)
    assert "not a workload" in err.message and len(err.message) < 300
    err = refused(registry.parse_path, "x" * 10**6)
    assert len(err.message) < 300
    assert unicodedata.normalize("NFKC", "ｇｐｔ") == "gpt"
    assert "ASCII" in refused(registry.register, "ｇｐｔ", "json:loads").message
