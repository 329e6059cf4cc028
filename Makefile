# gpufleet developer tasks. `make test` is what CI runs (through .ci/run).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint crds chart-kinds clean k8s-binaries system-deps image test-images

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

## demo: validate, render and summarise the bundled example organisation, then simulate the
## bundled 6-hour trace on it and write the HTML report (no cluster needed)
demo: $(STAMP)
	$(BIN)/gpufleet validate examples/gitops
	$(BIN)/gpufleet render examples/gitops --target all -o build/demo-render
	$(BIN)/gpufleet capacity examples/gitops
	$(BIN)/gpufleet simulate --gitops examples/gitops --trace examples/traces/demo.csv \
	  --report build/demo-report.html --json build/demo-metrics.json
	@echo "open build/demo-report.html to see the report"

## test: create .venv, install gpufleet with its test dependencies, build the local control plane
## and the images its real node runs (first time only; cached), lint, type-check and run the suite
## (unit tests first, then cluster tests) (the Python install and the Go builds of a fresh
## machine run side by side: the one waits on downloads, the other on the CPUs)
test:
	@$(MAKE) --no-print-directory -j2 $(STAMP) k8s-binaries test-images
	@$(MAKE) --no-print-directory lint system-deps
	$(BIN)/pytest

## k8s-binaries: build kube-apiserver & co., Karpenter's kwok provider and the operators of the
## workload kinds (JobSet, Kubeflow Trainer, KubeRay) from Go modules into ~/.cache/gpufleet (cached)
k8s-binaries:
	@if command -v go >/dev/null 2>&1; then bash hack/k8s/build.sh; \
	elif [ -n "$$CI" ]; then echo "error: Go not found and CI is set: the cluster tests must run (install Go 1.26)"; exit 1; \
	else echo "warning: Go not found: the cluster tests will be skipped (install Go 1.26 to run them)"; fi

## lint: ruff, mypy, and the import contract in pyproject.toml (layers only import downwards, the
## library never imports the controller shell, no import circle between files)
lint: $(STAMP)
	$(BIN)/ruff check gpufleet controllers agent tests benchmarks scripts infra
	$(BIN)/ruff format --check gpufleet controllers agent tests benchmarks scripts infra
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

## system-deps: Debian packages some tests need, when we may install them: Prometheus (the
## metrics test), Chromium (the HTML report test) and PostgreSQL (the ledger tests; its server
## binaries are not on PATH, so it is found by pg_ctlcluster)
system-deps:
	bash hack/system-deps.sh

## image: build the gpufleet image without a container engine (Debian bookworm, its python3, the
## packages of hack/image/requirements.txt, gpufleet; non-root) as an OCI archive in build/image,
## with the pause image the harness's real nodes use; prints each digest and size
## (hack/image/build.sh; pushing it: docs/install-helm.md)
image:
	bash hack/image/build.sh

## test-images: `make image` for tests/cluster/test_install.py, where this machine can build it
## (root or mmdebstrap and umoci installed, Go for the pause image); CI set: a failure fails
test-images:
	@bash hack/image/build.sh >/dev/null || { \
	  if [ -n "$$CI" ]; then echo "error: make image failed (see above); CI is set"; exit 1; fi; \
	  echo "warning: make image failed: the real-node test will be skipped"; }

## chart-kinds: regenerate the chart's per-kind RBAC and admission rules from the kind registry
chart-kinds: $(STAMP)
	$(BIN)/python scripts/chart_kinds.py

## crds: regenerate charts/gpufleet/crds from the models
crds: $(STAMP)
	$(BIN)/gpufleet crds -o charts/gpufleet/crds

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
