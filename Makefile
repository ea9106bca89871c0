# The workshop's commands. Every target sets up what it needs first (idempotent).
#
#   make setup      the environment (.venv, from lock/), then Horovod for lab 2 from a cached or shared wheel, or its
#                   compile started in the background (python -m workshop horovod: its status)
#   make workshop   set up, then run every lab locally and print a summary  (the main job; lab 2 last
#                   when its Horovod build is still running, once it is done)
#   make test       set up, then run every test (lint, unit, notebooks)     (what CI runs; the tests that
#                   need Horovod run last, once its build is done)
#   make test-costs `make test`, then tests/costs.json: each slow test's cost, which plans the workers' order
#   make test-fast  set up, then lint and every test that starts no training (no notebooks; under 2 minutes;
#                   never waits for Horovod's build: its tests are skipped until it is done)
#   make lab        set up, register the Jupyter kernel, start JupyterLab (Horovod builds behind it)
#   make kernel     set up, register the Jupyter kernel (what a SageMaker notebook instance's lifecycle
#                   scripts run: scripts/notebook-instance/)
#   make bench      set up, then run the benchmarks (prints tables, writes images/)
#   make bench-strategies  set up, then PS vs Horovod vs DDP vs FSDP side by side (about 12 minutes)
#   make bench-notebooks   set up, then time every notebook's Run All on an ml.t3.medium's size (2 CPUs, 4 GiB:
#                   a cgroup, as root) and write each notebook's time line and the facilitator's agendas
#   make bench-allreduce   set up, then the gloo all-reduce microbenchmark (about a minute)
#   make bench-grad-accum  set up, then lab 3's gradient accumulation (bytes per step and per micro-batch, speed, the
#                   losses of 1 rank at K = 2 against 2 ranks) and DDP's bucket size swept (about 8 minutes)
#   make bench-staleness   set up, then lab 1 with 1, 2 and 4 workers: each gradient's staleness, the speed, and the
#                   test loss and accuracy after the same updates against 1 worker (about 5 minutes)
#   make bench-lab1-startup  set up, then lab 1's start-up phase by phase, TensorFlow from source and from bytecode
#                   (about 3 minutes)
#   make bench-pipeline    set up, then GPipe and 1F1B on 2 stages: idle share against the bubble, activations kept,
#                   the planner's step time beside the measured one (a few minutes)
#   make bench-tensor-parallel  set up, then the MLP and attention block split over 2 ranks: bytes per step against
#                   2 all-reduces of b x s x h, the step against the planner's, at b = 2, 4, 8, 16 (about 4 minutes)
#   make figures    set up, then each lab's main figure from a real local run into images/ (the lab READMEs show them)
#   make horovod    set up, build Horovod (or wait for the background build; again after a failed one),
#                   then check the build: horovodrun --check-build and a 2-rank all-reduce per framework
#   make clean      remove local runs and caches (keeps .venv and data/)
#   make lock       lock/ again from requirements*.txt, after a change to them (each package kept where allowed)
#   make upgrade    lock/ with the newest versions requirements*.txt allow: one reviewed commit

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
DEV_STAMP := $(VENV)/.dev-done
KERNEL_NAME := distributed-training-workshop
KERNEL_DISPLAY_NAME := Python (distributed training workshop)
# A SageMaker notebook instance has this file (workshop/cloud/aws.py: NOTEBOOK_METADATA_FILE).
SAGEMAKER_NOTEBOOK_METADATA := /opt/ml/metadata/resource-metadata.json
PYTEST_ARGS ?=
# Test processes (pytest-xdist) for `make test`; 0 runs the tests in this process. Three, even on 2 cores:
# many tests wait (rendezvous, hosts started apart, timeouts, the fake SageMaker's polls) more than they
# compute; on 2 cores a whole run took 31 min of pytest with three, where two kept 1.6 cores busy. Four
# kept both cores as busy and spent more CPU on the same tests (fighting over them): back to back from
# fresh clones of one commit, 1,373 s of pytest and 42.3 CPU-min with four, 1,279 s and 39.1 with three.
TEST_WORKERS ?= 3
# ... and for `make test-fast`, whose tests mostly compute (imports, parsing): a third worker there cost
# 10% more CPU for the same time (2 cores: 140-145 s with two, 139-143 s with three).
FAST_TEST_WORKERS ?= 2
# The tests' and the benchmarks' Python bytecode. A test run starts hundreds of Python processes (kernels,
# jobs, hosts, ranks, CLI calls); where the machine sets PYTHONDONTWRITEBYTECODE (CI images often do) and
# the set-up installed with --no-compile (below), each compiled TensorFlow's, the SDK's, moto's, ...
# modules from source again (`import tensorflow`: 6.4 s of CPU, 3.8 s from bytecode). These write it once,
# into .venv/pycache (PYTHONPYCACHEPREFIX: never beside a source, so no lab's code/ folder, a job's
# source_dir, gains a __pycache__). `make workshop`, `make lab` and every job the workshop starts get the
# same cache where the machine writes none (workshop.runtime.contract.bytecode_cache: lab 1's six
# processes imported TensorFlow in 33-68 s from source, 11-21 s from bytecode, on 2 cores).
BYTECODE_ENV := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache
# An attendee's runs (`make workshop`, `make lab`) the same way, but only where the machine sets PYTHONDONTWRITEBYTECODE:
# elsewhere (a notebook instance, most laptops) Python writes bytecode beside the sources, as the set-up and the
# kernel already did, and a second copy in .venv/pycache cost a 5 GiB notebook volume 113 MiB (1,515 MiB left free,
# under scripts/simulate_notebook_instance.sh's 1,536; 1,628 without it).
RUN_BYTECODE_ENV := $(if $(PYTHONDONTWRITEBYTECODE),$(BYTECODE_ENV))
# Where torch's CPU build comes from (see the set-up below).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# The lock (lock/, scripts/lock.py): every package the set-up installs, at one version, with the sha256 of each of
# its files, for CPython 3.11 on Linux x86-64 (a notebook instance's and CI's), written by `make lock` from the
# top-level files (requirements*.txt, short and commented), never by hand. pip installs it with --no-deps (it is
# complete: nothing is resolved at set-up time, so a release of any package changes nothing here) and
# --require-hashes (a file whose sha256 is not in the lock is refused, wherever pip found it). Elsewhere (a Mac,
# another Python, ARM) the set-up installs the top-level files as pip resolves them that day, unlocked, and says so.
LOCK := lock/installer.txt lock/torch.txt lock/environment.txt
DEV_LOCK := lock/dev.txt
# "yes" where the lock applies to $(PYTHON), else "no: why": asked only by a set-up that runs, and once (the first
# use sets LOCK_HERE to the answer).
LOCK_HERE = $(eval LOCK_HERE := $$(shell $$(PYTHON) scripts/lock.py applies))$(LOCK_HERE)
LOCKED = $(filter yes,$(firstword $(LOCK_HERE)))
PIP_INSTALL = $(BIN)/python -m pip install --quiet
# The tool that writes the lock: uv, not pip-tools, because (1) it resolves for the lock's target (CPython 3.11,
# Linux x86-64: --python-version, --python-platform) on whatever machine runs it, where pip-compile resolves for
# the interpreter running it (on a Mac: Mac-only packages in, Linux-only ones out); (2) it reads PyPI alone, never
# pip's configuration, so the hashes are those of PyPI's files, which a notebook instance and CI download (pip,
# which also reads a machine's configured mirrors and wheel folders, checks whatever copy it takes against them;
# pip-compile would hash the copies); (3) it is one pinned binary in a venv of its own (never in the workshop's
# environment), tied to no pip version, and locks everything in seconds.
UV_VERSION := 0.13.8
LOCK_TOOLS := $(VENV)/lock-tools

.PHONY: setup workshop test test-costs test-fast lab kernel bench bench-allreduce bench-grad-accum bench-pipeline bench-staleness bench-tensor-parallel bench-lab1-startup bench-strategies bench-notebooks figures horovod clean lock upgrade

# Horovod 0.28.1 is source-only and needs patches for today's frameworks; only lab 2 uses it. After the
# base set-up, `horovod_build start` installs it from an installed, cached or shared (WORKSHOP_WHEELHOUSE)
# wheel, or starts its compile (6-14 minutes on 2 cores) in the background and returns at once: nothing
# waits for it but lab 2. It says which, every time (`python -m workshop horovod` says it again).
setup: $(STAMP)
	@$(BIN)/python -m workshop.horovod_build start

# The base set-up: re-runs only when the requirements, the lock or pyproject.toml change (or .venv is gone). From
# the lock: first pip and setuptools (the pip that installs the rest, the setuptools that builds DeepSpeed's sdist:
# --no-build-isolation, so that no build fetches an unlocked setuptools), then torch, then the environment.
$(STAMP): requirements.txt requirements-no-deps.txt pyproject.toml $(LOCK)
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else "Python 3.11 or newer is needed, found %d.%d: set PYTHON=python3.11 (make PYTHON=python3.11 ...)" % v[:2])'
	@$(if $(LOCKED),$(PYTHON) scripts/lock.py check,echo "Not locked: $(filter-out no:,$(LOCK_HERE)); installing requirements.txt as pip resolves it today")
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) $(if $(LOCKED),--no-deps --require-hashes -r lock/installer.txt,--upgrade "pip>=24")
	@# requirements.txt moved from `tensorflow` to `tensorflow-cpu` (the same module, 0.6 GB smaller): in
	@# a .venv made before, both would share one folder, so the old one goes first, with the Horovod
	@# built against its headers (scripts/build_horovod.sh installs one built for tensorflow-cpu).
	@if $(BIN)/python -m pip show tensorflow >/dev/null 2>&1; then \
		$(BIN)/python -m pip uninstall --quiet -y tensorflow tf-keras tensorflow-cpu horovod; fi
	@# mlxtend moved to requirements-no-deps.txt: a .venv made before has its scikit-learn, which nothing here uses
	@# and Keras 3 imports in every TensorFlow process (0.5-0.7 s of CPU each).
	@if $(BIN)/python -m pip show scikit-learn >/dev/null 2>&1; then \
		$(BIN)/python -m pip uninstall --quiet -y scikit-learn; fi
	@# torch's CPU build: PyPI's Linux wheel is the CUDA build, which brings NVIDIA's CUDA libraries
	@# (cuDNN, cuBLAS, NCCL, ...: gigabytes that a notebook instance's 5 GB volume has no room for); the lock
	@# holds the CPU file's hash, so pip refuses PyPI's. A torch of the pinned version already installed (the
	@# CUDA build on a GPU machine: docs/laptop-and-gpu.md) stays.
	@# --retries 2: where that index's name does not resolve (a machine that reaches only PyPI, as CI's), pip's
	@# default 5 retries back off for 7.5 s before it goes on with PyPI alone; 2 cost 0.5 s.
	$(PIP_INSTALL) --retries 2 --no-deps --extra-index-url $(TORCH_INDEX) $(if $(LOCKED),--require-hashes -r lock/torch.txt,"$$(grep -E '^torch==' requirements.txt)")
	@# --no-compile: Python compiles a module's bytecode when it is first imported; compiling every module
	@# ahead took 0.5 GB, of which the labs import 0.2 GB (a notebook instance's volume is 5 GB).
	@# The environment from the lock in one call, nothing resolved; unlocked, requirements.txt with what it needs,
	@# then requirements-no-deps.txt without.
	$(PIP_INSTALL) --no-compile $(if $(LOCKED),--no-deps --require-hashes --no-build-isolation -r lock/environment.txt,-r requirements.txt)
	$(if $(LOCKED),,$(PIP_INSTALL) --no-compile --no-deps -r requirements-no-deps.txt)
	@# PYTHONWARNINGS: setuptools' editable-install warning is about a folder named like the package, which
	@# is how this checkout is laid out on purpose (11 lines of set-up noise otherwise)
	PYTHONWARNINGS=ignore $(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)
	@echo "Set up: $(VENV) ($$($(BIN)/python --version))"

workshop: setup
	$(RUN_BYTECODE_ENV) $(BIN)/python -m workshop run all

# What only the tests and the linter need (requirements-dev.txt: moto's server, pytest, nbval, ruff), on
# top of the set-up. An attendee's environment goes without it: it must fit a SageMaker notebook
# instance's default 5 GB volume (scripts/simulate_notebook_instance.sh measures it).
$(DEV_STAMP): requirements-dev.txt $(DEV_LOCK) $(STAMP)
	@$(if $(LOCKED),$(PYTHON) scripts/lock.py check)
	$(PIP_INSTALL) $(if $(LOCKED),--no-deps --require-hashes -r $(DEV_LOCK),-r requirements-dev.txt)
	@touch $(DEV_STAMP)

# Unit and multi-process tests, and every notebook top to bottom (nbval, local mode), on $(TEST_WORKERS)
# workers: a notebook's cells and its sagemaker-mode run are one unit, on one worker (tests/conftest.py:
# notebook_group), in the order tests/scheduling.py plans from tests/costs.json (the longest first, a test
# that mostly waits beside those that compute). Horovod first: from a cached or shared wheel at once, or its
# compile started in the background (then xdist's order, the tests that need it last, waiting for it).
test: setup $(DEV_STAMP)
	$(BIN)/python -m ruff check workshop tests benchmarks $(wildcard [0-9]_*/code)
	$(BYTECODE_ENV) $(BIN)/python -m pytest tests $(wildcard [0-9]_*/*.ipynb) --nbval-lax --nbval-current-env \
		--nbval-cell-timeout=900 --timeout=1800 --durations=30 -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# `make test`, recording what each slow test cost (wall and CPU seconds) into tests/costs.json, the record
# its workers' order is planned with (tests/scheduling.py). Again after tests are added, removed or made
# much slower or faster: a stale record only makes the order worse. Written once every test has passed.
test-costs:
	$(MAKE) test PYTEST_ARGS="$(PYTEST_ARGS) --record-costs runs/test-costs.json"
	cp runs/test-costs.json tests/costs.json

# The tests that start no training process (tests marked slow and the notebooks left out); a test
# that is not marked slow and starts training fails (the guard in tests/conftest.py). Tests that need
# Horovod run when it is installed and are skipped, never waited for, while its build runs.
test-fast: $(DEV_STAMP)
	$(BIN)/python -m ruff check workshop tests benchmarks $(wildcard [0-9]_*/code)
	$(BYTECODE_ENV) $(BIN)/python -m pytest tests -m "not slow" --timeout=300 --no-horovod-wait -n $(FAST_TEST_WORKERS) $(PYTEST_ARGS)

# Registers the kernel every notebook names in its metadata (kernelspec name $(KERNEL_NAME); checked by
# tests/test_notebook_hygiene.py), for this user, then starts JupyterLab. As root (a container, sudo)
# JupyterLab refuses to start without --allow-root, so the recipe passes it and says so. On a SageMaker
# notebook instance the instance's own JupyterLab, run as ec2-user, lists the kernel too.
lab: setup
	$(BIN)/python -m ipykernel install --user --name $(KERNEL_NAME) --display-name "$(KERNEL_DISPLAY_NAME)"
	@echo "Registered the Jupyter kernel $(KERNEL_NAME) (\"$(KERNEL_DISPLAY_NAME)\", $(abspath $(BIN))/python): the kernel every notebook names"
	@if [ -f $(SAGEMAKER_NOTEBOOK_METADATA) ] && [ "$$(id -u)" = 0 ]; then \
		echo "SageMaker notebook instance, as root: the kernel went to root's kernels, but the instance's JupyterLab runs as ec2-user and lists ec2-user's: run make lab as ec2-user (without sudo)"; \
	elif [ -f $(SAGEMAKER_NOTEBOOK_METADATA) ]; then \
		echo "SageMaker notebook instance: the instance's own JupyterLab lists \"$(KERNEL_DISPLAY_NAME)\" too (reload its page)"; \
	fi
	@if [ "$$(id -u)" = 0 ]; then \
		echo "Running as root (id -u is 0): passing --allow-root, because JupyterLab refuses to start as root without it"; \
		$(RUN_BYTECODE_ENV) $(BIN)/jupyter lab --allow-root; \
	else \
		$(RUN_BYTECODE_ENV) $(BIN)/jupyter lab; \
	fi

# The kernel alone, for this user (a SageMaker notebook instance's lifecycle scripts register it this
# way, at the end of the set-up and again at every start: a restart resets the home folder).
kernel: setup
	$(BIN)/python -m ipykernel install --user --name $(KERNEL_NAME) --display-name "$(KERNEL_DISPLAY_NAME)"

# bench_strategies.py runs Horovod: it waits for the set-up's background build (the others need not).
bench: setup
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_data_parallel.py
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_allreduce.py
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_grad_accum.py
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_staleness.py
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_lab1_startup.py
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_pipeline.py
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_tensor_parallel.py
	@$(BIN)/python -m workshop.horovod_build --wait
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_strategies.py --profile
	$(BYTECODE_ENV) $(BIN)/python benchmarks/planner_validation.py --out images/planner_validation.md
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_runtime.py
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_cli.py

bench-allreduce: setup
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_allreduce.py

bench-grad-accum: setup
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_grad_accum.py

bench-staleness: setup
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_staleness.py

bench-pipeline: setup
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_pipeline.py

bench-lab1-startup: setup
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_lab1_startup.py

bench-tensor-parallel: setup
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_tensor_parallel.py

bench-strategies: setup
	@$(BIN)/python -m workshop.horovod_build --wait
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_strategies.py --profile

# Lab 2's notebook needs Horovod: wait for its build. Without root, NOTEBOOK_LIMITS= times them on the whole machine.
NOTEBOOK_LIMITS ?= --memory 4G --cpus 2
bench-notebooks: setup
	@$(BIN)/python -m workshop.horovod_build --wait
	$(BYTECODE_ENV) $(BIN)/python benchmarks/bench_notebooks.py $(NOTEBOOK_LIMITS) --write-docs

# Labs 1, 2 and 4, each run as its notebook runs it, drawn by the lab's own figures.py (scripts/lab_figures.py);
# lab 3's figure is make bench's images/bench_data_parallel.png. Lab 2 needs Horovod: wait for its build. About 16
# minutes on 2 busy cores: lab 1 3.3, lab 2 3.3, lab 4 9.6 (its grid at N = 1, 2, 4: 10 runs, each starting its ranks).
figures: setup
	@$(BIN)/python -m workshop.horovod_build --wait
	$(BYTECODE_ENV) $(BIN)/python scripts/lab_figures.py

# Horovod is source-only and needs patches for today's frameworks: see scripts/build_horovod.sh. Builds it
# (or waits for the background build, a line every 30 s; a failed build is retried), then checks it.
horovod: setup
	$(BIN)/python -m workshop.horovod_build build
	VENV=$(VENV) HOROVOD_VERIFY=1 bash scripts/build_horovod.sh

clean:
	rm -rf runs .pytest_cache .ruff_cache

# The lock again, after a change to requirements*.txt (make setup and CI's tests/test_lock.py fail on a stale lock,
# naming this): each package stays at its locked version where the top-level files still allow it. `make upgrade`:
# every package (pip and setuptools too) at the newest version they allow, as one commit to review (it prints what
# changed). Both need PyPI, and torch's CPU wheel from TORCH_INDEX (or where pip's configuration finds it).
lock: $(LOCK_TOOLS)/.uv-$(UV_VERSION)
	$(LOCK_TOOLS)/bin/python scripts/lock.py write --uv $(LOCK_TOOLS)/bin/uv --torch-index $(TORCH_INDEX)

upgrade: $(LOCK_TOOLS)/.uv-$(UV_VERSION)
	$(LOCK_TOOLS)/bin/python scripts/lock.py write --uv $(LOCK_TOOLS)/bin/uv --torch-index $(TORCH_INDEX) --upgrade

$(LOCK_TOOLS)/.uv-$(UV_VERSION):
	@test -x $(LOCK_TOOLS)/bin/python || $(PYTHON) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/python -m pip install --quiet uv==$(UV_VERSION)
	@touch $@
