"""The datasets :mod:`cubicml_lab.datasets` knows, one entry each: for a public table of
``data/public/`` its CSV file, the knobs chosen by hand, the citation, the notes on how it was
measured and its known flaws, how its objective (tokens/s per GPU) is computed and which cost
model it gets; for a table of this lab's own trials (``data/<name>.parquet``) its workload, the
script that made it, how it measured and how to get the file.

``MPTCost`` is the cost model of ``mpt_llmfoundry`` (FLOPs, FSDP traffic and overhead per token
and GPU). Nothing here reads a file or imports pandas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PUBLIC", "SWEEPS", "MPTCost", "PublicTable", "SweepTable"]


# ------------------------------------------------------------------------------ public tables
@dataclass(frozen=True)
class PublicTable:
    """How to turn one CSV of ``data/public/`` into a :class:`~cubicml_lab.datasets.Dataset`."""

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

PUBLIC: dict[str, PublicTable] = {
    # The BLOOM-176B search varied the 3D layout (tp, pp, with dp = n_gpus / (tp*pp) kept as a
    # reference column: one row breaks it), the batch (micro_batch, global_batch_seqs), ZeRO, the
    # model shape (hidden, n_layers, n_heads: the search traded shape against speed) and, from
    # 2022-02-28, the precision and the pipeline partition method. Not knobs: seq_len (2048
    # throughout), model_size_b_reported (follows from the shape), cluster_state and
    # tflops_formula (context, not choices), date/section (bookkeeping).
    "bigscience_tr11": PublicTable(
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
    "lucie7b_seq2k": PublicTable(
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
    "lucie7b_seq4k": PublicTable(
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
    "mpt_llmfoundry": PublicTable(
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
        cost_model=lambda df: MPTCost(df),
    ),
}


# ------------------------------------------------------------------- this lab's own trials
@dataclass(frozen=True)
class SweepTable:
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
SWEEPS: dict[str, SweepTable] = {
    "gpt_cpu_sweep": SweepTable("gpt", "benchmarks/collect_cpu_sweeps.py", _CPU_METHOD,
                            _COLLECT_HINT),
    "dlrm_cpu_sweep": SweepTable("dlrm", "benchmarks/collect_cpu_sweeps.py", _CPU_METHOD,
                             _COLLECT_HINT),
    "gpt_h100_campaign": SweepTable(
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
    "gpt_h200_campaign": SweepTable(
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


#: (d_model, n_layers) of the MPT models, from llm-foundry's
#: scripts/train/yamls/pretrain/mpt-*.yaml; with the table's n_params,
#: 6 * n_params + 12 * n_layers * d_model * seq_len reproduces the
#: source's model FLOPs per token (model_tflops_per_gpu / throughput) within 1% on every row.
_MPT_SHAPES: dict[str, tuple[int, int]] = {
    "125m": (768, 12), "350m": (1024, 24), "760m": (1536, 24), "1b": (2048, 24),
    "3b": (2560, 32), "7b": (4096, 32), "13b": (5120, 40), "30b": (7168, 48), "70b": (8192, 80)}


class MPTCost:
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
