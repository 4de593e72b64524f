"""The table run's data path on Spark: new records → winners per key → old rows marked deleted → files.

A partition to **rebuild** (its rows replaced by the winners over its whole log) takes the shuffle-free path,
`rebuild_files`: each partition and key bucket (`rebuild_buckets`: one, or a few for a partition larger than
`REBUILD_TASK_BYTES` or when a few large partitions would leave cores idle) is an item of work, packed into tasks
by bytes (`compaction.packing`: many small partitions share a task, a large one has its own). For each item the
task decodes the partition's read_committed records with the scan's kernels, keeps those of its bucket's keys
(XXH64 of the key, decided before values are built), folds each key's winner with the compaction's `KeyFold`
(`compaction.topic_table.winners`) and writes the rows as Parquet in offset order. Nothing crosses a shuffle; each
bucket decodes the whole partition, so past `MAX_REBUILD_BUCKETS` a partition takes the Spark path instead.

An **update** of a partition whose table files and new segments fit `UPDATE_TASK_BYTES` takes no shuffle either
(`update_files`; a task per core, each taking a share of the partitions, `compaction.tasks.task_groups`): for each
partition it decodes the new records, folds the winners of the keys they change (`table_changes_of`), marks the rows
of those keys in the partition's table files deleted (a deletion vector per file, all of the task's in one DV file,
`compaction.topic_table.deletion_vectors`; a file past `PURGE_SHARE` deleted is rewritten without them instead),
and writes the winners as a new file. An update whose tasks hold `DRIVER_UPDATE_BYTES` at most in all runs the same
tasks as threads of the driver's process, with no Spark job: a fresh session's first Python task would cost more
than the update.

A larger update (and a rebuild too large for the task path) goes through Spark:
1. **records**: each partition's consumer view (`read_refs`, read_committed) from the span's `read_from`,
   cut at its last stable offset; keyless records are not part of a compacted topic's state;
2. **winners**: per (partition, key), the record of greatest rank (has_version, version, offset) (KIP-280's
   rule of `compaction.strategies.ranking`), kept only for keys with a record in [from_offset, to_offset);
3. **marks** (`mark_rows`): a key-only read of the updated partitions' files (their live rows, deletion vectors
   applied as in every read of a table file here, with each row's position), joined with the winners' keys; a task
   per group of files writes their new deletion vectors, or leaves a file past `PURGE_SHARE` to be rewritten;
4. **write**: the winners that are not tombstones and the kept rows of the files being rewritten (`kept_rows`), as
   new Parquet files sorted by key, written by executors straight into the table's location; the driver commits
   them with the marks and the removal of the files they replace.

What runs inside the tasks is `compaction.topic_table.tasks` (no Spark): frozen task values in, a typed
`TaskOutcome` out (pickled into a binary column), a kcompact error a task raised carried back in it as a value and
raised by the driver; the tasks that yield rows instead (the reads of records and of table files) carry theirs back
through an accumulator (`TaskErrors`). Executors open the table's store from its picklable spec; no Spark filesystem
(s3a) is involved.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import reduce
from typing import Any

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from compaction.config import CompactionStrategy
from compaction.errors import KcompactError
from compaction.packing import pack_for
from compaction.reader import ConsumerRead, Isolation, SegmentRef
from compaction.spark.packed import packed_frame
from compaction.spark.ranking import best, rank_columns
from compaction.spark.read import RECORD_STRUCT, partition_read
from compaction.storage.base import ObjectStore
from compaction.tasks import task_groups
from compaction.topic_table.deletion_vectors import DeletionVector
from compaction.topic_table.plan import PartitionSpan
from compaction.topic_table.target import PARTITION_COLUMN, VERSION_COLUMN, DataFile, Location
from compaction.topic_table.tasks import (
    FileToRead,
    MarkFiles,
    MarkKind,
    ReadFiles,
    ReadRecords,
    RebuildItem,
    RebuildTask,
    TableTask,
    TaskOutcome,
    UpdateItem,
    UpdateTask,
    WriteFiles,
    portable,
    run_here,
    succeeded,
)

DATA_COLUMNS = ("value", "offset", "timestamp", "headers")


def row_schema(strategy: CompactionStrategy) -> StructType:
    """The table's columns as Spark types (`compaction.topic_table.target.table_schema`)."""
    headers = RECORD_STRUCT["headers"].dataType
    fields = [StructField("key", BinaryType(), False), StructField("value", BinaryType(), True),
              StructField("offset", LongType(), False), StructField("timestamp", LongType(), False),
              StructField("headers", headers, False)]
    if strategy is not CompactionStrategy.OFFSET:
        fields.append(StructField(VERSION_COLUMN, LongType(), True))
    return StructType(fields)


def topic_records(spark: SparkSession, store: ObjectStore, refs: Mapping[int, Sequence[SegmentRef]],
                  spans: Sequence[PartitionSpan], errors: TaskErrors) -> list[DataFrame]:
    """Per span, (partition, key, value, offset, timestamp, headers, fresh) of the partition's log `refs`, read as
    `compaction.spark.read.read_refs` reads it (a task per piece, `ReadRecords`; its errors to `errors`); `fresh`:
    at or above from_offset."""
    frames = []
    for span in spans:
        read, pieces = partition_read(store, refs[span.partition], span.read_from, Isolation.READ_COMMITTED,
                                      stable_offset=span.to_offset)
        ids = spark.range(0, len(pieces), 1, max(1, len(pieces)))
        view = ids.mapInArrow(errors.reading(ReadRecords(store.spec, read, tuple(pieces)).rows, _ids), RECORD_STRUCT)
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


_OUTCOMES = StructType([StructField("outcome", BinaryType(), False)])
_OUTCOME_SCHEMA = pa.schema([pa.field("outcome", pa.binary(), False)])


def _outcomes(outcomes: Iterable[TaskOutcome]) -> pa.RecordBatch:
    """Outcomes as rows of `_OUTCOMES`, each pickled (an error keeps its class and fields)."""
    return pa.RecordBatch.from_pydict({"outcome": [pickle.dumps(o) for o in outcomes]}, schema=_OUTCOME_SCHEMA)


def _collected(frame: DataFrame, errors: TaskErrors | None = None) -> Sequence[TaskOutcome]:
    """The outcomes `frame` (of `_OUTCOMES`) collects, once neither a reading task upstream (`errors`) nor one of
    them failed; else that kcompact error, raised here as itself."""
    outcomes = [pickle.loads(row.outcome) for row in frame.collect()]
    if errors is not None:
        errors.check()
    return succeeded(outcomes)


class _Appended(AccumulatorParam[list[bytes]]):
    """An accumulator of lists, appended to each other."""

    def zero(self, value: list[bytes]) -> list[bytes]:
        return []

    def addInPlace(self, value1: list[bytes], value2: list[bytes]) -> list[bytes]:
        return value1 + value2


class TaskErrors:
    """The kcompact errors of the tasks that yield rows rather than an outcome (the reads of records and of table
    files, `compaction.topic_table.tasks.ReadRecords` and `ReadFiles`), carried back as values: such a task stops
    reading at the error and adds it, pickled (`portable`), to a Spark accumulator, and the driver raises the first
    one once the job that ran it is done (`check`), before anything is committed."""

    def __init__(self, spark: SparkSession) -> None:
        self._found = spark.sparkContext.accumulator([], _Appended())

    def reading(self, rows: Callable[[Iterable[Any]], Iterator[pa.RecordBatch]],
                items: Callable[[pa.RecordBatch], Iterable[Any]]) -> _Reading:
        """The `mapInArrow` function yielding `rows` of the items (`items` of each batch) its task is given."""
        return _Reading(rows, items, self._found)

    def check(self) -> None:
        """Raise the first error a reading task found, as itself."""
        for found in self._found.value:
            raise pickle.loads(found)


class _Reading:
    """A reading task on Spark: its rows, or up to a kcompact error, which goes to the run's `TaskErrors`."""

    def __init__(self, rows: Callable[[Iterable[Any]], Iterator[pa.RecordBatch]],
                 items: Callable[[pa.RecordBatch], Iterable[Any]], found: Any) -> None:
        self.rows, self.items, self.found = rows, items, found

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            yield from self.rows(item for batch in batches for item in self.items(batch))
        except KcompactError as exc:
            self.found.add([pickle.dumps(portable(exc))])


def _ids(batch: pa.RecordBatch) -> list[int]:
    return batch.column(0).to_pylist()


def _files_to_read(batch: pa.RecordBatch) -> list[FileToRead]:
    return [FileToRead(d["path"], d[PARTITION_COLUMN],
                       None if d["vector"] is None else DeletionVector.from_json(json.loads(d["vector"])))
            for d in batch.to_pylist()]


_FILE_DESCRIPTOR = StructType([StructField("path", StringType(), False), StructField("partition", IntegerType(), False),
                               StructField("vector", StringType(), True)])


def table_rows(spark: SparkSession, location: Location, files: Sequence[DataFile], schema: StructType,
               errors: TaskErrors, columns: Sequence[str] | None = None, *, positions: bool = False) -> DataFrame:
    """The live rows of `files` (their deletion vectors applied; only `columns`, all if None) with their `partition`
    and `_file` (and, with `positions`, `_pos`: the row's position in its file), read by executors (`ReadFiles`;
    its errors to `errors`)."""
    fields = [f for f in schema.fields if columns is None or f.name in columns or f.name == "key"]
    fields = [f for f in fields if f.name != PARTITION_COLUMN]
    extra = [StructField("_pos", LongType(), False)] if positions else []
    out = StructType([*fields, *extra, StructField(PARTITION_COLUMN, IntegerType(), False),
                      StructField("_file", StringType(), False)])
    wanted = None if columns is None else tuple(f.name for f in fields)
    rows = [(f.path, f.partition, None if f.vector is None else json.dumps(f.vector.to_json())) for f in files]
    descriptors = packed_frame(spark, rows, [f.size for f in files], _FILE_DESCRIPTOR)
    return descriptors.mapInArrow(errors.reading(ReadFiles(location, wanted, positions).rows, _files_to_read), out)


PURGE_SHARE = 0.2
"""An update marks the rows of a file's changed keys deleted (a deletion vector) until more than this share of the
file's rows would be deleted: then it rewrites the file without them instead (Delta's purge). A reader reads a
file's deleted rows for nothing, so at a fifth deleted a read costs at most a quarter more than a clean file's; a
table updated at 1% of its keys a run rewrites each file about once in twenty runs (BENCHMARKS.md P8)."""


class _Marker:
    """The `mapInArrow` function of the marks: (file, row positions) rows in, one pickled outcome out."""

    def __init__(self, task: MarkFiles) -> None:
        self.task = task

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found = ((path, positions) for batch in batches
                 for path, positions in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True))
        yield _outcomes([self.task.run(found)])


def mark_rows(spark: SparkSession, location: Location, files: Sequence[DataFile], schema: StructType,
              fresh: DataFrame, purge_share: float, errors: TaskErrors
              ) -> tuple[set[str], dict[str, DeletionVector]]:
    """Mark the live rows of `files` whose (partition, key) is in `fresh` deleted: found by a key-only read joined
    with `fresh`'s keys, then a task per group of files writes their deletion vectors (or, past `purge_share`, leaves
    a file to be rewritten; `MarkFiles`). Returns the paths to rewrite and the marked files' new vectors."""
    if not files:
        return set(), {}
    keys = table_rows(spark, location, files, schema, errors, columns=["key"], positions=True)
    hits = keys.join(fresh.select(PARTITION_COLUMN, "key"), [PARTITION_COLUMN, "key"], "left_semi")
    found = hits.groupBy("_file").agg(F.collect_list("_pos").alias("positions"))
    done = _collected(found.mapInArrow(_Marker(MarkFiles(location, tuple(files), purge_share)), _OUTCOMES), errors)
    return _marked(done)


def _marked(outcomes: Iterable[TaskOutcome]) -> tuple[set[str], dict[str, DeletionVector]]:
    """The paths of the files `outcomes` rewrote, and the new vectors of those they marked."""
    marks = [m for o in outcomes for m in o.marks]
    return ({m.path for m in marks if m.kind is MarkKind.REPLACED},
            {m.path: m.vector for m in marks if m.kind is MarkKind.MARKED and m.vector is not None})


def kept_rows(spark: SparkSession, location: Location, files: Sequence[DataFile], schema: StructType,
              fresh: DataFrame, errors: TaskErrors) -> DataFrame:
    """The live rows of `files` (being rewritten) whose (partition, key) is not in `fresh`, without `_file`."""
    old = table_rows(spark, location, files, schema, errors).drop("_file")
    return old.join(fresh.select(PARTITION_COLUMN, "key"), [PARTITION_COLUMN, "key"], "left_anti")


class _Writer:
    """The `mapInArrow` function of the writes: rows in, one pickled outcome out (`WriteFiles`)."""

    def __init__(self, task: WriteFiles) -> None:
        self.task = task

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield _outcomes([self.task.run(pa.Table.from_batches([batch]) for batch in batches)])


def write_files(rows: DataFrame, location: Location, schema: pa.Schema, tasks: int, errors: TaskErrors
                ) -> list[DataFile]:
    """Write `rows` as Parquet files of the table (sorted by partition and key), one or more per task and
    partition; returns each file's path, partition, size and row count. Nothing is visible until committed."""
    spread = rows.repartition(max(1, tasks), PARTITION_COLUMN, "key").sortWithinPartitions(PARTITION_COLUMN, "key")
    return [f for o in _collected(spread.mapInArrow(_Writer(WriteFiles(location, schema)), _OUTCOMES), errors)
            for f in o.written]


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
"""The most an update task of one partition holds: the new records it decodes plus the table files it reads (their
size on disk; a larger partition's update goes through Spark's aggregate and join)."""

DRIVER_UPDATE_BYTES = 512 << 20
"""An update whose tasks hold at most this much in all runs them in the driver's process, a thread a task, with no
Spark job: on one machine's cores such an update takes about a second, where a session's first Python task alone
(Spark's daemon, a worker, its imports and kernels) takes several; BENCHMARKS.md P8 has both."""

@dataclass(frozen=True)
class Updated:
    """What the update tasks did: the files they wrote, the paths of the files they rewrote (to be removed), the
    files whose changed keys' rows they marked deleted, each with its new vector, how many tasks ran, and whether
    they ran in the driver's process (`DRIVER_UPDATE_BYTES`)."""

    written: list[DataFile]
    replaced: set[str]
    marked: dict[str, DeletionVector]
    tasks: int
    on_driver: bool


def update_files(spark: SparkSession, store: ObjectStore, refs: Mapping[int, Sequence[SegmentRef]],
                 spans: Sequence[PartitionSpan], files: Mapping[int, Sequence[DataFile]], location: Location,
                 schema: pa.Schema, strategy: CompactionStrategy, header: str | None, *, vectors: bool) -> Updated:
    """Apply the updates `spans` with no shuffle: for each partition (a task per core takes a share of them,
    `compaction.tasks.task_groups`) the task (`UpdateTask`) decodes its new records (from `read_from`),
    folds the winners of the keys they change (`table_changes_of`), reads the key column of each of the partition's
    table `files`, marks the rows of changed keys deleted in a deletion vector (with `vectors`, up to
    `PURGE_SHARE` of a file) or rewrites the file without them, and writes the winners. The tasks run on Spark's
    executors, or in this process when they hold `DRIVER_UPDATE_BYTES` at most (`run_here`). Nothing is visible
    until committed."""
    items = [UpdateItem(span, read, tuple(pieces), tuple(files.get(span.partition, ())))
             for span, (read, pieces) in zip(spans, partition_reads(store, refs, spans), strict=True)]
    sizes = [item.span.segment_bytes + sum(f.size for f in item.files) for item in items]
    on_driver = sum(sizes) <= DRIVER_UPDATE_BYTES
    cores = spark.sparkContext.defaultParallelism
    groups = task_groups(sizes, min(cores, os.cpu_count() or 1) if on_driver else cores)
    share = PURGE_SHARE if vectors else 0.0
    tasks = [UpdateTask(store.spec, location, schema, strategy, header, share, tuple(items[i] for i in group))
             for group in groups]
    done = succeeded(run_here(tasks)) if on_driver else run_tasks(spark, tasks)
    replaced, marked = _marked(done)
    return Updated([f for o in done for f in o.written], replaced, marked, len(tasks), on_driver)


class _Tasks:
    """The `mapInArrow` function over `spark.range(len(tasks))`: the task of each id run, one pickled outcome each."""

    def __init__(self, tasks: Sequence[TableTask]) -> None:
        self.tasks = tasks

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for ids in batches:
            yield _outcomes([self.tasks[i].run() for i in ids.column(0).to_pylist()])


def run_tasks(spark: SparkSession, tasks: Sequence[TableTask]) -> Sequence[TaskOutcome]:
    """The outcomes of `tasks`, a Spark task each (the values ride in the function), once none failed."""
    ids = spark.range(0, len(tasks), 1, max(1, len(tasks)))
    return _collected(ids.mapInArrow(_Tasks(tasks), _OUTCOMES))


def rebuild_files(spark: SparkSession, store: ObjectStore, refs: Mapping[int, Sequence[SegmentRef]],
                  spans: Sequence[tuple[PartitionSpan, int]], location: Location, schema: pa.Schema,
                  strategy: CompactionStrategy, header: str | None) -> list[DataFile]:
    """Rebuild the rows of `spans` (each with its bucket count, `rebuild_buckets`) from their partitions' log
    `refs` with no shuffle: a task (`RebuildTask`) per group of (partition, bucket) items decodes the partition's
    read_committed records, folds its keys' winners and writes them; returns the files written. Nothing is
    visible until committed."""
    reads = partition_reads(store, refs, [span for span, _ in spans])
    items = [RebuildItem(span, read, tuple(pieces), bucket, buckets)
             for (span, buckets), (read, pieces) in zip(spans, reads, strict=True) for bucket in range(buckets)]
    groups = pack_for([item.span.segment_bytes for item in items], spark.sparkContext.defaultParallelism)
    tasks = [RebuildTask(store.spec, location, schema, strategy, header, tuple(items[i] for i in group))
             for group in groups]
    return [f for o in run_tasks(spark, tasks) for f in o.written]


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


__all__ = ["PURGE_SHARE", "TaskErrors", "Updated", "kept_rows", "mark_rows", "rebuild_buckets", "rebuild_files",
           "row_schema", "run_tasks", "table_rows", "topic_records", "update_files", "winners", "write_files"]
