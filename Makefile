# The two commands a new user needs: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The straggler test (tests/unit/collector/jobs/test_torch_job.py) runs a real torch.distributed job
# (tests/jobs/torch_job.py: 4 gloo ranks on the CPU), so the tests need torch, and mypy, which
# checks that script, too. It is no dependency of fleetwatch: installed into the venv only when
# missing, pinned to the version whose CPU build this machine has (plain `torch` would pull GBs of
# CUDA packages).
# The framework callbacks' tests (tests/unit/fleetwatch/integrations/) train a tiny model with the
# real Hugging Face Trainer (transformers, and accelerate, which its Trainer needs) and the real
# Lightning Trainer (pytorch-lightning: the same Trainer as the `lightning` package, which installs
# it and more), and mypy checks fleetwatch/integrations/ against them. They depend on torch, so
# they are installed here, with the torch pin, and not in the [dev] extra: pip would install that
# before this line and fetch a CUDA torch from PyPI for them. About 290 MB and 25-50 s more (with
# numpy, tokenizers, safetensors, huggingface-hub, torchmetrics, aiohttp). Checked by version: one
# missing or different reinstalls the set.
TORCH_PINS := torch==2.13.0 transformers==5.24.0 accelerate==1.15.0 pytorch-lightning==2.6.6
TORCH := $(BIN)/python -c 'import sys, importlib.metadata as m; sys.exit(any(m.version(n).split("+")[0] != v for n, v in (p.split("==") for p in sys.argv[1:])))' $(TORCH_PINS) 2>/dev/null || $(BIN)/python -m pip install --quiet $(TORCH_PINS)

.PHONY: demo test lint typecheck rules unit proto dashboards clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fleetwatch demo --nodes 4 --duration 30

test: $(STAMP) lint typecheck rules unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(TORCH)
	$(BIN)/mypy

# The built-in rules must load cleanly and pass their own unit tests (docs/rules.md).
rules: $(STAMP)
	$(BIN)/fleetwatch rules check
	$(BIN)/fleetwatch rules test rules/default_test.yaml

unit: $(STAMP)
	sh scripts/ensure-test-deps.sh
	$(TORCH)
	$(BIN)/pytest

# Regenerate the wire code after editing the .proto (a test checks this was done).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
		fleetwatch/wire/v1/fleetwatch.proto

# Regenerate the Grafana JSON after editing dashboards/*.py (a test checks this was done).
dashboards: $(STAMP)
	$(BIN)/python -m dashboards.build

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
