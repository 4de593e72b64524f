"""The table's tasks hand a kcompact error back as a value (`compaction.topic_table.tasks`): the exception itself,
pickled with its class and fields, raised again by the driver, whether the task ran on Spark (an outcome, or a
reading task's rows through `compaction.spark.table.TaskErrors`) or in a thread of the driver (`run_here`). Other
failures are left as Spark raised them. `tests/spark/test_table.py` runs a corrupt segment through every path of
the command."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession

from compaction.errors import CorruptIndexError, ExitCode, KcompactError, ObjectExistsError, RetryableError
from compaction.spark.table import TaskErrors, run_tasks
from compaction.topic_table.target import DataFile
from compaction.topic_table.tasks import TaskOutcome, attempt, portable, run_here, succeeded

OBJECT = "s3://b/t-0/00000000000000000000-x.index"


def corrupt() -> CorruptIndexError:
    return CorruptIndexError("offset 3 not above the previous entry's 7", obj=OBJECT, position=16)


def unpicklable(message: str) -> RetryableError:
    """A kcompact error with a field that does not pickle (a lock), of a class defined here (shipped by value)."""
    class Unpicklable(RetryableError):
        def __init__(self, message: str) -> None:
            super().__init__(message)
            self.lock = threading.Lock()

    return Unpicklable(message)


def assert_the_corrupt_error(raised: BaseException) -> None:
    assert type(raised) is CorruptIndexError
    assert (raised.obj, raised.position, raised.detail) == (OBJECT, 16, "offset 3 not above the previous entry's 7")
    assert str(raised) == f"{OBJECT}, byte 16: offset 3 not above the previous entry's 7"
    assert raised.exit_code == ExitCode.CORRUPT_INPUT
    assert "Traceback" in raised.__notes__[-1]  # where the task raised it


def task_raising(exc: Exception | None = None, *, unpicklable_message: str = "") -> object:
    """A task value raising `exc` (or an `unpicklable` error of that message, made in the task); its class defined
    here so that Spark ships it by value."""
    @dataclass(frozen=True)
    class Raising:
        error: Exception | None
        message: str

        def run(self) -> TaskOutcome:
            def work() -> TaskOutcome:
                raise self.error or unpicklable(self.message)

            return attempt(work)

    return Raising(exc, unpicklable_message)


def task_writing(path: str) -> object:
    @dataclass(frozen=True)
    class Writing:
        path: str

        def run(self) -> TaskOutcome:
            return attempt(lambda: TaskOutcome(written=(DataFile(self.path, 0, 1, 1),)))

    return Writing(path)


@pytest.mark.spark
def test_a_kcompact_error_in_a_task_comes_back_as_itself(spark: SparkSession) -> None:
    tasks = [task_writing("a"), task_raising(corrupt()), task_writing("b")]
    with pytest.raises(CorruptIndexError) as raised:
        run_tasks(spark, tasks)  # type: ignore[arg-type]
    assert_the_corrupt_error(raised.value)
    with pytest.raises(CorruptIndexError) as here:
        succeeded(run_here(tasks))  # type: ignore[arg-type]
    assert_the_corrupt_error(here.value)
    done = run_tasks(spark, [task_writing("a"), task_writing("b")])  # type: ignore[list-item]
    assert [f.path for o in done for f in o.written] == ["a", "b"]


@pytest.mark.spark
def test_a_kcompact_error_of_a_reading_task_comes_back_as_itself(spark: SparkSession) -> None:
    def rows(ids: Iterable[int]) -> Iterator[pa.RecordBatch]:
        for i in ids:
            if i == 2:
                raise corrupt()
            yield pa.record_batch([pa.array([i], pa.int64())], names=["id"])

    errors = TaskErrors(spark)
    read = spark.range(0, 4, 1, 2).mapInArrow(errors.reading(rows, lambda b: b.column(0).to_pylist()), "id long")
    assert sorted(r.id for r in read.collect()) == [0, 1]  # the failed task stopped at its error
    with pytest.raises(CorruptIndexError) as raised:
        errors.check()
    assert_the_corrupt_error(raised.value)
    clean = TaskErrors(spark)
    assert spark.range(0, 2, 1, 2).mapInArrow(clean.reading(rows, lambda b: b.column(0).to_pylist()),
                                              "id long").count() == 2
    clean.check()


@pytest.mark.spark
def test_other_failures_are_left_as_spark_raised_them(spark: SparkSession) -> None:
    with pytest.raises(PythonException, match="not ours"):
        run_tasks(spark, [task_raising(ValueError("not ours"))])  # type: ignore[list-item]

    def rows(ids: Iterable[int]) -> Iterator[pa.RecordBatch]:
        raise ValueError("not ours either")
        yield

    errors = TaskErrors(spark)
    with pytest.raises(PythonException, match="not ours either"):
        spark.range(0, 1, 1, 1).mapInArrow(errors.reading(rows, lambda b: b.column(0).to_pylist()), "id long").collect()


@pytest.mark.spark
def test_an_error_its_constructor_cannot_rebuild_or_pickle_keeps_its_message_and_exit_code(
        spark: SparkSession) -> None:
    exists = ObjectExistsError("file:///x")  # its constructor takes the object, not the message
    with pytest.raises(ObjectExistsError) as raised:
        run_tasks(spark, [task_raising(exists)])  # type: ignore[list-item]
    assert str(raised.value) == str(exists) and raised.value.uri == "file:///x"
    with pytest.raises(KcompactError) as plain:
        run_tasks(spark, [task_raising(unpicklable_message="the store said no")])  # type: ignore[list-item]
    assert type(plain.value) is KcompactError and str(plain.value) == "the store said no"
    assert plain.value.exit_code == ExitCode.RETRYABLE != KcompactError.exit_code


def test_portable_keeps_the_class_and_fields() -> None:
    try:
        raise corrupt()
    except CorruptIndexError as exc:
        assert_the_corrupt_error(portable(exc))
    assert type(portable(unpicklable("x"))) is KcompactError
