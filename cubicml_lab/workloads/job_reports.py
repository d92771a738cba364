"""Where a command's figures come from: its metrics file and its log lines, read as it runs.

**The metrics file.** The lab sets ``CUBICML_LAB_METRICS`` to a file in the trial's folder; the
job appends one JSON object per line (:mod:`cubicml_lab.report` writes them)::

    {"v": 1, "event": "step", "rank": 0, "t": <time.monotonic()>, "wall": <time.time()>,
     "step": 12, "tokens": 8192, "samples": 8, "loss": 2.31, ...other numbers}
    {"v": 1, "event": "memory", "rank": 0, "t": ..., "wall": ..., "peak_gib": 3.2}

once per optimizer step and whenever it measures its memory. ``tokens`` and ``samples`` are what
*that rank* consumed in the step; the lab adds the ranks up (ranks that share one batch, tensor
or pipeline parallel peers, report it on one of them only). A line that is not such an object
(junk, a wrong version, a half-written last line) is skipped and counted, never fatal.

**Log lines.** A regular expression with named groups (:data:`GROUPS`) is searched in each line
of the job's stdout and stderr (colour codes removed); each match is one report, timed by the
numbers it carries or else by when the line appeared. :data:`PATTERNS` holds ready ones for
torchtitan, Megatron-LM and the Hugging Face ``Trainer``, checked against their logging code.

:class:`JobReports` reads both incrementally while the job runs and turns what it read into the
lab's figures (:meth:`JobReports.figures`): per rank, warm-up dropped, windows, steady-state
median step time and its 95% CI (:func:`~cubicml_lab.timing.reported_timing`), throughput in the
job's units, peak memory where reported; the slowest rank's figures count. Importing this module
imports no torch.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import replace

from ..errors import ConfigError
from ..timing import MeasureOptions, Timing, summarize
from ..timing.reported import reported_timing

__all__ = ["GROUPS", "HF_TRAINER", "MEGATRON", "PATTERNS", "TORCHTITAN", "JobReports",
           "check_sources", "pattern_of"]

#: Named groups a log pattern may use, and what each means. A pattern needs at least one.
GROUPS = {"step": "the optimizer step number", "loss": "the loss",
          "step_time_s": "seconds per step (averaged over the steps since the last line)",
          "step_time_ms": "milliseconds per step (same)",
          "tokens": "tokens per step, all ranks", "samples": "samples per step, all ranks",
          "tokens_per_s": "tokens/s, all ranks", "samples_per_s": "samples/s, all ranks",
          "tokens_per_s_per_device": "tokens/s of one device (times the job's devices)",
          "peak_mem_gib": "peak memory in GiB", "peak_mem_mib": "peak memory in MiB"}

# torchtitan, torchtitan/components/metrics.py (MetricsProcessor.log): rank 0 logs, every
# metrics.log_freq steps, "step: {step:2}  loss: {loss:8.5f}  grad_norm: ...  memory:
# {max_reserved_gib:5.2f}GiB({pct:.2f}%)  tps: {round(tps):,}  tflops: ...  mfu: ...%", each
# field behind an ANSI colour code; tps is tokens/s per device. "validate step:" lines are
# validation, not training.
TORCHTITAN = (r"(?<!validate )step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>[-+.\deEnaif]+)"
              r".*?memory:\s*(?P<peak_mem_gib>[\d.]+)GiB.*?tps:\s*(?P<tokens_per_s_per_device>"
              r"[\d,]+)")
# Megatron-LM, megatron/training/training.py (training_log): the last rank prints, every
# log_interval iterations, " [date] iteration {it:8d}/{train_iters:8d} | consumed samples: ... |
# elapsed time per iteration (ms): {ms:.1f} | ... | global batch size: {bs:5d} | lm loss:
# {loss:.6E} | ...", the time averaged over the interval.
MEGATRON = (r"iteration\s+(?P<step>\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*"
            r"(?P<step_time_ms>[\d.]+)\s*\|.*?global batch size:\s*(?P<samples>\d+)\s*\|"
            r"(?:.*?lm loss:\s*(?P<loss>[-+.\dEe]+))?")
# Hugging Face transformers, src/transformers/trainer_callback.py (ProgressCallback.on_log):
# the main process writes str(logs), e.g. "{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate':
# 5e-05, 'epoch': 0.12}", every logging_steps steps; no step time: the lab times the lines, so
# set logging_steps=1 (or use cubicml_lab.integrations' callback, which reports every step).
# Not anchored at the line's start: a progress bar's carriage return may precede it.
HF_TRAINER = r"\{'loss': (?P<loss>[-+.\deE]+|nan|inf),.*'epoch': [\d.]+"
#: Ready log patterns by name.
PATTERNS = {"torchtitan": TORCHTITAN, "megatron": MEGATRON, "hf_trainer": HF_TRAINER}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MAX_LINE = 65536  # longer lines are cut (a job's log is data, bounded)


def pattern_of(source: str) -> re.Pattern[str]:
    """The compiled regular expression of a source (a ready pattern's name or a regex)."""
    return re.compile(PATTERNS.get(source, source))


def check_sources(metrics: str | Sequence[str]) -> list[str]:
    """``metrics`` as a checked list of sources (see ``Command(metrics=)``).

    Raises:
        ConfigError: Empty, not strings, a regex that does not compile or has no named group
            the lab reads (the message lists :data:`GROUPS`).
    """
    items = [metrics] if isinstance(metrics, str) else list(metrics)
    if not items or not all(isinstance(s, str) and s for s in items):
        raise ConfigError(f"Command metrics = {metrics!r} must name one or more sources",
                          hint='e.g. metrics=["report"], ["torchtitan"] or a regex with named '
                               "groups")
    for s in items:
        if s == "report" or s in PATTERNS:
            continue
        try:
            groups = set(re.compile(s).groupindex)
        except re.error as err:
            raise ConfigError(f"Command metrics pattern {s!r} is not a regular expression: {err}",
                              hint="check the brackets and escapes") from None
        if not groups & set(GROUPS):
            raise ConfigError(f"Command metrics pattern {s!r} has no named group the lab reads "
                              f"(it has {sorted(groups) or 'none'})",
                              hint="name what a group holds, e.g. (?P<step_time_s>[\\d.]+); "
                                   f"known: {', '.join(GROUPS)}")
    return items


#: Windows of log lines timed as they are read last at least this long: the lines arrive in
#: bursts, one per poll of the log (every 20 ms), so a short window is mostly that poll's phase.
ARRIVAL_WINDOW_S = 0.5


def _window_rule(options: MeasureOptions, kind: str) -> MeasureOptions:
    """The options a rank's reports are windowed by: a rate per line is no time, so each line
    (an average already) is a window; lines timed as they arrive need long windows."""
    if kind == "per_unit":
        return replace(options, window_min_s=0.0)
    if kind == "arrival":
        return replace(options, window_min_s=max(options.window_min_s, ARRIVAL_WINDOW_S))
    return options


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) or text.strip().lower() in ("nan", "inf") else None


class _Tail:
    """New complete lines of a growing file (a partial last line waits for its newline)."""

    def __init__(self, path: str) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(1 << 22)
        except OSError:
            return []
        self.offset += len(data)
        *done, self.partial = (self.partial + data).split(b"\n")
        return [d[:_MAX_LINE].decode("utf-8", "replace") for d in done]


class JobReports:
    """What a running job reported so far, read from its metrics file and its logs.

    Args:
        sources: Checked sources (:func:`check_sources`).
        metrics_path: The metrics file (``CUBICML_LAB_METRICS``).
        log_paths: The job's stdout and stderr files.
        n_devices: Devices of the job (for ``tokens_per_s_per_device``).
    """

    def __init__(self, sources: Sequence[str], metrics_path: str, log_paths: Sequence[str],
                 n_devices: int = 1) -> None:
        self.report = "report" in sources
        self.patterns = [pattern_of(s) for s in sources if s != "report"]
        self._metrics = _Tail(metrics_path)
        self._logs = [_Tail(p) for p in log_paths] if self.patterns else []
        self.n_devices = n_devices
        self.steps: dict[int, list[dict[str, float]]] = {}  # rank -> reports in order
        self.peak_gib = math.nan
        self.junk = 0
        self.first_report = math.nan  # time.monotonic() when the first report was read
        self.last_report = math.nan  # ... and the newest

    def poll(self) -> int:
        """Read what was appended since the last call; the number of new step reports."""
        new = 0
        if self.report:
            for line in self._metrics.lines():
                new += self._metrics_line(line)
        for tail in self._logs:
            now = time.monotonic()
            for line in tail.lines():
                new += self._log_line(_ANSI.sub("", line), now)
        if new:
            self.last_report = time.monotonic()
            if self.first_report != self.first_report:
                self.first_report = self.last_report
        return new

    def finish(self) -> None:
        """Read the rest once the job ended; a half-written last line counts as junk."""
        self.poll()
        self.junk += int(bool(self._metrics.partial.strip()))

    def _metrics_line(self, line: str) -> int:
        if not line.strip():
            return 0
        try:
            rec = json.loads(line)
            ok = (isinstance(rec, dict) and rec.get("v") == 1
                  and rec.get("event") in ("step", "memory")
                  and isinstance(rec.get("t"), (int, float)) and math.isfinite(rec["t"]))
        except ValueError:
            ok = False
        rank = rec.get("rank", 0) if ok else 0
        if not ok or not isinstance(rank, int) or isinstance(rank, bool):
            self.junk += 1
            return 0
        if rec["event"] == "memory":
            peak = rec.get("peak_gib")
            if isinstance(peak, (int, float)) and math.isfinite(peak):
                self.peak_gib = max(self.peak_gib, float(peak)) if self.peak_gib == \
                    self.peak_gib else float(peak)
            return 0
        entry = {k: float(v) for k, v in rec.items() if k in
                 ("t", "step", "tokens", "samples", "loss", "peak_mem_gib")
                 and isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.steps.setdefault(rank, []).append(entry)
        if "peak_mem_gib" in entry:
            self.peak_gib = max(x for x in (self.peak_gib, entry["peak_mem_gib"]) if x == x)
        return 1

    def _log_line(self, line: str, now: float) -> int:
        for pattern in self.patterns:
            match = pattern.search(line)
            if match is None:
                continue
            found = {k: _number(v) for k, v in match.groupdict().items() if k in GROUPS}
            entry = {k: v for k, v in found.items() if v is not None}
            if not entry:
                continue
            entry["t"], entry["logged"] = now, 1.0
            if "step_time_ms" in entry:
                entry["step_time_s"] = entry.pop("step_time_ms") / 1000.0
            if "peak_mem_mib" in entry:
                entry["peak_mem_gib"] = entry.pop("peak_mem_mib") / 1024.0
            if "tokens_per_s_per_device" in entry:
                entry["tokens_per_s"] = entry.pop("tokens_per_s_per_device") * self.n_devices
            if "peak_mem_gib" in entry:
                peaks = [x for x in (self.peak_gib, entry["peak_mem_gib"]) if x == x]
                self.peak_gib = max(peaks)
            self.steps.setdefault(0, []).append(entry)
            return 1
        return 0

    @property
    def n_steps(self) -> int:
        """Step reports read so far, all ranks."""
        return sum(len(v) for v in self.steps.values())

    def durations(self, rank: int) -> tuple[list[tuple[int, float]], str]:
        """``(steps, seconds per step)`` of each report of ``rank`` after its first, and what
        they measure: ``"step_time"`` (seconds per step, from the job's clock or its lines),
        ``"arrival"`` (the same, from when log lines were read) or ``"per_unit"`` (seconds per
        token or sample: a log that gives only a rate)."""
        recs = self.steps.get(rank, [])
        rate = next((k for k in ("tokens_per_s", "samples_per_s") if recs and k in recs[-1]),
                    None)
        if rate is not None and not any("step_time_s" in r for r in recs):
            return [(1, 1.0 / r[rate]) for r in recs[1:] if r.get(rate, 0) > 0], "per_unit"
        steps = [1] + [max(1, int(r["step"] - p["step"])) if "step" in r and "step" in p else 1
                       for p, r in zip(recs, recs[1:])]
        if any("step_time_s" in r for r in recs):  # each line says its seconds per step
            return [(n, r["step_time_s"]) for n, r in zip(steps[1:], recs[1:])
                    if "step_time_s" in r], "step_time"
        # timed by the clock: reports read together (log lines) share an arrival time, and the
        # time since the previous arrival is theirs
        groups: list[list[float]] = []  # [time, steps]
        for n, rec in zip(steps, recs):
            if groups and rec["t"] == groups[-1][0]:
                groups[-1][1] += n
            else:
                groups.append([rec["t"], n])
        return [(int(g[1]), (g[0] - p[0]) / g[1]) for p, g in zip(groups, groups[1:])
                if g[0] > p[0]], "arrival" if recs and recs[-1].get("logged") else "step_time"

    def units_per_step(self, units: str) -> float:
        """Median ``tokens``/``samples`` per step of each rank, added over the ranks (NaN when
        no rank reported them)."""
        total, seen = 0.0, False
        for recs in self.steps.values():
            vals = sorted(r[units] for r in recs if units in r)
            if vals:
                total += vals[len(vals) // 2]
                seen = True
        return total if seen else math.nan

    def last_loss(self) -> float:
        """The newest loss of the lowest rank that reported one (NaN if none)."""
        for rank in sorted(self.steps):
            losses = [r["loss"] for r in self.steps[rank] if "loss" in r]
            if losses:
                return losses[-1]
        return math.nan

    def slowest(self, options: MeasureOptions, elapsed_s: float = math.nan
                ) -> tuple[int, Timing, str] | None:
        """The rank whose steady-state step is slowest, its :class:`Timing` and what its
        reports measure (see :meth:`durations`); None before any rank has a timed window."""
        best: tuple[int, Timing, str] | None = None
        for rank in sorted(self.steps):
            reports, kind = self.durations(rank)
            timing = reported_timing(reports, _window_rule(options, kind), elapsed_s)
            if timing.windows and (best is None
                                   or timing.median_step_time_s > best[1].median_step_time_s):
                best = (rank, timing, kind)
        return best

    def figures(self, units: str, options: MeasureOptions, elapsed_s: float,
                n_devices: int = 1, nodes: int = 1) -> dict[str, float]:
        """The lab's metrics from what was reported (empty when no rank has a timed window):
        :func:`~cubicml_lab.timing.summarize`'s (``step_time_s``, its CI, ``throughput``,
        ``<units>_per_s`` ...) of the slowest rank, with the units of all ranks per step, plus
        ``peak_mem_gib`` (where reported), ``loss``, ``ranks_reported``, ``junk_lines``.
        A log that gives only a rate yields the throughput and its CI; its step time is NaN
        unless the lines also give the units per step. A job on ``nodes`` nodes is read on the
        first one only (its trial folder is that node's): its units per step count ``nodes``
        times, the nodes taken to be alike (data parallel across them)."""
        found = self.slowest(options, elapsed_s)
        if found is None:
            return {}
        rank, timing, kind = found
        per_step = self.units_per_step(units) * max(1, nodes)
        if kind == "per_unit":  # windows in seconds per unit: throughput = 1 / median
            metrics = summarize(timing, 1.0, math.nan, None, n_devices, units=units)
            t = metrics["throughput"]
            step = per_step / t if per_step == per_step and t > 0 else math.nan
            metrics.update(step_time_s=step, step_time_raw_s=step, units_per_step=per_step)
        else:  # no tokens or samples reported: the throughput is in steps per second
            metrics = summarize(timing, per_step if per_step == per_step else 1.0, math.nan,
                                None, n_devices,
                                units=units if per_step == per_step else "steps")
        metrics.update(peak_mem_gib=self.peak_gib, loss=self.last_loss(),
                       slowest_rank=float(rank), ranks_reported=float(len(self.steps)),
                       junk_lines=float(self.junk))
        return metrics
