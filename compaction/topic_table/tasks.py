"""The topic table's tasks: frozen task values in, a typed `TaskOutcome` out, no Spark (MECHANISM).

The driver builds the task values (`compaction.spark.table`); Spark ships them to its executors, or `run_here` runs
the same values in threads of the driver's process (a small update: `compaction.spark.table.DRIVER_UPDATE_BYTES`).
A task that hits one of kcompact's errors (corrupt input naming the object and the byte, a store failing past its
retries) returns it in its outcome, as the exception itself (`portable`: pickled with its class and fields), and the
driver raises it (`succeeded`), so the command exits with that error's code and one-line message.

- `RebuildTask`: partitions (or key buckets of one) rebuilt from their logs: decode, fold each key's winner, write.
- `UpdateTask`: partitions updated from their new records: fold the winners of the keys they change, mark the rows
  of those keys in the partition's table files deleted (or rewrite a file past its purge share), write the winners.
- `MarkFiles`, `WriteFiles`: the Spark path's marks of the rows a join found, and its writes of rows it computed.
- `ReadFiles`, `ReadRecords`: the Spark path's reads of the table's files and of a partition's records; they yield
  rows, not an outcome (their caller on Spark carries their errors back, `compaction.spark.table.TaskErrors`).

Nothing a task writes is visible until the driver commits it (`compaction.topic_table.target`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compaction.bloom.hashing import key_hashes
from compaction.config import CompactionStrategy
from compaction.errors import KcompactError
from compaction.reader import ConsumerRead, SegmentRef, segment_batches
from compaction.storage.base import ObjectStore, StoreSpec
from compaction.topic_table.deletion_vectors import DeletionVector, VectorFile, read_vector
from compaction.topic_table.plan import PartitionSpan
from compaction.topic_table.target import FILE_BYTES, PARTITION_COLUMN, DataFile, Location
from compaction.topic_table.winners import table_changes_of, table_rows_of


class MarkKind(Enum):
    """What a task did to a table file holding changed keys."""

    MARKED = "marked"  # their rows deleted by the file's new deletion vector
    REPLACED = "replaced"  # rewritten without them (past the purge share): the old file is to be removed


@dataclass(frozen=True)
class FileMark:
    """A table file a task marked (`vector`: its new deletion vector) or rewrote (`vector` None)."""

    path: str
    kind: MarkKind
    vector: DeletionVector | None = None


@dataclass(frozen=True)
class TaskOutcome:
    """What one table task did: the files it wrote (none visible until committed) and the old files it marked or
    rewrote; or the kcompact error that failed it (nothing of the run is committed)."""

    written: tuple[DataFile, ...] = ()
    marks: tuple[FileMark, ...] = ()
    error: KcompactError | None = None


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


def attempt(work: Callable[[], TaskOutcome]) -> TaskOutcome:
    """The outcome of `work`, or of the kcompact error it raised (as a value, `portable`)."""
    try:
        return work()
    except KcompactError as exc:
        return TaskOutcome(error=portable(exc))


def succeeded(outcomes: Sequence[TaskOutcome]) -> Sequence[TaskOutcome]:
    """`outcomes`, once none holds an error; else the first error, raised on the driver as itself."""
    for outcome in outcomes:
        if outcome.error is not None:
            raise outcome.error
    return outcomes


class TableTask(Protocol):
    """A task value: frozen, picklable, run where it lands (a Spark task, or a thread of the driver)."""

    def run(self) -> TaskOutcome: ...


def run_here(tasks: Sequence[TableTask]) -> list[TaskOutcome]:
    """The outcomes of `tasks`, each run in a thread of this process as Spark would run it in a task (the decode,
    Parquet and Arrow work in a task releases the GIL for much of its time)."""
    with ThreadPoolExecutor(max(1, len(tasks)), thread_name_prefix="kcompact-update") as pool:
        return list(pool.map(lambda task: task.run(), tasks))


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


def _mark(rows: int, deleted: np.ndarray, gone: np.ndarray, vectors: VectorFile, purge_share: float
          ) -> tuple[MarkKind, DeletionVector | None, np.ndarray]:
    """Delete the rows at `gone` of a file of `rows` rows (whose vector already deletes `deleted`): (MARKED, its new
    vector, all its deleted rows), the vector added to `vectors`; or, past `purge_share` of its rows (REPLACED, None,
    all its deleted rows): the caller rewrites it without them. A file whose log entry holds no row count (0 here)
    is rewritten: Delta requires a marked file's `numRecords`."""
    positions = np.union1d(deleted, gone.astype(np.uint64))
    if len(positions) <= purge_share * rows:
        return MarkKind.MARKED, vectors.add(positions), positions
    return MarkKind.REPLACED, None, positions


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
        self.written: list[DataFile] = []
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
        self.written.append(DataFile(path, partition, os.path.getsize(local), self._rows))
        with contextlib.suppress(OSError):
            os.remove(local)
        self._current, self._rows, self._held = None, 0, 0

    def files(self) -> tuple[DataFile, ...]:
        """What was written, a file each."""
        self.close()
        return tuple(self.written)


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
    key hashes to the bucket, and write the table's rows of those keys (`table_rows_of`) as files."""

    spec: StoreSpec
    location: Location
    schema: pa.Schema
    strategy: CompactionStrategy
    header: str | None
    items: tuple[RebuildItem, ...]

    def run(self) -> TaskOutcome:
        return attempt(self._rebuild)

    def _rebuild(self) -> TaskOutcome:
        store = self.spec.open()
        with tempfile.TemporaryDirectory(prefix="kcompact-table-") as tmp:
            sink = _FileSink(self.location, self.schema, tmp)
            for item in self.items:
                held = _held_records(store, item.read, item.pieces, _bucket(item.bucket, item.buckets))
                sink.add(table_rows_of(held, item.span.partition, item.span.from_offset, self.strategy, self.header,
                                       self.schema))
            return TaskOutcome(written=sink.files())


@dataclass(frozen=True)
class UpdateItem:
    """A partition's span, its consumer read and pieces from `read_from`, and its table files."""

    span: PartitionSpan
    read: ConsumerRead
    pieces: tuple[SegmentRef, ...]
    files: tuple[DataFile, ...]


@dataclass(frozen=True)
class UpdateTask:
    """An update task: for each item, decode the new records, fold the winners of the keys they change
    (`table_changes_of`), read the key column of each of the partition's table files, mark the rows of changed keys
    deleted in a deletion vector (up to `purge_share` of a file; all the task's vectors in one DV file) or rewrite
    the file without them, and write the winners."""

    spec: StoreSpec
    location: Location
    schema: pa.Schema
    strategy: CompactionStrategy
    header: str | None
    purge_share: float
    items: tuple[UpdateItem, ...]

    def run(self) -> TaskOutcome:
        return attempt(self._update)

    def _update(self) -> TaskOutcome:
        store, tables, location = self.spec.open(), self.location.open(), self.location
        marks: list[FileMark] = []
        vectors, dv_files = VectorFile(), dict[str, bytes | memoryview]()
        with tempfile.TemporaryDirectory(prefix="kcompact-table-") as tmp:
            sink = _FileSink(location, self.schema, tmp)
            for item in self.items:
                span = item.span
                held = _held_records(store, item.read, item.pieces, None)
                rows, changed = table_changes_of(held, span.partition, span.from_offset, self.strategy, self.header,
                                                 self.schema)
                for f in item.files:
                    data = pa.BufferReader(tables.view(location.file_key(f.path)))
                    gone = np.asarray(pc.is_in(pq.read_table(data, columns=["key"])["key"], value_set=changed), bool)
                    deleted = deleted_rows(tables, location, f.vector, dv_files)
                    gone[deleted.astype(np.int64)] = False
                    if not gone.any():
                        continue
                    count = f.rows if f.rows == len(gone) else 0  # its log entry's count, if right (Delta's)
                    kind, vector, positions = _mark(count, deleted, np.flatnonzero(gone), vectors, self.purge_share)
                    marks.append(FileMark(f.path, kind, vector))
                    if kind is MarkKind.REPLACED:
                        kept = _live(pq.read_table(data), positions)
                        sink.add(kept.append_column(PARTITION_COLUMN,
                                                    pa.array(np.full(kept.num_rows, span.partition, np.int32))))
                sink.add(rows)
            written = sink.files()
        if len(vectors):
            tables.put(location.file_key(vectors.name), vectors.data())
        return TaskOutcome(written=written, marks=tuple(marks))


@dataclass(frozen=True)
class MarkFiles:
    """The Spark path's marks: for each (path, row positions) a join found, the file's rows at those positions
    deleted in a new deletion vector (all of the task's in one DV file) or, past `purge_share`, the file left to be
    rewritten."""

    location: Location
    files: tuple[DataFile, ...]
    purge_share: float

    def run(self, found: Iterable[tuple[str, Sequence[int]]]) -> TaskOutcome:
        return attempt(lambda: self._mark(found))

    def _mark(self, found: Iterable[tuple[str, Sequence[int]]]) -> TaskOutcome:
        store, files = self.location.open(), {f.path: f for f in self.files}
        vectors, dv_files, marks = VectorFile(), dict[str, bytes | memoryview](), []
        for path, positions in found:
            file = files[path]
            deleted = deleted_rows(store, self.location, file.vector, dv_files)
            kind, vector, _ = _mark(file.rows, deleted, np.asarray(positions, np.uint64), vectors, self.purge_share)
            marks.append(FileMark(path, kind, vector))
        if len(vectors):
            store.put(self.location.file_key(vectors.name), vectors.data())
        return TaskOutcome(marks=tuple(marks))


@dataclass(frozen=True)
class WriteFiles:
    """The Spark path's writes: rows of the table's `schema` (`partition` included), in the order they come,
    written as the table's Parquet files."""

    location: Location
    schema: pa.Schema

    def run(self, rows: Iterable[pa.Table]) -> TaskOutcome:
        return attempt(lambda: self._write(rows))

    def _write(self, rows: Iterable[pa.Table]) -> TaskOutcome:
        with tempfile.TemporaryDirectory(prefix="kcompact-table-") as tmp:
            sink = _FileSink(self.location, self.schema, tmp)
            for table in rows:
                sink.add(table)
            return TaskOutcome(written=sink.files())


@dataclass(frozen=True)
class FileToRead:
    """A table file to read and its deletion vector (None: none)."""

    path: str
    partition: int
    vector: DeletionVector | None


@dataclass(frozen=True)
class ReadFiles:
    """The Spark path's read of table files: their live rows (their deletion vectors applied; only `columns`, all if
    None), with `partition` and `_file` (and, with `positions`, `_pos`: the row's position in its file)."""

    location: Location
    columns: tuple[str, ...] | None
    positions: bool

    def rows(self, files: Iterable[FileToRead]) -> Iterator[pa.RecordBatch]:
        """The rows of `files`, in turn."""
        store = self.location.open()
        vectors: dict[str, bytes | memoryview] = {}
        columns = None if self.columns is None else list(self.columns)
        for file in files:
            data = pq.read_table(pa.BufferReader(store.view(self.location.file_key(file.path))), columns=columns)
            if self.positions:
                data = data.append_column("_pos", pa.array(np.arange(data.num_rows, dtype=np.int64)))
            data = _live(data, deleted_rows(store, self.location, file.vector, vectors))
            data = data.append_column(PARTITION_COLUMN, pa.array(np.full(data.num_rows, file.partition, np.int32)))
            data = data.append_column("_file", pa.array([file.path] * data.num_rows, pa.string()))
            yield from data.to_batches()


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


__all__ = ["DICTIONARY_COLUMNS", "FileMark", "FileToRead", "MarkFiles", "MarkKind", "ReadFiles", "ReadRecords",
           "RebuildItem", "RebuildTask", "TableTask", "TaskOutcome", "UpdateItem", "UpdateTask", "WriteFiles",
           "attempt", "deleted_rows", "portable", "run_here", "succeeded"]
