"""The torch modules of the ``gpt`` workload's model: causal self-attention, a GELU MLP, a
pre-norm transformer block and :class:`GPTModel` (:mod:`cubicml_lab.workloads.gpt` describes the
model). Importing this module imports torch; :func:`~cubicml_lab.workloads.gpt.GPT` imports it
on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["GPTModel"]


class Attention(nn.Module):
    """Causal self-attention (``F.scaled_dot_product_attention``): ``(B, T, d) -> (B, T, d)``."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, d)
        b, t, d = x.shape
        hd = d // self.heads
        # qkv's output rows are head-major ([q_h; k_h; v_h] per head), so a tensor-parallel
        # column shard holds whole heads; -1 is the heads on this rank.
        qkv = self.qkv(x).view(b, t, -1, 3, hd)
        q, k, v = (z.transpose(1, 2) for z in qkv.unbind(3))  # each (B, heads, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """GELU MLP ``ratio`` times wider than ``d``: ``(B, T, d) -> (B, T, d)``."""

    def __init__(self, d: int, ratio: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, ratio * d, bias=False)
        self.proj = nn.Linear(ratio * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block; ``recompute_mlp`` recomputes its MLP in the backward pass."""

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

