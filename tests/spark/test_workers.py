"""What a session's Python workers are started with (`compaction.spark.session`)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from compaction.spark.session import HUGE_PAGES, LOCAL_DEFAULTS, WORKER_MALLOC


def test_the_workers_malloc_asks_for_huge_pages(spark: SparkSession) -> None:
    def env(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            yield pa.record_batch([pa.array([os.environ.get("GLIBC_TUNABLES")])], names=["tunables"])

    assert LOCAL_DEFAULTS[WORKER_MALLOC] == HUGE_PAGES
    seen = {r.tunables for r in spark.range(0, 2, 1, 2).mapInArrow(env, "tunables string").collect()}
    assert seen == {HUGE_PAGES}
