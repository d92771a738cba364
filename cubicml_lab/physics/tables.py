"""The public tables of Megatron-style training (BLOOM-176B, Lucie-7B) as jobs of
:class:`~cubicml_lab.physics.LLMTrainingModel`, with their columns mapped."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .model import LLMTrainingModel
from .profiles import PhysicsConstants

# ------------------------------------------------------------- the public tables as jobs
#: The public tables that describe Megatron-style training, as jobs of the model: the shape and
#: settings from their launch scripts (Lucie-7B, OpenLLM-France/Lucie-Training
#: chronicles/parallelism/scripts/expe_parallelism/1_seq4k/lucie7b-seq4k.slurm: 32 layers,
#: hidden 4096, 32 heads, SwiGLU MLP 11008, untied embeddings, --use-flash-attn-v2; BLOOM-176B,
#: bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm: 70 layers, hidden
#: 14336, 112 heads, vocabulary 250880, tied embeddings, --checkpoint-activations; its rows in
#: bf16 ran DeepSpeed's bf16 optimizer with fp32 gradient accumulation, chronicles-prequel.md
#: from 2022-02-28; blank shape cells of the BLOOM table take BLOOM-176B's), the table's
#: columns mapped onto the vocabulary,
#: and the columns the model has no term for (left to the GP, without a warning).
_TABLE_JOBS: dict[str, dict[str, Any]] = {
    "lucie7b_seq2k": dict(
        job=dict(layers=32, hidden=4096, heads=32, ffn=11008, gated_mlp=True, seq_len=2048,
                 vocab=32000, global_batch=512, n_gpus=8, gpu="A100-80GB",
                 flash_attention=True),
        names={"global_batch_seqs": "global_batch"}, values={}, ignored=("pipeline_engine",)),
    "lucie7b_seq4k": dict(
        job=dict(layers=32, hidden=4096, heads=32, ffn=11008, gated_mlp=True, seq_len=4096,
                 vocab=32000, global_batch=512, n_gpus=8, gpu="A100-80GB",
                 flash_attention=True),
        names={"global_batch_seqs": "global_batch", "vocab_size": "vocab",
               "activation_recompute": "recompute"},
        values={"activation_recompute": {0: "none", 1: "full"}}, ignored=("pipeline_engine",)),
    "bigscience_tr11": dict(
        job=dict(layers=70, hidden=14336, heads=112, seq_len=2048, vocab=250880,
                 tied_embeddings=True, global_batch=2048, n_gpus=384, gpu="A100-80GB",
                 precision="bf16", defaults={"recompute": "full"}, fp32_grads=("bf16",)),
        names={"global_batch_seqs": "global_batch", "n_layers": "layers", "n_heads": "heads"},
        values={"n_layers": {-1: 70}, "n_heads": {-1: 112}}, ignored=("pp_partition",)),
}


def table_physics(dataset: Any, *,
                  constants: PhysicsConstants | None = None) -> LLMTrainingModel:
    """The :class:`LLMTrainingModel` of a public table of Megatron-style LLM training.

    Its cost terms are per token and GPU (``per_token=True``), as the tables' objective is
    tokens/s per GPU and their rows differ in GPU count and batch. ``mpt_llmfoundry`` is not
    one: its ``model`` column names a whole shape (several facts at once) and it trains with
    FSDP, whose knobs map only roughly onto ZeRO stages.

    How well the bare model (default constants, no measurement) ranks the measured rows: Kendall
    tau between predicted and measured tokens/s per GPU over the ok rows 0.79 (lucie7b_seq2k),
    0.70 (lucie7b_seq4k), 0.19 (bigscience_tr11, the noisiest table, whose shape varies); it
    predicts 1.7-1.8x the Lucie throughput (their scripts set ``CUDA_LAUNCH_BLOCKING=1``) and
    1.2x BLOOM's. BLOOM's reported peak memory (``mem_gb_max``) ranks at tau 0.83 against the
    predicted, which is ~0.8x of it (tau 0.67 before its bf16 rows' fp32 gradients were
    modelled: the bf16 rows were then predicted at ~0.65x, the fp16 rows at ~0.8x).

    Args:
        dataset: "lucie7b_seq2k", "lucie7b_seq4k" or "bigscience_tr11", or its Dataset.
        constants: The physics' constants (default: :class:`PhysicsConstants()`).

    Raises:
        ConfigError: For a table that is not one of these.

    Example:
        >>> from cubicml_lab import datasets
        >>> from cubicml_lab.physics import TERMS
        >>> ds = datasets.load("lucie7b_seq4k")
        >>> terms = table_physics(ds).cost_terms_frame(ds.configs())
        >>> terms.shape == (len(ds.table), len(TERMS)), bool((terms.sum(axis=1) > 0).all())
        (True, True)
    """
    name = dataset if isinstance(dataset, str) else getattr(dataset, "name", None)
    if name not in _TABLE_JOBS:
        raise ConfigError(f"no physics for table {name!r}",
                          hint=f"one of {list(_TABLE_JOBS)}; for your own job build "
                               "LLMTrainingModel(...) with names=/values= for its columns")
    spec = _TABLE_JOBS[name]
    # the records hold rows whose topology is inconsistent (tp * pp > n_gpus, dp blank): they
    # are modelled as recorded, not refused
    model = LLMTrainingModel(**spec["job"], names=spec["names"], values=spec["values"],
                             constants=constants, per_token=True, strict_layouts=False)
    model._warned.update(spec["ignored"])
    return model
