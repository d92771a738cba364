"""Run each trial as a multi-process job under ``torchrun`` (``torch.distributed.run``).

:class:`Torchrun` is :class:`~cubicml_lab.launch.Subprocess` with a different command: it starts
``python -m torch.distributed.run ... -m cubicml_lab.launch.worker --spec SPEC --result RESULT``,
which spawns ``nproc_per_node`` workers on this node. Each worker joins the process group (gloo on CPU,
NCCL on CUDA, one GPU per worker: ``cuda:LOCAL_RANK``), the workload parallelises itself over the
ranks (data, fully sharded or tensor parallel, as its config says), and measurement agrees across
ranks (the slowest rank's time). Rank 0 writes the result; a rank that fails writes its own, and
the launcher reports an out-of-memory rank before the errors its peers got from losing it.

Everything :class:`Subprocess` does holds per job: the timeout (the torchrun agent gets SIGTERM,
which it forwards to its workers; workers also die with the agent), the memory limit (applied in
each worker), crash reports with the tail of the job's stderr (all workers write to it), and
dying with the caller: the agent runs under the same guard as a single trial, which kills it when
the caller dies, and each worker asks for ``SIGKILL`` when the agent dies
(:func:`cubicml_lab.launch.worker.die_with_parent`, which also checks that the agent's parent is the
guard, so a worker started as its job was being torn down exits at once).

Single node (``nnodes=1``, no ``master_addr``): a standalone rendezvous on a free localhost port,
so several jobs can run side by side. Several nodes: run the same launcher on every node with its
``node_rank`` and the same ``master_addr``/``master_port`` (static rendezvous, as torchrun's own
docs describe); only node 0's launcher gets the result, so the others' come back ``failed`` with
"no result" unless their files are shared. On a Slurm cluster use the Slurm launcher instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._bounds import check_count, check_word
from .._params import brief
from ..errors import ConfigError
from .base import MAX_NODES, MAX_PROCS_PER_NODE, local_process_limit
from .subprocess import Subprocess

if TYPE_CHECKING:
    from ..trials import TrialResult

__all__ = ["Torchrun"]


def _count(name: str, value: Any, low: int, high: int, why: str = "") -> int:
    return check_count(f"Torchrun {name}", value, low=low, high=high, error=ConfigError, why=why)


class Torchrun(Subprocess):
    """Run each trial as ``torchrun`` with ``nproc_per_node`` processes per node.

    Args:
        nproc_per_node: Worker processes on this node (one per GPU on CUDA).
        nnodes: Nodes in the job.
        node_rank: This node's rank, 0 .. nnodes - 1.
        master_addr: Address of node 0; ``None`` on one node (standalone rendezvous).
        master_port: Port on node 0 (required with ``master_addr``).
        timeout_s, memory_limit_gib, python, env: As for :class:`Subprocess`; the memory
            limit applies to each worker.

    Raises:
        ConfigError: A count is not an integer within its limit (``nproc_per_node``: on this
            machine alone, :func:`~cubicml_lab.launch.base.local_process_limit`; with a
            ``master_addr``, 1024 per node), ``node_rank`` is out of range, a multi-node job has
            no ``master_addr``/``master_port``, or ``master_addr`` holds a control character;
            the message names the field and the limit.

    Example:
        >>> Torchrun(nproc_per_node=2).world_size
        2
    """

    def __init__(self, nproc_per_node: int = 2, *, nnodes: int = 1, node_rank: int = 0,
                 master_addr: str | None = None, master_port: int | None = None,
                 timeout_s: float = 600, memory_limit_gib: float | None = None,
                 python: str | os.PathLike[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(timeout_s=timeout_s, memory_limit_gib=memory_limit_gib, python=python,
                         env=env)
        self.nnodes = _count("nnodes", nnodes, 1, MAX_NODES)
        if master_addr is None:  # this machine alone
            high, why = local_process_limit()
        else:
            high, why = MAX_PROCS_PER_NODE, "the most one cluster node may run"
        self.nproc_per_node = _count("nproc_per_node", nproc_per_node, 1, high, why)
        self.node_rank = _count("node_rank", node_rank, 0, self.nnodes - 1,
                                f"number the nodes 0 .. nnodes - 1 = {self.nnodes - 1}")
        if master_addr is not None and not check_word(
                "Torchrun master_addr", master_addr, error=ConfigError,
                hint="e.g. master_addr='node001'"):
            raise ConfigError("Torchrun master_addr = '' must be a host name",
                              hint="e.g. master_addr='node001'")
        if master_port is not None:
            _count("master_port", master_port, 1, 65535, "a TCP port")
        if (self.nnodes > 1 or master_addr is not None) and (master_addr is None
                                                              or master_port is None):
            raise ConfigError(
                f"Torchrun with nnodes = {nnodes} needs master_addr and master_port "
                f"(got {brief(master_addr)}, {brief(master_port)})",
                hint="pass the address and a free port of node 0, the same on every node")
        self.master_addr, self.master_port = master_addr, master_port

    @property
    def world_size(self) -> int:
        """Processes in the job: ``nnodes * nproc_per_node``."""
        return self.nnodes * self.nproc_per_node

    def describe(self) -> dict[str, Any]:
        """The launcher kind and its options as plain JSON."""
        return {**super().describe(), "kind": "torchrun", "nproc_per_node": self.nproc_per_node,
                "nnodes": self.nnodes, "node_rank": self.node_rank,
                "master_addr": self.master_addr, "master_port": self.master_port}

    def options(self) -> list[str]:
        """torchrun's options for this launcher: nodes, processes, rendezvous."""
        cmd = ["--nnodes", str(self.nnodes), "--nproc-per-node", str(self.nproc_per_node),
               "--max-restarts", "0"]
        if self.master_addr is None:
            cmd.append("--standalone")
        else:
            cmd += ["--node-rank", str(self.node_rank), "--master-addr", self.master_addr,
                    "--master-port", str(self.master_port)]
        return cmd

    def command(self, spec_path: str, result_path: str) -> list[str]:
        """The torchrun argument list (never run through a shell)."""
        # [python, -m, cubicml_lab.launch.worker, ...]
        trial = super().command(spec_path, result_path)
        return [trial[0], "-m", "torch.distributed.run", *self.options(), *trial[1:]]

    def run(self, spec: dict[str, Any], *,
            on_start: Callable[[dict[str, Any]], None] | None = None) -> TrialResult:
        """Run one trial as :class:`Subprocess` does, under torchrun. A user's command (a spec
        with ``"command"``) runs in one trial process, which starts the job's script under
        torchrun with these options (:mod:`cubicml_lab.launch.job`)."""
        if isinstance(spec, dict) and isinstance(spec.get("command"), dict):
            spec = {**spec, "command": {**spec["command"], "torchrun": {
                "options": self.options(), "devices": self.world_size,
                "node_rank": self.node_rank}}}
        return super().run(spec, on_start=on_start)
