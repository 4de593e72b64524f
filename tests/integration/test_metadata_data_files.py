"""`kcompact gc` deletes the metadata table's removed data files (`compaction.metadata.upkeep.vacuum_data_files`), on a
local directory and on S3 (moto): a file no version of the last `delta.deletedFileRetentionDuration` names goes, every
other stays, and the table reads the same rows through delta-rs and kcompact before and after.

What must hold: the latest version's files are never deleted; a file younger than the retention is kept (a commit in
flight wrote it); a file removed within the retention is kept however old it is, whether its removal is a tombstone in
the newest checkpoint or a commit after it; a file no commit ever named goes by its age alone; a rerun deletes nothing.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from compaction.errors import ConfigError
from compaction.gc import collect_garbage
from compaction.metadata import MetadataTable, table_in_store
from compaction.metadata.delta_log import log_key
from compaction.metadata.table import LOG_CONFIGURATION, data_files
from compaction.metadata.upkeep import interval_ms, log_files, vacuum_data_files
from compaction.storage import ObjectStore, open_store
from tests.integration.test_rows_files import swap, tier, tps

PREFIX = "_kcompact_metadata/"
RETENTION = interval_ms(LOG_CONFIGURATION["delta.deletedFileRetentionDuration"])


def stored(store: ObjectStore) -> dict[str, int]:
    """The table's data files in the store: key relative to the table -> its mtime in ms."""
    return {o.key[len(PREFIX):]: o.mtime_ms for o in store.list(PREFIX)
            if o.key.endswith(".parquet") and "/_" not in "/" + o.key[len(PREFIX):]}


def live(table: MetadataTable) -> set[str]:
    return {path for path, _values, _size in data_files(table.delta_table())}


def removals_in(store: ObjectStore, version: int) -> dict[str, int]:
    """The data files the commit entry of `version` removed -> the removal's deletionTimestamp."""
    return {(r := json.loads(line)["remove"])["path"]: r["deletionTimestamp"]
            for line in store.get(PREFIX + log_key(version)).decode().splitlines() if '"remove"' in line}


def removals(store: ObjectStore, table: MetadataTable) -> dict[str, int]:
    """Every data file a commit entry of the log removed -> the removal's deletionTimestamp."""
    return {path: ts for version, kind in log_files(table.table_uri, table.storage_options) if kind == "commit"
            for path, ts in removals_in(store, version).items()}


def vacuum(store: ObjectStore, table: MetadataTable, now_ms: int) -> int:
    """`vacuum_data_files` as `kcompact gc` runs it: on the store's listing of the table; how many it deleted."""
    own = [replace(o, key=o.key[len(PREFIX):]) for o in store.list(PREFIX)]
    return vacuum_data_files(table, own, lambda keys: store.delete_many(PREFIX + k for k in keys), now_ms)


def test_gc_deletes_the_data_files_no_version_of_the_retention_names(store: ObjectStore) -> None:
    table = table_in_store(store, create=True)
    assert DeltaTable(table.table_uri, storage_options=table.storage_options or None).metadata().configuration[
        "delta.deletedFileRetentionDuration"] == "interval 1 day"
    tier(table, tps(4), 0)
    time.sleep(1.1)  # S3's LastModified has seconds: the first files are older than their removals by a second
    for _ in range(8):  # versions 2-9: checkpoint 9 holds every removal as a tombstone, no commit after it
        swap(table, tps(4))
    entries = log_files(table.table_uri, table.storage_options)
    assert (9, "checkpoint") in entries and max(v for v, _kind in entries) == 9
    orphan = "topic=orders/partition=0/part-00000-00000000-0000-0000-0000-000000000000-c000.parquet"
    store.put(PREFIX + orphan, b"a crashed commit's data file")
    rows = table.snapshot()
    files, latest, removed = stored(store), live(table), removals(store, table)
    assert latest < set(files) and orphan in files and set(removed) == set(files) - latest - {orphan}

    newest = max(files.values())
    assert vacuum(store, table, min(files.values()) + RETENTION - 1) == 0, "every file younger than the retention"
    assert stored(store) == files

    # the first removals' horizon: files created before it, removed after it, kept by their tombstones
    first_removal = min(removed.values())
    kept_by_tombstone = {p for p, ts in removed.items() if files[p] <= first_removal - 1 < ts}
    assert kept_by_tombstone, "no file older than its removal by the clock's resolution"
    assert vacuum(store, table, first_removal + RETENTION - 1) == 0

    # S3's LastModified has seconds, a removal's time milliseconds: past both
    last = max(newest, *removed.values())
    assert vacuum(store, table, last + RETENTION + 1) == len(files) - len(latest)
    assert set(stored(store)) == latest, "exactly the latest version's files are left"
    assert table.snapshot() == rows
    assert DeltaTable(table.table_uri, storage_options=table.storage_options or None).to_pyarrow_table().num_rows == (
        sum(len(p.segments) + (p.state is not None) for p in rows.partitions.values()))
    assert vacuum(store, table, last + RETENTION + 1) == 0, "a rerun deletes nothing"


def test_a_file_removed_after_the_newest_checkpoint_is_kept_whatever_its_age(store: ObjectStore) -> None:
    table = table_in_store(store, create=True)
    tier(table, tps(2), 0)
    swap(table, tps(2))  # version 2: no checkpoint yet, the removal only in a commit entry
    assert not any(kind == "checkpoint" for _v, kind in log_files(table.table_uri, table.storage_options))
    files = stored(store)
    far = max(files.values()) + 10 * RETENTION  # the removal's time is far past too: read from the commit, kept
    assert vacuum(store, table, far) == 0
    assert stored(store) == files
    for _ in range(9):
        swap(table, tps(2))  # versions 3-11: checkpoint 9 holds the removals of 2-9, commits 10 and 11 after it
    after = {path for version, kind in log_files(table.table_uri, table.storage_options) if kind == "commit"
             and version > 9 for path, _ts in removals_in(store, version).items()}
    before, latest = stored(store), live(table)
    assert len(after) == 4 and len(before) == 2 * 11  # a file per partition and commit, versions 1-11
    assert vacuum(store, table, far) == len(before) - len(latest) - len(after)
    assert set(stored(store)) == latest | after


def test_a_checkpoints_tombstones_carry_the_removal_times(tmp_path: Path) -> None:
    """What `vacuum_data_files` relies on: delta-rs keeps a removal younger than the retention in each checkpoint."""
    store = open_store(str(tmp_path / "store"))
    table = table_in_store(store, create=True)
    tier(table, tps(2), 0)
    for _ in range(8):
        swap(table, tps(2))  # versions 2-9, the last a checkpoint
    removed = removals(store, table)
    blob = store.get(PREFIX + "_delta_log/00000000000000000009.checkpoint.parquet")
    tombstones = {r["path"]: r["deletionTimestamp"]
                  for r in pq.read_table(io.BytesIO(blob), columns=["remove"]).column("remove").to_pylist() if r}
    assert tombstones == removed


def test_kcompact_gc_runs_it_and_counts_what_it_deleted(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    table = table_in_store(store, create=True)
    tier(table, tps(2), 0)
    swap(table, tps(2))
    first = collect_garbage(store, table, now_ms=0, grace_ms=0, orphan_grace_ms=10**12)  # retires the swapped rows
    assert "; 0 data files removed longer ago than delta.deletedFileRetentionDuration deleted" in (
        first.metadata_log or "")
    for _ in range(9):
        swap(table, tps(2))  # a checkpoint past every removal of the first two commits and gc's
    before, latest = stored(store), live(table)
    done = collect_garbage(store, table, now_ms=max(before.values()) + 10 * RETENTION, grace_ms=0,
                           orphan_grace_ms=10**12)
    (count,) = [int(part.split()[0]) for part in (done.metadata_log or "").split("; ") if "data files removed" in part]
    gone = set(before) - set(stored(store))
    assert count == len(gone) > 0 and not gone & latest
    assert set(stored(store)) >= live(table), "the table's files, gc's own commit's among them, all there"


def test_a_retention_that_is_not_an_interval_is_refused_naming_the_table(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    table = table_in_store(store, create=True)
    tier(table, tps(1), 0)
    DeltaTable(table.table_uri).alter.set_table_properties({"delta.deletedFileRetentionDuration": "a day"})
    with pytest.raises(ConfigError, match=r"_kcompact_metadata: table property delta.deletedFileRetentionDuration: "
                                          r"not a Delta interval: 'a day'"):
        vacuum(store, table, 0)
    assert [interval_ms(t) for t in ("interval 0 seconds", "interval 7 days", "INTERVAL 2 Hours", "interval 1 week")
            ] == [0, 7 * 86_400_000, 7_200_000, 7 * 86_400_000]
