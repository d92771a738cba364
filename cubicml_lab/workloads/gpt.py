"""The ``gpt`` workload: a small decoder-only transformer LM trained on synthetic tokens.

The model is nanoGPT's, readable in one sitting: token + position embeddings, ``n_layers`` pre-norm
blocks (causal self-attention through ``F.scaled_dot_product_attention(is_causal=True)``, then a
GELU MLP ``mlp_ratio`` times wider), a final LayerNorm and an LM head tied to the token embedding.
Linear layers have no bias. The data are ``grad_accum`` fixed micro-batches of random tokens made
on the device from a seeded generator (no download, no data-loading cost inside the step); as
they are fixed, the loss falls as the model memorises them, which shows it really trains.

One optimizer step (AdamW; ``foreach`` on CPU, ``fused`` on CUDA) runs ``grad_accum``
micro-batches of ``micro_batch`` sequences of ``seq_len`` tokens. Knobs: :data:`KNOBS`.

Activation recomputation (``recompute``):
  * ``"none"``: keep every activation.
  * ``"selective"``: recompute the MLP of each block in the backward pass
    (``torch.utils.checkpoint``), dropping its ``mlp_ratio * d_model``-wide hidden activations,
    the largest a block keeps. (Megatron-LM's "selective" recomputes the attention core instead;
    the fused SDPA kernels used here never store the ``seq_len x seq_len`` scores, so that would
    save almost nothing.)
  * ``"full"``: checkpoint every block; only block inputs are kept.

FLOPs per optimizer step (:func:`flops_per_step`), the Megatron-LM convention (Narayanan et al.
2021, eq. 3 without recomputation; also PaLM appendix B)::

    6 * N * T + 12 * n_layers * seq_len * d_model * T
    N = n_layers * (4 + 2 * mlp_ratio) * d_model**2 + d_model * vocab
    T = micro_batch * seq_len * grad_accum   (tokens per step)

``N`` counts the weights of every matmul (attention QKV and output, MLP, LM head); embedding
lookups, LayerNorms, softmax and the loss are not counted. The attention term counts the full
``seq_len x seq_len`` score and value matmuls (forward 4, backward 8 FLOPs per element, as
``FlopCounterMode`` does): *no* causal halving, which would halve that term. Recomputation is
not counted: MFU uses model FLOPs, not hardware FLOPs.

Importing this module imports no torch; :func:`build` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .base import Built, Knob, Workload, seeded_on
from .parallel import DEGREE_NAMES, World, resolve_degrees

__all__ = ["FLOPS_CONVENTION", "GPT", "KNOBS", "GPTWorkload", "cost_terms", "flops_per_step"]

KNOBS: dict[str, Knob] = {
    "d_model": Knob(default=128, type=int, low=1, unit="", doc="model width (hidden size)"),
    "n_layers": Knob(default=2, type=int, low=1, doc="transformer blocks"),
    "n_heads": Knob(default=4, type=int, low=1, doc="attention heads; must divide d_model"),
    "seq_len": Knob(default=128, type=int, low=1, unit="tokens", doc="sequence length"),
    "vocab": Knob(default=2048, type=int, low=2, unit="tokens", doc="vocabulary size"),
    "mlp_ratio": Knob(default=4, type=int, low=1, doc="MLP hidden width / d_model"),
    "micro_batch": Knob(default=8, type=int, low=1, unit="sequences",
                        doc="sequences per forward/backward pass"),
    "grad_accum": Knob(default=1, type=int, low=1, unit="micro-batches",
                       doc="micro-batches per optimizer step"),
    "precision": Knob(default="fp32", type=str, choices=("fp32", "bf16"),
                      doc="fp32, or bf16 autocast (weights and optimizer stay fp32)"),
    "recompute": Knob(default="none", type=str, choices=("none", "selective", "full"),
                      doc="activation recomputation: none, selective (MLPs), full (blocks)"),
    "compile": Knob(default=False, type=bool, doc="torch.compile each block"),
    "fused_optimizer": Knob(default=False, type=bool,
                            doc="AdamW's fused kernel (True) or its foreach one (False)"),
    "dp_replicate": Knob(default=1, type=int, low=1, doc="data-parallel replicas (DDP; HSDP's "
                         "outer dimension with dp_shard or tp > 1)"),
    "dp_shard": Knob(default=-1, type=int, low=-1, doc="FSDP2 shards; -1: the world size over "
                     "dp_replicate x tp"),
    "tp": Knob(default=1, type=int, low=1, doc="tensor-parallel degree (must divide n_heads)"),
    "reshard_after_forward": Knob(default=True, type=bool,
                                  doc="FSDP2 frees gathered weights after forward (ZeRO-3) or "
                                      "keeps them until backward (ZeRO-2)"),
    "threads": Knob(default=0, type=int, low=0, unit="threads",
                    doc="torch CPU threads; 0 leaves torch's default"),
    "lr": Knob(default=3e-4, type=float, low=0.0, doc="AdamW learning rate"),
    "seed": Knob(default=0, type=int, low=0, doc="seed of the weights and the synthetic tokens"),
}

FLOPS_CONVENTION = ("megatron: 6*N*T + 12*n_layers*seq_len*d_model*T, "
                    "N = n_layers*(4+2*mlp_ratio)*d_model^2 + d_model*vocab (LM head counted; "
                    "embeddings, norms, softmax, loss not), T = tokens/step; attention scores "
                    "counted in full (no causal halving); recomputation not counted")


def flops_per_step(cfg: Mapping[str, Any]) -> float:
    """Model FLOPs of one optimizer step (forward + backward), the convention above."""
    d, layers, vocab = cfg["d_model"], cfg["n_layers"], cfg["vocab"]
    tokens = cfg["micro_batch"] * cfg["seq_len"] * cfg["grad_accum"]
    n_matmul = layers * (4 + 2 * cfg["mlp_ratio"]) * d * d + d * vocab
    return float(6 * n_matmul * tokens + 12 * layers * cfg["seq_len"] * d * tokens)


def cost_terms(cfg: Mapping[str, Any]) -> list[float]:
    """Rough costs per token of one training step, for a GP's analytical prior mean
    (``GPPredictor(space, cost_model=...)``): a roofline-style sum whose weights the GP fits.

    Returns ``[flops_fp32, flops_low, weights, activation_bytes, overhead, attention_fp32,
    attention_low]``, each per token and in its own unit:

    * hardware FLOPs (:func:`flops_per_step` plus recomputation: a full block forward for
      ``"full"``, the MLP forward for ``"selective"``), in the first term for fp32 and in the
      second for bf16/fp16 (the other one 0), so that the fit learns each precision's speed on
      the machine with one weight instead of leaving it to the kernel;
    * weight, gradient and optimizer-state elements touched once per step (``N`` plus the input
      embedding, shared by the step's tokens);
    * bytes of activations written per layer (``(8 + mlp_ratio) * d_model`` elements of 4 bytes,
      2 in bf16/fp16);
    * per-micro-batch fixed costs (kernel launches, Python) shared by its tokens: one unit per
      block and one for the head, a block's a third more with full recomputation (its forward
      runs again) and the MLP forward's share of its FLOPs more with selective;
    * attention-score elements per token (``seq_len * n_heads * n_layers``, a third more with
      full recomputation): the fused attention kernel's softmax and masking run per head over
      every score, which its FLOP count (independent of the head count) does not see. Like the
      FLOPs, in the first of the two terms for fp32 and in the second for bf16/fp16: that
      elementwise work runs in the activations' precision, whose cost per element is the
      machine's (converted to fp32 and back on a CPU; half the bytes on a GPU), so each
      precision gets its own weight. A fit that saw scores of one precision only weighs the
      other's as its own (``term_units``). Split, and each term's weight per unit drawn towards
      that of its unit's other term (``GPPredictor``'s ``UNIT_PRIOR_SD``), the fp32 trials are
      no longer priced by the bf16 ones' weights.

    The FLOPs, activations and scores are divided by ``threads ** cfg["thread_scaling"]``
    where ``threads`` is set (> 0): CPU threads split that work, not the per-step and
    per-micro-batch costs, and ``thread_scaling`` (optional, default 1: an even split) says
    how much of the split the machine turns into speed (the demo measures it from its matmuls,
    :func:`~cubicml_lab.demo.cpu_thread_scaling`). ``cfg`` needs the model and batch knobs
    (``d_model``, ``n_layers``, ``n_heads``, ``vocab``, ``seq_len``, ``mlp_ratio``,
    ``micro_batch``, ``grad_accum``, ``recompute``; ``threads`` and ``precision`` optional).

    ``cfg["fp32_flop_cost"]`` (optional, default 1): the seconds of an fp32 FLOP over those of a
    bf16/fp16 FLOP on the machine, e.g. the ratio of its matmul rates
    (:func:`~cubicml_lab.hardware.device_peak_flops`), which scales the fp32 term. It matters
    when a fit has trials of only one precision: the GP then weighs the other precision's
    FLOPs as its own (``term_units``), and
    without the ratio an fp32 FLOP would cost what a bf16 one does (a demo campaign that ran
    fp32 once, for its default configuration, predicted that one 21-37% too fast when it was
    left out). With trials of both, the GP fits each term's weight and the ratio drops out.
    ``cfg["fp32_score_cost"]`` (optional, default 1) does the same for the attention scores: the
    seconds of an fp32 score over a bf16/fp16 one
    (:func:`~cubicml_lab.hardware.attention_score_seconds`), which scales the fp32 score term.
    Even with trials of both precisions it matters where the fp32 ones all have the same heads,
    as a demo campaign's often do: the GP then draws the fp32 score weight towards the bf16 one
    (``GPPredictor``'s ``UNIT_PRIOR_SD``), and the ratio says where that is.

    Example:
        >>> cfg = {k: knob.default for k, knob in KNOBS.items()}
        >>> [round(t / 1e3, 1) for t in cost_terms(cfg)[:2]]
        [4325.4, 0.0]
    """
    d, layers, vocab, ratio = cfg["d_model"], cfg["n_layers"], cfg["vocab"], cfg["mlp_ratio"]
    seq, micro = cfg["seq_len"], cfg["micro_batch"]
    tokens_per_micro = micro * seq
    tokens = tokens_per_micro * cfg["grad_accum"]
    flops = flops_per_step(cfg) / tokens
    recompute = cfg.get("recompute")
    if recompute == "full":
        flops *= 4 / 3  # one more forward: a third of forward + backward
    elif recompute == "selective":
        flops += 4 * ratio * d * d * layers  # the MLPs' forward again
    weights = (layers * (4 + 2 * ratio) * d * d + 2 * d * vocab) / tokens
    activations = float(layers * (8 + ratio) * d * _bytes_per_element(cfg))
    scores = seq * cfg["n_heads"] * layers * (4 / 3 if recompute == "full" else 1.0)
    threads = cfg.get("threads") or 1  # 0: torch's default, unknown here
    split = threads ** cfg.get("thread_scaling", 1.0)  # what the threads' split buys
    flops, activations, scores = flops / split, activations / split, scores / split
    # per micro-batch: each block's kernels and the head's; recomputation launches its share of
    # a block's forward and backward again (a third for "full", the MLP forward's FLOPs for
    # "selective")
    block = 6 * (4 + 2 * ratio) * d * d + 12 * seq * d  # a block's FLOPs per token
    rerun = {"full": 1 / 3, "selective": 4 * ratio * d * d / block}.get(recompute, 0.0)
    overhead = (layers * (1 + rerun) + 1) / tokens_per_micro
    low = _bytes_per_element(cfg) == 2
    fp32 = flops * cfg.get("fp32_flop_cost", 1.0)
    fp32_scores = scores * cfg.get("fp32_score_cost", 1.0)
    return [0.0 if low else float(fp32), float(flops) if low else 0.0, float(weights),
            activations, float(overhead), 0.0 if low else float(fp32_scores),
            float(scores) if low else 0.0]


#: Units of :func:`cost_terms`' values: a GP weighs a term it never saw as a seen one of the
#: same unit (FLOPs in fp32 as in bf16, until a trial of each was measured).
cost_terms.term_units = ("flop", "flop", "element", "byte", "launch", "score", "score")
#: Names of :func:`cost_terms`' values, in order (``GPPredictor.cost_shares`` columns).
cost_terms.term_names = ("flops_fp32", "flops_low", "weights", "activation_bytes", "overhead",
                         "attention_fp32", "attention_low")


def _bytes_per_element(cfg: Mapping[str, Any]) -> int:
    """2 for bf16/fp16 activations, 4 otherwise."""
    return 2 if cfg.get("precision") in ("bf16", "fp16") else 4


def shape_features(cfg: Mapping[str, Any]) -> list[float]:
    """Sizes that set how efficiently a step's kernels run, for a GP's derived inputs
    (``GPPredictor(space, features=...)``): the GP sees their logs next to the knobs, so that
    an effect of, say, the GEMMs' row count ``micro_batch * seq_len`` is one smooth function of
    one input rather than of two knobs.

    Returns ``[tokens per micro-batch, tokens x d_model, tokens x vocab, 1 + attention scores per
    token, working-set bytes]`` for one micro-batch: the rows of every GEMM, the size of the
    hidden-state GEMMs, of the LM head's logits, of the attention score matrices per token
    (``seq_len * n_heads * n_layers``), and the bytes of one layer's activations of the micro-batch
    (``tokens * (8 + mlp_ratio) * d_model`` elements, 2 or 4 bytes), whose size against the CPU's
    caches may bend the speed (on the demo, 32 sequences once ran slower per token than 16, but that
    was glibc page-faulting the step's buffers back in, which
    :func:`~cubicml_lab.hardware.tune_cpu_allocator` now stops).
    ``cfg`` needs ``d_model``, ``n_layers``, ``n_heads``, ``vocab``,
    ``seq_len``, ``mlp_ratio`` and ``micro_batch`` (``precision`` optional).

    Example:
        >>> cfg = {k: knob.default for k, knob in KNOBS.items()}
        >>> shape_features(cfg)[0] == cfg["micro_batch"] * cfg["seq_len"]
        True
    """
    tokens = cfg["micro_batch"] * cfg["seq_len"]
    scores = cfg["seq_len"] * cfg["n_heads"] * cfg["n_layers"]
    working_set = tokens * (8 + cfg["mlp_ratio"]) * cfg["d_model"] * _bytes_per_element(cfg)
    return [float(tokens), float(tokens * cfg["d_model"]), float(tokens * cfg["vocab"]),
            float(1 + scores), float(working_set)]


#: Names of :func:`shape_features`' values, in order (``GPPredictor.importance`` labels).
shape_features.feature_names = ("tokens", "tokens_x_d_model", "tokens_x_vocab",
                                "attention_scores", "working_set_bytes")


def GPT(cfg: Mapping[str, Any]) -> Any:  # noqa: N802 - reads as the class it builds
    """A fresh, randomly initialised model for a resolved config (an ``nn.Module``)."""
    from ._gpt_model import GPTModel  # torch, on first use

    return GPTModel(cfg)


class GPTWorkload(Workload):
    """Decoder-only transformer LM on synthetic tokens; units are tokens."""

    name = "gpt"
    # 2: head-major qkv rows (for tensor parallelism), parallel knobs, compile per block
    version = "2"
    units = "tokens"

    def knobs(self) -> dict[str, Knob]:
        return dict(KNOBS)

    def check(self, config: dict[str, Any]) -> None:
        d, heads, tp = config["d_model"], config["n_heads"], config["tp"]
        if d % heads:
            divisors = [h for h in range(1, min(d, 64) + 1) if d % h == 0]
            raise ConfigError(f"n_heads = {heads} does not divide d_model = {d}",
                              hint=f"choose n_heads among {divisors} or change d_model")
        if heads % tp:
            raise ConfigError(f"tp = {tp} does not divide n_heads = {heads}: tensor parallelism "
                              "gives each rank whole heads", hint="choose tp dividing n_heads")
        if config["dp_shard"] == 0:
            raise ConfigError("dp_shard = 0 is not allowed: must be >= 1 or -1 (auto)",
                              hint="dp_shard = -1 takes whatever the world size leaves")

    def check_world(self, config: Mapping[str, Any], world_size: int) -> None:
        resolve_degrees(self.resolve(config), world_size)

    def build(self, config: Mapping[str, Any], device: str, world: World | None = None) -> Built:
        """Model, fixed synthetic micro-batches and AdamW on ``device``; see the module doc."""
        import contextlib

        import torch

        cfg = self.resolve(config)
        world = world if world is not None else World(device=device)
        deg = resolve_degrees(cfg, world.world_size)
        dp_size = deg["dp_replicate"] * deg["dp_shard"]
        dev = torch.device(device)
        with seeded_on(dev, cfg["seed"]):
            model = GPT(cfg)
        model.train()
        n_params = sum(p.numel() for p in model.parameters())
        if cfg["compile"]:
            for block in model.blocks:
                block.compile()
        model, strategy = _parallelize(model, cfg, world, deg)
        dp_rank = world.rank // deg["tp"]  # ranks of one tensor-parallel group share their data
        batches = _token_batches(cfg, dev, cfg["seed"] + 1_000_003 * dp_rank)
        opt = _adamw(model, cfg)
        bf16 = cfg["precision"] == "bf16"

        def autocast() -> Any:
            if bf16:
                return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
            return contextlib.nullcontext()

        def no_sync(last: bool) -> Any:  # reduce gradients once per step, not per micro-batch
            if strategy == "ddp" and not last:
                return model.no_sync()
            if strategy == "fsdp":
                model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()

        def step() -> Any:
            for i, (x, y) in enumerate(batches):
                with no_sync(i == len(batches) - 1), autocast():
                    loss = model(x, y)
                    (loss / cfg["grad_accum"]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
        tokens = cfg["micro_batch"] * cfg["seq_len"] * cfg["grad_accum"] * dp_size
        return Built(step=step, units_per_step=tokens,
                     flops_per_step=flops_per_step(cfg) * dp_size,
                     flops_convention=FLOPS_CONVENTION, sync=sync, model_params=n_params,
                     precision=cfg["precision"], n_devices=world.world_size,
                     parallel={**deg, "strategy": strategy},
                     matmul_rows=cfg["micro_batch"] * cfg["seq_len"])


def _token_batches(cfg: Mapping[str, Any], dev: Any, seed: int) -> list[tuple[Any, Any]]:
    """``grad_accum`` fixed micro-batches of random tokens made on ``dev`` from a generator
    seeded ``seed``: ``(inputs, targets)``, each ``(micro_batch, seq_len)``, the targets the
    inputs shifted by one token."""
    import torch

    gen = torch.Generator(device=dev).manual_seed(seed)
    batches = []
    for _ in range(cfg["grad_accum"]):
        seq = torch.randint(0, cfg["vocab"], (cfg["micro_batch"], cfg["seq_len"] + 1),
                            generator=gen, device=dev)
        batches.append((seq[:, :-1], seq[:, 1:]))
    return batches


def _adamw(model: Any, cfg: Mapping[str, Any]) -> Any:
    """AdamW over ``model``'s parameters, ``fused`` or ``foreach`` as ``fused_optimizer`` says."""
    import torch

    impl = {"fused": True} if cfg["fused_optimizer"] else {"foreach": True}
    # One param group per tensor class: foreach/fused kernels cannot mix tensor-parallel
    # DTensors with the plain tensors of the unsplit layers (norms, embeddings).
    kinds: dict[str, list[Any]] = {}
    for param in model.parameters():
        kinds.setdefault(type(param).__name__, []).append(param)
    return torch.optim.AdamW([{"params": ps} for ps in kinds.values()], lr=cfg["lr"],
                             betas=(0.9, 0.95), weight_decay=0.1, **impl)


def _parallelize(model: Any, cfg: Mapping[str, Any], world: World, deg: dict[str, int]
                 ) -> tuple[Any, str]:
    """Apply the parallelism the degrees ask for; return the model and ``strategy``.

    ``strategy``: ``"single"`` (one process), ``"ddp"`` (``dp_replicate`` only),
    ``"tp"`` (tensor parallel only), or ``"fsdp"``: FSDP2 ``fully_shard`` of each block and the
    root over the data-parallel mesh, 1-D (``dp_shard``) or 2-D HSDP (``dp_replicate`` x
    ``dp_shard``), on top of tensor parallelism when ``tp > 1``. Tensor parallelism splits
    each block's qkv and MLP-up matmuls by columns and the two output projections by rows
    (``parallelize_module``), Megatron-style; embeddings, norms and the tied LM head stay whole.
    """
    if not world.distributed:
        return model, "single"
    import torch

    cuda = world.device.startswith("cuda")
    r, s, t = deg["dp_replicate"], deg["dp_shard"], deg["tp"]
    if s == 1 and t == 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(world.device).index] if cuda else None
        return DistributedDataParallel(model, device_ids=ids), "ddp"
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda" if cuda else "cpu", (r, s, t), mesh_dim_names=DEGREE_NAMES)
    if t > 1:
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        plan = {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], plan)
        if r * s == 1:
            return model, "tp"
    from torch.distributed.fsdp import fully_shard

    dp_mesh = mesh["dp_replicate", "dp_shard"] if r > 1 else mesh["dp_shard"]
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=cfg["reshard_after_forward"])
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=cfg["reshard_after_forward"])
    return model, "fsdp"
