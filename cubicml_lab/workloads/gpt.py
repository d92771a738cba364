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
from functools import lru_cache
from typing import Any

from ..errors import ConfigError
from .base import Built, Knob, Workload

__all__ = ["FLOPS_CONVENTION", "GPT", "KNOBS", "GPTWorkload", "flops_per_step"]

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
    "compile": Knob(default=False, type=bool, doc="torch.compile the model"),
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


@lru_cache(maxsize=1)
def _model_class() -> type:
    """Define the torch modules on first use, so that importing this module needs no torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class Attention(nn.Module):
        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, d)
            b, t, d = x.shape
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                       for z in self.qkv(x).split(d, dim=2))  # each (B, heads, T, d/heads)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class MLP(nn.Module):
        def __init__(self, d: int, ratio: int) -> None:
            super().__init__()
            self.fc = nn.Linear(d, ratio * d, bias=False)
            self.proj = nn.Linear(ratio * d, d, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(F.gelu(self.fc(x)))

    class Block(nn.Module):
        def __init__(self, d: int, heads: int, ratio: int, recompute_mlp: bool) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn, self.mlp = Attention(d, heads), MLP(d, ratio)
            self.recompute_mlp = recompute_mlp

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            h = self.ln2(x)
            if self.recompute_mlp and torch.is_grad_enabled():
                return x + checkpoint(self.mlp, h, use_reentrant=False)
            return x + self.mlp(h)

    class GPTModel(nn.Module):
        """Decoder-only LM: ``forward(idx (B, T) int64, targets (B, T) int64) -> mean loss``."""

        def __init__(self, cfg: Mapping[str, Any]) -> None:
            super().__init__()
            d = cfg["d_model"]
            self.recompute = cfg["recompute"]
            self.tok = nn.Embedding(cfg["vocab"], d)
            self.pos = nn.Embedding(cfg["seq_len"], d)
            self.blocks = nn.ModuleList(
                Block(d, cfg["n_heads"], cfg["mlp_ratio"], self.recompute == "selective")
                for _ in range(cfg["n_layers"]))
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, cfg["vocab"], bias=False)
            self.head.weight = self.tok.weight  # weight tying, as GPT-2
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, mean=0.0, std=0.02)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                if self.recompute == "full" and torch.is_grad_enabled():
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            logits = self.head(self.ln_f(x))  # (B, T, vocab)
            return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    return GPTModel


def GPT(cfg: Mapping[str, Any]) -> Any:  # noqa: N802 - reads as the class it builds
    """A fresh, randomly initialised model for a resolved config (an ``nn.Module``)."""
    return _model_class()(cfg)


class GPTWorkload(Workload):
    """Decoder-only transformer LM on synthetic tokens; units are tokens."""

    name = "gpt"
    version = "1"
    units = "tokens"

    def knobs(self) -> dict[str, Knob]:
        return dict(KNOBS)

    def check(self, config: dict[str, Any]) -> None:
        if config["d_model"] % config["n_heads"]:
            divisors = [h for h in range(1, min(config["d_model"], 64) + 1)
                        if config["d_model"] % h == 0]
            raise ConfigError(
                f"n_heads = {config['n_heads']} does not divide d_model = {config['d_model']}",
                hint=f"choose n_heads among {divisors} or change d_model")

    def build(self, config: Mapping[str, Any], device: str) -> Built:
        """Model, fixed synthetic micro-batches and AdamW on ``device``; see the module doc."""
        import contextlib

        import torch

        cfg = self.resolve(config)
        dev = torch.device(device)
        with torch.random.fork_rng(devices=[]):  # seed the weights without touching global RNG
            torch.manual_seed(cfg["seed"])
            model = GPT(cfg)
        model.to(dev).train()
        n_params = sum(p.numel() for p in model.parameters())
        gen = torch.Generator(device=dev).manual_seed(cfg["seed"])
        batches = []
        for _ in range(cfg["grad_accum"]):
            seq = torch.randint(0, cfg["vocab"], (cfg["micro_batch"], cfg["seq_len"] + 1),
                                generator=gen, device=dev)
            batches.append((seq[:, :-1], seq[:, 1:]))
        cuda = dev.type == "cuda"
        impl = {"fused": True} if cuda else {"foreach": True}
        opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95),
                                weight_decay=0.1, **impl)
        fwd = torch.compile(model) if cfg["compile"] else model
        bf16 = cfg["precision"] == "bf16"

        def autocast() -> Any:
            if bf16:
                return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
            return contextlib.nullcontext()

        def step() -> Any:
            for x, y in batches:
                with autocast():
                    loss = fwd(x, y)
                (loss / cfg["grad_accum"]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        sync = (lambda: torch.cuda.synchronize(dev)) if cuda else None
        tokens = cfg["micro_batch"] * cfg["seq_len"] * cfg["grad_accum"]
        return Built(step=step, units_per_step=tokens,
                     flops_per_step=flops_per_step(cfg), flops_convention=FLOPS_CONVENTION,
                     sync=sync, model_params=n_params, precision=cfg["precision"])
