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
# # 04 · Co-design search, steered by hand
#
# **Question.** When a person watches the search and reviews every proposal before it runs
# (accepting it, skipping it, or editing it first), how quickly does the campaign find a faster
# way to train a small GPT on this machine, and what does speed cost in memory?
#
# The loop is CubicML's: real training jobs, a GP predictor of speed fitted on them, Bayesian
# search proposing the next job. Here you see each proposal first, with the predicted speed,
# its 95% interval, the probability that it fits in memory, and why it was picked. A live
# dashboard follows the campaign as it runs. The notebook runs top to bottom without a person:
# after each widget, a code cell does what its buttons do.
#
# Runtime: about 2.5 minutes on 2 CPU cores at the full budget (150 s measured); no GPU needed.

# %%
import math
import os
from pathlib import Path

import pandas as pd

import cubicml_lab as cml
from cubicml_lab import plots
from cubicml_lab.demo import DEFAULT_CONFIG, DEMO_MEASURE, demo_space, summary_table

# %% tags=["parameters"]
SMOKE = os.environ.get("CUBICML_LAB_SMOKE") == "1"  # CI runs the notebook with tiny budgets
N_INIT = 2 if SMOKE else 5  # trials before Bayesian optimisation: the default, then random
START = N_INIT  # trials run without review (nothing to predict from before)
BUDGET = 5 if SMOKE else 16  # finished trials when the campaign stops, reviewed ones included
MEMORY_LIMIT_GIB = 2.0  # proposals predicted to need more count as not fitting
MEASURE = {"max_time_s": 0.5, "warmup_max_s": 1.0} if SMOKE else DEMO_MEASURE
MODEL = {"seq_len": 32} if SMOKE else {}  # the smoke run's model: shorter sequences, quick steps
# a fresh process per trial; the smoke run measures in the kernel (no interpreter per trial)
LAUNCHER = cml.launch.InProcess() if SMOKE else cml.launch.Subprocess(timeout_s=120)
ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
RUNS = Path(os.environ.get("CUBICML_LAB_RUNS", ROOT / "runs"))  # git-ignored
STORE = RUNS / "04_codesign.sqlite"
CAMPAIGN = "codesign-smoke" if SMOKE else "codesign"
SEED = 0
RUNS.mkdir(parents=True, exist_ok=True)
if SMOKE:
    print("SMOKE RUN: tiny budgets; the numbers below test the notebook, they are not results.")

# %% [markdown]
# ## 1. The campaign and its live dashboard
# The space is the quickstart's: micro-batch, attention heads, precision, activation
# recomputation and CPU threads, for the `gpt` workload's small model. The default configuration
# is measured first and is the baseline of every speed-up. The dashboard below observes the
# campaign: it redraws as each trial starts and finishes, in this cell's output, while later
# cells run. Re-running the notebook resumes the campaign from its SQLite store.

# %%
space = demo_space()
search = cml.BayesianSearch(space, objective="throughput", seed=SEED, n_init=N_INIT,
                            memory_limit_gib=MEMORY_LIMIT_GIB)
campaign = cml.Campaign(CAMPAIGN, space, workload="gpt", searcher=search,
                        launcher=LAUNCHER,
                        store=cml.TrialStore(STORE), measure_options=MEASURE,
                        reference=DEFAULT_CONFIG, fixed=MODEL)
dashboard = cml.widgets.CampaignDashboard(campaign)
dashboard

# %% [markdown]
# ## 2. The first trials, unreviewed
# The default configuration, then the search's initial space-filling design: there is nothing
# to review until the GP has data to predict from.

# %%
df = campaign.run(budget=START)

# %% [markdown]
# ## 3. Review the next proposal
# `ProposalReview` shows what the search wants to run next and what it expects. *accept & run*
# launches it (the dashboard above follows); *skip* drops it for good (the search never proposes
# it again, and a resumed campaign remembers); *edit* opens one input per knob, prefilled with
# the proposal, and *run edited* launches your version instead.

# %%
review = cml.widgets.ProposalReview(campaign)
review

# %% [markdown]
# The proposal the widget showed when this cell ran, as a record: every figure the widget
# shows is a field of `cml.search.Proposal`, so the loop works without widgets too. (After the
# cells below have run, the widget above shows the proposal that comes next.)

# %%
proposal = review.proposals[0]
proposal

# %% [markdown]
# What the buttons do, in code. Accept this proposal; then edit the next one before it runs:
# here, a what-if on its precision (bf16 <-> fp32); any knob is edited the same way.

# %%
review.accept()
nxt = review.proposals[0].config
review.run_edited({**nxt, "precision": {"fp32": "bf16", "bf16": "fp32"}[nxt["precision"]]})
print("\n".join(review.results))

# %% [markdown]
# ## 4. The rest of the budget, with a review rule
# `Campaign.run(review=...)` passes each proposal through a function before launching it: return
# the configuration to run it, an edited configuration to run that instead, or None to skip it.
# This rule skips a proposal whose 95% interval lies wholly below the best speed measured
# (`campaign.best()`: a flagged figure, contended or without an interval, is never that best
# while a clean one exists), or which is predicted not to fit in memory, and turns full
# recomputation off (it only trades time for memory, and memory is not the constraint here)
# unless that configuration was already measured. The campaign also stops early when the
# search's stopping rule fires: three Bayesian asks in a row that expect less than 0.5%
# improvement.


# %%
decisions = []  # one row per proposal the rule saw


def review_rule(p: cml.search.Proposal) -> dict | None:
    measured = {space.key({n: t.config[n] for n in space.names}) for t in campaign.trials()}
    edited = {**p.config, "recompute": "none"}
    if p.upper is not None and p.upper < campaign.best()[1]:
        decision, run = "skip: whole interval below the best so far", None
    elif p.p_feasible is not None and p.p_feasible < 0.5:
        decision, run = "skip: predicted not to fit in memory", None
    elif p.config["recompute"] == "full":
        decision, run = (("skip: measured without recompute already", None)
                         if space.key(edited) in measured else ("edit: recompute -> none", edited))
    else:
        decision, run = "accept", p.config
    decisions.append({**p.summary(), "decision": decision})
    return run


df = campaign.run(budget=BUDGET, review=review_rule)
print(f"stopped: {campaign.stop_reason}")

# %% [markdown]
# What the rule decided, with what the search predicted for each proposal (tokens/s, the 95%
# interval of a new measurement, P(fits) under the memory limit). Skipped configurations are
# kept in the campaign's store, so a resumed campaign never proposes them again.

# %%
pd.DataFrame(decisions).drop(columns=["why", "log acquisition"], errors="ignore").round(
    {"predicted throughput": 0, "95% low": 0, "95% high": 0, "P(fits)": 2})

# %%
summary_table(df, space)

# %% [markdown]
# ## 5. The best against the default
# The campaign's card: trials by status, the best single measurement, the configuration the
# search recommends (of those measured, the one its GP rates highest: the best single figure
# won partly by its own noise, and where the two differ the card shows both), and its speed-up
# over the reference measured at the start. The figure shows each trial and the best so far.

# %%
campaign

# %%
fig = plots.plot_best_so_far(df, reference=campaign.reference_value(), unit="tokens/s")
fig.savefig(RUNS / "04_best_so_far.png", dpi=120, bbox_inches="tight")
best_config, best_value = campaign.recommend()
print(f"recommended {best_config}: {best_value:,.0f} tokens/s measured, "
      f"{best_value / campaign.reference_value():.2f}x the default")

# %% [markdown]
# ## 6. Speed against memory
# Every configuration that ran, with the Pareto front: no other configuration is both faster
# and lighter. On a machine where memory binds, the front is the menu to choose from.

# %%
fig = plots.plot_pareto(df, "throughput", "peak_mem_gib", unit="tokens/s", second_unit="GiB")
plots.pareto_data(df, "throughput", "peak_mem_gib").query("on_front")[
    [*space.names, "tokens_per_s", "peak_mem_gib"]].round(3)

# %% [markdown]
# ## 7. Ask the predictor
# The search's GP, fitted on every trial of the campaign: move the knobs to see the predicted
# speed, its interval and the probability of fitting under the memory limit, for
# configurations nobody has measured.

# %%
explorer = cml.widgets.PredictorExplorer.from_search(search)
explorer.set_config(best_config)
explorer

# %% [markdown]
# ## 8. Let it run for days, headless
# The same campaign as a file: `cubicml-lab run runs/04_codesign.yaml` starts or resumes it in
# a terminal (tmux, or a job of its own), while this notebook watches its store with
# `cml.widgets.CampaignDashboard.from_store(store, name, refresh_s=10)`. The file names the
# space, workload, launcher, searcher, budget and store. It names no program of its own, so it
# runs as it is; a file that does (a command, an interpreter, environment or Slurm setup lines)
# is refused with the list of what it would run until you pass `--allow-programs`.

# %%
path = campaign.to_yaml(RUNS / "04_codesign.yaml", budget=2 * BUDGET)
print(path.read_text())

# %% [markdown]
# ## What we found
# Computed from this run below: the trials by status and how many ok figures were flagged, the
# default against the configuration the search recommends, the review rule's decisions, why the
# campaign stopped, and the memory the configurations took. A flagged figure (measured beside
# other work, or a single window shown `±?`) is counted but never taken as the best the rule
# compares with. Where the rule skipped everything left, the stop reason says so (not "search
# space exhausted"), and `campaign.unskip()` gives those configurations back to the search. For
# this small model on a CPU memory stays far below the limit; on a GPU the same cells show the
# trade-off that matters.

# %%
s = campaign.summary()
flags = pd.Series([cml.trials.figure_flag(t.metrics) or "unflagged" for t in campaign.trials()
                   if t.status == "ok"], dtype=object).value_counts().to_dict()
rule = pd.Series([d["decision"] for d in decisions], dtype=object).value_counts().to_dict()
rec = ", ".join(f"{k}={v}" for k, v in (s["recommended_config"] or {}).items())
mem = campaign.dataframe().query("status == 'ok'")["peak_mem_gib"]
print(f"{s['trials']} trials of a budget of {BUDGET}: {s['by_status']}; ok figures: {flags}")
print(f"default {s['reference'] or math.nan:,.0f} tokens/s; recommended {rec}: "
      f"{s['recommended'] or math.nan:,.0f} tokens/s, {s['speedup'] or math.nan:.2f}x the default")
print(f"the review rule saw {len(decisions)} proposals: {rule}")
print(f"stopped: {campaign.stop_reason}")
print(f"peak memory {mem.min():.2f} to {mem.max():.2f} GiB, limit {MEMORY_LIMIT_GIB} GiB")
print(cml.trials.contention_note(campaign.trials()) or "no figure shared the CPU with other work")
