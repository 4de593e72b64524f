"""`compaction.metadata.delta_log`: the metadata table's commits written as Delta log entries by kcompact, checked
against delta-rs (the table's reader and another writer), and the follower reading them commit file by commit file.

delta-spark reads the same commits in tests/delta_readers (the metadata table there is written by this path)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable, write_deltalake

from compaction.errors import CommitConflictError
from compaction.metadata import ChangeSet, TopicPartition, acquire_fencing_epoch, commit_current, table_in_store
from compaction.metadata import follower as follower_module
from compaction.metadata.delta_log import DeltaConflict, log_key, overwrite_partitions, read_commit, store_of
from compaction.metadata.follower import TableFollower
from compaction.metadata.model import METADATA_SCHEMA, PartitionState, partition_rows, rows_to_arrow
from compaction.metadata.snapshot import PartitionSnapshot
from compaction.metadata.table import MetadataTable, partition_files, read_rows
from compaction.storage import open_store

A, B = TopicPartition("orders", 0), TopicPartition("orders", 1)
TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"


def _touch(writer: str) -> Any:
    def plan(current: PartitionSnapshot) -> ChangeSet:
        return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer=writer, topic_id=TOPIC_ID)
    return plan


def _table(tmp_path: Path) -> MetadataTable:
    table = table_in_store(open_store(str(tmp_path)), create=True)
    for tp in (A, B):
        acquire_fencing_epoch(table, tp.topic, tp.partition, "setup", 1, topic_id=TOPIC_ID)
    return table


def _state_rows(tp: TopicPartition, writer: str) -> list[dict[str, Any]]:
    return partition_rows([(_state(tp, writer), [])])[0]


def _state(tp: TopicPartition, writer: str) -> PartitionState:
    return PartitionState(topic=tp.topic, partition=tp.partition, topic_id=TOPIC_ID, writer=writer, fencing_epoch=1,
                          commit_seq=9, cleaner_offsets=(), leader_epochs=(), updated_ms=1)


def _writers(table: MetadataTable) -> dict[TopicPartition, str]:
    rows = read_rows(table.delta_table(), table.storage_options).to_pylist()
    return {TopicPartition(r["topic"], r["partition"]): r["writer"] for r in rows if r["row_kind"] == "partition"}


def test_a_commit_is_a_delta_commit_delta_rs_reads(tmp_path: Path) -> None:
    """The commit file holds commitInfo, a remove for each file the partition had and an add for its new one; delta-rs
    reads the version with exactly the new rows, and the other partition's file untouched."""
    table = _table(tmp_path)
    dt, base = table.delta_table(), table.version()
    before = partition_files(dt, [A, B])
    commit = overwrite_partitions(dt, base, store_of(table.table_uri, table.storage_options),
                                  {A: _state_rows(A, "ours")}, partition_files(dt, [A]), "topic = 'orders' AND "
                                  "partition = 0", {"kcompact.writer": "ours"}, checkpoint=True)
    assert commit.version == base + 1 == table.version()
    actions = [json.loads(line) for line in (tmp_path / "_kcompact_metadata" / log_key(commit.version)).read_text()
               .splitlines()]
    assert [next(iter(a)) for a in actions] == ["commitInfo", "remove", "add"]
    assert actions[0]["commitInfo"]["kcompact.writer"] == "ours"
    assert actions[0]["commitInfo"]["operationParameters"]["mode"] == "Overwrite"
    assert actions[1]["remove"]["path"] == next(p for p, tp, _ in before if tp == A)
    fresh = DeltaTable(table.table_uri)
    assert fresh.version() == commit.version
    assert {tp: path for path, tp, _ in partition_files(fresh, [A, B])} == {
        A: commit.added[0][0], B: next(p for p, tp, _ in before if tp == B)}
    assert _writers(table) == {A: "ours", B: "setup"}
    assert read_commit(store_of(table.table_uri, table.storage_options), commit.version) == commit


def test_a_version_another_writer_took_is_checked_and_passed(tmp_path: Path) -> None:
    """delta-rs commits to the other partition at the version ours wanted: ours lands at the next one; delta-rs
    commits to ours: ours lost, nothing of it is visible, and its data file is gone."""
    table = _table(tmp_path)
    store = store_of(table.table_uri, table.storage_options)
    dt, base = table.delta_table(), table.version()
    files = partition_files(dt, [A])
    foreign = rows_to_arrow([_state(B, "rs")], [], METADATA_SCHEMA)
    write_deltalake(table.delta_table(), foreign, mode="overwrite", predicate="topic = 'orders' AND partition = 1")
    commit = overwrite_partitions(dt, base, store, {A: _state_rows(A, "ours")}, files, "p", {}, checkpoint=False)
    assert commit.version == base + 2 == table.version()
    assert _writers(table) == {A: "ours", B: "rs"}

    dt, base = table.delta_table(), table.version()
    files = partition_files(dt, [A])
    theirs = rows_to_arrow([_state(A, "rs-on-a")], [], METADATA_SCHEMA)
    write_deltalake(table.delta_table(), theirs, mode="overwrite", predicate="topic = 'orders' AND partition = 0")
    before = set(_parquet_files(tmp_path))
    with pytest.raises(DeltaConflict, match=f"version {base + 1} wrote a file of partition orders-0"):
        overwrite_partitions(dt, base, store, {A: _state_rows(A, "lost")}, files, "p", {}, checkpoint=False)
    assert table.version() == base + 1 and _writers(table) == {A: "rs-on-a", B: "rs"}
    assert set(_parquet_files(tmp_path)) == before, "the lost commit's data file is deleted again"


def test_a_commit_that_may_narrow_lands_without_the_partitions_taken_first(tmp_path: Path) -> None:
    """`narrow`: delta-rs commits to A at the version ours wanted: ours lands at the next one with B alone (its
    commitInfo from `narrow`, A's data file deleted again) and names A as lost; a version that takes every partition
    left still loses the whole commit."""
    table = _table(tmp_path)
    store = store_of(table.table_uri, table.storage_options)
    asked: list[list[TopicPartition]] = []

    def narrow(left: Any) -> tuple[str, dict[str, str]]:
        asked.append(sorted(left))
        return "narrowed", {"kcompact.partitions": str(len(left))}

    dt, base = table.delta_table(), table.version()
    files = partition_files(dt, [A, B])
    theirs = rows_to_arrow([_state(A, "rs-on-a")], [], METADATA_SCHEMA)
    write_deltalake(table.delta_table(), theirs, mode="overwrite", predicate="topic = 'orders' AND partition = 0")
    before = set(_parquet_files(tmp_path))
    commit = overwrite_partitions(dt, base, store, {A: _state_rows(A, "ours"), B: _state_rows(B, "ours")}, files,
                                  "both", {"kcompact.partitions": "2"}, checkpoint=False, narrow=narrow)
    assert (commit.version, asked) == (base + 2, [[B]])
    assert commit.lost == ((A, f"version {base + 1} wrote a file of partition orders-0"),)
    assert [tp for _p, tp, _n in commit.added] == [B] and commit.removed_from == (B,)
    assert _writers(table) == {A: "rs-on-a", B: "ours"}
    info = json.loads((tmp_path / "_kcompact_metadata" / log_key(commit.version)).read_text().splitlines()[0])
    assert info["commitInfo"]["operationParameters"]["predicate"] == "narrowed"
    assert info["commitInfo"]["kcompact.partitions"] == "1"
    assert info["commitInfo"]["operationMetrics"]["num_added_files"] == 1
    assert set(_parquet_files(tmp_path)) == before | {str(tmp_path / "_kcompact_metadata" / commit.added[0][0])}
    assert read_commit(store, commit.version) == commit.__class__(**{**commit.__dict__, "lost": ()})

    dt, base = table.delta_table(), table.version()
    files = partition_files(dt, [A])
    write_deltalake(table.delta_table(), theirs, mode="overwrite", predicate="topic = 'orders' AND partition = 0")
    with pytest.raises(DeltaConflict, match=f"version {base + 1} wrote a file of partition orders-0"):
        overwrite_partitions(dt, base, store, {A: _state_rows(A, "lost")}, files, "p", {}, checkpoint=False,
                             narrow=narrow)


def _parquet_files(store: Path) -> list[str]:
    return [str(p) for p in (store / "_kcompact_metadata").rglob("*.parquet") if "_delta_log" not in p.parts]


def test_a_due_checkpoint_is_written_by_a_commit_that_asks(tmp_path: Path) -> None:
    table = _table(tmp_path)
    DeltaTable(table.table_uri).alter.set_table_properties({"delta.checkpointInterval": "5"})
    while table.version() < 3:
        commit_current(table, A, 1, _touch("filler"))
    version = commit_current(table, A, 1, _touch("due")).version  # type: ignore[union-attr]
    assert version == 4
    assert (tmp_path / "_kcompact_metadata" / "_delta_log" / f"{version:020d}.checkpoint.parquet").exists()
    assert DeltaTable(table.table_uri).version() == 4 and _writers(table)[A] == "due"


def test_the_follower_reads_commit_files_and_never_asks_delta_rs(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits of its own and of others are read from their commit files; delta-rs's state is brought up to date
    only when a commit changes the table's metadata, after `RESYNC_SECONDS` without a look, or when more than
    `FOLLOW_FILES` commits came since the last."""
    table = _table(tmp_path)
    follower = TableFollower(table)
    updates: list[int] = []
    real = DeltaTable.update_incremental
    monkeypatch.setattr(DeltaTable, "update_incremental", lambda dt: (updates.append(1), real(dt))[1])
    start = follower.version
    follower.partitions([A, B])
    commit_current(table, A, 1, _touch("mine"), reader=follower)
    acquire_fencing_epoch(table, B.topic, B.partition, "theirs", 2)
    assert follower.follow() == start + 2 == table.version()
    assert follower.changed_since(start) == [A, B]
    now = follower.partitions([A, B])
    assert (now[A].state.writer, now[B].state.writer, now[B].fencing_epoch) == (  # type: ignore[union-attr]
        "mine", "theirs", 2)
    assert updates == []

    DeltaTable(table.table_uri).alter.set_table_properties({"delta.checkpointInterval": "1000"})
    acquire_fencing_epoch(table, A.topic, A.partition, "after", 3)  # (each acquire takes the next epoch)
    assert follower.follow() == table.version() and len(updates) == 1
    assert follower.partitions([A])[A].fencing_epoch == 2

    acquire_fencing_epoch(table, B.topic, B.partition, "late", 4)
    monkeypatch.setattr(follower_module, "RESYNC_SECONDS", 0.0)
    time.sleep(0.01)
    assert follower.follow() == table.version() and len(updates) == 2
    assert follower.partitions([B])[B].fencing_epoch == 3

    monkeypatch.setattr(follower_module, "RESYNC_SECONDS", 60.0)
    monkeypatch.setattr(follower_module, "FOLLOW_FILES", 2)
    for epoch in range(4, 7):  # three commits: more than a follow reads one by one
        acquire_fencing_epoch(table, A.topic, A.partition, "burst", epoch)
    assert follower.follow() == table.version() and len(updates) == 3
    assert follower.partitions([A])[A].fencing_epoch == 5


def test_a_broker_commit_that_loses_is_replanned(tmp_path: Path) -> None:
    """The commit path end to end: a commit whose partition moved between its read and its write is refused by the
    log (not by delta-rs), and the batch plans it again on the new rows."""
    table = _table(tmp_path)
    seen: list[int] = []

    def plan(current: PartitionSnapshot) -> ChangeSet:
        seen.append(current.fencing_epoch)
        if len(seen) == 1:
            acquire_fencing_epoch(table, A.topic, A.partition, "a-run", 2)
        return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer="w", topic_id=TOPIC_ID)

    result = commit_current(table, A, 3, plan)
    assert seen == [1, 2] and result is not None and result.fencing_epoch == 2
    with pytest.raises(CommitConflictError):
        commit_current(table, A, 1, lambda c: (acquire_fencing_epoch(table, A.topic, A.partition, "b", 3),
                                               ChangeSet.planned_from(c, fencing_epoch=c.fencing_epoch, writer="w",
                                                                      topic_id=TOPIC_ID))[1])
