"""The topic table's tasks: frozen task values in, the table's rows out, no Spark (MECHANISM).

The driver builds the task values (`compaction.spark.table`); Spark ships them to its executors, where each yields
its rows into a DataFrame that Delta's writer writes (`compaction.spark.delta_table`), or `run_here` runs the same
values in threads of the driver's process (a small update: `compaction.spark.table.DRIVER_UPDATE_BYTES`) and the
driver hands their rows to Delta. A task writes nothing itself.

- `RebuildTask`: partitions (or key buckets of one) rebuilt from their logs: decode, fold each key's winner, yield
  the table's rows of those keys (tombstone winners dropped).
- `UpdateTask`: partitions updated from their new records: fold the winners of the keys they change and yield them,
  a tombstone winner as a row whose value is null (the MERGE deletes that key's row).
- `ReadRecords`: the Spark path's read of a partition's records.

A task that hits one of kcompact's errors (corrupt input naming the object and the byte, a store failing past its
retries) carries it back as the exception itself (`portable`: pickled with its class and fields): in a thread of
the driver it is raised as it is; on Spark the task fails with a `CarriedError` holding it, which fails the job and
with it Delta's command (nothing is committed), and the driver raises the error it holds (`carried`), so the
command exits with that error's code and one-line message.
"""

from __future__ import annotations

import base64
import pickle
import re
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compaction.bloom.hashing import key_hashes
from compaction.config import CompactionStrategy
from compaction.errors import KcompactError
from compaction.reader import ConsumerRead, SegmentRef, segment_batches
from compaction.storage.base import ObjectStore, StoreSpec
from compaction.topic_table.plan import PartitionSpan
from compaction.topic_table.target import PARTITION_COLUMN
from compaction.topic_table.winners import table_changes_of, table_rows_of


def portable(exc: KcompactError) -> KcompactError:
    """`exc` with the executor's traceback as a note, when it comes back from pickling as itself (its class, fields
    and message); else a `KcompactError` of the same message and exit code."""
    exc.add_note("".join(traceback.format_exception(exc)))
    try:
        back = pickle.loads(pickle.dumps(exc))
        if type(back) is type(exc) and str(back) == str(exc):
            return exc
    except Exception:  # a field that does not pickle: the plain error below
        pass
    plain = KcompactError(str(exc))
    plain.exit_code = exc.exit_code
    plain.add_note(exc.__notes__[-1])
    return plain


_CARRIED = re.compile(r"kcompact-task-error<([A-Za-z0-9+/=]+)>")


class CarriedError(Exception):
    """A task's kcompact error on its way through Spark: its message holds the error pickled (`carried` reads it
    back on the driver, from whatever exception Spark and Delta wrap it in)."""

    def __init__(self, error: KcompactError) -> None:
        packed = base64.b64encode(pickle.dumps(portable(error))).decode()
        super().__init__(f"{error.__class__.__name__}: {error} kcompact-task-error<{packed}>")


def carrying(rows: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`rows`, a kcompact error among them raised as a `CarriedError` (the Spark task fails with it)."""
    try:
        yield from rows
    except KcompactError as exc:
        raise CarriedError(exc) from None


def carried(exc: BaseException) -> KcompactError | None:
    """The kcompact error a task carried in `exc` (a `CarriedError` as Spark, py4j and Delta raise it on the driver:
    in its message, or in a Java cause's), None when it holds none."""
    texts = [str(exc)]
    java: Any = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    for _ in range(20):
        if java is None:
            break
        try:
            texts.append(str(java.toString()))
            java = java.getCause()
        except Exception:  # not a Java object after all
            break
    for text in texts:
        if (found := _CARRIED.search(text)) is not None:
            error = pickle.loads(base64.b64decode(found.group(1)))
            if isinstance(error, KcompactError):
                return error
    return None


class TableTask(Protocol):
    """A task value: frozen, picklable, run where it lands (a Spark task, or a thread of the driver)."""

    def rows(self) -> Iterator[pa.RecordBatch]: ...


def run_here(tasks: Sequence[TableTask], schema: pa.Schema) -> pa.Table:
    """The rows of `tasks` (`schema`), each run in a thread of this process as Spark would run it in a task (the
    decode and Arrow work in a task releases the GIL for much of its time); a kcompact error raised as itself."""
    def rows(task: TableTask) -> list[pa.RecordBatch]:
        try:
            return list(task.rows())
        except KcompactError as exc:
            raise portable(exc) from None  # with the task's traceback as a note, as from Spark

    with ThreadPoolExecutor(max(1, len(tasks)), thread_name_prefix="kcompact-update") as pool:
        batches = [b for found in pool.map(rows, tasks) for b in found]
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()


def source_schema(schema: pa.Schema) -> pa.Schema:
    """The rows tasks yield: the table's `schema` with `value` nullable (an update's tombstone winner)."""
    return pa.schema([f.with_nullable(True) if f.name == "value" else f for f in schema])


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


def _held_records(store: ObjectStore, read: ConsumerRead, pieces: Sequence[SegmentRef],
                  keys: Callable[[pa.Array], np.ndarray] | None) -> list[pa.Table]:
    """The keyed committed records of `pieces` below the span's `to_offset`, where its `read` stops (of the keys
    `keys` keeps)."""
    return [pa.Table.from_batches([batch]) for piece in pieces
            for batch in segment_batches(store, piece, read, keys=keys)]


def _batches(table: pa.Table, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    yield from table.cast(schema).to_batches()


@dataclass(frozen=True)
class RebuildItem:
    """A partition's span, its consumer read and pieces (found by the driver), and the key bucket of `buckets` to
    rebuild (`compaction.spark.table.rebuild_buckets`)."""

    span: PartitionSpan
    read: ConsumerRead
    pieces: tuple[SegmentRef, ...]
    bucket: int = 0
    buckets: int = 1


@dataclass(frozen=True)
class RebuildTask:
    """A rebuild task: for each item, decode the partition's pieces, keep the keyed records below `to_offset` whose
    key hashes to the bucket, and yield the table's rows of those keys (`table_rows_of`, in offset order)."""

    spec: StoreSpec
    schema: pa.Schema
    strategy: CompactionStrategy
    header: str | None
    items: tuple[RebuildItem, ...]

    def rows(self) -> Iterator[pa.RecordBatch]:
        store, out = self.spec.open(), source_schema(self.schema)
        for item in self.items:
            held = _held_records(store, item.read, item.pieces, _bucket(item.bucket, item.buckets))
            yield from _batches(table_rows_of(held, item.span.partition, item.span.from_offset, self.strategy,
                                              self.header, self.schema), out)


@dataclass(frozen=True)
class UpdateItem:
    """A partition's span, and its consumer read and pieces from `read_from`."""

    span: PartitionSpan
    read: ConsumerRead
    pieces: tuple[SegmentRef, ...]


@dataclass(frozen=True)
class UpdateTask:
    """An update task: for each item, decode the new records, fold the winners of the keys they change
    (`table_changes_of`) and yield them, a key whose winner is a tombstone as a row of null value (and zero
    offset, timestamp, no headers): the MERGE's source."""

    spec: StoreSpec
    schema: pa.Schema
    strategy: CompactionStrategy
    header: str | None
    items: tuple[UpdateItem, ...]

    def rows(self) -> Iterator[pa.RecordBatch]:
        store, out = self.spec.open(), source_schema(self.schema)
        for item in self.items:
            span = item.span
            held = _held_records(store, item.read, item.pieces, None)
            rows, changed = table_changes_of(held, span.partition, span.from_offset, self.strategy, self.header,
                                             self.schema)
            yield from _batches(rows, out)
            gone = changed.filter(pc.invert(pc.is_in(changed, value_set=rows["key"].combine_chunks())))
            if len(gone):
                yield from _batches(tombstones(gone, span.partition, out), out)


def tombstones(keys: pa.Array, partition: int, schema: pa.Schema) -> pa.Table:
    """Rows of `schema` deleting `keys` of `partition` in a MERGE: value null."""
    n = len(keys)
    columns = {"key": keys, "value": pa.nulls(n, pa.binary()),
               PARTITION_COLUMN: pa.array(np.full(n, partition, np.int32)),
               "offset": pa.array(np.zeros(n, np.int64)), "timestamp": pa.array(np.zeros(n, np.int64)),
               "headers": pa.array([[]] * n, schema.field("headers").type)}
    return pa.table([columns.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema)


@dataclass(frozen=True)
class ReadRecords:
    """The Spark path's read of a partition's consumer records: the pieces at the indexes a task is given, in order
    (`compaction.reader.segment_batches`, as `compaction.spark.read.read_refs` decodes them)."""

    spec: StoreSpec
    read: ConsumerRead
    pieces: tuple[SegmentRef, ...]

    def rows(self, indexes: Iterable[int]) -> Iterator[pa.RecordBatch]:
        store = self.spec.open()
        for i in indexes:
            yield from segment_batches(store, self.pieces[i], self.read)


__all__ = ["CarriedError", "ReadRecords", "RebuildItem", "RebuildTask", "TableTask", "UpdateItem", "UpdateTask",
           "carried", "carrying", "portable", "run_here", "source_schema", "tombstones"]
