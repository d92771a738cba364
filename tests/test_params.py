"""Tests of cubicml_lab._params: wide Ints without listing, bounds, and parameters from dicts."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cubicml_lab._params import (
    MAX_INT,
    Bool,
    Choice,
    Float,
    Int,
    Ordinal,
    Parameter,
    PowerOfTwo,
    brief,
    param_from_dict,
)
from cubicml_lab.errors import SpaceError


def test_wide_int_never_lists_its_range():
    p = Int("x", 0, 10**12)
    start = time.perf_counter()
    values = p.values()
    assert isinstance(values, range) and len(values) == 10**12 + 1
    assert 10**12 in values and values.index(123_456_789) == 123_456_789
    assert values[-1] == 10**12
    assert p.check(10**12) == 10**12 and p.check(5e11) == 500_000_000_000
    rng = random.Random(0)
    draws = [p.draw(rng) for _ in range(1000)]
    assert p.decode(p.encode(987_654_321_012)) == 987_654_321_012
    assert time.perf_counter() - start < 0.5  # 10**12 listed ints would not even fit in memory
    assert min(draws) < 10**11 and max(draws) > 9 * 10**11  # spread over the whole range
    with pytest.raises(SpaceError, match=r"1000000000001 is outside \[0, 1000000000000\]"):
        p.check(10**12 + 1)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: Int("x", 0, 2**53 + 1), r"high = 9007199254740993 is beyond ±2\*\*53"),
        (lambda: Int("x", -(10**5000), 0), r"low = <an int of 16,610 bits> is beyond ±2\*\*53"),
        (lambda: PowerOfTwo("x", 1, 2**60), r"high = 1152921504606846976 is beyond ±2\*\*53"),
        (lambda: Int("x", 0, 5, log="yes"), r"log = 'yes' is not True or False"),
        (lambda: Float("x", 1.0, 2.0, log=1), r"log = 1 is not True or False"),
        (lambda: Int("my-knob", 0, 5), r"Int name 'my-knob' is not an ASCII Python identifier"),
        (lambda: Bool(7), r"Bool name 7 is not a string \(int\)"),
        (lambda: Choice("a b", ["x"]), r"Choice name 'a b' is not an ASCII Python identifier"),
        (lambda: Ordinal("d", [1.0, float("nan")]), r"value nan is not a finite number"),
        (lambda: Ordinal("d", "abc"), r"values must be a non-empty list, got 'abc'"),
        (lambda: Int("x", "0", 5), r"'0' is not an integer"),
    ],
)
def test_bad_parameters_name_the_field(build, match):
    with pytest.raises(SpaceError, match=match):
        build()


def test_int_bounds_at_the_float64_limit_round_trip():
    p = Int("x", -MAX_INT, MAX_INT)
    for v in (-MAX_INT, MAX_INT, MAX_INT - 1, 0):
        assert p.decode(p.encode(v)) == v


def test_power_of_two_decode_clamps_before_shifting():
    p = PowerOfTwo("mb", 1, 64)
    assert p.decode([1e300]) == 64 and p.decode([-1e300]) == 1 and p.decode([2.4]) == 4


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**14), st.integers(0, 10**14))
def test_log_int_decodes_exactly_up_to_1e14(high, offset):
    p = Int("n", 1, high, log=True)
    v = 1 + offset % high
    assert p.decode(p.encode(v)) == v


@pytest.mark.parametrize(
    "data, match",
    [
        (["int", "a"], r"parameters\[3\] must be a mapping, got list \['int', 'a'\]"),
        ("a", r"parameters\[3\] must be a mapping, got str 'a'"),
        ({"name": "a", "low": 1}, r"parameters\[3\] .* has no 'type'"),
        ({"type": "int"}, r"has no 'name'"),
        ({"type": ["int"], "name": "a"}, r"parameters\[3\] 'a': unknown type \['int'\]"),
        ({"type": "int", "name": "a", "lo": 1}, r"'a' \(int\): unknown key\(s\) 'lo'"),
        ({"type": "bool", "name": "a", "low": 1}, r"unknown key\(s\) 'low'"),
        ({"type": "choice", "name": "a"}, r"'a' \(choice\): .*values"),
        ({"type": "int", "name": "a", "low": [1]}, r"\[1\] is not an integer"),
        ({"type": "float", "name": "a", "high": "big"}, r"high = 'big' is not a finite number"),
        ({"type": "ordinal", "name": "a", "values": {"x": 1}}, r"values must be a non-empty list"),
        ({"type": "int", "name": ["a"], "low": 1}, r"Int name \['a'\] is not a string \(list\)"),
    ],
)
def test_param_from_dict_names_the_field(data, match):
    with pytest.raises(SpaceError, match=match):
        param_from_dict(data, "parameters[3]")


def test_param_from_dict_round_trips_every_type():
    for p in (Int("a", 1, 10**12, log=True), PowerOfTwo("b", 2, 64), Ordinal("c", [1, 2.5, "x"]),
              Choice("d", ["bf16", True]), Bool("e"), Float("f", 1e-5, 1e-1, log=True)):
        assert param_from_dict(p.to_dict()) == p


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4)
    | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12,
)
_PARAM_DICTS = st.fixed_dictionaries(
    {"type": st.sampled_from(["int", "power_of_two", "ordinal", "choice", "bool", "float", "x"]),
     "name": st.sampled_from(["a", "b_2", "", "1a", "if"]) | _JSON},
    optional={"low": _JSON, "high": _JSON, "log": _JSON, "values": _JSON, "extra": _JSON},
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_PARAM_DICTS, _JSON))
def test_param_from_dict_gives_a_parameter_or_a_space_error(data):
    try:
        p = param_from_dict(data)
    except SpaceError as err:
        assert err.hint and len(str(err)) < 1_000
    else:
        assert isinstance(p, Parameter)
        assert param_from_dict(p.to_dict()) == p


def test_brief_never_prints_huge_values():
    assert brief(10**5000) == "<an int of 16,610 bits>"
    assert len(brief(["x" * 10**6] * 10**4)) < 400
    nested: list = []
    for _ in range(10_000):
        nested = [nested]
    assert len(brief(nested)) < 100
