"""How many trials does each searcher need? Searches replayed offline on measured tables.

Every shipped dataset (``cubicml_lab.datasets``: the CPU sweeps and the public cluster tables)
and one large space, the analytical model of LLM training at cluster scale
(:func:`cubicml_lab.analytical.llm_cluster_model`, **a model, not measurements**), is turned
into an oracle with :class:`cubicml_lab.TableObjective` (each configuration's first measurement).
A searcher may propose only the table's configurations (``candidates=obj.configs()``); an
out-of-memory or failed row costs a trial and is told as such. For each table, searcher and seed
it records the best true value after every trial, and prints over seeds:

* trials to reach within 5 % and within 1 % of the table's best (median and [25th, 75th]
  percentiles; ``>B`` where a seed did not get there within the budget ``B``, counted as B + 1)
  and how many seeds got there;
* regret (how much slower than the best, %) of the best found after 10, 25 and 50 trials;
* the targets of issue 5: BayesianSearch's median regret at 25 and 50 below RandomSearch's and
  TPE's, and where random search reaches 1 %, BayesianSearch in at most half its median trials.

Searchers: ``bo`` (:class:`cubicml_lab.BayesianSearch`, defaults), ``bo-cost`` (the same with
the dataset's analytical cost model as the GP's prior mean, ``cost_model=ds.cost_model``, and
its derived kernel inputs, ``features=ds.features``; only on tables with a cost model: all but
BLOOM's), ``random``
(:class:`cubicml_lab.RandomSearch`), ``guided`` (:class:`cubicml_lab.PredictorGuidedSearch`, the
CubicML paper's MLP-guided search) and ``tpe`` (Optuna's ``TPESampler``, a benchmark-only
dependency). TPE proposes any combination of knob values; one that is not an untried table row
is snapped to the nearest untried row (normalised encoding), which is what its trial then
measures; out-of-memory rows are told to Optuna as failed trials, as a user would.

The loop and the figures are the library's: :func:`cubicml_lab.search.compare_searchers` (its
``workers`` processes run the replays of one table side by side) and
:func:`cubicml_lab.search.summarize_searches`; this script adds TPE and prints them.

Run (2 worker processes, one thread each):
    .venv/bin/python benchmarks/search_efficiency.py                           # all, 10 seeds
    .venv/bin/python benchmarks/search_efficiency.py --tables lucie7b_seq2k --seeds 3
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import numpy as np

LLM_MODEL = "llm_cluster_model"
SEARCHERS = ("bo", "bo-cost", "random", "guided", "tpe")
CHECKPOINTS = (10, 25, 50)
KINDS = {"bo": "BayesianSearch", "random": "RandomSearch", "guided": "PredictorGuidedSearch"}


@functools.lru_cache(maxsize=None)
def dataset(name: str):
    from cubicml_lab import analytical, datasets

    return analytical.llm_cluster_model() if name == LLM_MODEL else datasets.load(name)


@functools.lru_cache(maxsize=None)
def oracle(name: str):
    import cubicml_lab as cml

    return cml.TableObjective.from_dataset(dataset(name), reduce="first")


def factories(table: str, kinds: list[str]) -> dict:
    """Label -> ``seed -> searcher`` for the searchers that apply to ``table``."""
    from cubicml_lab.search import searcher_factory

    obj, ds = oracle(table), dataset(table)
    out = {}
    for kind in kinds:
        if kind in KINDS:
            out[kind] = searcher_factory(obj, KINDS[kind])
        elif kind == "bo-cost" and ds.cost_model is not None:
            out[kind] = searcher_factory(obj, "BayesianSearch", cost_model=ds.cost_model,
                                         features=ds.features)
        elif kind == "tpe":
            out[kind] = functools.partial(TPE, obj)
        elif kind != "bo-cost":
            raise SystemExit(f"unknown searcher {kind!r}; known: {', '.join(SEARCHERS)}")
    return out


class TPE:
    """Optuna's TPE behind the ask/tell calls of this script (not a library class)."""

    def __init__(self, obj, seed: int) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.obj = obj
        self.space = obj.space
        self.study = optuna.create_study(direction="maximize",
                                         sampler=optuna.samplers.TPESampler(seed=seed))
        self.dists = {}
        for p in self.space.parameters:
            vals = p.values()
            self.dists[p.name] = (optuna.distributions.CategoricalDistribution(vals)
                                  if p.kind in ("choice", "bool")
                                  else optuna.distributions.IntDistribution(0, len(vals) - 1))
        self.configs = obj.configs()
        lo, hi = self.space.encoded_bounds()
        self._span = np.where(hi > lo, hi - lo, 1.0)
        self._lo = lo
        self.X = self._norm(self.configs)
        self.keys = [self.space.key(c) for c in self.configs]
        self.tried: set[str] = set()
        self._trial = None

    def _norm(self, configs):
        return (self.space.encode_array(configs) - self._lo) / self._span

    def ask(self, n: int = 1) -> list[dict]:  # one at a time: TPE here is sequential
        self._trial = self.study.ask(self.dists)
        params = self._trial.params
        cfg = {p.name: (params[p.name] if p.kind in ("choice", "bool")
                        else p.values()[params[p.name]]) for p in self.space.parameters}
        key = self.space.key(cfg) if self.space.contains(cfg) else None
        if key is None or key not in set(self.keys) or key in self.tried:
            d = ((self.X - self._norm([cfg])) ** 2).sum(1)
            d[[i for i, k in enumerate(self.keys) if k in self.tried]] = np.inf
            cfg = self.configs[int(np.argmin(d))]
        self._asked = cfg
        return [cfg]

    def tell(self, config, values, status="ok") -> None:
        import optuna

        self.tried.add(self.space.key(config))
        params = {p.name: (config[p.name] if p.kind in ("choice", "bool")
                           else p.values().index(config[p.name]))
                  for p in self.space.parameters}
        state = optuna.trial.TrialState
        if params == self._trial.params:
            if status == "ok":
                self.study.tell(self._trial, values[self.obj.objective])
            else:
                self.study.tell(self._trial, state=state.FAIL)
            return
        self.study.tell(self._trial, state=state.FAIL)  # the snapped row is recorded instead
        self.study.add_trial(optuna.trial.create_trial(
            params=params, distributions=self.dists,
            value=values[self.obj.objective] if status == "ok" else None,
            state=state.COMPLETE if status == "ok" else state.FAIL))


def summarise(table: str, runs, budget: int) -> None:
    """Print the figures of one table (module docstring) from its stacked replays."""
    from cubicml_lab.search import summarize_searches

    obj = oracle(table)
    _, best = obj.best()
    summary = summarize_searches(runs, within_pct=(5, 1), after=CHECKPOINTS)
    print(f"\n{table}: {len(obj)} configurations ({obj.n_ok} ok, {obj.n_failed} failed/oom), "
          f"best {obj.objective} {best:.4g}; budget {budget}, {int(summary['seeds'].max())} "
          "seeds")
    print(f"  {'searcher':<8} {'to 5% (med [q1,q3]) got':>26} {'to 1% (med [q1,q3]) got':>26} "
          + " ".join(f"{'regret@' + str(c):>14}" for c in CHECKPOINTS) + f" {'s/run':>6}")
    for kind, row in summary.iterrows():
        cells = []
        for p in (5, 1):
            med, got = row[f"to_{p}pct"], int(row[f"to_{p}pct_reached"])
            mark = ">" if med > row["trials"] else ""
            cells.append(f"{mark}{med:>4.0f} [{row[f'to_{p}pct_q25']:>3.0f},"
                         f"{row[f'to_{p}pct_q75']:>3.0f}] {got:>2}/{int(row['seeds'])}")
        regs = [f"{row[f'regret_pct_at_{c}']:>5.1f}% [{row[f'regret_pct_at_{c}_q75']:>4.1f}]"
                if f"regret_pct_at_{c}" in row else f"{'-':>14}" for c in CHECKPOINTS]
        print(f"  {kind:<8} {cells[0]:>26} {cells[1]:>26} " + " ".join(f"{s:>14}" for s in regs)
              + f" {row['search_s']:>6.1f}")
    targets(summary)


def targets(summary) -> None:
    """The search targets: BO's median regret at 25 and 50 below random's and TPE's, and BO
    within 1 % in at most half random search's median trials."""
    for name in ("bo", "bo-cost"):
        if name not in summary.index:
            continue
        for c in (25, 50):
            col = f"regret_pct_at_{c}"
            if col not in summary.columns:
                continue
            others = {k: summary.loc[k, col] for k in ("random", "tpe") if k in summary.index}
            bo = summary.loc[name, col]
            verdict = ("met" if all(bo < v for v in others.values())
                       else "met or tied at 0 (all found the best)"
                       if all(bo < v or bo == v == 0 for v in others.values()) else "MISSED")
            print(f"  target regret@{c}: {name} {bo:.2f}% vs "
                  + ", ".join(f"{k} {v:.2f}%" for k, v in others.items()) + f" -> {verdict}")
        if "random" in summary.index and summary.loc["random", "to_1pct_reached"] > 0:
            r_med, b_med = summary.loc["random", "to_1pct"], summary.loc[name, "to_1pct"]
            print(f"  target to-1%: {name} median {b_med:.0f} vs random {r_med:.0f} (half: "
                  f"{r_med / 2:.1f}) -> {'met' if b_med <= r_med / 2 else 'MISSED'}")


def main() -> None:
    from cubicml_lab import datasets
    from cubicml_lab.search import compare_searchers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="*", default=None,
                        help=f"datasets to replay on (default: all, and {LLM_MODEL})")
    parser.add_argument("--searchers", nargs="*", default=list(SEARCHERS),
                        help=f"among {', '.join(SEARCHERS)} (default: all)")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per searcher (default 10)")
    parser.add_argument("--budget", type=int, default=50, help="trials per search (default 50)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes (default: up to 2)")
    args = parser.parse_args()
    tables = args.tables or [*datasets.names(), LLM_MODEL]
    usable = []
    for t in tables:
        try:
            oracle(t)
            usable.append(t)
        except Exception as err:  # noqa: BLE001 - a missing dataset file: say so, go on
            print(f"{t}: skipped ({type(err).__name__}: {str(err).splitlines()[0]})")
    plan = {t: factories(t, args.searchers) for t in usable}
    n = sum(len(f) for f in plan.values()) * args.seeds
    print(f"{n} searches ({len(usable)} tables x {len(args.searchers)} searchers x "
          f"{args.seeds} seeds), budget {args.budget}, {args.jobs} processes")
    t0 = time.perf_counter()
    results = {t: compare_searchers(oracle(t), plan[t], args.budget, args.seeds,
                                    workers=args.jobs, progress=sys.stderr.isatty())
               for t in usable}
    for t in usable:
        summarise(t, results[t], args.budget)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
