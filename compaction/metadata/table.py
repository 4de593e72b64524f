"""Opening the metadata table and reading snapshots of it, at the latest version or by time travel.

The table's files are those delta-rs lists for a version (`read_rows`), never a listing of its directory: old files
stay there until vacuum, and only the Delta log says which are current. A partition is loaded with a filter on both
partition columns, so only its files are opened; many partitions are loaded in one read (`load_partitions`, a filter
per topic naming its partitions).
`MetadataTable` holds nothing but the URI and storage options: it is small, picklable and safe to share between
threads; every read opens the Delta log afresh.

Opening the table checks its Delta protocol first (`compaction.delta_protocol.METADATA_TABLE`). kcompact reads the
data files itself, so a reader feature (deletion vectors, column mapping in use, ...) is refused on every open; a
writer feature kcompact's delta-rs writes do not honour (`rowTracking`, `domainMetadata`, ...) is refused on an open
for writing, the default. `segments`, `read`, `verify` and the metadata reads of `kcompact table` and `kcompact wal
upload`, which never write the table, open it with `write=False`; `kcompact plan` shares `compact`'s open for
writing. A refusal is `UnsupportedDeltaProtocolError`, exit 2. The check is made when a process opens the table: a
feature turned on while a long-lived process (the broker's metadata process) holds it open is refused by delta-rs
at that process's next commit if delta-rs does not implement it, and otherwise only at the process's next open.

A read that still fails after delta-rs's own retries (the log or a parquet file unreachable: throttling, 5xx,
timeouts) raises `TransientStoreError`, like a failed commit: the caller fails what the read was for (one
partition, when it read one) and a rerun is safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from compaction.delta_protocol import METADATA_TABLE, refused_by_delta_rs
from compaction.errors import (
    KcompactError,
    MetadataSchemaError,
    MetadataTableNotFoundError,
    MetadataVersionNotFoundError,
    MissingObjectError,
    TransientStoreError,
    plain_text,
)
from compaction.metadata.delta_log import (
    ROWS_FILE_MIN_PARTITIONS,
    ROWS_PATH_COLUMN,
    PartitionFile,
    group_of,
    rows_file_key,
    store_of,
)
from compaction.metadata.model import (
    LEGACY_METADATA_SCHEMA,
    METADATA_SCHEMA,
    PARTITION_COLUMNS,
    RowKind,
    SegmentMetadata,
    TopicPartition,
    check_topic,
    partition_from_row,
    segment_from_row,
)
from compaction.metadata.snapshot import MetadataSnapshot, PartitionSnapshot, build_snapshot
from compaction.storage.base import StoreStats, shared_pool

_log = logging.getLogger(__name__)

TABLE_NAME = "kcompact_metadata"

LOG_CONFIGURATION = {
    # a read loads the last checkpoint and every commit after it: delta-rs's default of 100 made each read of a
    # busy table on S3 fetch up to 100 commit files (the broker's metadata process reads it twice per tiered segment)
    "delta.checkpointInterval": "10",
    # delta-rs's default (true) lists the whole `_delta_log` after every commit, to delete expired entries: a
    # commit's cost then grows with the log (a LIST page per 1,000 files on S3). The log is expired by
    # `metadata.upkeep.expire_log` instead, from `kcompact gc`.
    "delta.enableExpiredLogCleanup": "false",
    # what `expire_log` keeps: time travel to any version of the last day (a run plans and commits within it)
    "delta.logRetentionDuration": "interval 1 day",
    # how long a removed data file stays, for readers of older versions, and its tombstone in each checkpoint:
    # no version older than the log's retention can be loaded, and Delta's default (a week) kept a week of
    # tombstones, two per partition a run swaps, in every checkpoint every read loads (`kcompact gc` deletes the
    # files, `upkeep.vacuum_data_files`)
    "delta.deletedFileRetentionDuration": "interval 1 day",
    # no column statistics in the add actions: every read selects files by their partition values (`read_rows`),
    # never by statistics, and a partition's file holds one partition's rows; delta-rs computing them for 22
    # columns was 9 of the 21 ms of a one-partition commit, and they were most of each checkpoint's bytes
    "delta.dataSkippingNumIndexedCols": "0",
}
"""The metadata table's log settings: set on creation, and on an older table by `upkeep.expire_log`
(docs/metadata-table.md explains the bound they keep)."""

Diagnose = Callable[[], KcompactError | None]
"""A store's `diagnose`: after a failed read, the configuration error behind it, if it finds one."""


class ObjectStoreLike(Protocol):
    """What the table needs of `compaction.storage.ObjectStore` (kept structural to avoid the import)."""

    @property
    def uri(self) -> str: ...

    def delta_uri(self, name: str) -> str: ...

    def delta_storage_options(self) -> dict[str, str]: ...

    def diagnose(self) -> KcompactError | None: ...


class DeltaTableRef:
    """One of kcompact's Delta tables by reference: the URI, the storage options and the store's `diagnose` (a store
    pickles), so it pickles across the Spark boundary and each side opens the table itself."""

    def __init__(self, table_uri: str, storage_options: Mapping[str, str] | None = None,
                 diagnose: Diagnose | None = None) -> None:
        self._uri = table_uri
        self._options = dict(storage_options or {})
        self._diagnose = diagnose

    @property
    def table_uri(self) -> str:
        return self._uri

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._uri!r})"


class MetadataTable(DeltaTableRef):
    """The Delta table in KIP-405's RemoteLogMetadataManager role; build with `open` or `create_if_missing`."""

    @classmethod
    def open(cls, table_uri: str, storage_options: Mapping[str, str] | None = None,
             diagnose: Diagnose | None = None, *, write: bool = True) -> MetadataTable:
        """Open an existing metadata table and check that it is kcompact's, and that its protocol is one kcompact
        reads and, unless `write` is False (a command that only reads the table), writes.

        Raises:
            MetadataTableNotFoundError: no Delta table at `table_uri`.
            UnsupportedDeltaProtocolError: the table requires a reader feature, or (`write`) a writer feature,
                kcompact's metadata-table writer does not implement (exit 2; nothing was written).
            MetadataSchemaError: a Delta table with other columns, types or partition columns.
        """
        table = cls(table_uri, storage_options, diagnose)
        dt = table.delta_table()
        METADATA_TABLE.check(dt, table_uri, write=write)
        table._check_schema(dt)
        return table

    @classmethod
    def create_if_missing(cls, table_uri: str, storage_options: Mapping[str, str] | None = None,
                          diagnose: Diagnose | None = None) -> MetadataTable:
        """Open the metadata table for writing, creating it (empty, version 0) if there is none. Idempotent.

        Two processes creating it at once is fine: the loser of the race to version 0 opens the winner's.
        """
        try:
            return cls.open(table_uri, storage_options, diagnose)
        except MetadataTableNotFoundError:
            pass
        # Losing the race to create version 0 raises; the open below then reads the winner's table.
        with contextlib.suppress(DeltaError):
            DeltaTable.create(
                table_uri,
                METADATA_SCHEMA,
                mode="ignore",
                partition_by=list(PARTITION_COLUMNS),
                name=TABLE_NAME,
                description="kcompact remote log segment metadata (KIP-405 RLMM)",
                configuration=dict(LOG_CONFIGURATION),
                storage_options=dict(storage_options) if storage_options else None,
            )
        return cls.open(table_uri, storage_options, diagnose)

    @property
    def storage_options(self) -> dict[str, str]:
        return dict(self._options)

    def delta_table(self, version: int | None = None) -> DeltaTable:
        """A fresh `DeltaTable` at `version` (latest if None).

        Raises:
            MetadataTableNotFoundError, MetadataVersionNotFoundError, TransientStoreError.
        """
        if version is not None and version < 0:  # delta-rs would raise OverflowError
            raise MetadataVersionNotFoundError(f"{self._uri}: no table version {version} (versions start at 0)")
        try:
            with reading(self._uri, self._diagnose):
                return DeltaTable(self._uri, version=version, storage_options=self._options or None)
        except TableNotFoundError as e:
            raise MetadataTableNotFoundError(f"{self._uri}: no Delta table here ({e})") from e
        except TransientStoreError as e:
            if version is None or not isinstance(e.__cause__, DeltaError):
                raise
            raise MetadataVersionNotFoundError(f"{self._uri}: cannot load table version {version} "
                                               f"({e.__cause__})") from e.__cause__

    def version(self) -> int:
        """The latest table version."""
        return int(self.delta_table().version())

    def snapshot(self, version: int | None = None) -> MetadataSnapshot:
        """Every partition at `version` (latest if None)."""
        dt = self.delta_table(version)
        with reading(self._uri, self._diagnose):
            rows = read_rows(dt, self._options)
        return _snapshot_of(dt, rows, self._uri)

    def partition_snapshot(self, topic: str, partition: int, version: int | None = None) -> PartitionSnapshot:
        """One partition at `version` (latest if None), read with partition filters."""
        return load_partition(self.delta_table(version), topic, partition, self._uri, self._options)

    def partition_snapshots(self, partitions: Iterable[TopicPartition], version: int | None = None
                            ) -> dict[TopicPartition, PartitionSnapshot]:
        """Each of `partitions` at one `version` (latest if None), in one read with partition filters."""
        return load_partitions(self.delta_table(version), partitions, self._uri, self._options)

    def live_segments(self, topic: str, partition: int, version: int | None = None) -> tuple[SegmentMetadata, ...]:
        """The partition's live segments (COPY_SEGMENT_FINISHED, not zombie) by start offset."""
        return self.partition_snapshot(topic, partition, version).live_segments

    def _check_schema(self, dt: DeltaTable) -> None:
        found = pa.schema(dt.schema().to_arrow())
        partition_columns = tuple(dt.metadata().partition_columns)
        known = found.equals(METADATA_SCHEMA) or found.equals(LEGACY_METADATA_SCHEMA)  # before `transactional`
        if not known or partition_columns != PARTITION_COLUMNS:
            raise MetadataSchemaError(
                f"{self._uri}: not a kcompact metadata table: expected columns {METADATA_SCHEMA.names} "
                f"partitioned by {list(PARTITION_COLUMNS)}, "
                f"found {found.names} partitioned by {list(partition_columns)}"
            )


def load_partition(dt: DeltaTable, topic: str, partition: int, where: str = "metadata",
                   storage_options: Mapping[str, str] | None = None) -> PartitionSnapshot:
    """One partition of the already opened `dt`, at `dt`'s version, read with partition filters."""
    filters: Any = [("topic", "=", check_topic(topic)), ("partition", "=", int(partition))]
    with reading(f"{where} ({topic}-{partition})"):
        rows = read_rows(dt, storage_options, filters)
    return _snapshot_of(dt, rows, where).partition(topic, partition)


def snapshot_of_files(dt: DeltaTable, files: Sequence[DataFile], where: str = "metadata",
                      storage_options: Mapping[str, str] | None = None) -> MetadataSnapshot:
    """The rows of `files` (of `dt`'s version: a caller that already knows which files hold the partitions it wants)
    as a snapshot at `dt`'s version."""
    with reading(f"{where} ({len(files)} files)"):
        rows = read_files(dt, storage_options, files)
    return _snapshot_of(dt, rows, where)


def load_partitions(dt: DeltaTable, partitions: Iterable[TopicPartition], where: str = "metadata",
                    storage_options: Mapping[str, str] | None = None) -> dict[TopicPartition, PartitionSnapshot]:
    """Each of `partitions` (an empty snapshot for one the table does not know) at `dt`'s version, in one read whose
    filter names them (`topic = t AND partition IN (...)` per topic), so delta-rs prunes every other file."""
    wanted = sorted(set(partitions))
    if not wanted:
        return {}
    by_topic: dict[str, list[int]] = defaultdict(list)
    for tp in wanted:
        by_topic[check_topic(tp.topic)].append(int(tp.partition))
    filters: Any = [[("topic", "=", topic), ("partition", "in", numbers)] for topic, numbers in by_topic.items()]
    with reading(f"{where} ({len(wanted)} partitions)"):
        rows = read_rows(dt, storage_options, filters)
    snapshot = _snapshot_of(dt, rows, where)
    return {tp: snapshot.partition(tp.topic, tp.partition) for tp in wanted}


def read_rows(dt: DeltaTable, storage_options: Mapping[str, str] | None, filters: Any = None) -> pa.Table:
    """`dt`'s rows (those matching `filters`, in pyarrow's DNF: `[(col, op, value), ...]` or a list of such
    conjunctions ORed), read through Arrow's own filesystem for the table.

    Only the data files whose partition values can match are opened: `filters`' `=` and `in` terms on partition
    columns are matched against delta-rs's list of the version's files (`DeltaTable.get_add_actions`, the log's
    partition values), and the rows of those files are then filtered by all of `filters`, unless those terms are all
    there is (a file holds one partition's rows: they all match, and Arrow's test of a 1,000-value `in` against each
    file was a third of a read of 1,000 partitions). delta-rs's
    `to_pyarrow_table(filters=...)` builds a dataset fragment with statistics for every file of the table before it
    prunes: ~20 s for one partition of a table of 10,000 partitions, against milliseconds here.

    Reading through Arrow's filesystem rather than delta-rs's matters too: `DeltaTable.to_pyarrow_table` reads
    through delta-rs wrapped in a Python filesystem (`pyarrow.fs.PyFileSystem`), which every fragment of the
    dataset holds. An Arrow I/O thread may drop the last fragment after the interpreter began to exit; the
    wrapper's destructor then takes the GIL, CPython (before 3.14) ends such a thread with `pthread_exit`, and the
    unwind through a C++ destructor calls `std::terminate`: exit 134 after a read that succeeded. A native
    filesystem holds no Python object.
    """
    conjunctions = _conjunctions(filters)
    partition_columns = set(dt.metadata().partition_columns)
    files = [file for file in data_files(dt) if any(_may_match(file[1], c) for c in conjunctions)]
    # every row of a file has the file's partition values: when the filters name only those, the files are the rows
    exact = all(column in partition_columns and op in ("=", "in") for c in conjunctions for column, op, _ in c)
    return read_files(dt, storage_options, files, pq.filters_to_expression(filters) if filters and not exact else None)


DataFile = tuple[str, Mapping[str, Any], int]
"""A data file of a table version: its path relative to the table, its partition values and its size in bytes (from
the log's add action)."""

READ_AHEAD_FILES = 32
"""Data files a read fetches at once (Arrow's default is 4), and the least number of threads of Arrow's I/O pool
while it reads from S3 (Arrow's default is 8, sized for disks). Each file holds one partition's rows, a few KB: on
S3 a read of 1,000 partitions is 1,000 small files, and its time is their round trips, not their bytes."""


def read_files(dt: DeltaTable, storage_options: Mapping[str, str] | None, files: Sequence[DataFile],
               row_filter: pc.Expression | None = None) -> pa.Table:
    """The rows of `files` (of `dt`'s version, as `data_files` lists them), their partition columns filled from
    their partition values, read through Arrow's filesystem for the table (`read_rows` says why).

    Each file is opened with the size its add action gives: Arrow would otherwise ask the store for it first (on S3
    a HEAD request per file, one more round trip per partition), and `READ_AHEAD_FILES` files are fetched at once.
    On S3 a file of at most `WHOLE_FILE_BYTES` is fetched whole, in one GET, and decoded from memory
    (`_read_whole`): Arrow's reader would make two, its footer then its rows, for a file of a few KB.

    Files of one commit that wrote a rows file (`delta_log`'s module docstring), when `ROWS_FILE_MIN_PARTITIONS` of
    them or more are wanted, are read from that one object instead (`_read_rows_files`); a rows file gone sends
    the read back to its data files."""
    schema = pa.schema(dt.schema().to_arrow())
    tables, rest = _read_rows_files(dt, storage_options or {}, schema, files)
    if rest or not tables:
        tables.append(_read_data_files(dt, storage_options, schema, rest))
    rows = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return rows.filter(row_filter) if row_filter is not None else rows


def _read_data_files(dt: DeltaTable, storage_options: Mapping[str, str] | None, schema: pa.Schema,
                     files: Sequence[DataFile]) -> pa.Table:
    """The rows of `files`, each read from its own data file (`read_files`)."""
    on_s3 = urlsplit(dt.table_uri).scheme in ("s3", "s3a")
    if on_s3 and all(size <= WHOLE_FILE_BYTES for _p, _v, size in files):
        return _read_whole(_s3_getter(dt.table_uri, storage_options or {}), schema, files)
    parquet = ds.ParquetFileFormat()
    filesystem = arrow_filesystem(dt.table_uri, storage_options or {})
    if on_s3 and pa.io_thread_count() < READ_AHEAD_FILES:
        pa.set_io_thread_count(READ_AHEAD_FILES)  # threads waiting on S3 round trips, not on a disk
    fragments = [parquet.make_fragment(path, filesystem, _partition_expression(schema, values), file_size=size)
                 for path, values, size in files]
    dataset = ds.FileSystemDataset(fragments, schema, parquet, filesystem)
    return dataset.to_table(fragment_readahead=READ_AHEAD_FILES)


def _read_rows_files(dt: DeltaTable, storage_options: Mapping[str, str], schema: pa.Schema,
                     files: Sequence[DataFile]) -> tuple[list[pa.Table], list[DataFile]]:
    """The rows of those of `files` that a rows file holds, when the read wants `ROWS_FILE_MIN_PARTITIONS` files of
    it or more (one table per rows file), and the files left to read one by one: those of smaller commits, of
    groups the read wants few of, and of a rows file that is gone or cannot be decoded (a warning says so)."""
    groups: dict[str, list[DataFile]] = defaultdict(list)
    rest: list[DataFile] = []
    for file in files:
        group = group_of(file[0])
        (groups[group] if group else rest).append(file)
    for group in [g for g, members in groups.items() if len(members) < ROWS_FILE_MIN_PARTITIONS]:
        rest.extend(groups.pop(group))
    if not groups:
        return [], rest
    store = store_of(dt.table_uri, storage_options)

    def get(group: str) -> bytes | None:
        try:
            return store.get(rows_file_key(group))
        except MissingObjectError:
            return None

    tables = []
    fetched = shared_pool("table-read", READ_AHEAD_FILES).map(get, list(groups))
    for (group, members), data in zip(groups.items(), fetched, strict=True):
        try:
            table = None if data is None else _rows_of(data, schema, members)
        except (pa.ArrowException, KeyError) as exc:
            _log.warning("%s: rows file %s unreadable (%s); reading its %d data files instead",
                         dt.table_uri, rows_file_key(group), plain_text(exc), len(members))
            table = None
        if table is None:
            rest.extend(members)
        else:
            tables.append(table)
    return tables, rest


def _rows_of(data: bytes, schema: pa.Schema, members: Sequence[DataFile]) -> pa.Table:
    """The rows of the data files `members` from their rows file's bytes `data`, as `read_files` returns them:
    partition columns filled from each row's file's partition values, a column the file lacks as nulls."""
    found = pq.read_table(pa.BufferReader(data))
    paths = pc.cast(found.column(ROWS_PATH_COLUMN), pa.string())
    index = pc.index_in(paths, value_set=pa.array([path for path, _v, _s in members], pa.string()))
    wanted = pc.is_valid(index)
    found, index = found.filter(wanted), index.filter(wanted)
    return _conformed(found, schema, {
        name: pc.take(pc.cast(pa.array([v[name] for _p, v, _s in members]), schema.field(name).type), index)
        for name in members[0][1]})


WHOLE_FILE_BYTES = 8 << 20
"""The largest data file a read on S3 fetches whole (`read_files`). A partition's file is a few KB (50 live segments
and their history: well under a MB); a larger one, should a table hold it, is read through Arrow's ranged reads."""


def _read_whole(get: Callable[[str], bytes], schema: pa.Schema, files: Sequence[DataFile]) -> pa.Table:
    """The rows of `files`, each fetched whole with `get` (`READ_AHEAD_FILES` at once) and decoded from memory, its
    partition columns filled from its partition values and a column its file lacks (written before the column was
    added) as nulls: the table `read_files` returns through Arrow's dataset, in one request per file."""
    tables = []
    fetched = shared_pool("table-read", READ_AHEAD_FILES).map(get, [path for path, _v, _s in files])
    for (_path, values, _size), data in zip(files, fetched, strict=True):
        found = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
        tables.append(_conformed(found, schema, {name: pa.repeat(pa.scalar(value, schema.field(name).type),
                                                                 found.num_rows) for name, value in values.items()}))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _conformed(found: pa.Table, schema: pa.Schema, partition_columns: Mapping[str, pa.Array]) -> pa.Table:
    """`found`'s rows as `schema`'s table: the partition columns given (a file stores none), the others from `found`
    (cast where its type differs), and a column `found` lacks (written before the column was added) as nulls."""
    columns = []
    for field in schema:
        if field.name in partition_columns:
            columns.append(partition_columns[field.name])
        elif field.name in found.column_names:
            column = found.column(field.name)
            columns.append(column if column.type == field.type else column.cast(field.type))
        else:
            columns.append(pa.nulls(found.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _s3_getter(table_uri: str, storage_options: Mapping[str, str]) -> Callable[[str], bytes]:
    """A GET of a file of the table at `table_uri` on S3 (its path relative to the table), through kcompact's own S3
    store at the table's root (`delta_log.store_of`: the process's shared client and the store's retries, the store
    the table's commits are written through). The endpoint and region are the ones delta-rs is given; the
    credentials are the process's (every table is opened from a store, whose `delta_storage_options` passes
    delta-rs those same credentials). A failure after the retries is an OSError naming the object, as Arrow's would
    be: `reading` then asks the store's `diagnose` what it means."""
    store = store_of(table_uri, storage_options)

    def get(path: str) -> bytes:
        try:
            return store.get(path)
        except KcompactError as exc:
            raise OSError(str(exc)) from exc

    return get


_Conjunction = Sequence[tuple[str, str, Any]]


def _conjunctions(filters: Any) -> list[_Conjunction]:
    """`filters` as a list of conjunctions (one, empty, when there are none)."""
    if not filters:
        return [()]
    return [filters] if isinstance(filters[0], tuple) else list(filters)


def data_files(dt: DeltaTable) -> list[DataFile]:
    """Every data file of `dt`'s version (delta-rs's list of its add actions), with its partition values and size."""
    partition_columns = tuple(dt.metadata().partition_columns)
    columns = ["path", "size_bytes", *(f"partition.{c}" for c in partition_columns)]
    adds = pa.table(dt.get_add_actions(flatten=True)).select(columns).to_pydict()
    return [(unquote(path), {c: adds[f"partition.{c}"][i] for c in partition_columns}, int(adds["size_bytes"][i]))
            for i, path in enumerate(adds["path"])]


def partition_files(dt: DeltaTable, partitions: Iterable[TopicPartition]) -> list[PartitionFile]:
    """The data files of `partitions` at `dt`'s version (path relative to the table, partition, size), picked from
    delta-rs's list of the version's add actions in Arrow, not row by row in Python."""
    wanted = sorted(set(partitions))
    adds = pa.table(dt.get_add_actions(flatten=True))
    topics = pc.cast(adds.column("partition.topic"), pa.string())
    numbers = pc.cast(adds.column("partition.partition"), pa.int64())
    keep = pc.is_in(pc.binary_join_element_wise(topics, pc.cast(numbers, pa.string()), "\x00"),
                    value_set=pa.array([f"{tp.topic}\x00{int(tp.partition)}" for tp in wanted], pa.string()))
    picked = adds.filter(keep).select(["path", "partition.topic", "partition.partition", "size_bytes"]).to_pydict()
    return [(unquote(path), TopicPartition(topic, int(number)), int(size)) for path, topic, number, size in zip(
        picked["path"], picked["partition.topic"], picked["partition.partition"], picked["size_bytes"], strict=True)]


def _may_match(values: Mapping[str, Any], conjunction: _Conjunction) -> bool:
    """Whether a file with partition `values` may hold rows matching `conjunction` (terms on other columns, or
    with other operators, cannot rule it out)."""
    for column, op, wanted in conjunction:
        if column not in values:
            continue
        if op == "=" and values[column] != wanted:
            return False
        if op == "in" and values[column] not in set(wanted):
            return False
    return True


def _partition_expression(schema: pa.Schema, values: Mapping[str, Any]) -> pc.Expression:
    """The file's partition values as the equalities Arrow fills its partition columns from."""
    expression = pc.scalar(True)
    for column, value in values.items():
        expression &= pc.field(column) == pa.scalar(value, schema.field(column).type)
    return expression


def arrow_filesystem(table_uri: str, storage_options: Mapping[str, str]) -> pa_fs.FileSystem:
    """Arrow's filesystem rooted at the table: local, or S3 with the endpoint, region and credentials delta-rs
    is given (none given: the AWS SDK's own chain, as delta-rs does)."""
    parts = urlsplit(table_uri)
    if parts.scheme in ("", "file"):
        return pa_fs.SubTreeFileSystem(unquote(parts.path) if parts.scheme else table_uri, pa_fs.LocalFileSystem())
    if parts.scheme not in ("s3", "s3a"):
        raise ValueError(f"{table_uri}: no Arrow filesystem for the scheme {parts.scheme!r}")
    endpoint = urlsplit(storage_options["AWS_ENDPOINT_URL"]) if "AWS_ENDPOINT_URL" in storage_options else None
    s3 = pa_fs.S3FileSystem(
        access_key=storage_options.get("AWS_ACCESS_KEY_ID"),
        secret_key=storage_options.get("AWS_SECRET_ACCESS_KEY"),
        session_token=storage_options.get("AWS_SESSION_TOKEN"),
        region=storage_options.get("AWS_REGION"),
        endpoint_override=endpoint.netloc if endpoint else None,
        scheme=endpoint.scheme if endpoint else "https",
    )
    return pa_fs.SubTreeFileSystem(f"{parts.netloc}{unquote(parts.path)}".rstrip("/"), s3)


@contextlib.contextmanager
def reading(where: str, diagnose: Diagnose | None = None) -> Iterator[None]:
    """Read failures of delta-rs, pyarrow and a data file's GET (after their retries) as `TransientStoreError`, naming
    `where`, in plain text; or, when `diagnose` (the store's) finds a cause a rerun cannot fix, as that error; or,
    when delta-rs cannot read the table's protocol, as `UnsupportedDeltaProtocolError` (`delta_protocol`, exit 2).

    `TableNotFoundError` passes through: the caller knows what a missing table means.
    """
    try:
        yield
    except TableNotFoundError:
        raise
    except (DeltaError, OSError) as e:
        found: KcompactError | None = refused_by_delta_rs(e, where) if isinstance(e, DeltaError) else None
        if found is None and diagnose is not None:
            found = diagnose()
        if found is not None:
            raise found from e
        raise TransientStoreError(f"{where}: reading the table failed after retries "
                                  f"(a rerun may pass): {plain_text(e)}") from e


def _snapshot_of(dt: DeltaTable, rows: pa.Table, where: str) -> MetadataSnapshot:
    states, segments = [], []
    for r in rows.to_pylist():
        if r["row_kind"] == RowKind.PARTITION:
            states.append(partition_from_row(r))
        else:
            segments.append(segment_from_row(r))
    return build_snapshot(int(dt.version()), states, segments, where)


METADATA_TABLE_NAME = "_kcompact_metadata"


def table_requests(store: ObjectStoreLike) -> StoreStats:
    """A copy of the requests this process has made so far to the metadata table in `store` through kcompact's own
    table store (`delta_log.store_of`): its commits' puts (data files, rows files, commit files), gc's deletes of
    the table's files, and its reads of commit, data and rows files there. delta-rs's and Arrow's own reads of the
    table (its log, a local table's data files) are not among them. Subtract two copies for what a command made."""
    return dataclasses.replace(store_of(store.delta_uri(METADATA_TABLE_NAME), store.delta_storage_options()).stats)


def table_in_store(store: ObjectStoreLike, *, create: bool = False, write: bool = True) -> MetadataTable:
    """The metadata table kept inside an object store, at `<store>/_kcompact_metadata`, opened for writing unless
    `write` is False (`MetadataTable.open`; `create` opens it for writing)."""
    uri, options = store.delta_uri(METADATA_TABLE_NAME), store.delta_storage_options()
    if create:
        return MetadataTable.create_if_missing(uri, options, store.diagnose)
    return MetadataTable.open(uri, options, store.diagnose, write=write)
