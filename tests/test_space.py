"""Tests of cubicml_lab.space: parameters, constraints, sampling, encoding, round trips."""

from __future__ import annotations

import collections
import itertools
import json
import math

import pytest

import cubicml_lab as cml
from cubicml_lab._expr import Expr
from cubicml_lab.errors import SpaceError


def brute_force_valid(tp_max=8, pp_max=8, world=8):
    out = []
    for tp, pp, rc in itertools.product([1, 2, 4, 8], [1, 2, 4, 8], ["none", "full"]):
        if tp <= tp_max and pp <= pp_max and tp * pp <= world:
            out.append({"tp": tp, "pp": pp, "recompute": rc})
    return out


def test_enumerate_matches_brute_force(tiny_space):
    got = tiny_space.enumerate()
    want = brute_force_valid()
    assert sorted(map(json.dumps, got)) == sorted(map(json.dumps, want))
    assert tiny_space.size() == len(want)
    assert all(tiny_space.contains(c) for c in got)


def test_contract_example_space():
    space = cml.Space(
        [cml.PowerOfTwo("tp", 1, 8), cml.PowerOfTwo("pp", 1, 8), cml.Int("micro_batch", 1, 16),
         cml.Choice("recompute", ["none", "selective", "full"]), cml.Bool("compile"),
         cml.Ordinal("d_model", [512, 768, 1024])],
        constants={"world_size": 8},
        derived={"dp": "world_size // (tp * pp)"},
        constraints=["tp * pp <= world_size", "world_size % (tp * pp) == 0"],
    )
    # tp*pp in {1,2,4,8}: 10 (tp,pp) pairs; times 16 * 3 * 2 * 3
    assert space.size() == 10 * 16 * 3 * 2 * 3
    cfg = {"tp": 2, "pp": 4, "micro_batch": 3, "recompute": "full", "compile": True, "d_model": 768}
    assert space.resolve(cfg)["dp"] == 1


def test_resolve_adds_constants_and_derived(tiny_space):
    full = tiny_space.resolve({"tp": 2, "pp": 1, "recompute": "none"})
    assert full == {"world_size": 8, "tp": 2, "pp": 1, "recompute": "none", "dp": 4}


def test_sample_is_uniform_over_valid_configs(tiny_space):
    counts = collections.Counter()
    for seed in range(400):
        (cfg,) = tiny_space.sample(1, seed=seed)
        counts[tiny_space.key(cfg)] += 1
    assert len(counts) == tiny_space.size()
    # 400 draws over 20 configs: expected 20 each; a chi-square bound far from typical noise
    chi2 = sum((c - 20) ** 2 / 20 for c in counts.values())
    assert chi2 < 60  # 19 dof: P(chi2 > 60) ~ 3e-6


def test_sample_distinct_deterministic_and_bounded(tiny_space):
    a, b = tiny_space.sample(10, seed=3), tiny_space.sample(10, seed=3)
    assert a == b
    assert len({tiny_space.key(c) for c in a}) == 10
    assert tiny_space.sample(10, seed=4) != a
    with pytest.raises(SpaceError, match="20"):
        tiny_space.sample(21)


def test_rejection_sampling_for_continuous_space():
    space = cml.Space([cml.Float("lr", 1e-5, 1e-1, log=True), cml.Int("n", 1, 100)],
                      constraints=["n * lr < 1"])
    configs = space.sample(200, seed=0)
    assert all(space.contains(c) for c in configs)
    logs = [math.log10(c["lr"]) for c in configs]
    assert min(logs) < -4 and max(logs) > -2  # log-uniform spreads over the decades
    with pytest.raises(SpaceError, match="infinitely"):
        space.size()
    with pytest.raises(SpaceError, match="continuous"):
        space.enumerate()


def test_contains_and_validate_messages(tiny_space):
    ok = {"tp": 2, "pp": 2, "recompute": "full"}
    assert tiny_space.contains(ok)
    assert tiny_space.contains({**ok, "dp": 2, "world_size": 8})  # resolved configs are accepted
    with pytest.raises(SpaceError, match=r"tp \* pp <= world_size.*pp=8.*tp=8"):
        tiny_space.validate({"tp": 8, "pp": 8, "recompute": "none"})
    with pytest.raises(SpaceError, match="unknown key"):
        tiny_space.validate({**ok, "tpp": 1})
    with pytest.raises(SpaceError, match="missing"):
        tiny_space.validate({"tp": 2})
    with pytest.raises(SpaceError, match="allowed values"):
        tiny_space.validate({**ok, "tp": 3})
    with pytest.raises(SpaceError, match="allowed values"):
        tiny_space.validate({**ok, "recompute": "selective"})
    assert not tiny_space.contains({**ok, "recompute": "selective"})


def test_values_are_normalised():
    space = cml.Space([cml.Int("n", 1, 8), cml.Bool("flag"), cml.Ordinal("d", [512, 768])])
    cfg = space.project({"n": 4.0, "flag": True, "d": 768.0})
    assert cfg == {"n": 4, "flag": True, "d": 768}
    assert type(cfg["n"]) is int and type(cfg["d"]) is int
    with pytest.raises(SpaceError, match="not an integer"):
        space.project({"n": 4.5, "flag": True, "d": 768})
    with pytest.raises(SpaceError, match="'flag'"):
        space.project({"n": 4, "flag": 1, "d": 768})  # an int is not a bool


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: cml.Choice("x", []), "non-empty"),
        (lambda: cml.Choice("x", ["a", "a"]), "duplicates"),
        (lambda: cml.Int("x", 5, 1), "low = 5 > high = 1"),
        (lambda: cml.PowerOfTwo("x", 3, 8), "not a power of two"),
        (lambda: cml.Float("x", 0.0, 1.0, log=True), "low > 0"),
        (lambda: cml.Space([cml.Int("a", 1, 2), cml.Int("a", 1, 3)]), "used twice"),
        (lambda: cml.Space([cml.Int("a", 1, 2)], constraints=["a < b"]), "unknown name.*'b'"),
        (lambda: cml.Space([cml.Int("a", 1, 2)], constraints=["a <"]), "does not parse"),
        (lambda: cml.Space([cml.Int("a", 1, 2)], constraints=["a > 5"]), "no configuration"),
        (lambda: cml.Space([cml.Int("a", 1, 2)], derived={"b": "a.bit_length()"}), "not allowed"),
        (lambda: cml.Space([cml.Int("a", 1, 2)], derived={"b": "__import__('os')"}), "only min"),
        (lambda: cml.Space([cml.Int("a", 1, 2)], constraints=["[a][0] > 0"]), "not allowed"),
        (lambda: cml.Space([cml.Int("a", 1, 2)], constraints=["(lambda: 1)()"]), "not allowed"),
        (lambda: cml.Space([cml.Int("a", 1, 2)], constraints=["2 ** (10 ** 9) > a"]), "refused"),
        (lambda: cml.Space([cml.Int("my-knob", 1, 2)]), "identifier"),
        (lambda: cml.Space([]), "non-empty"),
    ],
)
def test_bad_input_names_the_problem(build, match):
    with pytest.raises(SpaceError, match=match):
        build()


def test_space_errors_are_value_errors():
    with pytest.raises(ValueError):
        cml.Int("x", 2, 1)


def test_expression_evaluator_semantics():
    env = {"a": 7, "b": 2}
    cases = {"a // b": 3, "a % b": 1, "a / b": 3.5, "-a + b ** 3": 1, "min(a, b, 5)": 2,
             "max(a, b)": 7, "abs(b - a)": 5, "1 < b < a": True, "a == 7 and not b > 3": True,
             "a if b > 1 else 0": 7, "b > 5 or a < 3": False}
    for source, want in cases.items():
        assert Expr(source).evaluate(env) == want, source
    with pytest.raises(SpaceError, match="failed for a=1, b=0"):
        Expr("a // b").evaluate({"a": 1, "b": 0})


def test_encode_decode_round_trip():
    space = cml.Space([cml.Int("n", 1, 64, log=True), cml.PowerOfTwo("mb", 1, 32),
                       cml.Ordinal("d", [128, 256, 512]), cml.Choice("p", ["fp32", "bf16"]),
                       cml.Bool("c"), cml.Int("k", 0, 3)])
    configs = space.enumerate()[::97]
    X = space.encode(configs)
    assert X.dtype.__str__() == "torch.float64" and tuple(X.shape) == (len(configs), 7)
    assert space.decode(X) == configs
    lo, hi = space.encoded_bounds()
    arr = space.encode_array(configs)
    assert (arr >= lo).all() and (arr <= hi).all()
    assert space.encoded_names == ["n", "mb", "d", "p=fp32", "p=bf16", "c", "k"]
    # PowerOfTwo is encoded as log2, Choice one-hot
    row = space.encode_array([{"n": 1, "mb": 8, "d": 512, "p": "bf16", "c": True, "k": 2}])[0]
    assert list(row) == [0.0, 3.0, 2.0, 0.0, 1.0, 1.0, 2.0]
    with pytest.raises(SpaceError, match="shape"):
        space.decode(arr[:, :3])


def test_yaml_and_json_round_trip(tiny_space, tmp_path):
    tiny_space.to_yaml(tmp_path / "s.yaml")
    tiny_space.to_json(tmp_path / "s.json")
    for loaded in (cml.Space.from_yaml(tmp_path / "s.yaml"), cml.Space.from_json(tmp_path / "s.json")):
        assert loaded == tiny_space
        assert loaded.enumerate() == tiny_space.enumerate()
    (tmp_path / "bad.yaml").write_text("parameters:\n  - {type: integer, name: a}\n")
    with pytest.raises(SpaceError, match="unknown type 'integer'"):
        cml.Space.from_yaml(tmp_path / "bad.yaml")
    (tmp_path / "evil.yaml").write_text("!!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(SpaceError, match="not valid YAML"):
        cml.Space.from_yaml(tmp_path / "evil.yaml")


def test_import_is_torch_free():
    import subprocess
    import sys

    code = "import cubicml_lab, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_space_shows_itself_readably(tiny_space):
    """Jupyter renders a card (size, parameters, derived, constraints); text is readable too."""
    html = tiny_space._repr_html_()
    assert f"{tiny_space.size():,} valid configurations" in html
    for text in ("tp", "power_of_two", "world_size // (tp * pp)", "tp * pp &lt;= world_size"):
        assert text in html
    text = str(tiny_space)
    assert text.splitlines()[0] == f"Space: {tiny_space.size()} valid configurations"
    assert "derived   dp = world_size // (tp * pp)" in text
    # values are escaped: a choice value cannot inject markup
    odd = cml.Space([cml.Choice("kernel", ["<b>x</b>", "plain"])])
    assert "<b>x</b>" not in odd._repr_html_() and "&lt;b&gt;x&lt;/b&gt;" in odd._repr_html_()
    wide = cml.Space([cml.Float("lr", 1e-4, 1e-1)])
    assert "continuous" in str(wide)
