# cubicml-lab: `make demo` (set-up + a real co-design campaign on the CPU), `make lab` (JupyterLab
# on the notebooks), `make test` (what CI runs).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --quiet --disable-pip-version-check
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed
# Extra `jupyter lab` options: LAB_ARGS="--no-browser --port 8899 --IdentityProvider.token=abc"
LAB_ARGS ?=
# `make lab SMOKE=1`: every kernel of the lab runs with CUBICML_LAB_SMOKE=1 (the notebooks' tiny
# budgets: each runs in a minute or two, and says that its numbers are a smoke run)
SMOKE ?=

.PHONY: install demo lab test test-fast test-gpu lint-imports notebooks docs clean help

help:
	@echo "make demo       create .venv, install, run a real co-design campaign on the CPU (~4 min)"
	@echo "make lab        JupyterLab on notebooks/ with the cubicml-lab kernel (~10 s once installed)"
	@echo "make lab SMOKE=1  the same, every notebook with tiny budgets (CUBICML_LAB_SMOKE=1)"
	@echo "make test       the whole suite but GPU tests (what CI runs)"
	@echo "make test-fast  the inner loop: no slow, notebook, browser, slurm or gpu tests (~8 min on 2 cores)"
	@echo "make test-gpu   the tests that need CUDA"
	@echo "make notebooks  regenerate notebooks/*.ipynb from their .py twins"
	@echo "make docs       the documentation site into site/: guide, notebooks, API reference (~30 s)"

# A torch that the base interpreter already has is kept (the venv sees it through
# --system-site-packages); otherwise torch==2.13.0 is pinned in the same pip call as the package
# (one resolve, one pass over the indexes), so that pip's resolver never pulls an unpinned torch
# with gigabytes of CUDA packages.
$(STAMP): pyproject.toml
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
	  echo "using the torch of $(PYTHON): $$($(PYTHON) -c 'import torch; print(torch.__version__)')"; \
	  $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	  $(PYTHON) -m venv $(VENV); \
	fi
	@pin=; $(PY) -c "import torch" 2>/dev/null || { pin="$(TORCH_PIN)"; echo "installing $(TORCH_PIN)"; }; \
	  echo "installing cubicml-lab and its dependencies into $(VENV)"; \
	  $(PIP) install $$pin -e ".[dev]" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
	@$(PY) -c "import cubicml_lab, botorch, torch" || { echo "install failed"; exit 1; }
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/cubicml-lab demo

# JupyterLab in notebooks/: registers this venv's kernel as `cubicml-lab`, installs nbstripout's git
# filter into .git/config (the tracked .gitattributes names it: `git diff` and commits never carry
# outputs, cell ids are kept), and jupytext (notebooks/jupytext.toml) saves each notebook's .py twin
# with it. Git takes a notebook whose size changed (outputs) for a changed one without running the
# filter; the server's post-save hook (cubicml_lab/lab.py) re-records a saved notebook whose
# filtered content did not change, so `git status` stays clean. As root (CI, containers) it adds
# --allow-root.
lab: $(STAMP)
	@$(PY) -c "import jupyterlab, jupytext, nbstripout" 2>/dev/null || $(PIP) install -e ".[notebooks]"
	@$(PY) -m ipykernel install --sys-prefix --name cubicml-lab \
	  --display-name "Python (cubicml-lab)" >/dev/null
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  git config filter.nbstripout.clean '"$(CURDIR)/$(PY)" -m nbstripout --keep-id'; \
	  git config filter.nbstripout.smudge cat; \
	  git config filter.nbstripout.required true; \
	  git config filter.nbstripout.extrakeys "metadata.language_info"; \
	  git config diff.ipynb.textconv '"$(CURDIR)/$(PY)" -m nbstripout --keep-id -t'; \
	fi
	@if [ "$(SMOKE)" = 1 ]; then echo "smoke mode: the notebooks' kernels get CUBICML_LAB_SMOKE=1 (tiny budgets)"; fi
	cd notebooks && $(if $(filter 1,$(SMOKE)),CUBICML_LAB_SMOKE=1 )exec ../$(VENV)/bin/jupyter lab \
	  --FileContentsManager.post_save_hook=cubicml_lab.lab.refresh_git_index \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) $(LAB_ARGS)

test: $(STAMP)
	@if [ "$${CI:-}" = "true" ] && [ "$$(id -u)" = "0" ]; then bash .ci/system-deps; fi
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -m "not gpu" --durations=40

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not notebook and not browser and not slurm and not gpu" -q

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu -s -rs

notebooks: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb --update notebooks/*.py

# The documentation site (mkdocs.yml): the README as its guide, the notebooks as committed (not
# executed), the API reference from the docstrings; --strict fails on a broken link or reference.
docs: $(STAMP)
	@$(PY) -c "import material, mkdocs_jupyter, mkdocstrings_handlers.python" 2>/dev/null || \
	  $(PIP) install -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
	@echo "open site/index.html"

# also drops the git filter `make lab` installed, whose command lives in the venv
clean:
	-@git config --remove-section filter.nbstripout 2>/dev/null; \
	  git config --remove-section diff.ipynb 2>/dev/null
	rm -rf $(VENV) runs .pytest_cache
