"""Shared fixtures: small spaces and a store in a temporary folder."""

from __future__ import annotations

import os

import pytest

# Tests never write the user's cache (the CPU peak-FLOP/s micro-benchmark cache, for instance).
os.environ.setdefault("CUBICML_LAB_CACHE_DIR", os.path.join(os.path.dirname(__file__), ".cache"))


@pytest.fixture
def tiny_space():
    """A small mixed space with a constant, a derived value and constraints (20 valid configs)."""
    import cubicml_lab as cml

    return cml.Space(
        [cml.PowerOfTwo("tp", 1, 8), cml.PowerOfTwo("pp", 1, 8),
         cml.Choice("recompute", ["none", "full"])],
        constants={"world_size": 8},
        derived={"dp": "world_size // (tp * pp)"},
        constraints=["tp * pp <= world_size"],
    )


@pytest.fixture
def tmp_store(tmp_path):
    """A fresh SQLite trial store in a temporary folder."""
    from cubicml_lab.store import TrialStore

    store = TrialStore(tmp_path / "lab.sqlite")
    yield store
    store.close()
