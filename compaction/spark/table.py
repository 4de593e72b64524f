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

Executors open the table's store from its picklable spec; no Spark filesystem (s3a) is involved.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from compaction.bloom.hashing import key_hashes
from compaction.config import CompactionStrategy
from compaction.packing import pack_for
from compaction.reader import ConsumerRead, Isolation, SegmentRef, segment_batches
from compaction.spark.packed import packed_frame
from compaction.spark.ranking import best, rank_columns
from compaction.spark.read import RECORD_STRUCT, partition_read, read_refs
from compaction.storage.base import ObjectStore, StoreSpec
from compaction.tasks import task_groups
from compaction.topic_table.deletion_vectors import DeletionVector, VectorFile, read_vector
from compaction.topic_table.plan import PartitionSpan
from compaction.topic_table.target import FILE_BYTES, PARTITION_COLUMN, VERSION_COLUMN, DataFile, Location
from compaction.topic_table.winners import table_changes_of, table_rows_of

DATA_COLUMNS = ("value", "offset", "timestamp", "headers")
_FILE_ROW = StructType([
    StructField("path", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("size", LongType(), False),
    StructField("rows", LongType(), False),
])
_FILE_SCHEMA = pa.schema([pa.field("path", pa.string(), False), pa.field("partition", pa.int32(), False),
                          pa.field("size", pa.int64(), False), pa.field("rows", pa.int64(), False)])


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
                  spans: Sequence[PartitionSpan]) -> list[DataFrame]:
    """Per span, (partition, key, value, offset, timestamp, headers, fresh) of the partition's log `refs`;
    `fresh`: at or above from_offset."""
    frames = []
    for span in spans:
        view = read_refs(spark, store, refs[span.partition], span.read_from, Isolation.READ_COMMITTED,
                         stable_offset=span.to_offset)
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


def deleted_rows(store: ObjectStore, location: Location, vector: DeletionVector | None,
                 files: dict[str, bytes | memoryview] | None = None) -> np.ndarray:
    """The row positions a table file's deletion `vector` deletes (none if None), read from its DV file (kept in
    `files` by name, when given, for the next vector of the same file)."""
    if vector is None:
        return np.zeros(0, np.uint64)
    key = location.file_key(vector.file_name)
    cache = {} if files is None else files
    if vector.file_name not in cache:
        cache[vector.file_name] = store.view(key)
    return read_vector(cache[vector.file_name], vector, obj=store.object_uri(key))


def _live(data: pa.Table, deleted: np.ndarray) -> pa.Table:
    """`data` without the rows at `deleted`."""
    if not len(deleted):
        return data
    keep = np.ones(data.num_rows, bool)
    keep[deleted.astype(np.int64)] = False
    return data.filter(keep)


def _file_reader(location: Location, columns: Sequence[str] | None, positions: bool) -> Callable[
        [Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = location.open()
        vectors: dict[str, bytes | memoryview] = {}
        for descriptors in batches:
            for d in descriptors.to_pylist():
                data = pq.read_table(pa.BufferReader(store.view(location.file_key(d["path"]))), columns=columns)
                if positions:
                    data = data.append_column("_pos", pa.array(np.arange(data.num_rows, dtype=np.int64)))
                vector = None if d["vector"] is None else DeletionVector.from_json(json.loads(d["vector"]))
                data = _live(data, deleted_rows(store, location, vector, vectors))
                data = data.append_column(PARTITION_COLUMN, pa.array(np.full(data.num_rows, d[PARTITION_COLUMN],
                                                                             np.int32)))
                data = data.append_column("_file", pa.array([d["path"]] * data.num_rows, pa.string()))
                yield from data.to_batches()

    return read


_FILE_DESCRIPTOR = StructType([StructField("path", StringType(), False), StructField("partition", IntegerType(), False),
                               StructField("vector", StringType(), True)])


def table_rows(spark: SparkSession, location: Location, files: Sequence[DataFile], schema: StructType,
               columns: Sequence[str] | None = None, *, positions: bool = False) -> DataFrame:
    """The live rows of `files` (their deletion vectors applied; only `columns`, all if None) with their `partition`
    and `_file` (and, with `positions`, `_pos`: the row's position in its file), read by executors."""
    fields = [f for f in schema.fields if columns is None or f.name in columns or f.name == "key"]
    fields = [f for f in fields if f.name != PARTITION_COLUMN]
    extra = [StructField("_pos", LongType(), False)] if positions else []
    out = StructType([*fields, *extra, StructField(PARTITION_COLUMN, IntegerType(), False),
                      StructField("_file", StringType(), False)])
    wanted = None if columns is None else [f.name for f in fields]
    rows = [(f.path, f.partition, None if f.vector is None else json.dumps(f.vector.to_json())) for f in files]
    descriptors = packed_frame(spark, rows, [f.size for f in files], _FILE_DESCRIPTOR)
    return descriptors.mapInArrow(_file_reader(location, wanted, positions), out)


PURGE_SHARE = 0.2
"""An update marks the rows of a file's changed keys deleted (a deletion vector) until more than this share of the
file's rows would be deleted: then it rewrites the file without them instead (Delta's purge). A reader reads a
file's deleted rows for nothing, so at a fifth deleted a read costs at most a quarter more than a clean file's; a
table updated at 1% of its keys a run rewrites each file about once in twenty runs (BENCHMARKS.md P8)."""

_MARK_SCHEMA = pa.schema([pa.field("path", pa.string(), False), pa.field("kind", pa.string(), False),
                          pa.field("vector", pa.string())])
_MARK_ROW = StructType([StructField("path", StringType(), False), StructField("kind", StringType(), False),
                        StructField("vector", StringType(), True)])


def _mark(rows: int, deleted: np.ndarray, gone: np.ndarray, vectors: VectorFile, purge_share: float
          ) -> tuple[str, str | None, np.ndarray]:
    """Delete the rows at `gone` of a file of `rows` rows (whose vector already deletes `deleted`): ("marked", its new
    vector as JSON, all its deleted rows), the vector added to `vectors`; or, past `purge_share` of its rows
    ("replaced", None, all its deleted rows): the caller rewrites it without them. A file whose log entry holds no
    row count (0 here) is rewritten: Delta requires a marked file's `numRecords`."""
    positions = np.union1d(deleted, gone.astype(np.uint64))
    if len(positions) <= purge_share * rows:
        return "marked", json.dumps(vectors.add(positions).to_json()), positions
    return "replaced", None, positions


def _marker(location: Location, files: Mapping[str, DataFile], purge_share: float) -> Callable[
        [Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def mark(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = location.open()
        vectors, dv_files, done = VectorFile(), dict[str, bytes | memoryview](), []
        for batch in batches:
            for path, found in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                file = files[path]
                deleted = deleted_rows(store, location, file.vector, dv_files)
                kind, vector, _ = _mark(file.rows, deleted, np.asarray(found, np.uint64), vectors, purge_share)
                done.append({"path": path, "kind": kind, "vector": vector})
        if len(vectors):
            store.put(location.file_key(vectors.name), vectors.data())
        yield pa.RecordBatch.from_pylist(done, schema=_MARK_SCHEMA)

    return mark


def mark_rows(spark: SparkSession, location: Location, files: Sequence[DataFile], schema: StructType,
              fresh: DataFrame, purge_share: float) -> tuple[set[str], dict[str, DeletionVector]]:
    """Mark the live rows of `files` whose (partition, key) is in `fresh` deleted: found by a key-only read joined
    with `fresh`'s keys, then a task per group of files writes their deletion vectors (or, past `purge_share`, leaves
    a file to be rewritten). Returns the paths to rewrite and the marked files' new vectors."""
    if not files:
        return set(), {}
    keys = table_rows(spark, location, files, schema, columns=["key"], positions=True)
    hits = keys.join(fresh.select(PARTITION_COLUMN, "key"), [PARTITION_COLUMN, "key"], "left_semi")
    found = hits.groupBy("_file").agg(F.collect_list("_pos").alias("positions"))
    done = found.mapInArrow(_marker(location, {f.path: f for f in files}, purge_share), _MARK_ROW).collect()
    return ({r["path"] for r in done if r["kind"] == "replaced"},
            {r["path"]: DeletionVector.from_json(json.loads(r["vector"])) for r in done if r["kind"] == "marked"})


def kept_rows(spark: SparkSession, location: Location, files: Sequence[DataFile], schema: StructType,
              fresh: DataFrame) -> DataFrame:
    """The live rows of `files` (being rewritten) whose (partition, key) is not in `fresh`, without `_file`."""
    old = table_rows(spark, location, files, schema).drop("_file")
    return old.join(fresh.select(PARTITION_COLUMN, "key"), [PARTITION_COLUMN, "key"], "left_anti")


DICTIONARY_COLUMNS = ["headers.list.element.key"]
"""The Parquet columns dictionary-encoded: header names repeat; a compacted topic's keys never do within a partition,
and its values seldom, where a dictionary only costs time before Parquet falls back from it (zstd takes what
repeats; BENCHMARKS.md P8)."""


class _FileSink:
    """Parquet files of the table written from one task: rows go to the open file of their partition, a file is
    closed (and put into the store) once it holds `FILE_BYTES` of Arrow data or another partition's rows come."""

    def __init__(self, location: Location, schema: pa.Schema, tmp: str) -> None:
        self.location, self.tmp = location, tmp
        self.stored = pa.schema([f for f in schema if f.name != PARTITION_COLUMN])
        self.store = location.open()
        self.written: list[dict[str, object]] = []
        self._current: tuple[int, str, pq.ParquetWriter] | None = None
        self._rows = self._held = 0

    def add(self, table: pa.Table) -> None:
        """Rows of the table's schema (`partition` included), in the order they are to be written."""
        present = sorted(pc.unique(table[PARTITION_COLUMN]).to_pylist())
        for partition in present:
            rows = table.filter(pc.equal(table[PARTITION_COLUMN], partition)) if len(present) > 1 else table
            step = max(1, rows.num_rows * FILE_BYTES // max(1, rows.nbytes))
            for start in range(0, rows.num_rows, step):
                self._write(partition, rows.slice(start, step))

    def _write(self, partition: int, chunk: pa.Table) -> None:
        if self._current is not None and (self._current[0] != partition
                                          or (self._held and self._held + chunk.nbytes > FILE_BYTES)):
            self.close()
        if self._current is None:
            local = os.path.join(self.tmp, f"{uuid.uuid4()}.parquet")
            self._current = (partition, local, pq.ParquetWriter(local, self.stored, compression="zstd",
                                                                use_dictionary=DICTIONARY_COLUMNS))
        self._current[2].write_table(chunk.select(self.stored.names).cast(self.stored))
        self._rows += chunk.num_rows
        self._held += chunk.nbytes

    def close(self) -> None:
        if self._current is None:
            return
        partition, local, writer = self._current
        writer.close()
        path = f"{PARTITION_COLUMN}={partition}/part-{uuid.uuid4()}.c000.zstd.parquet"
        self.store.put_file(self.location.file_key(path), local)
        self.written.append({"path": path, "partition": partition, "size": os.path.getsize(local),
                             "rows": self._rows})
        with contextlib.suppress(OSError):
            os.remove(local)
        self._current, self._rows, self._held = None, 0, 0

    def files(self) -> pa.RecordBatch:
        """What was written, a row per file (`_FILE_ROW`)."""
        self.close()
        return pa.RecordBatch.from_pylist(self.written, schema=_FILE_SCHEMA)


def _file_writer(location: Location, schema: pa.Schema) -> Callable[[Iterator[pa.RecordBatch]],
                                                                        Iterator[pa.RecordBatch]]:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with tempfile.TemporaryDirectory(prefix="kcompact-table-") as tmp:
            sink = _FileSink(location, schema, tmp)
            for batch in batches:
                sink.add(pa.Table.from_batches([batch]))
            yield sink.files()

    return write


def write_files(rows: DataFrame, location: Location, schema: pa.Schema, tasks: int) -> list[dict[str, object]]:
    """Write `rows` as Parquet files of the table (sorted by partition and key), one or more per task and
    partition; returns each file's path, partition, size and row count. Nothing is visible until committed."""
    spread = rows.repartition(max(1, tasks), PARTITION_COLUMN, "key").sortWithinPartitions(PARTITION_COLUMN, "key")
    return [r.asDict() for r in spread.mapInArrow(_file_writer(location, schema), _FILE_ROW).collect()]


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


def _bucket(bucket: int, buckets: int) -> Callable[[pa.Array], np.ndarray]:
    """The keys of bucket `bucket` of `buckets` (by XXH64, `compaction.bloom.hashing`); nulls are dropped anyway."""
    def mine(keys: pa.Array) -> np.ndarray:
        if buckets == 1:
            return np.ones(len(keys), bool)
        hashes = np.zeros(len(keys), np.uint64)
        valid = np.asarray(keys.is_valid(), bool)
        hashes[valid] = key_hashes(keys)
        return hashes % np.uint64(buckets) == bucket

    return mine


def _rebuilder(spec: StoreSpec, location: Location, schema: pa.Schema, strategy: CompactionStrategy,
               header: str | None,
               groups: Sequence[Sequence[tuple[PartitionSpan, ConsumerRead, Sequence[SegmentRef], int, int]]]
               ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A rebuild task (one of `groups`, each of whose items is a span, its consumer read and pieces, the bucket and
    bucket count): for each item, decode the partition's pieces, keep the keyed records below `to_offset` whose key
    hashes to the bucket, and write the table's rows of those keys (`table_rows_of`) as files; yields what it
    wrote."""
    def rebuild(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = spec.open()
        with tempfile.TemporaryDirectory(prefix="kcompact-table-") as tmp:
            sink = _FileSink(location, schema, tmp)
            for ids in batches:
                for span, read, pieces, bucket, buckets in (t for i in ids.column(0).to_pylist() for t in groups[i]):
                    held = _held_records(store, read, pieces, _bucket(bucket, buckets))
                    sink.add(table_rows_of(held, span.partition, span.from_offset, strategy, header, schema))
            yield sink.files()

    return rebuild


def _held_records(store: ObjectStore, read: ConsumerRead, pieces: Sequence[SegmentRef],
                  keys: Callable[[pa.Array], np.ndarray] | None) -> list[pa.Table]:
    """The keyed committed records of `pieces` below the span's `to_offset`, where its `read` stops (of the keys
    `keys` keeps)."""
    return [pa.Table.from_batches([batch]) for piece in pieces
            for batch in segment_batches(store, piece, read, keys=keys)]


UPDATE_TASK_BYTES = REBUILD_TASK_BYTES
"""The most an update task of one partition holds: the new records it decodes plus the table files it reads (their
size on disk; a larger partition's update goes through Spark's aggregate and join)."""

DRIVER_UPDATE_BYTES = 512 << 20
"""An update whose tasks hold at most this much in all runs them in the driver's process, a thread a task, with no
Spark job: on one machine's cores such an update takes about a second, where a session's first Python task alone
(Spark's daemon, a worker, its imports and kernels) takes several; BENCHMARKS.md P8 has both."""

_UPDATE_SCHEMA = pa.schema([*_FILE_SCHEMA, pa.field("kind", pa.string(), False), pa.field("vector", pa.string())])
_UPDATE_ROW = StructType([*_FILE_ROW.fields, StructField("kind", StringType(), False),
                          StructField("vector", StringType(), True)])


@dataclass(frozen=True)
class Updated:
    """What the update tasks did: the files they wrote (as `rebuild_files` returns them), the paths of the files they
    rewrote (to be removed), the files whose changed keys' rows they marked deleted, each with its new vector, how
    many tasks ran, and whether they ran in the driver's process (`DRIVER_UPDATE_BYTES`)."""

    written: list[dict[str, object]]
    replaced: set[str]
    marked: dict[str, DeletionVector]
    tasks: int
    on_driver: bool


def update_files(spark: SparkSession, store: ObjectStore, refs: Mapping[int, Sequence[SegmentRef]],
                 spans: Sequence[PartitionSpan], files: Mapping[int, Sequence[DataFile]], location: Location,
                 schema: pa.Schema, strategy: CompactionStrategy, header: str | None, *, vectors: bool) -> Updated:
    """Apply the updates `spans` with no shuffle: for each partition (a task per core takes a share of them,
    `compaction.tasks.task_groups`) the task decodes its new records (from `read_from`),
    folds the winners of the keys they change (`table_changes_of`), reads the key column of each of the partition's
    table `files`, marks the rows of changed keys deleted in a deletion vector (with `vectors`, up to
    `PURGE_SHARE` of a file) or rewrites the file without them, and writes the winners. The tasks run on Spark's
    executors, or in this process when they hold `DRIVER_UPDATE_BYTES` at most. Nothing is visible until
    committed."""
    tasks = [(span, read, pieces, tuple(files.get(span.partition, ())))
             for span, (read, pieces) in zip(spans, partition_reads(store, refs, spans), strict=True)]
    sizes = [span.segment_bytes + sum(f.size for f in old) for span, _, _, old in tasks]
    on_driver = sum(sizes) <= DRIVER_UPDATE_BYTES
    cores = spark.sparkContext.defaultParallelism
    groups = [[tasks[i] for i in group]
              for group in task_groups(sizes, min(cores, os.cpu_count() or 1) if on_driver else cores)]
    update = _updater(store.spec, location, schema, strategy, header, groups, PURGE_SHARE if vectors else 0.0)
    if on_driver:
        done = _run_here(update, len(groups))
    else:
        ids = spark.range(0, len(groups), 1, max(1, len(groups)))
        done = [r.asDict() for r in ids.mapInArrow(update, _UPDATE_ROW).collect()]
    written = [{k: v for k, v in r.items() if k not in ("kind", "vector")} for r in done if r["kind"] == "written"]
    return Updated(written, {str(r["path"]) for r in done if r["kind"] == "replaced"},
                   {str(r["path"]): DeletionVector.from_json(json.loads(r["vector"]))
                    for r in done if r["kind"] == "marked"}, len(groups), on_driver)


def _run_here(task: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], count: int
              ) -> list[dict[str, Any]]:
    """The rows `task` (a `mapInArrow` function) returns for the ids 0..count-1, each id run in a thread of this
    process as Spark would run it in a task of `spark.range(count)` (the decode, Parquet and Arrow work in a task
    releases the GIL for much of its time)."""
    def one(i: int) -> list[dict[str, Any]]:
        ids = pa.record_batch([pa.array([i], pa.int64())], names=["id"])
        return [row for batch in task(iter([ids])) for row in batch.to_pylist()]

    with ThreadPoolExecutor(max(1, count), thread_name_prefix="kcompact-update") as pool:
        return [row for rows in pool.map(one, range(count)) for row in rows]


def _updater(spec: StoreSpec, location: Location, schema: pa.Schema, strategy: CompactionStrategy,
             header: str | None, groups: Sequence[Sequence[tuple[PartitionSpan, ConsumerRead, Sequence[SegmentRef],
                                                                 Sequence[DataFile]]]], purge_share: float
             ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """An update task: one of `groups`, each partition of it a span, its consumer read and pieces, its table
    files."""
    def update(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store, tables = spec.open(), location.open()
        done: list[dict[str, object]] = []
        vectors, dv_files = VectorFile(), dict[str, bytes | memoryview]()
        with tempfile.TemporaryDirectory(prefix="kcompact-table-") as tmp:
            sink = _FileSink(location, schema, tmp)
            for ids in batches:
                for span, read, pieces, old in (task for i in ids.column(0).to_pylist() for task in groups[i]):
                    held = _held_records(store, read, pieces, None)
                    rows, changed = table_changes_of(held, span.partition, span.from_offset, strategy, header, schema)
                    for f in old:
                        data = pa.BufferReader(tables.view(location.file_key(f.path)))
                        gone = np.asarray(pc.is_in(pq.read_table(data, columns=["key"])["key"], value_set=changed),
                                          bool)
                        deleted = deleted_rows(tables, location, f.vector, dv_files)
                        gone[deleted.astype(np.int64)] = False
                        if not gone.any():
                            continue
                        count = f.rows if f.rows == len(gone) else 0  # its log entry's count, if right (Delta's)
                        kind, vector, positions = _mark(count, deleted, np.flatnonzero(gone), vectors, purge_share)
                        done.append({"path": f.path, "partition": f.partition, "size": f.size, "rows": f.rows,
                                     "kind": kind, "vector": vector})
                        if kind == "replaced":
                            kept = _live(pq.read_table(data), positions)
                            sink.add(kept.append_column(PARTITION_COLUMN,
                                                        pa.array(np.full(kept.num_rows, span.partition, np.int32))))
                    sink.add(rows)
            written = sink.files()
        if len(vectors):
            tables.put(location.file_key(vectors.name), vectors.data())
        yield pa.RecordBatch.from_arrays([*written.columns, pa.array(["written"] * written.num_rows),
                                          pa.nulls(written.num_rows, pa.string())], schema=_UPDATE_SCHEMA)
        yield pa.RecordBatch.from_pylist(done, schema=_UPDATE_SCHEMA)

    return update


def rebuild_files(spark: SparkSession, store: ObjectStore, refs: Mapping[int, Sequence[SegmentRef]],
                  spans: Sequence[tuple[PartitionSpan, int]], location: Location, schema: pa.Schema,
                  strategy: CompactionStrategy, header: str | None) -> list[dict[str, object]]:
    """Rebuild the rows of `spans` (each with its bucket count, `rebuild_buckets`) from their partitions' log
    `refs` with no shuffle: a task per (partition, bucket) decodes the partition's read_committed records, folds
    its keys' winners and writes them; returns each file's path, partition, size and row count. Nothing is
    visible until committed."""
    reads = partition_reads(store, refs, [span for span, _ in spans])
    tasks = [(span, read, pieces, bucket, buckets)
             for (span, buckets), (read, pieces) in zip(spans, reads, strict=True) for bucket in range(buckets)]
    groups = [[tasks[i] for i in group] for group in pack_for([t[0].segment_bytes for t in tasks],
                                                              spark.sparkContext.defaultParallelism)]
    ids = spark.range(0, len(groups), 1, max(1, len(groups)))
    rebuild = _rebuilder(store.spec, location, schema, strategy, header, groups)
    return [r.asDict() for r in ids.mapInArrow(rebuild, _FILE_ROW).collect()]


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


__all__ = ["PURGE_SHARE", "Updated", "deleted_rows", "kept_rows", "mark_rows",
           "rebuild_buckets", "rebuild_files", "row_schema", "table_rows", "topic_records", "update_files", "winners",
           "write_files"]
