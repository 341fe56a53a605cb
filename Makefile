# genome_lm: `make demo` and `make test` work on a fresh machine with nothing run before.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU machines: the CPU build of torch 2.13.0. On a GPU node pass e.g. TORCH_SPEC="torch==2.13.0"
# with your CUDA index (PIP_EXTRA_INDEX_URL) before `make setup`.
TORCH_SPEC ?= torch==2.13.0
PIP := $(BIN)/python -m pip
PYTEST_ARGS ?=
# The exact environment (every dependency and extra, with hashes) that the suite passed on; torch
# and what comes with its build (nvidia-*, cuda-*, triton, and setuptools, whose range each torch
# release sets) stay outside it.
LOCK := requirements.lock
LOCK_PYTHON := 3.11

.PHONY: setup compiled lock demo test test-slow test-interpret test-faults test-gpu test-browser chromium test-all test-upstream gpu-kit lint typecheck bench clean
.DEFAULT_GOAL := demo

$(BIN)/python:
	@$(PYTHON) -c 'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(0 if v == "$(LOCK_PYTHON)" else \
		"$(PYTHON) is Python " + v + "; $(LOCK) is for Python $(LOCK_PYTHON): make setup PYTHON=python$(LOCK_PYTHON)")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first, so nothing later pulls a multi-GB CUDA build. Installs skip byte-compiling
# (--no-compile, as uv does by default): a demo imports a small part of what is installed, and
# compiling all of it takes longer than the install; the test targets compile once (.compiled).
$(VENV)/.torch: | $(BIN)/python
	$(PIP) install -q --no-compile "$(TORCH_SPEC)"
	touch $@

# The lock as it is (--no-deps: nothing resolves at install time), then genome_lm itself, then a
# check that the whole venv, torch included, is consistent.
$(VENV)/.installed: pyproject.toml $(LOCK) $(VENV)/.torch
	$(PIP) install -q --no-compile --no-deps --require-hashes -r $(LOCK)
	$(PIP) install -q --no-compile --no-deps -e .
	$(PIP) check
	touch $@

setup: $(VENV)/.installed

# Byte-code for everything installed, on all cores, for the suite's many subprocesses (each would
# otherwise parse torch and transformers anew). As pip's own compile step, it skips files this
# Python cannot compile (torch's Python 3.12-only test helpers).
$(VENV)/.compiled: $(VENV)/.installed
	$(BIN)/python -c 'import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()["purelib"], quiet=2, workers=0)'
	touch $@

compiled: $(VENV)/.compiled

demo: setup
	$(BIN)/genome-lm demo

test: compiled
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The slow tier (-m slow): the 256k rehearsal, the planner's bound on eight more drawn layouts, the
# calibration's sequence lengths x strategies, the longer parallel, score and variants cases, the CLI sweep
# (about an hour on 2 cores; not in .ci/run).
test-slow: compiled
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

# fla's Triton kernels on CPU tensors under Triton's interpreter (tests/interpret; docs/testing.md).
# The triton wheel goes into its own folder, on PYTHONPATH for this tier only: importable from the
# venv it would make every process that imports the model import all of fla (seconds each).
TRITON_SPEC   ?= triton==3.9.0
INTERPRET_DIR := $(VENV)/interpret

$(INTERPRET_DIR)/.installed: | $(VENV)/.installed
	rm -rf $(INTERPRET_DIR)
	$(PIP) install -q --no-deps --target $(INTERPRET_DIR) "$(TRITON_SPEC)"
	touch $@

test-interpret: compiled $(INTERPRET_DIR)/.installed
	PYTHONPATH="$(abspath $(INTERPRET_DIR))" TRITON_INTERPRET=1 GENOME_LM_KDA_BACKEND=fla \
		$(BIN)/python -m pytest tests/interpret $(PYTEST_ARGS)

# On a machine with CUDA: the gpu-marked tests with CUDA visible (the default suite hides it), among
# them benchmarks/gpu_check.py on the GPU (benchmarks/results/gpu_check.json). Skipped without CUDA.
test-gpu: compiled
	GENOME_LM_TEST_GPU=1 $(BIN)/python -m pytest -m gpu $(PYTEST_ARGS)

# The quick demo's report in headless Chromium (tests/report/test_browser.py; docs/testing.md): Debian's
# chromium, installed here when CHROMIUM is missing, driven by Playwright from the lock (extra `browser`).
# Screenshot: build/browser/demo_quick.png.
CHROMIUM := /usr/bin/chromium
APT_CHROMIUM := DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	apt-get install -y -q --no-install-recommends chromium
chromium:
	@if [ -x $(CHROMIUM) ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then sudo=none; \
	elif [ "$$(id -u)" = 0 ]; then sudo=; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else sudo=none; fi; \
	if [ "$$sudo" = none ]; then echo "make chromium: $(CHROMIUM) is missing and cannot be installed here \
	(needs apt-get as root or passwordless sudo): install Debian's chromium package" >&2; exit 1; fi; \
	echo "$${sudo:+$$sudo }apt-get install -y --no-install-recommends chromium"; \
	$$sudo sh -c '$(APT_CHROMIUM)' || { echo "make chromium: apt-get could not install chromium" >&2; exit 1; }; \
	[ -x $(CHROMIUM) ] || { echo "make chromium: apt-get installed chromium but $(CHROMIUM) is missing" >&2; exit 1; }

test-browser: compiled chromium
	GENOME_LM_TEST_BROWSER=1 GENOME_LM_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -m browser $(PYTEST_ARGS)

# A worker killed under Ray Train on a local Ray instance, restarted by --max-restarts (about a
# minute; docs/long-runs.md)
test-faults: compiled
	$(BIN)/python -m pytest -m ray_faults $(PYTEST_ARGS)

test-all: compiled
	$(BIN)/python -m pytest -m "" $(PYTEST_ARGS)

# ruff (configured in pyproject.toml: line length 120, pycodestyle, pyflakes, import order)
RUFF_SPEC ?= ruff==0.17.6
$(VENV)/.ruff: | $(BIN)/python
	$(PIP) install -q "$(RUFF_SPEC)"
	touch $@

lint: $(VENV)/.ruff
	$(BIN)/ruff check genome_lm tests benchmarks tools

# mypy over genome_lm (configured in pyproject.toml: the pydantic plugin, the annotated functions
# checked). It runs in the installed venv, so torch's, transformers' and pydantic's own types count.
MYPY_SPEC ?= mypy==2.4.1
$(VENV)/.mypy: | $(BIN)/python
	$(PIP) install -q "$(MYPY_SPEC)"
	touch $@

typecheck: $(VENV)/.installed $(VENV)/.mypy
	$(BIN)/mypy

# Regenerate $(LOCK) from pyproject.toml with the newest releases inside its ranges (run
# `make test-upstream` first to see what would move). uv resolves; pip installs.
UV_SPEC ?= uv==0.13.9
UV_COMPILE = $(BIN)/uv pip compile pyproject.toml --all-extras --python-version $(LOCK_PYTHON) \
	--python-platform x86_64-manylinux_2_28 --no-emit-package torch
$(VENV)/.uv: | $(BIN)/python
	$(PIP) install -q "$(UV_SPEC)"
	touch $@

lock: $(VENV)/.uv
	accel=$$($(UV_COMPILE) --no-header --no-annotate -q | grep -oE '^(nvidia-|cuda-|triton|setuptools)[^=]*' \
		| sed 's/^/--no-emit-package /'); \
	$(UV_COMPILE) $$accel --generate-hashes --custom-compile-command "make lock" -q -o $(LOCK)

# The drift canary (docs/testing.md): the newest release of every direct dependency in a
# throwaway venv, against the upstream contract, the parity tests and a tiny pipeline. It follows
# the registry, so it stays out of .ci/run; run it before `make lock`.
test-upstream: | $(BIN)/python
	$(BIN)/python tools/test_upstream.py --torch "$(TORCH_SPEC)"

# The wheels the GPU machine image (Python 3.12, torch 2.11, no registry) lacks for
# benchmarks/gpu_check.py, at the locked versions, into .whl/ (docs/testing.md has the command
# that installs them there).
gpu-kit: | $(BIN)/python
	$(BIN)/python tools/gpu_kit.py

# Every benchmark in turn (tens of minutes on 2 cores); each writes benchmarks/results/NAME.json.
bench: compiled
	set -e; for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b; done

clean:
	rm -rf $(VENV) data/generated shards runs evals reports
