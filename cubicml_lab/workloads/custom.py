"""Your own PyTorch model and optimizer as a workload, timed by the lab's harness like ``gpt``.

:class:`PythonWorkload` wraps a function ``make(config, device)`` that builds a model, its data and
an optimizer and returns a ``step()`` doing one optimizer step (and returning the loss). The lab
then times it exactly as it times the built-in workloads (:func:`cubicml_lab.trials.run_trial`):
warm-up, timed windows with device events on CUDA, the contention guard and drift reference on
the CPU, peak memory, a 95% CI. Register it under a name so that campaigns and
:func:`cubicml_lab.measure` find it (:func:`cubicml_lab.workloads.register`); to run it in a
fresh process (``Subprocess``, ``Torchrun``, ``LocalPool``), define it in a module file and
register its import path::

    # my_models.py
    import torch
    from cubicml_lab.workloads import PythonWorkload

    def make(config, device):
        model = torch.nn.Sequential(torch.nn.Linear(256, config["width"]), torch.nn.ReLU(),
                                    torch.nn.Linear(config["width"], 256)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(config["batch"], 256, device=device)
        def step():
            opt.zero_grad(set_to_none=True)
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return step, model

    mlp = PythonWorkload("mlp", make, knobs={"batch": 32, "width": 512}, units_per_step="batch")

    # the notebook
    cml.workloads.register("mlp", "my_models:mlp")

Importing this module imports no torch (``make`` does, when a trial builds the job).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._params import brief
from .._params import check_name as check_knob_name
from ..errors import ConfigError, SpaceError
from .base import Built, Knob, Workload
from .registry import check_name

if TYPE_CHECKING:
    from .parallel import World

__all__ = ["PythonWorkload"]

_TYPES = (bool, int, float, str)


def _cuda_sync(device: Any) -> Callable[[], None]:
    """A function that waits for ``device``'s queued kernels (the measurement's clock)."""
    import torch

    def sync() -> None:
        torch.cuda.synchronize(device)
    return sync


def _knob(name: str, value: Any) -> Knob:
    """A :class:`Knob` as given, or one whose default (and type) is ``value``."""
    if isinstance(value, Knob):
        return value
    if not isinstance(value, _TYPES):
        raise ConfigError(f"knob {name!r} = {brief(value)}: give a default (bool, int, float "
                          "or str) or a Knob", hint=f'e.g. knobs={{"{name}": 32}}')
    low = 1 if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None
    return Knob(default=value, type=type(value), low=low)


class PythonWorkload(Workload):
    """A workload made from a function that builds one training step (see the module docstring).

    Args:
        name: The workload's name (what :func:`~cubicml_lab.workloads.register` registers it as
            sets it again).
        make: ``make(config, device) -> step``, or ``-> (step, model)`` to count the model's
            parameters, or ``-> Built`` for full control; ``config`` holds every knob, ``device``
            is ``"cpu"`` or ``"cuda:N"``; ``step()`` runs one optimizer step and returns the loss
            (a 0-d tensor or a float; it is not synchronised).
        knobs: Knob name -> its default (its type taken from it; a whole number >= 1 is kept >=
            1) or a :class:`~cubicml_lab.workloads.Knob`.
        units: What a step consumes, ``"samples"`` or ``"tokens"``.
        units_per_step: Units one step consumes: a number, a knob's name, or a function of the
            config.
        flops_per_step: Model FLOPs per step (a number or a function of the config), for MFU;
            ``None``: unknown (no MFU).
        version: Recorded with each trial; change it when ``make`` changes.

    Raises:
        ConfigError: A knob default that is not a plain scalar, units other than tokens or
            samples, or ``units_per_step`` naming no knob.

    Example:
        >>> wl = PythonWorkload("toy", lambda config, device: None, knobs={"batch": 8},
        ...                     units_per_step="batch")
        >>> wl.resolve({"batch": 16}), wl.units_for({"batch": 16})
        ({'batch': 16}, 16)
    """

    def __init__(self, name: str, make: Callable[[dict[str, Any], str], Any], *,
                 knobs: Mapping[str, Any], units: str = "samples",
                 units_per_step: int | str | Callable[[Mapping[str, Any]], float] = 1,
                 flops_per_step: float | Callable[[Mapping[str, Any]], float] | None = None,
                 version: str = "1") -> None:
        check_name(name)
        if not isinstance(knobs, Mapping):
            raise ConfigError(f"PythonWorkload {name!r}: knobs = {brief(knobs)} is not a dict",
                              hint='e.g. knobs={"batch": 8}')
        for knob in knobs:
            try:
                check_knob_name("knob", knob)
            except SpaceError as err:
                raise ConfigError(f"PythonWorkload {name!r}: {err.message}",
                                  hint=err.hint) from None
        if not callable(make):
            raise ConfigError(f"PythonWorkload {name!r}: make = {brief(make)} is not callable",
                              hint="pass make(config, device) returning a step function")
        if not isinstance(units, str) or units not in ("samples", "tokens"):
            raise ConfigError(f"PythonWorkload {name!r}: units = {brief(units)}",
                              hint="'samples' or 'tokens'")
        self.name, self.version, self.units = name, version, units
        self.make = make
        self._knobs = {k: _knob(k, v) for k, v in dict(knobs).items()}
        if isinstance(units_per_step, str) and units_per_step not in self._knobs:
            raise ConfigError(f"PythonWorkload {name!r}: units_per_step = "
                              f"{brief(units_per_step)} "
                              "is not a knob", hint=f"knobs: {', '.join(self._knobs)}")
        self.units_per_step = units_per_step
        self.flops_per_step = flops_per_step

    def knobs(self) -> dict[str, Knob]:
        """The knobs given to the constructor."""
        return dict(self._knobs)

    def units_for(self, config: Mapping[str, Any]) -> int:
        """Units one step of ``config`` consumes."""
        u = self.units_per_step
        value = config[u] if isinstance(u, str) else u(config) if callable(u) else u
        return int(value)

    def _flops(self, config: Mapping[str, Any]) -> float:
        f = self.flops_per_step
        return math.nan if f is None else float(f(config) if callable(f) else f)

    def build(self, config: Mapping[str, Any], device: str, world: World | None = None) -> Built:
        """Call ``make`` and wrap what it returns in a :class:`Built` (one process only)."""
        if world is not None and world.world_size > 1:
            raise ConfigError(f"PythonWorkload {self.name!r} runs in one process; this job has "
                              f"{world.world_size}", hint="use InProcess or Subprocess")
        config = self.resolve(config)
        out = self.make(dict(config), device)
        if isinstance(out, Built):
            return out
        step, model = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
        if not callable(step):
            raise ConfigError(f"PythonWorkload {self.name!r}: make returned {type(out).__name__}"
                              ", not a step function", hint="return step or (step, model)")
        params = sum(p.numel() for p in model.parameters()) if model is not None else 0
        sync = _cuda_sync(device) if str(device).startswith("cuda") else None
        return Built(step=step, units_per_step=self.units_for(config),
                     flops_per_step=self._flops(config),
                     flops_convention="given by the workload" if self.flops_per_step is not None
                     else "unknown", sync=sync, model_params=int(params),
                     precision=str(config.get("precision", "fp32")))

    def __repr__(self) -> str:
        knobs = ", ".join(f"{k}={v.default!r}" for k, v in self._knobs.items())
        return f"<PythonWorkload {self.name!r} v{self.version} ({self.units}/step; {knobs})>"
