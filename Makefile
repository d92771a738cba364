# cubicml-lab: `make demo` (set-up + a real co-design campaign on the CPU), `make test` (what CI runs).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --quiet --disable-pip-version-check
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast test-gpu lint-imports notebooks clean help

help:
	@echo "make demo       create .venv, install, run a real co-design campaign on the CPU (~4 min)"
	@echo "make test       the whole suite but GPU tests (what CI runs)"
	@echo "make test-fast  the inner loop: no slow, notebook, slurm or gpu tests (~1 min)"
	@echo "make test-gpu   the tests that need CUDA"
	@echo "make notebooks  regenerate notebooks/*.ipynb from their .py twins"

# A torch that the base interpreter already has is kept (the venv sees it through
# --system-site-packages); otherwise torch==2.13.0 is installed before the package, so that pip's
# resolver never pulls an unpinned torch with gigabytes of CUDA packages.
$(STAMP): pyproject.toml
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
	  echo "using the torch of $(PYTHON): $$($(PYTHON) -c 'import torch; print(torch.__version__)')"; \
	  $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	  $(PYTHON) -m venv $(VENV); \
	fi
	@$(PY) -c "import torch" 2>/dev/null || { echo "installing $(TORCH_PIN)"; $(PIP) install "$(TORCH_PIN)"; }
	@echo "installing cubicml-lab and its dependencies into $(VENV)"
	@$(PIP) install -e ".[dev]" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
	@$(PY) -c "import cubicml_lab, botorch, torch" || { echo "install failed"; exit 1; }
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/cubicml-lab demo

test: $(STAMP)
	@if [ "$${CI:-}" = "true" ] && [ "$$(id -u)" = "0" ]; then bash .ci/system-deps; fi
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -m "not gpu" --durations=15

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not notebook and not slurm and not gpu" -q

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu -s -rs

notebooks: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb --update notebooks/*.py

clean:
	rm -rf $(VENV) runs .pytest_cache
