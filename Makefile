# The two commands a newcomer needs:  `make demo`  and  `make test`.
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: help bootstrap test unit k8s e2e lint format crds demo dev bench clean

help:
	@echo "make demo   run tinct end to end on a local control plane"
	@echo "make dev    a local tinct that stays up (control plane, Prometheus, operator, router, schedulers)"
	@echo "make test   lint, type-check and run every test (unit + real kube-apiserver)"
	@echo "make unit   unit tests only (no control plane)"
	@echo "make e2e    the chart from the image on a real node (root; see README)"
	@echo "make crds   regenerate crds/ from the API models"
	@echo "make bench  run the benchmarks in bench/ (minutes; each prints a JSON line)"

bootstrap:
	@scripts/bootstrap.sh

lint: bootstrap
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts
	$(BIN)/mypy

test: lint
	$(BIN)/pytest $(PYTEST_ARGS)

unit: bootstrap
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

k8s: bootstrap
	$(BIN)/pytest -m k8s $(PYTEST_ARGS)

e2e: bootstrap
	$(BIN)/pytest -m e2e $(PYTEST_ARGS)

format: bootstrap
	$(BIN)/ruff check --fix src tests bench scripts
	$(BIN)/ruff format src tests bench scripts

crds: bootstrap
	$(BIN)/tinct crds --out crds

demo: bootstrap
	$(BIN)/python scripts/demo.py

# Stays up until Ctrl-C; prints the KUBECONFIG to export. See the README's walk-through.
dev: bootstrap
	$(BIN)/python scripts/dev.py

# Each benchmark prints progress on stderr and a last line of JSON; they take minutes.
bench: bootstrap
	$(BIN)/python bench/controlplane.py
	$(BIN)/python bench/artifacts.py
	$(BIN)/python bench/lineage.py
	$(BIN)/python bench/router.py
	$(BIN)/python bench/release.py
	$(BIN)/python bench/node.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
