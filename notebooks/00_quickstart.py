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
# # 00 · Quickstart: how should this machine train a small GPT?
#
# **Question.** For a fixed small decoder-only transformer, which micro-batch size, head count,
# precision, activation recomputation and CPU thread count train it fastest on *this* machine, and
# how much faster is that than the default? We answer it the CubicML way: run a few real training
# jobs, store their measured speed, fit a Gaussian-process predictor of speed from the
# configuration, and let Bayesian search pick the next jobs.
#
# Runtime: about 2 minutes on 2 CPU cores at the full budget (114 s measured); no GPU needed.

# %%
import os
from pathlib import Path

import cubicml_lab as cml
from cubicml_lab.demo import (DEFAULT_CONFIG, DEMO_MEASURE, demo_prior, demo_space,
                              predictor_report, summary_table)
from cubicml_lab.trials import contention_note

# %% tags=["parameters"]
SMOKE = os.environ.get("CUBICML_LAB_SMOKE") == "1"  # CI runs the notebook with tiny budgets
BUDGET = 5 if SMOKE else 14  # finished trials, the default configuration first
IDLE_WAIT_S = 0  # > 0: before each measurement, wait up to this many seconds for idle cores
MEASURE = {**({"max_time_s": 0.5, "warmup_max_s": 1.0} if SMOKE else DEMO_MEASURE),
           "wait_for_idle_s": IDLE_WAIT_S}
# a fresh process per trial; the smoke run measures in the kernel (no interpreter per trial)
LAUNCHER = cml.launch.InProcess() if SMOKE else cml.launch.Subprocess(timeout_s=120)
ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
RUNS = Path(os.environ.get("CUBICML_LAB_RUNS", ROOT / "runs"))  # git-ignored
STORE = RUNS / "quickstart.sqlite"
CAMPAIGN = "quickstart-smoke" if SMOKE else "quickstart"
SEED = 0
if SMOKE:
    print("SMOKE RUN: tiny budgets; the numbers below test the notebook, they are not results.")

# %% [markdown]
# ## 1. The space of configurations
# The model itself stays fixed (the `gpt` workload's defaults: d_model 128, 2 layers, sequence
# length 128); the search covers how it is trained on this CPU.

# %%
space = demo_space()
print(f"{space.size()} configurations")
space.to_dict()["parameters"]

# %% [markdown]
# ## 2. One real measurement
# `cml.measure` trains the model for a few steps, discards the warm-up, and times steps until the
# median step time, corrected for the machine's drift, is known to within 1.5% (or the time
# budget runs out). Windows that shared the CPU with other processes are set aside and timed
# again; a measurement left with too few clean ones is flagged `contended`, and the card below
# says so, with what to do. A figure from a single window has no interval ("unknown").

# %%
result = cml.measure("gpt", DEFAULT_CONFIG, measure_options=MEASURE)
result  # all figures: result.metrics; the machine: result.hardware

# %% [markdown]
# ## 3. A co-design campaign: Bayesian search over real trials
# Each trial runs in a fresh Python process and lands in a SQLite store; the first trial is the
# default configuration. Re-running this cell resumes the campaign instead of starting over. The
# GP starts from the workload's rough cost model (`demo_prior()`: per token, FLOPs in fp32 and
# in bf16, weights, activation bytes, per-micro-batch overhead and attention scores in fp32 and
# in bf16, each with a weight the GP fits) instead of from nothing.

# %%
store = cml.TrialStore(STORE)
prior = demo_prior()  # {"cost_model": ..., "features": ...} of the gpt workload
search = cml.BayesianSearch(space, objective="throughput", seed=SEED, **prior)
campaign = cml.Campaign(CAMPAIGN, space, workload="gpt",
                        launcher=LAUNCHER, searcher=search,
                        store=store, measure_options=MEASURE,
                        reference=DEFAULT_CONFIG)  # measured first, the baseline of the speed-up
df = campaign.run(budget=BUDGET, full=True)  # every field; run() alone gives the short table
print(contention_note(df, wait_option="set IDLE_WAIT_S = 60 in the parameters cell")
      or "no trial was flagged: each had enough windows on idle cores")
summary_table(df, space)

# %% [markdown]
# The campaign shows itself as a summary: trials by status, the best so far and its speed-up
# over the reference. `notebooks/04_codesign_search` steers the same loop by hand with a live
# dashboard.

# %%
campaign

# %% [markdown]
# ## 4. How well does a GP predict speed from the configuration?
# Leave-one-out: fit on all trials but one, predict the one left out. Kendall tau measures whether
# the predicted order of configurations matches the measured order (1 is perfect). The GP is the
# search's: the same prior, each trial's measured noise (its CI) told to it, and the same drift
# exponent learned. Each trial's figure was corrected by how slow the drift reference ran beside
# it; how much of that slowdown a trial shares differs by machine, so the GP learns it from the
# trials (1: all of it; `None`: no trial needed a correction). Each fold learns it without the
# trial it leaves out, so that no trial helps shape its own prediction.

# %%
report = predictor_report(df, space, seed=SEED, **prior)  # the GP the search ranked with
drift = report["drift_exponent"]
flagged = f" ({report['flagged']} flagged contended)" if report["flagged"] else ""
print(f"Kendall tau = {report['kendall_tau']:.2f} over {report['n']} trials{flagged}; drift "
      f"exponent learned: {'none' if drift is None else format(drift, '.2f')}")

# %% [markdown]
# The highest single measurement won partly by its own noise. `search.recommend()` picks, of the
# configurations measured, the one the GP rates highest: it weighs each figure by its noise and by
# its neighbours' figures. In the figure, open dots are trials flagged contended (other work
# shared the CPU): while an unflagged trial exists they are not counted as best, so on a machine
# busy at first the best-so-far line starts at the first unflagged trial; where every trial was
# flagged it follows them all (the line printed under the campaign says how many were).

# %%
best_config, estimate = search.recommend()
top_config, top_value = campaign.best()
default_value = campaign.reference_value()
fig = cml.plots.campaign_figure(df, report if "mean" in report else None, reference=default_value,
                                unit="tokens/s")
print(f"best {best_config}: {estimate:,.0f} tokens/s estimated, "
      f"{estimate / default_value:.2f}x the default")
print(f"highest single measurement {top_config}: {top_value:,.0f} tokens/s")

# %% [markdown]
# ## What we found
# The search's answer depends on the CPU: on one with fast bf16 kernels it favours a large
# micro-batch, few heads, bf16 autocast and no recomputation; on one without them the cost model
# prices bf16 out, the search stays in fp32, and little beats the defaults. Larger micro-batches
# amortise a small model's per-step overhead, recomputation costs time when memory is not the
# constraint, and more heads at the same width cost time. Starting from the workload's cost model
# (`demo_prior()`), the GP ranks the trials well (the leave-one-out Kendall tau above); what limits
# that ranking is how steady the machine is, which the reference timed beside each trial corrects
# only in part. Your numbers are in the table and figure above, measured on your machine; the
# measured history is in `docs/results.md` ("History moved from the notebooks").
