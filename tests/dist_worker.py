"""Run a few training steps of a workload under ``torchrun`` and write rank 0's losses as JSON.

Usage: ``python -m torch.distributed.run --standalone --nproc-per-node N tests/dist_worker.py
WORKLOAD CONFIG_JSON STEPS OUT``. Also runs as a single process (no torchrun), which is the
reference the parallel runs are compared with. CONFIG_JSON is one config (OUT: one record) or a
list of them, built and trained one after another in the same processes (OUT: a list of
records): the interpreters' start, a few seconds each, is then paid once. Used by
tests/test_distributed.py.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import sys

from cubicml_lab.workloads import get
from cubicml_lab.workloads.parallel import close_world, init_world


def main() -> None:
    faulthandler.enable()
    name, config, steps, out = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    world = init_world("cpu")
    records = []
    for cfg in config if isinstance(config, list) else [config]:
        built = get(name).build(cfg, "cpu", world)
        losses = [float(built.step()) for _ in range(steps)]
        records.append({"losses": losses, "world_size": world.world_size,
                        "units_per_step": built.units_per_step,
                        "flops_per_step": built.flops_per_step, "n_devices": built.n_devices,
                        "parallel": built.parallel})
        # As run_trial does: free the model (DDP/FSDP hold gloo work objects) before leaving
        # the group, or gloo's threads may drop the last references during finalisation.
        del built
        gc.collect()
    if world.rank == 0:
        with open(out, "w") as f:
            json.dump(records if isinstance(config, list) else records[0], f)
    close_world(world)


if __name__ == "__main__":
    main()
