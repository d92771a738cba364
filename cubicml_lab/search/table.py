"""Replay a search offline: any table of measured configurations as the objective to search.

:class:`TableObjective` turns a table with one row per measured configuration (a
:class:`~cubicml_lab.datasets.Dataset`, a ``TrialStore`` export, the analytical model of
:mod:`cubicml_lab.analytical`) into an oracle: ``obj(config)`` returns what the table says
happened to ``config``, as a :class:`TableResult` whose ``status`` and ``values`` go straight into
:meth:`Searcher.tell <cubicml_lab.search.base.Searcher.tell>`. A searcher can then be run,
compared and repeated in seconds, without hardware. Because only the table's configurations have
an answer, the searcher's pool must be the table's: ``candidates=obj.configs()``.

Configurations are matched by the space's canonical :meth:`~cubicml_lab.space.Space.key`, so the
order of the keys and ``4`` vs ``4.0`` do not matter. A configuration measured several times is
answered according to ``reduce``:

* ``"first"``: the first row, always;
* ``"median"``: the most frequent status (ties: the one seen first); if that is ``"ok"``, every
  metric is the median over the configuration's ok rows;
* ``"random"``: one of its rows, drawn uniformly by a generator seeded from ``(seed, config,
  number of earlier calls for that config)``: asking again gives the noise of a real
  re-measurement, and a replay is reproducible whatever order the configurations are asked in.

The "true" value of a configuration, for :meth:`TableObjective.best`,
:meth:`~TableObjective.regret`, :attr:`~TableObjective.n_ok` and
:attr:`~TableObjective.n_failed`, is what ``"first"`` gives under ``reduce="first"`` and what
``"median"`` gives otherwise. Nothing is evaluated as code and nothing is pickled.

Example:
    >>> import cubicml_lab as cml
    >>> obj = cml.TableObjective.from_dataset(cml.datasets.load("lucie7b_seq2k"))
    >>> search = cml.RandomSearch(obj.space, objective=obj.objective, candidates=obj.configs())
    >>> for _ in range(5):
    ...     [config] = search.ask()
    ...     result = obj(config)
    ...     search.tell(config, result.values, status=result.status)
    >>> 0.0 <= obj.regret(search.best()[1]) < 1.0
    True
"""

from __future__ import annotations

import math
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._bounds import check_count
from .._params import brief
from ..errors import SearchError, SpaceError
from ..space import Space
from ..surrogate.metrics import relative_regret
from .base import DIRECTIONS, check_seed
from .cost import COST_METRIC
from ._table_columns import knob_names as _knob_names
from ._table_columns import metric_names as _metric_names
from ._table_columns import nanmedian as _nanmedian
from ._table_columns import observed_space as _observed_space
from ._table_columns import shown as _shown
from ._table_columns import statuses as _statuses

if TYPE_CHECKING:
    import pandas as pd

    from ..datasets import Dataset

__all__ = ["MAX_TABLE_ROWS", "REDUCE_MODES", "TableObjective", "TableResult"]

#: How a configuration measured several times is answered (module docstring).
REDUCE_MODES = ("first", "median", "random")
#: Most rows a replayed table may hold (a measured sweep holds thousands).
MAX_TABLE_ROWS = 10_000_000
_REPLAY_HINT = "replay over the table's configurations only: pass candidates=obj.configs() to " \
               "the searcher"


@dataclass(frozen=True, kw_only=True)
class TableResult:
    """What a table says about one configuration.

    Attributes:
        status: "ok", "oom", "failed" or "timeout".
        values: The row's numeric metrics (``metric -> float``, the objective included; NaN cells
            left out) when ``status`` is "ok", else None. Pass it to ``Searcher.tell`` as is.
        config: The configuration, as the space normalises it.
    """

    status: str
    values: dict[str, float] | None
    config: dict[str, Any]


class TableObjective:
    """A table of measured configurations as an oracle, to replay searches offline.

    Args:
        df: One row per measurement (pandas DataFrame): knob columns, the objective, a status.
        objective: Numeric column the search optimises, e.g. "throughput".
        status_col: Column holding "ok"/"oom"/"failed"/"timeout". None: a row is "ok" where the
            objective is a finite number, else "failed".
        knobs: The configuration columns. Default: ``space.names`` when ``space`` is given, else
            every column except ``objective`` and ``status_col`` whose dtype is integer, boolean
            or text (float columns are taken for metrics). Pass it explicitly for tables with
            integer metrics or text columns that are not choices (ids, dates).
        space: The space the configurations belong to (rows must be in it). Default: built from
            the values observed: :class:`~cubicml_lab.space.Ordinal` for numbers (sorted),
            :class:`~cubicml_lab.space.Bool` for booleans, :class:`~cubicml_lab.space.Choice`
            for the rest, no constraints.
        reduce: "first", "median" or "random": the answer for a configuration measured several
            times (module docstring).
        seed: Seed of ``reduce="random"``.
        metrics: Columns returned in ``values``. Default: every numeric (not boolean) column that
            is not a knob.

    Raises:
        SearchError: If the table is empty, lacks the objective, status or knob columns, has an
            unknown status, a blank knob cell, an ok row without a finite objective, or a row
            outside ``space``; or on a bad ``reduce``.

    Example:
        >>> import pandas as pd
        >>> df = pd.DataFrame({"tp": [1, 2, 2], "throughput": [10.0, None, 30.0],
        ...                    "status": ["ok", "oom", "ok"]})
        >>> obj = TableObjective(df, reduce="first")
        >>> obj({"tp": 2.0})
        TableResult(status='oom', values=None, config={'tp': 2})
        >>> obj.best(), obj.n_ok, obj.n_failed
        (({'tp': 1}, 10.0), 1, 1)
    """

    def __init__(self, df: pd.DataFrame, objective: str = "throughput",
                 status_col: str | None = "status", knobs: Sequence[str] | None = None,
                 space: Space | None = None, reduce: str = "first", *, seed: int = 0,
                 metrics: Sequence[str] | None = None) -> None:
        import pandas as pd

        if not isinstance(df, pd.DataFrame):
            raise SearchError(f"df must be a pandas DataFrame, got {type(df).__name__}",
                              hint="e.g. pd.read_csv(path), store.to_dataframe(campaign) or "
                                   "TableObjective.from_dataset(cml.datasets.load(name))")
        seed = check_seed(seed)
        if not isinstance(reduce, str) or reduce not in REDUCE_MODES:
            raise SearchError(f"reduce = {brief(reduce)} is not one of {list(REDUCE_MODES)}",
                              hint="'first' (default), 'median', or 'random' for replayed noise")
        if space is not None and not isinstance(space, Space):
            raise SearchError(f"space must be a cubicml_lab.Space, got {type(space).__name__}",
                              hint="pass None to build it from the table")
        if len(df) == 0:
            raise SearchError("the table is empty: no configuration to replay",
                              hint="pass a table with at least one measured row")
        check_count("len(df)", len(df), high=MAX_TABLE_ROWS, error=SearchError,
                    why="MAX_TABLE_ROWS: a replayed table holds measured trials")
        if not isinstance(objective, str):
            raise SearchError(f"objective = {brief(objective)} must be a column name",
                              hint="e.g. objective='throughput'")
        columns = [str(c) for c in df.columns]
        if objective not in df.columns:
            raise SearchError(f"the table has no objective column {objective!r}; its columns: "
                              f"{_shown(columns)}", hint="pass objective=<one of the columns>")
        self.objective = objective
        self.reduce = reduce
        self.seed = int(seed)
        self.table = df
        y = pd.to_numeric(df[objective], errors="coerce").to_numpy(np.float64)
        self._status = _statuses(df, status_col, y, columns)
        self.knobs = _knob_names(df, knobs, space, objective, status_col, columns)
        self.space = space if space is not None else _observed_space(df, self.knobs)
        ok_bad = np.flatnonzero((self._status == "ok") & ~np.isfinite(y))
        if len(ok_bad):
            raise SearchError(f"{len(ok_bad)} ok row(s) have no finite {objective!r} (rows "
                              f"{ok_bad[:5].tolist()}{'...' if len(ok_bad) > 5 else ''})",
                              hint=f"mark them 'failed' in {status_col!r}, or drop them")
        metrics = _metric_names(df, metrics, self.knobs, status_col, columns)
        self.metrics = [objective] + [c for c in metrics if c != objective]
        self._values = np.column_stack(
            [pd.to_numeric(df[c], errors="coerce").to_numpy(np.float64) for c in self.metrics])
        self._rows: dict[str, list[int]] = {}
        self._configs: dict[str, dict[str, Any]] = {}
        self._index_rows()
        self._reference: dict[str, TableResult] = {}
        self._calls: Counter[str] = Counter()

    def _index_rows(self) -> None:
        """Group the table's rows by configuration key; a row outside the space is a SearchError."""
        for i, values in enumerate(self.table[self.knobs].itertuples(index=False, name=None)):
            config = dict(zip(self.knobs, values))
            try:
                self.space.validate(config)
                key = self.space.key(config)
            except SpaceError as err:
                raise SearchError(f"row {i} = {config} is not in the space: {err.message}",
                                  hint=err.hint or "pass a space that holds every row") from None
            if key not in self._rows:
                self._rows[key] = []
                self._configs[key] = self.space.project(config)
            self._rows[key].append(i)

    @classmethod
    def from_dataset(cls, dataset: Dataset, reduce: str = "first", *,
                     seed: int = 0) -> TableObjective:
        """The oracle of a :class:`~cubicml_lab.datasets.Dataset`: its table, objective, knobs
        and space.

        Example:
            >>> import cubicml_lab as cml
            >>> obj = TableObjective.from_dataset(cml.datasets.load("bigscience_tr11"))
            >>> obj.objective, obj.n_ok + obj.n_failed == len(obj.configs())
            ('tokens_per_s_per_gpu', True)
        """
        return cls(dataset.table, objective=dataset.objective, status_col="status",
                   knobs=dataset.knobs, space=dataset.space, reduce=reduce, seed=seed)

    # -- answers --------------------------------------------------------------------------------
    def __call__(self, config: Mapping[str, Any]) -> TableResult:
        """What the table says about ``config``.

        Raises:
            SearchError: If ``config`` is not a configuration of the space, or not in the table.
        """
        key = self._lookup(config)
        rows = self._rows[key]
        if self.reduce == "random" and len(rows) > 1:
            n = self._calls[key]
            rng = np.random.default_rng([self.seed, zlib.crc32(key.encode()), n])
            self._calls[key] += 1
            return self._result(key, [rows[int(rng.integers(len(rows)))]])
        self._calls[key] += 1
        return self._true(key)

    def _lookup(self, config: Mapping[str, Any]) -> str:
        try:
            key = self.space.key(config)
        except SpaceError as err:
            raise SearchError(f"config = {brief(config)} is not a configuration of the table's "
                              "space: "
                              f"{err.message}", hint=err.hint or _REPLAY_HINT) from None
        if key not in self._rows:
            raise SearchError(f"config = {brief(config)} was never measured: it is not among the "
                              f"table's {len(self._rows)} configurations", hint=_REPLAY_HINT)
        return key

    def _true(self, key: str) -> TableResult:
        """The reference answer: the first row, or the median of the configuration's rows."""
        if key not in self._reference:
            rows = self._rows[key]
            self._reference[key] = self._result(key, rows[:1] if self.reduce == "first" else rows)
        return self._reference[key]

    def _result(self, key: str, rows: list[int]) -> TableResult:
        statuses = [str(self._status[i]) for i in rows]
        status = Counter(statuses).most_common(1)[0][0]  # ties: the first seen (Counter order)
        values = None
        if status == "ok":
            block = self._values[[i for i, s in zip(rows, statuses) if s == "ok"]]
            with np.errstate(all="ignore"):
                med = block[0] if len(block) == 1 else _nanmedian(block)
            values = {m: float(x) for m, x in zip(self.metrics, med) if math.isfinite(x)}
        return TableResult(status=status, values=values, config=dict(self._configs[key]))

    # -- the table as a whole -------------------------------------------------------------------
    def configs(self) -> list[dict[str, Any]]:
        """Every distinct configuration of the table, any status, in table order: the candidate
        pool of a replayed search (``candidates=obj.configs()``)."""
        return [dict(c) for c in self._configs.values()]

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def n_ok(self) -> int:
        """Distinct configurations whose reference answer (module docstring) is "ok"."""
        return sum(self._true(k).status == "ok" for k in self._rows)

    @property
    def n_failed(self) -> int:
        """Distinct configurations whose reference answer is "oom", "failed" or "timeout"."""
        return len(self._rows) - self.n_ok

    @property
    def n_calls(self) -> int:
        """How many times the oracle was asked (every call, repeats included)."""
        return sum(self._calls.values())

    def best(self, direction: str = "maximize") -> tuple[dict[str, Any], float]:
        """The true best configuration of the table and its objective value (reference answers,
        first in table order on ties).

        Raises:
            SearchError: On a bad direction, or if no configuration is "ok".
        """
        if not isinstance(direction, str) or direction not in DIRECTIONS:
            raise SearchError(f"direction = {brief(direction)} is not one of {list(DIRECTIONS)}",
                              hint="'maximize' for throughput, 'minimize' for step time")
        best_key, best_value = None, math.nan
        for key in self._rows:
            result = self._true(key)
            if result.status != "ok":
                continue
            value = result.values[self.objective]  # type: ignore[index]
            better = value > best_value if direction == "maximize" else value < best_value
            if best_key is None or better:
                best_key, best_value = key, value
        if best_key is None:
            raise SearchError(f"none of the table's {len(self._rows)} configurations is ok",
                              hint="a replay needs at least one measured (ok) configuration")
        return dict(self._configs[best_key]), float(best_value)

    def regret(self, value: float, direction: str = "maximize") -> float:
        """Relative regret of ``value`` against the table's true best: ``(best - value) / |best|``
        when maximising, ``(value - best) / |best|`` when minimising (0: the best was found).

        Raises:
            SearchError: If ``value`` is not a finite number or the best value is 0.

        Example:
            >>> import pandas as pd
            >>> obj = TableObjective(pd.DataFrame({"mb": [1, 2], "throughput": [50.0, 200.0],
            ...                                    "status": ["ok", "ok"]}))
            >>> obj.regret(150.0)
            0.25
        """
        try:
            v = float(value)
        except (TypeError, ValueError, OverflowError):
            v = math.nan
        if not math.isfinite(v):
            raise SearchError(f"regret(value={brief(value)}): value must be a finite number",
                              hint="pass the searcher's best value, e.g. search.best()[1]")
        best = self.best(direction)[1]
        if best == 0:
            raise SearchError(f"the best {self.objective!r} is 0: relative regret is undefined",
                              hint="compare absolute values instead")
        return relative_regret(best, v, direction)

    def replay(self, searcher: Any, budget: int, *, batch: int = 1,
               price: Callable[[dict[str, Any], TableResult], float] | None = None
               ) -> pd.DataFrame:
        """Run ``searcher`` against the table for ``budget`` trials (fewer if the table runs
        out), ``batch`` configurations per ask, and return what happened, one row per trial.

        Each asked configuration is answered by the table and told back to the searcher, so a
        failed or out-of-memory row costs a trial, as on hardware. ``searcher`` needs
        ``candidates=obj.configs()`` (or a space holding only the table's configurations).

        With ``price`` (``(config, result) -> device-seconds`` of that trial, e.g. its GPUs
        times start-up plus its steps) each trial is told with its price as ``device_s``, as a
        campaign tells a measured trial's, so a search that weighs prices
        (:mod:`~cubicml_lab.search.cost`) can; the frame gains ``device_s`` and ``spent_s``
        (device-seconds so far). A price that is not a finite number >= 0 raises SearchError.

        Returns:
            DataFrame with ``trial`` (1-based), ``status``, ``value`` (the objective, NaN unless
            ok), ``best`` (best ok value so far in the searcher's direction, NaN before the
            first), ``regret`` (of ``best`` against the table's true best, a fraction; 1.0
            before any ok trial), ``regret_pct`` (the same in percent), ``elapsed_s`` (seconds
            the searcher's asks and tells took so far; the table answers in microseconds) and
            one column per knob; with ``price``, ``device_s`` and ``spent_s`` too.

        Raises:
            SearchError: If ``budget`` or ``batch`` is not a positive int, ``price`` is not
                callable or returns no price.

        Example:
            >>> import cubicml_lab as cml
            >>> obj = cml.TableObjective.from_dataset(cml.datasets.load("lucie7b_seq2k"))
            >>> s = cml.RandomSearch(obj.space, objective=obj.objective, candidates=obj.configs())
            >>> obj.replay(s, budget=5)["trial"].tolist()
            [1, 2, 3, 4, 5]
        """
        import pandas as pd

        for name, v in (("budget", budget), ("batch", batch)):
            check_count(name, v, high=MAX_TABLE_ROWS, error=SearchError,
                        why="MAX_TABLE_ROWS: at most the table's rows")
        if price is not None and not callable(price):
            raise SearchError(f"price = {brief(price)} is not callable",
                              hint="pass a function (config, result) -> device-seconds")
        direction = getattr(searcher, "direction", "maximize")
        sign = 1.0 if direction == "maximize" else -1.0
        rows: list[dict[str, Any]] = []
        best = math.nan
        elapsed_s = spent_s = 0.0
        while len(rows) < min(budget, len(self._rows)):
            t0 = time.perf_counter()
            try:
                asked = searcher.ask(min(batch, budget - len(rows)))
            except SearchError:  # the pool ran out
                break
            elapsed_s += time.perf_counter() - t0
            for config in asked:
                res = self(config)
                told = res.values
                if price is not None:
                    cost = _price(price, res)
                    spent_s += cost
                    told = {**(res.values or {}), COST_METRIC: cost}
                t0 = time.perf_counter()
                searcher.tell(config, told, status=res.status)
                elapsed_s += time.perf_counter() - t0
                value = res.values[self.objective] if res.status == "ok" else math.nan
                if res.status == "ok" and not (sign * value <= sign * best):
                    best = value
                regret = self.regret(best, direction) if math.isfinite(best) else 1.0
                rows.append({"trial": len(rows) + 1, "status": res.status, "value": value,
                             "best": best, "regret": regret, "regret_pct": 100.0 * regret,
                             "elapsed_s": elapsed_s, **res.config})
                if price is not None:
                    rows[-1].update(device_s=told[COST_METRIC], spent_s=spent_s)
        return pd.DataFrame(rows)

    def reset(self) -> None:
        """Forget how many times each configuration was asked: ``reduce="random"`` draws start
        over and :attr:`n_calls` is 0, so a replay after ``reset()`` answers as on a fresh
        objective."""
        self._calls.clear()

    def __repr__(self) -> str:
        return (f"TableObjective({len(self.table)} rows, {len(self._rows)} configurations, "
                f"objective={self.objective!r}, knobs={self.knobs}, reduce={self.reduce!r})")


def _price(price: Callable[[dict[str, Any], TableResult], float], res: TableResult) -> float:
    """``price(config, result)`` checked: a finite number >= 0 (device-seconds)."""
    cost = price(dict(res.config), res)
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or \
            not 0 <= cost < math.inf:
        raise SearchError(f"price returned {brief(cost)} for {brief(res.config)}",
                          hint="return the trial's device-seconds, a finite number >= 0")
    return float(cost)
