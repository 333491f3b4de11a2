# Patch-series toolkit entry points. Every target is a thin wrapper over `python -m tools`.
# PYTHON: the project venv, which every target creates (or brings up to date with ci/requirements.txt)
# first, through ci/bootstrap-venv.sh; set PYTHON=<python> to use an environment of your own instead.
VENV_PYTHON := .venv/bin/python
PYTHON ?= $(VENV_PYTHON)
SETUP = $(if $(filter $(VENV_PYTHON),$(PYTHON)),bash ci/bootstrap-venv.sh,true)
# A release line with its own requirements runs its patch tests in .venv-<ref>, which holds those
# over .venv (its SGLang release imports another transformers than 0.5.9's).
LINE_REQ = $(if $(SGLANG_REF),$(wildcard lines/$(SGLANG_REF)/requirements.txt))
LINE_SETUP = $(if $(LINE_REQ),bash ci/bootstrap-venv.sh $(LINE_REQ) .venv-$(SGLANG_REF),true)
# SGLANG_REF: upstream ref to build against; empty means the one pinned in sglang.lock (v0.5.9).
SGLANG_REF ?=
# SGLANG_REPO: optional local clone/mirror of upstream, tried before the network.
SGLANG_REPO ?=
# TREE: patched tree; empty means build/sglang-<ref>.
TREE ?=
# FORCE=1: apply even over unsaved work in the tree, after saving it on a backup branch;
#          refresh even over patch files edited by hand since the last apply/refresh.
FORCE ?=
# ALLOW_OFFSET=1: accept hunks that apply at an offset (rebasing work; check still refuses them).
ALLOW_OFFSET ?=
# REFS: extra versions for the status matrix, e.g. REFS="v0.5.10 v0.5.15".
REFS ?=
# CHECK=1 / DROP=1: rebase report-only / confirm dropping upstreamed or obsolete patches;
# CONTINUE=1 / ABORT=1: after a rebase conflict.
# NEW_LINE=1 [FROM=<ref>]: rebase makes a new release line lines/<SGLANG_REF>/ from the line FROM
# (default: the default line) instead of moving that line.
NEW_LINE ?=
FROM ?=
CHECK ?=
DROP ?=
CONTINUE ?=
ABORT ?=
BENCH_ARGS ?=
PYTEST_ARGS ?=
# OFFLINE=1: leave out the tool tests that fetch SGLang releases from PyPI (air-gapped GPU boxes).
OFFLINE ?=
# PATCHES_ONLY=1: skip the tool's own tests (they do not depend on the line).
PATCHES_ONLY ?=
# GPU_PER_PATCH=1: also run each patch's GPU tests on its prefix of the series (attribution; slow).
GPU_PER_PATCH ?=

export SGLANG_REPO

TOOL = $(PYTHON) -m tools $(if $(SGLANG_REF),--ref $(SGLANG_REF)) $(if $(TREE),--tree $(TREE))

.PHONY: help apply refresh check status install test rebase bench bundle

help: ## list targets and variables
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 12
	@echo
	@echo "variables: SGLANG_REF (default: pinned in sglang.lock) SGLANG_REPO TREE FORCE=1 ALLOW_OFFSET=1"
	@echo "           REFS='v0.5.10 v0.5.15' (status) CHECK=1 DROP=1 NEW_LINE=1 FROM=<ref> (rebase) OFFLINE=1 GPU_PER_PATCH=1 PATCHES_ONLY=1 (test) PYTHON=$(PYTHON) BOOTSTRAP_PYTHON"

apply: ## build build/sglang-<ref>: upstream base + one commit per patch (strict)
	@$(SETUP)
	$(TOOL) apply $(if $(FORCE),--force) $(if $(ALLOW_OFFSET),--allow-offset)

refresh: ## write the tree's commits back to patches/ (new commits are appended to series)
	@$(SETUP)
	$(TOOL) refresh $(if $(FORCE),--force)

check: ## series vs patches/, headers, exact application, re-export is a no-op
	@$(SETUP)
	$(TOOL) check

status: ## table: each patch's hunks per version, Upstream-Status, Tests
	@$(SETUP)
	$(TOOL) status $(if $(REFS),--refs "$(REFS)")

install: ## pip install --no-deps -e <tree>/python into $(PYTHON)'s environment
	@$(SETUP)
	$(TOOL) install

test: ## tool tests, then each patch's declared Tests on the series up to it, then tests/gpu
	@$(SETUP)
	@$(LINE_SETUP)
	$(TOOL) test $(if $(GPU_PER_PATCH),--gpu-per-patch) $(if $(PATCHES_ONLY),--patches-only) -- $(if $(OFFLINE),-m "not network") $(PYTEST_ARGS)

rebase: ## port the series to SGLANG_REF=<new> (CHECK=1: report only; DROP=1: drop upstreamed; NEW_LINE=1 [FROM=<ref>]: as a new line)
	@$(SETUP)
	@test -n "$(SGLANG_REF)" || { echo "usage: make rebase SGLANG_REF=v0.5.10 [CHECK=1] [DROP=1] [NEW_LINE=1 [FROM=v0.5.15]]"; exit 2; }
	$(PYTHON) -m tools $(if $(FROM),--ref $(FROM)) rebase --to $(SGLANG_REF) $(if $(CHECK),--check) $(if $(DROP),--drop) \
		$(if $(CONTINUE),--continue) $(if $(ABORT),--abort) $(if $(NEW_LINE),--new-line)

bench: ## benchmarks (the bench package)
	@$(SETUP)
	$(PYTHON) -m bench $(BENCH_ARGS)

bundle: check ## offline bundle (.gpu) of a line's patched tree for a GPU machine without network, stamped with its series
	bash ci/gpu/make-bundle.sh "$(SGLANG_REF)" $(TREE)
