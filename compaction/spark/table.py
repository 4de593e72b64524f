"""The table run's data path on Spark: new records → winners per key → merged with the table's rows → files.

1. **records**: each partition's consumer view (`read_partition`, read_committed) from the span's `read_from`,
   cut at its last stable offset; keyless records are not part of a compacted topic's state;
2. **winners**: per (partition, key), the record of greatest rank (has_version, version, offset) (KIP-280's
   rule of `compaction.strategies.ranking`), kept only for keys with a record in [from_offset, to_offset);
3. **touched files**: the table files (of updated partitions) holding one of those keys: a key-only read;
4. **merge**: the touched files' rows, full outer join the winners by (partition, key): the winner replaces
   the row (or is inserted), a tombstone winner removes it, the other rows stay as they were;
5. **write**: the rows of rebuilt partitions and the merged rows, as new Parquet files, written by executors
   straight into the table's location; the driver commits them with the removal of the files they replace.

Executors open the table's store from its picklable spec; no Spark filesystem (s3a) is involved.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import reduce

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from compaction.config import CompactionStrategy
from compaction.spark.local import local_frame
from compaction.spark.ranking import best, rank_columns
from compaction.spark.read import RECORD_STRUCT, read_partition
from compaction.storage.base import ObjectStore
from compaction.topic_table.plan import PartitionSpan
from compaction.topic_table.target import FILE_BYTES, PARTITION_COLUMN, VERSION_COLUMN, DataFile, Location

DATA_COLUMNS = ("value", "offset", "timestamp", "headers")
_FILE_ROW = StructType([
    StructField("path", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("size", LongType(), False),
    StructField("rows", LongType(), False),
])


def row_schema(strategy: CompactionStrategy) -> StructType:
    """The table's columns as Spark types (`compaction.topic_table.target.table_schema`)."""
    headers = RECORD_STRUCT["headers"].dataType
    fields = [StructField("key", BinaryType(), False), StructField("value", BinaryType(), True),
              StructField("offset", LongType(), False), StructField("timestamp", LongType(), False),
              StructField("headers", headers, False)]
    if strategy is not CompactionStrategy.OFFSET:
        fields.append(StructField(VERSION_COLUMN, LongType(), True))
    return StructType(fields)


def topic_records(spark: SparkSession, store: ObjectStore, topic: str, spans: Sequence[PartitionSpan],
                  metadata_version: int) -> list[DataFrame]:
    """Per span, (partition, key, value, offset, timestamp, headers, fresh); `fresh`: at or above from_offset."""
    frames = []
    for span in spans:
        view = read_partition(spark, store, topic, span.partition, from_offset=span.read_from,
                              isolation="read_committed", version=metadata_version)
        frames.append(view.where((F.col("offset") < span.to_offset) & F.col("key").isNotNull()).select(
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


def _file_reader(location: Location, columns: Sequence[str] | None) -> Callable[
        [Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = location.open()
        for descriptors in batches:
            for d in descriptors.to_pylist():
                data = pq.read_table(pa.BufferReader(store.get(location.file_key(d["path"]))), columns=columns)
                data = data.append_column(PARTITION_COLUMN, pa.array([d[PARTITION_COLUMN]] * data.num_rows,
                                                                      pa.int32()))
                data = data.append_column("_file", pa.array([d["path"]] * data.num_rows, pa.string()))
                yield from data.to_batches()

    return read


def table_rows(spark: SparkSession, location: Location, files: Sequence[DataFile], schema: StructType,
               columns: Sequence[str] | None = None) -> DataFrame:
    """The rows of `files` (only `columns`, all if None) with their `partition` and `_file`, read by executors."""
    fields = [f for f in schema.fields if columns is None or f.name in columns or f.name == "key"]
    fields = [f for f in fields if f.name != PARTITION_COLUMN]
    out = StructType([*fields, StructField(PARTITION_COLUMN, IntegerType(), False),
                      StructField("_file", StringType(), False)])
    wanted = None if columns is None else [f.name for f in fields]
    rows = [(f.path, f.partition) for f in files]
    descriptors = local_frame(spark, rows, "path string, partition int").repartition(max(1, len(rows)))
    return descriptors.mapInArrow(_file_reader(location, wanted), out)


def touched_files(spark: SparkSession, location: Location, files: Sequence[DataFile], schema: StructType,
                  fresh: DataFrame) -> set[str]:
    """The files among `files` that hold a key of `fresh` (a key-only read of each)."""
    if not files:
        return set()
    keys = table_rows(spark, location, files, schema, columns=["key"])
    hits = keys.join(fresh.select(PARTITION_COLUMN, "key"), [PARTITION_COLUMN, "key"], "left_semi")
    return {r["_file"] for r in hits.select("_file").distinct().collect()}


def merged(old: DataFrame, fresh: DataFrame, columns: Sequence[str]) -> DataFrame:
    """`old` rows with `fresh` winners applied by (partition, key): replaced, inserted, or removed (tombstone)."""
    joined = old.drop("_file").alias("o").join(fresh.alias("n"), [PARTITION_COLUMN, "key"], "full_outer")
    won = F.col("n.offset").isNotNull()
    picked = [F.when(won, F.col(f"n.{c}")).otherwise(F.col(f"o.{c}")).alias(c) for c in columns]
    return joined.select(PARTITION_COLUMN, "key", *picked).where(F.col("value").isNotNull())


def _file_writer(location: Location, schema: pa.Schema) -> Callable[[Iterator[pa.RecordBatch]],
                                                                        Iterator[pa.RecordBatch]]:
    stored = pa.schema([f for f in schema if f.name != PARTITION_COLUMN])

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = location.open()
        written: list[dict[str, object]] = []
        with tempfile.TemporaryDirectory(prefix="kcompact-table-") as tmp:
            current: tuple[int, str, pq.ParquetWriter] | None = None
            rows = held = 0

            def close() -> None:
                nonlocal current, rows, held
                if current is None:
                    return
                partition, local, writer = current
                writer.close()
                path = f"{PARTITION_COLUMN}={partition}/part-{uuid.uuid4()}.c000.zstd.parquet"
                store.put_file(location.file_key(path), local)
                written.append({"path": path, "partition": partition, "size": os.path.getsize(local), "rows": rows})
                with contextlib.suppress(OSError):
                    os.remove(local)
                current, rows, held = None, 0, 0

            for batch in batches:
                table = pa.Table.from_batches([batch])
                parts = table[PARTITION_COLUMN].to_numpy()
                for partition in sorted(set(parts.tolist())):
                    chunk = table.filter(pa.compute.equal(table[PARTITION_COLUMN], partition)) \
                        if len(set(parts.tolist())) > 1 else table
                    if current is not None and (current[0] != partition or held >= FILE_BYTES):
                        close()
                    if current is None:
                        local = os.path.join(tmp, f"{uuid.uuid4()}.parquet")
                        current = (partition, local, pq.ParquetWriter(local, stored, compression="zstd"))
                    current[2].write_table(chunk.select(stored.names).cast(stored))
                    rows += chunk.num_rows
                    held += chunk.nbytes
            close()
        yield pa.RecordBatch.from_pylist(written, schema=pa.schema([
            pa.field("path", pa.string(), False), pa.field("partition", pa.int32(), False),
            pa.field("size", pa.int64(), False), pa.field("rows", pa.int64(), False)]))

    return write


def write_files(rows: DataFrame, location: Location, schema: pa.Schema, tasks: int) -> list[dict[str, object]]:
    """Write `rows` as Parquet files of the table (sorted by partition and key), one or more per task and
    partition; returns each file's path, partition, size and row count. Nothing is visible until committed."""
    spread = rows.repartition(max(1, tasks), PARTITION_COLUMN, "key").sortWithinPartitions(PARTITION_COLUMN, "key")
    return [r.asDict() for r in spread.mapInArrow(_file_writer(location, schema), _FILE_ROW).collect()]


def stats(rows: int) -> str:
    """The Delta `stats` of a written file (the row count; readers need no more)."""
    return json.dumps({"numRecords": rows})


__all__ = ["merged", "row_schema", "stats", "table_rows", "topic_records", "touched_files", "winners", "write_files"]
