"""The metadata table's rows files (`compaction.metadata.delta_log`'s module docstring): a batched commit of many
partitions also writes their rows as one object, and a read that wants many of that commit's files reads it instead
of one object per partition, on a local directory and on S3 (moto).

What must hold: a read through rows files returns the rows the data files hold (the data files stay the truth, and
Delta's own readers never see a rows file); a rows file gone or unreadable sends the read back to the data files; a
read of a few partitions reads their data files; `kcompact gc` deletes a rows file once no live file names it.
"""

from __future__ import annotations

import importlib
import io
import json
import logging
from collections.abc import Iterable, Sequence

import pytest
from deltalake import DeltaTable

from compaction.gc import collect_garbage
from compaction.metadata import (
    ChangeSet,
    MetadataSnapshot,
    MetadataTable,
    SegmentState,
    StateChange,
    TopicPartition,
    commit_batch,
    new_kafka_uuid,
    table_in_store,
)
from compaction.metadata.delta_log import ROWS_DIR, ROWS_FILE_MIN_PARTITIONS, group_of, rows_file_key
from compaction.metadata.table import DataFile, data_files
from compaction.remote_log_metadata import RemoteTier, serve
from compaction.storage import ObjectStore
from tests.factories import TOPIC_ID, new_segment

table_module = importlib.import_module("compaction.metadata.table")

TOPIC, NOW = "orders", 1_700_000_000_000
MANY = 3 * ROWS_FILE_MIN_PARTITIONS


def tps(n: int, first: int = 0) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in range(first, first + n)]


def tier(table: MetadataTable, partitions: Iterable[TopicPartition], start: int) -> None:
    """Two live segments from `start` in each partition, in one commit."""
    snaps = table.partition_snapshots(partitions)
    commit_batch(table, [ChangeSet.planned_from(
        snaps[p], fencing_epoch=0, writer="tier", topic_id=TOPIC_ID,
        new_segments=[new_segment(a, b, topic=p.topic, partition=p.partition, max_ts=NOW)
                      for a, b in ((start, start + 99), (start + 100, start + 199))]) for p in partitions], NOW)


def swap(table: MetadataTable, partitions: Sequence[TopicPartition]) -> None:
    """Each partition's live segments compacted into one, in one commit."""
    changes = []
    for p, snap in table.partition_snapshots(partitions).items():
        live = snap.live_segments
        merged = new_segment(live[0].start_offset, live[-1].end_offset, topic=p.topic, partition=p.partition,
                             max_ts=NOW)
        changes.append(ChangeSet.planned_from(
            snap, fencing_epoch=0, writer="run", new_segments=[merged], cleaner_offset=live[-1].end_offset + 1,
            state_changes=[StateChange(s.segment_id, SegmentState.DELETE_SEGMENT_STARTED) for s in live]))
    commit_batch(table, changes, NOW)


def spy_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[int]]:
    """The data files read one by one, and the sizes of the rows files decoded, by every read from now on."""
    files: list[str] = []
    groups: list[int] = []
    data, rows = table_module._read_data_files, table_module._rows_of

    def read_data_files(dt: DeltaTable, options: object, schema: object, wanted: Sequence[DataFile]) -> object:
        files.extend(path for path, _v, _s in wanted)
        return data(dt, options, schema, wanted)

    def rows_of(blob: bytes, schema: object, members: Sequence[DataFile]) -> object:
        found = rows(blob, schema, members)
        groups.append(len(members))  # decoded
        return found

    monkeypatch.setattr(table_module, "_read_data_files", read_data_files)
    monkeypatch.setattr(table_module, "_rows_of", rows_of)
    return files, groups


def from_data_files(table: MetadataTable, monkeypatch: pytest.MonkeyPatch) -> MetadataSnapshot:
    """The table's snapshot read from its data files alone."""
    with monkeypatch.context() as m:
        m.setattr(table_module, "ROWS_FILE_MIN_PARTITIONS", 10**9)
        return table.snapshot()


def rows_keys(store: ObjectStore) -> set[str]:
    return {o.key for o in store.list(f"_kcompact_metadata/{ROWS_DIR}/")}


def history(table: MetadataTable) -> MetadataTable:
    """Segments of 3 commits: MANY partitions tiered (a rows file, group A), 3 of them swapped (too few for a rows
    file), then the last MANY // 2 swapped (a rows file again, group B): a read of the table wants files of all
    three, 9 of A and 12 of B."""
    tier(table, tps(MANY), 0)
    swap(table, tps(3))
    swap(table, tps(MANY // 2, first=MANY // 2))
    return table


def rows_key_of(store: ObjectStore, table: MetadataTable, partition: int) -> str:
    """The store key of the rows file that holds `partition`'s live file."""
    (group,) = {group_of(path) for path, values, _s in data_files(table.delta_table())
                if int(values["partition"]) == partition}
    assert group is not None
    return f"_kcompact_metadata/{rows_file_key(group)}"


def test_a_batched_commit_writes_one_rows_file_and_names_its_data_files_after_it(store: ObjectStore) -> None:
    table = table_in_store(store, create=True)
    tier(table, tps(MANY), 0)
    swap(table, tps(ROWS_FILE_MIN_PARTITIONS - 1))
    files = data_files(table.delta_table())
    groups = {group_of(path) for path, _v, _s in files}
    assert len(groups) == 2 and None in groups, "the tier's files name its rows file; the small swap's name none"
    (group,) = groups - {None}
    assert sum(group_of(path) == group for path, _v, _s in files) == MANY - (ROWS_FILE_MIN_PARTITIONS - 1)
    assert rows_keys(store) == {f"_kcompact_metadata/{rows_file_key(group)}"}
    # Delta's own reader sees the data files only: the rows file is not part of the table
    rows = DeltaTable(table.table_uri, storage_options=table.storage_options).to_pyarrow_table()
    snapshot = table.snapshot()
    assert rows.num_rows == sum(len(p.segments) + 1 for p in snapshot.partitions.values())


def test_a_read_of_many_partitions_takes_them_from_rows_files_and_returns_what_the_data_files_hold(
        store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    table = history(table_in_store(store, create=True))
    truth = from_data_files(table, monkeypatch)
    files, groups = spy_reads(monkeypatch)
    assert table.snapshot() == truth
    live = data_files(table.delta_table())
    one_by_one = {path for path, _v, _s in live if group_of(path) is None}
    assert set(files) == one_by_one and len(one_by_one) == 3, "only the small commit's files were read one by one"
    assert sorted(groups) == [MANY // 2 - 3, MANY // 2], "9 live files of the tier's rows file, 12 of the swap's"
    # a partition-filtered read of many partitions, and of one, at an older version too
    files.clear()
    groups.clear()
    assert table.partition_snapshots(tps(MANY)) == {p: truth.partition(p.topic, p.partition) for p in tps(MANY)}
    assert groups
    files.clear()
    groups.clear()
    assert table.partition_snapshot(TOPIC, 7) == truth.partition(TOPIC, 7)
    assert groups == [] and len(files) == 1, "one partition: its own data file"
    old = table.version() - 1
    with monkeypatch.context() as m:
        m.setattr(table_module, "ROWS_FILE_MIN_PARTITIONS", 10**9)
        before = table.snapshot(old)
    assert table.snapshot(old) == before


def test_a_rows_file_gone_or_unreadable_sends_the_read_to_the_data_files(
        store: ObjectStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    table = history(table_in_store(store, create=True))
    truth = from_data_files(table, monkeypatch)
    tiered, swapped = rows_key_of(store, table, 3), rows_key_of(store, table, MANY - 1)
    store.delete(tiered)
    files, groups = spy_reads(monkeypatch)
    assert table.snapshot() == truth
    assert groups == [MANY // 2] and len(files) == 3 + MANY // 2 - 3, "the gone one's 9 live files read one by one"
    files.clear()
    groups.clear()
    store.delete(swapped)
    store.put(swapped, b"PAR1 not a parquet file PAR1")
    with caplog.at_level(logging.WARNING, logger="compaction.metadata.table"):
        assert table.snapshot() == truth
    assert groups == [] and len(files) == len(data_files(table.delta_table()))
    assert any(swapped.removeprefix("_kcompact_metadata/") in r.getMessage() and "unreadable" in r.getMessage()
               for r in caplog.records)


def test_gc_deletes_a_rows_file_once_no_live_file_names_it(store: ObjectStore, monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    table = table_in_store(store, create=True)
    tier(table, tps(MANY), 0)
    (tiered,) = rows_keys(store)
    swap(table, tps(MANY))  # every file of the tier replaced: its rows file is named by none
    young = collect_garbage(store, table, now_ms=NOW, grace_ms=0, orphan_grace_ms=10**12)
    assert tiered in rows_keys(store), "younger than the orphan grace: kept"
    assert "; 0 rows files" in (young.metadata_log or "")
    before = rows_keys(store)
    done = collect_garbage(store, table, now_ms=_later(store, before), grace_ms=0, orphan_grace_ms=1000)
    named = {f"_kcompact_metadata/{rows_file_key(g)}" for path, _v, _s in data_files(table.delta_table())
             if (g := group_of(path))}
    assert tiered not in named and rows_keys(store) == named, "kept exactly those a live file names"
    assert f"; {len(before - named)} rows files of replaced commits deleted" in (done.metadata_log or "")
    assert table.snapshot() == from_data_files(table, monkeypatch)


def _later(store: ObjectStore, keys: set[str]) -> int:
    """A clock well after every one of `keys` was written."""
    return max(o.mtime_ms for o in store.list(f"_kcompact_metadata/{ROWS_DIR}/") if o.key in keys) + 60_000


def test_a_brokers_group_commit_puts_no_rows_file(store: ObjectStore) -> None:
    """The broker's metadata process commits copies of many partitions at once (`batch`), and its files are replaced
    by the partitions' next copies within seconds: it puts no rows file (`batch.Reader.rows_files`), where a
    kcompact writer's commit of as many partitions does."""
    table = table_in_store(store, create=True)
    copies = [{"op": "copy", "topic": TOPIC, "partition": p.partition, "topic_id": TOPIC_ID, "broker_id": 7,
               "segment_id": new_kafka_uuid(), "start_offset": 0, "end_offset": 99, "max_timestamp_ms": NOW,
               "event_timestamp_ms": NOW, "segment_size_bytes": 4096, "txn_index_empty": True,
               "leader_epochs": [[0, 0]], "transactional": False} for p in tps(MANY)]
    out = io.StringIO()
    serve(RemoteTier.of(table, store), io.StringIO(json.dumps({"op": "batch", "requests": copies}) + "\n"), out)
    (answer,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answer["ok"] and all(a["ok"] for a in answer["result"]["answers"]), answer
    assert table.version() == 1, "one commit for the batch"
    assert not rows_keys(store) and not {group_of(path) for path, _v, _s in data_files(table.delta_table())} - {None}
    assert all(len(table.live_segments(TOPIC, p.partition)) == 1 for p in tps(MANY))
    tier(table, tps(MANY, first=MANY), 0)
    assert len(rows_keys(store)) == 1, "a kcompact writer's commit of as many partitions puts one"
