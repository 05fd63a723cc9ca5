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
# pytest-xdist workers and extra pytest arguments for `make test`: twice the CPU count, as many of the kit's tests
# mostly wait (for a launch's timeout, for a child process), and others can use the CPUs meanwhile.
JOBS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) * 2 )))
# Stages of the gate run side by side, at most GATE_JOBS at once (default: the CPU count).
GATE_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# `make gate GATE_CACHE=0`: run every stage, reusing no stored result (default: a stage whose inputs are unchanged
# reuses its stored results, build/gate-cache/).
GATE_CACHE ?=
PYTEST_ARGS ?=
# `make stress`: runs of the 2-process suite, busy processes competing for the CPUs meanwhile, and the code under
# test (checkouts: as they are; base: the pristine releases; series: patches/ applied), in work trees for the latter.
REPEAT ?= 10
LOAD ?= 0
ON ?= checkouts
# `make stress SCENARIOS="state-dict-first-diverged-nw6 ..."`: launch only these scenarios of tests/accelerate's worker.
SCENARIOS ?=
# `make stress SUITE=tests/deepspeed`: the part of the kit's suite that is run (default: the 2-process Accelerate suite).
SUITE ?= tests/accelerate
# Extra options of `make bench` (python -m scripts.bench --help), e.g. `--repeat 9`, `--profile-gate`, `--cold-apply`.
BENCH_ARGS ?=
# `make matrix`: DEPS=0 gates the releases in the kit's venv only (no dependency axis); MATRIX_JOBS gate runs at once
# (one per upstream at most).
DEPS ?= 1
MATRIX_JOBS ?= 2
# `make matrix ROW=<id>`: gate that row only and write its record, build/matrix/<id>/row.json (the rows' ids:
# `python -m scripts.matrix --list-rows`; the workflow runs one row per job).
ROW ?=
# `make upstream SOURCE=git` (or apply): a missing base comes from the upstream's git tag, not the sdist.
SOURCE ?= sdist
# `make export RESIGN=1`: re-sign the series with your git identity (author and Signed-off-by) first.
RESIGN ?=
# `make unapply DISCARD=1` drops commits in a checkout that are not exported to patches/.
DISCARD ?=
# `make apply KEEP_CONFLICT=1`: a patch that does not apply leaves `git am` stopped at it in the checkout, to resolve.
KEEP_CONFLICT ?=
# `make outdated` and `make pin` ask this package index's JSON API (<url>/<package>/json); `make pin DEFAULT=1` also
# makes the pinned release the upstream's default `version`.
INDEX_JSON ?= https://pypi.org/pypi
DEFAULT ?=

# `make flows FULL=1`: every triple of factor levels, not every pair (README, "The flow table").
FULL ?=
# `make flows FLOWS_CACHE=0` (or make test): run every flow's columns, reusing none stored in build/flows-cache/.
FLOWS_CACHE ?=
# `make flows AT=HEAD~1`: run that commit of each checkout as the series (ABOUT_AT below says it for make help).
AT ?=

# `make fuzz`: the history search's budget in seconds, and the seed of a search to replay (empty: a new one).
FUZZ_SECONDS ?= 600
FUZZ_SEED ?=

# `make pr DRAFT=1` writes the bodies even where they still say `Fixes #<...>` (an issue not filed yet), to read.
DRAFT ?=

# Boolean variables take 1, yes or true, or 0, no or false (empty: the default); anything else stops make here,
# before anything runs (issue 22: DISCARD=0 used to mean yes).
BOOLEANS := RESIGN DISCARD DEPS DRAFT KEEP_CONFLICT DEFAULT FULL GATE_CACHE FLOWS_CACHE
$(foreach v,$(BOOLEANS),$(if $(filter-out 1 yes true 0 no false,$($(v))),\
  $(error $(v)=$($(v)) is not a boolean: use 1, yes or true, or 0, no or false)))
is_yes = $(filter 1 yes true,$(1))
is_no = $(filter 0 no false,$(1))
# Counts and choices are checked the same way, before anything runs (issue 33: GATE_JOBS=abc printed argparse's
# five-line usage).
not_digits = $(strip $(subst 0,,$(subst 1,,$(subst 2,,$(subst 3,,$(subst 4,,$(subst 5,,$(subst 6,,$(subst 7,,$(subst \
  8,,$(subst 9,,$(1))))))))))))
is_count = $(and $(filter 1,$(words $(1))),$(if $(call not_digits,$(1)),,yes))
COUNTS := JOBS GATE_JOBS REPEAT MATRIX_JOBS FUZZ_SECONDS
$(foreach v,$(COUNTS),$(if $(and $(call is_count,$($(v))),$(subst 0,,$($(v)))),,\
  $(error $(v)=$($(v)) is not a positive whole number: use a count, e.g. $(v)=2)))
$(if $(call is_count,$(LOAD)),,$(error LOAD=$(LOAD) is not a whole number: use a count of busy processes, e.g. LOAD=4))
$(if $(FUZZ_SEED),$(if $(call is_count,$(FUZZ_SEED)),,$(error FUZZ_SEED=$(FUZZ_SEED) is not a whole number: use the seed a make fuzz printed, e.g. FUZZ_SEED=1)))
comma := ,
listed = $(subst $() ,$(comma) ,$(strip $(1)))
CHOICES_ON := checkouts base series
CHOICES_SOURCE := sdist git
$(foreach v,ON SOURCE,$(if $(and $(filter 1,$(words $($(v)))),$(filter $(CHOICES_$(v)),$($(v)))),,\
  $(error $(v)=$($(v)) is not one of $(call listed,$(CHOICES_$(v))): e.g. $(v)=$(firstword $(CHOICES_$(v))))))

# Every variable of the kit: what it means, and the targets that read it (none listed: every target); `make help`
# shows them. Given on the command line to targets none of which reads it, a variable gets one warning (issue 33:
# PYTEST_ARGS was silently ignored by make gate).
KNOWN := PYTHON VENV TORCH PIP_OPTS DEEPSPEED_VERSION ACCELERATE_VERSION JOBS GATE_JOBS GATE_CACHE PYTEST_ARGS REPEAT LOAD ON \
  SCENARIOS SUITE BENCH_ARGS DEPS MATRIX_JOBS ROW SOURCE RESIGN DISCARD DRAFT KIT_URL TOOLS KEEP_CONFLICT INDEX_JSON DEFAULT FULL AT \
  FLOWS_CACHE \
  FUZZ_SECONDS FUZZ_SEED
ABOUT_PYTHON := the Python 3.11 that makes the venvs
ABOUT_VENV := the kit's venv
ABOUT_TOOLS := the venv of the upstreams' style tools
READ_BY_TOOLS := tools test lint
ABOUT_TORCH := the torch requirement (e.g. a +cpu build)
READ_BY_TORCH := venv apply matrix lock outdated
ABOUT_PIP_OPTS := extra options of every pip install and download (an index URL, say)
READ_BY_PIP_OPTS := venv tools upstream apply unapply test lint matrix lock pin
ABOUT_DEEPSPEED_VERSION := another pinned DeepSpeed release (default: upstream/sources.toml)
ABOUT_ACCELERATE_VERSION := another pinned Accelerate release (default: upstream/sources.toml)
READ_BY_DEEPSPEED_VERSION := upstream apply unapply export gate bench lint pin
READ_BY_ACCELERATE_VERSION := $(READ_BY_DEEPSPEED_VERSION)
ABOUT_JOBS := pytest-xdist workers of make test, processes of make stress (default: twice the CPU count)
READ_BY_JOBS := test stress
ABOUT_GATE_JOBS := stages of the gate run at once (default: the CPU count)
READ_BY_GATE_JOBS := gate
ABOUT_GATE_CACHE := 0: run every stage of the gate, reusing no stored result (default: reuse by content)
READ_BY_GATE_CACHE := gate matrix
ABOUT_PYTEST_ARGS := extra pytest arguments, e.g. -k partition
READ_BY_PYTEST_ARGS := test
NOTE_PYTEST_ARGS := ; the gate judges every test of the suite, so it takes none
ABOUT_REPEAT := runs of the stressed suite
ABOUT_LOAD := busy processes competing for the CPUs meanwhile
ABOUT_ON := the code under test: checkouts, base or series
ABOUT_SCENARIOS := only these scenarios of the Accelerate worker, without pytest
READ_BY_REPEAT := stress
READ_BY_LOAD := stress
READ_BY_ON := stress
READ_BY_SCENARIOS := stress
ABOUT_SUITE := the part of the kit's suite that make stress runs, e.g. tests/deepspeed
READ_BY_SUITE := stress
ABOUT_BENCH_ARGS := options of python -m scripts.bench, e.g. --repeat 7 --gate
READ_BY_BENCH_ARGS := bench
ABOUT_DEPS := 0: the releases in the kit's venv only, without the dependency and torch axes
ABOUT_MATRIX_JOBS := upstreams gated at once
READ_BY_DEPS := matrix
READ_BY_MATRIX_JOBS := matrix
ABOUT_ROW := one row of the matrix to gate, its record in build/matrix/<row>/row.json
READ_BY_ROW := matrix
ABOUT_SOURCE := where a missing base comes from: sdist, or git (needs GitHub)
READ_BY_SOURCE := upstream apply
ABOUT_RESIGN := 1: first sign the series as you (git's user.name and user.email)
READ_BY_RESIGN := export
ABOUT_DISCARD := 1: drop commits in a checkout that patches/ does not hold
READ_BY_DISCARD := unapply
ABOUT_FULL := 1: every triple of factor levels, not every pair
READ_BY_FULL := flows
ABOUT_FLOWS_CACHE := 0: run every column of the flow table and side of the stored histories, reusing none (default: reuse by content)
READ_BY_FLOWS_CACHE := flows test
ABOUT_AT := the commit of each checkout that runs as the series (default HEAD), the same rev for both: HEAD~1 is each stack without its last commit; Accelerate's first commit alone is HEAD~4 (a stack of 5), DeepSpeed's HEAD~7 (a stack of 8); one upstream alone: python -m scripts.flows --only deepspeed --at HEAD~7
READ_BY_AT := flows
ABOUT_FUZZ_SECONDS := the history search's budget in seconds
READ_BY_FUZZ_SECONDS := fuzz
ABOUT_FUZZ_SEED := the seed of a history search to replay (default: a new one, printed)
READ_BY_FUZZ_SEED := fuzz
ABOUT_DRAFT := 1: write bodies that still say Fixes \#<...>, to read
READ_BY_DRAFT := pr
ABOUT_KIT_URL := the kit's public URL in the bodies (default: git remote get-url origin)
READ_BY_KIT_URL := pr
ABOUT_KEEP_CONFLICT := 1: a patch that does not apply leaves git am stopped at it in the checkout, to resolve
READ_BY_KEEP_CONFLICT := apply
ABOUT_INDEX_JSON := the package index's JSON API that make outdated and make pin ask
READ_BY_INDEX_JSON := outdated pin
ABOUT_DEFAULT := 1: make pin also makes the pinned release the upstream's default version
READ_BY_DEFAULT := pin
GIVEN := $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
GOALS := $(filter-out help,$(MAKECMDGOALS))
unread = $(and $(GOALS),$(READ_BY_$(1)),$(if $(filter $(READ_BY_$(1)),$(GOALS)),,yes))
$(foreach v,$(filter $(KNOWN),$(GIVEN)),$(if $(call unread,$(v)),$(warning warning: $(v) is read by make \
  $(call listed,$(READ_BY_$(v))) only, not by make $(call listed,$(GOALS)), and is ignored here$(NOTE_$(v)))))
# A variable or target that the kit does not have gets one line naming the closest one it has.
closest = $(shell python3 -c 'import difflib, sys; known = sys.argv[2:]; low = [k.lower() for k in known]; \
  m = difflib.get_close_matches(sys.argv[1].lower(), low, 1); \
  print(f" (did you mean {known[low.index(m[0])]}?)" if m else "")' '$(1)' $(2))
$(foreach v,$(filter-out $(KNOWN),$(GIVEN)),\
  $(warning warning: $(v) is not a variable of the kit and is ignored$(call closest,$(v),$(KNOWN)); make help lists them))
TARGETS = $(shell sed -nE 's/^([a-z][a-z-]*):.*## .*/\1/p' $(firstword $(MAKEFILE_LIST)))

quote = '$(subst ','\'',$(1))'
PY := $(VENV)/bin/python
# Every package of the venv at its locked version (`make lock` regenerates it); pip constraints of every install.
CONSTRAINTS := requirements/constraints.txt
STAMP := $(VENV)/.kit-venv
TOOLS := .tools
TOOLS_STAMP := $(TOOLS)/.kit-tools
NEED_VENV = test -x $(PY) || { echo "error: $(VENV) does not exist: run make apply first" >&2; exit 1; }
# Every recipe that reads or writes the checkouts, the venvs or build/ runs under the kit's lock: one run at a
# time, and no process of it left behind after it ends or is interrupted (scripts/runlock.py). `exec`: the shell
# of the recipe line becomes the wrapper, so the SIGTERM that GNU make sends its child reaches the wrapper.
LOCK = exec $(PYTHON) -m scripts.runlock --name "make $(or $(MAKECMDGOALS),$@)" --
# $(LOCK) that first says what it does, then every 30 s how long it has been at it (pip is quiet for minutes).
SAY = exec $(PYTHON) -m scripts.runlock --name "make $(or $(MAKECMDGOALS),$@)" --say "$(1)" --
# Only the versions asked for (an empty `--version deepspeed=` reads as noise in the commands the reports show).
VERSIONS = $(if $(DEEPSPEED_VERSION),--version deepspeed=$(DEEPSPEED_VERSION)) \
  $(if $(ACCELERATE_VERSION),--version accelerate=$(ACCELERATE_VERSION))
UPSTREAM_ARGS = $(VERSIONS) \
	--pip-options="$(PIP_OPTS)" --source $(SOURCE)
UPSTREAM = $(LOCK) $(1) -m scripts.upstream $(2) $(UPSTREAM_ARGS)
# The editable installs (pip builds each checkout) and the bytecode of the checkouts, with a line every 30 s.
INSTALL = $(call SAY,installing the checkouts editable into $(VENV) and compiling them) $(PY) -m scripts.upstream \
	install $(UPSTREAM_ARGS)

.DEFAULT_GOAL := help
.PHONY: help venv tools upstream apply unapply export test gate flows fuzz stress bench lint matrix lock pr clean \
	check-python need-venv lint-ready apply-ready outdated pin

help: ## list the targets and variables
	@echo "Targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  %-10s %s\n", $$1, $$2}'
	@echo "Variables (make TARGET NAME=value; the value now, what it means, [the targets that read it]):"
	@$(foreach v,$(KNOWN),printf '  %-36s %s\n' $(call quote,$(v)=$($(v))) \
	  $(call quote,$(ABOUT_$(v))$(if $(READ_BY_$(v)), [$(READ_BY_$(v))]));)
	@echo "Booleans (RESIGN, DISCARD, DEPS, DRAFT, KEEP_CONFLICT, DEFAULT, FULL, GATE_CACHE, FLOWS_CACHE) take 1, yes or true, or 0, no or false."

# A target the kit does not have (make gaet): one line naming the closest one and pointing at make help.
.DEFAULT:
	$(error make has no target '$@'$(call closest,$@,$(TARGETS)): make help lists the targets)

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
	@$(call SAY,installing $(TORCH) into $(VENV) with pip) $(PY) -m pip install --quiet $(PIP_OPTS) -c $(CONSTRAINTS) "$(TORCH)"
	@$(call SAY,installing the locked packages into $(VENV) with pip) $(PY) -m pip install --quiet $(PIP_OPTS) \
	  -c $(CONSTRAINTS) -r requirements/kit.txt -r $(CONSTRAINTS)
	@echo "$(TORCH)" > $@

venv: $(STAMP) ## create .venv with the pinned tools (torch, torchdata, pytest, ...)

$(TOOLS_STAMP): requirements/tools.txt | check-python
	@test -x $(TOOLS)/bin/python || $(PYTHON) -m venv $(TOOLS)
	@$(call SAY,installing the style tools into $(TOOLS) with pip) $(TOOLS)/bin/python -m pip install --quiet \
	  $(PIP_OPTS) -r requirements/tools.txt
	@touch $@

tools: $(TOOLS_STAMP) ## create .tools/ with the upstreams' style tools at their pinned versions (ruff, yapf, flake8, codespell)

upstream: check-python ## make the pristine checkouts upstream/<name> (tag base/<version>) from sdists, or SOURCE=git
	@$(call UPSTREAM,$(PYTHON),checkout)

# Checked before the venv is built: apply would not refuse on a checkout (uncommitted edits, unexported commits).
KEEP = $(if $(call is_yes,$(KEEP_CONFLICT)),--keep-conflict)
apply-ready: check-python
	@$(call UPSTREAM,$(PYTHON),apply) --check-only $(KEEP)

apply: apply-ready $(STAMP) ## venv + checkouts + the series applied (git am --3way) + editable installs; a no-op when done
	@$(call SAY,making the checkouts and applying the series) $(PY) -m scripts.upstream apply $(UPSTREAM_ARGS) $(KEEP)
	@PIP_CONSTRAINT=$(CURDIR)/$(CONSTRAINTS) $(INSTALL)

unapply: check-python ## put the checkouts back on their base; refuses to drop your edits or unexported commits (DISCARD=1 drops commits)
	@$(call UPSTREAM,$(PYTHON),unapply) $(if $(call is_yes,$(DISCARD)),--discard)
	@test ! -x $(PY) || $(INSTALL)

export: check-python ## regenerate patches/<name>/ from the commits on the base (git format-patch); RESIGN=1 signs as you
	@$(call UPSTREAM,$(PYTHON),export) $(if $(call is_yes,$(RESIGN)),--resign)

# Checked before anything is built: make test refuses for want of .venv before it makes .tools.
need-venv:
	@$(NEED_VENV)

test: need-venv $(TOOLS_STAMP) ## run the kit's suite (tests/) with pytest-xdist; JUnit XML in build/test/junit.xml
	@FLOWS_CACHE=$(FLOWS_CACHE) $(LOCK) $(PY) -m pytest -p scripts.pytest_progress --progress-every=30 -n $(JOBS) --dist loadgroup \
	  --junitxml=build/test/junit.xml $(PYTEST_ARGS) tests

gate: ## FAIL_TO_PASS / PASS_TO_PASS: base + test hunks vs the series, side by side in trees of their own; build/gate/
	@$(NEED_VENV)
	@$(LOCK) $(PY) -m scripts.gate $(VERSIONS) \
	  --jobs $(GATE_JOBS) $(if $(call is_no,$(GATE_CACHE)),--no-cache)

flows: need-venv ## the flow table: save/restart flows on the release and the series (FULL=1: every triple); build/flows/
	@$(call SAY,running the flow table (launch logs in build/flows/work/)) $(PY) -m scripts.flows \
	  $(if $(call is_yes,$(FULL)),--full) $(if $(AT),--at $(call quote,$(AT))) $(if $(call is_no,$(FLOWS_CACHE)),--no-cache)

fuzz: need-venv ## the history search: histories of save/restart steps on the release and the series (FUZZ_SECONDS, FUZZ_SEED); build/histories/
	@$(call SAY,searching histories (server logs in build/histories/work/)) $(PY) -m scripts.histories \
	  --seconds $(FUZZ_SECONDS) $(if $(FUZZ_SEED),--seed $(FUZZ_SEED))

stress: ## SUITE (tests/accelerate) REPEAT times under LOAD busy processes, ON=checkouts|base|series; build/stress/
	@$(NEED_VENV)
	@$(call SAY,running the stress repetitions (logs in build/stress/)) $(PY) -m scripts.stress --repeat $(REPEAT) --load $(LOAD) --on $(ON) --jobs $(JOBS) \
	  $(foreach scenario,$(SCENARIOS),--scenario $(scenario)) $(SUITE)

bench: ## base vs patched side by side (prepare(), epoch, sampler; BENCH_ARGS=--gate: the gate vs its floor); build/bench/report.md
	@$(NEED_VENV)
	@$(call SAY,measuring (each process's log in build/bench/logs/)) $(PY) -m scripts.bench --python $(PY) $(VERSIONS) \
	  $(BENCH_ARGS)

LINT = $(PYTHON) -m scripts.lint $(VERSIONS) --tools $(abspath $(TOOLS))

# Checked before .tools is built: the checkouts carry exactly the series.
lint-ready: check-python
	@$(LOCK) $(LINT) --ready

lint: lint-ready $(TOOLS_STAMP) ## each series with its upstream's own tools + patch hygiene (DCO, subject, Fixes #N); the kit's code
	@$(call SAY,checking the series and the kit's code) $(LINT)

matrix: need-venv ## every pinned release gated as it declares, x torchdata / numpy versions (DEPS=0: not); build/matrix/report.md (slow)
	@$(call SAY,gating the matrix (each row's report in build/matrix/)) $(PY) -m scripts.matrix --torch "$(TORCH)" --pip-options="$(PIP_OPTS)" --jobs $(MATRIX_JOBS) $(if $(call is_no,$(DEPS)),--no-deps) \
	  $(if $(call is_no,$(GATE_CACHE)),--no-cache) $(if $(ROW),--row $(call quote,$(ROW)))

lock: check-python ## regenerate requirements/constraints.txt from a fresh venv (TORCH, kit.txt, the upstreams' dependencies)
	@$(call SAY,making a fresh venv and freezing it (build/lock/)) $(PYTHON) -m scripts.lock --torch "$(TORCH)" --pip-options="$(PIP_OPTS)"

outdated: check-python ## newest releases on the index vs the pins, the matrix, the lock, TORCH; exit 3 when newer
	@$(LOCK) $(PYTHON) -m scripts.outdated --index "$(INDEX_JSON)" --torch "$(TORCH)"

pin: check-python ## pin <NAME>_VERSION=X in upstream/sources.toml: the index's sha256, checked on the download
	@$(LOCK) $(PYTHON) -m scripts.pin $(VERSIONS) \
	  --index "$(INDEX_JSON)" --pip-options="$(PIP_OPTS)" $(if $(call is_yes,$(DEFAULT)),--default)

pr: ## the pull-request bodies build/pr/<name>/<n>-<slug>.md, one per commit: docs/pr/<name>/<n>.md + its gate table + the commands
	@$(LOCK) $(PYTHON) -m scripts.pr $(if $(call is_yes,$(DRAFT)),--draft)

clean: ## remove build/ and caches (the venvs, checkouts and the sdist cache stay)
	@$(LOCK) rm -rf build .pytest_cache .ruff_cache
	@find scripts tests -name __pycache__ -type d -prune -exec rm -rf {} +
