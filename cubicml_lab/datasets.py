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
from them, like ``dp`` or ``grad_accum``, stay as reference columns), see ``PUBLIC`` in
``cubicml_lab/_dataset_catalog.py``, which describes every dataset. The sweeps' knobs are the
config keys that vary across rows. This module imports no torch and loads pandas only inside
:func:`load`.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._dataset_catalog import PUBLIC, SWEEPS, PublicTable, SweepTable
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


def names() -> list[str]:
    """Every dataset name :func:`load` knows: the public tables, then the CPU sweeps.

    Example:
        >>> names()[:2]
        ['bigscience_tr11', 'lucie7b_seq2k']
    """
    return [*PUBLIC, *SWEEPS]


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
    if not isinstance(name, str) or name not in PUBLIC and name not in SWEEPS:
        raise DataError(f"unknown dataset {brief(name)}; known datasets: {', '.join(names())}",
                        hint="see cubicml_lab.datasets.names()")
    root = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    if name in PUBLIC:
        return _load_public(name, PUBLIC[name], root / "public")
    return _load_sweep(name, SWEEPS[name], root / f"{name}.parquet")


def _load_public(name: str, spec: PublicTable, folder: Path) -> Dataset:
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
def _load_sweep(name: str, sweep: SweepTable, path: Path) -> Dataset:
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
