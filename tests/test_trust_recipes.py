"""Recipes run programs only with consent, and no value becomes script text (docs/threat-model.md).

A campaign file is a recipe when it names programs: a command, a launcher's own interpreter,
environment variables, Slurm setup lines or sbatch options. Such a file is refused with the
list of what it would run unless the user consents; values headed for the sbatch script are
refused when they hold a control character and quoted as one word; every file and size is
bounded when it is loaded; Ctrl-C ends every subcommand with exit code 130 and one line.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cubicml_lab as cml
from cubicml_lab.campaign.files import FILE_KEYS
from cubicml_lab.errors import ConfigError
from cubicml_lab.launch import LocalPool, Slurm, Subprocess, Torchrun
from cubicml_lab.launch.base import sbatch_line

CLI = [sys.executable, "-m", "cubicml_lab.cli"]
SPACE = cml.Space([cml.PowerOfTwo("micro_batch", 1, 4)])
TINY = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32, "vocab": 128}
FAST = {"max_time_s": 0.3, "warmup_max_s": 0.5, "min_steps": 3}
HOSTILE = ["a\nb", "a\rb", "a\x00b", "a\u2028b", "a\u2029b", "a\x85b", "a\x1bb", "a\x0bb"]
#: Values without a control character that a shell would still read as code.
SHELL_WORDS = ["a;b", "$(touch /tmp/pwned)", "`id`", "a'b", 'a"b', "a b", "x && y", "-x", "\\"]
_SETTINGS = settings(max_examples=40, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


def has_control(text: str) -> bool:
    """The oracle: what would break a script line (tab stays on its line)."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") and c != "\t" for c in text)


def file_data(folder: Path, launcher: dict | None = None, **more) -> dict:
    data = {"name": "trust", "workload": "gpt", "space": SPACE.to_dict(), "fixed": TINY,
            "measure_options": FAST, "searcher": {"kind": "random", "seed": 0},
            "store": str(folder / "lab.sqlite"), "budget": 1, **more}
    if launcher is not None:
        data["launcher"] = launcher
    return data


def write(folder: Path, data: dict, name: str = "camp.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def sigint_as_a_terminal() -> None:
    """In the child: take SIGINT as a terminal delivers it (a pytest in the background passes
    it on ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


# -- 2. consent for every recipe part ----------------------------------------------------------
RECIPES = [  # (launcher description, what the refusal must list)
    ({"kind": "subprocess", "python": "./anything.sh"},
     ["launcher.python: runs the trials with the interpreter ./anything.sh"]),
    ({"kind": "subprocess", "env": {"PYTHONPATH": "/tmp/evil dir", "OMP_NUM_THREADS": "2"}},
     ["launcher.env: PYTHONPATH='/tmp/evil dir'", "launcher.env: OMP_NUM_THREADS=2"]),
    ({"kind": "torchrun", "nproc_per_node": 2, "python": "/opt/py"},
     ["launcher.python: runs the trials with the interpreter /opt/py"]),
    ({"kind": "local_pool", "devices": [0], "env": {"LD_PRELOAD": "/x.so"}},
     ["launcher.env: LD_PRELOAD=/x.so"]),
    ({"kind": "repeated", "launcher": {"kind": "subprocess", "env": {"A": "$(id)"}}},
     ["launcher.launcher.env: A='$(id)'"]),
    ({"kind": "slurm", "setup": ["module load cuda", "source ~/env.sh"],
      "extra_sbatch": {"constraint": "a100;x", "exclusive": True}},
     ["launcher.setup: runs the shell line module load cuda",
      "launcher.setup: runs the shell line source ~/env.sh",
      "launcher.extra_sbatch: #SBATCH --constraint='a100;x'",
      "launcher.extra_sbatch: #SBATCH --exclusive"]),
]


@pytest.mark.parametrize(("launcher", "listed"), RECIPES)
def test_a_file_naming_programs_is_refused_with_what_it_would_run(tmp_path, launcher, listed):
    path = write(tmp_path, file_data(tmp_path, launcher))
    with pytest.raises(ConfigError, match="names programs to run") as info:
        cml.Campaign.from_yaml(path)
    lines = info.value.message.splitlines()
    assert sorted(line.strip() for line in lines[1:]) == sorted(listed)  # these, nothing else
    assert "--allow-programs" in info.value.hint and "allow_commands=True" in info.value.hint
    assert not (tmp_path / "lab.sqlite").exists()  # refused before the store is made
    camp = cml.Campaign.from_yaml(path, allow_commands=True)
    assert sorted(camp.launcher.recipe()) == sorted(listed)


@pytest.mark.parametrize("launcher", [
    Subprocess(timeout_s=60), LocalPool(1, devices=[0]), Torchrun(2),
    Slurm(partition="gpu", account="lab", mem_gib=8, nodes=2, nproc_per_node=4),
    cml.launch.Repeated(Subprocess(), processes=2), None])
def test_a_file_written_for_a_default_launcher_loads_without_consent(tmp_path, launcher):
    camp = cml.Campaign("plain", SPACE, workload="gpt", store=cml.TrialStore(tmp_path / "l.db"),
                        **({} if launcher is None else {"launcher": launcher}))
    back = cml.Campaign.from_yaml(camp.to_yaml(tmp_path / "plain.yaml", budget=2))
    assert back.launcher.describe() == camp.launcher.describe() and back.launcher.recipe() == []


_NAMES = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)
_CLEAN = st.text(st.characters(blacklist_categories=("Cc", "Zl", "Zp", "Cs")), min_size=1,
                 max_size=16)


@_SETTINGS
@given(env=st.dictionaries(_NAMES, _CLEAN, max_size=3), setup=st.lists(_CLEAN, max_size=3),
       sbatch=st.dictionaries(st.from_regex(r"[a-z][a-z_-]{0,8}", fullmatch=True),
                              st.one_of(_CLEAN, st.integers(0, 99), st.just(True)), max_size=3),
       python=st.one_of(st.none(), _CLEAN))
def test_every_random_recipe_part_is_in_the_refusal(tmp_path, env, setup, sbatch, python):
    launcher = {"kind": "slurm", "setup": setup, "extra_sbatch": sbatch}
    inner = {"kind": "subprocess", "env": env, "python": python}
    for description in (launcher, inner):
        folder = Path(tempfile.mkdtemp(dir=tmp_path))
        path = write(folder, file_data(folder, description))
        parts = [*(f"launcher.env: {k}={shlex.quote(v)}" for k, v in env.items()),
                 *([] if python is None else [
                     f"launcher.python: runs the trials with the interpreter "
                     f"{shlex.quote(python)}"])] if description is inner else \
            [*(f"launcher.setup: runs the shell line {line}" for line in setup),
             *(f"launcher.extra_sbatch: {sbatch_line(k, v)}" for k, v in sbatch.items())]
        if not parts:
            assert cml.Campaign.from_yaml(path).launcher.recipe() == []
            continue
        with pytest.raises(ConfigError) as info:
            cml.Campaign.from_yaml(path)
        listed = info.value.message.splitlines()[1:]
        assert sorted(line.strip() for line in listed) == sorted(p.strip() for p in parts)


def pythonpath_hook(folder: Path, marker: Path) -> dict:
    """A launcher whose ``PYTHONPATH`` makes every Python it starts run a ``sitecustomize.py``
    that leaves ``marker``."""
    hook = folder / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('ran\\n')\n")
    package_root = str(Path(cml.__file__).resolve().parents[1])
    return {"kind": "subprocess", "env": {"PYTHONPATH": f"{hook}{os.pathsep}{package_root}"}}


def test_the_cli_refuses_an_interpreter_or_pythonpath_and_runs_them_only_with_consent(tmp_path):
    refused, consented = tmp_path / "refused", tmp_path / "consented"
    refused.mkdir(), consented.mkdir()
    script = refused / "anything.sh"
    script.write_text(f"#!/bin/sh\necho ran >> {shlex.quote(str(refused / 'marker'))}\n")
    script.chmod(0o755)
    by_env = pythonpath_hook(refused, refused / "marker")
    files = [write(refused, file_data(refused, {"kind": "subprocess", "python": "./anything.sh"}),
                   "py.yaml"), write(refused, file_data(refused, by_env), "env.yaml"),
             write(consented, file_data(consented, pythonpath_hook(consented,
                                                                   consented / "marker")))]
    procs = [subprocess.Popen([*CLI, "run", str(path), "--no-progress", *flag], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=path.parent,
                              preexec_fn=sigint_as_a_terminal)
             for path, flag in zip(files, ([], [], ["--allow-programs"]))]
    for proc, shown in zip(procs, ("interpreter ./anything.sh",
                                   f"PYTHONPATH={by_env['env']['PYTHONPATH']}")):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and "Traceback" not in err, err
        assert "names programs to run" in err and shown in err and "--allow-programs" in err
    assert not (refused / "marker").exists() and not (refused / "lab.sqlite").exists()
    deadline = time.monotonic() + 120  # consent given: the hook runs in the trial's Python
    while not (consented / "marker").exists():
        assert procs[2].poll() is None and time.monotonic() < deadline, procs[2].communicate()
        time.sleep(0.02)
    procs[2].send_signal(signal.SIGINT)  # that is all this test needs of the trial
    procs[2].communicate(timeout=120)


# -- 3. no value becomes script text ---------------------------------------------------------
def sbatch_options(script: str) -> dict[str, str]:
    """Each ``#SBATCH`` line read back as sbatch reads it: one ``--key[=value]`` word."""
    found = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH"):
            words = shlex.split(line[len("#SBATCH"):])
            assert len(words) == 1 and words[0].startswith("--"), line
            key, _, value = words[0][2:].partition("=")
            assert key not in found, line
            found[key] = value
    return found


def test_hostile_values_never_add_a_line_to_the_sbatch_script(tmp_path):
    plain = Slurm(partition="p", account="p", qos="p", folder=tmp_path / "sl", setup=["true"],
                  extra_sbatch={"constraint": "p", "comment": "p"})
    baseline = plain.sbatch_script().splitlines()
    for word in SHELL_WORDS:
        slurm = Slurm(partition=word, account=word, qos=word, folder=tmp_path / f"s {word}",
                      extra_sbatch={"constraint": word, "comment": word}, setup=["true"])
        script = slurm.sbatch_script()
        assert len(script.splitlines()) == len(baseline), script
        options = sbatch_options(script)
        for key in ("partition", "account", "qos", "constraint", "comment"):
            assert options[key] == word  # the whole value, one quoted word
        assert options["output"].startswith(f"{slurm.folder}/")
        [srun] = [shlex.split(line) for line in script.splitlines() if line.startswith("srun")]
        assert srun[:2] == ["srun", "--unbuffered"] and srun[-1] == f"{slurm.folder}/%j"
        assert set(options) == set(sbatch_options("\n".join(baseline)))
    for bad in HOSTILE:
        for field in ("partition", "account", "qos", "folder"):
            with pytest.raises(ConfigError, match=f"Slurm {field} = .*control character"):
                Slurm(**{field: bad})
        with pytest.raises(ConfigError, match=r"extra_sbatch\['constraint'\].*control"):
            Slurm(extra_sbatch={"constraint": bad})
        with pytest.raises(ConfigError, match=r"setup\[1\].*control character"):
            Slurm(setup=["ok", bad])
        with pytest.raises(ConfigError, match="not an sbatch option name"):
            Slurm(extra_sbatch={f"constraint{bad}": "x"})
        with pytest.raises(ConfigError, match=r"env\['A'\].*control character"):
            Subprocess(env={"A": bad})
        with pytest.raises(ConfigError, match="master_addr.*control character"):
            Torchrun(2, nnodes=2, master_addr=bad, master_port=29500)
    for key in ("x=1 --wrap=id", "-x", "a b", "a;b", ""):
        with pytest.raises(ConfigError, match="not an sbatch option name"):
            Slurm(extra_sbatch={key: "x"})


@_SETTINGS
@given(field=st.sampled_from(["partition", "account", "qos", "constraint", "setup", "folder"]),
       value=st.one_of(st.text(min_size=1, max_size=20),
                       st.text(st.sampled_from(list("a;$()`'\"\\ \t\n\r\x00\x0b\x0c\x1c\x85"
                                                    "\u2028\u2029|&<>#=")),
                               min_size=1, max_size=12)))
def test_any_text_in_any_sbatch_field_is_refused_or_stays_one_word(tmp_path, field, value):
    def build(text: str) -> Slurm:
        kwargs = {"folder": tmp_path / "sl", "setup": ["true"]}
        if field == "constraint":
            kwargs["extra_sbatch"] = {"constraint": text}
        elif field == "setup":
            kwargs["setup"] = ["true", text]
        elif field == "folder":
            kwargs["folder"] = f"{tmp_path}/{text}"
        else:
            kwargs[field] = text
        return Slurm(**kwargs)

    if has_control(value):
        with pytest.raises(ConfigError, match="control character"):
            build(value)
        return
    reference = build("plain").sbatch_script().splitlines()
    script = build(value).sbatch_script()
    assert len(script.splitlines()) == len(reference), script  # no line added or lost
    options = sbatch_options(script)
    if field in ("partition", "account", "qos", "constraint"):
        assert options[field] == value
    elif field == "setup":
        assert script.splitlines()[reference.index("plain")] == value
    else:
        assert options["output"].startswith(f"{Path(f'{tmp_path}/{value}')}/")


# -- 4. bounded and checked at load ----------------------------------------------------------
BOMB = "[&a [x, x, x, x, x, x, x, x, x, x], " + ", ".join(
    f"&{n} [{', '.join([f'*{p}'] * 10)}]" for p, n in zip("abcdefgh", "bcdefghi")) + "]"


@pytest.mark.parametrize("key", FILE_KEYS)
def test_an_alias_bomb_in_any_field_fails_fast(tmp_path, key):
    data = file_data(tmp_path, {"kind": "inprocess"}, command={"argv": ["true"]})
    text = "\n".join(yaml.safe_dump({k: v}).rstrip() for k, v in data.items() if k != key)
    path = tmp_path / "bomb.yaml"
    path.write_text(f"{text}\n{key}: {BOMB}\n")
    start = time.monotonic()
    with pytest.raises(ConfigError, match="expands to more than 100,000 nodes"):
        cml.Campaign.from_yaml(path, allow_commands=True)
    assert time.monotonic() - start < 5


def test_deep_nesting_is_a_config_error_naming_the_limit(tmp_path):
    nested = {"kind": "subprocess"}
    for _ in range(30):
        nested = {"kind": "repeated", "launcher": nested}
    path = write(tmp_path, file_data(tmp_path, nested))
    with pytest.raises(ConfigError, match="nest more than 4 launchers deep"):
        cml.Campaign.from_yaml(path)
    path.write_text("name: " + "[" * 500_000 + "]" * 500_000 + "\n")  # within 1 MiB
    start = time.monotonic()
    deep = r"not valid YAML \(nested too deeply to read \(\[ and \{ more than 100 deep\)"
    with pytest.raises(ConfigError, match=deep):
        cml.Campaign.from_yaml(path)
    assert time.monotonic() - start < 2


@pytest.mark.parametrize(("make", "words"), [
    (lambda: Torchrun(nproc_per_node=10**9), r"nproc_per_node = 1000000000 is outside 1\.\..* "
                                             r"CPU core.*GPU"),
    (lambda: Torchrun(2, nnodes=10**9, master_addr="n0", master_port=29500), "nnodes"),
    (lambda: Torchrun(10**9, nnodes=2, master_addr="n0", master_port=29500),
     "outside 1..1,024 .the most one cluster node may run"),
    (lambda: LocalPool(nproc_per_node=10**9), "LocalPool nproc_per_node.*CPU core"),
    (lambda: LocalPool(devices_per_trial=10**9), "LocalPool devices_per_trial.*CPU core"),
    (lambda: LocalPool(devices=range(10**12)), "more than 1024 ids"),
    (lambda: LocalPool(devices=[0, 10**9]), "distinct ints from 0 to 1023"),
    (lambda: Slurm(nodes=10**9), "Slurm nodes"),
    (lambda: Slurm(nproc_per_node=10**9), "Slurm nproc_per_node"),
    (lambda: Slurm(mem_gib=float("inf")), "mem_gib"),
    (lambda: Slurm(setup=["x"] * 10**6), "setup"),
])
def test_sizes_are_bounded_when_the_launcher_is_built(make, words):
    start = time.monotonic()
    with pytest.raises(ConfigError, match=words):
        make()
    assert time.monotonic() - start < 2


def test_files_that_are_not_regular_are_refused_at_once(tmp_path):
    """A campaign file on /dev/zero or a FIFO, a store or an export target that is a FIFO: each
    command exits 2 with one error, where it hung."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    os.mkfifo(tmp_path / "out.csv")
    store = tmp_path / "lab.sqlite"
    cml.TrialStore(store).close()
    runs = [["run", "/dev/zero"], ["run", str(fifo)],
            ["export", "c", str(tmp_path / "out.csv"), "--store", str(store)],
            ["report", "c", "--store", str(fifo)]]
    procs = [subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path) for args in runs]
    for args, proc in zip(runs, procs):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, (args, err)
        assert "not a regular file" in err and "Traceback" not in err, (args, err)
    with pytest.raises(ConfigError, match="is a FIFO"):
        cml.Campaign.from_yaml(fifo)
    with pytest.raises(ConfigError, match="is a directory"):
        cml.Campaign.from_yaml(tmp_path)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(2 << 20)
    with pytest.raises(ConfigError, match="more than the 1,048,576 allowed"):
        cml.Campaign.from_yaml(big)
    with pytest.raises(ConfigError, match="store .* not a regular file"):
        cml.Campaign.from_yaml(write(tmp_path, {**file_data(tmp_path), "store": str(fifo)}))


# -- Ctrl-C ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Path:
    """A store with one campaign of 8,000 trials: report and export take a while over it."""
    folder = tmp_path_factory.mktemp("big")
    raw = folder / "raw.csv"
    with open(raw, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["campaign", "status", "config"])
        out.writerows(["c", "ok", json.dumps({"micro_batch": i})] for i in range(8000))
    with cml.TrialStore(folder / "lab.sqlite") as store:
        store.import_(raw)
    return folder / "lab.sqlite"


def _inside_main(pid: int, store: Path) -> bool:
    """Whether the CLI process ``pid`` is inside ``main``: it has its store open, or has loaded
    NumPy (which importing the CLI does not)."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(store)
                   for fd in os.listdir(f"/proc/{pid}/fd")) or \
            "numpy" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_ends_every_subcommand_with_130_and_one_line(tmp_path, big_store):
    camp_file = write(tmp_path, file_data(tmp_path, {"kind": "inprocess"}, budget=50))
    jobs = {"demo": (["demo", "--store", str(tmp_path / "demo.sqlite"), "--out",
                      str(tmp_path / "runs"), "--launcher", "inprocess", "--no-progress"],
                     tmp_path / "demo.sqlite"),
            "run": (["run", str(camp_file), "--no-progress"], tmp_path / "lab.sqlite"),
            "report": (["report", "c", "--store", str(big_store)], big_store),
            "export": (["export", "c", str(tmp_path / "c.csv"), "--store", str(big_store)],
                       big_store)}
    procs = {name: subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, text=True,
                                    stderr=subprocess.PIPE, cwd=tmp_path,
                                    preexec_fn=sigint_as_a_terminal)
             for name, (args, _) in jobs.items()}
    waiting, deadline = dict(procs), time.monotonic() + 120
    while waiting:  # each gets SIGINT once it is inside the subcommand
        for name, proc in list(waiting.items()):
            if _inside_main(proc.pid, jobs[name][1]) or proc.poll() is not None:
                proc.send_signal(signal.SIGINT)
                del waiting[name]
        assert time.monotonic() < deadline, list(waiting)
        time.sleep(0.005)
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, (name, proc.returncode, err[-2000:])
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"cubicml-lab {name}: "), (name, err)
        assert "Traceback" not in err and "interrupted" in lines[0], (name, err)


def test_a_config_template_is_read_bounded_like_every_file(tmp_path):
    """A Command's config template: a FIFO is refused at once, a YAML alias bomb before it is
    built, each as a ConfigError naming config_file."""
    from cubicml_lab.workloads.config_files import load_config

    fifo = tmp_path / "train.yaml"
    os.mkfifo(fifo)  # reading it would block forever
    bomb = tmp_path / "bomb.yaml"
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]
    bomb.write_text("\n".join(rows) + "\n")
    for path, why in ((fifo, "not a regular file"), (bomb, "expands to more than")):
        with pytest.raises(ConfigError, match=why) as err:
            load_config(path)
        assert "config_file" in str(err.value)
