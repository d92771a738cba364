"""Measure each trial in several fresh processes and combine them: :class:`Repeated`.

A figure measured in one fresh process carries two kinds of noise: the spread of its own timed
windows, which its CI states and longer timing shrinks, and the process's own level, which no
amount of timing in that process shrinks (where libraries and buffers land, the machine's state
when it started). Only more processes average the second kind away: where the invocation level
varies more than the iterations, more invocations buy more precision per second than longer
ones (Kalibera and Jones, "Rigorous Benchmarking in Reasonable Time", ISMM 2013).
:class:`Repeated` runs a trial in ``processes`` fresh processes of any launcher, one after
another. Its defaults are the measurement policy (:mod:`cubicml_lab.timing.policy`): 2
processes, each with the whole timing budget, combined by ``keep="drift_fit"``.

With ``share_budget=True`` each process gets a share of the budget (:func:`share_of_budget`):
``max_time_s`` and the step counts divided by the count and the CI it stops at
(``target_rel_ci``) widened by its square root, so that the CI of the processes' mean is about
what one process would have reached; what is added is the cost of starting and warming up the
extra processes. Where a share leaves a process only a few steps, its windows' own noise comes
back, so the policy gives each process the whole budget, at about ``processes`` times the
timing cost.

Which processes a trial's figures come from (``keep``, :data:`KEEP`):

* ``"fastest"``: the process with the highest figure. What disturbs a process adds time, so
  the fastest is the least disturbed (Chen and Revels, "Robust benchmarking in noisy
  environments", 2016); but where the drift reference moved between the processes, the
  fastest is also the one corrected most.
* ``"median"``: the median process (:func:`middle`: with an even count the geometric mean of
  the middle two), which with 3 or more also leaves out one that ran fast.
* ``"drift_fit"`` (the default): every process (the geometric mean), their drift correction
  re-done at the slope they show together: how much of the drift reference's move between the
  processes this configuration felt (:func:`~cubicml_lab.hardware.drift.own_drift_fit`, shrunk
  towards the full correction ``DRIFT_EXPONENT`` where the references read alike;
  ``drift_slope`` records it). The full correction fits a configuration that feels the
  machine's moves as the reference does; one that feels less of them would come out too fast
  from a process run while the reference read slow. Where a trial's processes read their
  references alike they cannot tell its slope, so a ``Repeated`` launcher pools what its
  earlier trials showed: configurations of one workload gauged by the same reference
  (``hardware["drift_reference"]``) feel the machine alike, so their
  :func:`~cubicml_lab.hardware.drift.drift_slope_sums` add up
  (:class:`~cubicml_lab.hardware.drift.DriftSlopePool`), and the slope they give is the mean
  of the next trial's prior instead of ``DRIFT_EXPONENT`` (``drift_slope_prior`` records it;
  the pool lives as long as the launcher, one campaign's).

Every rate and per-step figure (``throughput`` and its ``_raw`` and ``_corrected`` forms, step
times, the reference speed, ...) comes from the kept processes, so ratios between figures stay
as they were, and the contention flag and the worst waits are the largest of theirs. Over every
process: counts and seconds are summed and peak memory is the largest. A relative CI is the
kept process's (``"fastest"``) or that of the mean of all of them (otherwise:
``sqrt(sum ci^2) / n``; the median's precision is about the mean's). ``process_spread`` is
(max - min) / the combined ``throughput``, and ``hardware["processes"]`` lists each process's
figure, its CI, raw figure, reference speed, contention flag, pid and whether it was kept.
A process that does not finish ok (OOM, crash, timeout) ends the trial there with its status
and error: a configuration that fails in one process of two is not a configuration to trust.
A trial whose steps are too long for its budget to be split (a process's ``min_steps`` alone
took longer than its ``max_time_s``; :func:`steps_too_long`) runs in no further process, since
each would pay its start (torch's import), warm-up and minimum steps again
(``skip_long_steps=False`` runs them all). Nor does a trial that a process stopped early
(``stopped_early``: it could not beat the campaign's best): another process would pay its start
and warm-up again only to confirm a loser. The measurements behind these rules are in
``docs/results.md``.

Example:
    >>> from cubicml_lab.launch import Repeated, Subprocess
    >>> Repeated(Subprocess(timeout_s=120)).describe()["keep"]  # the policy's rule
    'drift_fit'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..hardware.drift import DRIFT_EXPONENT, DriftSlopePool, own_drift_fit, rescale_figures
from ..timing.policy import COMBINE, PROCESSES, SHARE_BUDGET
from ..trials import is_stopped_early
from .base import Launcher, check_spec

if TYPE_CHECKING:
    from ..timing import MeasureOptions
    from ..trials import TrialResult

__all__ = ["Repeated"]

_SUMMED = frozenset({"steps_timed", "windows", "contended_windows", "offstate_windows",
                     "outlier_steps", "reference_samples", "warmup_steps", "measure_s",
                     "contended_s", "offstate_s", "drift_gated", "idle_wait_s"})
_LARGEST = frozenset({"peak_mem_gib", "contended", "cpu_wait", "others_cpu", "cpu_steal",
                      "step_time_rel_spread", "reference_rel_spread", "idle_others_cpu",
                      "idle_timed_out", "stopped_early"})
_SMALLEST = frozenset({"target_met"})
#: What ``hardware["processes"]`` keeps of each process's metrics (those it has): its figure
#: and CI, and what tells a disturbed process from a steady one (its raw figure, reference
#: speed, contention flag)
_EACH = ("throughput", "throughput_rel_ci", "throughput_raw", "throughput_corrected",
         "reference_speed", "contended")


class Repeated(Launcher):
    """Run each trial in ``processes`` fresh processes of ``launcher`` and combine them (module
    doc): the same timing budget, spread over processes, so the process's own level averages.

    Args:
        launcher: Where each process runs; default a :class:`~cubicml_lab.launch.Subprocess`.
            An :class:`~cubicml_lab.launch.InProcess` launcher is refused: its runs would share
            one process, which is what this is to avoid.
        processes: Fresh processes per trial (>= 1; 1 runs the trial as ``launcher`` would);
            default :data:`~cubicml_lab.timing.policy.PROCESSES` (2).
        share_budget: Divide the trial's timing budget among the processes
            (:func:`share_of_budget`); False (the default,
            :data:`~cubicml_lab.timing.policy.SHARE_BUDGET`) gives each process the whole
            budget, at about ``processes`` times the cost, where a share would leave each
            process too few steps for a steady figure.
        keep: ``"drift_fit"`` (the default, :data:`~cubicml_lab.timing.policy.COMBINE`),
            ``"fastest"`` or ``"median"`` (:data:`KEEP`, module doc).
        skip_long_steps: Start no further process once one's minimum steps alone took longer
            than its timing budget (``min_steps`` x its step time > ``max_time_s``): such steps
            are too long for the budget to be split, and each further process would add its
            start, warm-up and minimum steps again. The trial then has the figures of the
            processes run so far; ``hardware["processes_skipped"]`` says how many were not.

    Raises:
        ConfigError: ``processes`` is not an int >= 1, ``launcher`` is not a subprocess kind
            of launcher, or ``keep`` is not one of :data:`KEEP`.
    """

    def __init__(self, launcher: Launcher | None = None, processes: int = PROCESSES,
                 share_budget: bool = SHARE_BUDGET, keep: str = COMBINE,
                 skip_long_steps: bool = True) -> None:
        from .inprocess import InProcess
        from .subprocess import Subprocess

        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ConfigError(f"Repeated processes = {processes!r} must be an int >= 1",
                              hint="e.g. Repeated(Subprocess(), processes=2)")
        launcher = Subprocess() if launcher is None else launcher
        if not isinstance(launcher, Launcher) or isinstance(launcher, (InProcess, Repeated)):
            raise ConfigError(
                f"Repeated launcher = {launcher!r:.80} must start fresh processes",
                hint="pass Subprocess(...), Torchrun(...), LocalPool(...) or Slurm(...)")
        for name, flag in (("share_budget", share_budget), ("skip_long_steps", skip_long_steps)):
            if not isinstance(flag, bool):
                raise ConfigError(f"Repeated {name} = {flag!r:.40} must be True or False",
                                  hint=f"e.g. Repeated(Subprocess(), processes=2, {name}=False)")
        if keep not in KEEP:
            raise ConfigError(f"Repeated keep = {keep!r:.40} is not one of {', '.join(KEEP)}",
                              hint='e.g. Repeated(Subprocess(), processes=2, keep="median")')
        self.launcher, self.processes, self.share_budget = launcher, processes, share_budget
        self.keep, self.skip_long_steps = keep, skip_long_steps
        # keep="drift_fit": the earlier trials' slopes, by (workload, drift reference)
        self._drift_pool = DriftSlopePool()

    def drift_slopes(self) -> dict[tuple[str, str], float]:
        """The drift slope each (workload, drift reference) showed over this launcher's
        trials so far (``keep="drift_fit"``): the prior mean its next trial gets."""
        return self._drift_pool.slopes()  # type: ignore[return-value]

    @property
    def world_size(self) -> int:
        return self.launcher.world_size

    def describe(self) -> dict[str, Any]:
        return {"kind": "repeated", "processes": self.processes,
                "share_budget": self.share_budget, "keep": self.keep,
                "skip_long_steps": self.skip_long_steps, "launcher": self.launcher.describe()}

    def __repr__(self) -> str:
        return (f"Repeated({self.launcher!r}, processes={self.processes}, "
                f"share_budget={self.share_budget}, keep={self.keep!r}, "
                f"skip_long_steps={self.skip_long_steps})")

    def run(self, spec: dict[str, Any], *,
            on_start: Callable[[dict[str, Any]], None] | None = None) -> TrialResult:
        spec = check_spec(spec)
        if self.processes == 1:
            return self.launcher.run(spec, on_start=on_start)
        one = dict(spec)
        if self.share_budget:
            one["measure"] = share_of_budget(spec.get("measure"), self.processes)
        results: list[TrialResult] = []
        records: list[dict[str, Any]] = []

        def started(record: dict[str, Any]) -> None:
            records.append(record)
            if on_start is not None:
                on_start(record)

        options = _options(one.get("measure"))
        for _ in range(self.processes):
            res = self.launcher.run(dict(one), on_start=started)
            if res.status != "ok":
                if results:
                    res.error = (f"process {len(results) + 1} of {self.processes} (the "
                                 f"first {len(results)} ran ok): {res.error}")
                    res.wall_s += sum(r.wall_s for r in results)
                return res
            results.append(res)
            if self.skip_long_steps and steps_too_long(res.metrics, options):
                break
            if is_stopped_early(res.metrics):  # it cannot win: no need to see it again
                break
        key = (str(spec.get("workload")), str(results[0].hardware.get("drift_reference")))
        prior = self._drift_pool.prior(key) if self.keep == "drift_fit" else None
        out = combine(results, records, keep=self.keep, drift_prior=prior)
        if "drift_slope" in out.metrics:  # re-corrected: no process flagged, every figure
            self._drift_pool.add(key, *(
                [float(r.metrics[name]) for r in results]
                for name in ("throughput_raw", "throughput_corrected")))
        if len(results) < self.processes:
            out.hardware["processes_skipped"] = self.processes - len(results)
        return out


def share_of_budget(measure: dict[str, Any] | None, processes: int) -> dict[str, Any]:
    """One process's measure options when ``processes`` share a trial's: ``max_time_s`` and
    the step counts (``min_steps``, ``max_steps``; at least 3) over the count,
    ``target_rel_ci`` times its square root, the rest (the warm-up's included: every process
    warms up) as given.

    Example:
        >>> share_of_budget({"max_time_s": 10.0, "target_rel_ci": 0.01}, 4)
        {'max_time_s': 2.5, 'target_rel_ci': 0.02, 'min_steps': 3, 'max_steps': 50}
    """
    given = dict(measure or {})
    opts = _options(given)
    one = replace(opts, max_time_s=opts.max_time_s / processes,
                  target_rel_ci=opts.target_rel_ci * math.sqrt(processes),
                  min_steps=max(3, math.ceil(opts.min_steps / processes)),
                  max_steps=max(3, math.ceil(opts.max_steps / processes)))
    return {**given, **{k: getattr(one, k) for k in (
        "max_time_s", "target_rel_ci", "min_steps", "max_steps")}}


def _options(measure: dict[str, Any] | None) -> MeasureOptions:
    """The :class:`~cubicml_lab.timing.MeasureOptions` a spec's ``measure`` dict gives."""
    from ..timing import MeasureOptions

    try:
        return MeasureOptions(**dict(measure or {}))
    except TypeError as err:
        raise ConfigError(f"spec measure: {err}",
                          hint=f"its options: {', '.join(asdict(MeasureOptions()))}") from None


def steps_too_long(metrics: dict[str, float], options: MeasureOptions) -> bool:
    """Whether a process's minimum steps alone took longer than its timing budget
    (``min_steps`` x its median raw step time > ``max_time_s``): its trial's steps are too long
    for the budget to be split among processes.

    Example:
        >>> from cubicml_lab.timing import MeasureOptions
        >>> o = MeasureOptions(max_time_s=5.0, min_steps=3)
        >>> steps_too_long({"step_time_raw_s": 2.3}, o), steps_too_long({"step_time_raw_s": 0.2}, o)
        (True, False)
    """
    step_s = float(metrics.get("step_time_raw_s", metrics.get("step_time_s", math.nan)))
    return math.isfinite(step_s) and options.min_steps * step_s > options.max_time_s


def combine(results: list[TrialResult], records: list[dict[str, Any]] | None = None,
            keep: str = "fastest", drift_prior: float | None = None) -> TrialResult:
    """One result from ok results of the same trial in separate processes (module doc);
    ``records``: each process's start record (pid, start time), where the launcher gave one;
    ``keep``: whose figures the result carries (:data:`KEEP`); ``drift_prior``: the mean of the
    drift slope's prior for ``keep="drift_fit"`` (None: ``DRIFT_EXPONENT``)."""
    from ..trials import TrialResult

    n = len(results)
    figures = [float(r.metrics.get("throughput", math.nan)) for r in results]
    kept = KEEP[keep](figures)
    every_ci = keep != "fastest"  # the median's precision is about the mean's of all of them
    names = [k for k in results[0].metrics if all(k in r.metrics for r in results)]
    metrics: dict[str, float] = {}
    for name in names:
        every = [float(r.metrics[name]) for r in results]
        over_all = name in _SUMMED or name == "peak_mem_gib" or every_ci and (
            name == "throughput_log_var" or name.endswith("_rel_ci"))
        xs = every if over_all else [every[i] for i in kept]
        k = len(xs)
        if not all(math.isfinite(x) for x in xs):
            metrics[name] = math.nan if any(math.isnan(x) for x in xs) else max(xs)
        elif name in _SUMMED:
            metrics[name] = sum(xs)
        elif name in _LARGEST:
            metrics[name] = max(xs)
        elif name in _SMALLEST:
            metrics[name] = min(xs)
        elif name.endswith("_rel_ci"):
            metrics[name] = math.sqrt(sum(x * x for x in xs)) / k
        elif name == "throughput_log_var":  # the variance of the mean of the logs
            metrics[name] = sum(xs) / k / k
        elif k == 1:  # the kept process's own figure, to the last bit
            metrics[name] = xs[0]
        elif min(xs) > 0:
            metrics[name] = math.exp(sum(math.log(x) for x in xs) / k)
        else:
            metrics[name] = sum(xs) / k
    if keep == "drift_fit":
        _at_own_drift_slope(metrics, [r.metrics for r in results], drift_prior)
    if all(math.isfinite(x) and x > 0 for x in figures) and "throughput" in metrics:
        metrics["process_spread"] = (max(figures) - min(figures)) / metrics["throughput"]
    metrics["processes"] = float(n)
    if any(float(r.metrics.get("stopped_early", 0.0)) > 0 for r in results):
        metrics["stopped_early"] = 1.0  # a process stopped it: the figure is partly a bound
    first = results[0]
    records = list(records or [])
    hardware = {**first.hardware, "processes": [
        {**{k: r.metrics.get(k) for k in _EACH if k in r.metrics}, "wall_s": r.wall_s,
         "kept": i in kept,
         **({k: records[i].get(k) for k in ("pid", "start")} if i < len(records) else {})}
        for i, r in enumerate(results)]}
    return TrialResult(status="ok", metrics=metrics, hardware=hardware, error=None,
                       workload=first.workload, workload_version=first.workload_version,
                       config=first.config, wall_s=sum(r.wall_s for r in results))


def fastest(figures: list[float]) -> list[int]:
    """Index of the process with the highest figure (a list of one); all of them where a
    figure is missing.

    Example:
        >>> fastest([10.0, 7.0, 10.4]), fastest([10.0, float("nan")])
        ([2], [0, 1])
    """
    if not all(math.isfinite(x) for x in figures):
        return list(range(len(figures)))
    return [max(range(len(figures)), key=figures.__getitem__)]


def middle(figures: list[float]) -> list[int]:
    """Indices of the processes a combined figure is taken from: the middle one (odd count) or
    two (even count) by figure, so that the combined figure is the median and one process at
    an odd level (3 or more processes) is left out; all of them where a figure is missing.

    Example:
        >>> middle([10.0, 7.0, 10.4]), middle([10.0, 7.0]), middle([3.0, 1.0, 2.0, 9.0])
        ([0], [1, 0], [2, 0])
    """
    if not all(math.isfinite(x) for x in figures):
        return list(range(len(figures)))
    order = sorted(range(len(figures)), key=figures.__getitem__)
    n = len(order)
    return order[(n - 1) // 2: n // 2 + 1]


def _at_own_drift_slope(metrics: dict[str, float], each: list[dict[str, float]],
                        prior: float | None = None) -> None:
    """``keep="drift_fit"``: the combined figures (geometric means of every process's, whose
    drift-corrected ones each took all of its reference's move) re-corrected at the trial's
    own drift slope (:func:`~cubicml_lab.hardware.drift.own_drift_fit`, from the processes'
    raw figures and references, with a prior of mean ``prior``, default ``DRIFT_EXPONENT``),
    which ``drift_slope`` records, and the prior's mean ``drift_slope_prior``; as they are (no
    ``drift_slope``) where a process was flagged or lacks a corrected figure."""
    prior = DRIFT_EXPONENT if prior is None else prior
    fit = own_drift_fit([float(m.get("throughput_raw", math.nan)) for m in each],
                        [float(m.get("throughput_corrected", math.nan)) for m in each], prior)
    if fit is None or any(float(m.get("contended", 0.0)) > 0 for m in each):
        return
    slope, factor = fit
    rescale_figures(metrics, factor, default_corrected=metrics.get("drift_corrected") == 1.0)
    metrics["drift_slope"], metrics["drift_slope_prior"] = slope, prior


def every(figures: list[float]) -> list[int]:
    """Indices of every process: their figures are combined, not chosen among.

    Example:
        >>> every([10.0, 7.0])
        [0, 1]
    """
    return list(range(len(figures)))


#: How :func:`combine` picks the processes whose figures a trial keeps: ``"fastest"`` the one
#: with the highest ``throughput``, ``"median"`` the middle one or two
#: (:func:`middle`), ``"drift_fit"`` every one, their drift correction re-done at the slope
#: the trial's own processes show (:func:`_at_own_drift_slope`; the policy's rule,
#: :data:`~cubicml_lab.timing.policy.COMBINE`). See the module doc for what each does.
KEEP: dict[str, Callable[[list[float]], list[int]]] = {"fastest": fastest, "median": middle,
                                                       "drift_fit": every}
