"""Ready :class:`~cubicml_lab.workloads.Command` recipes for well-known trainers.

:func:`torchtitan`: torchtitan's trainer (``python -m torchtitan.train``) configured by a TOML
file, as torchtitan's releases up to early 2026 are (``--job.config_file``; later ones build
their configs in Python, ``torchtitan/config/``, and take the same dotted keys as command-line
overrides: pass them in ``extra_args`` with placeholders instead). Each trial gets a copy of your
TOML with the searched knobs set at their keys, and with ``metrics.log_freq = 1`` and
``metrics.disable_color_printing = true`` so that every step prints a line that the
:data:`~cubicml_lab.workloads.job_reports.TORCHTITAN` pattern reads (loss, peak reserved memory,
tokens/s per device). Run it with ``launch.Torchrun(nproc_per_node=8)`` (the lab puts the
trainer under torchrun) or ``launch.Slurm(nodes=..., gpus_per_node=8)``; the job's figures are
the slowest rank's as torchtitan reports them (rank 0 logs). Importing this module imports no
torch.

Example:
    >>> import pathlib, tempfile
    >>> toml = pathlib.Path(tempfile.mkdtemp()) / "llama3_debug.toml"
    >>> _ = toml.write_text("[parallelism]\\ntensor_parallel_degree = 1\\n")
    >>> job = torchtitan("llama3-debug", toml, {"parallelism.tensor_parallel_degree": "tp"})
    >>> job.render({"tp": 2}, trial_dir="/t").argv[1:]
    ['-m', 'torchtitan.train', '--job.config_file', '/t/llama3_debug.toml']
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .command import Command
from .config_files import set_dotted

__all__ = ["TORCHTITAN_KEYS", "torchtitan"]

#: torchtitan's TOML keys for the knobs people search most, by the lab's parallelism vocabulary
#: (from torchtitan's ``[parallelism]``, ``[training]``, ``[activation_checkpoint]`` and
#: ``[compile]`` sections): a starting point for ``config_keys``.
TORCHTITAN_KEYS = {"dp_replicate": "parallelism.data_parallel_replicate_degree",
                   "dp_shard": "parallelism.data_parallel_shard_degree",
                   "tp": "parallelism.tensor_parallel_degree",
                   "pp": "parallelism.pipeline_parallel_degree",
                   "cp": "parallelism.context_parallel_degree",
                   "micro_batch": "training.local_batch_size",
                   "seq_len": "training.seq_len",
                   "recompute": "activation_checkpoint.mode",
                   "compile": "compile.enable"}


def torchtitan(name: str, config_file: str | os.PathLike[str], config_keys: Mapping[str, str],
               *, python: str | None = None, extra_args: Sequence[str] = (),
               env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
               **kwargs: Any) -> Command:
    """A :class:`Command` running torchtitan's trainer on your TOML config.

    Args:
        name: The workload's name.
        config_file: Your torchtitan TOML (e.g. a copy of a model's ``train_configs/*.toml``).
        config_keys: Dotted TOML key -> knob name, e.g.
            ``{"parallelism.tensor_parallel_degree": "tp"}`` (:data:`TORCHTITAN_KEYS` lists
            the usual keys).
        python: The Python with torchtitan installed; default this one.
        extra_args: More arguments after the config file (placeholders allowed), e.g.
            ``["--training.steps=1000"]``.
        env: Environment variables for the job.
        cwd: Where to run (a torchtitan checkout, for its relative asset paths).
        **kwargs: Other :class:`Command` arguments (``timeout_s``, ``stall_s``, ...).

    Raises:
        ConfigError: As :class:`Command`.
    """
    job = Command(name, argv=[python or sys.executable, "-m", "torchtitan.train",
                              "--job.config_file", "{config_file}", *extra_args],
                  env=env, config_file=config_file, config_keys=config_keys,
                  metrics=["torchtitan"], units="tokens", cwd=cwd, **kwargs)
    assert job.config_template is not None
    set_dotted(job.config_template, "metrics.log_freq", 1)  # a line per step
    set_dotted(job.config_template, "metrics.disable_color_printing", True)
    return job
