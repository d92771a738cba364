"""Tests of cubicml_lab._expr: the bounded restricted evaluator against hostile expressions.

Every expression either gives a plain scalar within the size limits or is refused with a
SpaceError naming the limit, within a second and a bounded amount of memory.
"""

from __future__ import annotations

import sys
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cubicml_lab._expr import (
    MAX_DEPTH,
    MAX_INT_BITS,
    MAX_NODES,
    MAX_SOURCE_CHARS,
    MAX_STR_CHARS,
    Expr,
    check_value,
)
from cubicml_lab.errors import SpaceError

ENV = {"a": 3, "b": -2, "s": "ab", "t": 10**12, "f": 0.5}
#: Time and memory one expression may take, parse and evaluation together.
MAX_SECONDS, MAX_BYTES = 1.0, 64 * 2**20


def run_bounded(source: str, env: dict | None = None) -> object:
    """Parse and evaluate ``source``; return its value or the SpaceError, checking that it took
    under a second and 64 MiB and that any value is a scalar within the limits."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        out: object = Expr(source).evaluate(ENV if env is None else env)
    except SpaceError as err:
        out = err
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < MAX_SECONDS, f"{source[:60]!r} took {elapsed:.2f} s"
    assert peak < MAX_BYTES, f"{source[:60]!r} used {peak / 2**20:.0f} MiB"
    if not isinstance(out, SpaceError):
        assert type(out) in (int, float, bool, str), (source[:60], type(out))
        if type(out) is int:
            assert out.bit_length() <= MAX_INT_BITS
        if type(out) is str:
            assert len(out) <= MAX_STR_CHARS
    return out


@pytest.mark.parametrize(
    "source, match",
    [
        ("'x' * 10 ** 10", r"10,000,000,000 characters, more than the limit MAX_STR_CHARS = 10,"),
        ("s * t", r"2,000,000,000,000 characters, more than the limit MAX_STR_CHARS"),
        ("t * s", r"2,000,000,000,000 characters"),
        ("10 ** 10 ** 10", r"10 \*\* 10000000000 is refused: .*MAX_INT_BITS = 1,024"),
        ("2 ** (10 ** 9)", r"about 1,000,000,001 bits, more than the limit MAX_INT_BITS"),
        ("(2 ** 1000) ** 2", r"an int of 1,001 bits \*\* 2 is refused"),
        ("2 ** 1000 * 2 ** 1000", r"2,001 bits, more than the limit MAX_INT_BITS = 1,024"),
        ("1" * 400, r"the literal has 1,326 bits"),
        ("-" * 100_000 + "1", r"100,001 characters, more than the limit MAX_SOURCE_CHARS = 4,096"),
        ("-" * 4_000 + "1", r"nests too deeply|MAX_DEPTH"),
        ("+".join(["a"] * 2_000), r"3,999 parts .* more than the limit MAX_NODES = 1,000"),
        ("-" * 150 + "a", r"nests 150 levels deep, more than the limit MAX_DEPTH = 100"),
        ("min(" * 120 + "a" + ", a)" * 120, r"nests 120 levels deep"),
        ("(" * 1_000 + "a" + ")" * 1_000, r"does not parse: too many nested parentheses"),
        ("'%2000000000d' % a", r"string formatting, which is refused"),
        ("(-8) ** 0.5", r"complex"),
        ("10.0 ** 400", r"OverflowError"),
        ("t ** 100 / 3", r"about 3,901 bits"),
    ],
)
def test_hostile_expressions_are_refused_quickly_naming_the_limit(source, match):
    out = run_bounded(source)
    assert isinstance(out, SpaceError), f"{source[:60]!r} gave {out!r}"
    assert out.hint, "every refusal says how to fix it"
    assert len(str(out)) < 600, "a refusal never prints the huge value itself"
    import re

    assert re.search(match, out.message), out.message


def test_limits_are_the_documented_values():
    assert (MAX_SOURCE_CHARS, MAX_NODES, MAX_DEPTH, MAX_INT_BITS, MAX_STR_CHARS) == \
        (4_096, 1_000, 100, 1_024, 10_000)


def test_values_just_inside_the_limits_still_work():
    assert run_bounded("2 ** 1023") == 2**1023
    assert run_bounded("'ab' * 5000") == "ab" * 5000
    assert run_bounded("+".join(["a"] * 100)) == 300  # depth 99: inside MAX_DEPTH
    assert run_bounded("-" * 99 + "a") == -3
    assert run_bounded("(2 ** 1000) / 3") == pytest.approx(2.0**1000 / 3)
    assert run_bounded("t * t * t > 10 ** 35") is True
    assert run_bounded("s + 'c' == 'abc' and f < 1") is True


def test_huge_environment_values_are_refused_when_read():
    with pytest.raises(SpaceError, match="1,330 bits, more than the limit MAX_INT_BITS"):
        Expr("a + 1").evaluate({"a": 2**1329})
    with pytest.raises(SpaceError, match="20,000 characters"):
        Expr("s == 'x'").evaluate({"s": "x" * 20_000})
    with pytest.raises(SpaceError, match=r"\[1, 2\] \(list\), not a number, string or bool"):
        Expr("a > 0").evaluate({"a": [1, 2]})


def test_a_deep_caller_stack_ends_in_space_error_not_recursion_error():
    expr = Expr("-" * 90 + "a")
    limit = sys.getrecursionlimit()

    def at_depth(n):
        return at_depth(n - 1) if n else expr.evaluate({"a": 1})

    with pytest.raises(SpaceError, match="RecursionError"):
        at_depth(limit - 100)


def test_check_value_names_where():
    assert check_value(7, "constant 'k'") == 7
    with pytest.raises(SpaceError, match="constant 'k': it has 1,025 bits"):
        check_value(2**1024, "constant 'k'")
    with pytest.raises(SpaceError, match="constant 'z'.*complex"):
        check_value(1j, "constant 'z'")


# -- property tests: generated hostile expressions ------------------------------------------------
_LEAVES = st.one_of(
    st.sampled_from(["a", "b", "s", "t", "f", "True", "0", "1", "-1", "2", "0.5", "1e308", "'x'",
                     "''", "'%d'", "10 ** 10", "2 ** 1023"]),
    st.integers(-(2**1100), 2**1100).map(str),  # huge literals, some beyond MAX_INT_BITS
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(alphabet="ab%d ", max_size=6).map(repr),
)
_BINOPS = ["+", "-", "*", "/", "//", "%", "**", "<", "<=", "==", "!=", "and", "or"]


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(_BINOPS), children)
        .map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["-", "+", "not "]), children).map("".join),
        st.tuples(st.sampled_from(["min", "max"]), st.lists(children, min_size=2, max_size=3))
        .map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        children.map(lambda c: f"abs({c})"),
        st.tuples(children, children, children).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
    )


_TREES = st.recursive(_LEAVES, _extend, max_leaves=30)
_CHAINS = st.one_of(
    st.tuples(st.sampled_from(["-", "+", "not ", "~"]), st.integers(1, 6_000))
    .map(lambda t: t[0] * t[1] + "a"),
    st.tuples(st.sampled_from(["+", "*", "**", "-", " and ", "<"]), st.integers(2, 3_000))
    .map(lambda t: t[0].join(["a"] * t[1])),
    st.tuples(st.sampled_from(["s", "t", "2", "'xy'"]), st.sampled_from(["*", "**"]),
              st.integers(2, 60)).map(lambda t: f" {t[1]} ".join([t[0]] * t[2])),
    st.integers(1, 3_000).map(lambda n: "(" * n + "a" + ")" * n),
    st.integers(1, 1_500).map(lambda n: "abs(" * n + "a" + ")" * n),
    st.tuples(st.sampled_from(["'x'", "s"]), st.integers(0, 30), st.integers(0, 30))
    .map(lambda t: f"{t[0]} * 10 ** {t[1]} * 10 ** {t[2]}"),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_TREES, _CHAINS, st.text(max_size=50)))
def test_any_expression_gives_a_value_or_a_space_error_in_bounded_time(source):
    out = run_bounded(source)  # raises on anything but a bounded value or a SpaceError
    event("refused" if isinstance(out, SpaceError) else f"value: {type(out).__name__}")
