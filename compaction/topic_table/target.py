"""The Delta table a topic is kept in: its schema, where its files go, what it has applied, and its commit.

The table is plain Delta (reader 1 / writer 2, no table features), partitioned by `partition`, so delta-rs,
pyarrow, DuckDB and delta-spark all read it. Its name is the topic and its description records the strategy
it was built under; a table of another topic or strategy is refused rather than silently mixed.

**What has been applied** lives in the table itself: every run that applies offsets of a partition commits,
in the same Delta commit as its data files, an application transaction (Delta's `txn` action) with app id
`kcompact-table/<topic>/<partition>` and `version` = the first offset not yet applied, and one with app id
`.../clock` whose version is the run's clock (delta-rs reads a transaction's version only). Delta's conflict
check fails a commit whose app ids another commit updated since its read version, so two runs that read the
same state can never both apply it: the second gets `CommitConflictError` (exit 4) and a rerun starts from
what the first applied.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from compaction.config import CompactionStrategy
from compaction.errors import CommitConflictError, ConfigError
from compaction.metadata.table import reading
from compaction.metadata.upkeep import vacuum
from compaction.storage.base import ObjectStore, StoreSpec

PARTITION_COLUMN = "partition"
FILE_BYTES = 128 * 1024 * 1024
"""The size the table's files are cut at: a run closes a file once it holds about this many bytes of Arrow data
(Parquet makes it smaller), and the upkeep's OPTIMIZE bin-packs to it (Delta's default OPTIMIZE target)."""
HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string(), False), pa.field("value", pa.binary())]))
VERSION_COLUMN = "version"


def table_schema(strategy: CompactionStrategy) -> pa.Schema:
    """One row per live key; `version` (the strategy's, null when a record has none) unless the strategy is offset."""
    fields = [
        pa.field("key", pa.binary(), False),
        pa.field("value", pa.binary(), False),
        pa.field(PARTITION_COLUMN, pa.int32(), False),
        pa.field("offset", pa.int64(), False),
        pa.field("timestamp", pa.int64(), False),
        pa.field("headers", HEADER_TYPE, False),
    ]
    if strategy is not CompactionStrategy.OFFSET:
        fields.append(pa.field(VERSION_COLUMN, pa.int64()))
    return pa.schema(fields)


def app_id(topic: str, partition: int) -> str:
    """The Delta application id under which a partition's applied offset is recorded."""
    return f"kcompact-table/{topic}/{partition}"


def clock_app_id(topic: str, partition: int) -> str:
    """The application id recording the clock of the run that applied it (delta-rs reads only a txn's version)."""
    return f"kcompact-table/{topic}/{partition}/clock"


@dataclass(frozen=True)
class Applied:
    """What the table holds of one partition: every committed record below `offset`, as of the clock `updated_ms`."""

    offset: int
    updated_ms: int


@dataclass(frozen=True)
class DataFile:
    """One live data file of the table (a path relative to the table, as the Delta log has it)."""

    path: str
    partition: int
    size: int


@dataclass(frozen=True)
class Location:
    """Where the table lives: a store holding it under `name`, so executors write its files with `spec.open()`."""

    spec: StoreSpec
    name: str

    @classmethod
    def parse(cls, table_uri: str, endpoint_url: str | None = None, region: str | None = None) -> Location:
        """`/path/to/table`, `file:///...` or `s3://bucket/prefix/table`: the parent is the store, the last name
        the table. `endpoint_url` and `region` apply to an S3 table only (a data store's, usually).

        Raises:
            ConfigError: an unsupported or malformed URI, or one without a table name.
        """
        s3 = table_uri.startswith("s3://")
        spec = StoreSpec.parse(table_uri, endpoint_url=endpoint_url if s3 else None, region=region if s3 else None)
        scheme, _, rest = spec.uri.partition("://")
        parent, _, name = rest.rstrip("/").rpartition("/")
        if not name or (scheme == "s3" and not parent):
            raise ConfigError(f"table URI {table_uri!r} needs a table name after the bucket or directory")
        return cls(StoreSpec.parse(f"{scheme}://{parent or '/'}", endpoint_url=spec.endpoint_url,
                                   region=spec.region), name)

    def open(self) -> ObjectStore:
        return self.spec.open()

    def file_key(self, path: str) -> str:
        return f"{self.name}/{path}"


def description(topic: str, strategy: CompactionStrategy, header: str | None) -> str:
    return json.dumps({"kcompact_table": topic, "strategy": str(strategy), "header": header}, sort_keys=True)


@dataclass(frozen=True)
class TableState:
    """The table as one run read it: the Delta version, what it applied per partition, its live files."""

    version: int
    applied: Mapping[int, Applied]
    files: tuple[DataFile, ...]

    def files_of(self, partitions: set[int]) -> list[DataFile]:
        return [f for f in self.files if f.partition in partitions]


class TopicTable:
    """The Delta table of one topic, opened (or created empty) at one version; `commit` lands one run.

    The `DeltaTable` read here is the one committed through, so the conflict check spans everything since
    this read.
    """

    def __init__(self, location: Location, topic: str, strategy: CompactionStrategy, header: str | None) -> None:
        self.location = location
        self.topic = topic
        self.schema = table_schema(strategy)
        self._description = description(topic, strategy, header)
        self._store = location.open()
        self.uri = self._store.delta_uri(location.name)
        self._options = self._store.delta_storage_options()
        self._table: DeltaTable | None = None

    def exists(self) -> bool:
        # Not `DeltaTable.is_deltatable`: its listing hangs for minutes against some S3 servers (moto).
        try:
            self._delta_table()
        except TableNotFoundError:
            return False
        return True

    def _delta_table(self) -> DeltaTable:
        """The table's latest version; a read failing after delta-rs's retries as `TransientStoreError`, or the
        store's configuration error behind it (`ObjectStore.diagnose`)."""
        with reading(self.uri, self._store.diagnose):
            return DeltaTable(self.uri, storage_options=self._options)

    def open(self, partitions: Sequence[int], *, create: bool) -> TableState:
        """Read the table's state (what it applied of each of `partitions`); create it empty first (version 0)
        if `create` and there is none.

        Raises:
            ConfigError: the table belongs to another topic, was built under another strategy or has other
                columns (recreate it elsewhere, or delete it), or does not exist and `create` is False.
        """
        if create and not self.exists():
            with contextlib.suppress(DeltaError):  # lost the race to version 0: the winner's table is opened below
                DeltaTable.create(self.uri, self.schema, mode="ignore", partition_by=[PARTITION_COLUMN],
                                  name=self.topic, description=self._description, storage_options=self._options)
        try:
            table = self._delta_table()
        except TableNotFoundError:
            raise ConfigError(f"no table at {self.uri}: the first run creates it") from None
        self._check(table)
        self._table = table
        return self._state(table, partitions)

    def _check(self, table: DeltaTable) -> None:
        meta = table.metadata()
        if meta.description != self._description:
            raise ConfigError(f"table {self.uri}: expected {self._description}, found {meta.description!r}; "
                              "a table holds one topic under one strategy: use another URI or delete this table")
        found = pa.schema(table.schema().to_arrow())
        if [(f.name, f.type) for f in found] != [(f.name, f.type) for f in self.schema]:
            raise ConfigError(f"table {self.uri}: expected columns {self.schema}, found {found}")

    def _state(self, table: DeltaTable, partitions: Sequence[int]) -> TableState:
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        files = tuple(DataFile(a["path"], int(a[f"partition.{PARTITION_COLUMN}"]), a["size_bytes"]) for a in actions)
        applied: dict[int, Applied] = {}
        for partition in partitions:
            txn = _transaction(table, self.topic, partition)
            if txn is not None:
                applied[partition] = txn
        return TableState(table.version(), applied, files)

    def commit(self, adds: Sequence[AddAction], removes: Sequence[DataFile], applied: Mapping[int, Applied],
               now_ms: int, info: Mapping[str, object]) -> int:
        """Add and remove files and record `applied`, in one Delta commit on top of the version `open` read.

        Returns the new table version. Raises `CommitConflictError` (nothing committed, rerun safe) if a
        concurrent commit applied offsets of the same partitions or removed the same files.
        """
        if self._table is None:
            raise RuntimeError("TopicTable.commit before open")
        actions: list[AddAction | RemoveAction] = [*adds]
        actions += [RemoveAction(f.path, True, now_ms, f.size, {PARTITION_COLUMN: str(f.partition)}) for f in removes]
        txns = [t for p, a in sorted(applied.items())
                for t in (Transaction(app_id(self.topic, p), a.offset, a.updated_ms),
                          Transaction(clock_app_id(self.topic, p), a.updated_ms, a.updated_ms))]
        properties = CommitProperties(custom_metadata={"kcompact": json.dumps(dict(info), sort_keys=True)},
                                      app_transactions=txns)
        read_version = self._table.version()
        try:
            self._table.create_write_transaction(actions, "append", self.schema, partition_by=[PARTITION_COLUMN],
                                                 commit_properties=properties)
        except CommitFailedError as exc:
            raise CommitConflictError(
                f"table {self.uri}: expected no commit touching partitions {sorted(applied)} after version "
                f"{read_version}, found one ({exc}); nothing was committed, rerun"
            ) from exc
        return self._delta_table().version()

    def optimize(self, partition: int, target_size: int) -> dict[str, Any]:
        """Bin-pack one partition's files into files of about `target_size` (Delta's OPTIMIZE: a rewrite with
        dataChange=false); returns delta-rs's metrics (numFilesAdded, numFilesRemoved, ...)."""
        table = self._delta_table()
        return table.optimize.compact(partition_filters=[(PARTITION_COLUMN, "=", str(partition))],
                                      target_size=target_size)

    def vacuum(self) -> list[str]:
        """Delete the data files removed longer ago than the table's retention (`metadata.upkeep.vacuum`)."""
        return vacuum(self._delta_table(), self.uri, lambda path: self._store.exists(self.location.file_key(path)))

def _transaction(table: DeltaTable, topic: str, partition: int) -> Applied | None:
    offset = table.transaction_version(app_id(topic, partition))
    if offset is None:
        return None
    return Applied(offset, table.transaction_version(clock_app_id(topic, partition)) or 0)


__all__ = ["Applied", "DataFile", "Location", "TableState", "TopicTable", "app_id", "clock_app_id", "table_schema"]
