# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Collecting training-speed data you can trust
#
# **Question.** A predictor of training speed learns only from measurements. What does one
# measurement of a real training job hold? How far apart do repeats of the same configuration
# land on this machine? And how do the same cells run a job on several processes, on a GPU, or
# on another launcher? We measure the `gpt` workload (a small decoder-only transformer on
# synthetic tokens) on the CPU. Where CUDA is present we use it instead.
#
# Runtime: about 2.5 minutes on 2 CPU cores at the full budget (141 s measured); a GPU is used
# when present, not needed.

# %%
import os
from pathlib import Path

import cubicml_lab as cml
from cubicml_lab.hardware import default_device

# %% tags=["parameters"]
SMOKE = os.environ.get("CUBICML_LAB_SMOKE") == "1"  # CI runs the notebook with tiny budgets
DEVICE = default_device()  # "cuda" when this kernel sees a GPU
WORKLOAD = "gpt"
# held fixed; small, yet steps of 10-60 ms on 2 cores (much shorter steps are mostly noise)
MODEL = {"d_model": 128, "n_layers": 2, "n_heads": 4, "seq_len": 128}
CONFIGS = [{"micro_batch": 4}, {"micro_batch": 16}, {"micro_batch": 16, "recompute": "full"},
           {"micro_batch": 16, "precision": "bf16"}][:2 if SMOKE else 4]  # repeats measure these
REPEATS = 2 if SMOKE else 5  # fresh-process measurements per configuration
MEASURE = {"max_time_s": 0.5, "warmup_max_s": 0.5} if SMOKE else {"max_time_s": 3.0}
BUDGET = 2 if SMOKE else 12  # trials of the small collection campaign
# the repeats' and the campaign's trials: a fresh process each; the smoke run measures them in
# the kernel
LAUNCHER = cml.launch.InProcess() if SMOKE else cml.launch.Subprocess(timeout_s=300)
NPROC = 2  # processes of the torchrun example
ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
RUNS = Path(os.environ.get("CUBICML_LAB_RUNS", ROOT / "runs"))  # git-ignored
RUNS.mkdir(parents=True, exist_ok=True)
STORE = RUNS / "collect.sqlite"
SEED = 0
if SMOKE:
    print("SMOKE RUN: tiny budgets; the numbers below test the notebook, they are not results.")

# %% [markdown]
# ## 1. One measurement
# `cml.measure` builds the model, trains it for a few steps that it throws away (warm-up),
# then times windows of steps until the median step time is known to within 1.5% or the time
# budget runs out (on a CPU, each window corrected for the machine's speed next to it). On a GPU the clock is a pair of CUDA events; on a CPU it is the wall clock.
# The result carries the figures, how sure they are (`step_time_rel_ci`: half-width of the 95%
# interval of the median, relative), memory, and the machine it ran on.

# %%
result = cml.measure(WORKLOAD, {**MODEL, **CONFIGS[0]}, device=DEVICE, measure_options=MEASURE)
result

# %% [markdown]
# ## 2. Repeats: how much does the same measurement move?
# Each configuration is measured `REPEATS` times, each time in a fresh Python process and
# interleaved with the others. A fresh process is what a campaign's trial gets, so the spread
# below is the noise the predictor has to live with. The spread is `(max - min) / median` of the
# step times, in percent.

# %%
repeats = cml.launch.measure_repeats(
    WORKLOAD, [{**MODEL, **c} for c in CONFIGS], repeats=REPEATS, device=DEVICE,
    launcher=LAUNCHER, measure_options=MEASURE)
repeats.to_csv(RUNS / "collect_repeats.csv", index=False)
spread = cml.launch.repeat_spread(repeats, "step_time_s")
spread.index = [str(c) for c in CONFIGS]
spread.round(4)

# %%
fig = cml.plots.plot_repeats(repeats, "tokens_per_s", labels=[str(c) for c in CONFIGS],
                            unit="tokens/s")
fig.savefig(RUNS / "collect_repeats.png", dpi=120, bbox_inches="tight")

# %% [markdown]
# ## 3. Several processes: `Torchrun`
# The same call with another launcher trains with FSDP2 across `NPROC` processes (gloo on the
# CPU, NCCL on GPUs). `dp_shard=-1` shards over every process, and the slowest rank's time
# counts. On a 2-core CPU two processes split the same cores, so this shows the mechanics, not
# a speed-up.

# %%
dist = cml.measure(WORKLOAD, {**MODEL, **CONFIGS[1], "dp_shard": -1, "threads": 1},
                   launcher=cml.launch.Torchrun(NPROC, timeout_s=300), device=DEVICE,
                   measure_options=MEASURE)
dist

# %% [markdown]
# ## 4. Into the store: a small collection campaign
# A `Campaign` measures configurations one after another and writes every trial, failures
# included, to one SQLite file. Here a random search covers micro-batch, recompute and precision.
# Re-running the cell resumes the campaign where it stopped.

# %%
space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 32), cml.Choice("recompute", ["none", "full"]),
                   cml.Choice("precision", ["fp32", "bf16"])])
store = cml.TrialStore(STORE)
campaign = cml.Campaign("collect-smoke" if SMOKE else "collect", space, workload=WORKLOAD,
                        launcher=LAUNCHER, device=DEVICE,
                        searcher=cml.RandomSearch(space, seed=SEED), store=store,
                        measure_options=MEASURE, fixed=MODEL)
table = campaign.run(budget=BUDGET)
store

# %%
table.set_index("trial_id").round(3)  # campaign.table(full=True): every field

# %% [markdown]
# ## 5. The same cells elsewhere: change the launcher
# Only the launcher (and the device) changes between a laptop, a GPU box and a cluster:
#
# ```python
# cml.launch.Subprocess(timeout_s=600)                     # this machine, a process per trial
# cml.launch.Repeated(cml.launch.Subprocess(), processes=2) # the same, 2 processes per trial
# cml.launch.Torchrun(8, timeout_s=1800)                   # one 8-GPU box, one job per trial
# cml.launch.Torchrun(8, nnodes=2, node_rank=0, master_addr="node0")   # two nodes, by hand
# cml.launch.LocalPool(1, device="cuda")                  # 8 GPUs: 8 trials at once, a GPU each
# cml.launch.LocalPool(1)                                 # this CPU: a trial per core, pinned
# cml.launch.Slurm(partition="gpu", gpus_per_node=1, time_limit_min=30)  # a Slurm job per trial
# cml.launch.Slurm(nodes=2, nproc_per_node=8, gpus_per_node=8)   # srun + torchrun on 2 nodes
# ```
#
# With a `LocalPool`, `campaign.run(budget, parallel=pool.slots)` keeps every slot busy, and
# two trials never share a core or a GPU.
#
# `Slurm` submits each trial as a job through submitit and turns Slurm's end states into trial
# statuses (see the README's "On a GPU box or a cluster"). If this kernel dies while jobs run,
# building the same campaign again (same store, same name) and calling `run` collects those jobs
# instead of launching them again; `campaign.stop()` cancels them. The next cell runs a trial on
# the GPU when this kernel has one, and says so when it does not.

# %%
if DEVICE == "cuda":
    gpu = cml.measure(WORKLOAD, {**MODEL, "micro_batch": 16, "precision": "bf16"},
                      device="cuda", measure_options=MEASURE)
    print(gpu.status, {k: gpu.metrics.get(k) for k in ("tokens_per_s", "mfu", "peak_mem_gib")})
else:
    print("no CUDA device in this kernel: the GPU cell is skipped (CPU results above)")

# %%
store.export(RUNS / "collect.parquet", campaign.name)
store.close()

# %% [markdown]
# ## What we found
# One measurement's interval is the noise inside one process; fresh processes of the same
# configuration spread several times wider, mostly by each process's own level, which no reference
# timed inside the trial sees. Each trial stores its figure corrected for the machine's speed by a
# reference timed beside it (`throughput`; the raw one is `throughput_raw`) and flags windows that
# shared the cores (`contended`). Measure twice what you must tell apart by less than about 5%:
# `cml.launch.Repeated(cml.launch.Subprocess(), processes=2)` does it for every trial (it keeps the
# faster process by default; the demo gives each the whole budget and passes `keep="drift_fit"`).
# On one machine, sharding with `Torchrun` only adds communication. Your figures come from the
# cells above; the measured history is in `docs/results.md` ("History moved from the notebooks").
