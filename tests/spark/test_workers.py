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
