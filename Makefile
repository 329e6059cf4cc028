# gpufleet developer tasks. `make test` is what CI runs (through .ci/run).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint crds clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

## demo: validate, render and summarise the bundled example organisation (no cluster needed)
demo: $(STAMP)
	$(BIN)/gpufleet validate examples/gitops
	$(BIN)/gpufleet render examples/gitops --target all -o build/demo-render
	$(BIN)/gpufleet capacity examples/gitops

## test: create .venv, install gpufleet with its test dependencies, lint, type-check and run the suite
test: $(STAMP) lint
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check gpufleet controllers agent tests benchmarks
	$(BIN)/ruff format --check gpufleet controllers agent tests benchmarks
	$(BIN)/mypy

## crds: regenerate charts/gpufleet/crds from the models
crds: $(STAMP)
	$(BIN)/gpufleet crds -o charts/gpufleet/crds

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
