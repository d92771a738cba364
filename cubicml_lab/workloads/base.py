"""What a workload is: named knobs with defaults and checks, and a built, steppable training job.

A :class:`Workload` describes its configuration as :class:`Knob` objects (default, type, allowed
values or range, unit, doc). :meth:`Workload.resolve` fills in defaults and checks a config,
raising :class:`~cubicml_lab.errors.ConfigError` that names the offending knob and what is allowed;
:meth:`Workload.build` turns a config into a :class:`Built` job whose ``step()`` runs one real
optimizer step. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from .parallel import World

__all__ = ["Built", "Knob", "Workload", "seeded_on"]

_TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str"}


@contextlib.contextmanager
def seeded_on(device: Any, seed: int) -> Iterator[None]:
    """Modules made inside are created directly on ``device`` (torch's default-device context),
    their weights drawn from ``seed``; every global RNG is as it was afterwards.

    On a GPU the weights never pass through host memory: a model larger than the host's RAM can be
    built, and one larger than the GPU's memory should fail with CUDA's out-of-memory error at
    once (a trial with status ``oom``) instead of filling the host first (not yet run on a GPU:
    ``tests/test_gpu.py``'s out-of-memory test checks it there). The same seed gives the same
    weights on every device of one kind (CPU and CUDA draw from different generators).
    """
    import torch

    dev = torch.device(device)
    cuda = [dev.index if dev.index is not None else torch.cuda.current_device()] \
        if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), dev:
        torch.manual_seed(seed)
        yield


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One configuration knob of a workload.

    Attributes:
        default: Value used when a config leaves the knob out.
        type: ``bool``, ``int``, ``float`` or ``str``.
        choices: Allowed values (required for ``str`` knobs), or ``None`` for any in range.
        low: Smallest allowed value of a number (inclusive), or ``None``.
        high: Largest allowed value of a number (inclusive), or ``None``.
        unit: Unit of the value (e.g. ``"tokens"``), ``""`` if none.
        doc: One line on what the knob does.
    """

    default: Any
    type: type
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    unit: str = ""
    doc: str = ""

    def allowed(self) -> str:
        """The allowed values in words, e.g. ``"int >= 1"`` or ``"one of 'fp32', 'bf16'"``."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        text = _TYPE_NAMES[self.type]
        if self.low is not None and self.high is not None:
            return f"{text} in [{self.low}, {self.high}]"
        if self.low is not None:
            return f"{text} >= {self.low}"
        return text if self.high is None else f"{text} <= {self.high}"

    def check(self, name: str, value: Any) -> Any:
        """Return ``value`` in the knob's type (an integral float becomes an int) or raise.

        Raises:
            ConfigError: Wrong type, not among the choices, or out of range; names the knob.
        """
        v = value
        if self.type is int and isinstance(v, float) and v.is_integer():
            v = int(v)
        if self.type is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        ok = isinstance(v, self.type) and (self.type is bool or not isinstance(v, bool))
        if ok and self.type is float:
            ok = math.isfinite(v)
        if ok and self.choices is not None:
            ok = v in self.choices
        if ok and self.low is not None:
            ok = v >= self.low
        if ok and self.high is not None:
            ok = v <= self.high
        if not ok:
            raise ConfigError(f"knob {name!r} = {value!r} is not allowed: must be {self.allowed()}",
                              hint=f"default: {self.default!r}; {self.doc}")
        return v


@dataclass(frozen=True, kw_only=True)
class Built:
    """A training job ready to step, with what measurement needs to know about it.

    Attributes:
        step: Runs one optimizer step; returns the loss (a 0-d tensor, not synchronised).
        units_per_step: Tokens or samples consumed per optimizer step (all devices).
        flops_per_step: Model FLOPs per optimizer step (convention in ``flops_convention``).
        flops_convention: How ``flops_per_step`` is counted, in words.
        sync: Blocks until queued device work is done (``None`` on CPU).
        model_params: Parameters of the model (each tied weight counted once).
        precision: Precision the matmuls run in (``"fp32"``, ``"bf16"``...), for the peak FLOP/s.
        n_devices: Devices (processes) the step runs on; units and FLOPs are their total.
        parallel: How the job is split, for the record (e.g. ``{"dp_shard": 2, "tp": 1,
            "strategy": "fsdp"}``); empty for one process.
        matmul_rows: Rows of the step's large matmuls on one process in one micro-step (tokens
            per micro-batch, samples per batch); the CPU drift reference is sized near it
            (:func:`~cubicml_lab.hardware.reference_rows`). ``None``: not said (the default
            size).
    """

    step: Callable[[], Any]
    units_per_step: int
    flops_per_step: float
    flops_convention: str
    sync: Callable[[], None] | None
    model_params: int
    precision: str = "fp32"
    n_devices: int = 1
    parallel: dict[str, Any] = field(default_factory=dict)
    matmul_rows: int | None = None


class Workload(ABC):
    """A real training workload built from a config of knobs.

    Subclasses set ``name``, ``version`` and ``units`` and implement :meth:`knobs` and
    :meth:`build` (plus :meth:`check` for rules that involve several knobs).
    """

    name: str = ""
    version: str = ""
    units: str = "samples"  #: "tokens" or "samples"
    #: Fixed small configurations of this workload whose steps are the CPU drift references of
    #: its trials (:class:`~cubicml_lab.hardware.StepReference`), for a workload that the default
    #: reference, a matmul-bound MLP sized to the trial's rows per matmul
    #: (:class:`~cubicml_lab.hardware.ReferenceWork`), does not follow; empty: that MLP. Where
    #: there are several, their nominal speeds are measured together (one scale) and
    #: :meth:`drift_reference_for` picks a trial's. Choose by measuring
    #: (``benchmarks/measure_repeatability.py``): the reference that the trials' figures spread
    #: least over across fresh processes.
    drift_references: tuple[Mapping[str, Any], ...] = ()

    def drift_reference_for(self, config: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The one of :attr:`drift_references` that gauges a trial of ``config`` (resolved):
        the first; ``None`` where there is none (the MLP). A workload with several overrides
        this."""
        return self.drift_references[0] if self.drift_references else None

    @abstractmethod
    def knobs(self) -> dict[str, Knob]:
        """Every knob by name."""

    @abstractmethod
    def build(self, config: Mapping[str, Any], device: str, world: World | None = None) -> Built:
        """Build the model, data and optimizer on ``device`` (``config`` is resolved first).

        ``world`` is this process's place in a multi-process job (``None``: a single process);
        the workload parallelises itself over it, and ``Built.units_per_step`` and
        ``flops_per_step`` count every rank.
        """

    def check_world(self, config: Mapping[str, Any], world_size: int) -> None:
        """Raise ConfigError if ``config`` cannot run on ``world_size`` processes. Default: any."""

    def check(self, config: dict[str, Any]) -> None:
        """Rules across knobs (e.g. heads divide the width); raise ConfigError. Default: none."""

    def default_config(self) -> dict[str, Any]:
        """Every knob with its default value."""
        return {name: knob.default for name, knob in self.knobs().items()}

    def resolve(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``config`` with defaults filled in, each value checked.

        Raises:
            ConfigError: An unknown knob (naming it and listing the known ones), a value of the
                wrong type or out of range (naming the knob and what is allowed), or a broken
                rule across knobs.
        """
        config = dict(config or {})
        knobs = self.knobs()
        unknown = sorted(set(config) - set(knobs), key=str)
        if unknown:
            raise ConfigError(f"unknown knob(s) {unknown} for workload {self.name!r}",
                              hint=f"known knobs: {', '.join(knobs)}")
        out = {name: knob.check(name, config.get(name, knob.default))
               for name, knob in knobs.items()}
        self.check(out)
        return out

    def describe(self) -> str:
        """A table of the knobs: name, default, allowed values, unit and doc, one per line."""
        rows = [f"{n:<12} {k.default!r:<8} {k.allowed():<34} {k.unit:<8} {k.doc}"
                for n, k in self.knobs().items()]
        return f"workload {self.name!r} v{self.version} ({self.units}/step)\n" + "\n".join(rows)

    def __repr__(self) -> str:
        return f"<Workload {self.name!r} v{self.version}>"
