# ragserve: two commands do everything on a fresh machine.
#   make run   - create .venv, install, serve the application on the embedded CPU models
#   make test  - create .venv, install, lint and run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CONFIG ?= configs/local.yaml

.PHONY: install run test test-fast lint typecheck clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[cpu,test]"
	bash scripts/ensure-chromium.sh
	touch $(STAMP)

install: $(STAMP)

# `serve run` on a local Ray started without the dashboard and in Serve's high-throughput mode
# (HAProxy ingress, gRPC between replicas; deployments/platform.py). RAGSERVE_HIGH_THROUGHPUT=0
# runs Serve's default request path instead.
run: $(STAMP)
	$(BIN)/python -m deployments.platform run $(CONFIG)

# The checks CI runs before the tests: lint, formatting, types (config in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest --cov=app --cov-report=term-missing:skip-covered

# Unit tests without Ray and without the LLM. They do load the small packaged embedding model
# (all-MiniLM-L6-v2, a few seconds) where a test embeds real text; the slow-marked ones (the embedded
# Gemma engine) are skipped.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q -m "not slow"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .coverage
