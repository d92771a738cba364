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

from .model import FACTS, KNOBS, LLMTrainingModel
from .profiles import GPUS, GPUS_PER_NODE, PRECISIONS, TERMS, GPUSpec, PhysicsConstants
from .tables import table_physics

__all__ = ["FACTS", "GPUS", "GPUS_PER_NODE", "KNOBS", "PRECISIONS", "TERMS", "GPUSpec",
           "LLMTrainingModel", "PhysicsConstants", "table_physics"]
