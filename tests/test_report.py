"""cubicml_lab.report: the job-side reporter (its lines, a no-op outside the lab, processes
sharing a file)."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cubicml_lab import report
from cubicml_lab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    env.pop("RANK", None)
    env.update(extra)
    return env


def test_doctests() -> None:
    env = os.environ.pop(report.ENV_VAR, None)
    try:
        result = doctest.testmod(report, optionflags=doctest.ELLIPSIS)
    finally:
        if env is not None:
            os.environ[report.ENV_VAR] = env
    assert result.attempted >= 5 and result.failed == 0


def test_inactive_is_a_no_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(report.ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    assert not report.active()
    assert report.step(tokens=1, loss="not even checked") is False
    assert report.memory() is False
    assert list(tmp_path.iterdir()) == []
    assert "inactive" in repr(report) and report.ENV_VAR in repr(report)


def test_step_and_memory_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv(report.ENV_VAR, str(path))
    monkeypatch.setenv("RANK", "3")
    r = report.Reporter()
    assert r.active() and r.path == str(path)
    assert r.step(tokens=4096, samples=8.0, loss=2.5, step=7, lr=3e-4, grad_norm=1)
    assert r.step(loss=float("nan"))
    assert r.memory(1.25) and r.memory()
    steps = _lines(path)
    assert [x["event"] for x in steps] == ["step", "step", "memory", "memory"]
    first = steps[0]
    assert first == {**first, "v": 1, "rank": 3, "step": 7, "tokens": 4096, "samples": 8,
                     "loss": 2.5, "lr": 3e-4, "grad_norm": 1}
    assert isinstance(first["samples"], int)
    assert first["t"] <= steps[1]["t"] and abs(first["wall"] - steps[1]["wall"]) < 60
    assert steps[1]["tokens"] is None and steps[1]["loss"] != steps[1]["loss"]  # NaN kept
    assert steps[2]["peak_gib"] == 1.25
    assert 0.01 < steps[3]["peak_gib"] < 64  # this process's resident high-water mark
    assert "as rank 3; 2 steps reported" in repr(r)
    r.close()


@pytest.mark.parametrize("kwargs, words", [
    ({"tokens": -1}, "tokens must be a whole number"),
    ({"samples": 2.5}, "samples must be a whole number"),
    ({"tokens": True}, "tokens must be a whole number"),
    ({"loss": "low"}, "is not a number"),
    ({"lr": [1]}, "is not a number"),
    ({"rank": 1}, "is a field of every line"),
])
def test_bad_values_are_refused(tmp_path: Path, kwargs: dict, words: str) -> None:
    r = report.Reporter(tmp_path / "m.jsonl")
    with pytest.raises(ConfigError, match=words) as err:
        r.step(**kwargs)
    assert err.value.hint
    assert not (tmp_path / "m.jsonl").exists() or (tmp_path / "m.jsonl").read_text() == ""


def test_path_change_reopens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = report.Reporter()
    for name in ("a.jsonl", "b.jsonl"):
        monkeypatch.setenv(report.ENV_VAR, str(tmp_path / name))
        r.step(step=1)
    assert len(_lines(tmp_path / "a.jsonl")) == len(_lines(tmp_path / "b.jsonl")) == 1
    r.close()


def test_import_is_standard_library_only() -> None:
    code = ("import sys; from cubicml_lab import report; "
            "print(sorted(m for m in ('torch', 'numpy', 'pandas', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=_child_env(), capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


_WRITER = textwrap.dedent("""
    import sys
    from cubicml_lab import report
    n = int(sys.argv[1])
    for i in range(n):
        report.step(step=i, tokens=i * 128, samples=i, loss=1.0 / (i + 1))
    report.memory()
    print(report.current().steps)
""")


def test_a_subprocess_writes_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    out = subprocess.run([sys.executable, "-c", _WRITER, "50"], capture_output=True, text=True,
                         env=_child_env(**{report.ENV_VAR: str(path), "RANK": "1"}),
                         check=True, timeout=60)
    assert out.stdout.strip() == "50"
    lines = _lines(path)
    assert [x["step"] for x in lines[:-1]] == list(range(50))
    assert {x["rank"] for x in lines} == {1}
    assert lines[-1]["event"] == "memory" and lines[-1]["peak_gib"] > 0


def test_two_processes_append_without_mixing_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    n = 3000
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(n)], stdout=subprocess.PIPE,
                              env=_child_env(**{report.ENV_VAR: str(path), "RANK": str(rank)}))
             for rank in (0, 1)]
    for p in procs:
        assert p.wait(timeout=120) == 0
        p.stdout.close()
    lines = _lines(path)  # every line parses: none was torn or interleaved
    assert len(lines) == 2 * (n + 1)
    for rank in (0, 1):
        mine = [x["step"] for x in lines if x["rank"] == rank and x["event"] == "step"]
        assert mine == list(range(n))  # each process's lines in its own order


@pytest.mark.gpu
def test_memory_reads_cudas_peak_where_cuda_is_in_use(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (run on a machine with an NVIDIA GPU)")
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # 0.25 GiB
    r = report.Reporter(tmp_path / "m.jsonl")
    r.memory()
    peak = _lines(tmp_path / "m.jsonl")[0]["peak_gib"]
    assert peak == pytest.approx(torch.cuda.max_memory_allocated() / 2**30) and peak >= 0.25
    del x
