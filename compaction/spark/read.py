"""`read_partition`: a partition's consumer view as a DataFrame, one Spark task per live segment.

The driver reads only metadata (and, for read_committed, the transaction indexes and open transactions);
executors open the store themselves from its picklable `StoreSpec` and decode their segment into Arrow columns
with the compaction scan's kernels (`compaction.reader.segment_batches`): no Python per record. Its records are
those of `kcompact read`'s record-by-record path (`reader.segment_records`), tested against each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from compaction.reader import ConsumerRead, Isolation, SegmentRef, consumer_read, log_refs, segment_batches
from compaction.spark.local import local_frame
from compaction.storage.base import ObjectStore, StoreSpec

RECORD_STRUCT = StructType(
    [
        StructField("offset", LongType(), False),
        StructField("timestamp", LongType(), False),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField(
            "headers",
            ArrayType(StructType([StructField("key", StringType(), False), StructField("value", BinaryType(), True)])),
            False,
        ),
    ]
)
_DESCRIPTOR = StructType(
    [
        StructField("start_offset", LongType(), False),
        StructField("end_offset", LongType(), False),
        StructField("log_key", StringType(), False),
        StructField("txn_index_key", StringType(), True),
        StructField("offset_index_key", StringType(), True),
        StructField("wal", BooleanType(), False),
        StructField("start_position", LongType(), False),
        StructField("end_position", LongType(), True),
    ]
)


def _decoder(spec: StoreSpec, read: ConsumerRead) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = spec.open()
        for descriptors in batches:
            for d in descriptors.to_pylist():
                yield from segment_batches(store, SegmentRef(**d), read)

    return decode


def read_partition(
    spark: SparkSession,
    store: ObjectStore,
    topic: str,
    partition: int,
    *,
    from_offset: int = 0,
    isolation: str = "read_uncommitted",
    version: int | None = None,
) -> DataFrame:
    """What a consumer of `topic`-`partition` would receive, in offset order, as a DataFrame.

    Columns: offset, timestamp, key (binary), value (binary), headers (array<struct<key, value>>). Reads the
    live segments at metadata table `version` (default: the latest), then the WAL tail (`compaction.wal`), one
    task per segment or WAL slice. Idempotent; reads only.
    """
    refs = [r for r in log_refs(store, topic, partition, version) if r.end_offset >= from_offset]
    read = consumer_read(store, refs, from_offset, Isolation.parse(isolation))
    rows = [(r.start_offset, r.end_offset, r.log_key, r.txn_index_key, r.offset_index_key, r.wal, r.start_position,
             r.end_position) for r in refs]
    descriptors = local_frame(spark, rows, _DESCRIPTOR).repartition(max(1, len(rows)), "start_offset")
    decoded = descriptors.mapInArrow(_decoder(store.spec, read), RECORD_STRUCT)
    return decoded.orderBy("offset")
