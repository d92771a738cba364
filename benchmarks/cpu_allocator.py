"""What glibc's malloc settings do to a CPU training step: page faults and step times.

Each (configuration, setting) runs in a fresh interpreter: the setting is applied with
``mallopt`` before torch loads, the ``gpt`` workload is built, 5 steps warm up, then ``--steps``
steps are timed one by one. Settings:

* ``untuned``: glibc's defaults (large blocks mapped and unmapped by ``mmap``/``munmap``);
* ``threshold``: ``M_MMAP_THRESHOLD`` at glibc's cap of 32 MiB and a 2 GiB trim threshold (what
  trials did before ``M_MMAP_MAX``);
* ``mmap-off``: :func:`cubicml_lab.hardware.tune_cpu_allocator`, as every trial calls it
  (``M_MMAP_MAX = 0`` and a 2 GiB trim threshold).

It prints, per configuration and setting, the minor page faults per step, the kernel time per
step, the median step and its 10th-90th percentile. Measured on a 2-core VM, untuned /
threshold / mmap-off: micro-batch 32 in bf16, 40,364 / 24,656 / 51 faults per step and 196 / 156
/ 103 ms; in fp32, 39,776 / 32,823 / 410 and 224 / 240 / 153 ms. At micro-batch 8 and 4 the
threshold already stops most faults, and the three settings' times (59 / 45 / 44 and 21 / 28 / 28
ms) moved with the host's speed state, which switched within seconds on that VM (an earlier run
of micro-batch 4: 29 ms untuned, 21 ms mmap-off): run it twice before reading small differences.

Run (the machine otherwise idle): ``.venv/bin/python benchmarks/cpu_allocator.py`` (~2 min).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

#: mallopt (parameter, value) pairs of each setting (malloc.h: -1 M_TRIM_THRESHOLD, -3
#: M_MMAP_THRESHOLD); "mmap-off" is tune_cpu_allocator itself, as a trial calls it.
SETTINGS = {"untuned": [], "threshold": [(-3, 32 * 2**20), (-1, 2**31 - 1)], "mmap-off": "tuned"}
CONFIGS = [
    {"micro_batch": 32, "n_heads": 2, "precision": "bf16", "threads": 2},
    {"micro_batch": 32, "n_heads": 2, "precision": "fp32", "threads": 2},
    {"micro_batch": 8, "n_heads": 4, "precision": "fp32", "threads": 2},
    {"micro_batch": 4, "n_heads": 2, "precision": "bf16", "threads": 2},
]

CHILD = """
import ctypes, json, resource, sys, time
opts, cfg, steps = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
if opts == "tuned":
    from cubicml_lab.hardware import tune_cpu_allocator
    assert tune_cpu_allocator() != "default", "CUBICML_LAB_MALLOC=default or not glibc"
else:
    libc = ctypes.CDLL("libc.so.6")
    assert all(libc.mallopt(k, v) == 1 for k, v in opts)
import torch
torch.set_num_threads(cfg["threads"])
from cubicml_lab.workloads import get
built = get("gpt").build(cfg, "cpu")
for _ in range(5):
    built.step()
r0 = resource.getrusage(resource.RUSAGE_SELF)
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    built.step()
    times.append(time.perf_counter() - t0)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"times": times, "faults": r1.ru_minflt - r0.ru_minflt,
                  "sys_s": r1.ru_stime - r0.ru_stime}))
"""


def run(setting: str, cfg: dict, steps: int) -> dict:
    """One fresh interpreter: the setting, the config, ``steps`` timed steps."""
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(SETTINGS[setting]),
                          json.dumps(cfg), str(steps)], capture_output=True, text=True,
                         check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    args = parser.parse_args()
    print(f"{'config':<70} {'setting':<10} {'faults/step':>11} {'sys ms':>7} {'median ms':>9} "
          f"{'p10-p90 ms':>11}")
    for cfg in CONFIGS:
        for setting in SETTINGS:
            got = run(setting, cfg, args.steps)
            t = sorted(got["times"])
            n = len(t)
            print(f"{json.dumps(cfg):<70} {setting:<10} {got['faults'] / n:>11,.0f} "
                  f"{1e3 * got['sys_s'] / n:>7.0f} {1e3 * t[n // 2]:>9.0f} "
                  f"{1e3 * t[n // 10]:>5.0f}-{1e3 * t[9 * n // 10]:<5.0f}", flush=True)


if __name__ == "__main__":
    main()
