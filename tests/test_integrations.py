"""cubicml_lab.integrations: the Hugging Face and Lightning callbacks report each optimizer step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cubicml_lab import report

ROOT = Path(__file__).resolve().parents[1]


def _steps(path: Path) -> tuple[list[dict], list[dict]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return ([x for x in lines if x["event"] == "step"],
            [x for x in lines if x["event"] == "memory"])


@pytest.mark.parametrize("module, package", [("hf", "transformers"), ("lightning", "lightning")])
def test_a_missing_trainer_says_which_extra(module: str, package: str) -> None:
    code = (f"import sys; sys.modules[{package!r}] = None\n"
            "sys.modules['pytorch_lightning'] = None\n"
            f"try:\n    import cubicml_lab.integrations.{module}\n"
            "except ImportError as err:\n    print(type(err).__name__, err)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.startswith("DependencyError"), out.stderr
    assert f"pip install 'cubicml-lab[{module}]'" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("count_tokens", [False, True])
def test_hf_trainer_reports_each_optimizer_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                count_tokens: bool) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from cubicml_lab.integrations.hf import ReportCallback

    path = tmp_path / "m.jsonl"
    monkeypatch.setenv(report.ENV_VAR, str(path))
    ids = torch.randint(0, 128, (32, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": x, "labels": x} for x in ids]
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=1,
                                       n_head=2))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
                             gradient_accumulation_steps=3, max_steps=4, report_to=[],
                             save_strategy="no", use_cpu=True, disable_tqdm=True,
                             include_num_input_tokens_seen="all" if count_tokens else "no")
    callback = ReportCallback(seq_len=None if count_tokens else 16, memory_every=0)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    steps, memory = _steps(path)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["samples"] == 2 * 3 and s["tokens"] == 2 * 3 * 16 for s in steps)
    assert len(memory) == 4 and all(m["peak_gib"] > 0 for m in memory)  # steps 1-3 and the end
    assert "m.jsonl" in repr(callback) and callback.steps == 4


@pytest.mark.slow
def test_lightning_reports_each_optimizer_step(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning as L
    import torch

    from cubicml_lab.integrations.lightning import ReportCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(64, 8)

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            return self.embed(batch).pow(2).mean()

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.1)

    path = tmp_path / "m.jsonl"
    monkeypatch.setenv(report.ENV_VAR, str(path))
    ids = torch.randint(0, 64, (40, 12))
    loader = torch.utils.data.DataLoader(ids, batch_size=4)
    callback = ReportCallback(memory_every=2)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=3, accumulate_grad_batches=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.callbacks.append(callback)
    trainer.fit(Tiny(), loader)
    steps, memory = _steps(path)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["samples"] == 8 and s["tokens"] == 8 * 12 for s in steps)  # 2 batches of 4
    assert all(isinstance(s["loss"], float) and s["loss"] > 0 for s in steps)
    assert len(memory) == 4  # steps 1-3, the end


def test_batch_counts() -> None:
    import torch

    from cubicml_lab.integrations.lightning import batch_counts

    assert batch_counts({"input_ids": torch.zeros(4, 16, dtype=torch.long),
                         "pixel": torch.zeros(4, 3)}) == (4, 64)
    assert batch_counts([torch.zeros(5, 7), torch.zeros(5)]) == (5, None)
    assert batch_counts([torch.zeros(5, 7)], seq_len=7) == (5, 35)
    assert batch_counts("no tensor") == (None, None)


@pytest.mark.slow
def test_hf_trainer_under_torchrun_counts_every_rank() -> None:
    """Two ranks (DDP over gloo): each reports its per-device batch x accumulation, the lab adds
    them up: a step is per-device batch x accumulation x world size sequences."""
    from cubicml_lab.launch import Torchrun
    from cubicml_lab.workloads import Command

    job = Command("hf-gpt2", argv=[sys.executable, str(ROOT / "examples" / "hf_trainer_gpt2.py"),
                                   "--batch={batch}", "--grad-accum={accum}", "--steps=40",
                                   "--seq-len=32"], units="tokens", timeout_s=240)
    spec = {"workload": job.name, "config": {"batch": 2, "accum": 3}, "command": job.to_spec(),
            "measure": {"max_time_s": 3.0, "min_steps": 5, "target_rel_ci": 0.05,
                        "warmup_max_steps": 5, "warmup_max_s": 1.0}}
    res = Torchrun(nproc_per_node=2, timeout_s=300).run(spec)
    assert res.status == "ok", res.error
    m = res.metrics
    assert m["ranks_reported"] == 2 and m["units_per_step"] == 2 * 3 * 2 * 32
    assert m["tokens_per_s"] == pytest.approx(m["units_per_step"] / m["step_time_s"])
