"""Does a physics prior find the fastest cluster layout in 25 trials? And does history help?

Searches are replayed offline (:class:`cubicml_lab.TableObjective`, the loop of
:func:`cubicml_lab.search.compare_searchers`; an out-of-memory row costs a trial, as on hardware)
on two kinds of tables:

* **perturbed analytical tables**: :func:`cubicml_lab.analytical.llm_cluster_model` generated with
  ``constants=PhysicsConstants().perturbed(k)`` (other GEMM efficiency curve, overlaps,
  latencies, memory reserve and fragmentation, per-step overhead), while the prior is a default
  :class:`~cubicml_lab.analytical.LLMTrainingModel` of the same job: it is wrong in its details,
  as it will be on a real cluster. **A model, not measurements.**
* **real public tables** (``cubicml_lab.datasets``): BLOOM-176B, Lucie-7B (seq 2k, 4k) and MPT,
  with the ``LLMTrainingModel`` of each job as the prior
  (:func:`cubicml_lab.analytical.table_physics`; MPT: the dataset's own cost model, its rows mix
  GPUs and model shapes).

A replay stops once it has found the table's best and run 25 trials (transfer: once within
1 % of the best): nothing printed could change after that, and ``s/run`` is then the time of
the shortened replay.

Searchers (:class:`cubicml_lab.BayesianSearch`): ``bo`` (no prior), ``prior``
(``cost_model=physics.cost_terms``), ``prior+mem`` (and ``memory_model=physics.memory_gib``,
``memory_limit_gib`` the GPU's). Printed per table, over seeds: median regret (%) after 10, 25
and 50 trials, trials to within 1 % of the best (median; ``>B`` when most seeds did not get
there in the budget ``B``), out-of-memory trials launched in the first 25 (median and mean), and
the Kendall tau of the GP's ranking of the held-out ok rows after 10, 20 and 50 random ok rows
with and without the prior. Then transfer: trials to within 1 % on a target table with no
history, with related history and with unrelated history (the same trials, their speeds
shuffled), for a search with the memory model only (``mem``: the history is its only guide to
speed) and with the physics prior too (``prior+mem``), in two studies: ``13b->70b`` (70B on 256
GPUs; history: 60 trials of a 13B job on 64 GPUs of the same cluster) and ``lucie seq2k->seq4k``
(the measured Lucie-7B seq-4k table; history: the measured seq-2k runs). Last, the targets,
met or missed.

The default perturbed tables are 13B on 64, 70B on 256 and 175B (GPT-3's shape and two others
of its size) on 1,024 H100s, where about four in five layouts run out of memory.

Run (2 worker processes, one torch thread each):
    .venv/bin/python benchmarks/prior_transfer.py            # 10 seeds, budget 50: ~50 min
    .venv/bin/python benchmarks/prior_transfer.py --quick    # 3 seeds, fewer tables: ~5 min
    .venv/bin/python benchmarks/prior_transfer.py --tables 175b-1024xH100 --no-transfer  # ~7 min
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
import warnings

import numpy as np

from cubicml_lab.analytical import TERMS

CHECKPOINTS = (10, 25, 50)
TAU_SIZES = (10, 20, 50)
#: name -> (model, n_gpus, gpu, perturbation seed of the table's constants)
PERTURBED = {"13b-64xH100": ("13b", 64, "H100-80GB", 1),
             "70b-256xH100": ("70b", 256, "H100-80GB", 2),
             "175b-1024xH100": ("175b", 1024, "H100-80GB", 4),
             "30b-128xA100": ("30b", 128, "A100-80GB", 3)}
#: the perturbed tables run by default (the others with --tables)
DEFAULT_PERTURBED = ("13b-64xH100", "70b-256xH100", "175b-1024xH100")
REAL = ("bigscience_tr11", "lucie7b_seq2k", "lucie7b_seq4k", "mpt_llmfoundry")
#: transfer studies: name -> target table (its history: :func:`history_frames`)
TRANSFERS = {"13b->70b": "70b-256xH100", "lucie seq2k->seq4k": "lucie7b_seq4k"}
#: the 13B job whose trials are the 70B target's history: (model, n_gpus); the 70B table's
#: GPU and perturbed constants (one cluster)
SOURCE_13B = ("13b", 64)
HISTORY_ROWS = 60


# ------------------------------------------------------------------ priors of each kind of table
class ClusterPrior:
    """The default-constants physics of an ``llm_cluster_model`` table's job: the ``hidden``
    knob carries its own layer count (the table's shapes)."""

    def __init__(self, model: str, n_gpus: int, gpu: str) -> None:
        from cubicml_lab import analytical as A

        shapes = A.MODELS[model]
        self.layers_of = {s.hidden: s.n_layers for s in shapes}
        self.gpu = A.GPUS[gpu]
        self.physics = A.LLMTrainingModel(
            layers=shapes[0].n_layers, hidden=shapes[0].hidden, heads=shapes[0].n_heads,
            seq_len=2048, vocab=A.VOCAB_SIZE, global_batch=1024, n_gpus=n_gpus, gpu=gpu)

    def frame(self, df):
        return df.assign(layers=df["hidden"].map(self.layers_of))

    def cost_terms(self, config):
        return self.cost_terms_frame(_one(config)).iloc[0].tolist()

    def cost_terms_frame(self, df):
        return self.physics.cost_terms_frame(self.frame(df))

    def memory_gib(self, config):
        return float(self.memory_gib_frame(_one(config)).iloc[0])

    def memory_gib_frame(self, df):
        return self.physics.memory_gib_frame(self.frame(df))


# the prior's terms carry the model's names and units, as LLMTrainingModel.cost_terms does
ClusterPrior.cost_terms.term_names = TERMS
ClusterPrior.cost_terms.term_units = ("s",) * len(TERMS)


class StopWhenSolved:
    """A searcher that stops its replay (as if the table ran out) once it has found a value
    within ``within`` of the table's best and run ``min_trials`` trials: the regret cannot fall
    further, so no printed figure changes, and replays of good searchers end sooner."""

    def __init__(self, searcher, best: float, within: float, min_trials: int) -> None:
        self.inner, self.best, self.within, self.min_trials = searcher, best, within, min_trials
        self.direction = searcher.direction
        self.found = False

    def ask(self, n: int = 1):
        from cubicml_lab.errors import SearchError

        if self.found and self.inner.n_told >= self.min_trials:
            raise SearchError("solved", hint="")
        return self.inner.ask(n)

    def tell(self, config, values, status="ok"):
        self.inner.tell(config, values, status=status)
        if status == "ok" and values[self.inner.objective] >= self.best * (1 - self.within):
            self.found = True


def stopping(factory, best: float, within: float, min_trials: int):
    return functools.partial(_stopping, factory, best, within, min_trials)


def _stopping(factory, best, within, min_trials, seed):
    return StopWhenSolved(factory(seed), best, within, min_trials)


def _one(config):
    import pandas as pd

    return pd.DataFrame([dict(config)])


# ------------------------------------------------------------------------------ the tables
@functools.lru_cache(maxsize=None)
def table(name: str):
    """``(dataset, prior or None, memory prior or None, memory limit GiB)``."""
    from cubicml_lab import analytical, datasets

    if name in PERTURBED:
        model, n_gpus, gpu, k = PERTURBED[name]
        ds = analytical.llm_cluster_model(n_gpus, model, gpu, constants=analytical.
                                          PhysicsConstants().perturbed(k))
        prior = ClusterPrior(model, n_gpus, gpu)
        return ds, prior.cost_terms, prior.memory_gib, prior.gpu.memory_gib
    ds = datasets.load(name)
    if name == "mpt_llmfoundry":  # mixes GPUs and model shapes per row: no job physics
        return ds, ds.cost_model, None, None
    physics = analytical.table_physics(ds)
    return ds, physics.cost_terms, physics.memory_gib, physics.memory_limit_gib


@functools.lru_cache(maxsize=None)
def oracle(name: str):
    import cubicml_lab as cml

    return cml.TableObjective.from_dataset(table(name)[0], reduce="first")


def factories(name: str) -> dict:
    from cubicml_lab.search import searcher_factory

    _, cost, mem, limit = table(name)
    obj = oracle(name)
    out = {"bo": searcher_factory(obj, "BayesianSearch")}
    if cost is not None:
        out["prior"] = searcher_factory(obj, "BayesianSearch", cost_model=cost)
    if cost is not None and mem is not None:  # BLOOM logs its peak memory as mem_gb_max
        metric = "mem_gb_max" if "mem_gb_max" in obj.metrics else "peak_mem_gib"
        out["prior+mem"] = searcher_factory(obj, "BayesianSearch", cost_model=cost,
                                            memory_model=mem, memory_limit_gib=limit,
                                            memory_metric=metric)
    return out


# ---------------------------------------------------------------------------------- figures
def search_figures(name: str, budget: int, seeds: int, jobs: int) -> dict:
    """Replays of every searcher; prints one line each and returns the figures by label."""
    from cubicml_lab.search import compare_searchers, summarize_searches

    obj = oracle(name)
    facs = {k: stopping(f, obj.best()[1], 0.0, 25) for k, f in factories(name).items()}
    runs = compare_searchers(obj, facs, budget, seeds, workers=jobs, progress=False)
    after = [c for c in CHECKPOINTS if c <= budget]
    summ = summarize_searches(runs, within_pct=(1,), after=())
    # a replay that stopped (solved, or the table ran out) keeps its last regret
    last = runs.sort_values("trial").groupby(["searcher", "seed"])["regret_pct"]
    regret = {c: last.apply(lambda r, c=c: r.iloc[min(c, len(r)) - 1]).groupby("searcher")
              .median() for c in after}
    first = runs[runs["trial"] <= 25]
    ooms = first.assign(oom=first["status"] == "oom").groupby(["searcher", "seed"])["oom"].sum()
    print(f"\n{name}: {len(obj)} configurations ({obj.n_failed} oom/failed), best "
          f"{obj.best()[1]:.4g} {obj.objective}; budget {budget}, {seeds} seeds")
    print(f"  {'searcher':<10} " + " ".join(f"{'regret@' + str(c):>10}" for c in after)
          + f" {'to 1%':>8} {'reached':>8} {'oom@25 med/mean':>16} {'s/run':>6}")
    out = {}
    for label, row in summ.iterrows():
        o = ooms.loc[label]
        med = row["to_1pct"]
        to1 = f"{'>' if med > budget else ''}{med:.0f}"
        regs = [float(regret[c][label]) for c in after]
        print(f"  {label:<10} " + " ".join(f"{r:>9.2f}%" for r in regs)
              + f" {to1:>8} {int(row['to_1pct_reached']):>5}/{int(row['seeds'])}"
              f" {o.median():>8.1f} / {o.mean():<5.1f} {row['search_s']:>6.1f}")
        out[label] = {"regret": dict(zip(after, regs)), "to1": float(med),
                      "oom25": float(o.median()), "oom25_mean": float(o.mean())}
    return out


def tau_figures(name: str, seeds: int, test_max: int = 2000) -> dict:
    """Median Kendall tau of the GP's ranking of held-out ok rows, by training size."""
    from scipy.stats import kendalltau

    from cubicml_lab.surrogate import GPPredictor

    ds, cost, _, _ = table(name)
    ok = ds.table[ds.table["status"] == "ok"]
    configs = [{k: v for k, v in zip(ds.knobs, row)} for row in
               ok[ds.knobs].itertuples(index=False, name=None)]
    configs = [ds.space.project(c) for c in configs]
    y = ok[ds.objective].to_numpy()
    out = {}
    for n in TAU_SIZES:
        if n > len(y) - 10:
            continue
        for label, cm in (("bo", None), ("prior", cost)):
            if label == "prior" and cm is None:
                continue
            taus = []
            for s in range(seeds):
                rng = np.random.default_rng([s, n])
                idx = rng.permutation(len(y))
                tr, te = idx[:n], idx[n:n + test_max]
                try:
                    pred = GPPredictor(ds.space, seed=s, cost_model=cm).fit(
                        [configs[i] for i in tr], y[tr])
                    mean, _ = pred.predict([configs[i] for i in te])
                    taus.append(kendalltau(mean, y[te]).statistic)
                except Exception as err:  # noqa: BLE001 - a failed fit is a figure too
                    print(f"  tau {name} n={n} {label} seed {s}: {type(err).__name__}")
            out[(label, n)] = float(np.nanmedian(taus)) if taus else math.nan
    line = "  Kendall tau (median)  " + "  ".join(
        f"n={n}: {out.get(('bo', n), math.nan):.3f} -> {out.get(('prior', n), math.nan):.3f}"
        for n in TAU_SIZES if ("bo", n) in out)
    print(line + "   (without -> with the prior)")
    return out


def history_frames(transfer: str, seed: int = 0):
    """``(related, unrelated, description)`` history of a transfer study's target.

    * ``13b->70b``: 60 random trials of a 13B job on 64 GPUs of the 70B target's cluster (its GPU
      and perturbed constants).
    * ``lucie seq2k->seq4k``: the measured Lucie-7B seq-2k runs at the target's ZeRO stage (0)
      whose micro-batch is known, in the seq-4k table's columns (the seq-2k runs used the 32k
      vocabulary and no activation recompute, SOURCES.md).

    Unrelated history is the same trials with their speeds shuffled among the ok ones.
    """
    from cubicml_lab import analytical, datasets

    if transfer == "13b->70b":
        _, _, gpu, k = PERTURBED[TRANSFERS[transfer]]
        model, n_gpus = SOURCE_13B
        src = analytical.llm_cluster_model(n_gpus, model, gpu, seed=7, constants=analytical.
                                           PhysicsConstants().perturbed(k))
        rows = src.table.sample(HISTORY_ROWS, random_state=seed)[
            [*src.knobs, src.objective, "status"]]
        text = (f"{HISTORY_ROWS} random trials of {model} on {n_gpus} GPUs of the same cluster")
    elif transfer == "lucie seq2k->seq4k":
        src = datasets.load("lucie7b_seq2k").table
        src = src[(src["zero_stage"] == 0) & src["micro_batch"].notna()]
        knobs = datasets.load("lucie7b_seq4k").knobs
        rows = src.assign(micro_batch=src["micro_batch"].astype(int), vocab_size=32000,
                          activation_recompute=0)[[*knobs, "tokens_per_s_per_gpu", "status"]]
        text = f"the {len(rows)} measured seq-2k runs with ZeRO-0 and a known micro-batch"
    else:
        raise SystemExit(f"unknown transfer {transfer!r}; known: {', '.join(TRANSFERS)}")
    objective = rows.columns[-2]
    shuffled = rows.copy()
    ok = shuffled["status"] == "ok"
    rng = np.random.default_rng(seed)
    shuffled.loc[ok, objective] = rng.permutation(shuffled.loc[ok, objective].to_numpy())
    return rows.reset_index(drop=True), shuffled.reset_index(drop=True), text


def transfer_figures(transfer: str, budget: int, seeds: int, jobs: int) -> dict:
    """Mean trials to within 1 % of the target's best with no, related and unrelated history,
    without (``mem``) and with (``prior+mem``) the physics prior."""
    from cubicml_lab.search import compare_searchers, searcher_factory, summarize_searches

    name = TRANSFERS[transfer]
    _, cost, mem, limit = table(name)
    obj = oracle(name)
    budget = min(budget, len(obj))
    related, unrelated, text = history_frames(transfer)
    facs = {}
    memory = {"memory_model": mem, "memory_limit_gib": limit}
    for label, opts in (("mem", memory), ("prior+mem", {"cost_model": cost, **memory})):
        facs[label] = searcher_factory(obj, "BayesianSearch", **opts)
        facs[f"{label}+history"] = searcher_factory(obj, "BayesianSearch", history=[related],
                                                    **opts)
        facs[f"{label}+unrelated"] = searcher_factory(obj, "BayesianSearch",
                                                      history=[unrelated], **opts)
    facs = {k: stopping(f, obj.best()[1], 0.01, 0) for k, f in facs.items()}
    runs = compare_searchers(obj, facs, budget, seeds, workers=jobs, progress=False)
    summ = summarize_searches(runs, within_pct=(1,), after=[c for c in (10, 25) if c <= budget])
    print(f"\ntransfer {transfer}: target {name} ({len(obj)} configurations); history = {text};"
          f" unrelated = the same trials, speeds shuffled; budget {budget}, {seeds} seeds")
    out = {}
    for label, row in summ.iterrows():
        med = row["to_1pct"]
        # mean trials to 1% (a seed that never got there counts as budget + 1)
        per_seed = runs[runs["searcher"] == label].groupby("seed").apply(
            lambda g: int(g.loc[g["regret_pct"] <= 1.0, "trial"].min())
            if (g["regret_pct"] <= 1.0).any() else budget + 1, include_groups=False)
        print(f"  {label:<20} to 1%: median {'>' if med > budget else ''}{med:.0f}, "
              f"mean {per_seed.mean():.1f}, reached {int(row['to_1pct_reached'])}/"
              f"{int(row['seeds'])}")
        out[label] = float(per_seed.mean())
    return out


# ---------------------------------------------------------------------------------- targets
def targets(search: dict, taus: dict, transfer: dict) -> None:
    print("\ntargets")

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    for name in search:
        fig = search[name]
        if any(25 not in f["regret"] for f in fig.values()):
            continue
        for label in ("prior", "prior+mem"):
            if label not in fig:
                continue
            r = fig[label]["regret"][25]
            if name in PERTURBED:
                print(f"  {name}: {label} median regret@25 {r:.2f}% <= 1%: {verdict(r <= 1.0)}")
            else:
                b = fig["bo"]["regret"][25]
                print(f"  {name}: {label} median regret@25 {r:.2f}% <= without ({b:.2f}%): "
                      f"{verdict(r <= b)}")
        if "prior+mem" in fig and "prior" in fig:
            a, b = fig["prior+mem"]["oom25_mean"], fig["prior"]["oom25_mean"]
            c = fig["bo"]["oom25_mean"]
            print(f"  {name}: oom trials in the first 25 (mean) with the memory model {a:.1f} vs "
                  f"{b:.1f} prior only, {c:.1f} no prior; at most half: "
                  f"{verdict(a <= 0.5 * b and a <= 0.5 * c) if b or c else 'n/a (no ooms)'}")
    for name in taus:
        t = taus[name].get(("prior", 50))
        if name in PERTURBED and t is not None:
            print(f"  {name}: Kendall tau at 50 with the prior {t:.3f} >= 0.9: {verdict(t >= 0.9)}")
    for study, fig in transfer.items():
        for base in ("mem", "prior+mem"):
            b, h, u = (fig[base], fig[f"{base}+history"], fig[f"{base}+unrelated"])
            cut = verdict(h <= 0.7 * b) if b > 1 else "n/a (already found in 1 trial)"
            print(f"  transfer {study} ({base}): mean trials to 1% {b:.1f} -> {h:.1f} with "
                  f"history ({100 * (1 - h / b):.0f}% fewer; target >= 30%: {cut}), "
                  f"{u:.1f} with unrelated history ({100 * (u / b - 1):+.1f}%; target <= +5%: "
                  f"{verdict(u <= 1.05 * b)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds per table (default 10)")
    parser.add_argument("--budget", type=int, default=50, help="trials per search (default 50)")
    parser.add_argument("--quick", action="store_true",
                        help="3 seeds, budget 30, tables 13b-64xH100 and lucie7b_seq2k")
    parser.add_argument("--tables", nargs="*", default=None,
                        help=f"tables (default: {', '.join(DEFAULT_PERTURBED)} and the real "
                             f"ones; also "
                             f"{', '.join(n for n in PERTURBED if n not in DEFAULT_PERTURBED)})")
    parser.add_argument("--transfers", nargs="*", default=list(TRANSFERS),
                        help=f"transfer studies (default: all of {', '.join(TRANSFERS)})")
    parser.add_argument("--no-transfer", action="store_true", help="skip the transfer studies")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    seeds, budget = (3, 30) if args.quick else (args.seeds, args.budget)
    names = args.tables or (["13b-64xH100", "lucie7b_seq2k"] if args.quick
                            else [*DEFAULT_PERTURBED, *REAL])
    t0 = time.perf_counter()
    print(f"{len(names)} tables x up to 3 searchers x {seeds} seeds, budget {budget}, "
          f"{args.jobs} processes")
    search, taus = {}, {}
    for name in names:
        search[name] = search_figures(name, budget, seeds, args.jobs)
        taus[name] = tau_figures(name, seeds)
        sys.stdout.flush()
    transfer = {} if args.no_transfer else {
        study: transfer_figures(study, min(budget, 30), seeds, args.jobs)
        for study in args.transfers}
    targets(search, taus, transfer)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
