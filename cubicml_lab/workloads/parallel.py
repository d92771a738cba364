"""The process group a trial runs in: one process, or one rank of a ``torchrun`` job.

:func:`init_world` reads the environment ``torchrun`` sets (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``) and, when there is more
than one rank, joins the default process group: gloo on CPU, NCCL on CUDA, each rank on
``cuda:LOCAL_RANK``. The :class:`World` it returns is what a workload needs to parallelise itself
and what measurement needs to agree across ranks (:meth:`World.max`, :meth:`World.mean`).

:func:`resolve_degrees` checks the parallel degrees of a config against the world size, with the
torchtitan names: ``dp_replicate`` (replicas, DDP or HSDP's outer dimension), ``dp_shard`` (FSDP
shards; ``-1`` means "whatever is left") and ``tp`` (tensor parallel). Their product must equal the
world size, and the error says every factor.

Importing this module imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["DEGREE_NAMES", "World", "close_world", "init_world", "resolve_degrees"]

DEGREE_NAMES = ("dp_replicate", "dp_shard", "tp")
_INIT_TIMEOUT_S = 300  # a rank that waits this long for its peers at a collective gives up


@dataclass(frozen=True, kw_only=True)
class World:
    """Where this process stands in the job.

    Attributes:
        rank: Global rank, 0 .. world_size - 1.
        world_size: Processes in the job (devices, one per process).
        local_rank: Rank on this node (selects ``cuda:local_rank``).
        nnodes: Nodes in the job (``world_size / LOCAL_WORLD_SIZE``).
        backend: ``"gloo"`` or ``"nccl"``; ``None`` for a single process.
        device: The torch device of this rank, e.g. ``"cpu"`` or ``"cuda:1"``.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    nnodes: int = 1
    backend: str | None = None
    device: str = "cpu"

    @property
    def distributed(self) -> bool:
        """More than one rank (a process group is initialised)."""
        return self.world_size > 1

    def _all_reduce(self, value: float, op: str) -> float:
        if not self.distributed:
            return float(value)
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        return float(t.item())

    def max(self, value: float) -> float:
        """Largest ``value`` over ranks (a collective: every rank must call it)."""
        return self._all_reduce(value, "MAX")

    def mean(self, value: float) -> float:
        """Mean of ``value`` over ranks (a collective); NaN on any rank gives NaN."""
        return self._all_reduce(value, "SUM") / self.world_size

    def describe(self) -> dict[str, Any]:
        """``world_size, nnodes, backend`` for the hardware record."""
        return {"world_size": self.world_size, "nnodes": self.nnodes, "backend": self.backend}


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"environment variable {name} = {text!r} is not an integer",
                          hint="launch multi-process trials with torchrun, which sets it") from None


def init_world(device: str) -> World:
    """Join the job this process belongs to (none if ``WORLD_SIZE`` is unset or 1).

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; with several ranks on CUDA, each rank uses
            ``cuda:LOCAL_RANK`` (a given index is ignored).

    Returns:
        The :class:`World`; for several ranks the default process group is initialised (gloo on
        CPU, NCCL on CUDA) and must be closed with :func:`close_world`.
    """
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:
        return World(device=device)
    import torch
    import torch.distributed as dist

    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = max(1, _env_int("LOCAL_WORLD_SIZE", world_size))
    cuda = device.startswith("cuda")
    if cuda:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(torch.device(device))
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        from datetime import timedelta

        kwargs: dict[str, Any] = {"device_id": torch.device(device)} if cuda else {}
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=_INIT_TIMEOUT_S),
                                **kwargs)
    return World(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank,
                 nnodes=max(1, world_size // local_world), backend=backend, device=device)


def close_world(world: World) -> None:
    """Leave the process group :func:`init_world` joined (no-op for a single process)."""
    if not world.distributed:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def resolve_degrees(config: Mapping[str, Any], world_size: int) -> dict[str, int]:
    """The parallel degrees of ``config``, with ``dp_shard = -1`` filled in, checked.

    Args:
        config: Holds ``dp_replicate``, ``dp_shard`` and ``tp`` (missing ones count as 1).
        world_size: Processes in the job.

    Returns:
        ``{"dp_replicate": r, "dp_shard": s, "tp": t}`` with ``r * s * t == world_size``.

    Raises:
        ConfigError: The product is not the world size (the message names every factor) or
            ``dp_shard = -1`` cannot be filled with a whole number.

    Example:
        >>> resolve_degrees({"dp_replicate": 1, "dp_shard": -1, "tp": 2}, 4)
        {'dp_replicate': 1, 'dp_shard': 2, 'tp': 2}
    """
    deg = {name: int(config.get(name, 1)) for name in DEGREE_NAMES}
    fixed = deg["dp_replicate"] * deg["tp"]
    if deg["dp_shard"] == -1:
        if world_size % fixed:
            raise ConfigError(
                f"dp_shard = -1 (auto) cannot fill world size {world_size}: dp_replicate "
                f"{deg['dp_replicate']} x tp {deg['tp']} = {fixed} does not divide it",
                hint="choose dp_replicate and tp whose product divides the number of processes")
        deg["dp_shard"] = world_size // fixed
    product = fixed * deg["dp_shard"]
    if product != world_size:
        raise ConfigError(
            f"parallel degrees dp_replicate {deg['dp_replicate']} x dp_shard {deg['dp_shard']} x "
            f"tp {deg['tp']} = {product}, but the world size is {world_size}",
            hint="make the degrees multiply to the number of processes (nnodes x "
                 "nproc_per_node), or set dp_shard = -1 to use whatever is left")
    return deg
