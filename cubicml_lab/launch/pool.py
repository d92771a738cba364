"""Keep one machine busy with independent trials, each on devices of its own.

:class:`LocalPool` splits this machine's devices into slots of ``devices_per_trial``: its CPU
cores (the ones this process may use) or its GPUs. Each trial waits for a free slot and runs in a
fresh interpreter (a :class:`~cubicml_lab.launch.Subprocess`, or a
:class:`~cubicml_lab.launch.Torchrun` job with ``nproc_per_node`` processes) pinned to it:

* CPU: the trial process (every torchrun worker too) binds itself to the slot's cores
  (``os.sched_setaffinity`` in :mod:`~cubicml_lab.launch.worker`, from
  ``CUBICML_LAB_CPUS``) and ``OMP_NUM_THREADS`` is the slot's core count.
* CUDA: ``CUDA_VISIBLE_DEVICES`` lists the slot's GPUs, so the trial sees them as
  ``cuda:0 ..``.

Two trials never share a core or a GPU. ``Campaign.run(parallel=pool.slots)`` keeps every slot
busy; with a larger ``parallel`` the extra trials wait for a slot. A torchrun job's rendezvous
takes a free localhost port of its own (see :class:`~cubicml_lab.launch.Torchrun`). The trial's
hardware record carries ``cpu_affinity``, the cores it ran on.

Example:
    >>> from cubicml_lab.launch import LocalPool
    >>> pool = LocalPool(devices_per_trial=1, devices=[0, 1, 2])
    >>> pool.slots, pool.describe()["slot_devices"]
    (3, [[0], [1], [2]])
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._bounds import check_count
from .._params import brief
from ..errors import ConfigError
from .base import MAX_PROCS_PER_NODE, Launcher, local_process_limit
from .subprocess import Subprocess
from .torchrun import Torchrun

if TYPE_CHECKING:
    from ..trials import TrialResult

__all__ = ["CPUS_ENV", "LocalPool"]

#: Environment variable naming the CPU cores a trial process binds itself to ("0,1").
CPUS_ENV = "CUBICML_LAB_CPUS"


def _machine_devices(kind: str) -> list[int]:
    if kind == "cpu":
        return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else list(range(os.cpu_count() or 1))
    import torch

    return list(range(torch.cuda.device_count()))


def _device_ids(devices: Sequence[int] | None, kind: str) -> list[int]:
    """The pool's device ids: ``devices`` (at most :data:`MAX_PROCS_PER_NODE` of them, each a
    distinct int below it, read no further than that) or the machine's."""
    if devices is None:
        return _machine_devices(kind)
    try:
        ids = list(itertools.islice(devices, MAX_PROCS_PER_NODE + 1))
    except TypeError:
        ids = [devices]  # type: ignore[list-item]  # not iterable: refused below
    if len(ids) > MAX_PROCS_PER_NODE:
        raise ConfigError(f"LocalPool devices: more than {MAX_PROCS_PER_NODE} ids, the most one "
                          "machine holds", hint="e.g. devices=[0, 1]")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_PROCS_PER_NODE
               for i in ids) or len(set(ids)) != len(ids):
        raise ConfigError(f"LocalPool devices = {brief(ids)} must be distinct ints from 0 to "
                          f"{MAX_PROCS_PER_NODE - 1}", hint="e.g. devices=[0, 1]")
    return ids


class LocalPool(Launcher):
    """Run trials side by side on this machine, each pinned to its own cores or GPUs.

    Args:
        devices_per_trial: Cores (``device="cpu"``) or GPUs (``"cuda"``) each trial gets.
        device: ``"cpu"`` or ``"cuda"``: which devices are split into slots.
        nproc_per_node: Processes per trial; above 1 each trial is a torchrun job on its slot.
        devices: The core or GPU ids to use (default: every core this process may run on, or
            every visible GPU).
        timeout_s: Wall-clock limit per trial, seconds.
        memory_limit_gib: Address-space cap per trial process, GiB (see ``Subprocess``).
        python: Interpreter for the trials.
        env: Extra environment variables for every trial.

    Attributes:
        slots: Trials that can run at once: ``len(devices) // devices_per_trial``.

    Raises:
        ConfigError: Fewer devices than one trial needs, a size past what this machine holds
            (:func:`~cubicml_lab.launch.base.local_process_limit`; at most 1024 device ids),
            or a bad option; the message says how many there are and which limit.
    """

    def __init__(self, devices_per_trial: int = 1, *, device: str = "cpu",
                 nproc_per_node: int = 1, devices: Sequence[int] | None = None,
                 timeout_s: float = 600, memory_limit_gib: float | None = None,
                 python: str | os.PathLike[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        limit, why = local_process_limit()
        devices_per_trial = check_count("LocalPool devices_per_trial", devices_per_trial,
                                        high=limit, error=ConfigError, why=why)
        nproc_per_node = check_count("LocalPool nproc_per_node", nproc_per_node, high=limit,
                                     error=ConfigError, why=why)
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"LocalPool device = {brief(device)} is not 'cpu' or 'cuda'",
                              hint="device='cpu' pins cores, device='cuda' pins GPUs")
        ids = _device_ids(devices, device)
        n = len(ids) // devices_per_trial
        if n < 1:
            raise ConfigError(f"LocalPool: {len(ids)} {device} device(s) {brief(ids)}, fewer than "
                              f"devices_per_trial = {devices_per_trial}",
                              hint=f"use devices_per_trial <= {max(1, len(ids))}")
        self.device = device
        self.devices_per_trial = devices_per_trial
        self.nproc_per_node = nproc_per_node
        self._slot_devices = [ids[i * devices_per_trial:(i + 1) * devices_per_trial]
                              for i in range(n)]
        self._runners = [self._runner(d, timeout_s, memory_limit_gib, python, env or {})
                         for d in self._slot_devices]
        self._free = list(range(n))
        self._cond = threading.Condition()

    def _runner(self, ids: list[int], timeout_s: float, memory_limit_gib: float | None,
                python: Any, env: dict[str, str]) -> Subprocess:
        joined = ",".join(str(i) for i in ids)
        pin = ({CPUS_ENV: joined, "OMP_NUM_THREADS": str(max(1, len(ids) // self.nproc_per_node))}
               if self.device == "cpu" else {"CUDA_VISIBLE_DEVICES": joined})
        options = {"timeout_s": timeout_s, "memory_limit_gib": memory_limit_gib,
                   "python": python, "env": {**env, **pin}}
        if self.nproc_per_node > 1:
            return Torchrun(self.nproc_per_node, **options)
        return Subprocess(**options)

    @property
    def slots(self) -> int:
        return len(self._slot_devices)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node

    def run(self, spec: dict[str, Any], *,
            on_start: Callable[[dict[str, Any]], None] | None = None) -> TrialResult:
        """Wait for a free slot, run the trial pinned to it, free the slot, return the result."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._free))
            slot = self._free.pop(0)
        try:
            return self._runners[slot].run(spec, on_start=on_start)
        finally:
            with self._cond:
                self._free.append(slot)
                self._cond.notify()

    def cancel(self) -> int:
        """Kill every trial the pool is running now; returns how many."""
        return sum(runner.cancel() for runner in self._runners)

    def describe(self) -> dict[str, Any]:
        inner = self._runners[0].describe()
        inner["env"] = {k: v for k, v in inner["env"].items()
                        if k not in (CPUS_ENV, "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")}
        return {"kind": "local_pool", "device": self.device,
                "devices_per_trial": self.devices_per_trial,
                "nproc_per_node": self.nproc_per_node,
                "slot_devices": [list(d) for d in self._slot_devices],
                **{k: inner[k] for k in ("timeout_s", "memory_limit_gib", "python", "env")}}
