"""The table's tasks hand a kcompact error back as the exception itself (`compaction.topic_table.tasks`): pickled
with its class and fields, carried through the Spark job it fails (and so through Delta's command, which commits
nothing) and raised again by the driver (`compaction.spark.table.task_errors`), or raised as it is by a thread of the
driver (`run_here`). Other failures are left as Spark raised them. `tests/spark/test_table.py` runs a corrupt segment
through every path of the command."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession

from compaction.config import CompactionStrategy
from compaction.errors import CorruptIndexError, ExitCode, KcompactError, ObjectExistsError, RetryableError
from compaction.spark.table import task_errors, task_rows
from compaction.topic_table.target import table_schema
from compaction.topic_table.tasks import CarriedError, carried, portable, run_here, source_schema, tombstones

SCHEMA = table_schema(CompactionStrategy.OFFSET)
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
    """A task value yielding a row, then raising `exc` (or an `unpicklable` error of that message, made in the task);
    its class defined here so that Spark ships it by value."""
    @dataclass(frozen=True)
    class Raising:
        error: Exception | None
        message: str

        def rows(self) -> Iterator[pa.RecordBatch]:
            yield from task_yielding(b"before").rows()  # type: ignore[attr-defined]
            raise self.error or unpicklable(self.message)

    return Raising(exc, unpicklable_message)


def task_yielding(key: bytes) -> object:
    @dataclass(frozen=True)
    class Yielding:
        key: bytes

        def rows(self) -> Iterator[pa.RecordBatch]:
            yield from tombstones(pa.array([self.key]), 0, source_schema(SCHEMA)).to_batches()

    return Yielding(key)


def collected(spark: SparkSession, tasks: list[object]) -> list[bytes]:
    with task_errors():
        return sorted(bytes(r.key) for r in task_rows(spark, tasks, SCHEMA).collect())  # type: ignore[arg-type]


@pytest.mark.spark
def test_a_kcompact_error_in_a_task_comes_back_as_itself(spark: SparkSession) -> None:
    tasks = [task_yielding(b"a"), task_raising(corrupt()), task_yielding(b"b")]
    with pytest.raises(CorruptIndexError) as raised:
        collected(spark, tasks)
    assert_the_corrupt_error(raised.value)
    with pytest.raises(CorruptIndexError) as here:
        run_here(tasks, source_schema(SCHEMA))  # type: ignore[arg-type]
    assert_the_corrupt_error(here.value)
    assert collected(spark, [task_yielding(b"a"), task_yielding(b"b")]) == [b"a", b"b"]
    assert run_here([task_yielding(b"a")], source_schema(SCHEMA)).num_rows == 1  # type: ignore[list-item]


@pytest.mark.spark
def test_other_failures_are_left_as_spark_raised_them(spark: SparkSession) -> None:
    with pytest.raises(PythonException, match="not ours"):
        collected(spark, [task_raising(ValueError("not ours"))])


@pytest.mark.spark
def test_an_error_its_constructor_cannot_rebuild_or_pickle_keeps_its_message_and_exit_code(
        spark: SparkSession) -> None:
    exists = ObjectExistsError("file:///x")  # its constructor takes the object, not the message
    with pytest.raises(ObjectExistsError) as raised:
        collected(spark, [task_raising(exists)])
    assert str(raised.value) == str(exists) and raised.value.uri == "file:///x"
    with pytest.raises(KcompactError) as plain:
        collected(spark, [task_raising(unpicklable_message="the store said no")])
    assert type(plain.value) is KcompactError and str(plain.value) == "the store said no"
    assert plain.value.exit_code == ExitCode.RETRYABLE != KcompactError.exit_code


def test_portable_keeps_the_class_and_fields_and_a_carried_error_reads_back() -> None:
    try:
        raise corrupt()
    except CorruptIndexError as exc:
        assert_the_corrupt_error(portable(exc))
    assert type(portable(unpicklable("x"))) is KcompactError
    try:
        raise corrupt()
    except CorruptIndexError as exc:
        wrapped = RuntimeError(f"Job aborted: {CarriedError(exc)}")  # as Spark and py4j wrap it
    found = carried(wrapped)
    assert found is not None
    assert_the_corrupt_error(found)
    assert carried(RuntimeError("no error of ours")) is None
