"""What a session's Python workers are started with (`compaction.spark.session`)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from compaction.spark.session import DAEMON_MODULE, LOCAL_DEFAULTS, NO_HUGE_PAGE_REQUESTS, WORKER_HUGE_PAGES


def test_the_workers_numpy_does_not_ask_for_huge_pages(spark: SparkSession) -> None:
    """numpy reads its setting when it is imported: each worker's numpy has it off (asked of numpy itself, whose
    setter returns the setting it replaces), where the driver's own is left as the user's environment has it."""

    def setting(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from numpy._core.multiarray import _set_madvise_hugepage

        for _ in batches:
            asks = _set_madvise_hugepage(False)
            _set_madvise_hugepage(asks)
            yield pa.record_batch([pa.array([os.environ.get("NUMPY_MADVISE_HUGEPAGE")]), pa.array([asks])],
                                  names=["env", "asks"])

    assert LOCAL_DEFAULTS[WORKER_HUGE_PAGES] == NO_HUGE_PAGE_REQUESTS
    rows = spark.range(0, 2, 1, 2).mapInArrow(setting, "env string, asks boolean").collect()
    assert {(r.env, r.asks) for r in rows} == {(NO_HUGE_PAGE_REQUESTS, False)}


def test_the_workers_import_pyspark_from_its_installed_package(spark: SparkSession) -> None:
    """Not from the zip of its sources Spark puts first on their path (`compaction.spark.daemon`), which Python
    compiles again in every daemon and worker; their path is the rest of the daemon's."""
    import py4j
    import pyspark

    def origins(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import sys

        import py4j as worker_py4j
        import pyspark as worker_pyspark

        for _ in batches:
            zips = [p for p in sys.path if p.endswith(".zip") and "pyspark" in p]
            yield pa.record_batch([pa.array([worker_pyspark.__file__]), pa.array([worker_py4j.__file__]),
                                   pa.array([":".join(zips)])], names=["pyspark", "py4j", "zips"])

    assert LOCAL_DEFAULTS[DAEMON_MODULE] == "compaction.spark.daemon"
    rows = spark.range(0, 2, 1, 2).mapInArrow(origins, "pyspark string, py4j string, zips string").collect()
    assert {(r.pyspark, r.py4j, r.zips) for r in rows} == {(pyspark.__file__, py4j.__file__, "")}


def test_the_workers_reuse_the_memory_they_free(spark: SparkSession) -> None:
    """Their daemon told their allocator to keep what they free (`compaction.spark.daemon.keep_freed_memory`): an
    array allocated after one of the same size was freed reuses its pages, where by default each is a new mapping
    whose every page faults again (16,385 faults for 64 MiB in 4 KiB pages)."""

    def faults(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import resource

        import numpy as np

        def filled() -> int:  # the page faults of filling a fresh 64 MiB array
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            array = np.ones(64 << 20, np.uint8)
            after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            del array
            return after - before

        for _ in batches:
            first = filled()
            yield pa.record_batch([pa.array([first]), pa.array([filled()])], names=["first", "second"])

    rows = spark.range(0, 2, 1, 2).mapInArrow(faults, "first long, second long").collect()
    assert len(rows) == 2
    # the first may reuse what the worker freed before (0 faults); the second reuses the first's pages, where without
    # the setting it faults as many pages as the first did (huge pages or not)
    assert all(10 * r.second <= r.first for r in rows), [(r.first, r.second) for r in rows]
