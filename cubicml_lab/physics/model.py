"""The model of one job: :class:`LLMTrainingModel`, its knob vocabulary (:data:`KNOBS`), the facts
a configuration may carry (:data:`FACTS`), and the checks of a user's ``names=``, ``values=``
and ``defaults=`` mappings."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._params import brief
from ..errors import ConfigError
from .formulas import Arch, step_physics
from .knobs import (
    ACCEPTS,
    BUILTIN_DEFAULTS,
    FACTS,
    KNOBS,
    SIZE,
    accepts,
    check_defaults,
    check_names,
    check_values,
    describe,
    gpu_spec,
    hashable,
    holds,
    is_number,
    layout_hint,
    layout_message,
    one_row,
    typed_values,
)
from .profiles import GPUS_PER_NODE, PRECISIONS, TERMS, GPUSpec, PhysicsConstants

if TYPE_CHECKING:
    import pandas as pd

# ------------------------------------------------------------------------ the model of one job
class LLMTrainingModel:
    """Step time, cost terms and peak memory of one LLM training job, per configuration.

    Built from the job's facts; a configuration holds the knobs (:data:`KNOBS`: ``tp``, ``pp``,
    ``dp``, ``micro_batch``, ``virtual_stages``, ``recompute`` none/selective/full,
    ``sequence_parallel``, ``tp_overlap``, ``dp_overlap``, ``distributed_optimizer``,
    ``zero_stage`` 0-3, ``offload_weights``, ``offload_activations``, ``offload_optimizer``,
    ``precision`` bf16/fp16/fp8, and fp32 for a CPU run), under the user's own names. A knob left
    out takes the job's default (``defaults=``, else tp = pp = micro_batch = virtual_stages = 1,
    no recompute, ZeRO-0, dp overlap on, the rest off, the job's precision); ``dp`` left out is
    ``n_gpus / (tp pp)``. A config may also carry a job fact (:data:`FACTS`) per row. Keys it
    does not know are ignored (for a GP's kernel to model) and named once in a warning.

    Args:
        layers: Transformer layers.
        hidden: Hidden size.
        heads: Attention heads (must divide ``hidden``).
        seq_len: Tokens per sequence.
        vocab: Vocabulary size (untied input and output embeddings unless
            ``tied_embeddings``).
        global_batch: Sequences per optimizer step.
        n_gpus: GPUs of the job.
        gpu: A name of :data:`GPUS` ("A100-40GB", "A100-80GB", "H100-80GB", "H200") or a
            :class:`GPUSpec` (e.g. a CPU described as one).
        kv_heads: Key/value heads (grouped-query attention); default ``heads``.
        ffn: MLP hidden size; default ``4 * hidden``.
        gated_mlp: A gated MLP (SwiGLU, three ``hidden x ffn`` matrices), as Llama's.
        tied_embeddings: The output layer shares the input embedding's weights (GPT-2).
        flash_attention: Fused attention (FlashAttention, PyTorch's SDPA): the ``s x s``
            scores are neither stored (no ``5 a s / (h t)`` activation term) nor moved through
            HBM, and selective recompute has nothing left to drop.
        gpus_per_node: GPUs per node: groups within a node talk over NVLink.
        precision: The job's precision, "bf16", "fp16", "fp8" or "fp32".
        fp32_grads: Precisions (of :data:`PRECISIONS`) whose gradients are accumulated and
            reduced in fp32: 4 bytes per parameter instead of 2 in memory and in the
            data-parallel gradient traffic (the parameter all-gathers of ZeRO keep their
            size). Megatron-LM does so for bf16 (``--accumulate-allreduce-grads-in-fp32``,
            implied by ``--bf16``; its distributed-optimizer table counts 18 bytes per
            parameter for "bf16 param, fp32 grads"), as does DeepSpeed's bf16 optimizer; e.g.
            ``fp32_grads=("bf16",)``. Default: none.
        names: User name -> vocabulary name (a knob or a fact), e.g. ``{"tensor_par": "tp"}``.
        values: User (or vocabulary) name -> {user value -> vocabulary value}, e.g.
            ``{"activation_recompute": {"attn_only": "selective", True: "full"}}``; values
            not listed pass through unchanged.
        defaults: Knob -> the job's default value, e.g. ``{"sequence_parallel": True}``.
        constants: The model's constants; default :class:`PhysicsConstants()`.
        per_token: Give :meth:`cost_terms` in seconds per token and GPU (the step's seconds x
            ``n_gpus / (global_batch seq_len)``) instead of per step: for an objective in
            tokens/s per GPU over configs whose GPU count or batch differ.
        strict_layouts: Refuse a layout the job's GPUs cannot hold (``tp * pp`` not dividing
            ``n_gpus`` where dp follows from them, ``tp * pp * dp > n_gpus``) with a
            ConfigError; False models it as given (dp = ``n_gpus / (tp pp)`` may be 0.5), for
            a table whose records hold such rows (:func:`table_physics`).

    Raises:
        ConfigError: On a bad fact, an unknown GPU or precision, or a bad ``names``/``values``/
            ``defaults`` mapping (the message names the entry and the fix).

    Example:
        >>> job = LLMTrainingModel(layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000,
        ...                        global_batch=512, n_gpus=64, gpu="A100-80GB",
        ...                        names={"activation_recompute": "recompute"},
        ...                        values={"activation_recompute": {True: "full", False: "none"}})
        >>> config = {"tp": 2, "pp": 4, "micro_batch": 1, "activation_recompute": True}
        >>> round(job.step_time_s(config), 2) == round(sum(job.cost_terms(config).values()), 2)
        True
        >>> job.memory_gib(config) < job.memory_gib({**config, "activation_recompute": False})
        True
    """

    #: Names of :meth:`cost_terms`' values (``GPPredictor.cost_shares`` columns).
    term_names: tuple[str, ...] = TERMS

    def __init__(self, *, layers: int, hidden: int, heads: int, seq_len: int, vocab: int,
                 global_batch: int, n_gpus: int, gpu: str | GPUSpec,
                 kv_heads: int | None = None, ffn: int | None = None, gated_mlp: bool = False,
                 tied_embeddings: bool = False, flash_attention: bool = False,
                 gpus_per_node: int = GPUS_PER_NODE,
                 precision: str = "bf16", fp32_grads: Sequence[str] = (),
                 names: Mapping[str, str] | None = None,
                 values: Mapping[str, Mapping[Any, Any]] | None = None,
                 defaults: Mapping[str, Any] | None = None,
                 constants: PhysicsConstants | None = None, per_token: bool = False,
                 strict_layouts: bool = True) -> None:
        facts = {"layers": layers, "hidden": hidden, "heads": heads,
                 "kv_heads": heads if kv_heads is None else kv_heads,
                 "ffn": 4 * hidden if is_number(hidden) and ffn is None else ffn,
                 "seq_len": seq_len, "vocab": vocab, "global_batch": global_batch,
                 "n_gpus": n_gpus, "gpus_per_node": gpus_per_node}
        for name, value in facts.items():
            if not is_number(value) or value < 1 or value != int(value):  # NaN, inf: no number
                raise ConfigError(f"LLMTrainingModel({name}={brief(value)}): must be {SIZE}",
                                  hint="give the job's facts, e.g. layers=40, hidden=5120, "
                                       "heads=40, seq_len=2048, vocab=32000, global_batch=1024, "
                                       "n_gpus=64")
        if hidden % heads or heads % facts["kv_heads"]:
            raise ConfigError(f"LLMTrainingModel: heads = {heads} must divide hidden = {hidden} "
                              f"and kv_heads = {facts['kv_heads']} must divide heads",
                              hint="e.g. hidden=4096, heads=32, kv_heads=8")
        self.facts: dict[str, int] = {k: int(v) for k, v in facts.items()}
        self.gpu = gpu_spec(gpu)
        if not isinstance(precision, str) or precision not in PRECISIONS:
            raise ConfigError(f"LLMTrainingModel(precision={brief(precision)}) is not one of "
                              f"{list(PRECISIONS)}", hint="e.g. precision='bf16'")
        if isinstance(fp32_grads, str) or not isinstance(fp32_grads, (tuple, list)) or \
                not all(isinstance(p, str) and p in PRECISIONS for p in fp32_grads):
            raise ConfigError(f"LLMTrainingModel(fp32_grads={brief(fp32_grads)}) is not a tuple of "
                              f"precisions among {list(PRECISIONS)}",
                              hint="e.g. fp32_grads=('bf16',) for Megatron-LM in bf16")
        self.fp32_grads = tuple(fp32_grads)
        if constants is not None and not isinstance(constants, PhysicsConstants):
            raise ConfigError(f"constants = {brief(constants)} is not a PhysicsConstants",
                              hint="constants=PhysicsConstants(...) or .perturbed(seed)")
        self.gated_mlp, self.tied_embeddings = bool(gated_mlp), bool(tied_embeddings)
        self.flash_attention = bool(flash_attention)
        self.per_token = bool(per_token)
        self.strict_layouts = bool(strict_layouts)
        self.precision = precision
        self.constants = constants or PhysicsConstants()
        self.names = check_names(names)
        self.values = check_values(values, self.names)
        self.defaults = {**BUILTIN_DEFAULTS, "precision": precision,
                         **check_defaults(defaults, self.names, self.values)}
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        f = self.facts
        return (f"<LLMTrainingModel: {f['layers']} layers x hidden {f['hidden']}, seq "
                f"{f['seq_len']}, batch {f['global_batch']}, {f['n_gpus']} x {self.gpu.name}, "
                f"{self.precision}>")

    @property
    def memory_limit_gib(self) -> float:
        """Memory per GPU a job can use, GiB (the GPU profile's)."""
        return self.gpu.memory_gib

    # -- one configuration
    def resolve(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The configuration in the vocabulary: every knob and fact, defaults filled in.

        Example:
            >>> job = LLMTrainingModel(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000,
            ...                        global_batch=16, n_gpus=8, gpu="H100-80GB")
            >>> job.resolve({"tp": 2})["dp"], job.resolve({"tp": 2})["recompute"]
            (4, 'none')
        """
        x = self._inputs(one_row(config), 1, frame=False)
        out = {k: v[0].item() if hasattr(v[0], "item") else v[0] for k, v in x.items()
               if k in ACCEPTS}
        return {k: int(v) if isinstance(v, float) and v.is_integer() else v
                for k, v in out.items()}

    def evaluate(self, config: Mapping[str, Any]) -> dict[str, float]:
        """Every modelled quantity of one configuration (a row of :meth:`evaluate_frame`)."""
        out = self._physics(self._inputs(one_row(config), 1, frame=False))
        return {k: float(v[0]) for k, v in out.items()}

    def cost_terms(self, config: Mapping[str, Any]) -> dict[str, float]:
        """Seconds of each cost term of one step (:data:`TERMS`); their sum is the step time.

        For ``BayesianSearch(cost_model=...)`` / ``GPPredictor(cost_model=...)``; per token and
        GPU with ``per_token=True``. About 0.3 ms a call: over thousands of candidates use
        :meth:`cost_terms_frame` (50,000 rows in ~0.1 s).
        """
        out = self._physics(self._inputs(one_row(config), 1, frame=False))
        scale = self._scale(out)
        return {k: float(out[k][0] * scale[0]) for k in TERMS}

    def step_time_s(self, config: Mapping[str, Any]) -> float:
        """Seconds per optimizer step: the sum of the per-step cost terms (overlaps taken)."""
        return self.evaluate(config)["step_time_s"]

    def throughput(self, config: Mapping[str, Any]) -> float:
        """Tokens per second of the whole job (``global_batch * seq_len / step_time_s``)."""
        return self.evaluate(config)["tokens_per_s"]

    def memory_gib(self, config: Mapping[str, Any]) -> float:
        """Peak memory per GPU (the most loaded pipeline stage), GiB."""
        return self.evaluate(config)["peak_mem_gib"]

    # -- many configurations at once
    def evaluate_frame(self, configs: pd.DataFrame | Any) -> pd.DataFrame:
        """Every modelled quantity of each row of ``configs`` (a DataFrame or a list of dicts).

        Returns:
            DataFrame with ``configs``' index, one row per configuration: the :data:`TERMS`
            (seconds per step), ``step_time_s``, ``tokens_per_s`` (job), ``tokens_per_s_per_gpu``,
            ``peak_mem_gib``, ``mfu`` (0-1, model FLOPs over the bf16 peak),
            ``bubble_fraction``, ``dp``, ``grad_accum`` (micro-batches per step), the bytes
            each GPU sends per step: ``tp_comm_bytes`` (ring all-reduces, or reduce-scatters
            plus all-gathers, of the layer activations), ``dp_comm_bytes`` (gradients and,
            with ZeRO >= 1, parameters), ``p2p_bytes`` (pipeline activations and their
            gradients), and ``tp_comm_all_s`` (TP seconds including full recompute's).
        """
        import pandas as pd

        df = configs if isinstance(configs, pd.DataFrame) else pd.DataFrame(list(configs))
        out = self._physics(self._inputs({c: df[c] for c in df.columns}, len(df), frame=True))
        return pd.DataFrame(out, index=df.index)

    def cost_terms_frame(self, configs: pd.DataFrame | Any) -> pd.DataFrame:
        """:meth:`cost_terms` of every row: a DataFrame with one column per term (seconds)."""
        out = self.evaluate_frame(configs)
        return out[list(TERMS)].mul(self._scale(out).to_numpy(), axis=0)

    def _scale(self, out: Any) -> Any:
        """1, or the GPU-seconds per token that turn a step's seconds into per-token ones."""
        if not self.per_token:
            return out["step_time_s"] * 0 + 1
        return 1 / (out["step_time_s"] * out["tokens_per_s_per_gpu"])

    def memory_gib_frame(self, configs: pd.DataFrame | Any) -> pd.Series:
        """:meth:`memory_gib` of every row, GiB, as a Series with ``configs``' index."""
        return self.evaluate_frame(configs)["peak_mem_gib"]

    # -- internals
    def _inputs(self, data: Mapping[str, Any], n: int, *, frame: bool) -> dict[str, np.ndarray]:
        """Vocabulary arrays of length ``n`` from user columns: renamed, values mapped and
        checked, unknown keys warned about, defaults and derived values filled in; a layout
        the job's GPUs cannot hold (:meth:`holds_frame`) is refused."""
        x, derived = self._inputs_unchecked(data, n, frame=frame)
        if not self.strict_layouts:
            return x
        bad = ~holds(x, derived)
        if bad.any():
            i = int(np.argmax(bad))
            raise ConfigError(layout_message(x, i, bool(derived[i]), frame),
                              hint=layout_hint(self.names, self.facts["n_gpus"]))
        return x

    def _inputs_unchecked(self, data: Mapping[str, Any], n: int, *, frame: bool
                          ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """:meth:`_inputs` without the layout check, and per row whether dp was derived."""
        given: dict[str, np.ndarray] = {}
        source: dict[str, str] = {}
        unknown = []
        dp_left_out = None
        if frame:
            import pandas as pd
        for column, data_column in data.items():
            target = self.names.get(column, column)
            if target not in ACCEPTS:
                unknown.append(column)
                continue
            if target in given:
                raise ConfigError(f"config keys {brief(source[target])} and {brief(column)} "
                                  f"both give {brief(target)}",
                                  hint="drop one of them, or map it elsewhere with names=")
            if frame:  # an empty cell (NaN, None) is a knob or fact left out in that row
                missing = np.asarray(pd.isna(data_column), dtype=bool)
                if missing.all():
                    continue
                if missing.any():
                    fill = 1 if target == "dp" else self.facts[target] if target in FACTS \
                        else self.defaults[target]
                    data_column = pd.Series(data_column).where(~missing, fill)
                    if target == "dp":
                        dp_left_out = missing
            source[target] = str(column)
            given[target] = self._column(column, target, data_column, frame)
        self._warn(unknown)
        x = self._filled(given, n)
        if dp_left_out is not None:  # dp follows from the GPUs in the rows that leave it out
            x["dp"] = np.where(dp_left_out, x["n_gpus"] / (x["tp"] * x["pp"]), x["dp"])
        derived = np.full(n, "dp" not in given) if dp_left_out is None else dp_left_out
        return x, derived

    def holds_frame(self, configs: pd.DataFrame | Any) -> np.ndarray:
        """Per row of ``configs`` (a DataFrame or a list of dicts): whether the job's GPUs can
        hold its layout: ``tp * pp`` divides ``n_gpus`` where dp follows from them, ``tp * pp *
        dp <= n_gpus`` where the row gives dp. :meth:`cost_terms`, :meth:`memory_gib` and the
        ``*_frame`` methods refuse the others with a ConfigError; a search leaves them out.
        With ``strict_layouts=False`` every row is taken (all True).

        Returns:
            Bool array of shape ``(len(configs),)``.

        Raises:
            ConfigError: On a value that is not valid at all (as :meth:`evaluate_frame`).

        Example:
            >>> job = LLMTrainingModel(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000,
            ...                        global_batch=16, n_gpus=8, gpu="H100-80GB")
            >>> job.holds_frame([{"tp": 2, "pp": 2}, {"tp": 4, "pp": 4}, {"tp": 3}]).tolist()
            [True, False, False]
        """
        import pandas as pd

        df = configs if isinstance(configs, pd.DataFrame) else pd.DataFrame(list(configs))
        if not self.strict_layouts:
            return np.ones(len(df), dtype=bool)
        return holds(*self._inputs_unchecked({c: df[c] for c in df.columns}, len(df),
                                              frame=True))

    def _column(self, column: str, target: str, data: Any, frame: bool) -> np.ndarray:
        mapping = self.values.get(column, self.values.get(target, {}))
        if frame:
            import pandas as pd

            try:
                codes, uniques = pd.factorize(data, use_na_sentinel=False)
            except TypeError:  # a list or dict in a cell
                bad = next(v for v in data if not hashable(v))
                raise ConfigError(f"config {brief(column)} holds {brief(bad)}, not a valid "
                                  f"{brief(target)}: it must be {describe(target)}",
                                  hint="give each row a plain value") from None
            uniques = [u.item() if isinstance(u, np.generic) else u for u in uniques]
        else:
            codes, uniques = None, list(data)
        mapped = [mapping.get(u, u) if hashable(u) else u for u in uniques]
        for raw, value in zip(uniques, mapped):
            if not accepts(target, value):
                via = f" (-> {brief(value)} through values=)" if value is not raw else ""
                named = "" if target == column else f" (names= maps it onto {brief(target)})"
                raise ConfigError(f"config {brief(column)} = {brief(raw)}{via}{named} is not a "
                                  f"valid {brief(target)}: it must be {describe(target)}",
                                  hint=f"map it with values={{{brief(column)}: "
                                       f"{{{brief(raw)}: ...}}}}")
        typed = typed_values(target, mapped)
        return typed if codes is None else typed[codes]

    def _warn(self, unknown: list[str]) -> None:
        shown = [c if isinstance(c, str) and len(c) <= 100 else brief(c) for c in unknown]
        new = [c for c in shown if c not in self._warned]
        if new:
            self._warned.update(new)
            warnings.warn(f"LLMTrainingModel ignores config key(s) {new}: not in its vocabulary "
                          f"({', '.join(KNOBS)}; facts {', '.join(FACTS)}) and not mapped by "
                          "names=; a GP's kernel still models them", UserWarning, stacklevel=4)

    def _filled(self, given: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        job = self.facts
        x = dict(given)
        for fact in FACTS:
            if fact not in x:
                x[fact] = np.full(n, float(job[fact]))
        if "heads" not in given and "hidden" in given:  # keep the job's head width and ratios
            x["heads"] = x["hidden"] * job["heads"] / job["hidden"]
        if "ffn" not in given and "hidden" in given:
            x["ffn"] = x["hidden"] * job["ffn"] / job["hidden"]
        if "kv_heads" not in given and ("heads" in given or "hidden" in given):
            x["kv_heads"] = x["heads"] * job["kv_heads"] / job["heads"]
        for knob in KNOBS:
            if knob not in x and knob != "dp":
                x[knob] = typed_values(knob, [self.defaults[knob]]).repeat(n)
        if "dp" not in x:
            x["dp"] = x["n_gpus"] / (x["tp"] * x["pp"])
        return x

    def _physics(self, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        arch = Arch(gated_mlp=self.gated_mlp, tied=self.tied_embeddings,
                     flash=self.flash_attention, fp32_grads=self.fp32_grads)
        return step_physics(x, self.gpu, self.constants, self.facts["gpus_per_node"], arch)


#: The names of :meth:`LLMTrainingModel.cost_terms`' values, readable from the bound method
#: (``GPPredictor`` reads ``cost_model.term_names``).
LLMTrainingModel.cost_terms.term_names = TERMS  # type: ignore[attr-defined]
#: Every term is in seconds (per step, or per token and GPU), so the GP's cost mean starts
#: from the model's own weighting (equal weight per second), draws each term's weight towards
#: the others' (``GPPredictor``'s ``UNIT_PRIOR_SD``) and prices a term no trial has shown yet
#: (offloading, say) as the model does, instead of leaving it out of the mean. Measured: the
#: Kendall tau of the GP after 10 random layouts, ``docs/results.md``.
LLMTrainingModel.cost_terms.term_units = ("s",) * len(TERMS)  # type: ignore[attr-defined]
