"""Shared fixtures and the `spark` marker. The SparkSession (spark/ tests) and the moto server (integration/)
live in their own conftests.

Every test that uses the `spark` fixture is marked `spark`, so `pytest -m "not spark"` (`make test-fast`) runs
everything that needs no JVM. A test that starts Spark some other way must carry the marker itself; one that
does not fails at teardown, naming itself.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".numba-cache"))

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("soak", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("soak" if os.environ.get("KCOMPACT_SOAK") == "full" else "ci")

pytest_plugins = ["tests.moto_s3", "tests.s3_proxy"]  # moto_endpoint, fake_aws_env, proxy: integration/, spark/

SPARK_RUNNING = pytest.StashKey[bool]()


HEAVIEST_FIRST = ("spark/test_table.py", "kafka/test_cluster_failover.py", "spark/test_one_job.py",
                  "delta_readers/test_delta_readers.py", "spark/test_kafka_scenarios.py", "spark/test_verify.py",
                  "spark/test_partition_faults.py", "spark/test_clean_exit.py")
"""The modules that take longest (minutes each under `make test`), longest first."""
FOLDER_ORDER = ("spark", "kafka", "delta_readers", "integration", "cluster", "unit")
"""Then whole folders, the slowest per module first: unit tests last."""


def run_order(item: pytest.Item) -> tuple[int, int]:
    """Where `item`'s module goes: `make test` runs modules on two xdist workers (`--dist loadfile`), each taking the
    next module in this order when it is done (`--no-loadscope-reorder`: xdist would otherwise order modules by their
    number of tests, which puts a module of eight long tests after every module of a hundred short ones), so the
    longest go first and many short ones fill the end instead of one long module running on while the other worker
    sits idle (the longest-first rule of scheduling). Within a module the order is the file's."""
    path = item.path.as_posix()
    heavy = next((i for i, name in enumerate(HEAVIEST_FIRST) if path.endswith(f"tests/{name}")), len(HEAVIEST_FIRST))
    folder = next((i for i, name in enumerate(FOLDER_ORDER) if f"/tests/{name}/" in path), len(FOLDER_ORDER))
    return heavy, folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
    items.sort(key=run_order)  # stable: files keep their order within a folder, tests theirs within a file


def spark_running() -> bool:
    """Whether this process has a live SparkContext (pyspark is never imported just to ask)."""
    if "pyspark" not in sys.modules:
        return False
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[SPARK_RUNNING] = spark_running()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    started = not item.stash.get(SPARK_RUNNING, True) and spark_running()
    yield  # the fixtures' teardown runs whatever the verdict
    if started and item.get_closest_marker("spark") is None:
        pytest.fail(f"{item.nodeid} started Spark without the `spark` marker: mark it, so that "
                    "`pytest -m 'not spark'` leaves it out", pytrace=False)
