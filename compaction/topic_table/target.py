"""The Delta table a topic is kept in: its schema, where its files go, what it has applied, and its commit.

The table is created plain Delta (reader 1 / writer 2, no table features), partitioned by `partition`. The first
run that updates a partition already in the table turns on the `deletionVectors` feature (reader 3 / writer 7, and
`delta.enableDeletionVectors`) in the commit of its data: an update marks the rows of the keys it changes as
deleted instead of rewriting their files (`deletion_vectors`). delta-spark, delta-rs's `DeltaTable.scan` and
DuckDB read it; delta-rs's `to_pyarrow_table`, which reads no deletion vectors, refuses it. Its name is the topic
and its description records the strategy it was built under; a table of another topic or strategy is refused
rather than silently mixed. A table whose protocol another writer raised past what kcompact implements (another
table feature than `deletionVectors`, or one of the features `compaction.delta_protocol` lets by only while unused, in
use) is refused when opened, before a run reads or writes anything (`UnsupportedDeltaProtocolError`, exit 2).

**What has been applied** lives in the table itself: every run that applies offsets of a partition commits,
in the same Delta commit as its data files, an application transaction (Delta's `txn` action) with app id
`kcompact-table/<topic>/<partition>` and `version` = the first offset not yet applied, and one with app id
`.../clock` whose version is the run's clock (delta-rs reads a transaction's version only). kcompact writes
its commits itself (`delta_log.write_commit`: delta-rs's Python API carries no deletion vectors), with Delta's
conflict rule for them: a commit fails when a commit since its read version recorded one of its app ids, removed
one of the files it removes or marks, or changed the table's metadata or protocol. So two runs that read the same
state can never both apply it: the second gets `CommitConflictError` (exit 4) and a rerun starts from what the
first applied.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from compaction.config import CompactionStrategy
from compaction.delta_protocol import DELETION_VECTORS, LEGACY_WRITER_FEATURES, TOPIC_TABLE
from compaction.errors import ConfigError
from compaction.metadata.table import reading
from compaction.metadata.upkeep import vacuum
from compaction.storage.base import ObjectStore, StoreSpec
from compaction.topic_table.deletion_vectors import DeletionVector
from compaction.topic_table.delta_log import Action, LogFiles, log_files, write_commit

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


def log_start_app_id(topic: str, partition: int) -> str:
    """The application id recording the log start offset of the log a run applied (retention moves it up)."""
    return f"kcompact-table/{topic}/{partition}/log-start"


@dataclass(frozen=True)
class Applied:
    """What the table holds of one partition: every committed record below `offset`, as of the clock `updated_ms`,
    read from a log that started at `log_start` (None: a table written before kcompact recorded it)."""

    offset: int
    updated_ms: int
    log_start: int | None = None


CHECKPOINT_INTERVAL = 100
"""A checkpoint every this many versions unless the table's `delta.checkpointInterval` says otherwise (Delta's
default, which delta-rs's own commits follow)."""


@dataclass(frozen=True)
class DataFile:
    """One live data file of the table (a path relative to the table, as the Delta log has it): its size, its
    physical row count and its deletion vector (the rows deleted from it, None: none)."""

    path: str
    partition: int
    size: int
    rows: int = 0
    vector: DeletionVector | None = None

    def remove(self, now_ms: int) -> Action:
        """The `remove` action of this file (with its vector: Delta identifies a file by path and vector)."""
        action: dict[str, object] = {"path": self.path, "deletionTimestamp": now_ms, "dataChange": True,
                                     "extendedFileMetadata": True,
                                     "partitionValues": {PARTITION_COLUMN: str(self.partition)}, "size": self.size}
        if self.vector is not None:
            action["deletionVector"] = self.vector.to_json()
        return {"remove": action}

    def add(self, now_ms: int) -> Action:
        """The `add` action of this file, its stats the physical row count (Delta's `numRecords`)."""
        action: dict[str, object] = {"path": self.path, "partitionValues": {PARTITION_COLUMN: str(self.partition)},
                                     "size": self.size, "modificationTime": now_ms, "dataChange": True,
                                     "stats": json.dumps({"numRecords": self.rows})}
        if self.vector is not None:
            action["deletionVector"] = self.vector.to_json()
        return {"add": action}


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
        self._log: LogFiles | None = None
        self._turn_on_vectors = False
        self._committed: int | None = None

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

    def check_protocol(self, table: DeltaTable | None = None) -> None:
        """Refuse the table (`table`, or the latest version; none yet is fine) if its protocol requires a feature
        kcompact's topic-table writer does not implement (`compaction.delta_protocol.TOPIC_TABLE`).

        Raises:
            UnsupportedDeltaProtocolError: naming the features (exit 2).
        """
        if table is None:
            try:
                table = self._delta_table()
            except TableNotFoundError:
                return
        after = ("" if self._committed is None else
                 f" after this run's commit (version {self._committed}), which the feature's commit followed")
        TOPIC_TABLE.check(table, self.uri, consequence=f"nothing was written to it{after}")

    def open(self, partitions: Sequence[int], *, create: bool) -> TableState:
        """Read the table's state (what it applied of each of `partitions`); create it empty first (version 0)
        if `create` and there is none.

        Raises:
            UnsupportedDeltaProtocolError: the table requires a table feature kcompact does not implement (a
                `ConfigError`; checked first, before anything is written).
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
        self.check_protocol(table)
        self._check(table)
        self._table, self._turn_on_vectors = table, False
        return self._state(table, partitions)

    def _check(self, table: DeltaTable) -> None:
        meta = table.metadata()
        if meta.description != self._description:
            raise ConfigError(f"table {self.uri}: expected {self._description}, found {meta.description!r}; "
                              "a table holds one topic under one strategy: use another URI or delete this table")
        found = pa.schema(table.schema().to_arrow())
        if [(f.name, f.type) for f in found] != [(f.name, f.type) for f in self.schema]:
            raise ConfigError(f"table {self.uri}: expected columns {self.schema}, found {found}")

    def deletion_vectors(self) -> bool:
        """Whether this run's commit leaves the table with the `deletionVectors` feature: the table (as `open` read
        it) has it, or `use_deletion_vectors` asked the commit to turn it on."""
        return self._table is not None and (self._turn_on_vectors or _has_vectors(self._table))

    def use_deletion_vectors(self) -> None:
        """Have this run's commit turn on the `deletionVectors` feature and `delta.enableDeletionVectors`, unless the
        table (as `open` read it) has them: a protocol upgrade (reader 3 / writer 7, `upgraded_protocol`) and the
        table's metadata with the property set, in the same Delta commit as the run's data. A run that fails before
        its commit therefore leaves the table as it was, protocol included, and a concurrent run that changed the
        table's protocol first makes this commit conflict (`CommitConflictError`, rerun safe)."""
        if self._table is None:
            raise RuntimeError("TopicTable.use_deletion_vectors before open")
        on = self._table.metadata().configuration.get("delta.enableDeletionVectors") == "true"
        self._turn_on_vectors = not (_has_vectors(self._table) and on)

    def _vector_actions(self, table: DeltaTable) -> list[Action]:
        """The protocol and metadata actions that turn on the `deletionVectors` feature and its table property."""
        meta, protocol = table.metadata(), table.protocol()
        return [
            {"protocol": upgraded_protocol(protocol.min_reader_version, protocol.min_writer_version,
                                           protocol.reader_features or [], protocol.writer_features or [])},
            {"metaData": {"id": meta.id, "name": meta.name, "description": meta.description,
                          "format": {"provider": "parquet", "options": {}},
                          "schemaString": table.schema().to_json(), "partitionColumns": list(meta.partition_columns),
                          "configuration": {**meta.configuration, "delta.enableDeletionVectors": "true"},
                          "createdTime": meta.created_time}},
        ]

    def _log_files(self, table: DeltaTable) -> LogFiles:
        """The log replayed up to `table`'s version, from this object's previous replay when there is one (a run
        opens the table, then its upkeep opens it and vacuums: one replay, then the commits since)."""
        self._log = log_files(self._store, self.location.name, table.version(), self._log)
        return self._log

    def _state(self, table: DeltaTable, partitions: Sequence[int]) -> TableState:
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        vectors = self._log_files(table).live if _has_vectors(table) else {}
        files = tuple(DataFile(a["path"], int(a[f"partition.{PARTITION_COLUMN}"]), a["size_bytes"],
                               int(a["num_records"] or 0), vectors.get(unquote(a["path"]))) for a in actions)
        applied: dict[int, Applied] = {}
        for partition in partitions:
            txn = _transaction(table, self.topic, partition)
            if txn is not None:
                applied[partition] = txn
        return TableState(table.version(), applied, files)

    def commit(self, adds: Sequence[DataFile], removes: Sequence[DataFile], applied: Mapping[int, Applied],
               now_ms: int, info: Mapping[str, object], marked: Sequence[tuple[DataFile, DeletionVector]] = ()
               ) -> int:
        """Add and remove files, mark rows deleted (`marked`: a file and its new deletion vector, which holds its
        old one's rows too) and record `applied`, in one Delta commit on top of the version `open` read; the commit
        also turns deletion vectors on if `use_deletion_vectors` asked it to.

        Returns the new table version. Raises `CommitConflictError` (nothing committed, rerun safe) if a
        concurrent commit applied offsets of the same partitions, removed or marked the same files, or changed
        the table's metadata or protocol.
        """
        if self._table is None:
            raise RuntimeError("TopicTable.commit before open")
        actions: list[Action] = [{"commitInfo": {  # stamped by the wall clock, as Delta's time travel expects
            "timestamp": int(time.time() * 1000), "operation": "WRITE", "operationParameters": {"mode": "Append"},
            "engineInfo": "kcompact", "kcompact": json.dumps(dict(info), sort_keys=True)}}]
        if self._turn_on_vectors:
            actions += self._vector_actions(self._table)
        for p, a in sorted(applied.items()):
            actions.append({"txn": {"appId": app_id(self.topic, p), "version": a.offset, "lastUpdated": a.updated_ms}})
            actions.append({"txn": {"appId": clock_app_id(self.topic, p), "version": a.updated_ms,
                                    "lastUpdated": a.updated_ms}})
            if a.log_start is not None:
                actions.append({"txn": {"appId": log_start_app_id(self.topic, p), "version": a.log_start,
                                        "lastUpdated": a.updated_ms}})
        actions += [f.add(now_ms) for f in adds]
        actions += [f.remove(now_ms) for f in removes]
        for f, vector in marked:
            actions += [f.remove(now_ms), replace(f, vector=vector).add(now_ms)]
        ids = {f(self.topic, p) for p in applied for f in (app_id, clock_app_id, log_start_app_id)}
        paths = {f.path for f in removes} | {f.path for f, _ in marked}
        version = write_commit(self._store, self.location.name, self._table.version(), actions,
                               lambda found: _conflict(found, ids, paths))
        self._committed = version
        interval = int(self._table.metadata().configuration.get("delta.checkpointInterval", CHECKPOINT_INTERVAL))
        if version % interval == 0:
            self._delta_table().create_checkpoint()
        return version

    def optimize(self, partition: int, target_size: int) -> dict[str, Any]:
        """Bin-pack one partition's files into files of about `target_size` (Delta's OPTIMIZE: a rewrite with
        dataChange=false); returns delta-rs's metrics (numFilesAdded, numFilesRemoved, ...)."""
        table = self._delta_table()
        return table.optimize.compact(partition_filters=[(PARTITION_COLUMN, "=", str(partition))],
                                      target_size=target_size)

    def vacuum(self, now_ms: int) -> list[str]:
        """Delete the data files removed longer ago than the table's retention (`metadata.upkeep.vacuum`), and the
        deletion vector files older than it that no live file and no file removed within it names (delta-rs's
        vacuum leaves those). Returns the paths deleted, relative to the table."""
        table = self._delta_table()
        gone = vacuum(table, self.uri, lambda path: self._store.exists(self.location.file_key(path)))
        if not _has_vectors(table):
            return gone
        horizon = now_ms - retention_ms(table.metadata().configuration)
        log = self._log_files(table)
        named = {dv.file_name for dv in (*log.live.values(), *log.removed_since(horizon)) if dv is not None}
        for info in self._store.list(f"{self.location.name}/deletion_vector_"):
            path = info.key[len(self.location.name) + 1:]
            if path not in named and info.mtime_ms < horizon:
                self._store.delete(info.key)
                gone.append(path)
        return gone

RETENTION_MS = 7 * 24 * 3600 * 1000
"""Delta's default `delta.deletedFileRetentionDuration`, one week."""
_UNIT_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
            "week": 604_800_000}


def retention_ms(configuration: Mapping[str, str]) -> int:
    """The table's `delta.deletedFileRetentionDuration` (`interval <n> <unit>`, as Delta writes it) in ms; Delta's
    default when the table sets none.

    Raises:
        ConfigError: the property is set but is no such interval.
    """
    value = configuration.get("delta.deletedFileRetentionDuration")
    if value is None:
        return RETENTION_MS
    words = value.lower().split()
    if len(words) == 3 and words[0] == "interval" and words[1].isdigit() and words[2].rstrip("s") in _UNIT_MS:
        return int(words[1]) * _UNIT_MS[words[2].rstrip("s")]
    raise ConfigError(f"delta.deletedFileRetentionDuration {value!r}: expected 'interval <n> <unit>' (e.g. "
                      "'interval 7 days')")


def upgraded_protocol(reader: int, writer: int, reader_features: Sequence[str], writer_features: Sequence[str]
                      ) -> dict[str, object]:
    """A table's protocol action (`minReaderVersion` `reader`, ...) with the `deletionVectors` feature added: reader
    3 / writer 7, listing every feature the legacy versions implied (writer 2's appendOnly and invariants, which
    delta-spark refuses a writer-7 table without). Pure."""
    readers = set(reader_features) | ({"columnMapping"} if reader == 2 else set()) | {DELETION_VECTORS}
    writers = set(writer_features) | {DELETION_VECTORS}
    for version, features in LEGACY_WRITER_FEATURES.items():
        if version <= writer < 7:
            writers.update(features)
    return {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": sorted(readers),
            "writerFeatures": sorted(writers)}


def _has_vectors(table: DeltaTable) -> bool:
    """Whether `table`'s protocol has the `deletionVectors` reader feature."""
    return DELETION_VECTORS in (table.protocol().reader_features or [])


def _conflict(actions: Sequence[Action], app_ids: set[str], paths: set[str]) -> str | None:
    """What in a concurrent commit's `actions` conflicts with a commit recording `app_ids` and removing or marking
    the files at `paths` (Delta's rule for these actions), None when nothing does."""
    for action in actions:
        if isinstance(txn := action.get("txn"), dict) and txn.get("appId") in app_ids:
            return f"applied {txn['appId']}"
        if isinstance(remove := action.get("remove"), dict) and unquote(str(remove.get("path"))) in paths:
            return f"removed {remove['path']}"
        if "metaData" in action or "protocol" in action:
            return "changed the table's metadata or protocol"
    return None


def _transaction(table: DeltaTable, topic: str, partition: int) -> Applied | None:
    offset = table.transaction_version(app_id(topic, partition))
    if offset is None:
        return None
    return Applied(offset, table.transaction_version(clock_app_id(topic, partition)) or 0,
                   table.transaction_version(log_start_app_id(topic, partition)))


__all__ = ["Applied", "DataFile", "Location", "TableState", "TopicTable", "app_id", "clock_app_id", "log_start_app_id",
           "table_schema", "upgraded_protocol"]
