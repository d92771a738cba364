"""The demo co-design campaign: a small GPT trained on this machine's CPU, searched with BO.

It is what ``cubicml-lab demo`` (and ``make demo``) runs and what ``notebooks/00_quickstart`` walks
through cell by cell. The model is held fixed (the ``gpt`` workload's defaults) and the search
covers how it is trained and shaped on this CPU: micro-batch size, attention heads, precision,
activation recomputation and CPU threads. Throughput is tokens per second of real training steps.

The first trial is always the stated default configuration (:data:`DEFAULT_CONFIG`), so the
speed-up of the best configuration is measured against a real run, not a guess.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .campaign import Campaign
from .errors import MeasurementError
from .space import Choice, Ordinal, PowerOfTwo, Space
from .store import TrialStore
from .timing.policy import COMBINE, MEASURE, PROCESSES, SHARE_BUDGET
from .trials import SUGGESTED_IDLE_WAIT_S, contention_note

if TYPE_CHECKING:
    import matplotlib.figure
    import pandas as pd

    from .launch import Launcher

__all__ = ["DEFAULT_CONFIG", "DEMO_KEEP", "DEMO_MEASURE", "DEMO_PROCESSES", "cpu_fp32_flop_cost",
           "cpu_fp32_score_cost", "cpu_thread_scaling", "demo_prior", "demo_space",
           "predictor_report", "run_demo", "speedup_line", "summary_table"]

#: The measurement policy (:mod:`cubicml_lab.timing.policy`), under the names the notebooks
#: import: ``MeasureOptions`` overrides, fresh processes per trial, how they are combined.
DEMO_MEASURE: dict[str, Any] = MEASURE
DEMO_PROCESSES = PROCESSES
DEMO_KEEP = COMBINE


def _max_threads() -> int:
    n = max(1, os.cpu_count() or 1)
    return 1 << (n.bit_length() - 1)


def demo_space() -> Space:
    """The demo's space: 6 micro-batch sizes x 3 head counts x 2 precisions x 2 recompute
    settings x thread counts."""
    return Space([
        PowerOfTwo("micro_batch", 1, 32),
        Ordinal("n_heads", [2, 4, 8]),
        Choice("precision", ["fp32", "bf16"]),
        Choice("recompute", ["none", "full"]),
        PowerOfTwo("threads", 1, _max_threads()),
    ])


#: What a user would run without searching: the workload's defaults, every core.
DEFAULT_CONFIG: dict[str, Any] = {"micro_batch": 8, "n_heads": 4, "precision": "fp32",
                                  "recompute": "none", "threads": _max_threads()}


def summary_table(df: pd.DataFrame, space: Space) -> pd.DataFrame:
    """The columns a person reads: id, status, searched knobs, tokens/s, step time, the CI of
    the figure (``throughput_rel_ci``, what the search is told; NaN: unknown, from a single
    window; ``step_time_rel_ci``, the timer's stopping CI, where a table lacks it) and peak
    memory."""
    cols = ["trial_id", "status", *space.names]
    ci = "throughput_rel_ci" if "throughput_rel_ci" in df else "step_time_rel_ci"
    for metric in ("tokens_per_s", "step_time_s", ci, "peak_mem_gib"):
        if metric in df:
            cols.append(metric)
    out = df[cols].copy()
    if "tokens_per_s" in out:
        out["tokens_per_s"] = out["tokens_per_s"].round(0)
    for col in ("step_time_s", ci, "peak_mem_gib"):
        if col in out:
            out[col] = out[col].round(4 if col == "step_time_s" else 3)
    return out.set_index("trial_id")


def demo_prior(fp32_flop_cost: float | None = None,
               constants: Mapping[str, Any] | None = None,
               fp32_score_cost: float | None = None,
               thread_scaling: float | None = None) -> dict[str, Any]:
    """The ``gpt`` workload's analytical prior for the demo's GP, as keyword arguments of
    ``BayesianSearch`` and ``GPPredictor``: ``cost_model`` (:func:`~cubicml_lab.workloads.gpt.
    cost_terms`: per token, FLOPs in fp32 and in bf16, weights, activation bytes,
    per-micro-batch overhead, attention scores in fp32 and in bf16) and
    ``features`` (:func:`~cubicml_lab.workloads.gpt.shape_features`), each of the demo's
    configuration completed with the workload's defaults. The cost model's ``fp32_flop_cost``
    is ``fp32_flop_cost``, by default this CPU's: its matmul rate in bf16 over fp32
    (:func:`cpu_fp32_flop_cost`); its ``fp32_score_cost`` is ``fp32_score_cost``, by default
    this CPU's cost of an fp32 attention score over a bf16 one (:func:`cpu_fp32_score_cost`, at
    the model's sequence length and width; pass 1.0 where the trials run elsewhere, e.g. on a
    GPU); its ``thread_scaling`` is ``thread_scaling``, by default how this CPU's matmuls speed
    up with threads (:func:`cpu_thread_scaling`: ``threads ** thread_scaling`` is the speed-up
    of the work the threads split; 1.0 divides it by the threads). ``constants``: knobs held
    fixed outside the demo's space
    (e.g. a larger model's ``d_model``), filled in before the workload's defaults.

    Each term is there because the GP ranks the demo's trials better with it (leave-one-out
    Kendall tau; ``docs/results.md``): an fp32 FLOP weighs as much as the CPU's matmul rates say,
    an attention score per precision as the CPU's kernel takes, and full recomputation's
    per-micro-batch launches are counted.

    Example:
        >>> prior = demo_prior()
        >>> len(prior["cost_model"](DEFAULT_CONFIG)), len(prior["features"](DEFAULT_CONFIG))
        (7, 5)
    """
    from .workloads import WithDefaults

    fixed = dict(constants or {})
    if fp32_score_cost is None:
        from .workloads.gpt import KNOBS

        shape = {k: fixed.get(k, KNOBS[k].default) for k in ("seq_len", "d_model")}
        fp32_score_cost = cpu_fp32_score_cost(**shape)
    return {"cost_model": WithDefaults("gpt", "cost_terms", {
                **fixed, "fp32_flop_cost": fp32_flop_cost or cpu_fp32_flop_cost(),
                "fp32_score_cost": fp32_score_cost,
                "thread_scaling": cpu_thread_scaling() if thread_scaling is None
                else thread_scaling}),
            "features": WithDefaults("gpt", "shape_features", fixed)}


def cpu_fp32_flop_cost() -> float:
    """Seconds of an fp32 FLOP over a bf16 one on this CPU: its matmul rate in bf16 over fp32
    (:func:`~cubicml_lab.hardware.device_peak_flops`, measured once per CPU model and thread
    count and cached), or 1.0 where the rates cannot be measured."""
    from .hardware import device_peak_flops

    fp32, bf16 = device_peak_flops("cpu", "fp32"), device_peak_flops("cpu", "bf16")
    return float(bf16 / fp32) if fp32 and bf16 else 1.0


def cpu_fp32_score_cost(seq_len: int = 128, d_model: int = 128) -> float:
    """Seconds of an fp32 attention score over a bf16 one on this CPU, for sequences of
    ``seq_len`` tokens in a model of width ``d_model``
    (:func:`~cubicml_lab.hardware.attention_score_seconds`, measured once per CPU model, thread
    count and shape and cached), or 1.0 where either cannot be measured."""
    from .hardware import attention_score_seconds

    fp32, bf16 = (attention_score_seconds(p, seq_len, d_model) for p in ("fp32", "bf16"))
    return float(fp32 / bf16) if fp32 and bf16 else 1.0


def cpu_thread_scaling(threads: int | None = None) -> float:
    """How this CPU's matmuls speed up with ``threads`` threads (default the demo's most,
    :data:`DEFAULT_CONFIG`'s): the exponent ``a`` of ``speed-up = threads ** a``, from the
    matmul rates (:func:`~cubicml_lab.hardware.device_peak_flops`, measured once per CPU model,
    thread count and precision and cached) at ``threads`` and at 1 thread, the log speed-ups
    of fp32 and bf16 averaged; within [0, 1]. 1.0 (the threads split the work evenly) where
    ``threads`` is 1 or a rate cannot be measured.

    Every demo campaign's search tries 1 thread once, and that trial is its only one: left out,
    it is predicted from the cost model's split alone, so the split follows the CPU's measured
    scaling rather than an even one."""
    import torch

    from .hardware import device_peak_flops

    n = _max_threads() if threads is None else int(threads)
    if n <= 1:
        return 1.0
    before, rates = torch.get_num_threads(), {}
    try:
        for t in (1, n):
            torch.set_num_threads(t)
            rates[t] = [device_peak_flops("cpu", p) for p in ("fp32", "bf16")]
    finally:
        torch.set_num_threads(before)
    logs = [math.log(many / one) for one, many in zip(rates[1], rates[n]) if one and many]
    if not logs:
        return 1.0
    return min(1.0, max(0.0, sum(logs) / len(logs) / math.log(n)))


def _costlier(cost: float, unit: str) -> str:
    """"an fp32 FLOP costs 2.4x a bf16 FLOP" from the seconds of an fp32 ``unit`` over a bf16
    one."""
    dear, cheap, ratio = ("fp32", "bf16", cost) if cost >= 1 else ("bf16", "fp32", 1 / cost)
    return (f"a{'n' if dear == 'fp32' else ''} {dear} {unit} costs {ratio:.3g}x "
            f"a{'n' if cheap == 'fp32' else ''} {cheap} {unit}")


def predictor_report(df: pd.DataFrame, space: Space, objective: str = "throughput",
                     seed: int = 0, observed_noise: bool = True, learn_drift: bool = True,
                     **gp_options: Any) -> dict[str, Any]:
    """Leave-one-out predictions of a GP over a campaign's ok trials, with Kendall tau and MAPE;
    ``gp_options`` go to each ``GPPredictor`` (e.g. ``**demo_prior()``).

    With ``observed_noise`` (the default) each fold's GP is told the trials' measured noise as
    ``BayesianSearch`` tells its own (:func:`~cubicml_lab.search.bayesian.observed_noise`: each
    figure's CI, at least 10 % for a flagged one), so the report scores the model the search
    ranked with; without it the GP infers one noise level for all. The told noise ranks
    the trials better; what still separates the two is pairs of configurations within a few
    percent of each other.

    With ``learn_drift`` (the default) the GP learns how much of each trial's drift correction
    to keep, as ``BayesianSearch`` does (:func:`~cubicml_lab.search.bayesian.learn_drift`).
    Each leave-one-out fold learns it on the trials it is fitted on, and the trial it leaves
    out is scored at that fold's exponent (``measured`` holds those figures);
    ``drift_exponent`` is the exponent learned on all the ok trials, as the search had it at
    its end (None: no trial was corrected). Learning it once on all the trials, the left-out
    one included, would move each left-out figure towards the model before it is scored.

    ``flagged`` counts the trials the contention guard flagged (``contended`` > 0: measured
    while other work shared the cores); they are kept, as measured: leaving them out leaves
    fewer trials to learn from and score, and ranks lower. A trial stopped early
    (``stopped_early`` > 0: its figure bounds its speed) is left out.
    """
    import numpy as np

    from .surrogate import GPPredictor, cross_val_predict, kendall_tau, mape

    ok = df[df["status"].eq("ok")]
    if "stopped_early" in ok:  # at most this fast: a bound, not a measurement to score
        ok = ok[~ok["stopped_early"].fillna(0).gt(0)]
    flagged = int(ok["contended"].fillna(0).gt(0).sum()) if "contended" in ok else 0
    configs = [{n: row[n] for n in space.names} for _, row in ok.iterrows()]
    configs = [space.project(c) for c in configs]
    values = ok[objective].to_numpy(dtype=float)
    if len(values) < 4:
        return {"n": len(values), "flagged": flagged, "kendall_tau": float("nan"),
                "mape": float("nan")}
    from .search.bayesian import at_drift_exponent, drift_covariate
    from .search.bayesian import learn_drift as learn
    from .search.bayesian import observed_noise as told_noise

    # a NaN CI stays: unknown (a single window), as the search is told it
    told = [{k: float(v) for k, v in row.items() if isinstance(v, (int, float))
             and not isinstance(v, bool)} for _, row in ok.iterrows()]
    noise = told_noise(told, objective)[0] if observed_noise else None
    covariate = drift_covariate(told, objective) if learn_drift else None

    def learned(rows: np.ndarray) -> tuple[GPPredictor, float]:
        """The GP of the trials ``rows`` at the exponent learned on them alone."""
        def fit(v: np.ndarray, warm: Any) -> GPPredictor:
            return GPPredictor(space, objective, seed=seed, **gp_options).fit(
                [configs[i] for i in rows], v, warm_start=warm,
                noise=None if noise is None else [noise[i] for i in rows])

        pred, exponent, _ = learn(fit, values[rows], covariate[rows])
        return pred, exponent

    if covariate is None:
        drift = None
        cv = cross_val_predict(lambda: GPPredictor(space, objective, seed=seed, **gp_options),
                               configs, values, folds="loo", seed=seed, noise=noise)
        mean, lo, hi = (np.asarray(cv[k], dtype=float) for k in ("mean", "lo", "hi"))
    else:  # each fold learns its exponent without the trial it leaves out (see above)
        n = len(values)
        mean, lo, hi, figures = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
        for i in range(n):
            pred, exponent = learned(np.delete(np.arange(n), i))
            figures[i] = at_drift_exponent(values[i:i + 1], covariate[i:i + 1], exponent)[0]
            mean[i] = pred.predict([configs[i]])[0][0]
            (lo[i],), (hi[i],) = pred.predict_interval([configs[i]], level=0.95)
        drift = learned(np.arange(n))[1]
        values = figures
    return {"n": len(values), "flagged": flagged, "measured": values, "mean": mean,
            "lo": lo, "hi": hi, "drift_exponent": drift,
            "kendall_tau": float(kendall_tau(values, mean)), "mape": float(mape(values, mean))}


def speedup_line(camp: Any, best_cfg: dict[str, Any], default_value: float,
                 speedup: float) -> str:
    """The demo's speed-up line, with a caveat where the default's or the best's every
    measurement was flagged contended (a figure from a busy machine: a default measured while
    other work shared the CPU makes any speed-up look large)."""
    busy = [what for what, cfg in (("the default's", camp.reference), ("the best's", best_cfg))
            if cfg is not None and camp.measured_flagged(cfg)]
    caveat = (f" ({' and '.join(busy)} measurement{'s' if len(busy) > 1 else ''} flagged "
              "contended: other work shared the CPU, so this speed-up is not to be trusted)"
              if busy else "")
    return (f"default configuration: {default_value:,.0f} tokens/s  ->  speed-up {speedup:.2f}x"
            f"{caveat}")


def run_demo(budget: int = 14, store: str | os.PathLike[str] = "data/demo.sqlite",
             out: str | os.PathLike[str] = "runs", *, campaign: str | None = None, seed: int = 0,
             launcher: str = "subprocess", progress: bool = True,
             max_time_s: float = DEMO_MEASURE["max_time_s"], processes: int = DEMO_PROCESSES,
             wait_for_idle_s: float = 0.0, early_stop: bool = False
             ) -> tuple[dict[str, Any], matplotlib.figure.Figure]:
    """Run the demo campaign end to end and print what it found.

    Args:
        budget: Finished trials wanted (the default configuration is the first).
        store: SQLite file of the trial store.
        out: Folder for ``demo.png``.
        campaign: Campaign name; an existing one resumes. Default: ``demo-<date>-<time>``.
        seed: Seed of the Bayesian search and the GP.
        launcher: ``"subprocess"`` (a fresh interpreter per trial) or ``"inprocess"``.
        progress: Show the tqdm bar.
        max_time_s: Seconds of timed steps per trial (:data:`DEMO_MEASURE`: 6); its warm-up
            may take half as long (``MeasureOptions.warmup_budget_s``). Shorter is quicker and
            noisier.
        processes: Fresh processes per trial with the ``"subprocess"`` launcher, each with
            the whole timing budget, their figures combined as :data:`DEMO_KEEP` says
            (:class:`~cubicml_lab.launch.Repeated`; :data:`DEMO_PROCESSES`: 2). A process
            has a speed level of its own, which more timing in it does not average away.
        wait_for_idle_s: Before each trial process's warm-up, wait up to this many seconds for
            other work to leave the cores idle (``MeasureOptions.wait_for_idle_s``); 0: none.
        early_stop: Stop a trial's timing once it cannot beat the best so far
            (``Campaign.run(early_stop=True)``).

    Returns:
        A summary dict (best config, speed-up, Kendall tau, paths...) and the figure. The best
        configuration is the one the search's GP rates highest among those measured
        (:meth:`~cubicml_lab.search.BayesianSearch.recommend`), with its measured figure; the
        highest single measurement is ``top_measured``.
    """
    import matplotlib

    matplotlib.use("Agg")
    from .search import BayesianSearch
    from .timing import hardware_info

    runner, measure = _demo_launcher(launcher, max_time_s, processes, wait_for_idle_s)
    space = demo_space()
    hw = hardware_info("cpu")
    name = campaign or time.strftime("demo-%Y%m%d-%H%M%S")
    print(f"cubicml-lab demo: a real co-design campaign of a small GPT on {hw.get('cpu_model')} "
          f"({hw.get('cpu_count')} CPUs)")
    print(f"space: {space.size()} configurations of {', '.join(space.names)}; budget {budget} "
          f"trials; store {store}; campaign {name!r}")
    print(f"default configuration (trial 1): {DEFAULT_CONFIG}")
    prior = _demo_cost_model()
    search = BayesianSearch(space, objective="throughput", seed=seed, **prior)
    trial_store = TrialStore(store)
    camp = Campaign(name, space, workload="gpt", launcher=runner, searcher=search,
                    store=trial_store, measure_options=measure, reference=DEFAULT_CONFIG)
    t0 = time.perf_counter()
    df = camp.run(budget, progress=progress, full=True,  # every field: the report reads them
                  early_stop=early_stop)
    elapsed = time.perf_counter() - t0
    try:
        summary, fig = _report_demo(camp, search, df, prior, hw, out, seed, processes)
    finally:
        trial_store.close()
    summary.update({"campaign": name, "store": str(store), "elapsed_s": elapsed,
                    "processes": getattr(runner, "processes", 1)})
    print(f"campaign took {elapsed:.0f} s; figure written to {summary['figure']}")
    return summary, fig


def _demo_launcher(launcher: str, max_time_s: float, processes: int, wait_for_idle_s: float
                   ) -> tuple[Launcher, dict[str, Any]]:
    """The demo's launcher and measurement options, each argument checked before any store or
    trial exists (a bad ``processes`` or wait is refused here)."""
    from .launch import InProcess, Repeated, Subprocess
    from .timing import MeasureOptions

    if isinstance(max_time_s, bool) or not isinstance(max_time_s, (int, float)) \
            or not 0 < max_time_s < math.inf:
        raise MeasurementError(f"max_time_s = {max_time_s!r} must be a number of seconds > 0",
                               hint=f"the demo's default: {DEMO_MEASURE['max_time_s']} "
                                    "(cubicml-lab demo --max-time-s 6)")
    runner: Launcher = InProcess()
    if launcher == "subprocess":
        runner = Repeated(Subprocess(timeout_s=120), processes=processes,
                          share_budget=SHARE_BUDGET, keep=DEMO_KEEP)
    measure = {**DEMO_MEASURE, "max_time_s": max_time_s}
    if wait_for_idle_s:
        measure["wait_for_idle_s"] = wait_for_idle_s
    MeasureOptions.from_dict(measure)
    return runner, measure


def _demo_cost_model() -> dict[str, Any]:
    """The demo's prior from this CPU's measured rates (:func:`demo_prior`), with a line saying
    what it prices and whether the rates could be measured."""
    flop_cost, score_cost = cpu_fp32_flop_cost(), cpu_fp32_score_cost()
    n, scaling = _max_threads(), cpu_thread_scaling()
    threads = f", and {n} threads speed its matmuls up {n ** scaling:.2f}x" if n > 1 else ""
    if flop_cost == 1.0 and score_cost == 1.0:  # both fallbacks: nothing could be measured
        print("cost model: this CPU's matmul and attention rates could not be measured on idle "
              "cores (other work kept them busy), so fp32 and bf16 are priced alike"
              f"{threads and ' and threads are taken to split the work evenly'}")
    else:
        print(f"cost model: {_costlier(flop_cost, 'FLOP')} here (this CPU's matmul rates), "
              f"{_costlier(score_cost, 'attention score')} (its attention kernel's){threads}")
    return demo_prior(flop_cost, fp32_score_cost=score_cost, thread_scaling=scaling)


def _report_demo(camp: Campaign, search: Any, df: Any, prior: dict[str, Any],
                 hw: dict[str, Any], out: str | os.PathLike[str], seed: int, processes: int
                 ) -> tuple[dict[str, Any], matplotlib.figure.Figure]:
    """Print what the demo campaign found (the trial table, the predictor's leave-one-out
    figures, the best configuration and its speed-up), save ``demo.png`` and return the
    summary and the figure."""
    import pandas as pd

    from .plots import campaign_figure

    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print("\nall trials:")
        print(summary_table(df, camp.space).to_string())
    note = contention_note(df, wait_option="run cubicml-lab demo --wait-for-idle-s "
                                           f"{SUGGESTED_IDLE_WAIT_S}")
    if note:
        print(f"\n{note}")
    report = predictor_report(df, camp.space, seed=seed, **prior)
    best_cfg, best_estimate = search.recommend()
    best_value = camp.measured_value(best_cfg)
    top_cfg, top_value = camp.best()
    default_value = camp.reference_value()
    speedup = best_value / default_value if best_value and default_value else None
    fig = campaign_figure(df, report if "mean" in report else None, reference=default_value,
                          unit="tokens/s",
                          title=f"cubicml-lab demo: GPT on {hw.get('cpu_count')} CPU cores")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig_path = out_dir / "demo.png"
    fig.savefig(fig_path, dpi=120)
    _print_findings(camp, df, report, (best_cfg, best_value, best_estimate),
                    (top_cfg, top_value), default_value, speedup, processes)
    summary = {"figure": str(fig_path), "best": best_cfg,
               "best_tokens_per_s": best_value, "best_estimate": best_estimate,
               "top_measured": top_cfg, "top_measured_tokens_per_s": top_value,
               "default_tokens_per_s": default_value,
               "speedup": speedup, "kendall_tau": report["kendall_tau"],
               "drift_exponent": report.get("drift_exponent"), "trials": len(df),
               "stop_reason": camp.stop_reason}
    return summary, fig


def _print_findings(camp: Campaign, df: Any, report: dict[str, Any], best: tuple, top: tuple,
                    default_value: float | None, speedup: float | None, processes: int) -> None:
    """The demo's closing lines: the predictor's leave-one-out figures, the recommended and the
    highest measured configuration, the speed-up over the default, and the processes' spread."""
    best_cfg, best_value, best_estimate = best
    top_cfg, top_value = top
    flagged = f" ({report['flagged']} flagged contended)" if report["flagged"] else ""
    drift = report.get("drift_exponent")
    learned = "" if drift is None else (f"; it took {drift:.2f} of each trial's drift "
                                        "correction (learned)")
    print(f"\nGP predictor, leave-one-out over {report['n']} ok trials{flagged}: "
          f"Kendall tau = {report['kendall_tau']:.3f}, MAPE = {100 * report['mape']:.1f}%"
          f"{learned}")
    print(f"best configuration: {best_cfg}  ->  {best_value:,.0f} tokens/s\n"
          f"  (of the configurations measured, the one the GP rates highest: {best_estimate:,.0f} "
          "tokens/s estimated)")
    if top_cfg != best_cfg:
        print(f"highest single measurement: {top_cfg}  ->  {top_value:,.0f} tokens/s (the GP, "
              "weighing each figure's noise and its neighbours, rates it lower)")
    if speedup is not None:
        print(speedup_line(camp, best_cfg, default_value, speedup))
    spread = df["process_spread"].dropna() if "process_spread" in df else []
    if len(spread):
        slopes = df["drift_slope"].dropna() if "drift_slope" in df else []
        felt = (f", corrected for the machine's drift by the share of it the two and the "
                f"campaign's earlier trials show the configuration felt (median "
                f"{slopes.median():.2f})" if len(slopes) else "")
        print(f"each trial ran in {processes} fresh processes{felt}; their figures lay a "
              f"median {100 * spread.median():.1f}% apart (largest {100 * spread.max():.1f}%)")
