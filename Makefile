# Patch-series toolkit entry points. Every target is a thin wrapper over `python -m tools`.
#
# Every variable below is the user's text, never make code or shell code: each is read raw
# ($(value ...), so `$(shell ...)` in a value stays text, even under `make -n`), refs must look like
# refs before any recipe runs, and every value reaches the shell single-quoted.
USER_VARS := PYTHON SGLANG_REF SGLANG_REPO TREE FORCE ALLOW_OFFSET REFS NEW_LINE FROM CHECK DROP \
	CONTINUE ABORT BENCH_ARGS PYTEST_ARGS OFFLINE PATCHES_ONLY GPU_PER_PATCH SUBJECT
$(foreach v,$(USER_VARS),$(eval override $(v) := $$(value $(v))))

# PYTHON: the project venv, which every target creates (or brings up to date with ci/requirements.txt)
# first, through ci/bootstrap-venv.sh; set PYTHON=<python> to use an environment of your own instead.
# SGLANG_REF: upstream ref to build against; empty means the one pinned in sglang.lock (v0.5.9).
#   A ref with its own folder under lines/ is that release line (patches, tests, tree and bench).
# SGLANG_REPO: optional local clone/mirror of upstream, tried before the network.
# TREE: patched tree; empty means build/sglang-<ref>.
# FORCE=1: apply even over unsaved work in the tree, after saving it on a backup branch;
#          refresh even over patch files edited by hand since the last apply/refresh.
# ALLOW_OFFSET=1: accept hunks that apply at an offset (rebasing work; check still refuses them).
# REFS: extra versions for the status matrix, e.g. REFS="v0.5.10 v0.5.15".
# CHECK=1 / DROP=1: rebase report-only / confirm dropping upstreamed or obsolete patches;
# CONTINUE=1 / ABORT=1: after a rebase conflict.
# NEW_LINE=1 [FROM=<ref>]: rebase makes a new release line lines/<SGLANG_REF>/ from the line FROM
#   (default: the default line) instead of moving that line.
# BENCH_ARGS / PYTEST_ARGS: arguments for `python -m bench` / the tool tests' pytest, split on blanks
#   (no quoting inside: each word is passed as it is).
# OFFLINE=1: leave out the tool tests that fetch SGLang releases from PyPI (air-gapped GPU boxes).
# PATCHES_ONLY=1: skip the tool's own tests (they do not depend on the line).
# GPU_PER_PATCH=1: also run each patch's GPU tests on its prefix of the series (attribution; slow).
# SUBJECT: the subject line of `make new`.

quote = '$(subst ','\'',$(1))'
quote_words = $(foreach w,$(1),$(call quote,$(w)))
ALNUM := a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M N O P Q R S T U V W X \
	Y Z 0 1 2 3 4 5 6 7 8 9
strip_chars = $(if $(2),$(call strip_chars,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,$(words $(2)),$(2))),$(1))
# A ref: one word of letters, digits and . _ - / +, starting with a letter or digit (git's own
# check-ref-format runs in the tool).
bad_ref = $(or $(filter-out 1,$(words $(1))),$(filter-out $(addsuffix %,$(ALNUM)),$(1)),$(call \
	strip_chars,$(1),$(ALNUM) . _ - / +))
$(foreach v,SGLANG_REF FROM,$(if $($(v)),$(if $(call bad_ref,$($(v))),$(error $(v)='$($(v))' is not a git \
	ref (letters, digits and . _ - / + only, e.g. $(v)=v0.5.9): nothing was run))))
$(foreach r,$(REFS),$(if $(call bad_ref,$(r)),$(error REFS holds '$(r)', which is not a git ref (letters, \
	digits and . _ - / + only, e.g. REFS="v0.5.10 v0.5.15"): nothing was run)))

VENV_PYTHON := .venv/bin/python
override PYTHON := $(or $(PYTHON),$(VENV_PYTHON))
PY := $(call quote,$(PYTHON))
SETUP = $(if $(filter $(VENV_PYTHON),$(PYTHON)),bash ci/bootstrap-venv.sh,true)
# A release line with its own requirements runs its patch tests in its own venv, which holds those
# over .venv (its SGLang release imports another transformers than 0.5.9's); the tool names both.
LINE_SETUP = req="$$($(TOOL) line requirements)" && { [ -z "$$req" ] || bash ci/bootstrap-venv.sh "$$req" "$$($(TOOL) line venv)"; }

export SGLANG_REPO

LINE_ARGS = $(if $(SGLANG_REF),--ref $(SGLANG_REF)) $(if $(TREE),--tree $(call quote,$(TREE)))
TOOL = $(PY) -m tools $(LINE_ARGS)

.PHONY: help apply refresh check status install test rebase bench new bundle

help: ## list targets and variables
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 12
	@echo
	@echo "variables (the comments at the top of the Makefile say what each does):"
	@echo "  every target: SGLANG_REF (default: pinned in sglang.lock; a lines/<ref> folder is that line) TREE"
	@echo "                PYTHON (default .venv/bin/python, made by the set-up step) BOOTSTRAP_PYTHON SGLANG_REPO"
	@echo "  apply: FORCE=1 ALLOW_OFFSET=1   refresh: FORCE=1   status: REFS='v0.5.10 v0.5.15'"
	@echo "  test: OFFLINE=1 PATCHES_ONLY=1 GPU_PER_PATCH=1 PYTEST_ARGS='-k name'"
	@echo "  rebase: CHECK=1 DROP=1 CONTINUE=1 ABORT=1 NEW_LINE=1 FROM=<ref>   bench: BENCH_ARGS='--quick'   new: SUBJECT"

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
	$(TOOL) status $(if $(REFS),--refs $(call quote,$(REFS)))

install: ## pip install --no-deps -e <tree>/python into PYTHON's environment
	@$(SETUP)
	$(TOOL) install

test: ## tool tests, then each patch's declared Tests on the series up to it, then tests/gpu
	@$(SETUP)
	@$(LINE_SETUP)
	$(TOOL) test $(if $(GPU_PER_PATCH),--gpu-per-patch) $(if $(PATCHES_ONLY),--patches-only) -- $(if $(OFFLINE),-m "not network") $(call quote_words,$(PYTEST_ARGS))

rebase: ## port the series to SGLANG_REF=<new> (CHECK=1: report only; DROP=1: drop upstreamed; NEW_LINE=1 [FROM=<ref>]: as a new line)
	@$(SETUP)
	@test -n '$(SGLANG_REF)' || { echo "usage: make rebase SGLANG_REF=v0.5.10 [CHECK=1] [DROP=1] [NEW_LINE=1 [FROM=v0.5.15]]"; exit 2; }
	$(PY) -m tools $(if $(FROM),--ref $(FROM)) rebase --to $(SGLANG_REF) $(if $(CHECK),--check) $(if $(DROP),--drop) \
		$(if $(CONTINUE),--continue) $(if $(ABORT),--abort) $(if $(NEW_LINE),--new-line)

bench: ## benchmarks (the bench package) on the line's tree
	@$(SETUP)
	$(PY) -m bench $(LINE_ARGS) $(call quote_words,$(BENCH_ARGS))

new: ## a commit message template for a new patch: make new SUBJECT='area: what it fixes'
	@$(SETUP)
	@test -n $(call quote,$(SUBJECT)) || { echo "usage: make new SUBJECT='speculative: what the patch fixes'"; exit 2; }
	$(TOOL) new $(call quote,$(SUBJECT))

bundle: check ## offline bundle (.gpu) of a line's patched tree for a GPU machine without network, stamped with its series
	PYTHON=$(PY) bash ci/gpu/make-bundle.sh '$(SGLANG_REF)' "$$($(TOOL) tree)"
