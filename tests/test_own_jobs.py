"""Real third-party training jobs as campaigns: a Hugging Face ``Trainer`` script and a
plain PyTorch loop using ``cubicml_lab.report``, each searched by a campaign of real trials under
the Subprocess launcher, with a memory limit under which the largest batch ends ``oom``, and the
lab's figure held against the job's own clock (its ``--own-timings`` file, warm-up excluded).

The jobs are the scripts users see in ``examples/``. Slow: each trial starts a fresh interpreter
that imports torch (and transformers), about 10-25 s a trial on a busy 2-core machine.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

import cubicml_lab as cml
from cubicml_lab.launch import Subprocess
from cubicml_lab.workloads import Command

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
#: Loose enough to keep a trial to a few seconds of timed steps on a shared CPU.
#: The lab stops a job warmup_max_s + max_time_s after its first step report at the latest.
MEASURE = {"max_time_s": 4.0, "min_steps": 5, "target_rel_ci": 0.05, "warmup_max_steps": 8,
           "warmup_max_s": 1.5}
#: RLIMIT_AS: importing torch and transformers and training a batch of 8 fit (peak resident
#: about 0.5 GiB); a batch of 256 sequences' logits (256 x 64 x 8192 floats, with their softmax
#: and gradient) do not: "can't allocate memory" in the job's stderr, which the lab reads as oom.
HF_LIMIT_GIB = 2.0
PLAIN_LIMIT_GIB = 1.5


def own_step_times(path: Path) -> list[float]:
    """The job's own seconds per optimizer step, in order (step 1 first)."""
    return [json.loads(line)["seconds"] for line in path.read_text().splitlines()]


def own_figure(result: cml.TrialResult, path: Path) -> float:
    """The job's own median step time over the steps the lab timed: the lab's first report
    starts its clock, its ``warmup_steps`` follow, then ``steps_timed`` steps."""
    m = result.metrics
    first = int(m["warmup_steps"]) + 1  # 0-based index of the lab's first timed step
    mine = sorted(own_step_times(path)[first:first + int(m["steps_timed"])])
    assert len(mine) >= 5, f"{path.name}: {len(mine)} own steps"
    return mine[len(mine) // 2]


def check_campaign(camp: cml.Campaign, own_dir: Path, own_name: str, largest: int,
                   package: str) -> list[float]:
    """The campaign's trials: at least 4, every one of the largest batch oom, every other ok
    with the job's record, its figure within 5% of the job's own clock. Returns the relative
    gaps."""
    trials = camp.store.trials(camp.name)
    assert len(trials) >= 4
    by_status = {t.id: (t.config["batch"], t.status) for t in trials}
    big = [t for t in trials if t.config["batch"] == largest]
    assert big and all(t.status == "oom" for t in big), by_status
    assert all("ran out of memory" in t.error and "allocate" in t.error for t in big)
    gaps = []
    for t in trials:
        if t.config["batch"] == largest:
            continue
        assert t.status == "ok", (by_status, t.error)
        job = t.hardware["job"]
        assert any(f"--batch={t.config['batch']}" == a for a in job["argv"])
        assert package in job["packages"]
        own = own_dir / own_name.format(**{k: str(v).lower() if isinstance(v, bool) else v
                                           for k, v in t.config.items()})  # as in the argv
        rel = t.metrics["step_time_s"] / own_figure(t, own) - 1
        gaps.append(rel)
        units = t.metrics.get("tokens_per_s", math.nan)
        assert units > 0 and math.isfinite(units)
    shown = [f"{100 * g:+.1f}%" for g in gaps]
    print(f"{camp.name}: the lab's step time against the job's own clock: {shown}")
    assert all(abs(g) < 0.05 for g in gaps), shown
    return gaps


@pytest.mark.slow
def test_a_hugging_face_trainer_campaign(tmp_path: Path) -> None:
    own = "hf-b{batch}-a{accum}-c{ckpt}-w{workers}.jsonl"
    job = Command("hf-gpt2", argv=[
        sys.executable, str(EXAMPLES / "hf_trainer_gpt2.py"), "--batch={batch}",
        "--grad-accum={accum}", "--grad-ckpt={ckpt}", "--workers={workers}", "--steps=60",
        "--vocab=8192", f"--own-timings={tmp_path}/{own}"], units="tokens", timeout_s=240)
    space = cml.Space([cml.Ordinal("batch", [1, 2, 4, 256]), cml.PowerOfTwo("accum", 1, 2),
                       cml.Bool("ckpt"), cml.Choice("workers", [0, 1])])
    searcher = cml.RandomSearch(space, seed=0)
    searcher.enqueue({"batch": 256, "accum": 1, "ckpt": False, "workers": 0})
    camp = cml.Campaign("hf", space, workload=job, searcher=searcher,
                        launcher=Subprocess(timeout_s=300, memory_limit_gib=HF_LIMIT_GIB),
                        store=cml.TrialStore(tmp_path / "lab.sqlite"), measure_options=MEASURE)
    camp.run(budget=4)  # the oom batch and three that run: each trial starts an interpreter
    check_campaign(camp, tmp_path, own, 256, "transformers")


@pytest.mark.slow
def test_a_plain_pytorch_loop_campaign(tmp_path: Path) -> None:
    own = "plain-b{batch}-a{accum}-w{width}.jsonl"
    job = Command("plain-lm", argv=[
        sys.executable, str(EXAMPLES / "plain_torch_report.py"), "--batch={batch}",
        "--grad-accum={accum}", "--width={width}", "--steps=300",
        f"--own-timings={tmp_path}/{own}"], units="tokens", timeout_s=240)
    space = cml.Space([cml.Ordinal("batch", [4, 8, 16, 1024]), cml.PowerOfTwo("accum", 1, 2),
                       cml.Choice("width", [64, 128])])
    searcher = cml.BayesianSearch(space, seed=0, n_init=3)  # the fourth trial is the GP's
    searcher.enqueue({"batch": 1024, "accum": 1, "width": 64})
    camp = cml.Campaign("plain", space, workload=job, searcher=searcher,
                        launcher=Subprocess(timeout_s=300, memory_limit_gib=PLAIN_LIMIT_GIB),
                        store=cml.TrialStore(tmp_path / "lab.sqlite"), measure_options=MEASURE)
    camp.run(budget=4)
    check_campaign(camp, tmp_path, own, 1024, "torch")
