# The two commands a new user needs: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit proto clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fleetwatch demo --nodes 4 --duration 30

test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	sh scripts/ensure-test-deps.sh
	$(BIN)/pytest

# Regenerate the wire code after editing the .proto (a test checks this was done).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
		fleetwatch/wire/v1/fleetwatch.proto

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
