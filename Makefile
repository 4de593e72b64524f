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

.PHONY: venv packages kernels cds test test-fast lint demo bench bench-wal soak clean java airflow-test kafka delta

# The venv (`make packages`), and the numba kernels compiled into compaction/**/__pycache__ for this CPU and a
# generic one (`make kernels`: compaction/prebuild/kernels.py, ~1-1.5 min), so that no run compiles them. Packages are
# installed by uv (from PyPI, into the venv first): the same versions pip resolves, in ~40 s from an empty cache where
# pip took ~75 s with a warm one, and ~10 s for the Airflow venv below where pip took minutes.
# Bytecode is compiled at install (uv's --compile-bytecode, as pip does by default; kcompact's own editable modules in
# `make kernels`): where a process may not write it (PYTHONDONTWRITEBYTECODE, a read-only install), every process,
# each Spark Python worker included, otherwise compiles the ~470 modules it imports (pandas, pyspark, numba) from
# source, ~1.3-1.9 s of CPU each time. docs/operating.md has the measured difference.
UV_VERSION := 0.13.9
UV := $(BIN)/uv
KERNELS := $(VENV)/.kernels
venv: $(STAMP) $(KERNELS)
packages: $(STAMP)
kernels: $(KERNELS)

$(UV):
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH"; exit 2; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet uv==$(UV_VERSION)

$(STAMP): pyproject.toml | $(UV)
	$(UV) pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[test]'
	@touch $(STAMP)

$(KERNELS): $(STAMP)
	$(BIN)/python -m compaction.prebuild.kernels
	$(BIN)/python -m compileall -q compaction
	@touch $(KERNELS)

# The Spark driver JVM's class-data-sharing archive (compaction/spark/cds.py: ~1-2 min once, ~160 MB under
# ~/.cache/kcompact), so that a fresh kcompact process starts its JVM from mapped classes. Cached per java + jars.
cds: packages java delta
	$(BIN)/python -m compaction.prebuild.cds

java:
	@command -v javac >/dev/null || { echo "installing a JDK (apt)"; apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless; }
	@command -v mvn >/dev/null || { echo "installing Maven (apt)"; apt-get update -qq && apt-get install -y -qq maven; }

# --durations: the slowest tests close the log, so a test that starts waiting on something (a store retrying a
# request until its timeout) shows up in CI's output before it eats the 45-minute budget.
# -n: pytest-xdist workers, each given whole test files (--dist loadfile: a module's fixtures, brokers and stores are
# built once) and its own SparkSession. Much of the suite's wall is waiting on JVMs and brokers, so 2 workers on 2
# cores finish sooner than one process; TEST_WORKERS=0 runs everything in this process (pytest's own -x, --pdb, -k).
# --no-loadscope-reorder: the workers take the modules in tests/conftest.py's order (`run_order`: the slowest first),
# not xdist's (most tests first, which left the modules of a few long tests for the end).
TEST_WORKERS ?= 2
test: venv java delta cds kafka
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=12 tests

# Everything but the tests marked `spark` (tests/conftest.py marks every user of the Spark fixture) or `kafka`
# (tests/kafka/): no JVM.
test-fast: venv
	$(BIN)/python -m pytest -q -m "not spark and not kafka" tests

# Kafka's own jars (kafka/runtime/pom.xml, the version pinned in kafka/pom.xml) from Maven Central into
# .kafka/libs, and the Java harnesses under kafka/ built against them into .kafka/: what tests/kafka/ runs as the
# referee. Cached; fails at once,
# naming the artifact, when Maven Central cannot serve it.
kafka: java
	bash scripts/kafka_runtime.sh

# delta-spark's JVM half (delta/pom.xml: delta-spark, delta-storage, hadoop-aws and the AWS SDK bundle) from Maven
# Central into .delta-jars, which every session kcompact launches puts on its class path (compaction/spark/delta.py).
# ~720 MB the first time; cached; fails at once, naming the artifact, when Maven Central cannot serve it.
delta: packages java
	bash scripts/delta_runtime.sh

lint: packages
	$(BIN)/ruff check compaction tests jobs scripts examples
	$(BIN)/mypy

demo: venv java delta cds
	bash scripts/demo.sh

# Issue 13's goals a-f into BENCHMARKS.md (workloads cached under bench-data/). BENCH_ARGS="--only P2K,P6"
# refreshes some sections; BENCH_ARGS=--quick checks the harness on ~1/64 sizes into bench-data/quick/.
# P9 runs a Kafka broker with the tiered plugin: `make kafka`'s jars.
bench: venv java delta cds kafka
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

# The WAL's figures (issue 15): upload, read and roll on two >= 1 GiB shapes, into BENCHMARKS.md's "W" section.
bench-wal: venv java
	$(BIN)/python scripts/bench_wal.py

soak: venv java kafka
	KCOMPACT_SOAK=full $(BIN)/python -m pytest -q tests -k soak

# The example DAG against real Airflow, in a venv of its own: the Spark provider requires pyspark-client,
# whose `pyspark` package would replace pyspark in $(VENV). ~30 s and ~700 MB the first time (uv).
AIRFLOW_VENV := .venv-airflow
airflow-test: packages
	@test -x $(AIRFLOW_VENV)/bin/python || $(PY) -m venv $(AIRFLOW_VENV)
	$(UV) pip install --quiet --python $(AIRFLOW_VENV)/bin/python apache-airflow==3.3.2 \
		apache-airflow-providers-apache-spark==6.3.4 pytest==9.2.0 deltalake==1.6.6 pyarrow==26.0.1 PyYAML==6.0.3
	PYTHONPATH=$(CURDIR) $(AIRFLOW_VENV)/bin/python -m pytest -q --noconftest -p no:cacheprovider \
		tests/integration/test_airflow_dag.py

# The Python environment executors unpack from spark.archives (conf/spark-defaults.conf): a venv-pack of a
# wheel install of kcompact and its dependencies but pyspark and delta-spark (scripts/pack_env.py), cached under
# .dist-cache/.
.PHONY: dist cluster-test cluster-test-prebuilt
dist: packages
	$(BIN)/python scripts/pack_env.py --python $(PY)

# kcompact on a Spark standalone cluster (tests/cluster/): a master and two workers on 127.0.0.1, spark-submit
# of jobs/ against S3 (moto), executors running from dist/kcompact-env.tar.gz. A few minutes.
CLUSTER_TEST = KCOMPACT_CLUSTER_TEST=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/cluster
cluster-test: venv java dist
	$(CLUSTER_TEST)

# The same on the dist/ an earlier `make dist` built (.ci/run builds it while make test runs).
cluster-test-prebuilt: venv java
	$(CLUSTER_TEST)

clean:
	rm -rf $(VENV) $(AIRFLOW_VENV) .delta-jars .kafka .dist-cache dist build .numba-cache kcompact-store kcompact-tables demo-logdir .pytest_cache .mypy_cache
