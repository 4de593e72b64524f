"""kcompact's errors raised in a Spark task come back to the driver as themselves (`compaction.spark.task_errors`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession

from compaction.errors import CorruptIndexError, ExitCode, KcompactError, ObjectExistsError
from compaction.spark.task_errors import kcompact_errors_from_tasks


def _raising(exc: Exception) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            raise exc
            yield batch

    return task


@pytest.mark.spark
def test_a_kcompact_error_in_a_task_is_raised_again_with_its_class_and_message(spark: SparkSession) -> None:
    message = "s3://b/t-0/00000000000000000000-x.index, byte 16: offset 3 not above the previous entry's 7"
    with pytest.raises(CorruptIndexError) as raised, kcompact_errors_from_tasks():
        spark.range(0, 1, 1, 1).mapInArrow(_raising(CorruptIndexError(message)), "id long").collect()
    assert str(raised.value) == message and raised.value.exit_code == ExitCode.CORRUPT_INPUT
    assert isinstance(raised.value.__cause__, PythonException)


@pytest.mark.spark
def test_other_failures_are_left_as_spark_raised_them(spark: SparkSession) -> None:
    with pytest.raises(PythonException), kcompact_errors_from_tasks():
        spark.range(0, 1, 1, 1).mapInArrow(_raising(ValueError("not ours")), "id long").collect()
    exists = ObjectExistsError("file:///x")  # its constructor takes the object, not the message
    with pytest.raises(KcompactError) as raised, kcompact_errors_from_tasks():
        spark.range(0, 1, 1, 1).mapInArrow(_raising(exists), "id long").collect()
    assert str(raised.value) == str(exists)
