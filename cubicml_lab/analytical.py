"""An analytical MODEL of LLM training at cluster scale: a large search space with no hardware.

Everything here is a **model, not a measurement**. :func:`llm_cluster_model` enumerates every
valid 3D-parallel configuration of a GPT-style decoder (tensor, pipeline and data parallelism,
micro-batch, activation recompute, ZeRO stage, sequence parallelism, interleaved pipeline
schedule, model shape) on ``n_gpus`` GPUs and predicts, with closed-form formulas, each one's
per-GPU peak memory and step time. Configurations whose predicted memory exceeds the GPU's are
``"oom"``. The result is a :class:`~cubicml_lab.datasets.Dataset` of several thousand rows that
a search benchmark can replay through :class:`~cubicml_lab.search.TableObjective`, at cluster
scale, in milliseconds. Use it to compare search strategies; never quote its numbers as speeds of
real hardware.

The formulas, per GPU, with ``s`` sequence length, ``b`` micro-batch, ``h`` hidden size, ``a``
heads, ``L`` layers, ``V`` vocabulary, ``t``/``p``/``d`` tensor/pipeline/data-parallel degrees,
``v`` virtual pipeline stages, ``m`` micro-batches per step (grad_accum):

* **FLOPs** (Narayanan et al., 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", SC'21, section 5.1): per layer and micro-batch, the forward pass is
  ``24 b s h^2 + 4 b s^2 h``, the backward twice that; the output layer is ``2 b s h V`` forward.
  Full recompute adds one forward (+~33%); selective recompute adds the attention core
  ``4 b s^2 h`` (Korthikanti et al., 2022). MFU counts model FLOPs only (no recompute).
* **Compute time**: GEMM FLOPs / (peak * efficiency), where efficiency grows with the per-GPU
  GEMM size ``w = b s h / t`` as ``e_max * w / (w + 5e5)`` (small GEMMs underuse the GPU), plus
  memory-bound element-wise work (layer norm, dropout, residual, GeLU, softmax) at 70% of HBM
  bandwidth. Without sequence parallelism the layer-norm/dropout/residual part is replicated on
  every tensor-parallel rank; with it, it is split ``t`` ways (Korthikanti et al., 2022).
* **Tensor-parallel communication** (Narayanan et al., 2021): 2 all-reduces of ``2 b s h`` bytes per
  layer in the forward pass and 2 in the backward (+2 with full recompute), over NVLink (tp is at
  most 8 = one node), not overlapped. Sequence parallelism swaps each for a reduce-scatter plus an
  all-gather of the same volume. A ring all-reduce of ``M`` bytes over ``k`` ranks takes
  ``2 (k-1)/k M / bandwidth + latency``.
* **Pipeline** (Narayanan et al., 2021): a step takes ``(m + (p-1)/v) (t_mb + 2 v t_p2p)``, i.e. the
  1F1B bubble ``(p-1)/m`` shrinks ``v``-fold with the interleaved schedule, which in exchange sends
  ``v`` times more point-to-point messages (``2 b s h / t`` bytes each, scatter-gather). ``t_mb`` is
  the slowest stage's time per micro-batch: its ``L/p`` layers plus the output layer and loss.
  Ranks are ordered tp, dp, pp (innermost first), 8 GPUs per node.
* **Data parallelism / ZeRO** (Rajbhandari et al., 2020, "ZeRO", SC'20): bf16 gradients of the
  rank's ``P/(t p)`` parameters. Stage 0: one all-reduce per step; stage 1: reduce-scatter + an
  all-gather of the updated parameters; stage 2: a reduce-scatter per micro-batch (DeepSpeed
  reduces gradients at every micro-step) + the all-gather; stage 3: per micro-batch, two parameter
  all-gathers (forward, backward) and a gradient reduce-scatter. Over NVLink when the dp group fits
  in a node (``t d <= 8``), else over the inter-node network. A fraction (80%) of the
  communication can hide behind the backward pass it overlaps with: exposed time
  ``max(c - 0.8 w, 0.2 c)`` for communication ``c`` and compute window ``w``.
* **Optimizer**: Adam is memory-bound, 32 bytes of traffic per parameter of the rank's optimizer
  shard.
* **Memory** (Rajbhandari et al., 2020; Korthikanti et al., 2022, "Reducing Activation
  Recomputation in Large Transformer Models", arXiv:2205.05198, Table 2): model states of
  ``Phi = P_stage / t`` parameters are ``16 Phi`` bytes for ZeRO-0 (bf16 parameters and gradients,
  fp32 master weights and Adam moments), ``4 Phi + 12 Phi/d`` for stage 1, ``2 Phi + 14 Phi/d``
  for stage 2, ``16 Phi/d`` plus two gathered layers for stage 3. Activations per layer and
  micro-batch: ``s b h (10 + 24/t + 5 a s/(h t))`` bytes without recompute,
  ``s b h (34/t + 5 a s/(h t))`` with sequence parallelism; selective recompute drops the
  ``5 a s/(h t)`` term; full recompute keeps only the layer input, ``2 s b h`` (``/t`` with sequence
  parallelism), plus one layer's working activations. The first pipeline stage holds ``min(p, m)``
  micro-batches in flight (1F1B), times ``1 + (p-1)/(p v)`` with interleaving; the output layer adds
  ``4 s b (h + V) / t``. Peak = 1.05 x (states + activations) + 2.5 GiB (CUDA context, NCCL and
  cuBLAS buffers); out of memory above the GPU's usable memory.
* **Noise**: each step time is multiplied by ``exp(N(0, noise^2))`` (default ``noise = 0.015``,
  i.e. ~1.5%), drawn from ``seed`` in table order, so a replay is not noise-free. Memory is
  noise-free. ``noise=0`` gives the bare model.

Attention is Megatron's unfused softmax (no FlashAttention), as in both papers, which is what makes
selective recompute worth having. Every constant above is a module-level name.

Example:
    >>> from cubicml_lab.analytical import llm_cluster_model
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

from .datasets import Dataset
from .errors import ConfigError
from .space import Bool, Choice, Ordinal, PowerOfTwo, Space

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GPUS", "MODELS", "GPUSpec", "ModelShape", "llm_cluster_model"]

#: Bytes of model state per parameter: bf16 parameter 2, bf16 gradient 2, fp32 Adam master+m+v 12.
PARAM_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
#: GEMM size ``b s h / t`` at which GEMMs reach half their best efficiency.
GEMM_HALF_SIZE = 5e5
#: Fraction of HBM bandwidth that memory-bound element-wise kernels reach.
ELEMENTWISE_EFFICIENCY = 0.7
#: Latency of one collective or point-to-point message, seconds.
COMM_LATENCY_S = 20e-6
#: Fraction of data-parallel communication that can hide behind the compute it overlaps with.
DP_OVERLAP = 0.8
#: Bytes of HBM traffic per parameter in one Adam step.
OPTIMIZER_TRAFFIC_BYTES = 32
#: Fixed time per step (launch, data loading, logging), seconds.
STEP_OVERHEAD_S = 0.02
#: Memory model: fragmentation factor and fixed reserve (CUDA context, NCCL, cuBLAS), GiB.
MEMORY_FRAGMENTATION, MEMORY_RESERVED_GIB = 1.05, 2.5
#: GPUs per node; tensor parallelism stays inside a node.
GPUS_PER_NODE = 8
#: Vocabulary size (Llama-2's).
VOCAB_SIZE = 32000
#: Width of one attention head (n_heads = hidden / HEAD_DIM).
HEAD_DIM = 128


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU kind as the model sees it (vendor datasheet numbers, rounded).

    Attributes:
        name: E.g. "H100-80GB".
        peak_tflops: Dense bf16 peak, TFLOP/s.
        memory_gib: Device memory a job can use, GiB.
        hbm_tb_s: HBM bandwidth, TB/s.
        nvlink_gb_s: All-reduce bus bandwidth inside a node, GB/s per GPU.
        internode_gb_s: All-reduce bus bandwidth across nodes, GB/s per GPU (one NIC per GPU).
        gemm_efficiency: Best fraction of peak a large bf16 GEMM reaches.
    """

    name: str
    peak_tflops: float
    memory_gib: float
    hbm_tb_s: float
    nvlink_gb_s: float
    internode_gb_s: float
    gemm_efficiency: float


#: GPU kinds :func:`llm_cluster_model` knows (InfiniBand NDR 400 Gb/s per H100, HDR 200 per A100).
GPUS: dict[str, GPUSpec] = {
    g.name: g for g in (
        GPUSpec(name="H100-80GB", peak_tflops=989.0, memory_gib=79.6, hbm_tb_s=3.35,
                nvlink_gb_s=360.0, internode_gb_s=45.0, gemm_efficiency=0.75),
        GPUSpec(name="A100-80GB", peak_tflops=312.0, memory_gib=79.2, hbm_tb_s=2.04,
                nvlink_gb_s=230.0, internode_gb_s=22.0, gemm_efficiency=0.80),
        GPUSpec(name="A100-40GB", peak_tflops=312.0, memory_gib=39.4, hbm_tb_s=1.56,
                nvlink_gb_s=230.0, internode_gb_s=22.0, gemm_efficiency=0.80),
    )
}


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


#: Model sizes, each three shapes of about the same parameter count (within ~3%): the ``hidden``
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
}

_OBJECTIVE = "tokens_per_s_per_gpu"


def llm_cluster_model(n_gpus: int = 64, model: str = "13b", gpu: str = "H100-80GB", seed: int = 0,
                      *, seq_len: int = 2048, global_batch_seqs: int = 1024,
                      noise: float = 0.015) -> Dataset:
    """Every valid training configuration of an LLM on a GPU cluster, with MODELLED speed/memory.

    Not a measurement: see the module docstring for every formula and its source.

    Args:
        n_gpus: Cluster size (8 GPUs per node), e.g. 64 or 256.
        model: One of :data:`MODELS` ("7b", "13b", "30b", "70b").
        gpu: One of :data:`GPUS` ("H100-80GB", "A100-80GB", "A100-40GB").
        seed: Seed of the multiplicative step-time noise.
        seq_len: Tokens per sequence.
        global_batch_seqs: Sequences per optimizer step (fixed; grad_accum follows).
        noise: Standard deviation of the log step-time noise (0.015 ~ 1.5%; 0: none).

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
    df = _evaluate(df, shapes, spec, n_gpus, seq_len, global_batch_seqs,
                   np.random.default_rng(seed), noise)
    n_oom = int((df["status"] == "oom").sum())
    shape_text = ", ".join(f"h{s.hidden}xL{s.n_layers}" for s in shapes)
    notes = (f"ANALYTICAL MODEL, NOT MEASURED: {model} GPT-style decoder (shapes {shape_text}, "
             f"about {shapes[0].n_params / 1e9:.1f}B parameters, vocabulary {VOCAB_SIZE}, "
             f"heads of {HEAD_DIM}) trained on {n_gpus} {spec.name} ({GPUS_PER_NODE} per node), "
             f"seq {seq_len}, global batch {global_batch_seqs} sequences, bf16 + Adam. "
             "Step time and memory from closed-form formulas: FLOPs and pipeline bubble after "
             "Narayanan et al. (2021, Megatron-LM), activation memory and sequence parallelism "
             "after Korthikanti et al. (2022), ZeRO sharding after Rajbhandari et al. (2020); "
             "see cubicml_lab.analytical's docstring for each formula and constant. "
             f"Multiplicative lognormal step-time noise sigma = {noise} (seed {seed}). "
             f"{len(df)} valid configurations (every one of the space), {n_oom} out of memory "
             f"(predicted peak above {spec.memory_gib} GiB). Unlike the measured datasets, the "
             "space carries the validity constraints, so space.enumerate() == configs().")
    return Dataset(name="llm_cluster_model", space=space, table=df, objective=_OBJECTIVE,
                   knobs=list(space.names), source="analytical model (not measured)", notes=notes)


def _check_args(n_gpus: Any, model: Any, gpu: Any, seed: Any, seq_len: Any,
                global_batch_seqs: Any, noise: Any) -> None:
    if model not in MODELS:
        raise ConfigError(f"model = {model!r} is not one of {list(MODELS)}",
                          hint="add a tuple of ModelShape to cubicml_lab.analytical.MODELS")
    if gpu not in GPUS:
        raise ConfigError(f"gpu = {gpu!r} is not one of {list(GPUS)}",
                          hint="add a GPUSpec to cubicml_lab.analytical.GPUS")
    for name, value, low in (("n_gpus", n_gpus, 1), ("seq_len", seq_len, 1),
                             ("global_batch_seqs", global_batch_seqs, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ConfigError(f"{name} = {value!r} must be an int >= {low}",
                              hint="e.g. n_gpus=64, seq_len=2048, global_batch_seqs=1024, seed=0")
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or \
            not math.isfinite(noise) or noise < 0:
        raise ConfigError(f"noise = {noise!r} must be a finite number >= 0",
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


def _exposed(comm: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Communication time left after hiding up to DP_OVERLAP of it behind ``window``."""
    return np.maximum(comm - DP_OVERLAP * window, (1 - DP_OVERLAP) * comm)


def _evaluate(df: pd.DataFrame, shapes: tuple[ModelShape, ...], gpu: GPUSpec, n_gpus: int,
              s: int, gbs: int, rng: np.random.Generator, noise: float) -> pd.DataFrame:
    """Add the modelled columns to the table of configurations (vectorised over rows)."""
    layers_of = {sh.hidden: sh.n_layers for sh in shapes}
    h = df["hidden"].to_numpy(np.float64)
    L = df["hidden"].map(layers_of).to_numpy(np.float64)
    a = h / HEAD_DIM
    t, p = df["tp"].to_numpy(np.float64), df["pp"].to_numpy(np.float64)
    v, b = df["virtual_stages"].to_numpy(np.float64), df["micro_batch"].to_numpy(np.float64)
    z = df["zero_stage"].to_numpy(np.int64)
    sp = df["sequence_parallel"].to_numpy(bool)
    rc = df["recompute"].to_numpy(object)
    d = n_gpus // (t * p)
    m = gbs / (d * b)
    V = float(VOCAB_SIZE)
    sbh = s * b * h
    peak = gpu.peak_tflops * 1e12
    hbm = gpu.hbm_tb_s * 1e12 * ELEMENTWISE_EFFICIENCY
    nvlink, internode = gpu.nvlink_gb_s * 1e9, gpu.internode_gb_s * 1e9

    # ---- memory (bytes per GPU of the worst stage)
    layer_params = 12 * h * h + 13 * h
    stage_params = L / p * layer_params + V * h * np.where(p == 1, 2, 1)
    phi = stage_params / t
    states = np.select(
        [z == 0, z == 1, z == 2],
        [(PARAM_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) * phi,
         (PARAM_BYTES + GRAD_BYTES) * phi + OPTIMIZER_BYTES * phi / d,
         PARAM_BYTES * phi + (GRAD_BYTES + OPTIMIZER_BYTES) * phi / d],
        (PARAM_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) * phi / d + 2 * PARAM_BYTES * layer_params / t)
    attn = 5 * a * s / (h * t)                         # softmax/dropout of the a s^2 scores
    act_none = sbh * np.where(sp, 34 / t + attn, 10 + 24 / t + attn)
    act_sel = sbh * np.where(sp, 34 / t, 10 + 24 / t)
    act_full = 2 * sbh / np.where(sp, t, 1)
    act_layer = np.select([rc == "none", rc == "selective"], [act_none, act_sel], act_full)
    working = np.select([rc == "none", rc == "selective"], [0.0, sbh * attn], act_none)
    in_flight = np.where(v > 1, L * (1 + (p - 1) / (p * v)), L / p * np.minimum(p, m))
    output = 4 * s * b * (h + V) / t
    peak_bytes = states + in_flight * act_layer + working + output
    peak_mem_gib = MEMORY_FRAGMENTATION * peak_bytes / 2**30 + MEMORY_RESERVED_GIB

    # ---- time per micro-batch on the slowest (last) pipeline stage
    w = b * s * h / t
    gemm_rate = peak * gpu.gemm_efficiency * w / (w + GEMM_HALF_SIZE)
    gemm_f = (24 * b * s * h * h + 4 * b * s * s * h) / t / gemm_rate
    elem_f = 2 * (16 * sbh / np.where(sp, t, 1) + 12 * sbh / t + 4 * a * s * s * b / t) / hbm
    all_reduce = np.where(t > 1, 2 * (t - 1) / t * 2 * sbh / nvlink + COMM_LATENCY_S, 0.0)
    tp_f = tp_b = 2 * all_reduce
    recompute = np.select(
        [rc == "none", rc == "selective"],
        [0.0, 4 * b * s * s * h / t / gemm_rate + 2 * 4 * a * s * s * b / t / hbm],
        gemm_f + elem_f + tp_f)
    layer_fwd, layer_bwd = gemm_f + elem_f + tp_f, 2 * (gemm_f + elem_f) + tp_b + recompute
    logits = 3 * 2 * b * s * h * V / t / gemm_rate + 4 * 4 * s * b * V / t / hbm
    t_mb = L / p * (layer_fwd + layer_bwd) + logits
    t_bwd_mb = L / p * layer_bwd
    tp_comm = m * L / p * (tp_f + tp_b + np.where(rc == "full", tp_f, 0.0))

    # ---- pipeline: bubble and point-to-point messages (ranks ordered tp, dp, pp)
    p2p_bw = np.where(t * d >= GPUS_PER_NODE, internode, nvlink)
    p2p = np.where(p > 1, 2 * sbh / t / p2p_bw + COMM_LATENCY_S, 0.0)
    pipeline = (m + (p - 1) / v) * (t_mb + 2 * v * p2p)
    bubble = (p - 1) / (v * m)

    # ---- data parallelism / ZeRO
    dp_bw = np.where(t * d <= GPUS_PER_NODE, nvlink, internode)
    grad_bytes = GRAD_BYTES * phi
    ring = np.where(d > 1, (d - 1) / d * grad_bytes / dp_bw + COMM_LATENCY_S, 0.0)  # RS or AG
    dp_comm = np.select(
        [z == 0, z == 1, z == 2],
        [_exposed(2 * ring, t_bwd_mb), _exposed(ring, t_bwd_mb) + ring,
         m * _exposed(ring, t_bwd_mb) + ring],
        m * _exposed(3 * ring, t_mb))
    optimizer = OPTIMIZER_TRAFFIC_BYTES * np.where(z >= 1, phi / d, phi) / hbm

    draws = rng.lognormal(0.0, noise, len(df)) if noise > 0 else np.ones(len(df))
    step = (pipeline + dp_comm + optimizer + STEP_OVERHEAD_S) * draws
    tokens = gbs * s / step / n_gpus
    flops_per_token = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    ok = peak_mem_gib <= gpu.memory_gib

    def where_ok(x: np.ndarray) -> np.ndarray:
        return np.where(ok, x, np.nan)

    out = df.copy()
    out[_OBJECTIVE] = where_ok(tokens)
    out["status"] = np.where(ok, "ok", "oom").astype(object)
    out["step_time_s"] = where_ok(step)
    out["peak_mem_gib"] = peak_mem_gib
    out["mfu"] = where_ok(tokens * flops_per_token / peak)
    out["dp"] = d.astype(np.int64)
    out["grad_accum"] = m.astype(np.int64)
    out["n_layers"] = L.astype(np.int64)
    out["n_heads"] = a.astype(np.int64)
    out["n_params_b"] = (L * layer_params + 2 * V * h) / 1e9
    out["bubble_fraction"] = bubble
    out["tp_comm_s"] = where_ok(tp_comm)
    out["dp_comm_exposed_s"] = where_ok(dp_comm)
    out["optimizer_s"] = where_ok(optimizer)
    return out
