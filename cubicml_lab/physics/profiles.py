"""Hardware profiles (:data:`GPUS`), precisions and the constants of the LLM training physics
(:class:`PhysicsConstants`, with :meth:`~PhysicsConstants.perturbed` for a deliberately different
set); the sources of every figure are given beside it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import math
from typing import Any

import numpy as np

from .._params import brief
from ..errors import ConfigError

#: Bytes of model state per parameter in bf16: parameter 2, gradient 2, fp32 Adam master+m+v 12.
PARAM_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
#: GPUs per node by default (and in the generated tables, where TP stays inside a node).
GPUS_PER_NODE = 8
#: Largest value of a hardware figure or constant (beyond any real machine, finite in float64).
MAX_FIGURE = 1e18


def _check_figures(owner: str, obj: Any, positive: tuple[str, ...], at_least_zero: tuple[str, ...],
                   fractions: tuple[str, ...]) -> None:
    """Refuse a figure of ``obj`` that is not a finite number in its range, naming it."""
    ranges = [(n, "> 0") for n in positive] + [(n, ">= 0") for n in at_least_zero] + \
        [(n, "in (0, 1]") for n in fractions]
    for name, rule in ranges:
        v = getattr(obj, name)
        ok = isinstance(v, (int, float, np.integer, np.floating)) and \
            not isinstance(v, (bool, np.bool_)) and abs(v) <= MAX_FIGURE and math.isfinite(v)
        ok = ok and (v > 0 if rule == "> 0" else v >= 0 if rule == ">= 0" else 0 < v <= 1)
        if not ok:
            raise ConfigError(f"{owner}({name}={brief(v)}): must be a finite number {rule}",
                              hint=f"give {name} as a number {rule} (see the {owner} docstring "
                                   "for its unit)")
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

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= 100:
            raise ConfigError(f"GPUSpec(name={brief(self.name)}): must be a short string",
                              hint="e.g. name='H100-80GB'")
        _check_figures("GPUSpec", self, ("peak_tflops", "memory_gib", "hbm_tb_s", "nvlink_gb_s",
                                         "internode_gb_s", "pcie_gb_s", "host_adam_params_s"),
                       ("fp8_tflops", "fp32_tflops", "nvlink_latency_s", "internode_latency_s"),
                       ("gemm_efficiency",))


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

    def __post_init__(self) -> None:
        _check_figures("PhysicsConstants", self,
                       ("gemm_half_size", "gemm_curve_power", "gemm_efficiency_scale",
                        "latency_scale", "optimizer_traffic_bytes", "memory_fragmentation"),
                       ("memory_reserved_gib", "step_overhead_s", "dp_overlap", "tp_overlap",
                        "offload_overlap"),
                       ("elementwise_efficiency",))
        if self.gemm_curve_power > 10:
            raise ConfigError(f"PhysicsConstants(gemm_curve_power={brief(self.gemm_curve_power)})"
                              ": must be at most 10 (an efficiency curve's exponent)",
                              hint="e.g. gemm_curve_power=1.0")
        for name in ("dp_overlap", "tp_overlap", "offload_overlap"):
            if getattr(self, name) > 1:
                raise ConfigError(f"PhysicsConstants({name}={brief(getattr(self, name))}): "
                                  "must be a fraction in [0, 1]", hint=f"e.g. {name}=0.8")

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
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or \
                not 0 <= seed < 2**63:
            raise ConfigError(f"perturbed(seed={brief(seed)}): the seed must be an int in "
                              "0..2**63 - 1", hint="e.g. perturbed(1)")
        if isinstance(spread, bool) or not isinstance(spread, (int, float)) or \
                not 0 <= spread <= 1:
            raise ConfigError(f"perturbed(spread={brief(spread)}): must be a number in [0, 1]",
                              hint="e.g. spread=0.5")
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
