"""An analytical MODEL of LLM training at cluster scale: the physics, and tables generated from it.

Everything here is a **model, not a measurement**. Two faces of one physics:

* :class:`LLMTrainingModel` (defined in :mod:`cubicml_lab.physics`, whose docstring gives every
  formula and its source, and re-exported here with :class:`GPUSpec`, :class:`PhysicsConstants`,
  :data:`GPUS`, :data:`PRECISIONS`, :data:`KNOBS`, :data:`FACTS`, :data:`TERMS` and
  :func:`table_physics`): a user points it at their own job and asks for the cost terms, step
  time, throughput and peak memory per GPU of a configuration of the knobs Megatron-LM, NeMo and
  DeepSpeed users tune, under the user's own column names and values.
* :func:`llm_cluster_model`: enumerates every valid 3D-parallel configuration of a GPT-style
  decoder on ``n_gpus`` GPUs and evaluates it through an :class:`LLMTrainingModel`; configurations
  whose predicted memory exceeds the GPU's are ``"oom"``. The result is a
  :class:`~cubicml_lab.datasets.Dataset` a search benchmark replays through
  :class:`~cubicml_lab.search.TableObjective`. With ``constants=PhysicsConstants().perturbed(seed)``
  the table comes from deliberately different constants, so that a prior built with the default
  constants can be judged on a table it did not generate. Never quote its numbers as speeds of
  real hardware.

* **Noise** (tables only): each step time is multiplied by ``exp(N(0, noise^2))`` (default
  ``noise = 0.015``, i.e. ~1.5%), drawn from ``seed`` in table order, so a replay is not
  noise-free. Memory is noise-free. ``noise=0`` gives the bare model.

Example:
    >>> from cubicml_lab.analytical import LLMTrainingModel, llm_cluster_model
    >>> job = LLMTrainingModel(layers=40, hidden=5120, heads=40, seq_len=2048, vocab=32000,
    ...                        global_batch=1024, n_gpus=64, gpu="H100-80GB")
    >>> round(job.memory_gib({"tp": 4, "pp": 2}))
    43
    >>> ds = llm_cluster_model(n_gpus=64, model="13b")
    >>> ds.source
    'analytical model (not measured)'
    >>> 3000 <= len(ds.table) <= 30000, bool((ds.table.status == "oom").any())
    (True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ._bounds import check_count
from ._params import brief
from .datasets import Dataset
from .errors import ConfigError
from .physics import (FACTS, GPUS, GPUS_PER_NODE, KNOBS, PRECISIONS, TERMS, GPUSpec,
                      LLMTrainingModel, PhysicsConstants, table_physics)
from .space import Bool, Choice, Ordinal, PowerOfTwo, Space

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FACTS", "GPUS", "KNOBS", "MODELS", "PRECISIONS", "TERMS", "GPUSpec",
           "LLMTrainingModel", "ModelShape", "PhysicsConstants", "llm_cluster_model",
           "table_physics"]

#: Vocabulary size of the generated tables (Llama-2's).
VOCAB_SIZE = 32000
#: Width of one attention head in the generated tables (n_heads = hidden / HEAD_DIM).
HEAD_DIM = 128


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """One decoder shape: ``hidden`` width and ``n_layers`` (heads of width :data:`HEAD_DIM`)."""

    hidden: int
    n_layers: int

    @property
    def n_heads(self) -> int:
        """Attention heads."""
        return self.hidden // HEAD_DIM

    @property
    def n_params(self) -> int:
        """Parameters: ``L (12 h^2 + 13 h)`` in the layers, ``2 V h`` untied embeddings."""
        return self.n_layers * (12 * self.hidden**2 + 13 * self.hidden) + \
            2 * VOCAB_SIZE * self.hidden


#: Model sizes, each three shapes of about the same parameter count (within ~4%): the ``hidden``
#: knob trades width against depth.
MODELS: dict[str, tuple[ModelShape, ...]] = {
    "7b": (ModelShape(hidden=3072, n_layers=56), ModelShape(hidden=4096, n_layers=32),
           ModelShape(hidden=5120, n_layers=20)),
    "13b": (ModelShape(hidden=4096, n_layers=64), ModelShape(hidden=5120, n_layers=40),
            ModelShape(hidden=6144, n_layers=28)),
    "30b": (ModelShape(hidden=6144, n_layers=72), ModelShape(hidden=7168, n_layers=52),
            ModelShape(hidden=8192, n_layers=40)),
    "70b": (ModelShape(hidden=7168, n_layers=104), ModelShape(hidden=8192, n_layers=80),
            ModelShape(hidden=12288, n_layers=36)),
    # GPT-3 175B's shape (Brown et al., 2020: 96 layers, hidden 12288, 96 heads) first
    "175b": (ModelShape(hidden=12288, n_layers=96), ModelShape(hidden=11264, n_layers=112),
             ModelShape(hidden=14336, n_layers=72)),
}

_OBJECTIVE = "tokens_per_s_per_gpu"


# --------------------------------------------------------------------- tables from the model
def llm_cluster_model(n_gpus: int = 64, model: str = "13b", gpu: str = "H100-80GB", seed: int = 0,
                      *, seq_len: int = 2048, global_batch_seqs: int = 1024,
                      noise: float = 0.015,
                      constants: PhysicsConstants | None = None) -> Dataset:
    """Every valid training configuration of an LLM on a GPU cluster, with MODELLED speed/memory.

    Not a measurement: see the module docstring for every formula and its source. Each row is
    evaluated by an :class:`LLMTrainingModel` of the job (the ``hidden`` knob and its layer
    count per row), so the table and a prior built from that model share one physics.

    Args:
        n_gpus: Cluster size (8 GPUs per node), e.g. 64 or 256.
        model: One of :data:`MODELS` ("7b", "13b", "30b", "70b", "175b").
        gpu: One of :data:`GPUS` ("H100-80GB", "A100-80GB", "A100-40GB", "H200").
        seed: Seed of the multiplicative step-time noise.
        seq_len: Tokens per sequence.
        global_batch_seqs: Sequences per optimizer step (fixed; grad_accum follows).
        noise: Standard deviation of the log step-time noise (0.015 ~ 1.5%; 0: none).
        constants: The physics' constants; e.g. ``PhysicsConstants().perturbed(1)`` for a table
            whose details differ from what a default :class:`LLMTrainingModel` predicts.

    Returns:
        A :class:`~cubicml_lab.datasets.Dataset` named "llm_cluster_model": one row per valid
        configuration of its (constrained) ``space``, status "ok" or "oom", objective
        ``tokens_per_s_per_gpu`` (NaN when oom), and the columns ``step_time_s``,
        ``peak_mem_gib`` (also for oom rows), ``mfu`` (0-1), ``dp``, ``grad_accum``, ``n_layers``,
        ``n_heads``, ``n_params_b`` (billions), ``bubble_fraction``, ``tp_comm_s``,
        ``dp_comm_exposed_s`` and ``optimizer_s`` (per step).

    Raises:
        ConfigError: On an unknown model or GPU, or a size that is not a positive integer.

    Example:
        >>> ds = llm_cluster_model(n_gpus=64, model="7b", noise=0.0)
        >>> ds.knobs[:3], ds.objective
        (['hidden', 'tp', 'pp'], 'tokens_per_s_per_gpu')
        >>> all(ds.space.contains(c) for c in ds.configs()[:100])
        True
    """
    _check_args(n_gpus, model, gpu, seed, seq_len, global_batch_seqs, noise)
    import pandas as pd

    spec, shapes = GPUS[gpu], MODELS[model]
    space = _space(n_gpus, shapes, seq_len, global_batch_seqs)
    df = pd.DataFrame(space.enumerate())
    physics = LLMTrainingModel(
        layers=shapes[0].n_layers, hidden=shapes[0].hidden, heads=shapes[0].n_heads,
        seq_len=seq_len, vocab=VOCAB_SIZE, global_batch=global_batch_seqs, n_gpus=n_gpus,
        gpu=spec, gpus_per_node=GPUS_PER_NODE, constants=constants)
    df = _evaluate(df, shapes, physics, np.random.default_rng(seed), noise)
    n_oom = int((df["status"] == "oom").sum())
    shape_text = ", ".join(f"h{s.hidden}xL{s.n_layers}" for s in shapes)
    which = "default constants" if constants in (None, PhysicsConstants()) else \
        f"constants {constants}"
    notes = (f"ANALYTICAL MODEL, NOT MEASURED: {model} GPT-style decoder (shapes {shape_text}, "
             f"about {shapes[0].n_params / 1e9:.1f}B parameters, vocabulary {VOCAB_SIZE}, "
             f"heads of {HEAD_DIM}) trained on {n_gpus} {spec.name} ({GPUS_PER_NODE} per node), "
             f"seq {seq_len}, global batch {global_batch_seqs} sequences, bf16 + Adam. "
             "Step time and memory from closed-form formulas: FLOPs and pipeline bubble after "
             "Narayanan et al. (2021, Megatron-LM), activation memory and sequence parallelism "
             "after Korthikanti et al. (2022), ZeRO sharding after Rajbhandari et al. (2020); "
             "see cubicml_lab.analytical's docstring for each formula and constant "
             f"({which}). "
             f"Multiplicative lognormal step-time noise sigma = {noise} (seed {seed}). "
             f"{len(df)} valid configurations (every one of the space), {n_oom} out of memory "
             f"(predicted peak above {spec.memory_gib} GiB). Unlike the measured datasets, the "
             "space carries the validity constraints, so space.enumerate() == configs().")
    return Dataset(name="llm_cluster_model", space=space, table=df, objective=_OBJECTIVE,
                   knobs=list(space.names), source="analytical model (not measured)", notes=notes)


def _check_args(n_gpus: Any, model: Any, gpu: Any, seed: Any, seq_len: Any,
                global_batch_seqs: Any, noise: Any) -> None:
    if not isinstance(model, str) or model not in MODELS:
        raise ConfigError(f"model = {brief(model)} is not one of {list(MODELS)}",
                          hint="add a tuple of ModelShape to cubicml_lab.analytical.MODELS")
    if not isinstance(gpu, str) or gpu not in GPUS:
        raise ConfigError(f"gpu = {brief(gpu)} is not one of {list(GPUS)}",
                          hint="add a GPUSpec to cubicml_lab.analytical.GPUS")
    for name, value, low, high in (("n_gpus", n_gpus, 1, 1 << 20), ("seq_len", seq_len, 1, 1 << 24),
                                   ("global_batch_seqs", global_batch_seqs, 1, 1 << 30),
                                   ("seed", seed, 0, 2**63 - 1)):
        check_count(name, value, low=low, high=high, error=ConfigError)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or \
            not 0 <= noise <= 10 or not math.isfinite(noise):
        raise ConfigError(f"noise = {brief(noise)} must be a finite number from 0 to 10",
                          hint="e.g. 0.015 (1.5%), or 0 for the bare model")


def _space(n_gpus: int, shapes: tuple[ModelShape, ...], seq_len: int,
           global_batch_seqs: int) -> Space:
    """The knobs and the validity constraints (what Megatron-DeepSpeed would accept)."""
    n_layers = str(shapes[-1].n_layers)
    for shape in reversed(shapes[:-1]):  # "64 if hidden == 4096 else (40 if ... else 28)"
        n_layers = f"({shape.n_layers} if hidden == {shape.hidden} else {n_layers})"
    return Space(
        [Ordinal("hidden", sorted(s.hidden for s in shapes)), PowerOfTwo("tp", 1, 8),
         PowerOfTwo("pp", 1, 16), Ordinal("virtual_stages", [1, 2, 4]),
         PowerOfTwo("micro_batch", 1, 16), Choice("recompute", ["none", "selective", "full"]),
         Ordinal("zero_stage", [0, 1, 2, 3]), Bool("sequence_parallel")],
        constants={"n_gpus": n_gpus, "global_batch_seqs": global_batch_seqs,
                   "seq_len": seq_len},
        derived={"dp": "n_gpus // (tp * pp)",
                 "grad_accum": "global_batch_seqs // max(dp * micro_batch, 1)",
                 "n_layers": n_layers},
        constraints=[
            "n_gpus % (tp * pp) == 0",                       # the degrees tile the cluster
            "global_batch_seqs % (dp * micro_batch) == 0",   # whole micro-batches per step
            "n_layers % (pp * virtual_stages) == 0",         # whole layers per (virtual) stage
            "pp > 1 or virtual_stages == 1",                 # interleaving needs a pipeline
            "virtual_stages == 1 or grad_accum % pp == 0",   # Megatron's interleaving rule
            "tp > 1 or not sequence_parallel",               # sequence parallelism splits over tp
            "dp > 1 or zero_stage == 0",                     # ZeRO shards over dp
            "pp == 1 or zero_stage <= 1",                    # DeepSpeed: ZeRO-2/3 exclude pipelines
        ],
    )


def _evaluate(df: pd.DataFrame, shapes: tuple[ModelShape, ...], physics: LLMTrainingModel,
              rng: np.random.Generator, noise: float) -> pd.DataFrame:
    """Add the modelled columns to the table of configurations, through ``physics``."""
    layers_of = {sh.hidden: sh.n_layers for sh in shapes}
    layers = df["hidden"].map(layers_of)
    res = physics.evaluate_frame(df.assign(layers=layers))
    draws = rng.lognormal(0.0, noise, len(df)) if noise > 0 else np.ones(len(df))
    step = res["step_time_s"].to_numpy() * draws
    n_gpus, gbs, s = (physics.facts[k] for k in ("n_gpus", "global_batch", "seq_len"))
    tokens = gbs * s / step / n_gpus
    ok = res["peak_mem_gib"].to_numpy() <= physics.memory_limit_gib
    h = df["hidden"].to_numpy(np.float64)
    L = layers.to_numpy(np.float64)

    def where_ok(x: Any) -> np.ndarray:
        return np.where(ok, x, np.nan)

    out = df.copy()
    out[_OBJECTIVE] = where_ok(tokens)
    out["status"] = np.where(ok, "ok", "oom").astype(object)
    out["step_time_s"] = where_ok(step)
    out["peak_mem_gib"] = res["peak_mem_gib"].to_numpy()
    out["mfu"] = where_ok(res["mfu"].to_numpy() * res["step_time_s"].to_numpy() / step)
    out["dp"] = res["dp"].to_numpy().astype(np.int64)
    out["grad_accum"] = res["grad_accum"].to_numpy().astype(np.int64)
    out["n_layers"] = L.astype(np.int64)
    out["n_heads"] = (h / HEAD_DIM).astype(np.int64)
    out["n_params_b"] = (L * (12 * h * h + 13 * h) + 2 * VOCAB_SIZE * h) / 1e9
    out["bubble_fraction"] = res["bubble_fraction"].to_numpy()
    out["tp_comm_s"] = where_ok(res["tp_comm_all_s"].to_numpy())
    out["dp_comm_exposed_s"] = where_ok(res["dp_comm"].to_numpy())
    out["optimizer_s"] = where_ok(res["optimizer"].to_numpy())
    return out
