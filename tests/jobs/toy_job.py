"""A job that misbehaves on request, standard library only (no torch: it starts in ~30 ms).

``toy_job.py MODE [ARG]`` writes lines to ``$CUBICML_LAB_METRICS`` in the metrics-file format
(what cubicml_lab.report writes) with steps of ``--step-s`` seconds of busy work:

* ``steps``: reports steps until stopped; ``ARG`` is echoed to stdout as JSON first.
* ``junk``: the same, with junk lines between the steps and a half line at the end.
* ``silent``: prints nothing, reports nothing, sleeps.
* ``fail``: prints an error and exits with code 3.
* ``oom``: prints a CUDA-style out-of-memory error and exits with code 1.
* ``fork``: starts a child that sleeps in the same process group, then exits 0 at once.
* ``hang``: reports 12 steps, then sleeps.
* ``megatron``: prints Megatron-LM-style log lines instead of writing the metrics file.
* ``pidfile``: writes its pid to the file ``ARG``, then reports steps until stopped.
* ``titan``: prints torchtitan-style coloured log lines (tokens/s per device, no step time).
* ``hf``: prints the Hugging Face Trainer's log dicts, one per step (no time in them).
"""

import json
import os
import sys
import time

MODE = sys.argv[1]
ARG = sys.argv[2] if len(sys.argv) > 2 else ""
STEP_S = float(os.environ.get("TOY_STEP_S", "0.02"))
PATH = os.environ.get("CUBICML_LAB_METRICS", os.devnull)


def busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def step_line(i: int) -> str:
    return json.dumps({"v": 1, "event": "step", "rank": int(os.environ.get("RANK", "0")),
                       "t": time.monotonic(), "wall": time.time(), "step": i,
                       "tokens": 1000, "samples": 4, "loss": 1.0 / (i + 1)})


def report_steps(limit: int, junk: bool = False) -> None:
    with open(PATH, "a", encoding="utf-8") as f:
        for i in range(limit):
            busy(STEP_S)
            f.write(step_line(i) + "\n")
            if junk and i % 3 == 0:
                f.write("not json at all\n{\"v\": 2, \"event\": \"step\"}\n[1, 2]\n")
            f.flush()
        if junk:
            f.write('{"v": 1, "event": "st')


if MODE in ("steps", "junk"):
    print(json.dumps({"arg": ARG}), flush=True)
    report_steps(400 if MODE == "junk" else 100_000, junk=MODE == "junk")
elif MODE == "pidfile":
    with open(ARG + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(ARG + ".tmp", ARG)
    report_steps(10_000_000)
elif MODE == "silent":
    time.sleep(3600)
elif MODE == "fail":
    print("Traceback (most recent call last):\nValueError: bad learning rate", file=sys.stderr)
    sys.exit(3)
elif MODE == "oom":
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
          file=sys.stderr)
    sys.exit(1)
elif MODE == "fork":
    if os.fork() == 0:
        time.sleep(3600)
        os._exit(0)
    print("parent exits, child keeps running", flush=True)
elif MODE == "hang":
    report_steps(12)
    time.sleep(3600)
elif MODE == "titan":
    for i in range(1, 100_000):
        busy(STEP_S)
        tps = round(2048 / STEP_S)
        print(f"\x1b[31mstep: {i:2}  \x1b[32mloss: {1 / i:8.5f}  \x1b[33mgrad_norm:  1.0000  "
              f"\x1b[36mmemory:  1.50GiB(2.00%)  \x1b[34mtps: {tps:,}  \x1b[36mtflops: 1.00  "
              "\x1b[35mmfu: 1.00%\x1b[39m", flush=True)
elif MODE == "hf":
    for i in range(1, 100_000):
        busy(STEP_S)
        print({"loss": round(1 / i, 4), "grad_norm": 1.0, "learning_rate": 5e-05,
               "epoch": round(i / 1000, 2)}, flush=True)
elif MODE == "megatron":
    for i in range(1, 100_000):
        busy(STEP_S)
        print(f" [2026-12-05 21:00:00.000000] iteration {i:8d}/  100000 | consumed samples: "
              f"{8 * i:12d} | elapsed time per iteration (ms): {1000 * STEP_S:.1f} | learning "
              f"rate: 1.000000E-04 | global batch size:     8 | lm loss: 2.500000E+00 | loss "
              "scale: 1.0 |", flush=True)
