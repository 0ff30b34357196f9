# ragserve: two commands do everything on a fresh machine.
#   make run   - create .venv, install what serving needs, serve the application on the embedded CPU models
#   make test  - also install the test tools (and Chromium), lint and run the whole test suite
# Each installs through its own stamp: `make run` after `make test` installs nothing, `make test`
# after `make run` adds only the test extras; a change to pyproject.toml re-installs both.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
CONFIG ?= configs/local.yaml

.PHONY: install run test test-fast lint typecheck clean

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

test: lint typecheck
	$(BIN)/python -m pytest --cov=ragserve --cov-report=term-missing:skip-covered

# Unit tests without Ray and without the LLM. They do load the small packaged embedding model
# (all-MiniLM-L6-v2, a few seconds) where a test embeds real text; the slow-marked ones (the embedded
# Gemma engine) are skipped.
test-fast: $(TEST_STAMP)
	$(BIN)/python -m pytest tests/unit -q -m "not slow"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .coverage
