"""The formulas of a step's time and memory, vectorised over configurations (numpy arrays of
one value per row); :mod:`cubicml_lab.physics` documents each with its source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .profiles import PRECISIONS, TERMS, GPUSpec, PhysicsConstants


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
class Arch:
    """Architecture choices of the job that are not knobs."""

    gated_mlp: bool
    tied: bool
    flash: bool
    fp32_grads: tuple[str, ...] = ()


def step_physics(x: dict[str, np.ndarray], gpu: GPUSpec, c: PhysicsConstants,
                 gpus_per_node: int, arch: Arch) -> dict[str, np.ndarray]:
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


def _shared(x: dict[str, np.ndarray], gpu: GPUSpec, arch: Arch) -> dict[str, np.ndarray]:
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
