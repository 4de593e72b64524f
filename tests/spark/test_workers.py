"""Starting a session's Python workers in the background (`compaction.spark.workers`) and what they are started
with (`compaction.spark.session`)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from compaction.spark.session import HUGE_PAGES, LOCAL_DEFAULTS, WORKER_MALLOC
from compaction.spark.table import load_rebuild_task
from compaction.spark.workers import start_workers


def test_every_task_of_the_start_runs_the_commands_load(spark: SparkSession, tmp_path: Path) -> None:
    def load() -> None:
        (tmp_path / f"{os.getpid()}-{uuid.uuid4().hex}").touch()

    starting = start_workers(spark, load)
    deadline = time.monotonic() + 120
    while not starting.done and time.monotonic() < deadline:
        time.sleep(0.1)
    starting.stop()
    assert starting.done and starting.error is None
    assert len(list(tmp_path.iterdir())) == spark.sparkContext.defaultParallelism


def test_a_start_still_running_is_cancelled_by_stop_and_the_session_goes_on(spark: SparkSession,
                                                                             tmp_path: Path) -> None:
    def load() -> None:
        (tmp_path / f"started-{uuid.uuid4().hex}").touch()
        time.sleep(300)

    starting = start_workers(spark, load)
    deadline = time.monotonic() + 120
    while not any(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not starting.done
    starting.stop(timeout_s=60)  # without the cancel the thread would wait out the 300 s sleep
    assert starting.done and starting.error is not None
    assert spark.range(10).count() == 10


def test_the_table_rebuilds_load_runs_in_a_worker(spark: SparkSession) -> None:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        load_rebuild_task()
        yield from batches

    assert spark.range(0, 2, 1, 2).mapInArrow(task, "id long").count() == 2


def test_the_workers_malloc_asks_for_huge_pages(spark: SparkSession) -> None:
    def env(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            yield pa.record_batch([pa.array([os.environ.get("GLIBC_TUNABLES")])], names=["tunables"])

    assert LOCAL_DEFAULTS[WORKER_MALLOC] == HUGE_PAGES
    seen = {r.tunables for r in spark.range(0, 2, 1, 2).mapInArrow(env, "tunables string").collect()}
    assert seen == {HUGE_PAGES}
