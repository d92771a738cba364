"""Truth models of clusters whose step time and memory follow OTHER FORMULAS than the prior.

A **model, not measurements**, and deliberately not part of the library: it stands for a cluster
the project has never seen. The physics prior (:class:`cubicml_lab.analytical.LLMTrainingModel`,
default constants) assumes Megatron's 1F1B/interleaved pipeline, one ring all-reduce per TP
collective, recompute priced as the work it repeats, a fixed fragmentation factor and reserve,
one GEMM efficiency for every GEMM shape, a data-parallel gradient reduction hidden (a fixed
fraction) behind one micro-batch's backward, and no per-micro-batch cost. A
:class:`StructuralTruth` keeps the same knob vocabulary (so the prior applies to every row) and
the prior's own terms (same constants), and replaces one or more of those assumptions by another
formula, so that the error is in the shape of a term, not in a constant.

Per step, with ``m`` micro-batches, ``L/p`` layers per stage, ``t``/``p``/``v`` the TP, PP and
virtual-stage degrees, ``b`` micro-batch, ``s`` sequence, ``h`` hidden size, ``C`` and ``E`` the
prior's GEMM and element-wise seconds per step (forward + backward, every micro-batch; ``C``
through :class:`GemmWaves` where one is given), the truth's step time is::

    C + E + TP + RC + LAUNCH + BUBBLE + P2P + DP + OPT + OVERHEAD

where ``P2P``, ``OPT`` and ``OVERHEAD`` (and the offload term, 0 in these tables) are the
prior's, ``DP`` the prior's unless :class:`DPOverlap` scales it, each other term is the
prior's unless a change below replaces it, and ``t_mb = (C + E + TP + RC + LAUNCH) / m`` is
the slowest stage's seconds per micro-batch. The structural changes (each a parameterised
formula):

* :class:`PipelineSchedule`: another schedule. The prior's bubble is ``(p-1) t_mb / v`` (1F1B,
  interleaved) with ``min(p, m)`` micro-batches in flight on the first stage. Zero-bubble
  schedules (Qi et al., 2023, "Zero Bubble Pipeline Parallelism") split the backward into its
  input-gradient and weight-gradient halves and run deferred weight-gradient passes in the idle
  slots: ``BUBBLE = (p-1)/v^g (t_mb - f t_w min(1, m/(p-1)))``, ``t_w = C/(3m)`` the
  weight-gradient GEMMs of a micro-batch, ``f`` how many of them fill one slot (ZB-H1: 2; ZB-H2:
  3, leaving only element-wise and communication time), and only ``min(m, p-1)`` deferred
  passes exist to fill the ``p-1`` slots, so the bubble's dependence on ``m`` and ``p`` changes
  shape. ZB-H2 buys this with ``min(2p, m)`` micro-batches in flight (``in_flight = 2``; GPipe:
  every micro-batch of the step), each one's activations priced by the prior's memory formula.
  ``g < 1``: virtual stages shrink the bubble less than ``v``-fold (``g = 0``: not at all, they
  only add their messages); ``zero_bubble_only_v1`` applies the fill to ``v = 1`` only.
* :class:`TPCollective`: another TP collective. The prior prices each of the 4 collectives per
  layer and micro-batch as a ring all-reduce of ``M = 2 s b h`` bytes, ``2 (t-1)/t M / B + l``
  (one latency ``l``), and sequence parallelism's reduce-scatter + all-gather as the same. The
  truth's collective is ``k(t) M / (B M / (M + M_half)) + n(t) l_hop``: ``ring`` ``k = 2 (t-1)/t``,
  ``n = 2 (t-1)`` hops; ``tree`` (NCCL's double binary tree) ``k = 2``, ``n = 2 log2 t``;
  ``nvls`` (NVLink SHARP, in-switch reduction) ``k = 1``, ``n = 2``; ``M_half`` the message size
  at which a link reaches half its bandwidth (small micro-batches send small messages); sequence
  parallelism costs ``sp_cost`` times an all-reduce (unfused reduce-scatter and all-gather
  kernels) of which ``sp_overlap`` hides behind the neighbouring GEMMs.
* :class:`RecomputeCost`: recompute priced as a fraction of the forward it repeats,
  ``RC = rho (C + E) / 3`` (the forward is a third of the GEMM and element-wise work) with
  ``rho`` per recompute kind: a fused attention kernel that recomputes the scores inside its
  backward makes selective recompute a few percent of a forward (the prior: the unfused ``s^2``
  attention core and its softmax traffic, ~30% at GPT-3 size); full recompute with fused
  element-wise kernels and its TP collectives overlapped with the backward costs a fraction of
  the forward it repeats (the prior: the whole forward and its TP).
* :class:`Allocator`: another caching-allocator and reserve model. The prior's peak is
  ``1.05 X + 2.5 GiB`` for the bytes ``X`` it counts. The truth's is
  ``phi0 (1 + phi1 log2 b) X + r0 + r_tp (t-1) + r_pp (p-1) + r_v (v-1)``: fragmentation grows
  with the micro-batch (larger transient activation blocks leave larger holes), NCCL channel
  buffers grow with the TP group, pipeline send/receive buffers and per-stage CUDA-graph and
  workspace pools with the pipeline depth and the virtual stages. A small ``phi0`` and ``r0``
  let small layouts fit that the prior refuses; the growth terms make large ones run out of
  memory where the prior says they fit.
* :class:`MicroBatchOverhead`: a per-micro-batch cost ``LAUNCH = m (c_mb + L/p c_tp (t-1))``:
  host time per micro-batch the GPU does not hide (dispatch of its forward and backward,
  gradient-accumulation hooks, the pipeline's handshakes), and per layer the skew of the TP
  collectives (synchronisation points whose straggler wait grows with the group). The prior has
  only a fixed per-step overhead, so it does not see that many small micro-batches cost time,
  nor that the cost grows with TP.
* :class:`GemmWaves`: another GEMM efficiency. The prior prices every GEMM at one efficiency,
  whatever its shape. On the GPU a GEMM of ``n`` rows (``b s`` tokens) and ``d`` output columns
  runs as ``ceil(n/T_m) ceil(d/T_n)`` output tiles over ``S`` multiprocessors in whole waves, and a
  small GEMM does not saturate the memory system: its seconds are the prior's divided by
  ``q (n d / (n d + N_half))``, ``q = tiles / (S ceil(tiles/S))`` the busy fraction of its waves.
  The tensor-parallel GEMMs' output columns are split ``t`` ways (QKV ``3h/t``, attention
  projection ``h``, MLP up ``4h/t``, MLP down ``h``; weighted by their FLOPs 3:1:4:4), so some
  ``(micro_batch, tp)`` pairs leave a last wave nearly empty and are disproportionately slow, and
  the order of layouts within the compute term changes (a per-term weight cannot express it).
* :class:`DPOverlap`: a bucketed data-parallel gradient all-reduce that overlaps with the
  backward passes of the step: ``DP = D (x_min + (1 - x_min) m_0 / (m_0 + m - 1))`` for the
  prior's ``D`` (whatever its ZeRO stage), so a layout with more micro-batches hides more of its
  gradient traffic (buckets of earlier micro-batches' accumulated gradients go out while later
  ones compute), which couples the data-parallel term to the micro-batch and the pipeline degree.

Memory is the prior's (same formulas, same constants) plus a schedule's further micro-batches in
flight, through an :class:`Allocator` where one is given. Each
step time is multiplied by ``exp(N(0, noise^2))`` (default 1.5%), memory is noise-free; a row
whose peak exceeds the GPU's usable memory is ``"oom"``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from cubicml_lab.analytical import FACTS, KNOBS
from prior_transfer import ClusterPrior

#: The prior's fragmentation factor and reserve (GiB), which :class:`Allocator` replaces.
PRIOR_FRAGMENTATION, PRIOR_RESERVED_GIB = 1.05, 2.5
#: Bytes of one bf16 activation element (every truth table trains in bf16).
ACT_BYTES = 2


@dataclass(frozen=True, kw_only=True)
class PipelineSchedule:
    """Bubble ``(p-1)/v^interleave_power (t_mb - fill t_w min(1, m/(p-1)))`` seconds per step,
    and ``min(in_flight p, m)`` micro-batches' activations held by the first stage (``v = 1``).

    Attributes:
        fill: Weight-gradient passes (each ``t_w`` seconds) that fill one idle slot (ZB-H1: 2,
            since ``t_F + t_B - t_W`` replaces ``t_F + t_B + t_W``; ZB-H2: 3, no bubble left
            but the element-wise and communication time; GPipe and 1F1B: 0).
        interleave_power: Exponent of ``v`` in the bubble's shrinkage (1: Megatron's interleaved
            schedule; 0: virtual stages do not shrink it).
        zero_bubble_only_v1: Fill only where ``v = 1`` (``v > 1`` runs the interleaved schedule).
        in_flight: Micro-batches in flight on the first stage, in multiples of ``p`` (1F1B and
            ZB-H1: 1; ZB-H2: 2, it starts twice as many forwards before the first backward;
            GPipe: ``inf``, every micro-batch of the step), for ``v = 1``.
    """

    fill: float = 2.0
    interleave_power: float = 1.0
    zero_bubble_only_v1: bool = False
    in_flight: float = 1.0

    def bubble(self, x: dict[str, np.ndarray], t_mb: np.ndarray, t_w: np.ndarray) -> np.ndarray:
        p, v, m = x["pp"], x["virtual_stages"], x["m"]
        share = np.minimum(1.0, m / np.maximum(p - 1, 1))
        fill = self.fill * t_w * share
        if self.zero_bubble_only_v1:
            fill = np.where(v == 1, fill, 0.0)
        idle = np.maximum(t_mb - fill, 0.0)
        return (p - 1) / v ** self.interleave_power * idle

    def extra_in_flight(self, x: dict[str, np.ndarray]) -> np.ndarray:
        """Micro-batches in flight beyond the prior's 1F1B ``min(p, m)`` (``v = 1`` only)."""
        p, m = x["pp"], x["m"]
        more = np.minimum(np.ceil(self.in_flight * p), m) - np.minimum(p, m)
        return np.where((x["virtual_stages"] == 1) & (p > 1), np.maximum(more, 0.0), 0.0)


@dataclass(frozen=True, kw_only=True)
class TPCollective:
    """Seconds of the 4 TP collectives per layer and micro-batch (module docstring).

    Attributes:
        algorithm: "ring", "tree" or "nvls".
        hop_latency_s: Latency of one step of the algorithm, seconds.
        half_bytes: Message size at which a link reaches half its bandwidth, bytes (0: full
            bandwidth at any size).
        sp_cost: Sequence parallelism's reduce-scatter + all-gather, in all-reduces.
        sp_overlap: Fraction of the sequence-parallel collectives hidden behind GEMMs (0-1).
    """

    algorithm: str = "ring"
    hop_latency_s: float = 4e-6
    half_bytes: float = 0.0
    sp_cost: float = 1.0
    sp_overlap: float = 0.0

    def __post_init__(self) -> None:
        if self.algorithm not in ("ring", "tree", "nvls"):
            raise ValueError(f"algorithm {self.algorithm!r}: one of ring, tree, nvls")

    def seconds(self, x: dict[str, np.ndarray], bandwidth_b_s: float) -> np.ndarray:
        t = x["tp"]
        message = ACT_BYTES * x["seq_len"] * x["micro_batch"] * x["hidden"]
        volume, steps = {"ring": (2 * (t - 1) / t, 2 * (t - 1)),
                         "tree": (2.0 + 0 * t, 2 * np.log2(t)),
                         "nvls": (1.0 + 0 * t, 2.0 + 0 * t)}[self.algorithm]
        one = volume * (message + self.half_bytes) / bandwidth_b_s + steps * self.hop_latency_s
        sp = x["sequence_parallel"].astype(bool)
        one = one * np.where(sp, self.sp_cost * (1 - self.sp_overlap), 1.0)
        per_layer = np.where(t > 1, 4 * one, 0.0)
        return x["m"] * x["layers"] / x["pp"] * per_layer


@dataclass(frozen=True, kw_only=True)
class RecomputeCost:
    """Recompute seconds per step as ``rho`` times the forward of every micro-batch.

    Attributes:
        selective: ``rho`` of selective recompute (fraction of a forward).
        full: ``rho`` of full recompute (fraction of a forward).
    """

    selective: float = 0.04
    full: float = 0.7

    def seconds(self, x: dict[str, np.ndarray], forward: np.ndarray) -> np.ndarray:
        rc = x["recompute"].astype(str)
        rho = np.where(rc == "selective", self.selective, np.where(rc == "full", self.full, 0.0))
        return rho * forward


@dataclass(frozen=True, kw_only=True)
class Allocator:
    """Peak GiB ``phi0 (1 + phi1 log2 b) X + r0 + r_tp (t-1) + r_pp (p-1) + r_v (v-1)``.

    Attributes:
        phi0: Fragmentation at micro-batch 1 (the prior: 1.05 at any micro-batch).
        phi1: Growth of the fragmentation per doubling of the micro-batch.
        r0: Reserve of a layout with no TP and no pipeline, GiB (the prior: 2.5 always).
        r_tp: Reserve per further TP rank, GiB.
        r_pp: Reserve per further pipeline stage, GiB.
        r_v: Reserve per further virtual stage, GiB.
    """

    phi0: float = 1.0
    phi1: float = 0.03
    r0: float = 1.5
    r_tp: float = 0.35
    r_pp: float = 0.25
    r_v: float = 0.5

    def peak_gib(self, x: dict[str, np.ndarray], counted_gib: np.ndarray) -> np.ndarray:
        frag = self.phi0 * (1 + self.phi1 * np.log2(x["micro_batch"]))
        reserve = (self.r0 + self.r_tp * (x["tp"] - 1) + self.r_pp * (x["pp"] - 1)
                   + self.r_v * (x["virtual_stages"] - 1))
        return frag * counted_gib + reserve


@dataclass(frozen=True, kw_only=True)
class MicroBatchOverhead:
    """``m (per_micro_batch_s + L/p tp_sync_s (t-1))`` seconds per step.

    Attributes:
        per_micro_batch_s: Exposed host time per micro-batch (dispatch of its forward and
            backward, gradient-accumulation hooks, the pipeline's per-micro-batch handshakes),
            seconds.
        tp_sync_s: Straggler wait per further TP rank, per layer and micro-batch, seconds.
    """

    per_micro_batch_s: float = 3e-3
    tp_sync_s: float = 15e-6

    def seconds(self, x: dict[str, np.ndarray]) -> np.ndarray:
        per_layer = self.tp_sync_s * (x["tp"] - 1)
        return x["m"] * (self.per_micro_batch_s + x["layers"] / x["pp"] * per_layer)


@dataclass(frozen=True, kw_only=True)
class GemmWaves:
    """GEMM seconds: the prior's divided by ``q (n d / (n d + half_elements))`` (module docstring).

    Attributes:
        tile_m: Rows of one output tile.
        tile_n: Columns of one output tile.
        sms: Multiprocessors that run tiles at once (one tile each).
        half_elements: Output elements ``n d`` at which a GEMM reaches half its efficiency
            (0: every size saturates).
    """

    tile_m: int = 128
    tile_n: int = 256
    sms: int = 132
    half_elements: float = 0.0

    def factor(self, x: dict[str, np.ndarray]) -> np.ndarray:
        """Seconds of the truth's GEMMs over the prior's, per row."""
        n, h, t = x["seq_len"] * x["micro_batch"], x["hidden"], x["tp"]
        total, weight = 0.0, 0.0
        for d, w in ((3 * h / t, 3.0), (h, 1.0), (4 * h / t, 4.0), (h, 4.0)):
            tiles = np.ceil(n / self.tile_m) * np.ceil(d / self.tile_n)
            busy = tiles / (self.sms * np.ceil(tiles / self.sms))
            size = n * d
            total = total + w / (busy * size / (size + self.half_elements))
            weight += w
        return total / weight


@dataclass(frozen=True, kw_only=True)
class DPOverlap:
    """Data-parallel seconds: the prior's times ``x_min + (1 - x_min) m0 / (m0 + m - 1)``.

    Attributes:
        exposed_min: Fraction ``x_min`` left exposed however many micro-batches hide it.
        m0: Micro-batches at which half the hideable traffic is hidden (plus one).
    """

    exposed_min: float = 0.15
    m0: float = 2.0

    def factor(self, x: dict[str, np.ndarray]) -> np.ndarray:
        return self.exposed_min + (1 - self.exposed_min) * self.m0 / (self.m0 + x["m"] - 1)


@dataclass(frozen=True, kw_only=True)
class StructuralTruth:
    """A cluster: the prior's physics with the given structural changes (module docstring)."""

    schedule: PipelineSchedule | None = None
    collective: TPCollective | None = None
    recompute: RecomputeCost | None = None
    allocator: Allocator | None = None
    overhead: MicroBatchOverhead | None = None
    gemm: GemmWaves | None = None
    dp: DPOverlap | None = None

    def describe(self) -> str:
        parts = [repr(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name)]
        return "; ".join(parts) or "the prior's own formulas"

    def evaluate(self, base: ClusterPrior, df: Any) -> Any:
        """Per row of ``df`` (knob columns): ``step_time_s``, ``peak_mem_gib`` and the terms."""
        import pandas as pd

        frame = base.frame(df[[c for c in df.columns if c in KNOBS or c in FACTS]])
        prior = base.physics.evaluate_frame(frame)
        x = {k: frame[k].to_numpy() for k in ("tp", "pp", "virtual_stages", "micro_batch",
                                               "hidden", "layers", "recompute",
                                               "sequence_parallel")}
        x = {k: v if k == "recompute" else v.astype(np.float64) for k, v in x.items()}
        x["seq_len"] = float(base.physics.facts["seq_len"])
        x["m"] = prior["grad_accum"].to_numpy()
        col = {k: prior[k].to_numpy() for k in ("compute", "memory_bound", "tp_comm",
                                                "recompute", "pipeline", "dp_comm",
                                                "optimizer", "offload", "overhead")}
        p, v, m = x["pp"], x["virtual_stages"], x["m"]
        prior_t_mb = (col["compute"] + col["memory_bound"] + col["tp_comm"]
                      + col["recompute"]) / m
        p2p = col["pipeline"] - (p - 1) / v * prior_t_mb
        if self.gemm is not None:
            col["compute"] = col["compute"] * self.gemm.factor(x)
        if self.dp is not None:
            col["dp_comm"] = col["dp_comm"] * self.dp.factor(x)
        work = col["compute"] + col["memory_bound"]
        terms = {
            "tp_comm": col["tp_comm"] if self.collective is None else
            self.collective.seconds(x, base.gpu.nvlink_gb_s * 1e9),
            "recompute": col["recompute"] if self.recompute is None else
            self.recompute.seconds(x, work / 3),
            "launch": 0 * work if self.overhead is None else self.overhead.seconds(x),
        }
        t_mb = (work + sum(terms.values())) / m
        bubble = (p - 1) / v * t_mb if self.schedule is None else \
            self.schedule.bubble(x, t_mb, col["compute"] / (3 * m))
        terms.update(compute=col["compute"], memory_bound=col["memory_bound"], bubble=bubble,
                     p2p=p2p, dp_comm=col["dp_comm"], optimizer=col["optimizer"],
                     offload=col["offload"], overhead=col["overhead"])
        step = sum(terms.values())
        peak = prior["peak_mem_gib"].to_numpy()
        if self.schedule is not None and self.schedule.in_flight != 1:
            peak = peak + self.schedule.extra_in_flight(x) * _micro_batch_gib(base, frame, prior)
        if self.allocator is not None:
            counted = (peak - PRIOR_RESERVED_GIB) / PRIOR_FRAGMENTATION
            peak = self.allocator.peak_gib(x, counted)
        return pd.DataFrame({"step_time_s": step, "peak_mem_gib": peak,
                             **{f"{k}_s": val for k, val in terms.items()}}, index=df.index)


def _micro_batch_gib(base: ClusterPrior, frame: Any, prior: Any) -> np.ndarray:
    """GiB of one more micro-batch in flight on the first stage, by the prior's memory: its peak
    with two micro-batches per step less its peak with one (a fact a config may carry)."""
    one = prior["dp"].to_numpy() * frame["micro_batch"].to_numpy()
    peaks = [base.physics.memory_gib_frame(frame.assign(global_batch=k * one)).to_numpy()
             for k in (1, 2)]
    return peaks[1] - peaks[0]


def truth_table(model: str, n_gpus: int, gpu: str, truth: StructuralTruth, *, seed: int = 0,
                noise: float = 0.015, name: str = "structural_truth"):
    """Every valid layout of ``model`` on ``n_gpus`` ``gpu`` (the space of
    :func:`cubicml_lab.analytical.llm_cluster_model`) with the step time and memory of ``truth``.

    Returns a :class:`~cubicml_lab.datasets.Dataset`: the knob columns, ``tokens_per_s_per_gpu``
    (NaN when oom), ``status`` ("ok" or "oom"), ``step_time_s``, ``peak_mem_gib`` (every row),
    ``grad_accum``, ``dp`` and each term's seconds per step (``*_s``, NaN when oom).
    """
    from cubicml_lab import analytical
    from cubicml_lab.datasets import Dataset

    layouts = analytical.llm_cluster_model(n_gpus, model, gpu, noise=0.0)
    base = ClusterPrior(model, n_gpus, gpu)
    df = layouts.table[layouts.knobs + ["dp", "grad_accum"]].copy()
    res = truth.evaluate(base, df)
    draws = np.random.default_rng(seed).lognormal(0.0, noise, len(df)) if noise > 0 else 1.0
    step = res["step_time_s"].to_numpy() * draws
    facts = base.physics.facts
    tokens = facts["global_batch"] * facts["seq_len"] / step / facts["n_gpus"]
    ok = res["peak_mem_gib"].to_numpy() <= base.gpu.memory_gib
    df[layouts.objective] = np.where(ok, tokens, np.nan)
    df["status"] = np.where(ok, "ok", "oom").astype(object)
    df["step_time_s"] = np.where(ok, step, np.nan)
    df["peak_mem_gib"] = res["peak_mem_gib"].to_numpy()
    for column in res.columns.drop(["step_time_s", "peak_mem_gib"]):
        df[column] = np.where(ok, res[column].to_numpy(), np.nan)
    notes = (f"STRUCTURAL TRUTH MODEL, NOT MEASURED: {model} on {n_gpus} {gpu}, the layouts of "
             f"llm_cluster_model, timed and sized by the prior's physics with: "
             f"{truth.describe()}. Step-time noise sigma {noise} (seed {seed}); "
             f"{int((~ok).sum())} of {len(df)} layouts out of memory.")
    return Dataset(name=name, space=layouts.space, table=df.reset_index(drop=True),
                   objective=layouts.objective, knobs=list(layouts.knobs),
                   source="structural truth model (not measured)", notes=notes)
