"""kcompact: Kafka log compaction for segments in object storage, as a Spark batch job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compaction.errors import (
    CommitConflictError,
    ConfigError,
    CorruptInputError,
    FencedError,
    KcompactError,
    RetryableError,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from compaction.storage import ObjectStore


def read_partition(spark: SparkSession, store: ObjectStore, topic: str, partition: int, **options: Any) -> DataFrame:
    """A partition's consumer view as a DataFrame (see `compaction.spark.read.read_partition`)."""
    from compaction.spark.read import read_partition as _read

    return _read(spark, store, topic, partition, **options)


__all__ = [
    "CommitConflictError",
    "ConfigError",
    "CorruptInputError",
    "FencedError",
    "KcompactError",
    "RetryableError",
    "read_partition",
]
