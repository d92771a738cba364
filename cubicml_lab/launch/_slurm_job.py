"""What each task of a :class:`~cubicml_lab.launch.Slurm` job runs, on the cluster's node: the
trial (one process, or this task's torchrun agent), and in task 0 its result, written as JSON to
:data:`RESULT_FILE` in the job's folder with the job's timestamps (seconds since the epoch).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..trials import TrialResult

__all__ = ["RESULT_FILE", "job_main"]

RESULT_FILE = "cubicml_result.json"  # in the job's folder, written by task 0


def job_main(spec_json: str, plan_json: str) -> str:
    """What each task of the Slurm job runs: the trial (one process, or this task's torchrun
    agent), and, in task 0, its result as JSON in the job's folder with the job's timestamps."""
    started = time.time()
    spec, plan = json.loads(spec_json), json.loads(plan_json)
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    if plan["world_size"] == 1:
        from .runner import run_spec  # a user's command, or run_trial

        result = run_spec(spec)
    else:
        result = torchrun_task(spec, plan, rank)
    if rank != 0:
        return result.status
    stamps = {"job_started_at": started, "trial_ended_at": time.time()}
    result = dataclasses.replace(result, hardware={**result.hardware, "slurm": stamps})
    folder = Path(plan["folder"]) / os.environ.get("SLURM_JOB_ID", "unknown")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{RESULT_FILE}.{os.getpid()}"
    tmp.write_text(result.to_json())
    tmp.replace(folder / RESULT_FILE)  # atomic: the launcher reads all of it or nothing
    return result.status


def torchrun_task(spec: dict[str, Any], plan: dict[str, Any], rank: int) -> TrialResult:
    """This task's torchrun agent: node rank = task rank, rendezvous on the job's first node."""
    from .torchrun import Torchrun

    ntasks = int(os.environ.get("SLURM_NTASKS", "1"))
    nodes = subprocess.run(["scontrol", "show", "hostnames",
                            os.environ.get("SLURM_JOB_NODELIST", "localhost")],
                           capture_output=True, text=True, timeout=60, check=False)
    master = (nodes.stdout.split() or ["localhost"])[0]
    port = 20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000
    agent = Torchrun(plan["procs_per_task"], nnodes=ntasks, node_rank=rank, master_addr=master,
                     master_port=port, timeout_s=plan["timeout_s"])
    return agent.run(spec)
