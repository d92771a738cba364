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
# # 07 · Your own job: co-design a training script you already have
#
# **Question.** You have a training script, here a Hugging Face `Trainer` training a small GPT-2
# (`examples/hf_trainer_gpt2.py`). Which per-device batch, gradient accumulation, gradient
# checkpointing and dataloader workers train it fastest on this machine, which do not fit in
# memory, and does a physics model of the job help the search? The lab runs the script as it is,
# once per trial, with the knobs as command-line flags; the script reports each optimizer step
# through a callback (`cubicml_lab.integrations.hf.ReportCallback`, two lines added to it), and
# the lab stops it once its figure is good enough.
#
# Runtime: about 2 minutes on 2 CPU cores (124 s measured; 330 s while other work loaded them:
# each trial starts Python, torch and transformers); no GPU needed. The same notebook runs a torchrun or Slurm job by swapping the launcher.

# %%
import os
import sys
from pathlib import Path

from scipy.stats import kendalltau

import cubicml_lab as cml
from cubicml_lab import analytical
from cubicml_lab.physics import GPUSpec

# %% tags=["parameters"]
SMOKE = os.environ.get("CUBICML_LAB_SMOKE") == "1"  # CI runs the notebook with tiny budgets
BUDGET = 2 if SMOKE else 8  # trials of the first run; the resumed run adds one more
MEASURE = {"max_time_s": 2.0 if SMOKE else 4.0, "min_steps": 5, "target_rel_ci": 0.05,
           "warmup_max_steps": 8, "warmup_max_s": 1.5}  # a job stops by 1.5 + max_time_s s
MEMORY_LIMIT_GIB = 2.0  # address space of each trial: the batch of 256 does not fit
ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
SCRIPT = ROOT / "examples" / "hf_trainer_gpt2.py"
RUNS = Path(os.environ.get("CUBICML_LAB_RUNS", ROOT / "runs"))  # git-ignored
STORE = RUNS / "your_own_job.sqlite"
CAMPAIGN = "hf-gpt2-smoke" if SMOKE else "hf-gpt2"
SEED = 0
RUNS.mkdir(parents=True, exist_ok=True)
if SMOKE:
    print("SMOKE RUN: tiny budgets; the numbers below test the notebook, they are not results.")

# %% [markdown]
# ## 1. Wrap the script
# `Command` takes the argument list as a list (nothing goes through a shell), with `{knob}`
# placeholders the lab fills in per trial; `metrics=["report"]` (the default) says the figures
# come from the file the job's callback appends to (its path is in `$CUBICML_LAB_METRICS`).
# Outside the lab the callback does nothing, so the script still runs by hand.

# %%
job = cml.workloads.Command(
    "hf-gpt2", argv=[sys.executable, str(SCRIPT), "--batch={batch}", "--grad-accum={accum}",
                     "--grad-ckpt={ckpt}", "--workers={workers}", "--steps=200", "--vocab=8192"],
    units="tokens", timeout_s=300)
job

# %% [markdown]
# ## 2. The knobs, and a physics model of the job as the search's prior
# The space uses the script's names. `LLMTrainingModel` knows the job's facts (2 layers, width
# 64, sequences of 64 tokens, a vocabulary of 8192, this CPU described as a slow device) and
# reads the script's names through `names=` and `values=`: `batch` is its micro-batch, `ckpt` its
# recompute switch, and a step of `batch x accum` sequences is its global batch. Knobs it does
# not know (`workers`) are left to the GP, with a warning.

# %%
space = cml.Space([cml.Ordinal("batch", [1, 2, 4, 256]), cml.PowerOfTwo("accum", 1, 2),
                   cml.Bool("ckpt"), cml.Choice("workers", [0, 1])])
this_cpu = GPUSpec(name="2-core CPU", peak_tflops=0.05, memory_gib=MEMORY_LIMIT_GIB,
                   hbm_tb_s=0.02, nvlink_gb_s=10.0, internode_gb_s=1.0, gemm_efficiency=0.5,
                   fp32_tflops=0.05)
physics = analytical.LLMTrainingModel(
    layers=2, hidden=64, heads=2, seq_len=64, vocab=8192, global_batch=8, n_gpus=1,
    gpu=this_cpu, precision="fp32", tied_embeddings=True,
    names={"batch": "micro_batch", "ckpt": "recompute", "global": "global_batch"},
    values={"ckpt": {True: "full", False: "none"}})


def prior(config):  # a step is batch x accum sequences: the job's global batch per config
    return physics.cost_terms({**config, "global": config["batch"] * config["accum"]})


physics

# %% [markdown]
# ## 3. A short campaign
# Each trial is a fresh process under a memory limit; the script is started, read, and stopped
# once its step time is known to 5% (or its time budget is spent). The largest batch is queued
# first, so that this run shows a failure: the job's own out-of-memory error makes it `oom`, a
# result the search learns from, not an exception. The reference, the script's defaults, is the
# baseline of the speed-up.

# %%
store = cml.TrialStore(STORE)
search = cml.BayesianSearch(space, seed=SEED, cost_model=prior, n_init=3)
search.enqueue({"batch": 256, "accum": 1, "ckpt": False, "workers": 0})
campaign = cml.Campaign(
    CAMPAIGN, space, workload=job, searcher=search, store=store, measure_options=MEASURE,
    launcher=cml.launch.Subprocess(timeout_s=400, memory_limit_gib=MEMORY_LIMIT_GIB),
    reference={"batch": 4, "accum": 1, "ckpt": False, "workers": 0})
campaign.run(budget=BUDGET)

# %% [markdown]
# ## 4. The figures
# Each trial's figures are the job's own steps after warm-up: the median step time, its 95%
# interval, tokens per second (the job's units) and the peak memory the callback reported. The
# trial's record keeps what ran: the argument list as rendered, the job's package versions and
# how it ended.

# %%
ok = store.trials(CAMPAIGN, status="ok")
first = ok[0]
print("argv:", " ".join(first.hardware["job"]["argv"][1:]))
print("packages:", first.hardware["job"]["packages"])
print("ended:", first.hardware["job"]["ended"])
first  # the trial's card: its figures, their interval, its configuration

# %% [markdown]
# ## 5. A failed trial's log
# The error of a trial that did not end `ok` says why and ends with the tail of the job's own
# stdout and stderr, here the allocator's message (the dashboard shows the same tail a click
# away).

# %%
failed = [t for t in store.trials(CAMPAIGN) if t.status != "ok"]
for t in failed[:1]:
    lines = t.error.splitlines()
    print(f"trial {t.id} ({t.status}), {t.config}:\n{lines[0]}\n...")
    print("\n".join(lines[-3:]))

# %% [markdown]
# ## 6. Resume
# The store holds the campaign: building it again with the same name resumes it (in another
# kernel too), and the search is told the earlier trials before it proposes the next.

# %%
again = cml.Campaign(
    CAMPAIGN, space, workload=job, searcher=cml.BayesianSearch(space, seed=SEED, cost_model=prior),
    store=store, measure_options=MEASURE,
    launcher=cml.launch.Subprocess(timeout_s=400, memory_limit_gib=MEMORY_LIMIT_GIB),
    reference={"batch": 4, "accum": 1, "ckpt": False, "workers": 0})
again.run(budget=len(store.trials(CAMPAIGN)) + 1)
again

# %% [markdown]
# ## What we found

# %%
trials = store.trials(CAMPAIGN)
ok = [t for t in trials if t.status == "ok"]
summary = again.summary()
measured = [t.metrics["tokens_per_s"] for t in ok]
modelled = [t.config["batch"] * t.config["accum"] * 64  # tokens a step / modelled seconds
            / sum(prior({n: t.config[n] for n in space.names}).values()) for t in ok]
tau = kendalltau(measured, modelled).statistic if len(ok) > 2 else float("nan")
print(f"{len(trials)} trials: {summary['by_status']}; out of memory: "
      f"{sorted({t.config['batch'] for t in trials if t.status == 'oom'})} sequences a batch")
print(f"fastest: {summary['best_config']} at {summary['best']:,.0f} tokens/s"
      + (f", {summary['speedup']:.2f}x the script's defaults" if summary["speedup"] else ""))
print(f"the physics prior alone ranks the {len(ok)} measured configurations by tokens/s with "
      f"Kendall tau {tau:.2f} against the measurements (1: the same order)")
