# Entry points of the kit. `make help` lists the targets; README.md explains them.
# Set-up on a fresh machine: `make apply`, then `make test`.

PYTHON ?= python3.11
VENV ?= .venv
# The torch requirement and extra pip options (an index URL for a CPU-only torch build, say).
TORCH ?= torch==2.13.0
PIP_OPTS ?=
# Versions of the upstreams (empty: the `version` of upstream/sources.toml).
DEEPSPEED_VERSION ?=
ACCELERATE_VERSION ?=
# pytest-xdist workers and extra pytest arguments for `make test`.
JOBS ?= auto
# pytest-xdist workers of the gate's kit-suite runs: none by default, as two worker interpreters importing torch
# cost more than they save there (`make bench BENCH_ARGS=--profile-gate`: tests/accelerate 18.2 s with -n auto,
# 15.3 s with -n 0).
GATE_JOBS ?= 0
PYTEST_ARGS ?=
# How many times `make stress` runs the 2-process suite.
REPEAT ?= 10
# Extra options of `make bench` (python -m scripts.bench --help), e.g. `--repeat 9`, `--profile-gate`, `--cold-apply`.
BENCH_ARGS ?=
# `make matrix`: DEPS=0 gates the releases in the kit's venv only (no dependency axis); MATRIX_JOBS gate runs at once
# (one per upstream at most).
DEPS ?= 1
MATRIX_JOBS ?= 2
# `make upstream SOURCE=git` (or apply): a missing base comes from the upstream's git tag, not the sdist.
SOURCE ?= sdist
# `make export RESIGN=1`: re-sign the series with your git identity (author and Signed-off-by) first.
RESIGN ?=
# `make unapply DISCARD=1` drops commits in a checkout that are not exported to patches/.
DISCARD ?=

PY := $(VENV)/bin/python
# Every package of the venv at its locked version (`make lock` regenerates it); pip constraints of every install.
CONSTRAINTS := requirements/constraints.txt
STAMP := $(VENV)/.kit-venv
TOOLS := .tools
TOOLS_STAMP := $(TOOLS)/.kit-tools
NEED_VENV = test -x $(PY) || { echo "error: $(VENV) does not exist: run make apply first" >&2; exit 1; }
UPSTREAM = $(1) -m scripts.upstream $(2) --version deepspeed=$(DEEPSPEED_VERSION) \
	--version accelerate=$(ACCELERATE_VERSION) --pip-options="$(PIP_OPTS)" --source $(SOURCE)

.DEFAULT_GOAL := help
.PHONY: help venv tools upstream apply unapply export test gate stress bench lint matrix lock pr clean check-python

help: ## list the targets and variables
	@echo "Targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  %-10s %s\n", $$1, $$2}'
	@echo "Variables: PYTHON=$(PYTHON) VENV=$(VENV) TORCH=$(TORCH) PIP_OPTS=$(PIP_OPTS) JOBS=$(JOBS)"
	@echo "           DEEPSPEED_VERSION ACCELERATE_VERSION (default: upstream/sources.toml) PYTEST_ARGS"
	@echo "           SOURCE=sdist|git RESIGN=1 DISCARD=1 REPEAT=N GATE_JOBS BENCH_ARGS DEPS=0|1 MATRIX_JOBS"

check-python:
	@command -v git >/dev/null || { echo "error: git is not installed: install git and run again" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || \
	  { echo "error: $(PYTHON) is not Python 3.11: install it or run make PYTHON=/path/to/python3.11" >&2; exit 1; }

# The venv is brought up to date when requirements/kit.txt or the lock changes, or TORCH differs from the one it was
# made with: every locked package is installed at its locked version (-r $(CONSTRAINTS)), so the venv follows the lock.
ifneq ($(shell cat $(STAMP) 2>/dev/null),$(TORCH))
.PHONY: $(STAMP)
endif
$(STAMP): requirements/kit.txt $(CONSTRAINTS) | check-python
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(PIP_OPTS) -c $(CONSTRAINTS) "$(TORCH)"
	$(PY) -m pip install --quiet $(PIP_OPTS) -c $(CONSTRAINTS) -r requirements/kit.txt -r $(CONSTRAINTS)
	@echo "$(TORCH)" > $@

venv: $(STAMP) ## create .venv with the pinned tools (torch, torchdata, pytest, ...)

$(TOOLS_STAMP): requirements/tools.txt | check-python
	@test -x $(TOOLS)/bin/python || $(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet $(PIP_OPTS) -r requirements/tools.txt
	@touch $@

tools: $(TOOLS_STAMP) ## create .tools/ with the upstreams' style tools at their pinned versions (ruff, yapf, flake8, codespell)

upstream: check-python ## make the pristine checkouts upstream/<name> (tag base/<version>) from sdists, or SOURCE=git
	@$(call UPSTREAM,$(PYTHON),checkout)

apply: $(STAMP) ## venv + checkouts + the series applied (git am --3way) + editable installs; a no-op when done
	@$(call UPSTREAM,$(PY),apply)
	@PIP_CONSTRAINT=$(CURDIR)/$(CONSTRAINTS) $(call UPSTREAM,$(PY),install)

unapply: check-python ## put the checkouts back on their base; refuses to drop your edits or unexported commits (DISCARD=1 drops commits)
	@$(call UPSTREAM,$(PYTHON),unapply) $(if $(DISCARD),--discard)

export: check-python ## regenerate patches/<name>/ from the commits on the base (git format-patch); RESIGN=1 signs as you
	@$(call UPSTREAM,$(PYTHON),export) $(if $(RESIGN),--resign)

test: $(TOOLS_STAMP) ## run the kit's suite (tests/) with pytest-xdist; JUnit XML in build/test/junit.xml
	@$(NEED_VENV)
	$(PY) -m pytest -n $(JOBS) --junitxml=build/test/junit.xml $(PYTEST_ARGS) tests

gate: ## FAIL_TO_PASS / PASS_TO_PASS check: base + test hunks, then the series; report in build/gate/
	@$(NEED_VENV)
	@$(PY) -m scripts.gate --version deepspeed=$(DEEPSPEED_VERSION) --version accelerate=$(ACCELERATE_VERSION) \
	  --jobs $(GATE_JOBS)

stress: ## run tests/accelerate REPEAT times on the checkouts as they are; failures per test in build/stress/
	@$(NEED_VENV)
	@$(PY) -m scripts.stress --repeat $(REPEAT) --jobs $(JOBS)

bench: ## base vs patched side by side (prepare(), epoch, sampler) and the gate vs its floor; build/bench/report.md
	@$(NEED_VENV)
	@$(PY) -m scripts.bench --python $(PY) --version deepspeed=$(DEEPSPEED_VERSION) \
	  --version accelerate=$(ACCELERATE_VERSION) --jobs $(JOBS) $(BENCH_ARGS)

lint: $(TOOLS_STAMP) ## each series with its upstream's own tools + patch hygiene (DCO, subject, Fixes #N); the kit's code
	@$(PYTHON) -m scripts.lint --version deepspeed=$(DEEPSPEED_VERSION) --version accelerate=$(ACCELERATE_VERSION)

matrix: $(STAMP) ## every pinned release gated as it declares, x torchdata / numpy versions (DEPS=0: not); build/matrix/report.md (slow)
	@$(PY) -m scripts.matrix --torch "$(TORCH)" --pip-options="$(PIP_OPTS)" --jobs $(MATRIX_JOBS) $(if $(filter 0,$(DEPS)),--no-deps)

lock: check-python ## regenerate requirements/constraints.txt from a fresh venv (TORCH, kit.txt, the upstreams' dependencies)
	@$(PYTHON) -m scripts.lock --torch "$(TORCH)" --pip-options="$(PIP_OPTS)"

pr: ## the pull-request bodies build/pr/<name>.md: docs/pr/<name>.md + the gate's table + the commands
	@$(PYTHON) -m scripts.pr

clean: ## remove build/ and caches (the venvs, checkouts and the sdist cache stay)
	rm -rf build .pytest_cache .ruff_cache
	find scripts tests -name __pycache__ -type d -prune -exec rm -rf {} +
