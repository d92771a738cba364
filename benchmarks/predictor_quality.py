"""How well do the predictors rank configurations from few trials? Learning curves on real tables.

For every shipped dataset (the CPU sweeps of ``gpt`` and ``dlrm`` and the public cluster tables,
``cubicml_lab.datasets``), the ``ok`` rows are the table: for n = 10, 20, 50, 100, 200 trials drawn
at random (``--repeats`` draws, the same draws for every predictor) each predictor is fitted on
the n trials and scores the rest; where n reaches the table's size, leave-one-out over the whole
table instead. It prints, per dataset and n, the median over draws of Kendall tau, top-5% recall
(of the true top 5%, the share in the predicted top 5%) and the regret of the predicted best
(how much slower it truly is than the true best), for:

* ``gp``: :class:`~cubicml_lab.surrogate.GPPredictor`, one-hot ARD kernel (the default);
* ``gp-mixed``: the same with ``categorical="mixed"`` (only on tables with categorical knobs);
* ``gp-cost`` (every table with a cost model: all but BLOOM): the GP with the dataset's
  analytical cost model as its prior mean and its derived kernel inputs where it has them
  (``GPPredictor(space, cost_model=ds.cost_model, features=ds.features)``, e.g.
  :func:`cubicml_lab.workloads.gpt.cost_terms` and
  :func:`~cubicml_lab.workloads.gpt.shape_features`);
* ``mlp``: :class:`~cubicml_lab.surrogate.MLPPredictor` (the CubicML paper's kind of model);
* ``gp-noise`` (CPU sweeps): the GP given each trial's measured relative spread
  (``step_time_rel_ci``) as fixed observation noise instead of inferring one noise level;
* ``gbt``: scikit-learn's ``HistGradientBoostingRegressor`` on the same encoding and log target
  (a benchmark-only dependency).

Beside them, the **noise floor**: the Kendall tau between two measurements of the same
configurations (the sweeps' repeat campaigns; repeated rows of a public table), the best rank
agreement any predictor can show against one measurement. The "GP at least as good as MLP and
GBT" target compares medians; where a GP's median is lower, the paired gap over the same draws
says whether it is worse beyond the draws' noise (a 95% t interval of the mean tau gap that
reaches 0 is reported as a tie). Last, the speed target: fit plus
predict on 1,000 trials over 50,000 candidates (2 cores).

Run:
    .venv/bin/python benchmarks/predictor_quality.py                     # everything
    .venv/bin/python benchmarks/predictor_quality.py --datasets lucie7b_seq2k --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import numpy as np

import cubicml_lab as cml
from cubicml_lab import datasets
from cubicml_lab.surrogate import GPPredictor, MLPPredictor, kendall_tau, learning_curve
from cubicml_lab.surrogate.base import BasePredictor


class GBTPredictor(BasePredictor):
    """Gradient-boosted trees on the encoded configuration and the log objective; the interval
    is the point estimate widened by the training residuals' spread (trees give no posterior)."""

    def fit(self, configs, values, noise=None) -> GBTPredictor:
        from sklearn.ensemble import HistGradientBoostingRegressor

        X = self._encode(configs, "configs").numpy()
        y = self._to_model_units(np.asarray(values, dtype=np.float64))
        self.model = HistGradientBoostingRegressor(max_iter=200, learning_rate=0.1,
                                                   min_samples_leaf=min(20, max(2, len(y) // 5)),
                                                   random_state=self.seed).fit(X, y)
        self._new_noise_var = float(np.var(y - self.model.predict(X)))
        self.n_train = len(y)
        return self

    def _posterior(self, configs):
        self._check_fitted()
        mu = self.model.predict(self._encode(configs, "configs").numpy())
        return mu, np.zeros_like(mu)


def factories(ds: datasets.Dataset, with_mixed: bool) -> dict:
    out = {"gp": lambda: GPPredictor(ds.space),
           "mlp": lambda: MLPPredictor(ds.space, epochs=300),
           "gbt": lambda: GBTPredictor(ds.space)}
    if ds.cost_model is not None:
        out["gp-cost"] = lambda: GPPredictor(ds.space, cost_model=ds.cost_model,
                                             features=ds.features)
    if with_mixed and any(p.kind == "choice" for p in ds.space.parameters):
        out["gp-mixed"] = lambda: GPPredictor(ds.space, categorical="mixed")
    return out


def ok_rows(ds: datasets.Dataset, first_only: bool = True):
    """The ok rows with a positive objective; ``first_only``: each configuration's first
    measurement only (the sweeps' repeat campaigns would otherwise leak into the test split)."""
    ok = ds.table[(ds.table["status"] == "ok") & (ds.table[ds.objective] > 0)]
    return ok.drop_duplicates(subset=ds.knobs) if first_only else ok


def table_of(ds: datasets.Dataset, first_only: bool = True) -> tuple[list[dict], np.ndarray]:
    ok = ok_rows(ds, first_only)
    return ok[ds.knobs].to_dict("records"), ok[ds.objective].to_numpy(dtype=np.float64)


def noise_of(ds: datasets.Dataset) -> np.ndarray | None:
    """Each ok row's relative 95% CI half-width of its median step time (where too few windows
    gave no CI: the 90th percentile of the others)."""
    if "step_time_rel_ci" not in ds.table.columns:
        return None
    rel = ok_rows(ds)["step_time_rel_ci"].to_numpy(dtype=np.float64)
    finite = np.isfinite(rel)
    # too few windows for a CI (the slowest configurations): take a high but typical spread
    return np.where(finite, rel, np.percentile(rel[finite], 90))


def noise_floor(ds: datasets.Dataset) -> tuple[float, int]:
    """Kendall tau between the first two measurements of configurations measured twice."""
    configs, y = table_of(ds, first_only=False)
    groups: dict[tuple, list[float]] = defaultdict(list)
    for cfg, v in zip(configs, y, strict=True):
        groups[tuple(sorted((k, repr(val)) for k, val in cfg.items()))].append(v)
    pairs = [g[:2] for g in groups.values() if len(g) >= 2]
    if len(pairs) < 5:
        return float("nan"), len(pairs)
    a, b = zip(*pairs, strict=True)
    return kendall_tau(a, b), len(pairs)


def paired_gap(ours: list[dict], theirs: list[dict]) -> tuple[float, float]:
    """Mean Kendall-tau gap (ours - theirs) over the shared draws and the upper end of its 95%
    confidence interval (t distribution); NaN without at least 3 shared draws."""
    from scipy import stats

    a = {r["repeat"]: r["kendall_tau"] for r in ours}
    d = np.array([a[r["repeat"]] - r["kendall_tau"] for r in theirs if r["repeat"] in a])
    if len(d) < 3:
        return float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return float(d.mean()), float(d.mean() + half)


def speed_check() -> None:
    """Fit + predict, 1,000 trials, 50,000 candidates, on the gpt sweep's space."""
    ds = datasets.load("gpt_cpu_sweep")
    space = ds.space
    train, cands = space.sample(1000, seed=1), space.sample(50_000, seed=2)
    rng = np.random.default_rng(0)
    y = [float(np.exp(0.3 * np.log2(c["micro_batch"]) - 0.2 * np.log2(c["n_layers"])
                      + rng.normal(0, 0.05))) for c in train]
    for name, make in (("gp", lambda: GPPredictor(space)),
                       ("gp-cost", lambda: GPPredictor(space, cost_model=ds.cost_model,
                                                       features=ds.features)),
                       ("mlp", lambda: MLPPredictor(space, epochs=300))):
        t0 = time.perf_counter()
        pred = make().fit(train, y)
        t1 = time.perf_counter()
        pred.predict(cands)
        t2 = time.perf_counter()
        print(f"speed {name}: fit {t1 - t0:.1f} s + predict {t2 - t1:.1f} s = {t2 - t0:.1f} s "
              f"(1,000 trials, 50,000 candidates; target <= 10 s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="*", default=None)
    parser.add_argument("--sizes", nargs="*", type=int, default=[10, 20, 50, 100, 200])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-mixed", action="store_true", help="leave out gp-mixed (slow)")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--speed-only", action="store_true", help="only the speed check")
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; sizes {args.sizes}, "
          f"{args.repeats} draws each; median over draws")
    if args.speed_only:
        speed_check()
        return
    for name in args.datasets or datasets.names():
        try:
            ds = datasets.load(name)
        except cml.errors.CubicMLError as err:
            print(f"\n{name}: skipped ({err})")
            continue
        configs, y = table_of(ds)
        floor, pairs = noise_floor(ds)
        print(f"\n{name}: {len(y)} ok rows of {len(ds.table)}, objective {ds.objective}, "
              f"{len(ds.knobs)} knobs; noise floor tau {floor:.3f} ({pairs} repeated configs)")
        t0 = time.perf_counter()
        preds = factories(ds, not args.no_mixed)
        mixed = {"gp-mixed": preds.pop("gp-mixed")} if "gp-mixed" in preds else {}
        rows = learning_curve(preds, configs, y, args.sizes, repeats=args.repeats,
                              progress=True)
        if mixed:  # random splits only: its leave-one-out refits would take most of the run
            random_sizes = sorted({r["n"] for r in rows if r["split"] == "random"})
            rows += learning_curve(mixed, configs, y, random_sizes, repeats=args.repeats,
                                   progress=True)
        noise = noise_of(ds)
        if noise is not None:  # the same draws, each trial's measured spread as fixed noise
            rows += learning_curve({"gp-noise": lambda: GPPredictor(ds.space)}, configs, y,
                                   args.sizes, repeats=args.repeats, noise=noise,
                                   progress=True)
        cells: dict[tuple, list[dict]] = defaultdict(list)
        for r in rows:
            cells[(r["n"], r["split"], r["predictor"])].append(r)
        print(f"  {'n':>4} {'split':<6} {'predictor':<9} {'tau':>6} {'top5%':>6} {'regret':>7} "
              f"{'fit s':>6}")
        for (n, split, pred), rs in cells.items():
            med = {k: statistics.median(r[k] for r in rs)
                   for k in ("kendall_tau", "top5_recall", "regret", "fit_s")}
            print(f"  {n:>4} {split:<6} {pred:<9} {med['kendall_tau']:>6.3f} "
                  f"{med['top5_recall']:>6.2f} {100 * med['regret']:>6.1f}% {med['fit_s']:>6.2f}")
        med_tau = {(n, pred): statistics.median(r["kendall_tau"] for r in rs)
                   for (n, split, pred), rs in cells.items() if split == "random"}
        for gp_name in ("gp", "gp-cost"):
            if (50, gp_name) in med_tau:
                tau = med_tau[(50, gp_name)]
                allowed = "" if np.isnan(floor) else f", noise floor {floor:.3f}"
                print(f"  target {gp_name} tau@50 >= 0.85: {tau:.3f} -> "
                      f"{'met' if tau >= 0.85 else 'MISSED'}{allowed}")
            for n in sorted({n for n, _ in med_tau if n <= 50}):
                gp = med_tau.get((n, gp_name))
                rivals = {p: med_tau[(n, p)] for p in ("mlp", "gbt") if (n, p) in med_tau}
                if gp is None or not rivals:
                    continue
                verdict = "met" if all(gp >= v for v in rivals.values()) else "MISSED"
                if verdict == "MISSED":  # worse by more than the draws' noise?
                    gaps = [paired_gap(cells[(n, "random", gp_name)], cells[(n, "random", p)])
                            for p in rivals]
                    if all(np.isfinite(hi) and hi >= 0 for _, hi in gaps):
                        draws = len(cells[(n, "random", gp_name)])
                        verdict = ("MISSED on medians; the gap is within the 95% CI of "
                                   f"{draws} draws")
                print(f"  target {gp_name} >= mlp, gbt at n={n}: {gp:.3f}, "
                      + ", ".join(f"{p} {v:.3f}" for p, v in rivals.items())
                      + f" -> {verdict}")
        print(f"  ({time.perf_counter() - t0:.0f} s)")
    if not args.no_speed:
        speed_check()


if __name__ == "__main__":
    main()
