PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test lint types test-only clean openapi

# `make run`: serve on 127.0.0.1:8080; with DATABASE_URL unset an embedded PostgreSQL
# starts in ./.tickgate and stops when the last local replica exits.
run: $(VENV)/.runtime
	$(BIN)/tickgate serve --host 127.0.0.1 --port 8080

# `make test`: lint, types, layer contracts, then every test against real PostgreSQL.
test: lint types test-only

lint: $(VENV)/.test
	$(BIN)/ruff check service tests
	$(BIN)/ruff format --check service tests
	$(BIN)/lint-imports

types: $(VENV)/.test
	$(BIN)/mypy

test-only: $(VENV)/.test
	$(BIN)/python -m pytest

$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.test: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.runtime

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
