"""Starting a fresh session's Python workers while the driver plans.

A session's Python workers start with its first Python job: each forks from Spark's daemon, imports kcompact and
loads the numba kernels its task calls (from the cache `make venv` fills). In a fresh `kcompact` process that
start sits between the plan and the first task, every core idle meanwhile. `start_workers` runs it as a job of its
own, one task per core, in a background thread, while the driver plans (reading the metadata table, walking
transaction headers); the run's first job then takes the started workers (`spark.python.worker.reuse`, which
kcompact's sessions set). A run that submits no job (nothing to do, a dry run) cancels the start when it ends.

Only a session the command launches itself starts its workers so: a notebook's or a long-lived session's are
started already.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import SparkSession


class WorkerStart:
    """A background job starting the session's Python workers (`start_workers`); `stop` ends it."""

    def __init__(self, spark: SparkSession, load: Callable[[], None]) -> None:
        self._spark = spark
        self._group = f"kcompact-worker-start-{uuid.uuid4().hex}"
        self.error: Exception | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, args=(load,), name="kcompact-worker-start", daemon=True)
        self._thread.start()

    def _run(self, load: Callable[[], None]) -> None:
        spark = self._spark
        try:
            spark.sparkContext.setJobGroup(self._group, "kcompact: starting the Python workers", True)
            cores = max(1, spark.sparkContext.defaultParallelism)
            if not self._stopping:
                spark.range(0, cores, 1, cores).mapInArrow(_loading(load), "id long").collect()
        except Exception as exc:  # cancelled, or a failure the run's own job meets again and reports
            self.error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Cancel the job if it still runs (its tasks end where they are) and wait for the thread. A job not
        submitted yet is not submitted; cancelling a group with no active job would only log a warning."""
        self._stopping = True
        if self._thread.is_alive():
            with contextlib.suppress(Exception):  # the context may be stopping already
                tracker = self._spark.sparkContext.statusTracker()
                if set(tracker.getJobIdsForGroup(self._group)) & set(tracker.getActiveJobsIds()):
                    self._spark.sparkContext.cancelJobGroup(self._group)
        self._thread.join(timeout_s)


def start_workers(spark: SparkSession, load: Callable[[], None]) -> WorkerStart:
    """Start the session's Python workers in the background: a job of one task per core (the default
    parallelism), each calling `load` (a module-level function: import a command's modules, load its kernels).
    Returns at once; call `stop()` on the result before stopping the session."""
    return WorkerStart(spark, load)


def _loading(load: Callable[[], None]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        load()
        yield from batches

    return task


__all__ = ["WorkerStart", "start_workers"]
