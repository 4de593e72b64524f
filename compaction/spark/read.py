"""`read_partition`: a partition's consumer view as a DataFrame, one Spark task per live segment or WAL slice.

The driver reads only metadata (and, for read_committed, the transaction indexes and the batch headers that tell
which transactions are still open: the read stops at the log's last stable offset, as a consumer does);
executors open the store themselves from its picklable `StoreSpec` and decode their piece into Arrow columns
with the compaction scan's kernels (`compaction.reader.segment_batches`): no Python per record. Its records are
those of `kcompact read`'s record-by-record path (`reader.segment_records`), tested against each other.

The offset order is kept by construction, not by a sort: the DataFrame's partition i is the log's i-th piece
(`spark.range` with one id per partition, no shuffle), and a piece's records come out in offset order. A global
`orderBy("offset")` would cost a sampling job over the whole read and a shuffle of every value: measured, more
than the whole read without it, for anything that materializes the rows (scripts/bench_notes.md, P8 analysis).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from compaction.errors import ConfigError
from compaction.reader import (
    ConsumerRead,
    Isolation,
    SegmentRef,
    consumer_pieces,
    consumer_read,
    log_refs,
    segment_batches,
)
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


def _decoder(spec: StoreSpec, read: ConsumerRead, pieces: Sequence[SegmentRef]
             ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A task's decode: the pieces whose index its `id` column holds (one: its partition's), in order.

    The pieces ride in the closure beside `read` (a few hundred bytes each) rather than as rows: rows would
    need a shuffle to put one piece in each task, and that shuffle loses their order.
    """
    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = spec.open()
        for ids in batches:
            for i in ids.column(0).to_pylist():
                yield from segment_batches(store, pieces[i], read)

    return decode


def partition_read(store: ObjectStore, refs: Sequence[SegmentRef], from_offset: int, isolation: Isolation, *,
                   stable_offset: int | None = None) -> tuple[ConsumerRead, list[SegmentRef]]:
    """How a consumer from `from_offset` reads the log of `refs` (`reader.log_refs`, the whole log): where it stops
    and the transactions it skips, found by the driver (`reader.consumer_read`; `stable_offset` when the caller
    knows the last stable offset already), and the pieces it reads, in offset order (`segment_batches` decodes
    each). At read_committed, none at or past the last stable offset.

    Raises:
        ConfigError: a negative `from_offset` (a consumer cannot seek there).
    """
    if from_offset < 0:
        raise ConfigError(f"from_offset {from_offset}: offsets start at 0")
    read = consumer_read(store, refs, from_offset, isolation, stable_offset=stable_offset)
    return read, consumer_pieces(refs, read)


def read_refs(spark: SparkSession, store: ObjectStore, refs: Sequence[SegmentRef], from_offset: int,
              isolation: Isolation, *, stable_offset: int | None = None) -> DataFrame:
    """`read_partition` of a log already resolved into pieces (a run that read the metadata once), its last stable
    offset too if the run found it (`partition_read`)."""
    read, pieces = partition_read(store, refs, from_offset, isolation, stable_offset=stable_offset)
    ids = spark.range(0, len(pieces), 1, max(1, len(pieces)))
    return ids.mapInArrow(_decoder(store.spec, read, pieces), RECORD_STRUCT)


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
    task per segment or WAL slice. `isolation="read_committed"` stops at the log's last stable offset (the first
    offset of the earliest transaction still open, else the log end), as a Kafka consumer does: a read from it
    or past it is empty. Idempotent; reads only.

    Offset order without a sort: partition i holds the i-th piece of the log, each in offset order, so what
    keeps partitions in order (`collect`, `toLocalIterator`, `toPandas`, `limit`, filters and projections, a
    write's files by part number) sees offset order. A shuffle (a join, a `repartition`, an aggregate) does
    not keep it: sort by `offset` after one if the order matters.

    Raises:
        UnknownPartitionError: the store holds nothing of `topic`-`partition` (a misspelt name, the wrong store).
        ConfigError: a negative `from_offset`; MetadataVersionNotFoundError: a `version` the table does not have.
    """
    return read_refs(spark, store, log_refs(store, topic, partition, version), from_offset,
                     Isolation.parse(isolation))
