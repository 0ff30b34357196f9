# ragserve: two commands do everything on a fresh machine.
#   make run   - create .venv, install, serve the application on the embedded CPU models
#   make test  - create .venv, install, lint and run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CONFIG ?= configs/local.yaml

.PHONY: install run test test-fast lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[cpu,test]"
	bash scripts/ensure-chromium.sh
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/serve run $(CONFIG)

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest --cov=app --cov-report=term-missing:skip-covered

# Unit tests only (milliseconds each, no Ray, no models).
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .coverage
