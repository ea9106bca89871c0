# The workshop's commands. Every target sets up what it needs first (idempotent).
#
#   make workshop   set up, then run every lab locally and print a summary  (the main job)
#   make test       set up, then run every test (lint, unit, notebooks)     (what CI runs)
#   make lab        set up, register the Jupyter kernel, start JupyterLab
#   make bench      set up, then run the benchmarks (prints tables, writes images/)
#   make horovod    set up, then build Horovod 0.28.1 into .venv (minutes once; a cached wheel after)
#   make clean      remove local runs and caches (keeps .venv and data/)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
KERNEL_NAME := distributed-training-workshop
PYTEST_ARGS ?=

.PHONY: setup workshop test lab bench horovod clean

setup: $(STAMP)

# Re-runs only when requirements.txt or pyproject.toml change (or .venv is gone).
$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else "Python 3.11 or newer is needed, found %d.%d: set PYTHON=python3.11 (make PYTHON=python3.11 ...)" % v[:2])'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)
	@echo "Set up: $(VENV) ($$($(BIN)/python --version))"

workshop: setup
	$(BIN)/python -m workshop run all

# Unit and multi-process tests, then every notebook top to bottom (nbval, local mode).
test: setup
	$(BIN)/python -m ruff check workshop tests benchmarks $(wildcard [0-9]_*/code)
	$(BIN)/python -m pytest tests $(wildcard [0-9]_*/*.ipynb) --nbval-lax --nbval-current-env \
		--nbval-cell-timeout=900 --timeout=1800 $(PYTEST_ARGS)

lab: setup
	$(BIN)/python -m ipykernel install --user --name $(KERNEL_NAME) --display-name "Python (distributed training workshop)"
	$(BIN)/jupyter lab

bench: setup
	$(BIN)/python benchmarks/bench_data_parallel.py

# Horovod is source-only and needs patches for today's frameworks: see scripts/build_horovod.sh.
horovod: setup
	VENV=$(VENV) bash scripts/build_horovod.sh

clean:
	rm -rf runs .pytest_cache .ruff_cache
