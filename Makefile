# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The accelerators' compilers (make accel; test-long checks their programs): two more venvs.
ACCEL_JAX  ?= 0.10.2
ACCEL_ARGS ?=
CUDA_VENV  ?= .venv-accel-cuda
TPU_VENV   ?= .venv-accel-tpu
ACCEL_STAMPS := $(CUDA_VENV)/.installed $(TPU_VENV)/.installed
# Where soak, clients, conformance and accel write their records. The committed records (the
# ones the docs quote and the tests compare the docs with) are benchmarks/results; CI points
# this at a scratch folder, so that a run on another machine (whose chaotic curves, such as
# lamb's soak drift, differ in the last digit) cannot rewrite the record the tests then read.
RECORDS ?= benchmarks/results

.PHONY: test test-long test-plan check-new stress soak conformance clients test-oldest test-oldest-long accel package demo speedrun bench bench-device lightbench docs docs-tables docs-check venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,demo,flax,equinox,orbax,notebooks,docs]"
	touch $(STAMP)

venv: $(STAMP)

# Two pytest workers (pytest-xdist): the suite is ~3,600 tests, mostly XLA compiles. make test
# runs those that fit a time budget (under 15 minutes on a slow 2-core machine): the checks
# marked `long` in their files (notebooks, the docs build, benchmark smoke runs, fresh-process
# runs over 8 devices or 2 processes, float64 model-scale twins) and the heaviest measured
# cases (tests/long_by_duration.txt, from make test-plan) are `make test-long`; CI runs both,
# and test-oldest runs make test's selection on the declared floors (test-oldest-long the rest).
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not long"

test-long: $(STAMP) $(ACCEL_STAMPS)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m long

# Re-plan make test's time budget after tests were added or made slower: the suite less its
# marked long checks, timed with tests/long_by_duration.txt switched off, then that list
# rewritten (tests/plan_fast_suite.py: the heaviest cases go long until the rest sums to
# 28% of the measured worker-seconds, every parametrized test keeping its cheapest case).
# About 20 minutes.
PLAN_LOG ?= /tmp/functrain-durations.log

test-plan: $(STAMP)
	-FUNCTRAIN_LONG_BY_DURATION=off $(PY) -m pytest -q -n $(TEST_WORKERS) -m "not long" \
	  --durations=0 > $(PLAN_LOG) 2>&1
	tail -n 3 $(PLAN_LOG)
	$(PY) tests/plan_fast_suite.py $(PLAN_LOG)

# The checks of one optimizer, new or changed (tests/check_new.py): its own test files, the
# declaration, registry, public-API, optax-coverage and docs-table checks, and its cases of
# every registry-wide suite. Usage: make check-new NAME=laprop
check-new: $(STAMP)
	@test -n "$(NAME)" || { echo "usage: make check-new NAME=<optimizer>"; exit 2; }
	$(PY) tests/check_new.py $(NAME) -n $(TEST_WORKERS)

# Every optimizer whose step holds a conditional or a decomposition, in fresh processes
# under a timeout (docs/matrix_optimizers.md): 50+ runs, a hang fails naming the optimizer.
stress: $(STAMP)
	$(PY) tests/stress/run_stress.py

# 10,000 steps beside optax, and a run resumed halfway from Orbax in a fresh process (~1 min).
soak: $(STAMP)
	$(PY) tests/soak/run_soak.py --out $(RECORDS)

# Other projects' optax-using tests, with optax and with functrain as `import optax`, compared
# test by test (tests/clients/run_clients.py): flax's NNX optimizer tests and linen_test.py
# from its released sources (fetched into .clients/), and optimistix's OptaxMinimiser
# (OPTIMISTIX_SRC=<checkout> adds its own test_minimise.py). About 8 minutes; CI runs
# CLIENTS_ARGS=--reduced (flax's tests that mention optax).
CLIENTS_STAMP := $(VENV)/.clients-installed
CLIENTS_ARGS ?=

$(CLIENTS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[clients]"
	touch $(CLIENTS_STAMP)

clients: $(CLIENTS_STAMP)
	$(PY) tests/clients/run_clients.py -n $(TEST_WORKERS) --out $(RECORDS) $(CLIENTS_ARGS)

# optax 0.2.8's own test files, run from the installed wheel with functrain's functions
# swapped in; every failure must be on tests/conformance's list of deliberate differences
# (about 4-7 minutes on 2 cores).
conformance: $(STAMP)
	$(PY) tests/conformance/run_conformance.py -n $(TEST_WORKERS) --out $(RECORDS)

# The declared floors, tested: a separate venv with the lowest versions of jax, jaxlib,
# optax, chex and absl-py that pyproject.toml allows (JAX 0.5.3 is optax 0.2.8's floor), and
# the extras the suite uses (their own versions as pip resolves them against those floors,
# flax 0.10.6 among them). One pin beyond the floors: orbax-checkpoint 0.11.24 and newer call
# jax.monitoring.record_scalar, which JAX 0.5.3 lacks, though they declare jax>=0.5.0; 0.11.21
# is the newest that runs on it. The same pytest run as `make test`; features that need a
# newer JAX (explicit mesh axes: 0.7.0) are skipped with that reason, nothing else. The long
# checks on the floors are make test-oldest-long (about 12 minutes more; not in CI, which
# keeps well under 90 minutes).
OLD_VENV  ?= .venv-oldest
OLD_PY    := $(OLD_VENV)/bin/python
OLD_STAMP := $(OLD_VENV)/.installed
OLDEST    := jax==0.5.3 jaxlib==0.5.3 optax==0.2.8 chex==0.1.86 absl-py==1.0.0 \
             orbax-checkpoint==0.11.21

$(OLD_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(OLD_VENV)
	$(OLD_PY) -m pip install -q --upgrade pip
	$(OLD_PY) -m pip install -q $(OLDEST)
	$(OLD_PY) -m pip install -q -e ".[test,demo,flax,equinox,orbax,notebooks,docs]" $(OLDEST)
	touch $(OLD_STAMP)

test-oldest: $(OLD_STAMP)
	$(OLD_PY) -m pytest -q -n $(TEST_WORKERS) -rs -m "not long"

test-oldest-long: $(OLD_STAMP) $(ACCEL_STAMPS)
	$(OLD_PY) -m pytest -q -n $(TEST_WORKERS) -rs -m long

# Every optimizer compiled for one H100 and one TPU v5e chip by their own compilers on this
# CPU machine (deviceless; ../shared/accel/README.md), functrain beside optax: bytes accessed
# per parameter against the floor, flops, temp memory, kernels, compile seconds, into
# benchmarks/results/accelerators.{md,json} (benchmarks/accelerators.py); the sharded steps
# (ZeRO-1 AdamW, the matrix optimizers with mesh=) on 8 H100s and a v5e 2x2 and their
# collectives into results/accelerators_sharded_*.json (benchmarks/accel_sharded.py; TPU
# soap and kron take minutes to compile and are left to a manual run). Two venvs of the
# same JAX (about 1.3 GB each). The short form (CI, about 5 minutes); ACCEL_ARGS=--full for
# every registry optimizer.

$(CUDA_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/python -m pip install -q --upgrade pip
	$(CUDA_VENV)/bin/python -m pip install -q jax==$(ACCEL_JAX) jaxlib==$(ACCEL_JAX) \
	  jax-cuda12-plugin==$(ACCEL_JAX) nvidia-cuda-nvcc-cu12 nvidia-nvjitlink-cu12 optax==0.2.8
	$(CUDA_VENV)/bin/python -m pip install -q -e . jax==$(ACCEL_JAX)
	touch $@

$(TPU_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(TPU_VENV)
	$(TPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(TPU_VENV)/bin/python -m pip install -q "jax[tpu]==$(ACCEL_JAX)" optax==0.2.8
	$(TPU_VENV)/bin/python -m pip install -q -e . jax==$(ACCEL_JAX)
	touch $@

accel: $(STAMP) $(ACCEL_STAMPS)
	$(PY) benchmarks/accelerators.py --out $(RECORDS) $(ACCEL_ARGS)
	FUNCTRAIN_RECORDS=$(RECORDS) $(CUDA_VENV)/bin/python benchmarks/accel_sharded.py h100
	FUNCTRAIN_RECORDS=$(RECORDS) $(TPU_VENV)/bin/python benchmarks/accel_sharded.py tpu_v5e muon shampoo

# The package as a user gets it: a wheel and an sdist (python -m build), the wheel installed
# (not editable) into a new venv with its declared dependencies, then the README's quickstart
# and functrain.__version__ run there. PKG_PYTHON=python3.12 make package tries another Python.
PKG_VENV   ?= /tmp/functrain-package-venv
PKG_PYTHON ?= $(PYTHON)
package: $(STAMP)
	$(PY) -c "import build" 2>/dev/null || $(PY) -m pip install -q build
	rm -rf dist $(PKG_VENV)
	$(PY) -m build --outdir dist . >/dev/null
	$(PKG_PYTHON) -m venv $(PKG_VENV)
	$(PKG_VENV)/bin/python -m pip install -q dist/functrain-*.whl
	cd /tmp && $(PKG_VENV)/bin/python $(CURDIR)/tests/package_smoke.py $(CURDIR)/README.md

demo: $(STAMP)
	$(PY) -c "import sklearn, tqdm, matplotlib" 2>/dev/null || $(PY) -m pip install -q -e ".[demo]"
	$(PY) examples/demo.py

# Fifteen optimizers and the record recipe x 10 seeds on a small character-level GPT, then the
# main rows on a 0.8M-parameter one: steps to a target validation loss, 95% intervals, Welch's
# tests against AdamW and Muon, the optimization track's validity and pairwise tests
# (docs/speedrun.md). Tuning the learning rates is separate and longer:
# $(PY) examples/speedrun.py [--model medium] --tune
speedrun: $(STAMP)
	$(PY) -c "import matplotlib, scipy" 2>/dev/null || $(PY) -m pip install -q -e ".[demo]" scipy
	$(PY) examples/speedrun.py
	$(PY) examples/speedrun.py --model medium

bench: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/run.py
	$(PY) benchmarks/beyond_optax.py
	$(PY) benchmarks/matrix_optimizers.py
	$(PY) benchmarks/matrix_ceilings.py
	$(PY) benchmarks/quantized_state.py
	$(PY) benchmarks/memory_options.py
	$(PY) benchmarks/newton_schulz.py
	$(PY) benchmarks/accumulation_memory.py
	$(PY) benchmarks/stacked_compile.py

# On a machine with a GPU and a CUDA JAX: the parity smoke on the GPU and the key benchmark
# tables, under 8 minutes, into benchmarks/results/device/ (benchmarks/device_check.sh).
bench-device:
	benchmarks/device_check.sh

# The documentation site, into docs/_build/html: strict (-W: warnings are errors; -n: every
# cross-reference must resolve). The notebooks are executed and cached in docs/_build.
# Small hard problems for every optimizer (benchmarks/lightbench.py): ~5 minutes on 2 cores.
lightbench: $(STAMP)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q -e ".[demo]"
	$(PY) benchmarks/lightbench.py

# docs/optimizers.md's optimizer tables, rewritten from each optimizer's @declare_optimizer
# (summary=, signature=, listed_with=) by docs/generate_tables.py, and the README's row of
# optax's core optimizers and table of optax.contrib's by family; tests/test_declarations.py
# fails, naming the rows, while a file differs from what this writes.
docs-tables: $(STAMP)
	$(PY) docs/generate_tables.py

DOCS_OUT ?= docs/_build/html

docs: $(STAMP)
	$(PY) -c "import sphinx, myst_nb, furo" 2>/dev/null || $(PY) -m pip install -q -e ".[docs]"
	$(PY) -m sphinx -b html -n -W --keep-going -q docs $(DOCS_OUT)
	@echo "site: $(DOCS_OUT)/index.html"

# Serve the built site, open it in headless Chromium (Debian's package), check it as a reader
# would, save screenshots in docs/_build/screenshots/.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

docs-check: docs
	command -v chromium >/dev/null || ($(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium)
	$(PY) -c "import playwright" 2>/dev/null || $(PY) -m pip install -q -e ".[docs-check]"
	$(PY) docs/check_site.py --site $(DOCS_OUT)

clean:
	rm -rf $(VENV) $(OLD_VENV) build dist *.egg-info docs/_build docs/notebooks
