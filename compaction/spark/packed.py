"""Driver-side descriptors (one row per segment or file to read) as a DataFrame whose Spark partitions are the tasks
`compaction.packing` packs them into by bytes: a task reads many small items, a large item has a task of its own.

Built on the JVM (`local_frame`) and laid out by `repartition(n, task)` on task keys that each land in a partition of
their own (`slot_keys`): no Python task converts the rows, and the tasks are exactly the packed ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from compaction.packing import pack_for
from compaction.spark.local import local_frame
from compaction.spark.winners import slot_keys

_TASK = "_task"


def packed_frame(spark: SparkSession, rows: Sequence[Sequence[Any]], sizes: Sequence[int], schema: StructType
                 ) -> DataFrame:
    """`rows` (tuples in `schema`'s column order, one per item of `sizes` bytes) as a DataFrame of `schema` with one
    Spark partition per task `compaction.packing.pack_for` gives on this session's cores (one, empty, when there
    are no rows)."""
    tasks = pack_for(sizes, spark.sparkContext.defaultParallelism)
    keys = slot_keys(len(tasks))
    tagged = [(key, *rows[i]) for task, key in zip(tasks, keys, strict=True) for i in task]
    frame = local_frame(spark, tagged, StructType([StructField(_TASK, LongType(), False), *schema.fields]))
    return frame.repartition(max(1, len(tasks)), _TASK).drop(_TASK)


__all__ = ["packed_frame"]
