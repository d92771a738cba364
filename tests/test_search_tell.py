"""Tests for Searcher.tell at its edge: a bad value is refused with a SearchError naming the
entry and the fix, and nothing is told (real searchers, no mocks)."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pytest

import cubicml_lab as cml
from cubicml_lab.errors import SearchError
from cubicml_lab.search import BayesianSearch, RandomSearch


@pytest.fixture
def space() -> cml.Space:
    return cml.Space([cml.PowerOfTwo("tp", 1, 4), cml.Int("micro_batch", 1, 4)])


def _told(s) -> tuple:
    return s.n_told, repr(s), s.history


@pytest.mark.parametrize("cls", [RandomSearch, BayesianSearch])
@pytest.mark.parametrize("values, status, pattern", [
    ({"throughput": 10**400}, "ok", r"values\['throughput'\] is an int of 1329 bits, too large"),
    ({"throughput": 1.0, "peak_mem_gib": 2**2000}, "ok", r"values\['peak_mem_gib'\] is an int"),
    ({"throughput": 2**1100}, "oom", r"values\['throughput'\] is an int of 1101 bits"),
    ({"throughput": True}, "ok", r"values\['throughput'\] = True is a bool, not a number"),
    ({"throughput": np.bool_(True)}, "ok", r"= True is a bool"),
    ({"throughput": 5.0, "fits": False}, "ok", r"values\['fits'\] = False is a bool"),
    ({"throughput": "nan"}, "ok", r"values\['throughput'\] = 'nan' is a str, not a number"),
    ({"throughput": "12.5"}, "ok", r"= '12.5' is a str, not a number"),
    ({"throughput": Decimal("NaN")}, "ok", r"is a Decimal, not a number"),
    ({"throughput": np.float32("inf")}, "ok", r"= np.float32\(inf\) is not a finite"),
    ({"throughput": float("-nan")}, "ok", r"= nan is not a finite number"),
    ({"throughput": None}, "ok", r"= None is a NoneType, not a number"),
    ({"throughput": [1.0]}, "ok", r"= \[1.0\] is a list, not a number"),
    ([("throughput", 1.0)], "ok", r"values = \[\('throughput', 1.0\)\] must be a dict"),
    (3.5, "failed", r"values = 3.5 must be a dict of metric name -> number, or None"),
    ("oom", "oom", r"values = 'oom' must be a dict"),
])
def test_bad_told_values_are_refused_and_nothing_is_told(cls, space, values, status, pattern):
    s = cls(space, seed=0)
    cfg = space.enumerate()[0]
    s.tell(space.enumerate()[1], {"throughput": 5.0})
    s.mark_pending(cfg)
    before = _told(s)
    with pytest.raises(SearchError, match=pattern) as info:
        s.tell(cfg, values, status=status)
    assert "hint:" in str(info.value)
    assert _told(s) == before
    assert cfg not in s.ask(len(space.enumerate()) - 2)  # still pending, so never asked


def test_numbers_of_every_kind_are_told_and_the_rest_ignored(space):
    s = RandomSearch(space, seed=0)
    cfg = space.enumerate()[0]
    s.tell(cfg, {"throughput": np.int64(7), "peak_mem_gib": np.float32(1.5), "mfu": math.nan,
                 "device": "cpu", "curve": [1.0, 2.0], "steps": 2**80})
    assert s.best() == (cfg, 7.0)
    assert s.history[-1]["values"] == {"throughput": 7.0, "peak_mem_gib": 1.5,
                                        "steps": float(2**80)}
    s.tell(space.enumerate()[1], {"throughput": math.nan, "mfu": math.inf}, status="failed")
    assert s.n_told == 2
