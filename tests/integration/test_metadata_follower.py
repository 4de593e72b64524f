"""`compaction.metadata.follower`: the table followed commit by commit, and the metadata process's answers from it."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from compaction.metadata import ChangeSet, TopicPartition, acquire_fencing_epoch, commit_current, table_in_store
from compaction.metadata.checkpointer import NICENESS, Checkpointer, CheckpointError
from compaction.metadata.follower import TableFollower
from compaction.metadata.snapshot import PartitionSnapshot
from compaction.metadata.table import LOG_CONFIGURATION
from compaction.metadata.upkeep import log_files
from compaction.remote_log_metadata import RemoteTier, answer
from compaction.storage import open_store

A, B, C = TopicPartition("orders", 0), TopicPartition("orders", 1), TopicPartition("orders", 2)
TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"
BROKER = {"topic_id": TOPIC_ID, "broker_id": 1}
"""What the plugin adds to each partition's request (compaction/pipes.json)."""


def _touch(current: PartitionSnapshot) -> ChangeSet:
    return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer="other", topic_id=TOPIC_ID)


def test_only_the_partitions_a_commit_changed_are_read_again(tmp_path: Path) -> None:
    table = table_in_store(open_store(str(tmp_path)), create=True)
    for tp in (A, B, C):
        acquire_fencing_epoch(table, tp.topic, tp.partition, "setup", 1, topic_id=TOPIC_ID)
    follower = TableFollower(table)
    start = follower.version
    before = follower.partitions([A, B])
    assert follower.changed_since(start) == []

    acquire_fencing_epoch(table, A.topic, A.partition, "a-run", 2)  # another process's commit to A
    acquire_fencing_epoch(table, C.topic, C.partition, "a-run", 3)  # and to C, never asked for here
    assert follower.version == start  # nothing read until asked to follow
    assert follower.follow() == start + 2 == table.version()
    assert follower.changed_since(start) == [A]
    after = follower.partitions([A, B])
    assert (after[A].fencing_epoch, before[A].fencing_epoch) == (2, 1)
    assert after[B].version == start + 2 and after[B].state == before[B].state
    with pytest.raises(ValueError, match=f"expected a version of {start} or newer"):
        follower.changed_since(start - 1)


def test_a_commit_on_the_followed_table_sees_every_commit_before_it(tmp_path: Path) -> None:
    """The follower's own commit lands on top of commits it had not followed (delta-rs checks them, and they touch
    other partitions): afterwards it holds both, none lost from its state."""
    table = table_in_store(open_store(str(tmp_path)), create=True)
    follower = TableFollower(table)
    follower.partitions([A, B])
    acquire_fencing_epoch(table, B.topic, B.partition, "elsewhere", 1, topic_id=TOPIC_ID)
    result = commit_current(table, A, 2, _touch, reader=follower)
    assert result is not None and result.version == table.version() == 2
    follower.follow()
    assert follower.version == 2 and follower.changed_since(0) == [A, B]
    now = follower.partitions([A, B])
    assert (now[A].state.writer, now[B].state.writer) == ("other", "elsewhere")  # type: ignore[union-attr]
    assert {tp: s.state for tp, s in now.items()} == {tp: table.partition_snapshot(tp.topic, tp.partition).state
                                                      for tp in (A, B)}


def test_a_conflicting_commit_replans_on_the_followed_rows(tmp_path: Path) -> None:
    """Another writer commits to the same partition after the follower read it: the commit is planned again on
    the new rows (commit_current's rule), through the follower."""
    table = table_in_store(open_store(str(tmp_path)), create=True)
    acquire_fencing_epoch(table, A.topic, A.partition, "setup", 1, topic_id=TOPIC_ID)
    follower = TableFollower(table)
    seen: list[int] = []

    def plan(current: PartitionSnapshot) -> ChangeSet:
        seen.append(current.fencing_epoch)
        if len(seen) == 1:  # a compaction takes the partition between this read and the write
            acquire_fencing_epoch(table, A.topic, A.partition, "a-run", 2)
        return _touch(current)

    result = commit_current(table, A, 3, plan, reader=follower)
    assert seen == [1, 2] and result is not None and result.fencing_epoch == 2


def test_the_process_answers_follow_with_what_changed(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    table = table_in_store(store, create=True)
    tier = RemoteTier.of(table, store)
    first = tier.follower.version

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        answered = answer(tier, json.dumps(request))
        assert answered["ok"], answered
        return answered["result"]

    listed = ask({"op": "segments", "topic": "orders", "partition": 0, **BROKER})
    assert (listed["version"], listed["segments"]) == (first, [])
    acquire_fencing_epoch(table, "orders", 0, "a-run", 5, topic_id=TOPIC_ID)
    acquire_fencing_epoch(table, "orders", 1, "a-run", 5, topic_id=TOPIC_ID)  # never asked for by the broker
    followed = ask({"op": "follow", "since": first})
    assert followed["version"] == table.version() and not followed["reset"]
    assert [(p["topic"], p["partition"], p["version"]) for p in followed["partitions"]] == [
        ("orders", 0, table.version())]
    assert ask({"op": "follow", "since": followed["version"]})["partitions"] == []
    assert ask({"op": "follow", "since": first - 1}) == {"version": table.version(), "reset": True, "partitions": []}
    loaded = ask({"op": "load", "partitions": [{"topic": "orders", "partition": p} for p in (1, 0, 7)]})
    assert loaded["version"] == table.version()
    assert [(p["partition"], p["version"], p["segments"]) for p in loaded["partitions"]] == [
        (1, table.version(), []), (0, table.version(), []), (7, table.version(), [])]
    assert ask({"op": "segments", "topic": "orders", "partition": 1, **BROKER}) == loaded["partitions"][0]


def _copy(partition: int, segment_id: str, start: int) -> dict[str, Any]:
    """The plugin's request for one whole copy (compaction/pipes.json)."""
    return {"op": "copy", "topic": "orders", "partition": partition, **BROKER, "segment_id": segment_id,
            "start_offset": start, "end_offset": start + 99, "max_timestamp_ms": 5, "event_timestamp_ms": 6,
            "segment_size_bytes": 4096, "txn_index_empty": True, "leader_epochs": [[0, start]], "transactional": False}


def test_follow_leaves_out_what_only_the_process_own_writes_changed(tmp_path: Path) -> None:
    """The broker had the rows of its own writes in their answers: follow names a partition only when another
    writer's commit changed it, also when the process's own commit lands after one it had not followed yet."""
    store = open_store(str(tmp_path))
    table = table_in_store(store, create=True)
    tier = RemoteTier.of(table, store)

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        answered = answer(tier, json.dumps(request))
        assert answered["ok"], answered
        return answered["result"]

    for p in (0, 1):
        ask({"op": "segments", "topic": "orders", "partition": p, **BROKER})
    since = tier.follower.version
    copied = ask(_copy(0, "tqimKeZwStOEOwRzT3L5oQ", 0))
    assert copied["version"] == table.version() and len(copied["segments"]) == 1
    assert ask({"op": "follow", "since": since}) == {"version": table.version(), "reset": False, "partitions": []}

    acquire_fencing_epoch(table, "orders", 1, "a-run", 5, topic_id=TOPIC_ID)  # another writer, not followed yet
    other = table.version()
    ask(_copy(0, "AAAAAAAAAAAAAAAAAAAAAQ", 100))  # lands after it: the follower reads the other's commit first
    assert tier.follower.version == table.version() == other + 1
    followed = ask({"op": "follow", "since": since})
    assert [(p["partition"], p["version"]) for p in followed["partitions"]] == [(1, other + 1)]

    acquire_fencing_epoch(table, "orders", 0, "a-run", 6, topic_id=TOPIC_ID)  # another writer's commit to 0
    followed = ask({"op": "follow", "since": other + 1})
    assert [(p["partition"], p["version"]) for p in followed["partitions"]] == [(0, table.version())]
    assert [s["segment_id"] for s in followed["partitions"][0]["segments"]] == [
        "tqimKeZwStOEOwRzT3L5oQ", "AAAAAAAAAAAAAAAAAAAAAQ"]


def test_the_followers_commits_leave_checkpoints_to_a_background_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit through the follower never waits for a checkpoint: the one due at the table's interval is written
    by the checkpoint process, waited for on the follower's thread while commits go on, and lands in the log."""
    table = table_in_store(open_store(str(tmp_path)), create=True)
    interval = int(LOG_CONFIGURATION["delta.checkpointInterval"])
    follower = TableFollower(table)
    started, release = threading.Event(), threading.Event()
    write = Checkpointer.write

    def held(self: Checkpointer, *args: Any) -> None:
        started.set()
        assert release.wait(60)
        write(self, *args)

    monkeypatch.setattr(Checkpointer, "write", held)
    while table.version() < interval + 2:  # past the due version (delta-rs's: interval - 1), its checkpoint held
        commit_current(table, A, 2, _touch, reader=follower)
    assert started.is_set()
    assert [v for v, kind in log_files(table.table_uri) if kind == "checkpoint"] == []
    release.set()
    follower.wait_for_checkpoint()
    assert [v for v, kind in log_files(table.table_uri) if kind == "checkpoint"] == [interval - 1]
    assert TableFollower(table).partitions([A])[A].state == follower.partitions([A])[A].state


def test_checkpoints_are_written_by_a_child_at_a_lower_priority(tmp_path: Path) -> None:
    """The checkpoint process runs niced, writes the version asked for (delta-rs opens the table from it), reports
    what delta-rs refused without ending, and is started again after it died."""
    table = table_in_store(open_store(str(tmp_path)), create=True)
    for epoch in (1, 2, 3):
        acquire_fencing_epoch(table, A.topic, A.partition, "a-run", epoch, topic_id=TOPIC_ID)
    writer = Checkpointer()
    try:
        writer.write(table.table_uri, 2, table.storage_options)
        assert [v for v, kind in log_files(table.table_uri) if kind == "checkpoint"] == [2]
        pid = writer.pid
        assert pid is not None
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(os.getpriority(os.PRIO_PROCESS, 0) + NICENESS, 19)
        with pytest.raises(CheckpointError, match="version"):
            writer.write(table.table_uri, 99, table.storage_options)
        assert writer.pid == pid, "a refusal is answered, the process goes on"
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(CheckpointError, match="the checkpoint process ended"):
            writer.write(table.table_uri, 3, table.storage_options)
        writer.write(table.table_uri, 3, table.storage_options)
        assert writer.pid not in (None, pid)
        assert [v for v, kind in log_files(table.table_uri) if kind == "checkpoint"] == [2, 3]
        assert DeltaTable(table.table_uri).version() == 3
    finally:
        writer.close()
    assert writer.pid is None


def test_a_commit_of_a_fresh_reader_writes_its_due_checkpoint(tmp_path: Path) -> None:
    """Without a follower (a `kcompact` run), delta-rs writes the checkpoint with the commit that is due: the
    interval-th commit, version interval - 1."""
    table = table_in_store(open_store(str(tmp_path)), create=True)
    interval = int(LOG_CONFIGURATION["delta.checkpointInterval"])
    while table.version() < interval:
        acquire_fencing_epoch(table, A.topic, A.partition, "a-run", table.version() + 1, topic_id=TOPIC_ID)
    assert [v for v, kind in log_files(table.table_uri) if kind == "checkpoint"] == [interval - 1]
