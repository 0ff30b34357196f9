# ragserve: two commands do everything on a fresh machine.
#   make run   - create .venv, install what serving needs, serve the application on the embedded CPU models
#   make test  - also install the test tools (and Chromium), lint and run the whole test suite
#   make coverage - the same suite with line coverage (about twice as slow in-process)
#   make gpu-check - on an NVIDIA GPU machine: the gpu extra in .venv-gpu, the application on vLLM and CUDA
# Each installs through its own stamp: `make run` after `make test` installs nothing, `make test`
# after `make run` adds only the test extras; a change to pyproject.toml re-installs both.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
CONFIG ?= configs/local.yaml

# make gpu-check: the GPU extra in a venv of its own (vLLM pins a CUDA torch where .[cpu] pins a CPU one,
# and faiss-gpu and faiss-cpu write the same package), installed once behind its stamp.
GPU_VENV   ?= .venv-gpu
GPU_BIN    := $(GPU_VENV)/bin
GPU_STAMP  := $(GPU_VENV)/.installed-gpu
GPU_CHECK_ARGS ?=

.PHONY: install run test coverage test-fast lint typecheck clean gpu-check gpu-preflight

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[cpu]"
	touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install -q -e ".[cpu,test]"
	bash scripts/ensure-chromium.sh
	touch $(TEST_STAMP)

install: $(RUN_STAMP)

# `serve run` on a local Ray started without the dashboard and in Serve's high-throughput mode
# (HAProxy ingress, gRPC between replicas; ragserve/deployments/platform.py). RAGSERVE_HIGH_THROUGHPUT=0
# runs Serve's default request path instead. PORT=8100 (or RAGSERVE_PORT, which the CLI's default
# URL follows too) serves on another port; it prints a line when the server is ready.
run: $(RUN_STAMP)
	$(if $(PORT),RAGSERVE_PORT=$(PORT) )$(BIN)/python -m ragserve.deployments.platform run $(CONFIG)

# The checks CI runs before the tests: lint, formatting, types (config in pyproject.toml).
lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(TEST_STAMP)
	$(BIN)/mypy

# Two pytest-xdist workers (TEST_WORKERS=0 runs in one process), a test file to one worker (its
# module-scoped fixtures start Ray and deploy an application once): on two cores one file's waits on
# Ray overlap another's CPU. (--dist loadgroup would spread the benchmark smokes too, but xdist 3.8
# cannot regroup node ids under pytest 9.2.) PYTHONFAULTHANDLER: a crash after the last test (at a
# worker's exit) still prints where it was.
TEST_WORKERS ?= 2
PYTEST_PARALLEL = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
test: lint typecheck
	PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest $(PYTEST_PARALLEL) --durations=30

# The same suite with line coverage of ragserve. Not part of `make test`: on Python 3.11 coverage's
# tracer doubles the time of in-process tests (tests/unit/rag and test_dos_shapes: 115 against 53 s),
# and nothing gates on the figure.
coverage: lint typecheck
	$(BIN)/python -X faulthandler -m pytest --cov=ragserve --cov-report=term-missing:skip-covered --durations=30

# Unit tests without Ray and without the LLM. They do load the small packaged embedding model
# (all-MiniLM-L6-v2, a few seconds) where a test embeds real text; the slow-marked ones (the embedded
# Gemma engine) are skipped.
test-fast: $(TEST_STAMP)
	$(BIN)/python -X faulthandler -m pytest tests/unit -q -m "not slow"

# GPU readiness in one command (benchmarks/gpu_check.py, README "GPU check"): the machine first (any
# python3, no install: a CPU machine stops here in a second), then the gpu extra, then the application
# on vLLM, faiss-gpu and CUDA against its parts alone. GPU_CHECK_ARGS="--quick --json out.json".
gpu-preflight:
	$(PYTHON) -m benchmarks.gpu_check preflight --venv $(GPU_VENV)

$(GPU_STAMP): pyproject.toml | gpu-preflight
	test -x $(GPU_BIN)/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_BIN)/python -m benchmarks.gpu_check install
	touch $(GPU_STAMP)

gpu-check: gpu-preflight $(GPU_STAMP)
	PYTHONUNBUFFERED=1 $(GPU_BIN)/python -m benchmarks.gpu_check run $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(GPU_VENV) .pytest_cache .ruff_cache .coverage
