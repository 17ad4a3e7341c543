# The two commands a newcomer needs:  `make demo`  and  `make test`.
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: help bootstrap test unit k8s lint format crds demo bench clean

help:
	@echo "make demo   run tinct end to end on a local control plane"
	@echo "make test   lint, type-check and run every test (unit + real kube-apiserver)"
	@echo "make unit   unit tests only (no control plane)"
	@echo "make crds   regenerate crds/ from the API models"

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

format: bootstrap
	$(BIN)/ruff check --fix src tests bench scripts
	$(BIN)/ruff format src tests bench scripts

crds: bootstrap
	$(BIN)/tinct crds --out crds

demo: bootstrap
	$(BIN)/python scripts/demo.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
