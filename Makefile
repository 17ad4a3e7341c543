# The two commands a newcomer needs:  `make demo`  and  `make test`.
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=
# Parallel test workers (pytest-xdist) of `make test`, `make integration` and `make k8s`: the
# control-plane tests mostly wait on the API server, so two share two cores; each worker starts
# its own control plane, and the e2e tier runs whole in one. 0: one process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))
# `make unit` runs in two workers (its tests are in-process and independent); 0: one process.
UNIT_WORKERS ?= 2
UNIT_XDIST = $(if $(filter 0,$(UNIT_WORKERS)),,-n $(UNIT_WORKERS))


.PHONY: help bootstrap test unit integration k8s e2e lint format crds docs demo dev bench clean

# Every target carries a `## what it does` comment on its line; `make help` prints them.
help: ## list the targets and what each does
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z0-9-]*:.*## / {printf "make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

bootstrap: ## install what the rest needs: .venv, and the Go-built binaries (cached)
	@scripts/bootstrap.sh

lint: bootstrap ## ruff (lint and format check) and mypy --strict
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts
	$(BIN)/mypy

test: lint ## lint, type-check and run every test (unit, integration, real kube-apiserver, real node)
	$(BIN)/pytest $(XDIST) --durations=30 $(PYTEST_ARGS)

unit: bootstrap ## the fast tests, tests/unit (under a minute, in two workers)
	$(BIN)/pytest $(UNIT_XDIST) tests/unit $(PYTEST_ARGS)

integration: bootstrap ## tests/integration: no cluster, real processes that take seconds each
	$(BIN)/pytest $(XDIST) tests/integration $(PYTEST_ARGS)

k8s: bootstrap ## only the tests on the real control plane
	$(BIN)/pytest $(XDIST) -m k8s $(PYTEST_ARGS)

e2e: bootstrap ## the chart from the image on a real node (root; see README)
	$(BIN)/pytest -m e2e $(PYTEST_ARGS)

format: bootstrap ## fix what ruff can fix and format the code
	$(BIN)/ruff check --fix src tests bench scripts
	$(BIN)/ruff format src tests bench scripts

crds: bootstrap ## regenerate crds/ (and the chart's copy) from the API models
	$(BIN)/tinct crds --out crds
	cp crds/tinct.io_*.yaml charts/tinct/crds/

# Needs only the virtualenv and the docs extra (mkdocs, mkdocs-material), not the Go-built binaries.
docs: ## build the docs site into site/, strict: a broken link, an unlisted page or a stale reference fails
	@test -x $(BIN)/python || python3 -m venv $(VENV)
	@test -x $(BIN)/uv || $(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[docs]"
	$(BIN)/python scripts/docs_ref.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# make demo and make dev install only what they run (TINCT_BOOTSTRAP in scripts/bootstrap.sh).
demo: ## run tinct end to end on a local control plane, then tear it down
	@TINCT_BOOTSTRAP=demo scripts/bootstrap.sh
	$(BIN)/python scripts/demo.py

# Stays up until Ctrl-C; prints the KUBECONFIG to export. See the README's walk-through.
# DEV_ARGS: its options, e.g. DEV_ARGS="--dir /tmp/tinct-dev2 --router-port 8081" for a second one.
dev: ## a local tinct that stays up until Ctrl-C (see the README)
	@TINCT_BOOTSTRAP=dev scripts/bootstrap.sh
	$(BIN)/python scripts/dev.py $(DEV_ARGS)

# Each benchmark prints progress on stderr and a last line of JSON; they take minutes.
bench: bootstrap ## run the benchmarks in bench/ (minutes; each prints a JSON line)
	$(BIN)/python bench/controlplane.py
	$(BIN)/python bench/artifacts.py
	$(BIN)/python bench/lineage.py
	$(BIN)/python bench/router.py
	$(BIN)/python bench/router_code.py
	$(BIN)/python bench/release.py
	$(BIN)/python bench/node.py

clean: ## remove the virtualenv, the tools' caches and the built docs site
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
