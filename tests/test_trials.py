"""Tests for cubicml_lab.trials: one vocabulary, the two records, their JSON codec."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys

import pytest

from cubicml_lab.errors import MeasurementError
from cubicml_lab.trials import (
    FINISHED,
    STATUSES,
    Trial,
    TrialResult,
    dumps,
    failure_result,
    json_safe,
    restore,
)


def test_one_vocabulary_everywhere(tmp_path):
    from cubicml_lab import datasets, store
    from cubicml_lab.search import base
    from cubicml_lab.surrogate import feasibility

    assert STATUSES == ("pending", "running", *FINISHED)
    assert FINISHED == ("ok", "oom", "failed", "timeout")
    assert store.STATUSES is STATUSES and store.FINAL_STATUSES is FINISHED
    assert base.STATUSES is FINISHED and feasibility.FINISHED is FINISHED
    assert datasets.FINISHED is FINISHED and store.Trial is Trial
    # the store file's CHECK constraint holds exactly this vocabulary
    s = store.TrialStore(tmp_path / "s.sqlite")
    s.create_campaign("c", workload="gpt")
    s.close()
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'trials'").fetchone()
    assert f"status IN {STATUSES!r}" in sql


def test_codec_round_trips_non_finite_floats_as_strict_json():
    value = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": "text"}, 3: None}
    text = dumps(value, sort_keys=True)

    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in JSON")

    parsed = json.loads(text, parse_constant=refuse)
    assert parsed == {"3": None, "a": "NaN", "b": ["Infinity", "-Infinity", 1.5],
                      "c": {"d": "text"}}
    back = restore(parsed)
    assert math.isnan(back["a"]) and back["b"][:2] == [math.inf, -math.inf]
    assert json_safe((1, 2.0)) == [1, 2.0] and restore("NaNo") == "NaNo"


def test_trial_duration():
    t = Trial(campaign="c", id=1, config={}, status="ok", metrics={}, hardware={},
              workload="gpt", workload_version="1", created_at=0.0, started_at=10.0,
              ended_at=12.5, error=None)
    assert t.duration_s == 2.5
    assert Trial(**{**t.__dict__, "ended_at": None}).duration_s is None


def test_failure_result_keeps_the_spec_and_describes_this_host_as_a_cpu():
    r = failure_result({"workload": "gpt", "config": {"d_model": 8}, "device": "cuda:1"},
                       "timeout", "killed after 5 s", wall_s=5.0)
    assert r.status == "timeout" and r.metrics == {} and r.config == {"d_model": 8}
    assert r.hardware["device"] == "cuda:1" and r.wall_s == 5.0 and r.workload == "gpt"


def test_importing_trials_loads_no_torch():
    code = "import sys, cubicml_lab.trials; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_trial_result_json_round_trip_with_nan_and_inf() -> None:
    res = TrialResult(status="ok", metrics={"step_time_s": 0.25, "mfu": math.nan,
                                            "step_time_rel_ci": math.inf},
                      hardware={"hostname": "h", "gpu": {"name": "none"}}, workload="gpt",
                      workload_version="1", config={"d_model": 64, "compile": False}, wall_s=3.5)
    text = res.to_json()

    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in JSON")

    json.loads(text, parse_constant=refuse)  # strict JSON
    back = TrialResult.from_json(text)
    assert math.isnan(back.metrics["mfu"]) and back.metrics["step_time_rel_ci"] == math.inf
    assert back.metrics["step_time_s"] == 0.25
    assert back.to_dict() | {"metrics": {}} == res.to_dict() | {"metrics": {}}
    assert TrialResult.from_dict(res.to_dict()).config == {"d_model": 64, "compile": False}


def test_trial_result_checks_its_status() -> None:
    assert FINISHED == ("ok", "oom", "failed", "timeout")
    with pytest.raises(MeasurementError, match="'crashed'"):
        TrialResult(status="crashed", metrics={}, hardware={})
    with pytest.raises(MeasurementError, match="colour"):
        TrialResult.from_dict({"status": "ok", "metrics": {}, "hardware": {}, "colour": 1})
    with pytest.raises(MeasurementError, match="no 'status'"):
        TrialResult.from_json("[1, 2]")


def test_trial_result_shows_itself():
    ok = TrialResult(status="ok", metrics={"tokens_per_s": 12345.6, "step_time_s": 0.01,
                                           "peak_mem_gib": 0.5, "throughput_rel_ci": 0.014},
                     hardware={}, workload="gpt", config={"micro_batch": 4})
    assert "tokens_per_s: 12345.6" in str(ok) and "micro_batch=4" in str(ok)
    assert "throughput_rel_ci: 0.014" in str(ok)  # the figure's own CI, beside the figure
    assert "12,346" in ok._repr_html_() and "gpt" in ok._repr_html_()
    one = TrialResult(status="ok", metrics={**ok.metrics, "throughput_rel_ci": float("nan"),
                                            "windows": 1.0}, hardware={})
    assert "throughput_rel_ci: unknown (1 window: too few for a CI)" in str(one)
    assert "unknown (1 window:" in one._repr_html_() and "nan" not in one._repr_html_()
    flagged = TrialResult(status="ok", metrics={**one.metrics, "contended": 1.0,
                                                "contended_windows": 1.0}, hardware={})
    assert "contended: This measurement shared the CPU with other processes (on " in str(flagged)
    assert "1 window timed beside them): its figure is flagged" in str(flagged)
    assert "  drift:" not in str(flagged) and "  processes:" not in str(flagged)
    # a drift-corrected figure says how it came from the raw one; a repeated trial shows each
    # of its processes and which one it kept
    both = TrialResult(status="ok", hardware={"processes": [
        {"throughput": 8000.0, "kept": False}, {"throughput": 8400.0, "kept": True}]},
        metrics={"tokens_per_s": 8400.0, "throughput": 8400.0, "throughput_raw": 6000.0,
                 "drift_corrected": 1.0})
    assert ("drift: corrected x1.40 from the raw 6,000/s to the machine's nominal speed (its "
            "drift reference ran slower than nominal)") in str(both)
    assert "processes: 2 fresh processes: 8,000, 8,400 (kept); 5.0% apart" in str(both)
    assert "8,400 (kept)" in both._repr_html_()
    raw = TrialResult(status="ok", metrics={**both.metrics, "drift_corrected": 0.0},
                      hardware={"processes": [{"throughput": 8400.0, "kept": True}]})
    assert "drift" not in str(raw) and "processes" not in str(raw)
    bad = TrialResult(status="oom", metrics={}, hardware={}, error="Traceback\nMemoryError: <x>")
    assert "MemoryError: &lt;x&gt;" in bad._repr_html_() and "error: MemoryError" in str(bad)


def test_a_stored_trial_shows_itself_as_a_result_does():
    from cubicml_lab.trials import Trial

    t = Trial(campaign="c", id=7, config={"micro_batch": 4}, status="ok", workload="gpt",
              metrics={"tokens_per_s": 9000.0, "throughput": 9000.0, "throughput_raw": 9900.0,
                       "drift_corrected": 1.0, "contended": 1.0, "contended_windows": 3.0},
              hardware={}, workload_version="1", created_at=0.0, started_at=10.0,
              ended_at=22.5, error=None)
    text = str(t)
    assert text.startswith("Trial 7 of 'c' · gpt") and "micro_batch=4" in text
    assert "3 windows timed beside them): its figure is flagged" in text and "duration_s: 12.5" in text
    assert "drift: corrected x0.91 from the raw 9,900/s" in text and "ran faster than" in text
    assert "Trial 7 · c · gpt" in t._repr_html_() and "9,000" in t._repr_html_()
    queued = Trial(**{**t.__dict__, "status": "queued", "metrics": {}, "started_at": None})
    assert "duration_s" not in str(queued) and "status: queued" in str(queued)


def test_is_contended_reads_the_guards_flag_and_nothing_else():
    from cubicml_lab.trials import is_contended

    assert is_contended({"contended": 1.0}) and is_contended({"contended": True})
    assert not any(is_contended(m) for m in ({}, {"contended": 0.0}, {"contended": None},
                                            {"contended": float("nan")}, {"contended": "yes"}))
