"""The table run's data path on Spark: new records → winners per key → rows that Delta's writer writes.

kcompact computes the rows; delta-spark writes them (`compaction.spark.delta_table`: an overwrite with `replaceWhere`
for rebuilt partitions, a MERGE for updated ones).

A partition to **rebuild** (its rows replaced by the winners over its whole log) takes the shuffle-free path,
`rebuild_rows`: each partition and key bucket (`rebuild_buckets`: one, or a few for a partition larger than
`REBUILD_TASK_BYTES` or when a few large partitions would leave cores idle) is an item of work, packed into tasks
by bytes (`compaction.packing`: many small partitions share a task, a large one has its own). For each item the
task decodes the partition's read_committed records with the scan's kernels, keeps those of its bucket's keys
(XXH64 of the key, decided before values are built), folds each key's winner with the compaction's `KeyFold`
(`compaction.topic_table.winners`) and yields the rows in offset order, which Delta's writer writes as they come.
Nothing crosses a shuffle; each bucket decodes the whole partition, so past `MAX_REBUILD_BUCKETS` a partition takes
the Spark path instead.

An **update** of a partition whose new segments fit `UPDATE_TASK_BYTES` takes no shuffle either (`update_rows`; a
task per core, each taking a share of the partitions, `compaction.tasks.task_groups`): for each partition it decodes
the new records and folds the winners of the keys they change (`table_changes_of`), a tombstone winner as a row of
null value: the MERGE's source. An update whose tasks hold `DRIVER_UPDATE_BYTES` at most in all runs the same tasks
as threads of the driver's process, with no Spark job for them: a fresh session's first Python task would cost more
than the update; their rows become the source as a local DataFrame.

A larger update (and a rebuild too large for the task path) goes through Spark (`spark_rows`): each partition's
consumer view (`read_refs`, read_committed) from the span's `read_from`, cut at its last stable offset (keyless
records are not part of a compacted topic's state), then per (partition, key) the record of greatest rank
(has_version, version, offset) (KIP-280's rule of `compaction.strategies.ranking`), kept only for keys with a
record in [from_offset, to_offset).

What runs inside the tasks is `compaction.topic_table.tasks` (no Spark). A kcompact error a task raises fails its
Spark job with the error carried in it (`compaction.topic_table.tasks.CarriedError`), and with the job Delta's
command, which commits nothing; `task_errors` raises it on the driver as itself. Executors open the store from its
picklable spec; Delta's writer writes the table through Spark's filesystems (`s3a://` for S3).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from compaction.config import CompactionStrategy
from compaction.packing import pack_for
from compaction.reader import ConsumerRead, Isolation, SegmentRef
from compaction.spark.ranking import best, rank_columns
from compaction.spark.read import RECORD_STRUCT, partition_read
from compaction.storage.base import ObjectStore
from compaction.tasks import task_groups
from compaction.topic_table.plan import PartitionSpan
from compaction.topic_table.target import PARTITION_COLUMN, VERSION_COLUMN
from compaction.topic_table.tasks import (
    ReadRecords,
    RebuildItem,
    RebuildTask,
    TableTask,
    UpdateItem,
    UpdateTask,
    carried,
    carrying,
    run_here,
    source_schema,
)

DATA_COLUMNS = ("value", "offset", "timestamp", "headers")


def row_struct(schema: pa.Schema) -> StructType:
    """The rows a run hands Delta, as Spark types: the table's `schema` (Arrow) with `value` nullable (a tombstone
    winner in an update's source)."""
    return from_arrow_schema(source_schema(schema))


@contextlib.contextmanager
def task_errors() -> Iterator[None]:
    """Raise a kcompact error a task carried through Spark (`compaction.topic_table.tasks.carried`) as itself."""
    try:
        yield
    except Exception as exc:
        if (error := carried(exc)) is not None:
            raise error from None
        raise


class _Rows:
    """A `mapInArrow` function yielding the rows of one kind of reading task, a kcompact error carried through."""

    def __init__(self, read: ReadRecords) -> None:
        self.read = read

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ids = (i for batch in batches for i in batch.column(0).to_pylist())
        yield from carrying(self.read.rows(ids))


def topic_records(spark: SparkSession, store: ObjectStore, refs: Mapping[int, Sequence[SegmentRef]],
                  spans: Sequence[PartitionSpan]) -> list[DataFrame]:
    """Per span, (partition, key, value, offset, timestamp, headers, fresh) of the partition's log `refs`, read as
    `compaction.spark.read.read_refs` reads it (a task per piece, `ReadRecords`); `fresh`: at or above
    from_offset."""
    frames = []
    for span in spans:
        read, pieces = partition_read(store, refs[span.partition], span.read_from, Isolation.READ_COMMITTED,
                                      stable_offset=span.to_offset)
        ids = spark.range(0, len(pieces), 1, max(1, len(pieces)))
        view = ids.mapInArrow(_Rows(ReadRecords(store.spec, read, tuple(pieces))), RECORD_STRUCT)
        frames.append(view.where(F.col("key").isNotNull()).select(
            F.lit(span.partition).cast("int").alias(PARTITION_COLUMN), "key", "value", "offset", "timestamp",
            "headers", (F.col("offset") >= span.from_offset).alias("fresh")))
    return frames


def winners(frames: Sequence[DataFrame], strategy: CompactionStrategy, header: str | None) -> DataFrame:
    """Per (partition, key) with a fresh record, the winning record (value null = tombstone), plus `version`
    (null when the record has none) unless the strategy is offset.

    The winner is `compaction.spark.ranking.best` carrying the record: `max`, unlike `max_by`, does not depend on
    row order, so the order `read_partition`'s rows come in plays no part.
    """
    return reduce(DataFrame.unionByName, [_best(f, strategy, header) for f in frames])


def _best(records: DataFrame, strategy: CompactionStrategy, header: str | None) -> DataFrame:
    by_offset = strategy is CompactionStrategy.OFFSET
    extra: list[Column] = []
    if not by_offset:
        has_version, version = rank_columns(strategy, header)
        records = records.withColumn("has_version", has_version).withColumn("version", version)
        extra = [F.when(F.col("w.has_version") == 1, F.col("w.version")).alias(VERSION_COLUMN)]
    carried = [c for c in DATA_COLUMNS if c != "offset"]
    ranked = records.groupBy(PARTITION_COLUMN, "key").agg(best(carried, by_offset=by_offset).alias("w"),
                                                          F.max("fresh").alias("fresh"))
    return ranked.where("fresh").select(PARTITION_COLUMN, "key", *(F.col(f"w.{c}") for c in DATA_COLUMNS), *extra)


def spark_rows(spark: SparkSession, store: ObjectStore, refs: Mapping[int, Sequence[SegmentRef]],
               spans: Sequence[PartitionSpan], schema: pa.Schema, strategy: CompactionStrategy, header: str | None
               ) -> DataFrame:
    """The rows of `spans` through Spark's aggregate (`winners`), in the table's column order: a rebuilt partition's
    rows without its tombstone winners, an updated one's with them (value null: the MERGE deletes their rows)."""
    fresh = winners(topic_records(spark, store, refs, spans), strategy, header)
    rebuilt = sorted(s.partition for s in spans if s.rebuild)
    keep = fresh["value"].isNotNull() | ~fresh[PARTITION_COLUMN].isin(rebuilt) if rebuilt else F.lit(True)
    struct = row_struct(schema)
    return fresh.where(keep).select(*(F.col(f.name).cast(f.dataType) for f in struct.fields))


REBUILD_TASK_BYTES = 1 << 30
"""The segment bytes of one partition a rebuild task holds at most: its records stay in the task's memory (as Arrow,
about their decoded size) until its keys' winners are written, so a partition above it is split into key buckets."""
REBUILD_SPREAD_BYTES = 64 << 20
"""A partition of at least this many segment bytes is split into more buckets when the run has fewer partitions to
rebuild than the cluster has cores (up to `REBUILD_SPREAD_BUCKETS`), so that one large partition uses them all."""
REBUILD_SPREAD_BUCKETS = 4
MAX_REBUILD_BUCKETS = 8
"""Each bucket's task decodes the whole partition (and keeps its share of the keys): past this many, decoding it
again costs more than a shuffle, and the partition is rebuilt through Spark's aggregate (`winners`) instead."""


def rebuild_buckets(segment_bytes: int, partitions: int, parallelism: int) -> int | None:
    """The key buckets (tasks) a partition's rebuild is split into; None when it is too large for the task path."""
    need = -(-segment_bytes // REBUILD_TASK_BYTES)
    spread = min(REBUILD_SPREAD_BUCKETS, parallelism // max(1, partitions)) \
        if segment_bytes >= REBUILD_SPREAD_BYTES else 1
    buckets = max(1, need, spread)
    return buckets if buckets <= MAX_REBUILD_BUCKETS else None


UPDATE_TASK_BYTES = REBUILD_TASK_BYTES
"""The most an update task of one partition holds: the new records it decodes (a larger partition's update goes
through Spark's aggregate)."""

DRIVER_UPDATE_BYTES = 512 << 20
"""An update whose tasks hold at most this much in all runs them in the driver's process, a thread a task, with no
Spark job: on one machine's cores such an update takes about a second, where a session's first Python task alone
(Spark's daemon, a worker, its imports and kernels) takes several; BENCHMARKS.md P8 has both."""


class _Tasks:
    """The `mapInArrow` function over `spark.range(len(tasks))`: the rows of the task of each id."""

    def __init__(self, tasks: Sequence[TableTask]) -> None:
        self.tasks = tasks

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for ids in batches:
            for i in ids.column(0).to_pylist():
                yield from carrying(self.tasks[i].rows())


def task_rows(spark: SparkSession, tasks: Sequence[TableTask], schema: pa.Schema) -> DataFrame:
    """The rows of `tasks` (the table's `schema`, `row_struct`), a Spark task each (the values ride in the
    function)."""
    ids = spark.range(0, len(tasks), 1, max(1, len(tasks)))
    return ids.mapInArrow(_Tasks(tasks), row_struct(schema))


def local_rows(spark: SparkSession, rows: pa.Table, schema: pa.Schema) -> DataFrame:
    """Rows computed on the driver as a DataFrame. One chunk: pyspark 4.2's `createDataFrame` of an Arrow table drops
    every row after an empty chunk."""
    return spark.createDataFrame(rows.cast(source_schema(schema)).combine_chunks(), schema=row_struct(schema))


@dataclass(frozen=True)
class Updated:
    """The update tasks' rows (the MERGE's source), how many tasks ran, whether in the driver's process
    (`DRIVER_UPDATE_BYTES`), and the number of rows when known there."""

    rows: DataFrame
    tasks: int
    on_driver: bool
    count: int | None


def update_rows(spark: SparkSession, store: ObjectStore, refs: Mapping[int, Sequence[SegmentRef]],
                spans: Sequence[PartitionSpan], schema: pa.Schema, strategy: CompactionStrategy, header: str | None
                ) -> Updated:
    """The MERGE source of the updates `spans`, with no shuffle: for each partition (a task per core takes a share
    of them, `compaction.tasks.task_groups`) the task (`UpdateTask`) decodes its new records (from `read_from`) and
    folds the winners of the keys they change. The tasks run on Spark's executors, or in this process when they
    hold `DRIVER_UPDATE_BYTES` at most (`run_here`)."""
    items = [UpdateItem(span, read, tuple(pieces))
             for span, (read, pieces) in zip(spans, partition_reads(store, refs, spans), strict=True)]
    sizes = [item.span.segment_bytes for item in items]
    on_driver = sum(sizes) <= DRIVER_UPDATE_BYTES
    cores = spark.sparkContext.defaultParallelism
    groups = task_groups(sizes, min(cores, os.cpu_count() or 1) if on_driver else cores)
    tasks = [UpdateTask(store.spec, schema, strategy, header, tuple(items[i] for i in group)) for group in groups]
    if on_driver:
        rows = run_here(tasks, source_schema(schema))
        return Updated(local_rows(spark, rows, schema), len(tasks), True, rows.num_rows)
    return Updated(task_rows(spark, tasks, schema), len(tasks), False, None)


def rebuild_rows(spark: SparkSession, store: ObjectStore, refs: Mapping[int, Sequence[SegmentRef]],
                 spans: Sequence[tuple[PartitionSpan, int]], schema: pa.Schema, strategy: CompactionStrategy,
                 header: str | None) -> tuple[DataFrame, int]:
    """The rows of `spans` (each with its bucket count, `rebuild_buckets`) rebuilt from their partitions' log
    `refs` with no shuffle: a task (`RebuildTask`) per group of (partition, bucket) items decodes the partition's
    read_committed records and folds its keys' winners. Returns the rows and the number of tasks."""
    reads = partition_reads(store, refs, [span for span, _ in spans])
    items = [RebuildItem(span, read, tuple(pieces), bucket, buckets)
             for (span, buckets), (read, pieces) in zip(spans, reads, strict=True) for bucket in range(buckets)]
    groups = pack_for([item.span.segment_bytes for item in items], spark.sparkContext.defaultParallelism)
    tasks = [RebuildTask(store.spec, schema, strategy, header, tuple(items[i] for i in group)) for group in groups]
    return task_rows(spark, tasks, schema), len(tasks)


DRIVER_READ_THREADS = 16
"""Partitions whose consumer read the driver finds at once (`partition_reads`): each waits on the store."""


def partition_reads(store: ObjectStore, refs: Mapping[int, Sequence[SegmentRef]], spans: Sequence[PartitionSpan]
                    ) -> list[tuple[ConsumerRead, list[SegmentRef]]]:
    """Per span how its partition is read at read_committed from `read_from` (`partition_read`: the driver reads the
    transaction indexes of the pieces), the partitions read at once, in threads: they wait on the store."""
    def read(span: PartitionSpan) -> tuple[ConsumerRead, list[SegmentRef]]:
        return partition_read(store, refs[span.partition], span.read_from, Isolation.READ_COMMITTED,
                              stable_offset=span.to_offset)

    if len(spans) < 2:
        return [read(span) for span in spans]
    with ThreadPoolExecutor(min(DRIVER_READ_THREADS, len(spans)), thread_name_prefix="kcompact-read") as pool:
        return list(pool.map(read, spans))


__all__ = ["DRIVER_UPDATE_BYTES", "UPDATE_TASK_BYTES", "Updated", "local_rows", "rebuild_buckets", "rebuild_rows",
           "row_struct", "spark_rows", "task_errors", "task_rows", "topic_records", "update_rows", "winners"]
