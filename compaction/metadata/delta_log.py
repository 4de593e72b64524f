"""The metadata table's commits, written as Delta log entries by kcompact itself: each partition's new Parquet file
put in the store, then one commit file `_delta_log/<version>.json` created only if no other writer took that version.

This is the write `delta-rs`'s `write_deltalake(dt, rows, mode="overwrite", predicate=...)` makes for a predicate on
the partition columns, and what the Delta protocol asks of it, without its fixed cost: delta-rs plans the write
through DataFusion, matches the predicate against every file of the version, and after its commit brings the whole
table state to the new version. That was 22 ms of a broker copy's 28 ms at 1,000 partitions, and grew with the
table (11 ms at 1,000 files, 20 ms at 5,000 for a one-row overwrite). Here a commit costs its own files:

1. the files that hold the batch's partitions at the base version (the version's add actions, by partition value)
   are the commit's `remove` actions;
2. each partition's rows go to a new Parquet file (`topic=<t>/partition=<p>/part-00000-<uuid>-c000.parquet`,
   the data columns only: the partition columns are in the log, as every Delta writer stores them; encoded by
   `compaction.metadata.small_parquet`, which writes the layout pyarrow wrote for them at a fifth of its cost), put
   in the store, which makes them durable, and are the commit's `add` actions;
3. the commit file is created with the store's create-only put (a local link that fails when the name exists; on
   S3 a conditional PUT, the guarantee delta-rs's own commits rely on): the version is ours or another writer's.

When another writer took the version, its actions are read: if any adds or removes a file of one of the batch's
partitions, or changes the table's metadata or protocol, the commit lost (`DeltaConflict`: nothing of it is
visible, and its Parquet files, which no commit names, are deleted again); otherwise the same actions are tried at
the next version. That is delta-rs's conflict check for this write, file by file: a commit to other partitions never
fails one to these.

A commit of `ROWS_FILE_MIN_PARTITIONS` partitions or more (a writer may decline, as a broker's does: `rows_file`)
also puts one more Parquet file, its **rows file**
(`_kcompact_rows/<group>.parquet`, `rows_file_key`): the rows of all its data files in one object, each row with the
path of the data file it copies (`_path`), and names its data files after it (`...-c000.g<group>.parquet`,
`group_of`). A reader that wants many files of one commit reads that one object instead of one per partition
(`table.read_files`: 1,000 partitions' rows in ~15 ms against ~1 s, one GET against 1,000 on S3); the data files stay
the table's truth, so a rows file gone (deleted by `kcompact gc` once no live file names it) or unreadable only
sends the reader back to them. Delta's readers and vacuum never see it: a path under a directory whose name starts
with `_` is not part of the table.

Checkpoints and log cleanup are the caller's choice, as with delta-rs's post-commit hook: `checkpoint` writes the
version's checkpoint when it is due (the last version of each `delta.checkpointInterval`: 99, 199, ... at 100), and
the table's expired-log cleanup is off (`compaction.metadata.upkeep`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import io
import json
import re
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from compaction.errors import CorruptMetadataError, KcompactError, MissingObjectError, ObjectExistsError
from compaction.metadata import small_parquet
from compaction.metadata.model import METADATA_SCHEMA, PARTITION_COLUMNS, TopicPartition
from compaction.storage.base import ObjectStore, StoreSpec

PartitionFile = tuple[str, TopicPartition, int]
"""A data file of the table: its path relative to the table (decoded), its partition and its size in bytes (the
metadata table's `table.DataFile`, with the partition values as the partition they name)."""

COMMIT_ATTEMPTS = 15
"""Versions a commit tries before it counts as lost: each taken by another writer that touched none of its
partitions (delta-rs's default `max_commit_retries`)."""


class DeltaConflict(Exception):
    """The commit lost: a commit that landed after the base version touched one of its partitions (or the table's
    metadata), or `COMMIT_ATTEMPTS` versions were taken first. Nothing of it is visible."""


@functools.lru_cache(maxsize=16)
def table_store(table_uri: str, endpoint_url: str | None, region: str | None) -> ObjectStore:
    """kcompact's own store at the root of the Delta table `table_uri`, one per table for the process (on S3 its
    shared client, retries and its conditional-PUT probe, made once)."""
    parts = urlsplit(table_uri)
    if parts.scheme in ("s3", "s3a"):
        return StoreSpec.parse(f"s3://{parts.netloc}{unquote(parts.path)}", endpoint_url=endpoint_url,
                               region=region).open()
    return StoreSpec.parse(unquote(parts.path) if parts.scheme == "file" else table_uri).open()


def store_of(table_uri: str, storage_options: Mapping[str, str]) -> ObjectStore:
    """`table_store` for a table opened with delta-rs's `storage_options`."""
    scheme = urlsplit(table_uri).scheme
    if scheme in ("s3", "s3a"):
        return table_store(table_uri, storage_options.get("AWS_ENDPOINT_URL"), storage_options.get("AWS_REGION"))
    return table_store(table_uri, None, None)


@functools.cache
def _version() -> str:
    try:
        return importlib.metadata.version("kcompact")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def log_key(version: int) -> str:
    return f"_delta_log/{version:020d}.json"


ROWS_DIR = "_kcompact_rows"
ROWS_FILE_MIN_PARTITIONS = 8
"""The fewest partitions a commit writes a rows file for (module docstring), and the fewest files of one rows file
a read must want before it reads the rows file instead of them (`table.read_files`)."""
ROWS_PATH_COLUMN = "_path"
_GROUPED = re.compile(r"-c000\.g([0-9a-f]{32})\.parquet$")


def rows_file_key(group: str) -> str:
    """The rows file of the commit whose data files name `group`, relative to the table."""
    return f"{ROWS_DIR}/{group}.parquet"


def group_of(path: str) -> str | None:
    """The rows file group a data file's path names, or None (a file of a smaller commit, or another writer's)."""
    m = _GROUPED.search(path)
    return m.group(1) if m else None


def data_schema(schema: pa.Schema = METADATA_SCHEMA) -> pa.Schema:
    """The columns of `schema` a data file holds: all but the partition columns."""
    return pa.schema([f for f in schema if f.name not in PARTITION_COLUMNS])


Rows = Sequence[Mapping[str, Any]]
"""A partition's rows, each a dict of its columns by name (`model.partition_rows`; other keys are ignored)."""


def _rows_file(files: Sequence[tuple[str, Rows]], schema: pa.Schema) -> bytes:
    """The rows file of data files `files` (path, rows) of data columns `schema`: their rows, in order, with a
    `_path` column."""
    paths = pa.array([path for path, _r in files], pa.string())
    indices = pa.array([i for i, (_p, r) in enumerate(files) for _ in range(len(r))], pa.int32())
    rows = pa.Table.from_pylist([row for _p, r in files for row in r], schema=schema)
    rows = rows.append_column(ROWS_PATH_COLUMN, pa.DictionaryArray.from_arrays(indices, paths))
    out = io.BytesIO()
    pq.write_table(rows, out, compression="snappy", store_schema=False, write_statistics=False)
    return out.getvalue()


def _partition_values(tp: TopicPartition) -> dict[str, str]:
    return {"topic": tp.topic, "partition": str(int(tp.partition))}


Describe = Callable[[Collection[TopicPartition]], tuple[str, Mapping[str, str]]]
"""The commitInfo of a commit of some partitions: its predicate (`batch.partitions_predicate`) and the writer's own
fields."""


def overwrite_partitions(dt: DeltaTable, base: int, store: ObjectStore, rows: Mapping[TopicPartition, Rows],
                         current: Sequence[PartitionFile], predicate: str, custom_metadata: Mapping[str, str],
                         checkpoint: bool, rows_file: bool = True, schema: pa.Schema = METADATA_SCHEMA,
                         narrow: Describe | None = None) -> Commit:
    """Replace every row of the partitions of `rows` with those rows (of the table's `schema`: `METADATA_SCHEMA`,
    or `LEGACY_METADATA_SCHEMA` for a table created before `transactional`; the data files hold all but the
    partition columns), in one commit on top of version `base` of the table `dt` opened; the commit, as
    the log now holds it. `current`: the files of those partitions at `base` (path relative to the table,
    partition, size), all of them. `dt` is left at its version, but for a due checkpoint (`checkpoint`), which
    loads the new version into it first. `rows_file`: whether a commit of `ROWS_FILE_MIN_PARTITIONS` partitions or
    more also puts their rows file (the module docstring). `predicate` and `custom_metadata` go into the commitInfo.

    `narrow`: a commit of many partitions may land without some. With it, a version taken first that touched some
    of the partitions but not all drops those from the commit (their actions, and their data files, deleted again),
    which goes on with the rest, its commitInfo from `narrow(the partitions left)`; the partitions dropped are the
    returned commit's `lost`, each with what took it. Without it, any touched partition loses the whole commit.

    Raises:
        DeltaConflict: the commit lost (module docstring); nothing of it is visible.
        TransientStoreError and the store's other errors: a put failed after the store's retries.
    """
    now = int(time.time() * 1000)
    objects: dict[str, bytes] = {}
    adds: dict[TopicPartition, dict[str, Any]] = {}
    added: dict[TopicPartition, PartitionFile] = {}
    group = uuid.uuid4().hex if rows_file and len(rows) >= ROWS_FILE_MIN_PARTITIONS else None
    suffix = f"c000.g{group}.parquet" if group else "c000.parquet"
    columns = data_schema(schema)
    encoder = small_parquet.encoder(columns)
    for tp, table in rows.items():
        path = f"topic={tp.topic}/partition={int(tp.partition)}/part-00000-{uuid.uuid4()}-{suffix}"
        objects[path] = data = encoder.encode(table)
        added[tp] = (path, tp, len(data))
        adds[tp] = {"add": {
            "path": path, "partitionValues": _partition_values(tp), "size": len(data), "modificationTime": now,
            "dataChange": True,
            "stats": json.dumps({"numRecords": len(table), "minValues": {}, "maxValues": {}, "nullCount": {}},
                                separators=(",", ":"))}}
    if group:
        objects[rows_file_key(group)] = _rows_file([(added[tp][0], table) for tp, table in rows.items()], columns)
    removes = [(tp, {"remove": {"path": path, "dataChange": True, "deletionTimestamp": now,
                                "extendedFileMetadata": True, "partitionValues": _partition_values(tp),
                                "size": size}})
               for path, tp, size in current]

    def body(left: Collection[TopicPartition], predicate: str, custom_metadata: Mapping[str, str]) -> bytes:
        info = {"commitInfo": {
            "timestamp": now, "operation": "WRITE",
            "operationParameters": {"mode": "Overwrite", "predicate": predicate,
                                    "partitionBy": json.dumps(list(PARTITION_COLUMNS), separators=(",", ":"))},
            "readVersion": base, "isBlindAppend": False,
            "engineInfo": f"kcompact/{_version()}", "clientVersion": f"kcompact-{_version()}",
            **custom_metadata,
            "operationMetrics": {"num_added_files": len(left),
                                 "num_removed_files": sum(tp in left for tp, _r in removes),
                                 "num_added_rows": sum(len(rows[tp]) for tp in left)}}}
        actions = [info, *(r for tp, r in removes if tp in left), *(adds[tp] for tp in rows if tp in left)]
        return "\n".join(json.dumps(action, separators=(",", ":")) for action in actions).encode()

    def drop(keys: Iterable[str]) -> None:
        for key in keys:  # never referenced by any commit, and named by a fresh uuid: nobody else can know them
            with contextlib.suppress(KcompactError):
                store.delete(key)

    rewritten = None if narrow is None else lambda left: body(left, *narrow(left))
    try:  # (not in `deferred_sync`: the store is shared by the process's writers)
        version, lost = _claim(store, base, body(rows.keys(), predicate, custom_metadata), set(rows), rewritten,
                               objects)
    except DeltaConflict:
        drop(objects)
        raise
    drop(added[tp][0] for tp in lost)
    left = set(rows).difference(lost)
    if checkpoint:
        interval = int(dt.metadata().configuration.get("delta.checkpointInterval", "100"))
        if (version + 1) % interval == 0:
            dt.load_as_version(version)
            dt.create_checkpoint()
    kept = [f for f in current if f[1] in left]
    return Commit(version, tuple(added[tp] for tp in rows if tp in left), tuple(path for path, _tp, _size in kept),
                  tuple(tp for _path, tp, _size in kept), False, tuple(sorted(lost.items())))


def _claim(store: ObjectStore, base: int, body: bytes, touched: set[TopicPartition],
           rewritten: Callable[[set[TopicPartition]], bytes] | None = None, objects: Mapping[str, bytes] | None = None
           ) -> tuple[int, dict[TopicPartition, str]]:
    """Put the data files `objects`, then create the commit file `body` at the first version after `base` no other
    writer took (the first try with the objects, `ObjectStore.put_then`: a local store waits for its disk once for
    both); the version, and the partitions dropped from it on the way (each with why): whenever a version taken first
    touched some of `touched` but not all, those are taken out of it, and the body is `rewritten(the partitions
    left)` (when given).

    Raises:
        DeltaConflict: a version taken first touched `touched` (all of it, with `rewritten`) or the table's metadata,
            or `COMMIT_ATTEMPTS` were.
    """
    version = base + 1
    lost: dict[TopicPartition, str] = {}
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            if attempt == 0:
                store.put_then(objects or {}, log_key(version), body)
            else:
                store.put(log_key(version), body)
            return version, lost
        except ObjectExistsError as e:
            if e.uri != store.object_uri(log_key(version)):  # a data file's (uuid-named: not another writer's)
                raise
            winner = read_commit(store, version)
            if winner is None:  # expired between the refusal and the read: far older than any base
                raise DeltaConflict(f"version {version} was taken, and is gone from the log") from None
            if winner.table_changed:
                raise DeltaConflict(f"version {version} changed the table's metadata or protocol") from None
            if hit := touched & winner.partitions:
                if rewritten is None or hit == touched:
                    tp = min(hit)
                    raise DeltaConflict(f"version {version} wrote a file of partition {tp.topic}-{tp.partition}"
                                        ) from None
                lost.update({tp: f"version {version} wrote a file of partition {tp.topic}-{tp.partition}"
                             for tp in hit})
                touched = touched - hit
                body = rewritten(touched)
            version += 1
    raise DeltaConflict(f"{COMMIT_ATTEMPTS} versions after {base} were taken by other writers first")


@dataclass(frozen=True)
class Commit:
    """What one commit file of the log changed in the table's files."""

    version: int
    added: tuple[PartitionFile, ...]
    removed: tuple[str, ...]
    removed_from: tuple[TopicPartition, ...]
    """The partitions of the removed files (a remove without partition values names none)."""
    table_changed: bool
    """Whether it holds a `metaData` or `protocol` action (a schema, a configuration, a feature)."""
    lost: tuple[tuple[TopicPartition, str], ...] = ()
    """Of a commit this process wrote (`overwrite_partitions`): the partitions dropped from it because a commit
    landed first touched them, each with what it found; nothing of theirs is in it."""

    @property
    def partitions(self) -> set[TopicPartition]:
        """The partitions whose files it added or removed."""
        return {tp for _path, tp, _size in self.added} | set(self.removed_from)


def read_commit(store: ObjectStore, version: int) -> Commit | None:
    """The commit file of `version`, or None when the log holds none (not written yet, or expired).

    Raises:
        CorruptMetadataError: a line is not a JSON action.
        TransientStoreError and the store's other errors.
    """
    key = log_key(version)
    try:
        text = store.get(key).decode()
    except MissingObjectError:
        return None
    added: list[PartitionFile] = []
    removed: list[str] = []
    removed_tps: list[TopicPartition] = []
    changed = False
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
            if "add" in action:
                add = action["add"]
                added.append((unquote(add["path"]), _partition_of(add), int(add["size"])))
            elif "remove" in action:
                remove = action["remove"]
                removed.append(unquote(remove["path"]))
                if remove.get("partitionValues"):
                    removed_tps.append(_partition_of(remove))
            elif "metaData" in action or "protocol" in action:
                changed = True
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptMetadataError(f"line {number} is not a Delta action this writer reads ({e})",
                                       obj=store.object_uri(key)) from e
    return Commit(version, tuple(added), tuple(removed), tuple(removed_tps), changed)


def _partition_of(action: Mapping[str, Any]) -> TopicPartition:
    values = action["partitionValues"]
    return TopicPartition(str(values["topic"]), int(values["partition"]))


__all__ = ["COMMIT_ATTEMPTS", "Commit", "DeltaConflict", "Describe", "PartitionFile", "Rows", "data_schema", "log_key",
           "overwrite_partitions", "read_commit", "store_of", "table_store"]
