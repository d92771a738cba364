"""The physics of LLM training at cluster scale: step time, cost terms and memory of one job.

A **model, not a measurement**. :class:`LLMTrainingModel`: a user points it at their own job
(layers, hidden size, heads, sequence length, vocabulary, global batch, GPUs, a hardware profile,
precision) and asks, for one configuration of the knobs Megatron-LM, NeMo and DeepSpeed users
tune, for the seconds of each cost term of a step (:meth:`~LLMTrainingModel.cost_terms`), the step
time, the throughput and the peak memory per GPU (:meth:`~LLMTrainingModel.memory_gib`); with
``names=``/``values=`` it reads the user's own column names and values. Vectorised over a
DataFrame of candidates (:meth:`~LLMTrainingModel.cost_terms_frame`,
:meth:`~LLMTrainingModel.memory_gib_frame`) for a search's prior mean and feasibility model.
:func:`table_physics` gives the model of the public Megatron-DeepSpeed tables (Lucie-7B,
BLOOM-176B) with their columns mapped; :mod:`cubicml_lab.datasets` uses it as the Lucie tables'
cost model. The public face is :mod:`cubicml_lab.analytical`, which re-exports everything here and
adds the tables generated from this physics; this module sits below ``datasets`` in the import
layers so that both share one physics.

The formulas, per GPU, with ``s`` sequence length, ``b`` micro-batch, ``h`` hidden size, ``a``
heads, ``k`` KV heads, ``f`` FFN size, ``L`` layers, ``V`` vocabulary, ``t``/``p``/``d``
tensor/pipeline/data-parallel degrees, ``v`` virtual pipeline stages, ``m`` micro-batches per step
(grad_accum = global_batch / (d b)). Byte counts are for bf16; fp32 doubles the activation bytes,
fp8 runs GEMMs at the fp8 peak and keeps an extra 1-byte weight copy (:data:`PRECISIONS`).

* **FLOPs** (Narayanan et al., 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", SC'21, section 5.1): per layer and micro-batch, the forward pass is
  ``2 b s W + 4 b s^2 h`` with ``W = 2 h^2 + 2 h k h/a + 2 h f`` matmul weights (``3 h f`` with a
  gated MLP); for ``k = a``, ``f = 4h`` that is ``24 b s h^2 + 4 b s^2 h``. The backward pass is
  twice that; the output layer is ``2 b s h V`` forward. Full recompute adds one forward (+~33%);
  selective recompute adds the attention core ``4 b s^2 h`` (Korthikanti et al., 2022). MFU
  counts model FLOPs only (no recompute).
* **Compute time**: GEMM FLOPs / (peak * efficiency), where efficiency grows with the per-GPU
  GEMM size ``w = b s h / t`` as ``e_max * (w / (w + 5e5))^1`` (small GEMMs underuse the GPU),
  plus memory-bound element-wise work (layer norm, dropout, residual, GeLU, softmax) at 70% of HBM
  bandwidth. Without sequence parallelism the layer-norm/dropout/residual part is replicated on
  every tensor-parallel rank; with it, it is split ``t`` ways (Korthikanti et al., 2022).
* **Tensor-parallel communication** (Narayanan et al., 2021): 2 all-reduces of ``2 b s h`` bytes per
  layer in the forward pass and 2 in the backward (+2 with full recompute), over NVLink (over the
  inter-node network when ``t`` exceeds a node). Sequence parallelism swaps each for a
  reduce-scatter plus an all-gather of the same volume. A ring all-reduce of ``M`` bytes over
  ``n`` ranks takes ``2 (n-1)/n M / bandwidth + latency``. With ``tp_overlap`` up to 70% of it
  hides behind the layer's GEMMs (Megatron/Transformer Engine userbuffers).
* **Pipeline** (Narayanan et al., 2021): a step takes ``(m + (p-1)/v) (t_mb + 2 v t_p2p)``, i.e. the
  1F1B bubble ``(p-1)/m`` shrinks ``v``-fold with the interleaved schedule, which in exchange sends
  ``v`` times more point-to-point messages (``2 b s h / t`` bytes each, scatter-gather). ``t_mb`` is
  the slowest stage's time per micro-batch: its ``L/p`` layers plus the output layer and loss.
  Ranks are ordered tp, dp, pp (innermost first), ``gpus_per_node`` GPUs per node.
* **Data parallelism / ZeRO** (Rajbhandari et al., 2020, "ZeRO", SC'20): gradients of the
  rank's ``P/(t p)`` parameters. Stage 0: one all-reduce per step; stage 1 (also Megatron's
  ``distributed_optimizer``): reduce-scatter + an all-gather of the updated parameters; stage 2: a
  reduce-scatter per micro-batch (DeepSpeed reduces gradients at every micro-step) + the
  all-gather; stage 3: per micro-batch, two parameter all-gathers (forward, backward) and a
  gradient reduce-scatter. Over NVLink when the dp group fits in a node (``t d <= 8``), else over
  the inter-node network. With ``dp_overlap`` a fraction (80%) of the communication hides behind
  the backward pass it overlaps with: exposed time ``max(c - 0.8 w, 0.2 c)`` for communication
  ``c`` and compute window ``w``; without it, all of ``c`` is exposed.
* **Optimizer**: Adam is memory-bound, 32 bytes of traffic per parameter of the rank's optimizer
  shard; offloaded (``offload_optimizer``, Ren et al., 2021, "ZeRO-Offload") it runs on the host at
  ``GPUSpec.host_adam_params_s`` and the gradients go down, the parameters come back over PCIe.
* **Offload traffic**: ``offload_weights`` (ZeRO-Infinity) streams the stage's weights from the
  host over PCIe twice per micro-batch; ``offload_activations`` sends the stored activations down
  and back; half of either hides behind the micro-batch's compute.
* **Memory** (Rajbhandari et al., 2020; Korthikanti et al., 2022, "Reducing Activation
  Recomputation in Large Transformer Models", arXiv:2205.05198, Table 2): model states of
  ``Phi = P_stage / t`` parameters are ``16 Phi`` bytes for ZeRO-0 (bf16 parameters and gradients,
  fp32 master weights and Adam moments), ``4 Phi + 12 Phi/d`` for stage 1, ``2 Phi + 14 Phi/d``
  for stage 2, ``16 Phi/d`` plus two gathered layers for stage 3 (gradients accumulated in
  fp32, ``fp32_grads``, take 4 bytes instead of 2, and so does their DP traffic); offloaded
  weights leave two layers, an offloaded optimizer none of its 12 bytes. Activations per layer
  and micro-batch:
  ``s b h (10 + 24/t + 5 a s/(h t))`` bytes without recompute (the 24 is ``8 + 8 k/a + 4 f/h``,
  ``x 1.5`` on the MLP part for a gated MLP), ``s b h (34/t + 5 a s/(h t))`` with sequence
  parallelism; selective recompute drops the ``5 a s/(h t)`` term; full recompute keeps only the
  layer input, ``2 s b h`` (``/t`` with sequence parallelism), plus one layer's working
  activations. The first pipeline stage holds ``min(p, m)`` micro-batches in flight (1F1B), times
  ``1 + (p-1)/(p v)`` with interleaving; offloaded activations leave two layers' worth; the output
  layer adds ``4 s b (h + V) / t``. Peak = 1.05 x (states + activations) + 2.5 GiB (CUDA context,
  NCCL and cuBLAS buffers); out of memory above the GPU's usable memory.

Attention is Megatron's unfused softmax, as in both papers, which is what makes selective recompute
worth having; ``flash_attention=True`` (FlashAttention, PyTorch's SDPA) drops the stored scores and
their element-wise traffic. Every constant above is a field of :class:`PhysicsConstants`
(efficiencies, overlaps, memory reserve, per-step overhead) or of :class:`GPUSpec` (hardware).

Example:
    >>> from cubicml_lab.physics import LLMTrainingModel
    >>> job = LLMTrainingModel(layers=40, hidden=5120, heads=40, seq_len=2048, vocab=32000,
    ...                        global_batch=1024, n_gpus=64, gpu="H100-80GB",
    ...                        names={"tensor_par": "tp"})
    >>> terms = job.cost_terms({"tensor_par": 4, "pp": 2, "micro_batch": 2})
    >>> sorted(terms) == sorted(job.term_names), round(job.memory_gib({"tensor_par": 4, "pp": 2}))
    (True, 43)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FACTS", "GPUS", "GPUS_PER_NODE", "KNOBS", "PRECISIONS", "TERMS", "GPUSpec",
           "LLMTrainingModel", "PhysicsConstants", "table_physics"]

#: Bytes of model state per parameter in bf16: parameter 2, gradient 2, fp32 Adam master+m+v 12.
PARAM_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
#: GPUs per node by default (and in the generated tables, where TP stays inside a node).
GPUS_PER_NODE = 8
#: The cost terms of a step, seconds each; a step takes their sum (:meth:`LLMTrainingModel.
#: step_time_s`). ``pipeline`` is the bubble plus point-to-point messages, ``offload`` the
#: exposed host traffic, ``overhead`` the fixed time per step (launch, data, logging).
TERMS = ("compute", "memory_bound", "tp_comm", "pipeline", "dp_comm", "optimizer", "recompute",
         "offload", "overhead")


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU kind as the model sees it (vendor datasheet numbers, rounded; see :data:`GPUS`).

    Attributes:
        name: E.g. "H100-80GB".
        peak_tflops: Dense bf16/fp16 peak, TFLOP/s.
        memory_gib: Device memory a job can use, GiB.
        hbm_tb_s: HBM bandwidth, TB/s.
        nvlink_gb_s: All-reduce bus bandwidth inside a node, GB/s per GPU.
        internode_gb_s: All-reduce bus bandwidth across nodes, GB/s per GPU (one NIC per GPU).
        gemm_efficiency: Best fraction of peak a large GEMM reaches.
        fp8_tflops: Dense fp8 peak, TFLOP/s; 0 where the GPU has no fp8 tensor cores (fp8 then
            runs at the bf16 peak).
        fp32_tflops: Peak of fp32 matmuls (TF32 on NVIDIA), TFLOP/s; 0: half of ``peak_tflops``.
        nvlink_latency_s: Latency of one collective or message inside a node, seconds.
        internode_latency_s: Latency of one collective or message across nodes, seconds.
        pcie_gb_s: Host <-> device bandwidth per GPU (offloading), GB/s.
        host_adam_params_s: Parameters per second the host's CPU Adam updates, per GPU's share.
    """

    name: str
    peak_tflops: float
    memory_gib: float
    hbm_tb_s: float
    nvlink_gb_s: float
    internode_gb_s: float
    gemm_efficiency: float
    fp8_tflops: float = 0.0
    fp32_tflops: float = 0.0
    nvlink_latency_s: float = 20e-6
    internode_latency_s: float = 20e-6
    pcie_gb_s: float = 25.0
    host_adam_params_s: float = 0.25e9


# Sources. Peaks, HBM and memory: NVIDIA datasheets (A100 Tensor Core GPU datasheet, 2021:
# 312 TFLOP/s bf16 dense, 1.555 TB/s (40GB) and 2.039 TB/s (80GB); H100 SXM5 datasheet, 2023:
# 989 TFLOP/s bf16 dense, 1979 fp8 dense, 3.35 TB/s; H200 SXM datasheet, 2024: same peaks, 4.8
# TB/s, 141 GB), the usable memory as nvidia-smi reports it (H100 81559 MiB, H200 143771 MiB).
# Bus bandwidths: NVLink 3 (600 GB/s per A100) and 4 (900 GB/s per H100/H200) reach ~230 and ~360
# GB/s all-reduce bus bandwidth in nccl-tests on DGX A100/H100; InfiniBand HDR (200 Gb/s = 25
# GB/s, A100) and NDR (400 Gb/s = 50 GB/s, H100/H200) one NIC per GPU, at ~90% in nccl-tests.
# Latencies: nccl-tests small-message all_reduce on one 8-GPU node is ~15-25 us, across nodes
# over InfiniBand ~25-50 us (NCCL ring/tree). PCIe: Gen4 x16 32 GB/s (A100), Gen5 x16 64 GB/s
# (H100/H200), ~80% achieved. Best GEMM efficiency: Megatron-LM reaches 0.75-0.8 of peak on
# large bf16 GEMMs (Narayanan et al., 2021). Host Adam: an estimate (DeepSpeed CPU-Adam, Ren et
# al., 2021, "ZeRO-Offload", of the order of 2e9 parameters/s on a 2-socket host shared by 8 GPUs).
#: GPU kinds the model knows.
GPUS: dict[str, GPUSpec] = {
    g.name: g for g in (
        GPUSpec(name="H100-80GB", peak_tflops=989.0, memory_gib=79.6, hbm_tb_s=3.35,
                nvlink_gb_s=360.0, internode_gb_s=45.0, gemm_efficiency=0.75,
                fp8_tflops=1979.0, nvlink_latency_s=20e-6, internode_latency_s=30e-6,
                pcie_gb_s=50.0, host_adam_params_s=0.25e9),
        GPUSpec(name="A100-80GB", peak_tflops=312.0, memory_gib=79.2, hbm_tb_s=2.04,
                nvlink_gb_s=230.0, internode_gb_s=22.0, gemm_efficiency=0.80,
                nvlink_latency_s=20e-6, internode_latency_s=30e-6, pcie_gb_s=25.0,
                host_adam_params_s=0.25e9),
        GPUSpec(name="A100-40GB", peak_tflops=312.0, memory_gib=39.4, hbm_tb_s=1.56,
                nvlink_gb_s=230.0, internode_gb_s=22.0, gemm_efficiency=0.80,
                nvlink_latency_s=20e-6, internode_latency_s=30e-6, pcie_gb_s=25.0,
                host_adam_params_s=0.25e9),
        GPUSpec(name="H200", peak_tflops=989.0, memory_gib=140.4, hbm_tb_s=4.8,
                nvlink_gb_s=360.0, internode_gb_s=45.0, gemm_efficiency=0.75,
                fp8_tflops=1979.0, nvlink_latency_s=20e-6, internode_latency_s=30e-6,
                pcie_gb_s=50.0, host_adam_params_s=0.25e9),
    )
}


@dataclass(frozen=True)
class _Precision:
    """Bytes per parameter of the weights the GEMMs read, the gradients and the optimizer states
    (fp32 master weights and Adam moments), and activation bytes relative to bf16."""

    weight: float
    grad: float
    optimizer: float
    activation: float


#: Precisions the model knows. fp8 keeps bf16 weights plus an fp8 copy (Transformer Engine);
#: fp32 (a CPU run) keeps no separate master copy.
PRECISIONS: dict[str, _Precision] = {
    "bf16": _Precision(PARAM_BYTES, GRAD_BYTES, OPTIMIZER_BYTES, 1.0),
    "fp16": _Precision(PARAM_BYTES, GRAD_BYTES, OPTIMIZER_BYTES, 1.0),
    "fp8": _Precision(PARAM_BYTES + 1, GRAD_BYTES, OPTIMIZER_BYTES, 1.0),
    "fp32": _Precision(4, 4, 8, 2.0),
}


@dataclass(frozen=True, kw_only=True)
class PhysicsConstants:
    """The model's constants that are not hardware facts; :meth:`perturbed` draws other ones.

    Attributes:
        gemm_half_size: GEMM size ``b s h / t`` at which GEMMs reach half their best efficiency.
        gemm_curve_power: Exponent of the efficiency curve ``e_max (w / (w + half))^power``.
        gemm_efficiency_scale: Multiplies the GPU's best GEMM efficiency (capped at 0.95).
        elementwise_efficiency: Fraction of HBM bandwidth memory-bound kernels reach (0-1).
        latency_scale: Multiplies the GPU's communication latencies.
        dp_overlap: Fraction of data-parallel communication that can hide behind compute (0-1).
        tp_overlap: Fraction of tensor-parallel communication that ``tp_overlap`` hides (0-1).
        offload_overlap: Fraction of offload traffic that hides behind compute (0-1).
        optimizer_traffic_bytes: Bytes of HBM traffic per parameter in one Adam step.
        memory_fragmentation: Peak memory = fragmentation x (states + activations) + reserve.
        memory_reserved_gib: Fixed reserve (CUDA context, NCCL and cuBLAS buffers), GiB.
        step_overhead_s: Fixed time per step (launch, data loading, logging), seconds.
    """

    gemm_half_size: float = 5e5
    gemm_curve_power: float = 1.0
    gemm_efficiency_scale: float = 1.0
    elementwise_efficiency: float = 0.7
    latency_scale: float = 1.0
    dp_overlap: float = 0.8
    tp_overlap: float = 0.7
    offload_overlap: float = 0.5
    optimizer_traffic_bytes: float = 32.0
    memory_fragmentation: float = 1.05
    memory_reserved_gib: float = 2.5
    step_overhead_s: float = 0.02

    def perturbed(self, seed: int, spread: float = 1.0) -> PhysicsConstants:
        """Other constants, drawn reproducibly from ``seed``: what a real cluster might have.

        Each factor is drawn uniformly in log space (fractions in their own range): GEMM
        half-size x0.4-2.5, curve power 0.7-1.5, efficiency scale 0.85-1.1, element-wise
        efficiency 0.5-0.85, latencies x0.5-3, overlaps 0.5-0.95 (tp 0.4-0.9, offload 0.3-0.8),
        optimizer traffic x0.8-1.5, fragmentation 1.0-1.15, reserve 1.5-5 GiB, overhead
        x0.5-2. ``spread`` (0-1) shrinks every range towards these defaults.

        Example:
            >>> a = PhysicsConstants().perturbed(1)
            >>> a == PhysicsConstants().perturbed(1), a == PhysicsConstants()
            (True, False)
        """
        rng = np.random.default_rng(seed)

        def factor(low: float, high: float) -> float:
            return float(np.exp(spread * rng.uniform(np.log(low), np.log(high))))

        def towards(value: float, low: float, high: float) -> float:
            return float(value + spread * (rng.uniform(low, high) - value))

        return replace(
            self, gemm_half_size=self.gemm_half_size * factor(0.4, 2.5),
            gemm_curve_power=self.gemm_curve_power * factor(0.7, 1.5),
            gemm_efficiency_scale=self.gemm_efficiency_scale * factor(0.85, 1.1),
            elementwise_efficiency=towards(self.elementwise_efficiency, 0.5, 0.85),
            latency_scale=self.latency_scale * factor(0.5, 3.0),
            dp_overlap=towards(self.dp_overlap, 0.5, 0.95),
            tp_overlap=towards(self.tp_overlap, 0.4, 0.9),
            offload_overlap=towards(self.offload_overlap, 0.3, 0.8),
            optimizer_traffic_bytes=self.optimizer_traffic_bytes * factor(0.8, 1.5),
            memory_fragmentation=towards(self.memory_fragmentation, 1.0, 1.15),
            memory_reserved_gib=towards(self.memory_reserved_gib, 1.5, 5.0),
            step_overhead_s=self.step_overhead_s * factor(0.5, 2.0))


# ------------------------------------------------------------------------ the knob vocabulary
_DEGREE, _BOOL, _SIZE = "a number >= 1", "a bool", "a positive integer"
#: What each knob accepts: a description, or the tuple of its values.
_KNOB_VALUES: dict[str, str | tuple[Any, ...]] = {
    "tp": _DEGREE, "pp": _DEGREE, "dp": _DEGREE, "micro_batch": _DEGREE,
    "virtual_stages": _DEGREE, "recompute": ("none", "selective", "full"),
    "sequence_parallel": _BOOL, "tp_overlap": _BOOL, "dp_overlap": _BOOL,
    "distributed_optimizer": _BOOL, "zero_stage": (0, 1, 2, 3), "offload_weights": _BOOL,
    "offload_activations": _BOOL, "offload_optimizer": _BOOL, "precision": tuple(PRECISIONS),
}
#: The knobs :class:`LLMTrainingModel` understands (its fixed vocabulary).
KNOBS: tuple[str, ...] = tuple(_KNOB_VALUES)
#: Facts of the job that a config may also carry per row (e.g. a table whose rows differ in
#: model width); they then override the job's.
FACTS: tuple[str, ...] = ("layers", "hidden", "heads", "kv_heads", "ffn", "seq_len", "vocab",
                          "global_batch", "n_gpus")
_ACCEPTS: dict[str, str | tuple[Any, ...]] = {**_KNOB_VALUES, **{f: _DEGREE for f in FACTS}}
#: Knob values a job takes when neither its config nor ``defaults=`` sets them (precision: the
#: job's; dp: ``n_gpus / (tp pp)``).
_BUILTIN_DEFAULTS: dict[str, Any] = {
    "tp": 1, "pp": 1, "micro_batch": 1, "virtual_stages": 1, "recompute": "none",
    "sequence_parallel": False, "tp_overlap": False, "dp_overlap": True,
    "distributed_optimizer": False, "zero_stage": 0, "offload_weights": False,
    "offload_activations": False, "offload_optimizer": False}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and \
        not isinstance(value, (bool, np.bool_))


def _accepts(name: str, value: Any) -> bool:
    """Whether ``value`` is a valid value of knob or fact ``name``."""
    kind = _ACCEPTS[name]
    if kind == _DEGREE:
        return _is_number(value) and math.isfinite(value) and value >= 1
    if kind == _BOOL:
        return isinstance(value, (bool, np.bool_)) or (_is_number(value) and value in (0, 1))
    if name == "zero_stage":
        return _is_number(value) and value in kind
    return isinstance(value, str) and value in kind


def _describe(name: str) -> str:
    kind = _ACCEPTS[name]
    return kind if isinstance(kind, str) else "one of " + ", ".join(map(repr, kind))


def _typed(name: str, values: list[Any]) -> np.ndarray:
    """Valid values of ``name`` as the array type the physics computes with."""
    kind = _ACCEPTS[name]
    if kind == _DEGREE:
        return np.asarray(values, dtype=np.float64)
    if kind == _BOOL:
        return np.asarray([bool(v) for v in values], dtype=bool)
    if name == "zero_stage":
        return np.asarray(values, dtype=np.int64)
    return np.asarray(values, dtype=object)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# ------------------------------------------------------------------------ the model of one job
class LLMTrainingModel:
    """Step time, cost terms and peak memory of one LLM training job, per configuration.

    Built from the job's facts; a configuration holds the knobs (:data:`KNOBS`: ``tp``, ``pp``,
    ``dp``, ``micro_batch``, ``virtual_stages``, ``recompute`` none/selective/full,
    ``sequence_parallel``, ``tp_overlap``, ``dp_overlap``, ``distributed_optimizer``,
    ``zero_stage`` 0-3, ``offload_weights``, ``offload_activations``, ``offload_optimizer``,
    ``precision`` bf16/fp16/fp8, and fp32 for a CPU run), under the user's own names. A knob left
    out takes the job's default (``defaults=``, else tp = pp = micro_batch = virtual_stages = 1,
    no recompute, ZeRO-0, dp overlap on, the rest off, the job's precision); ``dp`` left out is
    ``n_gpus / (tp pp)``. A config may also carry a job fact (:data:`FACTS`) per row. Keys it
    does not know are ignored (for a GP's kernel to model) and named once in a warning.

    Args:
        layers: Transformer layers.
        hidden: Hidden size.
        heads: Attention heads (must divide ``hidden``).
        seq_len: Tokens per sequence.
        vocab: Vocabulary size (untied input and output embeddings unless
            ``tied_embeddings``).
        global_batch: Sequences per optimizer step.
        n_gpus: GPUs of the job.
        gpu: A name of :data:`GPUS` ("A100-40GB", "A100-80GB", "H100-80GB", "H200") or a
            :class:`GPUSpec` (e.g. a CPU described as one).
        kv_heads: Key/value heads (grouped-query attention); default ``heads``.
        ffn: MLP hidden size; default ``4 * hidden``.
        gated_mlp: A gated MLP (SwiGLU, three ``hidden x ffn`` matrices), as Llama's.
        tied_embeddings: The output layer shares the input embedding's weights (GPT-2).
        flash_attention: Fused attention (FlashAttention, PyTorch's SDPA): the ``s x s``
            scores are neither stored (no ``5 a s / (h t)`` activation term) nor moved through
            HBM, and selective recompute has nothing left to drop.
        gpus_per_node: GPUs per node: groups within a node talk over NVLink.
        precision: The job's precision, "bf16", "fp16", "fp8" or "fp32".
        fp32_grads: Precisions (of :data:`PRECISIONS`) whose gradients are accumulated and
            reduced in fp32: 4 bytes per parameter instead of 2 in memory and in the
            data-parallel gradient traffic (the parameter all-gathers of ZeRO keep their
            size). Megatron-LM does so for bf16 (``--accumulate-allreduce-grads-in-fp32``,
            implied by ``--bf16``; its distributed-optimizer table counts 18 bytes per
            parameter for "bf16 param, fp32 grads"), as does DeepSpeed's bf16 optimizer; e.g.
            ``fp32_grads=("bf16",)``. Default: none.
        names: User name -> vocabulary name (a knob or a fact), e.g. ``{"tensor_par": "tp"}``.
        values: User (or vocabulary) name -> {user value -> vocabulary value}, e.g.
            ``{"activation_recompute": {"attn_only": "selective", True: "full"}}``; values
            not listed pass through unchanged.
        defaults: Knob -> the job's default value, e.g. ``{"sequence_parallel": True}``.
        constants: The model's constants; default :class:`PhysicsConstants()`.
        per_token: Give :meth:`cost_terms` in seconds per token and GPU (the step's seconds x
            ``n_gpus / (global_batch seq_len)``) instead of per step: for an objective in
            tokens/s per GPU over configs whose GPU count or batch differ.

    Raises:
        ConfigError: On a bad fact, an unknown GPU or precision, or a bad ``names``/``values``/
            ``defaults`` mapping (the message names the entry and the fix).

    Example:
        >>> job = LLMTrainingModel(layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000,
        ...                        global_batch=512, n_gpus=64, gpu="A100-80GB",
        ...                        names={"activation_recompute": "recompute"},
        ...                        values={"activation_recompute": {True: "full", False: "none"}})
        >>> config = {"tp": 2, "pp": 4, "micro_batch": 1, "activation_recompute": True}
        >>> round(job.step_time_s(config), 2) == round(sum(job.cost_terms(config).values()), 2)
        True
        >>> job.memory_gib(config) < job.memory_gib({**config, "activation_recompute": False})
        True
    """

    #: Names of :meth:`cost_terms`' values (``GPPredictor.cost_shares`` columns).
    term_names: tuple[str, ...] = TERMS

    def __init__(self, *, layers: int, hidden: int, heads: int, seq_len: int, vocab: int,
                 global_batch: int, n_gpus: int, gpu: str | GPUSpec,
                 kv_heads: int | None = None, ffn: int | None = None, gated_mlp: bool = False,
                 tied_embeddings: bool = False, flash_attention: bool = False,
                 gpus_per_node: int = GPUS_PER_NODE,
                 precision: str = "bf16", fp32_grads: Sequence[str] = (),
                 names: Mapping[str, str] | None = None,
                 values: Mapping[str, Mapping[Any, Any]] | None = None,
                 defaults: Mapping[str, Any] | None = None,
                 constants: PhysicsConstants | None = None, per_token: bool = False) -> None:
        facts = {"layers": layers, "hidden": hidden, "heads": heads,
                 "kv_heads": heads if kv_heads is None else kv_heads,
                 "ffn": 4 * hidden if _is_number(hidden) and ffn is None else ffn,
                 "seq_len": seq_len, "vocab": vocab, "global_batch": global_batch,
                 "n_gpus": n_gpus, "gpus_per_node": gpus_per_node}
        for name, value in facts.items():
            if not _is_number(value) or value < 1 or value != int(value):
                raise ConfigError(f"LLMTrainingModel({name}={value!r}): must be {_SIZE}",
                                  hint="give the job's facts, e.g. layers=40, hidden=5120, "
                                       "heads=40, seq_len=2048, vocab=32000, global_batch=1024, "
                                       "n_gpus=64")
        if hidden % heads or heads % facts["kv_heads"]:
            raise ConfigError(f"LLMTrainingModel: heads = {heads} must divide hidden = {hidden} "
                              f"and kv_heads = {facts['kv_heads']} must divide heads",
                              hint="e.g. hidden=4096, heads=32, kv_heads=8")
        self.facts: dict[str, int] = {k: int(v) for k, v in facts.items()}
        self.gpu = _gpu(gpu)
        if precision not in PRECISIONS:
            raise ConfigError(f"LLMTrainingModel(precision={precision!r}) is not one of "
                              f"{list(PRECISIONS)}", hint="e.g. precision='bf16'")
        if isinstance(fp32_grads, str) or not all(p in PRECISIONS for p in fp32_grads):
            raise ConfigError(f"LLMTrainingModel(fp32_grads={fp32_grads!r}) is not a tuple of "
                              f"precisions among {list(PRECISIONS)}",
                              hint="e.g. fp32_grads=('bf16',) for Megatron-LM in bf16")
        self.fp32_grads = tuple(fp32_grads)
        if constants is not None and not isinstance(constants, PhysicsConstants):
            raise ConfigError(f"constants = {constants!r:.80} is not a PhysicsConstants",
                              hint="constants=PhysicsConstants(...) or .perturbed(seed)")
        self.gated_mlp, self.tied_embeddings = bool(gated_mlp), bool(tied_embeddings)
        self.flash_attention = bool(flash_attention)
        self.per_token = bool(per_token)
        self.precision = precision
        self.constants = constants or PhysicsConstants()
        self.names = _check_names(names)
        self.values = _check_values(values, self.names)
        self.defaults = {**_BUILTIN_DEFAULTS, "precision": precision,
                         **_check_defaults(defaults, self.names, self.values)}
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        f = self.facts
        return (f"<LLMTrainingModel: {f['layers']} layers x hidden {f['hidden']}, seq "
                f"{f['seq_len']}, batch {f['global_batch']}, {f['n_gpus']} x {self.gpu.name}, "
                f"{self.precision}>")

    @property
    def memory_limit_gib(self) -> float:
        """Memory per GPU a job can use, GiB (the GPU profile's)."""
        return self.gpu.memory_gib

    # -- one configuration
    def resolve(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The configuration in the vocabulary: every knob and fact, defaults filled in.

        Example:
            >>> job = LLMTrainingModel(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000,
            ...                        global_batch=16, n_gpus=8, gpu="H100-80GB")
            >>> job.resolve({"tp": 2})["dp"], job.resolve({"tp": 2})["recompute"]
            (4, 'none')
        """
        x = self._inputs(_one_row(config), 1, frame=False)
        out = {k: v[0].item() if hasattr(v[0], "item") else v[0] for k, v in x.items()
               if k in _ACCEPTS}
        return {k: int(v) if isinstance(v, float) and v.is_integer() else v
                for k, v in out.items()}

    def evaluate(self, config: Mapping[str, Any]) -> dict[str, float]:
        """Every modelled quantity of one configuration (a row of :meth:`evaluate_frame`)."""
        out = self._physics(self._inputs(_one_row(config), 1, frame=False))
        return {k: float(v[0]) for k, v in out.items()}

    def cost_terms(self, config: Mapping[str, Any]) -> dict[str, float]:
        """Seconds of each cost term of one step (:data:`TERMS`); their sum is the step time.

        For ``BayesianSearch(cost_model=...)`` / ``GPPredictor(cost_model=...)``; per token and
        GPU with ``per_token=True``. About 0.3 ms a call: over thousands of candidates use
        :meth:`cost_terms_frame` (50,000 rows in ~0.1 s).
        """
        out = self._physics(self._inputs(_one_row(config), 1, frame=False))
        scale = self._scale(out)
        return {k: float(out[k][0] * scale[0]) for k in TERMS}

    def step_time_s(self, config: Mapping[str, Any]) -> float:
        """Seconds per optimizer step: the sum of the per-step cost terms (overlaps taken)."""
        return self.evaluate(config)["step_time_s"]

    def throughput(self, config: Mapping[str, Any]) -> float:
        """Tokens per second of the whole job (``global_batch * seq_len / step_time_s``)."""
        return self.evaluate(config)["tokens_per_s"]

    def memory_gib(self, config: Mapping[str, Any]) -> float:
        """Peak memory per GPU (the most loaded pipeline stage), GiB."""
        return self.evaluate(config)["peak_mem_gib"]

    # -- many configurations at once
    def evaluate_frame(self, configs: pd.DataFrame | Any) -> pd.DataFrame:
        """Every modelled quantity of each row of ``configs`` (a DataFrame or a list of dicts).

        Returns:
            DataFrame with ``configs``' index, one row per configuration: the :data:`TERMS`
            (seconds per step), ``step_time_s``, ``tokens_per_s`` (job), ``tokens_per_s_per_gpu``,
            ``peak_mem_gib``, ``mfu`` (0-1, model FLOPs over the bf16 peak),
            ``bubble_fraction``, ``dp``, ``grad_accum`` (micro-batches per step), the bytes
            each GPU sends per step: ``tp_comm_bytes`` (ring all-reduces, or reduce-scatters
            plus all-gathers, of the layer activations), ``dp_comm_bytes`` (gradients and,
            with ZeRO >= 1, parameters), ``p2p_bytes`` (pipeline activations and their
            gradients), and ``tp_comm_all_s`` (TP seconds including full recompute's).
        """
        import pandas as pd

        df = configs if isinstance(configs, pd.DataFrame) else pd.DataFrame(list(configs))
        out = self._physics(self._inputs({c: df[c] for c in df.columns}, len(df), frame=True))
        return pd.DataFrame(out, index=df.index)

    def cost_terms_frame(self, configs: pd.DataFrame | Any) -> pd.DataFrame:
        """:meth:`cost_terms` of every row: a DataFrame with one column per term (seconds)."""
        out = self.evaluate_frame(configs)
        return out[list(TERMS)].mul(self._scale(out).to_numpy(), axis=0)

    def _scale(self, out: Any) -> Any:
        """1, or the GPU-seconds per token that turn a step's seconds into per-token ones."""
        if not self.per_token:
            return out["step_time_s"] * 0 + 1
        return 1 / (out["step_time_s"] * out["tokens_per_s_per_gpu"])

    def memory_gib_frame(self, configs: pd.DataFrame | Any) -> pd.Series:
        """:meth:`memory_gib` of every row, GiB, as a Series with ``configs``' index."""
        return self.evaluate_frame(configs)["peak_mem_gib"]

    # -- internals
    def _inputs(self, data: Mapping[str, Any], n: int, *, frame: bool) -> dict[str, np.ndarray]:
        """Vocabulary arrays of length ``n`` from user columns: renamed, values mapped and
        checked, unknown keys warned about, defaults and derived values filled in."""
        given: dict[str, np.ndarray] = {}
        source: dict[str, str] = {}
        unknown = []
        for column, data_column in data.items():
            target = self.names.get(column, column)
            if target not in _ACCEPTS:
                unknown.append(column)
                continue
            if target in given:
                raise ConfigError(f"config keys {source[target]!r} and {column!r} both give "
                                  f"{target!r}", hint="drop one of them, or map it elsewhere "
                                                      "with names=")
            source[target] = str(column)
            given[target] = self._column(column, target, data_column, frame)
        self._warn(unknown)
        return self._filled(given, n)

    def _column(self, column: str, target: str, data: Any, frame: bool) -> np.ndarray:
        mapping = self.values.get(column, self.values.get(target, {}))
        if frame:
            import pandas as pd

            codes, uniques = pd.factorize(data, use_na_sentinel=False)
            uniques = [u.item() if isinstance(u, np.generic) else u for u in uniques]
        else:
            codes, uniques = None, list(data)
        mapped = [mapping.get(u, u) if _hashable(u) else u for u in uniques]
        for raw, value in zip(uniques, mapped):
            if not _accepts(target, value):
                via = f" (-> {value!r} through values=)" if value is not raw else ""
                named = "" if target == column else f" (names= maps it onto {target!r})"
                raise ConfigError(f"config {column!r} = {raw!r}{via}{named} is not a valid "
                                  f"{target!r}: it must be {_describe(target)}",
                                  hint=f"map it with values={{{column!r}: {{{raw!r}: ...}}}}")
        typed = _typed(target, mapped)
        return typed if codes is None else typed[codes]

    def _warn(self, unknown: list[str]) -> None:
        new = [str(c) for c in unknown if str(c) not in self._warned]
        if new:
            self._warned.update(new)
            warnings.warn(f"LLMTrainingModel ignores config key(s) {new}: not in its vocabulary "
                          f"({', '.join(KNOBS)}; facts {', '.join(FACTS)}) and not mapped by "
                          "names=; a GP's kernel still models them", UserWarning, stacklevel=4)

    def _filled(self, given: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        job = self.facts
        x = dict(given)
        for fact in FACTS:
            if fact not in x:
                x[fact] = np.full(n, float(job[fact]))
        if "heads" not in given and "hidden" in given:  # keep the job's head width and ratios
            x["heads"] = x["hidden"] * job["heads"] / job["hidden"]
        if "ffn" not in given and "hidden" in given:
            x["ffn"] = x["hidden"] * job["ffn"] / job["hidden"]
        if "kv_heads" not in given and ("heads" in given or "hidden" in given):
            x["kv_heads"] = x["heads"] * job["kv_heads"] / job["heads"]
        for knob in KNOBS:
            if knob not in x and knob != "dp":
                x[knob] = _typed(knob, [self.defaults[knob]]).repeat(n)
        if "dp" not in x:
            x["dp"] = x["n_gpus"] / (x["tp"] * x["pp"])
        return x

    def _physics(self, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        arch = _Arch(gated_mlp=self.gated_mlp, tied=self.tied_embeddings,
                     flash=self.flash_attention, fp32_grads=self.fp32_grads)
        return _physics(x, self.gpu, self.constants, self.facts["gpus_per_node"], arch)


#: The names of :meth:`LLMTrainingModel.cost_terms`' values, readable from the bound method
#: (``GPPredictor`` reads ``cost_model.term_names``).
LLMTrainingModel.cost_terms.term_names = TERMS  # type: ignore[attr-defined]


def _one_row(config: Mapping[str, Any]) -> dict[str, list[Any]]:
    if not isinstance(config, Mapping):
        raise ConfigError(f"config = {config!r:.80} is not a dict",
                          hint="pass one configuration as a dict, many as a DataFrame to the "
                               "*_frame methods")
    return {k: [v] for k, v in config.items()}


def _gpu(gpu: Any) -> GPUSpec:
    if isinstance(gpu, GPUSpec):
        return gpu
    if gpu not in GPUS:
        raise ConfigError(f"gpu = {gpu!r} is not one of {list(GPUS)}",
                          hint="pick one, or pass a GPUSpec(...) describing yours")
    return GPUS[gpu]


def _as_mapping(arg: str, given: Any, example: str) -> Mapping[Any, Any]:
    """``given`` (None: empty) as the mapping argument ``arg`` of the model, else an error
    showing ``example``."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"{arg} = {given!r:.80} is not a dict", hint=f"{arg}={example}")
    return given


def _check_names(names: Any) -> dict[str, str]:
    names = _as_mapping("names", names, "{'tensor_par': 'tp'} maps your name onto the "
                                        "vocabulary")
    seen: dict[str, str] = {}
    for user, target in names.items():
        if target not in _ACCEPTS:
            raise ConfigError(f"names[{user!r}] = {target!r} is not a knob or fact of the "
                              "model", hint=f"map {user!r} onto one of {', '.join(KNOBS)} "
                                            f"(or facts {', '.join(FACTS)}), or leave it out "
                                            "of names= to let the GP model it")
        if target in seen:
            raise ConfigError(f"names[{seen[target]!r}] and names[{user!r}] both map onto "
                              f"{target!r}", hint="map each vocabulary name from one key")
        seen[target] = user
    return dict(names)


def _check_values(values: Any, names: Mapping[str, str]) -> dict[str, dict[Any, Any]]:
    values = _as_mapping("values", values, "{'activation_recompute': {'attn_only': "
                                           "'selective'}}")
    out = {}
    for user, mapping in values.items():
        target = names.get(user, user)
        if target not in _ACCEPTS:
            raise ConfigError(f"values[{user!r}]: {user!r} is neither a key of names= nor a knob "
                              "of the model", hint=f"add names={{{user!r}: <knob>}} or key "
                                                   f"values= by a knob: {', '.join(KNOBS)}")
        if not isinstance(mapping, Mapping):
            raise ConfigError(f"values[{user!r}] = {mapping!r:.80} is not a dict",
                              hint=f"values={{{user!r}: {{<your value>: <model value>}}}}")
        for raw, value in mapping.items():
            if not _accepts(target, value):
                raise ConfigError(f"values[{user!r}][{raw!r}] = {value!r} is not a valid "
                                  f"{target!r}: it must be {_describe(target)}",
                                  hint=f"map {raw!r} onto a valid value of {target!r}")
        out[user] = dict(mapping)
    return out


def _check_defaults(defaults: Any, names: Mapping[str, str],
                    values: Mapping[str, Mapping[Any, Any]]) -> dict[str, Any]:
    defaults = _as_mapping("defaults", defaults, "{'sequence_parallel': True}")
    out = {}
    for user, raw in defaults.items():
        knob = names.get(user, user)
        value = values.get(user, {}).get(raw, raw) if _hashable(raw) else raw
        if knob not in KNOBS or knob == "dp" or not _accepts(knob, value):
            raise ConfigError(f"defaults[{user!r}] = {raw!r} is not a valid default",
                              hint=f"give a knob of {', '.join(k for k in KNOBS if k != 'dp')} "
                                   "a valid value (dp follows from n_gpus / (tp pp))")
        out[knob] = value
    return out


# ------------------------------------------------------------------------------- the physics
def _exposed(comm: np.ndarray, window: np.ndarray, overlap: Any) -> np.ndarray:
    """Communication time left after hiding up to ``overlap`` of it behind ``window``."""
    return np.maximum(comm - overlap * window, (1 - overlap) * comm)


def _by_precision(precision: np.ndarray, **tables: Mapping[str, float]) -> dict[str, np.ndarray]:
    """``tables[name][precision]`` per row, for each table (one lookup per distinct value)."""
    kinds, rows = np.unique(precision.astype(str), return_inverse=True)
    return {name: np.asarray([table[k] for k in kinds], dtype=np.float64)[rows]
            for name, table in tables.items()}


@dataclass(frozen=True, kw_only=True)
class _Arch:
    """Architecture choices of the job that are not knobs."""

    gated_mlp: bool
    tied: bool
    flash: bool
    fp32_grads: tuple[str, ...] = ()


def _physics(x: dict[str, np.ndarray], gpu: GPUSpec, c: PhysicsConstants, gpus_per_node: int,
             arch: _Arch) -> dict[str, np.ndarray]:
    """Every modelled quantity, vectorised over the rows of the vocabulary arrays ``x``."""
    q = _shared(x, gpu, arch)
    q["act"] = _activations(x, q)
    memory = _memory(x, q, c)
    times = _times(x, q, gpu, c, gpus_per_node)
    step = sum(times[k] for k in TERMS)
    tokens = x["global_batch"] * x["seq_len"] / step
    return {**{k: times[k] for k in TERMS}, "step_time_s": step, "tokens_per_s": tokens,
            "tokens_per_s_per_gpu": tokens / x["n_gpus"], "peak_mem_gib": memory,
            "mfu": tokens / x["n_gpus"] * q["flops_per_token"] / (gpu.peak_tflops * 1e12),
            "bubble_fraction": (x["pp"] - 1) / (x["virtual_stages"] * q["m"]),
            "dp": x["dp"], "grad_accum": q["m"],
            **{k: times[k] for k in ("tp_comm_bytes", "dp_comm_bytes", "p2p_bytes",
                                     "tp_comm_all_s")}}


def _shared(x: dict[str, np.ndarray], gpu: GPUSpec, arch: _Arch) -> dict[str, np.ndarray]:
    """Shape, parameter and precision quantities both memory and time need."""
    h, a, k, f = x["hidden"], x["heads"], x["kv_heads"], x["ffn"]
    L, V, s, t = x["layers"], x["vocab"], x["seq_len"], x["tp"]
    kv_width = 2 * k * h / a
    matmul = h * (h + kv_width) + h * h + (3 if arch.gated_mlp else 2) * h * f  # 12 h^2
    layer_params = matmul + 7 * h + kv_width + f                           # + 13 h of biases
    embeddings = np.where(x["pp"] == 1, 1 if arch.tied else 2, 1)  # input and/or output
    stage_params = L / x["pp"] * layer_params + V * h * embeddings
    prec = x["precision"]
    fp32 = gpu.fp32_tflops or gpu.peak_tflops / 2
    peaks = {"bf16": gpu.peak_tflops, "fp16": gpu.peak_tflops,
             "fp8": gpu.fp8_tflops or gpu.peak_tflops, "fp32": fp32}
    per_precision = _by_precision(
        prec, pw={n: p.weight for n, p in PRECISIONS.items()},
        pg={n: 4 if n in arch.fp32_grads else p.grad for n, p in PRECISIONS.items()},
        pag={n: p.grad for n, p in PRECISIONS.items()},  # bytes of a ZeRO parameter gather
        po={n: p.optimizer for n, p in PRECISIONS.items()},
        pa={n: p.activation for n, p in PRECISIONS.items()},
        peak={n: v * 1e12 for n, v in peaks.items()})
    rc = x["recompute"]
    return {
        "matmul": matmul, "layer_params": layer_params, "phi": stage_params / t,
        "m": x["global_batch"] / (x["dp"] * x["micro_batch"]),
        "sbh": s * x["micro_batch"] * h,
        "z": np.maximum(x["zero_stage"], x["distributed_optimizer"].astype(np.int64)),
        "mlp_act": 4 * f / h * (1.5 if arch.gated_mlp else 1.0),
        "scores": 0.0 if arch.flash else 1.0,  # whether the s x s scores are materialised
        "flops_per_token": 6 * L * matmul + 12 * L * s * h + 6 * h * V,
        "rc_none": rc == "none", "rc_sel": rc == "selective", "rc_full": rc == "full",
        **per_precision,
    }


def _activations(x: dict[str, np.ndarray], q: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Activation bytes per layer and micro-batch kept for the backward pass, and working."""
    h, a, s, t = x["hidden"], x["heads"], x["seq_len"], x["tp"]
    sp, sbh, none, sel = x["sequence_parallel"], q["sbh"], q["rc_none"], q["rc_sel"]
    attn = q["scores"] * 5 * a * s / (h * t)           # softmax/dropout of the a s^2 scores
    split = 4 + 4 * x["kv_heads"] / a + q["mlp_act"]   # 24 for k = a, f = 4h
    kept = np.where(sp, (10 + split) / t, 10 + split / t)
    act_none, act_sel = sbh * (kept + attn), sbh * kept
    act_full = 2 * sbh / np.where(sp, t, 1)
    layer = np.where(none, act_none, np.where(sel, act_sel, act_full))
    working = np.where(none, 0.0, np.where(sel, sbh * attn, act_none))
    return {"layer": q["pa"] * layer, "working": q["pa"] * working}


def _memory(x: dict[str, np.ndarray], q: dict[str, np.ndarray],
            c: PhysicsConstants) -> np.ndarray:
    """Peak memory per GPU of the most loaded (first) pipeline stage, GiB."""
    t, p, d, v, z, phi = x["tp"], x["pp"], x["dp"], x["virtual_stages"], q["z"], q["phi"]
    gathered = 2 * q["pw"] * q["layer_params"] / t     # two layers' weights in flight
    weights = np.where(z == 3, q["pw"] * phi / d + gathered, q["pw"] * phi)
    weights = np.where(x["offload_weights"], gathered, weights)
    grads = q["pg"] * phi / np.where(z >= 2, d, 1)
    optimizer = np.where(x["offload_optimizer"], 0.0, q["po"] * phi / np.where(z >= 1, d, 1))
    act = q["act"]
    L = x["layers"]
    in_flight = np.where(v > 1, L * (1 + (p - 1) / (p * v)), L / p * np.minimum(p, q["m"]))
    in_flight = np.where(x["offload_activations"], np.minimum(in_flight, 2.0), in_flight)
    output = q["pa"] * 4 * x["seq_len"] * x["micro_batch"] * (x["hidden"] + x["vocab"]) / t
    total = weights + grads + optimizer + in_flight * act["layer"] + act["working"] + output
    return c.memory_fragmentation * total / 2**30 + c.memory_reserved_gib


def _links(gpu: GPUSpec, c: PhysicsConstants, inside: np.ndarray) -> tuple[np.ndarray, ...]:
    """(bandwidth bytes/s, latency s) of a group inside a node (NVLink) or across nodes."""
    return (np.where(inside, gpu.nvlink_gb_s, gpu.internode_gb_s) * 1e9,
            np.where(inside, gpu.nvlink_latency_s, gpu.internode_latency_s) * c.latency_scale)


def _layer_times(x: dict[str, np.ndarray], q: dict[str, np.ndarray], gpu: GPUSpec,
                 c: PhysicsConstants, gpn: int) -> dict[str, np.ndarray]:
    """Seconds per layer and micro-batch: GEMMs, element-wise work, TP traffic, recompute."""
    h, a, s, t, b = x["hidden"], x["heads"], x["seq_len"], x["tp"], x["micro_batch"]
    sp, sbh, pa = x["sequence_parallel"], q["sbh"], q["pa"]
    w = b * s * h / t
    best = min(gpu.gemm_efficiency * c.gemm_efficiency_scale, 0.95)
    rate = q["peak"] * best * (w / (w + c.gemm_half_size)) ** c.gemm_curve_power
    hbm = gpu.hbm_tb_s * 1e12 * c.elementwise_efficiency
    gemm = (2 * b * s * q["matmul"] + 4 * b * s * s * h) / t / rate
    elem = 2 * pa * (16 * sbh / np.where(sp, t, 1) + 3 * x["ffn"] / h * sbh / t +
                     q["scores"] * 4 * a * s * s * b / t) / hbm
    bw, lat = _links(gpu, c, t <= gpn)
    ar_bytes = np.where(t > 1, 2 * (t - 1) / t * 2 * pa * sbh, 0.0)  # sent per GPU, ring
    all_reduce = np.where(t > 1, ar_bytes / bw + lat, 0.0)
    overlap = np.where(x["tp_overlap"], c.tp_overlap, 0.0)
    tp_f, tp_b = _exposed(2 * all_reduce, gemm, overlap), _exposed(2 * all_reduce, 2 * gemm,
                                                                    overlap)
    recompute = np.where(q["rc_none"], 0.0, np.where(
        q["rc_sel"], q["scores"] * (4 * b * s * s * h / t / rate +
                                    2 * pa * 4 * a * s * s * b / t / hbm),
        gemm + elem + tp_f))
    V = x["vocab"]
    return {"gemm": gemm, "elem": elem, "tp_f": tp_f, "tp_b": tp_b, "recompute": recompute,
            "ar_bytes": ar_bytes,
            "logits_gemm": 3 * 2 * b * s * h * V / t / rate,
            "logits_elem": pa * 4 * 4 * s * b * V / t / hbm, "hbm": hbm}


def _times(x: dict[str, np.ndarray], q: dict[str, np.ndarray], gpu: GPUSpec,
           c: PhysicsConstants, gpn: int) -> dict[str, np.ndarray]:
    """Seconds per step of each term of :data:`TERMS` (and the TP traffic with recompute's)."""
    t, p, d, v, m, z = x["tp"], x["pp"], x["dp"], x["virtual_stages"], q["m"], q["z"]
    r = _layer_times(x, q, gpu, c, gpn)
    per_stage = x["layers"] / p
    bwd = per_stage * (2 * (r["gemm"] + r["elem"]) + r["tp_b"] + r["recompute"])
    t_mb = per_stage * (r["gemm"] + r["elem"] + r["tp_f"]) + bwd + r["logits_gemm"] + \
        r["logits_elem"]
    pcie, shard = gpu.pcie_gb_s * 1e9, q["phi"] / np.where(z >= 1, d, 1)
    streamed = np.where(x["offload_weights"], 2 * q["pw"] * q["phi"] / np.where(z == 3, d, 1),
                        0.0)
    stored = np.where(x["offload_activations"], 2 * per_stage * q["act"]["layer"], 0.0)
    offload_mb = _exposed((streamed + stored) / pcie, t_mb, c.offload_overlap)
    message = np.where(p > 1, 2 * q["pa"] * q["sbh"] / t, 0.0)  # scatter-gather activations
    bw, lat = _links(gpu, c, t * d < gpn)  # ranks ordered tp, dp, pp: next stage t*d away
    p2p = np.where(p > 1, message / bw + lat, 0.0)
    bw, lat = _links(gpu, c, t * d <= gpn)
    # one reduce-scatter (or all-gather) of the gradients (g) or parameters (w), per GPU
    ring_bytes = np.where(d > 1, (d - 1) / d * q["phi"], 0.0)
    g_bytes, w_bytes = q["pg"] * ring_bytes, q["pag"] * ring_bytes
    g, w = (np.where(d > 1, nbytes / bw + lat, 0.0) for nbytes in (g_bytes, w_bytes))
    ov = np.where(x["dp_overlap"], c.dp_overlap, 0.0)
    dp_comm = np.select(
        [z == 0, z == 1, z == 2],
        [_exposed(2 * g, bwd, ov), _exposed(g, bwd, ov) + w, m * _exposed(g, bwd, ov) + w],
        m * _exposed(g + 2 * w, t_mb, ov))
    host = x["offload_optimizer"]
    tp_comm = m * per_stage * (r["tp_f"] + r["tp_b"])
    return {
        "compute": m * (per_stage * 3 * r["gemm"] + r["logits_gemm"]),
        "memory_bound": m * (per_stage * 3 * r["elem"] + r["logits_elem"]),
        "tp_comm": tp_comm,
        "pipeline": (p - 1) / v * (t_mb + offload_mb) + (m + (p - 1) / v) * 2 * v * p2p,
        "dp_comm": dp_comm,
        "optimizer": np.where(host, shard / gpu.host_adam_params_s,
                              c.optimizer_traffic_bytes * shard / r["hbm"]),
        "recompute": m * per_stage * r["recompute"],
        "offload": m * offload_mb + np.where(host, (q["pg"] + q["pw"]) * shard / pcie, 0.0),
        "overhead": np.full(len(t), c.step_overhead_s),
        "tp_comm_all_s": tp_comm + np.where(q["rc_full"], m * per_stage * r["tp_f"], 0.0),
        "tp_comm_bytes": m * per_stage * np.where(q["rc_full"], 6, 4) * r["ar_bytes"],
        "dp_comm_bytes": np.select([z == 0, z == 1, z == 2],
                                   [2 * g_bytes, g_bytes + w_bytes, m * g_bytes + w_bytes],
                                   m * (g_bytes + 2 * w_bytes)),
        "p2p_bytes": m * 2 * v * message,
    }


# ------------------------------------------------------------- the public tables as jobs
#: The public tables that describe Megatron-style training, as jobs of the model: the shape and
#: settings from their launch scripts (Lucie-7B, OpenLLM-France/Lucie-Training
#: chronicles/parallelism/scripts/expe_parallelism/1_seq4k/lucie7b-seq4k.slurm: 32 layers,
#: hidden 4096, 32 heads, SwiGLU MLP 11008, untied embeddings, --use-flash-attn-v2; BLOOM-176B,
#: bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm: 70 layers, hidden
#: 14336, 112 heads, vocabulary 250880, tied embeddings, --checkpoint-activations; its rows in
#: bf16 ran DeepSpeed's bf16 optimizer with fp32 gradient accumulation, chronicles-prequel.md
#: from 2022-02-28; blank shape cells of the BLOOM table take BLOOM-176B's), the table's
#: columns mapped onto the vocabulary,
#: and the columns the model has no term for (left to the GP, without a warning).
_TABLE_JOBS: dict[str, dict[str, Any]] = {
    "lucie7b_seq2k": dict(
        job=dict(layers=32, hidden=4096, heads=32, ffn=11008, gated_mlp=True, seq_len=2048,
                 vocab=32000, global_batch=512, n_gpus=8, gpu="A100-80GB",
                 flash_attention=True),
        names={"global_batch_seqs": "global_batch"}, values={}, ignored=("pipeline_engine",)),
    "lucie7b_seq4k": dict(
        job=dict(layers=32, hidden=4096, heads=32, ffn=11008, gated_mlp=True, seq_len=4096,
                 vocab=32000, global_batch=512, n_gpus=8, gpu="A100-80GB",
                 flash_attention=True),
        names={"global_batch_seqs": "global_batch", "vocab_size": "vocab",
               "activation_recompute": "recompute"},
        values={"activation_recompute": {0: "none", 1: "full"}}, ignored=("pipeline_engine",)),
    "bigscience_tr11": dict(
        job=dict(layers=70, hidden=14336, heads=112, seq_len=2048, vocab=250880,
                 tied_embeddings=True, global_batch=2048, n_gpus=384, gpu="A100-80GB",
                 precision="bf16", defaults={"recompute": "full"}, fp32_grads=("bf16",)),
        names={"global_batch_seqs": "global_batch", "n_layers": "layers", "n_heads": "heads"},
        values={"n_layers": {-1: 70}, "n_heads": {-1: 112}}, ignored=("pp_partition",)),
}


def table_physics(dataset: Any, *,
                  constants: PhysicsConstants | None = None) -> LLMTrainingModel:
    """The :class:`LLMTrainingModel` of a public table of Megatron-style LLM training.

    Its cost terms are per token and GPU (``per_token=True``), as the tables' objective is
    tokens/s per GPU and their rows differ in GPU count and batch. ``mpt_llmfoundry`` is not
    one: its ``model`` column names a whole shape (several facts at once) and it trains with
    FSDP, whose knobs map only roughly onto ZeRO stages.

    How well the bare model (default constants, no measurement) ranks the measured rows: Kendall
    tau between predicted and measured tokens/s per GPU over the ok rows 0.79 (lucie7b_seq2k),
    0.70 (lucie7b_seq4k), 0.19 (bigscience_tr11, the noisiest table, whose shape varies); it
    predicts 1.7-1.8x the Lucie throughput (their scripts set ``CUDA_LAUNCH_BLOCKING=1``) and
    1.2x BLOOM's. BLOOM's reported peak memory (``mem_gb_max``) ranks at tau 0.83 against the
    predicted, which is ~0.8x of it (tau 0.67 before its bf16 rows' fp32 gradients were
    modelled: the bf16 rows were then predicted at ~0.65x, the fp16 rows at ~0.8x).

    Args:
        dataset: "lucie7b_seq2k", "lucie7b_seq4k" or "bigscience_tr11", or its Dataset.
        constants: The physics' constants (default: :class:`PhysicsConstants()`).

    Raises:
        ConfigError: For a table that is not one of these.

    Example:
        >>> from cubicml_lab import datasets
        >>> ds = datasets.load("lucie7b_seq4k")
        >>> terms = table_physics(ds).cost_terms_frame(ds.configs())
        >>> terms.shape == (len(ds.table), len(TERMS)), bool((terms.sum(axis=1) > 0).all())
        (True, True)
    """
    name = dataset if isinstance(dataset, str) else getattr(dataset, "name", None)
    if name not in _TABLE_JOBS:
        raise ConfigError(f"no physics for table {name!r}",
                          hint=f"one of {list(_TABLE_JOBS)}; for your own job build "
                               "LLMTrainingModel(...) with names=/values= for its columns")
    spec = _TABLE_JOBS[name]
    model = LLMTrainingModel(**spec["job"], names=spec["names"], values=spec["values"],
                             constants=constants, per_token=True)
    model._warned.update(spec["ignored"])
    return model
