"""A Lightning ``Callback`` that reports each optimizer step to the lab.

Add it to a ``Trainer`` and run the script as a :class:`~cubicml_lab.workloads.Command`::

    from cubicml_lab.integrations.lightning import ReportCallback

    trainer = L.Trainer(max_steps=1000, callbacks=[ReportCallback()])

Lightning calls ``on_train_batch_end`` once per batch; an optimizer step happened when
``trainer.global_step`` moved (every ``accumulate_grad_batches`` batches), and only then does the
callback report, on every rank, with the samples of this rank's batches since the last step (the
first dimension of the batch's first tensor, or of ``input_ids``; the lab adds the ranks up), the
tokens where the batch holds token ids (an integer tensor of shape ``[batch, seq]``) or
``seq_len`` is given, and the loss the training step returned. Memory (``report.memory``) after
steps 1-3, every ``memory_every`` steps and at the end of training. Outside the lab it does
nothing.

Importing this module imports ``lightning`` (or, where only that is installed,
``pytorch_lightning``); where neither is, a :class:`~cubicml_lab.errors.DependencyError` says
``pip install 'cubicml-lab[lightning]'``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import report
from . import missing, report_step

try:
    from lightning.pytorch import Callback
except ImportError as _err:  # pragma: no cover - exercised where lightning is absent
    try:
        from pytorch_lightning import Callback
    except ImportError:
        raise missing("lightning", "lightning", _err) from _err

__all__ = ["ReportCallback", "batch_counts"]


def _first_tensor(batch: Any) -> Any:
    """The tensor a batch's size is read from: ``input_ids`` of a mapping, else its first
    tensor (depth first through lists, tuples and mappings); ``None`` where there is none."""
    if hasattr(batch, "shape"):
        return batch
    if isinstance(batch, Mapping):
        items = [batch["input_ids"]] if "input_ids" in batch else list(batch.values())
    elif isinstance(batch, (list, tuple)):
        items = list(batch)
    else:
        return None
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


def batch_counts(batch: Any, seq_len: int | None = None) -> tuple[int | None, int | None]:
    """``(samples, tokens)`` of one batch on one rank: samples from the first dimension of
    :func:`_first_tensor`, tokens as samples x ``seq_len`` where given, else samples x the second
    dimension where that tensor holds integers of shape ``[batch, seq]`` (token ids).

    Example:
        >>> import torch
        >>> batch_counts({"input_ids": torch.zeros(4, 16, dtype=torch.long)})
        (4, 64)
        >>> batch_counts((torch.zeros(8, 3), torch.zeros(8)))
        (8, None)
    """
    t = _first_tensor(batch)
    if t is None or len(t.shape) == 0:
        return None, None
    samples = int(t.shape[0])
    if seq_len:
        return samples, samples * int(seq_len)
    is_ids = len(t.shape) == 2 and not getattr(t, "is_floating_point", lambda: True)()
    return samples, samples * int(t.shape[1]) if is_ids else None


def _loss(outputs: Any) -> float | None:
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    try:
        return float(loss) if loss is not None else None
    except (TypeError, ValueError, RuntimeError):
        return None


class ReportCallback(Callback):  # type: ignore[misc]
    """Reports each optimizer step of a Lightning ``Trainer`` to :mod:`cubicml_lab.report`.

    Args:
        seq_len: Tokens per sample, where the batch does not show them (see :func:`batch_counts`).
        memory_every: Report memory every this many steps (after the first three); 0: only those
            and the end.
        loss: Report the loss the training step returned (a device sync per step on a GPU).

    Attributes:
        steps: Optimizer steps reported so far.
    """

    def __init__(self, seq_len: int | None = None, memory_every: int = 20,
                 loss: bool = True) -> None:
        self.seq_len, self.memory_every, self.loss = seq_len, int(memory_every), loss
        self.steps = 0
        self._last_step: int | None = None
        self._pending = [0, 0, True]  # samples, tokens, tokens known since the last step

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_step = int(trainer.global_step)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not report.active():
            return
        samples, tokens = batch_counts(batch, self.seq_len)
        pending = self._pending
        pending[0] += samples or 0
        pending[1] += tokens or 0
        pending[2] = pending[2] and tokens is not None
        if self._last_step is not None and int(trainer.global_step) == self._last_step:
            return  # an accumulation micro-batch: no optimizer step yet
        self._last_step = int(trainer.global_step)
        self.steps += 1
        extra = {"loss": _loss(outputs)} if self.loss else {}
        report_step(pending[0] or None, pending[1] if pending[2] else None,
                    self._last_step, self.steps, self.memory_every, **extra)
        self._pending = [0, 0, True]

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        report.memory()

    def __repr__(self) -> str:
        where = report.current().path or "nowhere (not under the lab)"
        return f"<cubicml_lab Lightning ReportCallback: each optimizer step to {where}>"
