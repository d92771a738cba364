"""Callbacks that report each optimizer step of a third-party trainer to the lab.

* :class:`cubicml_lab.integrations.hf.ReportCallback`: a Hugging Face ``transformers``
  ``TrainerCallback`` (``pip install 'cubicml-lab[hf]'``).
* :class:`cubicml_lab.integrations.lightning.ReportCallback`: a Lightning ``Callback``
  (``pip install 'cubicml-lab[lightning]'``).

Each calls :func:`cubicml_lab.report.step` on every rank once per optimizer step with the samples
(and tokens, where known) that the step consumed on that rank (the lab adds the ranks up), and
:func:`cubicml_lab.report.memory` after the first steps and then now and then (the lab may stop the
job before it ends). Outside
the lab (no ``CUBICML_LAB_METRICS`` in the environment) they do nothing. Importing this package
imports neither trainer; a missing one is a :class:`~cubicml_lab.errors.DependencyError` with the
``pip`` line, raised by the submodule that needs it.

Example:
    >>> from cubicml_lab import integrations
    >>> integrations.EXTRAS["hf"]
    "pip install 'cubicml-lab[hf]'"
"""

from __future__ import annotations

from typing import Any

from .. import report
from ..errors import DependencyError

__all__ = ["EXTRAS", "memory_due", "missing", "report_step"]

#: The pip line that installs each integration's trainer.
EXTRAS = {"hf": "pip install 'cubicml-lab[hf]'",
          "lightning": "pip install 'cubicml-lab[lightning]'"}


def missing(extra: str, package: str, err: ImportError) -> DependencyError:
    """The error raised where ``package`` (of the ``extra`` integration) cannot be imported."""
    return DependencyError(f"cubicml_lab.integrations.{extra} needs {package}, which cannot be "
                           f"imported here ({type(err).__name__}: {err})", hint=EXTRAS[extra])


def memory_due(steps: int, every: int) -> bool:
    """Whether the step numbered ``steps`` (1 for the first) also reports memory: the first three
    (where the peak is usually reached) and every ``every``-th after (``every`` <= 0: those three
    only).

    Example:
        >>> [s for s in range(1, 50) if memory_due(s, 20)]
        [1, 2, 3, 20, 40]
    """
    return steps <= 3 or (every > 0 and steps % every == 0)


def report_step(samples: int | None, tokens: int | None, step: int | None, steps: int,
                memory_every: int, **extra: Any) -> None:
    """One optimizer step to :mod:`cubicml_lab.report`, and memory where :func:`memory_due`."""
    report.step(tokens=tokens, samples=samples, step=step, **extra)
    if memory_due(steps, memory_every):
        report.memory()
