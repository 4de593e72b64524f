"""Delta table upkeep shared by kcompact's tables: vacuuming what is really stale, compacting many small files, and
keeping the metadata table's log bounded.

delta-rs lists a removed data file as stale (`DeltaTable.vacuum(dry_run=True)`) until a checkpoint expires its
tombstone, whether or not a vacuum already deleted it, and a vacuum is two commits (VACUUM START, VACUUM END): a
table vacuumed on every run would grow its log by two commits a run for nothing. `vacuum` deletes only when a stale
file is still in the store.

The metadata table's log is expired here rather than by delta-rs after each commit (`expire_log`): its automatic
cleanup (`delta.enableExpiredLogCleanup`, on by default) lists the whole `_delta_log` after every commit, so a commit
would cost more the longer the log. With it off (`table.LOG_CONFIGURATION`) a commit and a read touch only the last
checkpoint and the commits after it (on S3 the listing starts after the checkpoint's version), and `expire_log`, from
`kcompact gc`, deletes the entries older than `delta.logRetentionDuration`; docs/metadata-table.md states the bound.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake import DeltaTable

from compaction.errors import ConfigError, CorruptMetadataError
from compaction.metadata.delta_log import ROWS_DIR, group_of, read_commit, store_of
from compaction.metadata.table import LOG_CONFIGURATION, MetadataTable, arrow_filesystem, data_files, reading
from compaction.storage.base import ObjectInfo, ObjectStore


def relative_path(table_uri: str, path: str) -> str:
    """A data file's path relative to the table (delta-rs hands some as the table's URI or path joined to it)."""
    prefix = table_uri.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path


def vacuum(table: DeltaTable, table_uri: str, exists: Callable[[str], bool]) -> list[str]:
    """Delete the data files removed longer ago than the table's retention (`delta.deletedFileRetentionDuration`,
    one week unless the table sets another); returns their paths relative to the table. `exists` tells whether a
    relative path is still in the store."""
    stale = [p for p in (relative_path(table_uri, p) for p in table.vacuum(dry_run=True)) if exists(p)]
    if stale:
        table.vacuum(dry_run=False)
    return stale


def compact_if_crowded(table: DeltaTable, max_files: int) -> int:
    """Bin-pack the table's files (Delta's OPTIMIZE, a dataChange=false rewrite) once it holds more than `max_files`;
    returns how many files were rewritten."""
    if len(table.file_uris()) <= max_files:
        return 0
    return int(table.optimize.compact().get("numFilesRemoved", 0))


_LOG_ENTRY = re.compile(r"^(\d{20})\.(json|checkpoint(?:\.\d+\.\d+)?\.parquet)$")


def log_files(table_uri: str, storage_options: Mapping[str, str] | None = None) -> list[tuple[int, str]]:
    """The entries of the table's `_delta_log` as (version, `commit` or `checkpoint`), by version: one listing of
    the whole directory (`_last_checkpoint` and temporary files left out)."""
    fs = arrow_filesystem(table_uri, storage_options or {})
    found = []
    for info in fs.get_file_info(pa_fs.FileSelector("_delta_log", allow_not_found=True)):
        if m := _LOG_ENTRY.match(info.base_name):
            found.append((int(m.group(1)), "commit" if m.group(2) == "json" else "checkpoint"))
    return sorted(found)


@dataclass(frozen=True)
class LogUpkeep:
    """What `expire_log` did: the table properties it set (an older table's), and the log entries before and after."""

    properties_set: tuple[str, ...]
    entries_before: int
    entries_after: int

    @property
    def entries_expired(self) -> int:
        return self.entries_before - self.entries_after

    def summary(self) -> str:
        settings = f"; set {', '.join(self.properties_set)}" if self.properties_set else ""
        return (f"metadata table log: {self.entries_after} entries, {self.entries_expired} expired "
                f"(older than delta.logRetentionDuration){settings}")


def expire_log(table: MetadataTable, configuration: Mapping[str, str] = LOG_CONFIGURATION) -> LogUpkeep:
    """Keep the metadata table's Delta log bounded: give a table created before `configuration` its properties (one
    commit, once), then delete the log entries older than `delta.logRetentionDuration` (delta-rs's
    `cleanup_metadata`: commits and checkpoints below the newest checkpoint older than the retention, so every
    version inside it can still be loaded). Idempotent; a concurrent commit is unaffected (only entries below a
    checkpoint are deleted, and no reader of the latest version opens them).

    Raises:
        TransientStoreError: the store kept failing; rerun.
    """
    options = table.storage_options
    with reading(f"{table.table_uri} (log upkeep)"):
        dt = table.delta_table()
        current = dt.metadata().configuration
        wrong = {k: v for k, v in configuration.items() if current.get(k) != v}
        if wrong:
            dt.alter.set_table_properties(wrong)
        before = len(log_files(table.table_uri, options))
        table.delta_table().cleanup_metadata()
        after = len(log_files(table.table_uri, options))
    return LogUpkeep(tuple(sorted(wrong)), before, after)


def expire_rows_files(table: MetadataTable, listing: Iterable[ObjectInfo], delete: Callable[[list[str]], object],
                      now_ms: int, min_age_ms: int, *, dt: DeltaTable | None = None) -> int:
    """Delete the metadata table's rows files (`delta_log`'s module docstring) that no data file of the table's
    latest version names, once older than `min_age_ms`: a commit writes its rows file before it claims its
    version, so a younger one may be a commit's in flight. `listing`: the table's objects, keys relative to the
    table (at least those under `delta_log.ROWS_DIR`); `delete` takes such keys, all at once (a store's
    `delete_many`). Returns how many were deleted.
    A reader of an older version that wanted one reads its data files instead. `dt`: the table loaded at its latest
    version, where the caller has it (default: loaded here)."""
    prefix = ROWS_DIR + "/"
    found = [o for o in listing if o.key.startswith(prefix) and o.key.endswith(".parquet")]
    if not found:
        return 0
    with reading(f"{table.table_uri} (rows files)"):
        named = {group_of(path) for path, _values, _size in data_files(table.delta_table() if dt is None else dt)}
    stale = [o.key for o in found
             if o.key[len(prefix):-len(".parquet")] not in named and now_ms - o.mtime_ms >= min_age_ms]
    if stale:
        delete(stale)
    return len(stale)


_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+([a-z]+?)s?\s*$", re.IGNORECASE)
_UNIT_MS = {"nanosecond": 1e-6, "microsecond": 1e-3, "millisecond": 1, "second": 1000, "minute": 60_000,
            "hour": 3_600_000, "day": 86_400_000, "week": 7 * 86_400_000}
DEFAULT_DELETED_FILE_RETENTION = "interval 1 week"
"""Delta's default for `delta.deletedFileRetentionDuration`."""


def interval_ms(text: str) -> int:
    """A Delta table property's interval (`interval 1 day`, `interval 0 seconds`) in milliseconds.

    Raises:
        ValueError: not an interval of one number and one unit.
    """
    m = _INTERVAL.match(text)
    if not m or m.group(2).lower() not in _UNIT_MS:
        raise ValueError(f"not a Delta interval: {text!r} (expected e.g. 'interval 7 days')")
    return int(int(m.group(1)) * _UNIT_MS[m.group(2).lower()])


def _is_data_file(key: str) -> bool:
    """A key relative to the table that may be a data file: a Parquet file in no hidden directory (`_delta_log`,
    `_kcompact_rows` and any other a name starting with `_` or `.` marks, which Delta's readers skip too)."""
    return key.endswith(".parquet") and not any(part.startswith(("_", ".")) for part in key.split("/"))


def _removed_since_checkpoint(table: MetadataTable, store: ObjectStore, version: int) -> dict[str, int | None]:
    """Every data file a remove action of the log names, up to `version`: path -> its deletion time in ms, from
    the newest checkpoint at or below `version` (which keeps the removes younger than the table's deleted-file
    retention: its tombstones) and every commit after it (None: removed after the checkpoint, taken as just now)."""
    entries = [(v, kind) for v, kind in log_files(table.table_uri, table.storage_options) if v <= version]
    checkpoint = max((v for v, kind in entries if kind == "checkpoint"), default=-1)
    removed: dict[str, int | None] = {}
    if checkpoint >= 0:
        blob = store.get(f"_delta_log/{checkpoint:020d}.checkpoint.parquet")
        column = pq.read_table(io.BytesIO(blob), columns=["remove"]).column("remove")
        for remove in column.to_pylist():
            if remove:
                removed[unquote(remove["path"])] = int(remove.get("deletionTimestamp") or 0)
    for v in range(checkpoint + 1, version + 1):
        commit = read_commit(store, v)
        if commit is None:  # an expired entry: below a checkpoint, never after the newest one
            raise CorruptMetadataError(f"commit {v} is missing after checkpoint {checkpoint}",
                                       obj=table.table_uri)
        removed.update(dict.fromkeys(commit.removed))
    return removed


def vacuum_data_files(table: MetadataTable, listing: Iterable[ObjectInfo], delete: Callable[[list[str]], object],
                      now_ms: int, *, dt: DeltaTable | None = None) -> int:
    """Delete the metadata table's data files that no version a reader may still load names: not in the latest
    version, and removed longer ago than `delta.deletedFileRetentionDuration` (a file's tombstone, in the newest
    checkpoint, holds the time of its removal; a file removed after that checkpoint is kept), or never committed
    at all (a commit that crashed after its puts). A file younger than the retention is always kept: a commit in
    flight wrote it. Delta's VACUUM rule, on kcompact's own clock (`now_ms`), and without its two commits: the
    metadata table's data files, two per partition a run swaps, would otherwise never leave the store.
    `listing`: the table's objects, keys relative to the table; `delete` takes such keys, all at once; `dt` as
    `expire_rows_files`'s. Returns how many were deleted.

    Raises:
        ConfigError: the table's `delta.deletedFileRetentionDuration` is not an interval.
        CorruptMetadataError: the log misses a commit after its newest checkpoint.
        TransientStoreError: the store kept failing; rerun.
    """
    candidates = [o for o in listing if _is_data_file(o.key)]
    if not candidates:
        return 0
    with reading(f"{table.table_uri} (data files)"):
        dt = table.delta_table() if dt is None else dt
        setting = dt.metadata().configuration.get("delta.deletedFileRetentionDuration", DEFAULT_DELETED_FILE_RETENTION)
        try:
            retention = interval_ms(setting)
        except ValueError as e:
            raise ConfigError(f"{table.table_uri}: table property delta.deletedFileRetentionDuration: {e}") from None
        live = {path for path, _values, _size in data_files(dt)}
        store = store_of(table.table_uri, table.storage_options)
        removed = _removed_since_checkpoint(table, store, dt.version())
    horizon = now_ms - retention
    never = -1  # a file no remove action names: never committed, or its tombstone expired with the retention
    stale = [o.key for o in candidates
             if o.key not in live and o.mtime_ms <= horizon
             and (when := removed.get(o.key, never)) is not None and when <= horizon]
    if stale:
        delete(stale)
    return len(stale)


__all__ = ["LogUpkeep", "compact_if_crowded", "expire_log", "expire_rows_files", "interval_ms", "log_files",
           "relative_path", "vacuum", "vacuum_data_files"]
