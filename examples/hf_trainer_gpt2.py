"""A Hugging Face ``Trainer`` training a small GPT-2 on synthetic tokens: a job to wrap.

The model is built from a ``GPT2Config`` (nothing is downloaded) and the data are random token
ids, so the script runs anywhere ``transformers`` does. Its training-speed knobs are flags::

    python examples/hf_trainer_gpt2.py --batch 4 --grad-accum 2 --grad-ckpt true --workers 0

``cubicml_lab.integrations.hf.ReportCallback`` reports each optimizer step to the lab when it runs
the script as a :class:`cubicml_lab.workloads.Command`; run by hand, the script just trains.
``--own-timings FILE`` writes the script's own time of each optimizer step (one JSON line each),
which ``tests/test_own_jobs.py`` holds the lab's figure against.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from cubicml_lab.integrations.hf import ReportCallback


class RandomTokens(torch.utils.data.Dataset):
    """``n`` sequences of ``seq_len`` random token ids below ``vocab`` (fixed by ``seed``)."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class OwnTimings(TrainerCallback):
    """The script's own clock: one line per optimizer step with the seconds since the last one."""

    def __init__(self, path: str) -> None:
        self.path, self.last = path, None

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        if self.last is None:
            self.last = time.perf_counter()  # the first step is timed from its own start

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        now = time.perf_counter()
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": state.global_step, "seconds": now - self.last}) + "\n")
        self.last = now


def _flag(text: str) -> bool:
    """``true``/``false`` (as the lab writes a bool knob) or ``1``/``0``."""
    if text.lower() not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"{text!r} is not true, false, 1 or 0")
    return text.lower() in ("true", "1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4, help="per-device batch (sequences)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--grad-ckpt", type=_flag, default=False,
                   help="gradient (activation) checkpointing: true/false or 1/0")
    p.add_argument("--workers", type=int, default=0, help="dataloader worker processes")
    p.add_argument("--steps", type=int, default=60,
                   help="optimizer steps (the lab may stop sooner)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--own-timings", default=None, help="write the script's own step times here")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=a.vocab, n_positions=a.seq_len, n_embd=a.width,
                        n_layer=a.layers, n_head=max(1, a.width // 32))
    model = GPT2LMHeadModel(config)
    data = RandomTokens(a.steps * a.batch * a.grad_accum, a.seq_len, a.vocab)
    out = tempfile.mkdtemp(prefix="hf-gpt2-")
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=a.batch,
        gradient_accumulation_steps=a.grad_accum,
        gradient_checkpointing=a.grad_ckpt, dataloader_num_workers=a.workers,
        max_steps=a.steps, learning_rate=1e-3, report_to=[], save_strategy="no",
        logging_steps=10, use_cpu=True, disable_tqdm=True, dataloader_drop_last=True, seed=0)
    callbacks = [ReportCallback(seq_len=a.seq_len)]
    if a.own_timings:
        callbacks.append(OwnTimings(a.own_timings))
    Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks).train()
    os.rmdir(out) if not os.listdir(out) else None


if __name__ == "__main__":
    main()
