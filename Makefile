# kcompact: `make demo` and `make test` are the two commands a fresh machine needs.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(BIN))/python
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN))/python
export SPARK_LOCAL_IP := 127.0.0.1
export NUMBA_CACHE_DIR := $(abspath .numba-cache)

.PHONY: venv test lint demo bench soak clean java

venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH"; exit 2; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

java:
	@command -v java >/dev/null || { echo "installing a JDK (apt)"; apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; }

test: venv java
	$(BIN)/python -m pytest -q tests

lint: venv
	$(BIN)/ruff check compaction tests jobs scripts
	$(BIN)/mypy

demo: venv java
	bash scripts/demo.sh

bench: venv java
	$(BIN)/python scripts/bench.py

soak: venv java
	KCOMPACT_SOAK=full $(BIN)/python -m pytest -q tests -k soak

clean:
	rm -rf $(VENV) .numba-cache kcompact-store demo-logdir .pytest_cache .mypy_cache
