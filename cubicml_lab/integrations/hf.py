"""A Hugging Face ``transformers`` ``TrainerCallback`` that reports each optimizer step to the lab.

Add it to a ``Trainer`` and run the script as a :class:`~cubicml_lab.workloads.Command`::

    from cubicml_lab.integrations.hf import ReportCallback

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[ReportCallback(seq_len=128)])

After every optimizer step (``on_step_end``: once per ``gradient_accumulation_steps``
micro-batches) every rank reports the samples the step consumed on it,
``per_device_train_batch_size x gradient_accumulation_steps``, and the tokens: the Trainer's own
count (``state.num_input_tokens_seen``, summed over the ranks, divided by ``world_size``) where the
arguments ask for it (``include_num_input_tokens_seen``), else samples x ``seq_len`` where given,
else none. The lab adds the ranks up: a step's figure is per-device batch x gradient accumulation x
world size samples. The
sample count assumes full batches: an epoch's short last batch counts as a full one (set
``dataloader_drop_last=True`` where that matters). Memory
(``report.memory``) after steps 1-3, every ``memory_every`` steps and at the end of training.
Outside the lab it does nothing.

Importing this module imports ``transformers``; where it is missing, a
:class:`~cubicml_lab.errors.DependencyError` says ``pip install 'cubicml-lab[hf]'``.
"""

from __future__ import annotations

from typing import Any

from .. import report
from . import missing, report_step

try:
    from transformers import TrainerCallback
except ImportError as _err:  # pragma: no cover - exercised where transformers is absent
    raise missing("hf", "transformers", _err) from _err

__all__ = ["ReportCallback"]


class ReportCallback(TrainerCallback):  # type: ignore[misc]
    """Reports each optimizer step of a ``transformers.Trainer`` to :mod:`cubicml_lab.report`.

    Args:
        seq_len: Tokens per sample (the sequence length of the training data), for the token
            count where the Trainer does not count tokens itself; ``None``: samples only.
        memory_every: Report memory every this many steps (after the first three); 0: only
            those and the end.

    Attributes:
        steps: Optimizer steps reported so far.
    """

    def __init__(self, seq_len: int | None = None, memory_every: int = 20) -> None:
        self.seq_len = seq_len
        self.memory_every = int(memory_every)
        self.steps = 0
        self._tokens_seen = 0

    @staticmethod
    def samples_per_step(args: Any) -> int:
        """Samples one optimizer step consumes on one rank: per-device batch x gradient
        accumulation (the lab adds the ranks up)."""
        return int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)

    def _tokens(self, args: Any, state: Any, samples: int) -> int | None:
        counted = getattr(args, "include_num_input_tokens_seen", "no") not in ("no", False, None)
        seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        if counted and seen > self._tokens_seen:  # all ranks' tokens: this rank's share
            tokens, self._tokens_seen = seen - self._tokens_seen, seen
            return round(tokens / max(1, int(getattr(args, "world_size", 1) or 1)))
        return samples * int(self.seq_len) if self.seq_len else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._tokens_seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not report.active():
            return
        self.steps += 1
        samples = self.samples_per_step(args)
        report_step(samples, self._tokens(args, state, samples), int(state.global_step),
                    self.steps, self.memory_every)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        report.memory()

    def __repr__(self) -> str:
        tokens = f"samples x {self.seq_len}" if self.seq_len else "the Trainer's count, if any"
        where = report.current().path or "nowhere (not under the lab)"
        return (f"<cubicml_lab HF ReportCallback: each optimizer step to {where}; tokens: "
                f"{tokens}>")
