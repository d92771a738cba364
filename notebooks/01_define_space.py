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
# # 01 · Defining a space: which ways of training a job are there?
#
# **Question.** Before a search can choose how to train a model, it needs the list of valid
# choices: parallel degrees that multiply to the number of devices, a micro-batch that divides
# the batch, a tensor-parallel degree that divides the heads. How do we write that down so that
# a search never proposes a layout that cannot run, and a typo fails in the cell that made it?
# This notebook builds a GPT space (FSDP / tensor / data parallel on N devices) and a DLRM
# embedding-sharding space, then shows the `SpaceEditor` widget that builds one in a form.
#
# Runtime: about 2 seconds; no GPU needed (nothing is trained here).

# %%
import math
import os
from pathlib import Path

import pandas as pd

import cubicml_lab as cml

# %% tags=["parameters"]
SMOKE = os.environ.get("CUBICML_LAB_SMOKE") == "1"  # same cells either way: nothing is trained
N_DEVICES = 8  # GPUs (or processes) one job runs on
N_HEADS = 16  # attention heads of the GPT: tensor parallelism must divide them
GLOBAL_BATCH = 64  # sequences per optimizer step
SAMPLES = 6  # configurations drawn to look at
ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
RUNS = Path(os.environ.get("CUBICML_LAB_RUNS", ROOT / "runs"))  # git-ignored
RUNS.mkdir(parents=True, exist_ok=True)
SEED = 0
if SMOKE:
    print("SMOKE RUN: this notebook has no budget to shrink; its figures are the real ones.")

# %% [markdown]
# ## 1. Parameter types
# Each knob is one parameter. Its type says which values it takes and how a Gaussian process
# sees it: ordered numbers on a (log) scale, or categories one-hot.
#
# | type | values | encoded as |
# | --- | --- | --- |
# | `Int(name, low, high)` | every integer in the range | a number (log scale with `log=True`) |
# | `PowerOfTwo(name, low, high)` | 1, 2, 4, ... | log2 of the value |
# | `Ordinal(name, [..])` | listed values, in order | their rank |
# | `Choice(name, [..])` | unordered categories | one-hot |
# | `Bool(name)` | False, True | 0 / 1 |
# | `Float(name, low, high)` | a real range (not enumerable) | a number |

# %%
knobs = [cml.PowerOfTwo("tp", 1, 8), cml.PowerOfTwo("pp", 1, 8), cml.PowerOfTwo("micro_batch", 1, 16),
         cml.Choice("recompute", ["none", "selective", "full"]), cml.Bool("compile")]
pd.DataFrame([{"parameter": p.name, "type": p.kind, "values": p.values()} for p in knobs])

# %% [markdown]
# ## 2. A GPT space on N devices: constants, derived values, constraints
# The data-parallel degree is not a free knob: it is what is left of the devices, so it is
# *derived*. Constraints are short expressions. They are parsed into a small evaluator that
# knows arithmetic, comparisons, `and`/`or`, `min`/`max`/`abs` and the space's names. Python's
# `eval` is never used. Derived values are computed for every point of the grid before the
# constraints are checked, so a derived value guards its own divisions (`max(1, ...)`); the
# constraints run in order and stop at the first that fails. The card below is how a `Space`
# shows itself in Jupyter.

# %%
gpt_space = cml.Space(
    knobs,
    constants={"world_size": N_DEVICES, "n_heads": N_HEADS, "global_batch": GLOBAL_BATCH},
    derived={"dp": "world_size // (tp * pp)",
             "grad_accum": "global_batch // max(1, micro_batch * dp)"},
    constraints=["world_size % (tp * pp) == 0", "n_heads % tp == 0",
                 "global_batch % (micro_batch * dp) == 0", "pp == 1 or micro_batch <= 8"],
)
gpt_space

# %% [markdown]
# Size, validity and sampling. `contains` answers whether a configuration is valid. `resolve`
# adds the derived values. `sample` draws valid configurations uniformly.

# %%
grid = math.prod(len(p.values()) for p in knobs)
print(f"{gpt_space.size():,} valid of the {grid:,} combinations on the grid")
probe = {"tp": 8, "pp": 2, "micro_batch": 4, "recompute": "none", "compile": False}
print("tp=8, pp=2 on 8 devices valid?", gpt_space.contains(probe))
pd.DataFrame([gpt_space.resolve(c) for c in gpt_space.sample(SAMPLES, seed=SEED)])

# %% [markdown]
# ## 3. A DLRM embedding-sharding space
# For a recommender, the knobs are how the embedding tables are placed: replicated on every
# rank, or table-wise, where each table lives on one rank and lookups travel by all-to-all. Add
# the batch per rank and whether gradients of the tables are sparse. Table-wise sharding needs
# the tables to spread evenly over the ranks.

# %%
dlrm_space = cml.Space(
    [cml.Choice("embedding_sharding", ["replicated", "table_wise"]),
     cml.Ordinal("num_tables", [4, 8, 16, 26]), cml.PowerOfTwo("batch_size", 256, 8192),
     cml.Bool("sparse_grads"), cml.Choice("optimizer", ["sgd", "adagrad", "adam"])],
    constants={"world_size": N_DEVICES},
    constraints=["embedding_sharding == 'replicated' or num_tables % world_size == 0",
                 "not (sparse_grads and optimizer == 'adagrad' and batch_size > 4096)"],
)
dlrm_space

# %% [markdown]
# ## 4. Saving and reading a space: YAML round trip
# A space is plain data: parameters, constants, derived values and constraints as strings. The
# YAML file is what a colleague or a cluster job reads back. It is checked like a space built
# in code, and nothing in it is executed.

# %%
path = RUNS / "gpt_space.yaml"
gpt_space.to_yaml(path)
print(path.read_text())
assert cml.Space.from_yaml(path) == gpt_space
print("read back equal:", cml.Space.from_yaml(path) == gpt_space)

# %% [markdown]
# ## 5. What an error looks like
# A space is checked when it is built, so a mistake shows up in the cell that wrote it. Each
# message names the field, the value and the fix. Below are three common mistakes: an
# unknown name in a constraint, a power of two that is not one, and constraints that no
# configuration meets.

# %%
mistakes = {
    "typo in a constraint": lambda: cml.Space(knobs, constants={"world_size": 8},
                                              constraints=["world_sise % tp == 0"]),
    "not a power of two": lambda: cml.PowerOfTwo("tp", 1, 6),
    "nothing is valid": lambda: cml.Space(knobs, constraints=["tp * pp > 64"]),
}
for what, build in mistakes.items():
    try:
        build()
    except cml.CubicMLError as err:
        print(f"{what}:\n  {err}\n")

# %% [markdown]
# ## 6. The `SpaceEditor` widget
# The same space in a form. Edit a row, add a parameter or a constraint, and press *apply*: the
# editor shows the size, a sample and the first error (in red, no traceback). `editor.space`
# holds the last valid space, ready for a searcher.

# %%
editor = cml.widgets.SpaceEditor(gpt_space)
editor

# %%
print(editor.space.size(), "valid configurations in the editor's space")

# %% [markdown]
# ## What we found
# On 8 devices with 16 heads and a global batch of 64, the GPT space keeps 258 of the 480
# combinations on its grid (54%). The divisibility rules (tp * pp must divide the devices, tp
# the heads, micro-batch * dp the batch) and the pipeline's micro-batch cap remove the rest;
# `tp=8, pp=2` asks for 16 devices and is refused. The DLRM space keeps 210 of 288: table-wise
# sharding of 4 or 26 tables over 8 ranks is out, and so is sparse Adagrad above 4,096 samples.
# None of the removed combinations would run, so no later step spends a trial on them. The rules
# read like Megatron-LM's argument checks; each error names the field, the value and a fix (a typo
# lists the names that exist). A space is plain data, and its YAML file reads back equal, so one
# file carries it between a notebook and a cluster job.
