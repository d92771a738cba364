"""Measured datasets as a search space plus a table, in one call: ``load(name)``.

Four public tables of cluster measurements ship in ``data/public/`` (``SOURCES.md`` there gives
their attribution, column dictionary and known flaws); four tables of this lab's own workloads
ship in ``data/``: two CPU sweeps (``benchmarks/collect_cpu_sweeps.py`` makes them again on
this machine) and the trials of two co-design campaigns on one H100 and two on one H200
(``benchmarks/gpu_campaign.py``):

=================  ============================================================================
name               what
=================  ============================================================================
bigscience_tr11    BLOOM-176B 3D-topology search, 320-384 A100-80GB (BigScience, 2022)
lucie7b_seq2k      Lucie-7B parallelism runs, sequence 2048, 8-128 A100-80GB (OpenLLM-France)
lucie7b_seq4k      Lucie-7B parallelism runs, sequence 4096, 8-256 A100-80GB (OpenLLM-France)
mpt_llmfoundry     MPT 125M-70B training benchmarks, 8-512 A100/H100 (MosaicML llm-foundry)
gpt_cpu_sweep      ``gpt`` workload, random search on CPU (``data/gpt_cpu_sweep.parquet``)
dlrm_cpu_sweep     ``dlrm`` workload, random search on CPU (``data/dlrm_cpu_sweep.parquet``)
gpt_h100_campaign  ``gpt``, Bayesian search on one H100 (``data/gpt_h100_campaign.parquet``)
gpt_h200_campaign  ``gpt``, Bayesian search on one H200 (``data/gpt_h200_campaign.parquet``)
=================  ============================================================================

Every :class:`Dataset` follows the same conventions:

* ``table`` has one row per measured configuration (failed ones included): the knob columns
  first, then the objective, ``status``, and every other column of the source, for reference.
* ``status`` is ``"ok"``, ``"oom"``, ``"failed"`` or ``"timeout"``. A source's ``no_result`` becomes
  ``"failed"`` (the source's word is kept in ``source_status``); a table without a status column
  is ``"ok"`` where the objective is present, else ``"failed"``. Rows that are not ``"ok"`` have a
  NaN objective when the source gives no number.
* The objective is maximised. For the public tables it is ``tokens_per_s_per_gpu``; for the CPU
  sweeps it is the store's ``throughput`` metric (tokens/s for ``gpt``, samples/s for ``dlrm``).
* Blank knob cells are never dropped: they are filled with a placeholder, ``-1`` for numbers and
  ``"unknown"`` for strings, and the placeholder is one of the space's values. ``notes`` says
  how many cells of which knob were filled.
* ``space`` is built from the values observed: :class:`~cubicml_lab.Ordinal` (sorted) for numbers,
  :class:`~cubicml_lab.Choice` for strings, :class:`~cubicml_lab.Bool` for booleans, and no
  constraints. So every row is in the space, but most points of the space were never measured:
  for a replayed search the pool is ``dataset.configs()``, not ``space.enumerate()``.

The public tables' knob lists are chosen by hand (the settings a user chooses; values derived
from them, like ``dp`` or ``grad_accum``, stay as reference columns), see ``_PUBLIC``. The sweeps'
knobs are the config keys that vary across rows. This module imports no torch and loads pandas
only inside :func:`load`.

Example:
    >>> import cubicml_lab as cml
    >>> ds = cml.datasets.load("lucie7b_seq2k")
    >>> len(ds.table), ds.objective
    (52, 'tokens_per_s_per_gpu')
    >>> ds.knobs
    ['n_gpus', 'tp', 'pp', 'pipeline_engine', 'zero_stage', 'global_batch_seqs']
    >>> all(ds.space.contains(c) for c in ds.configs())
    True
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._params import brief
from .errors import DataError
from .physics import table_physics
from .space import Space
from ._dataset_tables import (
    _STATUS_MAP,
    UNKNOWN,
    UNKNOWN_NUMBER,
    expand_raw,
    fill_blanks,
    is_number_col,
    observed_parameter,
    plain,
    status_column,
    tidy_config_columns,
)
from .trials import FINISHED

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["UNKNOWN", "UNKNOWN_NUMBER", "Dataset", "default_data_dir", "load", "names"]



@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A measured dataset: the space of its knobs and one table row per measured configuration.

    Instances compare by identity (the table is a DataFrame).

    Attributes:
        name: The name :func:`load` knows it by.
        space: Every knob with the values observed (no constraints).
        table: One row per measured configuration: the knob columns, the objective, ``status``
            (``ok``/``oom``/``failed``/``timeout``) and the source's other columns.
        objective: Column of ``table`` to maximise; NaN where nothing was measured.
        knobs: Names of the knob columns, equal to ``space.names``.
        source: One-line citation: where the numbers come from (repository, commit, file).
        notes: How the numbers were measured, how the table was built and its known flaws.
        cost_model: Analytical cost terms of a configuration of ``space``, for
            ``GPPredictor(space, cost_model=...)``: the sweeps' workload's (e.g.
            :func:`cubicml_lab.workloads.gpt.cost_terms`, the table's constant knobs filled
            in); ``mpt_llmfoundry``'s FLOPs, FSDP traffic and overhead per token; for the
            Lucie-7B tables the shared physics of LLM training,
            :func:`cubicml_lab.analytical.table_physics`'s ``cost_terms`` (seconds per token and
            GPU of each term of :data:`cubicml_lab.analytical.TERMS`); None for BLOOM, whose
            physics (``table_physics("bigscience_tr11")``) ranks its noisy rows poorly
            (Kendall tau ~0.2), so it is a search's prior only where asked for.
        features: Derived inputs for the GP's kernel (``GPPredictor(space, features=...)``):
            :func:`cubicml_lab.workloads.gpt.shape_features` on the gpt sweep, None elsewhere.

    Example:
        >>> ds = load("mpt_llmfoundry")
        >>> ok = ds.table[ds.table.status == "ok"]
        >>> bool((ok[ds.objective] > 0).all())
        True
    """

    name: str
    space: Space
    table: pd.DataFrame
    objective: str
    knobs: list[str]
    source: str
    notes: str
    cost_model: Callable[[dict], list[float]] | None = None
    features: Callable[[dict], list[float]] | None = None

    def __repr__(self) -> str:
        counts = self.table["status"].value_counts().to_dict()
        shown = ", ".join(f"{k} {v}" for k, v in counts.items())
        return (f"<Dataset {self.name!r}: {len(self.table)} rows ({shown}), "
                f"{len(self.knobs)} knobs, objective {self.objective!r}>")

    def configs(self, status: str | None = None) -> list[dict[str, Any]]:
        """The knob values of every row (or of the rows with ``status``) as plain Python dicts.

        Example:
            >>> config = load("lucie7b_seq4k").configs()[0]
            >>> config["n_gpus"], config["pipeline_engine"]
            (8, 'deepspeed_pipe')
            >>> len(load("bigscience_tr11").configs(status="oom"))
            6
        """
        rows = self.table if status is None else self.table[self.table["status"] == status]
        return [{k: plain(v) for k, v in zip(self.knobs, values)}
                for values in rows[self.knobs].itertuples(index=False, name=None)]


# ------------------------------------------------------------------------------ public tables
@dataclass(frozen=True)
class _Public:
    """How to turn one CSV of ``data/public/`` into a :class:`Dataset`."""

    file: str
    knobs: tuple[str, ...]
    source: str
    notes: str
    objective: Callable[[pd.DataFrame], pd.Series] | None = None  # None: column already there
    order: Mapping[str, Sequence[Any]] = field(default_factory=dict)  # string knobs with an order
    # builds the Dataset's cost_model from the loaded table (None: the table has none)
    cost_model: Callable[[pd.DataFrame], Callable[[dict], list[float]]] | None = None
    # the table describes Megatron-style LLM training: its cost model is the shared physics
    # (cubicml_lab.physics.table_physics), whatever cost_model says
    physics: bool = False


#: Where the Lucie-7B tables come from: the repository at one commit, then the file.
_LUCIE = ("github.com/OpenLLM-France/Lucie-Training @ c3b8b3a013a32d0a468cd5d6c7bf969a131590c6, "
          "{} (GPL-3.0; numbers only)")

_PUBLIC: dict[str, _Public] = {
    # The BLOOM-176B search varied the 3D layout (tp, pp, with dp = n_gpus / (tp*pp) kept as a
    # reference column: one row breaks it), the batch (micro_batch, global_batch_seqs), ZeRO, the
    # model shape (hidden, n_layers, n_heads: the search traded shape against speed) and, from
    # 2022-02-28, the precision and the pipeline partition method. Not knobs: seq_len (2048
    # throughout), model_size_b_reported (follows from the shape), cluster_state and
    # tflops_formula (context, not choices), date/section (bookkeeping).
    "bigscience_tr11": _Public(
        file="real_bigscience_tr11_a100.csv",
        knobs=("n_gpus", "tp", "pp", "micro_batch", "global_batch_seqs", "zero_stage", "hidden",
               "n_layers", "n_heads", "precision", "pp_partition"),
        source="github.com/bigscience-workshop/bigscience @ "
               "9e64edec2ad1fb9263bf39ba616a84ff64b4d947, "
               "train/tr11-176B-ml/chronicles-prequel.md lines 465-960 (Apache-2.0)",
        notes="BLOOM-176B topology search (Feb 2022), Megatron-DeepSpeed on 40-48 Jean-Zay nodes "
              "of 8 A100-80GB, seq 2048. Each number is a snapshot of the 2nd iteration, which the "
              "author warns fluctuates: the noisiest table. Objective = tokens_per_s_derived / "
              "n_gpus. The model shape differs between rows. Context that changed between "
              "sections is kept in cluster_state (PCIe/NUMA fix on 2022-02-25) and tflops_formula "
              "(corrected ~3% up). One 40-node row has dp*tp*pp = 640 (topology_consistent = 0, "
              "kept as is). n_layers/n_heads are blank where the source does not state them "
              "(the 2022-02-20 hidden-14400 rows, whose layer count changed with pp). Repeats of "
              "one configuration on either side of the cluster fix differ by up to ~8%.",
        objective=lambda df: df["tokens_per_s_derived"] / df["n_gpus"],
    ),
    # The knobs SOURCES.md names for this file. micro_batch/grad_accum come from a prose table,
    # not the logs, and are blank for 15 of 52 runs (where that table contradicts the global
    # batch or does not cover the run), so they stay reference columns; so does
    # dp = n_gpus / (tp*pp) (blank for the mislabelled run).
    "lucie7b_seq2k": _Public(
        file="real_lucie7b_seq2k_a100.csv",
        knobs=("n_gpus", "tp", "pp", "pipeline_engine", "zero_stage", "global_batch_seqs"),
        source=_LUCIE.format("chronicles/parallelism/logs/{z0,z1}/{b192,b512}/iterations/"
                             "*.iterations"),
        physics=True,
        notes="Lucie-7B (Llama-2-7B-like, bf16, seq 2048), Megatron-DeepSpeed on 1-16 Jean-Zay "
              "nodes of 8 A100-80GB. Each ~20-minute run logged every iteration; the objective "
              "(source column) is global_batch_seqs*seq_len / the median iteration time over "
              "iterations >= 3, per GPU. Stalls every 50 iterations are in that median. The run "
              "tagged 1nodes-tp4-pp4 cannot fit 8 GPUs and is probably mislabelled "
              "(topology_consistent = 0, dp blank). micro_batch is not a knob: it comes from "
              "prose, not the logs, and is blank for 15 runs. The seq-4k scripts set "
              "CUDA_LAUNCH_BLOCKING=1; if these did too, absolute throughput is somewhat low.",
    ),
    # Everything that varies and is chosen: layout (n_gpus, tp, pp, pipeline engine), batch
    # (micro_batch, global_batch_seqs; grad_accum follows), vocabulary size and activation
    # recompute. zero_stage (0) and seq_len (4096) are constant; dp follows from the layout.
    "lucie7b_seq4k": _Public(
        file="real_lucie7b_seq4k_a100.csv",
        knobs=("n_gpus", "tp", "pp", "pipeline_engine", "micro_batch", "global_batch_seqs",
               "vocab_size", "activation_recompute"),
        source=_LUCIE.format("chronicles/parallelism/scripts/expe_parallelism/"
                             "expe_summary.csv"),
        physics=True,
        notes="Lucie-7B (bf16, seq 4096, ZeRO-0), Megatron-DeepSpeed on 1-32 Jean-Zay nodes of "
              "8 A100-80GB. One summary row per run, statistic undocumented; objective = the "
              "source's tokens_per_s_per_gpu (derived from its reported throughput). The 32-node "
              "runs logged only 2-3 iterations: noisy. Three rows repeat one 1-node "
              "configuration (~0.2% apart). The 1_seq4k and 2_vocab_65k launch scripts set "
              "CUDA_LAUNCH_BLOCKING=1, which lowers absolute throughput.",
    ),
    # llm-foundry (FSDP only) varies the hardware (gpu), the model size, seq_len, the GPU
    # count, precision, FSDP sharding, activation checkpointing and the batch (micro_batch,
    # global_batch_seqs; grad_accum follows). Not knobs: mp_mode (fixed by precision: bf16 <->
    # PURE), n_nodes and data_parallel (follow from n_gpus), activation_cpu_offload (always 0),
    # n_params (follows from model and seq_len). model is ordered by size.
    "mpt_llmfoundry": _Public(
        file="real_mpt_llmfoundry.csv",
        knobs=("gpu", "model", "seq_len", "n_gpus", "precision", "fsdp_sharding",
               "activation_checkpointing", "micro_batch", "global_batch_seqs"),
        source="github.com/mosaicml/llm-foundry @ 8c8dd48f72168c5d51e2f7b151595892a8fba43d, "
               "scripts/train/benchmarking/README.md (Apache-2.0)",
        notes="MPT 125M-70B training benchmarks on the MosaicML platform (H100-80GB BF16/FP8, "
              "A100-80GB and A100-40GB with 1600 Gb/s RoCE, 8-512 GPUs), Composer + PyTorch FSDP. "
              "Short runs (30 batches by default); throughput is the last 10-batch rolling "
              "window. Objective = throughput_tok_s / n_gpus (the source's per-GPU column is "
              "rounded to an integer). micro_batch was hand-tuned per row, so configurations "
              "are sparse: better for predictor accuracy across models than for search. No failed "
              "runs are reported.",
        objective=lambda df: df["throughput_tok_s"] / df["n_gpus"],
        order={"model": ("125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b")},
        cost_model=lambda df: _MPTCost(df),
    ),
}

@dataclass(frozen=True)
class _Sweep:
    """A table of this lab's own trials (``data/<name>.parquet``): its workload, the script that
    made it, how it measured (a sentence of the notes) and how to get the file (the hint)."""

    workload: str
    script: str
    method: str
    hint: str


_CPU_METHOD = ("random search, each trial in a fresh subprocess under an address-space limit "
               "(configurations that do not fit are 'oom'), median step time in steady state, on "
               "the machine in the hw.* columns. A '-repeats' campaign measures some ok "
               "configurations again (same knobs, new row), which gives the noise floor. Other "
               "processes shared the machine, so noise is a few percent (see step_time_rel_ci).")
_COLLECT_HINT = ("make it with `.venv/bin/python benchmarks/collect_cpu_sweeps.py` (about 45 min "
                 "on 2 cores; `--workloads gpt` or `dlrm` for one), or point data_dir / "
                 "CUBICML_LAB_DATA at the folder that holds it")
_SWEEPS: dict[str, _Sweep] = {
    "gpt_cpu_sweep": _Sweep("gpt", "benchmarks/collect_cpu_sweeps.py", _CPU_METHOD,
                            _COLLECT_HINT),
    "dlrm_cpu_sweep": _Sweep("dlrm", "benchmarks/collect_cpu_sweeps.py", _CPU_METHOD,
                             _COLLECT_HINT),
    "gpt_h100_campaign": _Sweep(
        "gpt", "benchmarks/gpu_campaign.py",
        "two Bayesian co-design campaigns (seeds 0 and 1, 16 and 14 trials) of a 1024-wide, "
        "8-layer GPT (sequence 1,024, vocabulary 32,768) on one NVIDIA H100 80GB HBM3, the "
        "default configuration (fp32, micro-batch 8) first; each trial in a fresh subprocess, "
        "step times from CUDA events, 3 s of timed windows. Both campaigns proposed the same "
        "configurations in the same order, so the second repeats the first's 14 (median "
        "difference 0.3%, at most 2.4%).",
        "it ships in the repository's data/ (git checkout data/gpt_h100_campaign.parquet); make "
        "one on a GPU machine with `python3 benchmarks/gpu_campaign.py`, or point data_dir / "
        "CUBICML_LAB_DATA at the folder that holds it"),
    "gpt_h200_campaign": _Sweep(
        "gpt", "benchmarks/gpu_campaign.py",
        "two Bayesian co-design campaigns (seeds 0 and 1, 14 trials each) of the same GPT as the "
        "H100 campaigns on one NVIDIA H200, the default configuration (fp32, micro-batch 8) "
        "first; each trial in a fresh subprocess, step times from CUDA events, 3 s of timed "
        "windows. The two searched with the gpt cost model of two revisions (1119ddf, then "
        "051a52d, which counts recomputation's launches), so they chose different "
        "configurations after the first 6.",
        "it ships in the repository's data/ (git checkout data/gpt_h200_campaign.parquet); make "
        "one on a GPU machine with `python3 benchmarks/gpu_campaign.py`, or point data_dir / "
        "CUBICML_LAB_DATA at the folder that holds it"),
}


def names() -> list[str]:
    """Every dataset name :func:`load` knows: the public tables, then the CPU sweeps.

    Example:
        >>> names()[:2]
        ['bigscience_tr11', 'lucie7b_seq2k']
    """
    return [*_PUBLIC, *_SWEEPS]


def default_data_dir() -> Path:
    """``$CUBICML_LAB_DATA`` if set, else the repository's ``data/`` folder next to this package."""
    env = os.environ.get("CUBICML_LAB_DATA")
    return Path(env).expanduser() if env else Path(__file__).resolve().parents[1] / "data"


def load(name: str, data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """Load a measured dataset as a :class:`Dataset` (space + table).

    Args:
        name: One of :func:`names`.
        data_dir: Folder holding ``public/`` and the sweep Parquet files; default
            :func:`default_data_dir`.

    Returns:
        The dataset, its table freshly read from disk.

    Raises:
        DataError: An unknown name (the message lists the known ones), a missing file (the hint
            says how to get it) or a file that cannot be read as the expected table.

    Example:
        >>> ds = load("bigscience_tr11")
        >>> int((ds.table.status == "oom").sum()), ds.objective
        (6, 'tokens_per_s_per_gpu')
    """
    if not isinstance(name, str) or name not in _PUBLIC and name not in _SWEEPS:
        raise DataError(f"unknown dataset {brief(name)}; known datasets: {', '.join(names())}",
                        hint="see cubicml_lab.datasets.names()")
    root = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    if name in _PUBLIC:
        return _load_public(name, _PUBLIC[name], root / "public")
    return _load_sweep(name, _SWEEPS[name], root / f"{name}.parquet")


def _load_public(name: str, spec: _Public, folder: Path) -> Dataset:
    pd = _pandas()
    path = folder / spec.file
    if not path.is_file():
        raise DataError(f"no file {path} for dataset {name!r}",
                        hint="the public tables ship in the repository's data/public/; pass "
                             "data_dir= (or set CUBICML_LAB_DATA) to the folder that holds public/")
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read {path} as CSV: {err}",
                        hint="restore it from the repository (git checkout data/public)") from None
    missing = [c for c in spec.knobs if c not in df.columns]
    if missing:
        raise DataError(f"{path} lacks the knob column(s) {missing}",
                        hint="restore it from the repository (git checkout data/public)")
    objective = "tokens_per_s_per_gpu"
    if spec.objective is not None:
        df[objective] = spec.objective(df).astype("float64")
    cost_model = None if spec.cost_model is None else spec.cost_model(df)
    if spec.physics:
        cost_model = table_physics(name).cost_terms
    return _finish(name, df, list(spec.knobs), objective, spec.source, spec.notes, spec.order,
                   cost_model=cost_model)


# ------------------------------------------------------------------------------- CPU sweeps
def _load_sweep(name: str, sweep: _Sweep, path: Path) -> Dataset:
    pd = _pandas()
    workload, hint = sweep.workload, sweep.hint
    if not path.is_file():
        raise DataError(f"no file {path} for dataset {name!r}", hint=hint)
    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError, ImportError) as err:
        raise DataError(f"cannot read {path} as Parquet: {err}", hint=hint) from None
    if "status" not in df.columns:
        raise DataError(f"{path} has no 'status' column: not a trial table",
                        hint="write it with TrialStore.to_dataframe(...).to_parquet(path)")
    others = sorted({str(w) for w in df.get("workload", [])} - {workload, ""})
    if others:
        raise DataError(f"{path} holds trials of workload(s) {others}, not only {workload!r}",
                        hint=f"dataset {name!r} is the {workload!r} sweep; " + hint)
    if "config" in df.columns:  # the raw form: config/metrics/hardware as JSON text or dicts
        df, config_keys = expand_raw(pd, df)
    else:  # the tidy form of TrialStore.to_dataframe: one column per config key
        config_keys = tidy_config_columns(df, path)
    unfinished = ~df["status"].isin(list(FINISHED) + list(_STATUS_MAP))
    dropped = int(unfinished.sum())
    df = df[~unfinished].reset_index(drop=True)
    if not len(df):
        raise DataError(f"{path} has no finished trials", hint=hint)
    if "throughput" not in df.columns:
        df["throughput"] = math.nan
    df["throughput"] = pd.to_numeric(df["throughput"], errors="coerce").astype("float64")
    knobs = [k for k in config_keys if df[k].astype(str).nunique() > 1]
    if not knobs:
        raise DataError(f"{path}: no config key varies across its {len(df)} trials, so there is "
                        "no knob to search", hint=hint)
    versions = sorted({str(v) for v in df.get("workload_version", [])} - {""})
    campaigns = sorted({str(c) for c in df.get("campaign", [])} - {""})
    notes = (f"Real measurements of this lab's {workload!r} workload (version(s) "
             f"{', '.join(versions) or '?'}) by {sweep.script}: {sweep.method} Campaign(s) "
             + (", ".join(campaigns) or "?") + ". Knobs = the config keys that vary.")
    if dropped:
        notes += f" {dropped} unfinished (pending/running) trial(s) dropped."
    source = f"cubicml-lab (this repository), {sweep.script} -> data/{path.name}"
    from .workloads import WithDefaults

    constants = {k: plain(df[k].iloc[0]) for k in config_keys if k not in knobs}
    return _finish(name, df, knobs, "throughput", source, notes, {},
                   cost_model=WithDefaults(workload, "cost_terms", constants),
                   features=WithDefaults(workload, "shape_features", constants)
                   if workload == "gpt" else None)


#: (d_model, n_layers) of the MPT models, from llm-foundry's
#: scripts/train/yamls/pretrain/mpt-*.yaml; with the table's n_params,
#: 6 * n_params + 12 * n_layers * d_model * seq_len reproduces the
#: source's model FLOPs per token (model_tflops_per_gpu / throughput) within 1% on every row.
_MPT_SHAPES: dict[str, tuple[int, int]] = {
    "125m": (768, 12), "350m": (1024, 24), "760m": (1536, 24), "1b": (2048, 24),
    "3b": (2560, 32), "7b": (4096, 32), "13b": (5120, 40), "30b": (7168, 48), "70b": (8192, 80)}


class _MPTCost:
    """Cost terms per token and GPU of an llm-foundry (FSDP) configuration, for
    ``GPPredictor(cost_model=...)``: ``[flops, fsdp, overhead]`` = hardware FLOPs (model FLOPs,
    +1/3 with activation checkpointing; the parameters include the ``d_model x seq_len`` position
    embeddings), parameters moved by FSDP per token (all-gathers and a
    reduce-scatter per micro-batch: 3 x n_params with FULL_SHARD, 2 x with SHARD_GRAD_OP) and
    per-micro-batch fixed costs (n_layers per micro-batch's tokens). GPU, precision and GPU
    count are left to the GP's kernel.

    Not the shared physics (:mod:`cubicml_lab.analytical`), although MPT is LLM training: a row's
    ``model`` names a whole shape (hidden size, layers and heads at once, where ``names=`` /
    ``values=`` map one column onto one vocabulary name), its ``gpu`` varies per row (one
    ``LLMTrainingModel`` has one GPU profile), and FSDP's FULL_SHARD / SHARD_GRAD_OP are ZeRO-3 /
    ZeRO-2 only roughly (no tensor or pipeline parallelism, per-layer all-gathers)."""

    term_names = ("flops", "fsdp", "overhead")

    def __init__(self, df: pd.DataFrame) -> None:
        # n_params = the model's weights + its learned position embeddings (d_model x seq_len)
        first = df.groupby("model")[["n_params", "seq_len"]].first()
        self.base = {str(m): int(r.n_params) - _MPT_SHAPES[str(m)][0] * int(r.seq_len)
                     for m, r in first.iterrows()}

    def __call__(self, config: Mapping[str, Any]) -> list[float]:
        d, layers = _MPT_SHAPES[config["model"]]
        seq = config["seq_len"]
        n = self.base[config["model"]] + d * seq
        flops = (6 * n + 12 * layers * d * seq) * (4 / 3 if config["activation_checkpointing"]
                                                   else 1)
        tokens = config["micro_batch"] * seq
        passes = 3 if config["fsdp_sharding"] == "FULL_SHARD" else 2
        return [float(flops), passes * n / tokens, layers / tokens]

    def __repr__(self) -> str:
        return "<cost terms of an MPT configuration (FLOPs, FSDP traffic, overhead per token)>"


# ------------------------------------------------------------------------------- shared steps
def _finish(name: str, df: pd.DataFrame, knobs: list[str], objective: str, source: str,
            notes: str, order: Mapping[str, Sequence[Any]],
            cost_model: Callable[[dict], list[float]] | None = None,
            features: Callable[[dict], list[float]] | None = None) -> Dataset:
    """Normalise status, fill blank knob cells, build the space and order the columns."""
    df = df.copy()
    df["status"] = status_column(df, objective)
    filled = fill_blanks(df, knobs)
    if filled:
        notes += " Blank knob cells filled: " + ", ".join(
            f"{k} {n} -> {UNKNOWN_NUMBER if is_number_col(df[k]) else repr(UNKNOWN)}"
            for k, n in filled.items()) + "."
    repeats = df.duplicated(knobs, keep=False)
    if repeats.any():
        notes += (f" {int(repeats.sum())} rows share their knob values with another row "
                  f"({int(df[repeats].drop_duplicates(knobs).shape[0])} configurations measured "
                  "more than once).")
    space = Space([observed_parameter(k, df[k], order.get(k)) for k in knobs])
    first = [*knobs, objective, "status"]
    df = df[first + [c for c in df.columns if c not in first]].reset_index(drop=True)
    return Dataset(name=name, space=space, table=df, objective=objective, knobs=list(space.names),
                   source=source, notes=notes, cost_model=cost_model, features=features)


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError as err:  # pragma: no cover - pandas is a dependency
        from .errors import DependencyError

        raise DependencyError(f"loading a dataset needs pandas ({err})",
                              hint="pip install pandas pyarrow") from None
    return pd
