"""A broker tiering the next segments does not cost a concurrent compaction its commit (`compaction.metadata.rebase`).

The broker's commits go through the metadata manager's own request handlers (`compaction.remote_log_metadata`), on
a real Delta table in a local directory; the compaction is a change set planned at one table version and committed
after the broker's commits landed, either before `commit` reads the partition (a stale `expected_commit_seq`) or
between its read and its write (delta-rs's conflict check).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from compaction.errors import CommitConflictError, FencedError
from compaction.metadata import (
    ChangeSet,
    MetadataTable,
    SegmentState,
    StateChange,
    TopicPartition,
    acquire_fencing_epoch,
    commit,
    new_kafka_uuid,
)
from compaction.remote_log_metadata import RemoteTier, add, update
from compaction.storage import open_store
from tests import factories
from tests.factories import TOPIC_ID

commit_module = importlib.import_module("compaction.metadata.commit")
batch_module = importlib.import_module("compaction.metadata.batch")

TOPIC, NOW = "orders", 1_700_000_000_000
compaction = partial(factories.compaction, topic=TOPIC, max_ts=NOW)


@pytest.fixture
def table(tmp_path: Path) -> MetadataTable:
    return MetadataTable.create_if_missing(str(tmp_path / "metadata"))


def _tier(table: MetadataTable) -> RemoteTier:
    """The metadata process's view: the table, and a store its requests here never touch (no copy overlaps)."""
    return RemoteTier.of(table, open_store(str(Path(table.table_uri).parent)))


def broker_add(table: MetadataTable, start: int, end: int, *, leader_epoch: int = 0) -> str:
    """The broker's addRemoteLogSegmentMetadata of [start, end] (COPY_SEGMENT_STARTED); the new segment id."""
    sid = new_kafka_uuid()
    add(_tier(table), {"topic": TOPIC, "partition": 0, "topic_id": TOPIC_ID, "broker_id": 1, "segment_id": sid,
                "start_offset": start, "end_offset": end, "max_timestamp_ms": NOW, "event_timestamp_ms": NOW,
                "segment_size_bytes": 100, "txn_index_empty": True, "leader_epochs": [[leader_epoch, start]]})
    return sid


def broker_finish(table: MetadataTable, sid: str) -> None:
    update(_tier(table), {"topic": TOPIC, "partition": 0, "topic_id": TOPIC_ID, "broker_id": 1, "segment_id": sid,
                   "state": SegmentState.COPY_SEGMENT_FINISHED.value, "event_timestamp_ms": NOW,
                   "transactional": False})


def broker_tiers(table: MetadataTable, *ranges: tuple[int, int]) -> list[str]:
    ids = [broker_add(table, a, b) for a, b in ranges]
    for sid in ids:
        broker_finish(table, sid)
    return ids


def live(table: MetadataTable) -> list[tuple[int, int, str]]:
    return [(s.start_offset, s.end_offset, s.writer) for s in table.live_segments(TOPIC, 0)]


def before_each_write(monkeypatch: pytest.MonkeyPatch, action: Callable[[int], object]) -> None:
    """Run `action(n)` before the n-th write of a commit (n from 1), after the commit read the partition: the race
    the commit's conflict check decides."""
    real, calls = batch_module.overwrite_partitions, [0]

    def racing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        monkeypatch.setattr(batch_module, "overwrite_partitions", real)  # the action's own commits write plainly
        try:
            action(calls[0])
        finally:
            monkeypatch.setattr(batch_module, "overwrite_partitions", racing)
        return real(*args, **kwargs)

    monkeypatch.setattr(batch_module, "overwrite_partitions", racing)


def test_a_compaction_lands_over_a_new_leaders_superseded_copy(table: MetadataTable) -> None:
    """Issue 40: the leader dies between a compaction's stage and its commit; its successor's first copy [150, 299]
    overlaps the tier, so at its finish it is superseded (DELETE_SEGMENT_STARTED) and its part above the tier's end
    goes live as a row of its own. The superseded row lies below the compaction's range but never served a reader:
    the compaction rebases over it and lands, where it was refused as a conflict."""
    a, b = broker_tiers(table, (0, 99), (100, 199))
    cs, _ = compaction(table, [a, b], (0, 199), cleaner_offset=200)
    copy = broker_add(table, 150, 299, leader_epoch=1)
    trimmed = factories.new_segment(200, 299, topic=TOPIC, leader_epoch=1)
    commit_module.commit_current(table, TopicPartition(TOPIC, 0), NOW, lambda current: ChangeSet.planned_from(
        current, fencing_epoch=current.fencing_epoch, writer="broker-2", new_segments=[trimmed],
        state_changes=[StateChange(copy, SegmentState.DELETE_SEGMENT_STARTED)]))

    commit(table, cs, NOW)

    assert live(table) == [(0, 199, "kcompact"), (200, 299, "broker-2")]
    assert table.partition_snapshot(TOPIC, 0).lineage.current == 200


def test_a_compaction_lands_over_segments_the_broker_tiered_since_it_planned(table: MetadataTable) -> None:
    a, b = broker_tiers(table, (0, 99), (100, 199))
    uploading = broker_add(table, 200, 299)  # being copied when the compaction plans: nothing reads it
    cs, merged = compaction(table, [a, b], (0, 199), cleaner_offset=200)
    broker_finish(table, uploading)
    broker_tiers(table, (300, 399))
    planned_seq = cs.expected_commit_seq

    result = commit(table, cs, NOW)

    assert live(table) == [(0, 199, "kcompact"), (200, 299, "broker-1"), (300, 399, "broker-1")]
    p = table.partition_snapshot(TOPIC, 0)
    assert p.commit_seq == result.commit_seq == planned_seq + 4
    assert p.lineage.current == 200
    assert p.segment(merged.segment_id).state is SegmentState.COPY_SEGMENT_FINISHED  # type: ignore[union-attr]
    assert [(e.epoch, e.start_offset) for e in p.state.leader_epochs] == [(0, 0)]  # type: ignore[union-attr]


def test_a_tiering_commit_between_the_read_and_the_write_is_rebased_over(
    table: MetadataTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = broker_tiers(table, (0, 99), (100, 199))
    cs, _ = compaction(table, [a, b], (0, 199), cleaner_offset=200)
    before_each_write(monkeypatch, lambda n: broker_tiers(table, (200, 299)) if n == 1 else None)
    commit(table, cs, NOW)
    assert live(table) == [(0, 199, "kcompact"), (200, 299, "broker-1")]


def test_appends_winning_every_race_end_in_the_conflict(table: MetadataTable, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = broker_tiers(table, (0, 99), (100, 199))
    cs, _ = compaction(table, [a, b], (0, 199), cleaner_offset=200)
    before_each_write(monkeypatch, lambda n: broker_tiers(table, (100 + 100 * n, 199 + 100 * n)))
    with pytest.raises(CommitConflictError, match="expected no commit to the partition after table version"):
        commit(table, cs, NOW)
    assert live(table)[:2] == [(0, 99, "broker-1"), (100, 199, "broker-1")]
    assert len(live(table)) == 2 + commit_module.REBASE_ATTEMPTS


@pytest.mark.parametrize("change", ["another compaction", "a row in the range", "a row added in the range"])
def test_any_other_change_since_the_plan_is_still_a_conflict(table: MetadataTable, change: str) -> None:
    a, b, c = broker_tiers(table, (0, 99), (100, 199), (200, 299))
    cs, merged = compaction(table, [a, b], (0, 199), cleaner_offset=200)
    if change == "another compaction":  # a row it reads is replaced, and the cleaner offset moves
        commit(table, compaction(table, [c], (200, 299), cleaner_offset=300)[0], NOW)
        found = "cleaner offsets"
    elif change == "a row in the range":
        commit(table, ChangeSet.planned_from(table.partition_snapshot(TOPIC, 0), fencing_epoch=0, writer="gc",
                                             state_changes=[StateChange(a, SegmentState.DELETE_SEGMENT_STARTED)]),
               NOW)
        found = f"segment {a} [0, 99] COPY_SEGMENT_FINISHED became DELETE_SEGMENT_STARTED"
    else:  # an upload of offsets the compaction rewrites
        broker_add(table, 150, 160)
        found = "[150, 160] COPY_SEGMENT_STARTED was added by 'broker-1'"
    with pytest.raises(CommitConflictError, match="expected commit_seq") as refused:
        commit(table, cs, NOW)
    assert found in str(refused.value) and "above offset 199" in str(refused.value)
    assert table.partition_snapshot(TOPIC, 0).segment(merged.segment_id) is None


def test_a_replay_of_a_landed_compaction_is_still_refused(table: MetadataTable) -> None:
    a, b = broker_tiers(table, (0, 99), (100, 199))
    cs, _ = compaction(table, [a, b], (0, 199), cleaner_offset=200)
    commit(table, cs, NOW)
    broker_tiers(table, (200, 299))
    with pytest.raises(CommitConflictError, match=r"cleaner offsets \(epoch, offset\) \[\] became \[\(0, 200\)\]"):
        commit(table, cs, NOW)


def test_a_change_set_without_segment_rows_is_never_rebased(table: MetadataTable) -> None:
    """Only the partition row changes (the cleaner offset where it already is): after it landed, nothing but
    commit_seq tells its landing from an append, so a replay (a lost reply retried) must not land twice."""
    broker_tiers(table, (0, 99))
    cs = ChangeSet.planned_from(table.partition_snapshot(TOPIC, 0), fencing_epoch=0, writer="kcompact",
                                cleaner_offset=0)
    landed = commit(table, cs, NOW)
    with pytest.raises(CommitConflictError, match="changes no segment row"):
        commit(table, cs, NOW)
    assert table.partition_snapshot(TOPIC, 0).commit_seq == landed.commit_seq


def test_a_zombie_compaction_is_fenced_even_when_only_the_broker_wrote_since(table: MetadataTable) -> None:
    """The zombie planned under its epoch; a new run took the partition, and the broker tiered meanwhile. The
    rebase never applies across a fencing epoch: the zombie is refused, wherever the race puts its commit."""
    a, b = broker_tiers(table, (0, 99), (100, 199))
    zombie_epoch = acquire_fencing_epoch(table, TOPIC, 0, "run A", NOW)
    zombie, merged = compaction(table, [a, b], (0, 199), cleaner_offset=200, epoch=zombie_epoch)
    owner_epoch = acquire_fencing_epoch(table, TOPIC, 0, "run B", NOW)
    broker_tiers(table, (200, 299))
    with pytest.raises(FencedError, match=f"expected fencing epoch {zombie_epoch}, found {owner_epoch}"):
        commit(table, zombie, NOW)
    assert table.partition_snapshot(TOPIC, 0).segment(merged.segment_id) is None
    assert [r[:2] for r in live(table)] == [(0, 99), (100, 199), (200, 299)]
