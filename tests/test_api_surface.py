"""The public API as a user meets it: ``import cubicml_lab as cml`` and nothing else.

Each check runs in a fresh interpreter, so that no module another test imported hides a name that
does not resolve on its own, or a heavy import that a plain ``import cubicml_lab`` would pull.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The public modules, each an attribute of ``cml`` after a plain import.
MODULES = ["analytical", "campaign", "datasets", "errors", "hardware", "integrations", "launch",
           "plots", "report", "search", "space", "store", "surrogate", "timing", "trials",
           "widgets", "workloads"]

#: Names a module picks up by accident: its own imports and the typing helpers.
ACCIDENTAL = {"Any", "TYPE_CHECKING", "annotations", "importlib", "sys", "types", "warnings",
              "physics"}


def run_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (warnings as errors but the ones it catches); its last
    line of output is JSON."""
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:__main__", "-c", code],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_plain_import_is_light_and_dir_lists_only_the_public_api():
    out = run_python(
        "import json, sys\n"
        "import cubicml_lab as cml\n"
        "heavy = sorted(m for m in ('torch', 'botorch', 'gpytorch', 'pandas', 'matplotlib',\n"
        "                           'ipywidgets') if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'dir': dir(cml), 'all': list(cml.__all__)}))\n")
    assert out["heavy"] == [], f"import cubicml_lab pulled {out['heavy']}"
    names = out["dir"]
    assert names == sorted(out["all"])
    assert not [n for n in names if n.startswith("_")], names
    assert not ACCIDENTAL & set(names), ACCIDENTAL & set(names)
    assert {"Proposal", "Space", "Campaign", "TrialStore", "BayesianSearch", "measure"} <= set(names)
    assert set(MODULES) <= set(names)


def test_every_public_name_resolves_and_dir_stays_clean_once_loaded():
    out = run_python(
        "import json, types\n"
        "import cubicml_lab as cml\n"
        "kinds = {n: ('module:' + getattr(cml, n).__name__ if isinstance(getattr(cml, n),\n"
        "                                                           types.ModuleType) else 'obj')\n"
        "         for n in cml.__all__}\n"
        "print(json.dumps({'kinds': kinds, 'dir': dir(cml),\n"
        "                  'proposal': cml.Proposal.__module__}))\n")
    for name in MODULES:
        assert out["kinds"][name] == f"module:cubicml_lab.{name}"
    assert out["proposal"].startswith("cubicml_lab.search")
    # loading everything bound submodules such as _params and physics onto the package: dir()
    # still lists only the public API
    assert not [n for n in out["dir"] if n.startswith("_") or n in ACCIDENTAL], out["dir"]


def test_physics_is_a_deprecated_alias_that_names_analytical():
    out = run_python(
        "import json, warnings\n"
        "import cubicml_lab as cml\n"
        "from cubicml_lab import analytical\n"  # loads the physics package underneath
        "caught = []\n"
        "for how in ('attribute', 'from-import'):\n"
        "    with warnings.catch_warnings(record=True) as w:\n"
        "        warnings.simplefilter('always')\n"
        "        if how == 'attribute':\n"
        "            physics = cml.physics\n"
        "        else:\n"
        "            from cubicml_lab import physics\n"
        "    caught.append([(x.category.__name__, str(x.message)) for x in w])\n"
        "print(json.dumps({'caught': caught, 'same_model': physics.LLMTrainingModel is\n"
        "                  analytical.LLMTrainingModel, 'in_dir': 'physics' in dir(cml)}))\n")
    for warned in out["caught"]:
        assert warned, "cml.physics gave no warning"
        assert all(cat == "DeprecationWarning" for cat, _ in warned)
        assert "use cubicml_lab.analytical" in warned[0][1]
    assert out["same_model"]
    assert not out["in_dir"]


def test_analytical_is_the_name_the_examples_and_benchmarks_use():
    old = re.compile(r"cml\.physics\b|from cubicml_lab(\.physics)? import physics|"
                     r"cubicml_lab\.physics import")
    files = [*ROOT.glob("examples/**/*.py"), *ROOT.glob("benchmarks/**/*.py"), ROOT / "README.md"]
    offenders = [str(f.relative_to(ROOT)) for f in files if old.search(f.read_text())]
    assert offenders == []
