"""The Delta table a topic is kept in: its schema, where it lives, and what it has applied, read back.

Delta's own writer (delta-spark, `compaction.spark.delta_table`) writes the table: created with deletion vectors and
Change Data Feed on (reader 3 / writer 7 with `deletionVectors` and `changeDataFeed`), partitioned by `partition`;
a run replaces the rows of the partitions it rebuilds (an overwrite with `replaceWhere`) and MERGEs the winners of
the keys an update changed (their old rows marked deleted by deletion vectors), a downstream reader following those
changes through Delta's change data feed. Its description records the topic and the strategy it was built under; a
table of another topic or strategy is refused rather than silently mixed. A table whose protocol needs what
kcompact cannot honour (`compaction.delta_protocol.TOPIC_TABLE`) is refused when opened, before a run reads or writes
anything (`UnsupportedDeltaProtocolError`, exit 2).

**What has been applied** lives in the table itself, in the commits that apply it: each commit of a run carries
Delta's idempotent-write transaction (app id `kcompact-table/<topic>`, version the run's sequence number: one above
the table's last) and, as the commit's `userMetadata`, the record of what the table holds of each partition once it
lands (`record`): the first offset not yet applied, the run's clock and the log start it read. `open` reads the
transaction's version with delta-rs and the newest record from the `_delta_log` JSON through kcompact's own store
(not `DeltaTable.history()`, which holds the GIL while it reads: it deadlocked the in-process moto S3 server of the
tests). Two runs that read the same state carry the same sequence number, so Delta lets one commit land and skips or
fails the other (`TopicTable.landed` finds it missing: `CommitConflictError`, exit 4, rerun safe).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from compaction.config import CompactionStrategy
from compaction.delta_protocol import TOPIC_TABLE
from compaction.errors import ConfigError, MissingObjectError
from compaction.metadata.table import reading
from compaction.storage.base import ObjectStore, StoreSpec

PARTITION_COLUMN = "partition"
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


def app_id(topic: str) -> str:
    """The Delta application id of the topic's runs (Delta's idempotent writes: `txnAppId`)."""
    return f"kcompact-table/{topic}"


@dataclass(frozen=True)
class Applied:
    """What the table holds of one partition: every committed record below `offset`, as of the clock `updated_ms`,
    read from a log that started at `log_start` (None: not recorded)."""

    offset: int
    updated_ms: int
    log_start: int | None = None


@dataclass(frozen=True)
class DataFile:
    """One live data file of the table (a path relative to the table, as the Delta log has it): its size and its
    physical row count."""

    path: str
    partition: int
    size: int
    rows: int = 0


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
    """The table as one run read it: the Delta version (-1: no table yet), what it applied per partition, its live
    files and the sequence number of the last run that committed (0: none)."""

    version: int
    applied: Mapping[int, Applied]
    files: tuple[DataFile, ...]
    sequence: int = 0

    def files_of(self, partitions: set[int]) -> list[DataFile]:
        return [f for f in self.files if f.partition in partitions]


def record(topic: str, run_id: str, sequence: int, applied: Mapping[int, Applied], **extra: object
           ) -> dict[str, object]:
    """A commit's `userMetadata`: what the table holds of each partition once the commit lands (`applied`), the run
    and its sequence number, and `extra` (the metadata version it read, the partitions rebuilt)."""
    return {"kcompact_table": topic, "run_id": run_id, "sequence": sequence, **extra,
            "applied": {str(p): [a.offset, a.updated_ms, a.log_start] for p, a in sorted(applied.items())}}


def _applied(found: Mapping[str, Any]) -> dict[int, Applied]:
    return {int(p): Applied(int(a[0]), int(a[1]), None if a[2] is None else int(a[2]))
            for p, a in found.get("applied", {}).items()}


def _signature(kind: pa.DataType) -> str:
    """A type as a string with nullability, field metadata and list item names left out (delta-spark writes nested
    fields nullable, delta-rs reads list items as `element`)."""
    if pa.types.is_struct(kind):
        return "struct<" + ",".join(f"{kind.field(i).name}:{_signature(kind.field(i).type)}"
                                    for i in range(kind.num_fields)) + ">"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{_signature(kind.value_type)}>"
    if pa.types.is_large_binary(kind):
        return "binary"
    if pa.types.is_large_string(kind):
        return "string"
    return str(kind)


class TopicTable:
    """The Delta table of one topic: opened at one version (`open`) and read back (`landed`) by delta-rs and
    kcompact's store; written by `compaction.spark.delta_table` at `spark_path`."""

    def __init__(self, location: Location, topic: str, strategy: CompactionStrategy, header: str | None) -> None:
        self.location = location
        self.topic = topic
        self.schema = table_schema(strategy)
        self.description = description(topic, strategy, header)
        self._store = location.open()
        self.uri = self._store.delta_uri(location.name)
        self.options = self._store.delta_storage_options()
        self.spark_path = "s3a://" + self.uri.removeprefix("s3://") if self.uri.startswith("s3://") else self.uri

    def exists(self) -> bool:
        # Not `DeltaTable.is_deltatable`: its listing hangs for minutes against some S3 servers (moto).
        try:
            self.delta_table()
        except TableNotFoundError:
            return False
        return True

    def delta_table(self) -> DeltaTable:
        """The table's latest version; a read failing after delta-rs's retries as `TransientStoreError`, or the
        store's configuration error behind it (`ObjectStore.diagnose`)."""
        with reading(self.uri, self._store.diagnose):
            return DeltaTable(self.uri, storage_options=self.options)

    def check_protocol(self, table: DeltaTable | None = None) -> None:
        """Refuse the table (`table`, or the latest version; none yet is fine) if its protocol requires what kcompact
        cannot honour (`compaction.delta_protocol.TOPIC_TABLE`).

        Raises:
            UnsupportedDeltaProtocolError: naming the features (exit 2).
        """
        if table is None:
            try:
                table = self.delta_table()
            except TableNotFoundError:
                return
        TOPIC_TABLE.check(table, self.uri)

    def open(self, partitions: Sequence[int]) -> TableState:
        """Read the table's state: what it applied of each of `partitions`, its files, its last sequence number; an
        empty state (version -1) when there is no table yet (the run's first command creates it).

        Raises:
            UnsupportedDeltaProtocolError: the table requires what kcompact cannot honour (a `ConfigError`; checked
                first, before anything is written).
            ConfigError: the table belongs to another topic, was built under another strategy or has other
                columns (recreate it elsewhere, or delete it).
        """
        try:
            table = self.delta_table()
        except TableNotFoundError:
            return TableState(-1, {}, ())
        self.check_protocol(table)
        self.check(table)
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        files = tuple(DataFile(a["path"], int(a[f"partition.{PARTITION_COLUMN}"]), a["size_bytes"],
                               int(a["num_records"] or 0)) for a in actions)
        found = self._newest_record(table.version())
        wanted = set(partitions)
        applied = {p: a for p, a in _applied(found or {}).items() if p in wanted}
        return TableState(table.version(), applied, files, table.transaction_version(app_id(self.topic)) or 0)

    def check(self, table: DeltaTable) -> None:
        """Refuse a table of another topic or strategy, or of other columns (nullability aside)."""
        meta = table.metadata()
        if meta.description != self.description:
            raise ConfigError(f"table {self.uri}: expected {self.description}, found {meta.description!r}; "
                              "a table holds one topic under one strategy: use another URI or delete this table")
        found = pa.schema(table.schema().to_arrow())
        if [(f.name, _signature(f.type)) for f in found] != [(f.name, _signature(f.type)) for f in self.schema]:
            raise ConfigError(f"table {self.uri}: expected columns {self.schema}, found {found}")

    def commit_infos(self, latest: int, oldest: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
        """The `commitInfo` of each commit from `latest` down to `oldest`, read from the `_delta_log` JSON through
        the store; stops at a commit whose JSON is gone (Delta's log cleanup)."""
        for version in range(latest, oldest - 1, -1):
            try:
                data = self._store.get(self.location.file_key(f"_delta_log/{version:020d}.json"))
            except MissingObjectError:
                return
            info: dict[str, Any] = {}
            for line in data.decode().splitlines():
                if line.strip() and "commitInfo" in (action := json.loads(line)):
                    info = action["commitInfo"]
                    break
            yield version, info

    def _newest_record(self, latest: int) -> dict[str, Any] | None:
        """The newest commit record of this topic's runs (`record`) at or below `latest`, None when none."""
        for _, info in self.commit_infos(latest):
            if (found := self._record_of(info)) is not None and "applied" in found:
                return found
        return None

    def _record_of(self, info: Mapping[str, Any]) -> dict[str, Any] | None:
        try:
            found = json.loads(info.get("userMetadata") or "null")
        except ValueError:
            return None
        return found if isinstance(found, dict) and found.get("kcompact_table") == self.topic else None

    def landed(self, run_id: str, since: int) -> dict[int, dict[str, Any]]:
        """The commits of the run `run_id` after version `since` (each version's `commitInfo`): what of a run
        landed, whether or not it heard back (a crash after the commit)."""
        try:
            latest = self.delta_table().version()
        except TableNotFoundError:
            return {}
        return {v: info for v, info in self.commit_infos(latest, since + 1)
                if (found := self._record_of(info)) is not None and found.get("run_id") == run_id}

    def removable(self) -> bool:
        """Whether a VACUUM would delete anything (delta-rs's dry run under the table's retention); True when the dry
        run itself fails (Delta's VACUUM decides then)."""
        try:
            return bool(self.delta_table().vacuum(dry_run=True))
        except DeltaError:
            return True


__all__ = ["Applied", "DataFile", "Location", "TableState", "TopicTable", "app_id", "record", "table_schema"]
