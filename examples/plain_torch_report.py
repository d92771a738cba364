"""A plain PyTorch training loop that reports to the lab with ``cubicml_lab.report``: a job to wrap.

A small causal language model (embedding, ``--layers`` transformer blocks, a tied head) trained
on random token ids. Two lines make it measurable by the lab, and do nothing outside it::

    from cubicml_lab import report
    report.step(tokens=..., samples=..., loss=...)     # once per optimizer step
    report.memory()                                    # peak memory, best effort

Run by hand it just trains (``python examples/plain_torch_report.py --batch 8``).
``--own-timings FILE`` writes the script's own time of each optimizer step (one JSON line each),
which the tests and ``benchmarks/command_overhead.py`` hold the lab's figure against.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

from cubicml_lab import report


class TinyLM(nn.Module):
    """Token embedding, ``layers`` pre-norm causal transformer blocks, tied output head."""

    def __init__(self, vocab: int, width: int, layers: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq_len, width))
        block = nn.TransformerEncoderLayer(width, max(1, width // 32), 4 * width, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        x = self.blocks(x, mask=self.mask[: ids.shape[1], : ids.shape[1]], is_causal=True)
        return self.norm(x) @ self.embed.weight.T


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--steps", type=int, default=200,
                   help="optimizer steps (the lab may stop sooner)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--own-timings", default=None, help="write the script's own step times here")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = TinyLM(a.vocab, a.width, a.layers, a.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    own = open(a.own_timings, "a") if a.own_timings else None
    last = time.perf_counter()
    for step in range(1, a.steps + 1):
        for _ in range(a.grad_accum):
            ids = torch.randint(0, a.vocab, (a.batch, a.seq_len))
            logits = model(ids[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
            (loss / a.grad_accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        samples = a.batch * a.grad_accum
        report.step(step=step, samples=samples, tokens=samples * a.seq_len, loss=loss.item())
        if step <= 3 or step % 20 == 0:
            report.memory()
        now = time.perf_counter()
        if own is not None:
            own.write(json.dumps({"step": step, "seconds": now - last}) + "\n")
            own.flush()
        last = now
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    report.memory()


if __name__ == "__main__":
    main()
