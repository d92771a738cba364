"""The documentation site (mkdocs.yml, `make docs`): it builds strictly, and it has a page for
every public module, every notebook and the results and threat-model pages."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_roles():
    """docs/hooks/roles.py, the griffe extension that turns the docstrings' roles into links."""
    spec = importlib.util.spec_from_file_location("docs_roles", ROOT / "docs" / "hooks" / "roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_module_notebook_and_page_is_in_the_nav():
    import yaml

    import cubicml_lab as cml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages: list[str] = []
    stack = list(nav)
    while stack:
        item = stack.pop()
        value = item if isinstance(item, str) else next(iter(item.values()))
        stack.extend(value) if isinstance(value, list) else pages.append(value)
    public = [n for n in cml.__all__ if (ROOT / "cubicml_lab" / n).is_dir() or
              (ROOT / "cubicml_lab" / f"{n}.py").is_file()]
    assert sorted(f"api/{m}.md" for m in public) == sorted(p for p in pages if p.startswith("api/")
                                                          and p != "api/index.md")
    notebooks = sorted(f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks == sorted(p for p in pages if p.startswith("notebooks/"))
    for page in ("index.md", "results.md", "modules.md", "threat-model.md"):
        assert page in pages and (ROOT / "docs" / page).is_file(), page


def test_roles_link_what_exists_and_fail_on_what_does_not(tmp_path):
    import griffe

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent('''
        """See :class:`Thing`, :meth:`~pkg.Thing.go`, :class:`Missing` and :class:`torch.Tensor`.

        Example:
            >>> [1, 2][0]
            1
        """
        class Thing:
            """A thing."""
            def go(self, a, b):
                """Go.

                Args:
                    a, b: the two ends.
                """
    '''))
    roles = load_roles()
    module = griffe.load("pkg", search_paths=[str(tmp_path)], extensions=griffe.load_extensions(
        str(ROOT / "docs" / "hooks" / "roles.py")))
    doc = module.docstring.value
    assert '<autoref identifier="pkg.Thing" optional><code>Thing</code></autoref>' in doc
    assert '<autoref identifier="pkg.Thing.go" optional><code>go</code></autoref>' in doc
    assert "[`Missing`][Missing]" in doc  # a hard link: the strict build fails on it
    assert "`torch.Tensor`" in doc and "[`torch" not in doc
    assert "Examples:" in doc
    params = module["Thing.go"].docstring.value
    assert "a: the two ends." in params and "b: the two ends." in params
    assert roles.EXTERNAL >= {"torch", "pandas", "ValueError"}


@pytest.mark.slow
def test_site_builds_strictly(tmp_path):
    """`make docs`'s build (about 20 s of CPU) into a temporary folder: a broken link, a
    cross-reference to nothing, a docstring parameter that is not in the signature, or a nav
    entry without a page fails it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d",
                           str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "api/analytical/index.html", "api/search/index.html",
                 "notebooks/00_quickstart/index.html", "results/index.html",
                 "threat-model/index.html"):
        assert (site / page).is_file(), page
    home = (site / "index.html").read_text()
    assert "make demo" in home and "make docs" in home  # the README is the home page
    search = (site / "api" / "search" / "index.html").read_text()
    assert 'id="cubicml_lab.search.BayesianSearch"' in search
