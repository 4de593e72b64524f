"""Many partitions in one Delta commit, each still checked alone (`compaction.metadata.batch`), on a local directory.

What delta-rs's conflict checker does with a batch's predicate (`topic = 't' AND partition IN (...)`, ORed across
topics): a commit to a partition outside the batch, landing between the batch's read and its write, does not conflict;
one to a partition in it does, and costs only that partition: it is checked again (refused, rebased or planned
again) and the others land in the batch's next write. A zombie's epoch refuses the partitions a newer run took and
no other; a store that keeps refusing one partition's files fails that partition alone. Races are made deterministic
by running the concurrent commit inside the batch's write (`delta_log.overwrite_partitions`), after its read.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from compaction.errors import CommitConflictError, FencedError, TransientStoreError
from compaction.metadata import (
    ChangeSet,
    CommitResult,
    MetadataTable,
    NewSegment,
    PartitionSnapshot,
    SegmentState,
    StateChange,
    TopicPartition,
    acquire_fencing_epoch,
    acquire_fencing_epochs,
    commit,
    commit_batch,
    commit_current,
    commit_current_batch,
)
from compaction.metadata.batch import partitions_predicate
from tests.factories import TOPIC_ID, new_segment

batch_module = importlib.import_module("compaction.metadata.batch")

TOPIC, OTHER, NOW = "orders", "payments", 1_700_000_000_000


@pytest.fixture
def table(tmp_path: Path) -> MetadataTable:
    return MetadataTable.create_if_missing(str(tmp_path / "metadata"))


def tp(partition: int, topic: str = TOPIC) -> TopicPartition:
    return TopicPartition(topic, partition)


def segments(p: TopicPartition, *ranges: tuple[int, int]) -> list[NewSegment]:
    return [new_segment(a, b, topic=p.topic, partition=p.partition, max_ts=NOW) for a, b in ranges]


def tier(table: MetadataTable, partitions: Iterable[TopicPartition], *ranges: tuple[int, int]) -> None:
    """Segments `ranges` live in every partition, in one commit."""
    commit_batch(table, [ChangeSet.planned_from(table.partition_snapshot(*p), fencing_epoch=0, writer="tier",
                                                new_segments=segments(p, *ranges), topic_id=TOPIC_ID)
                         for p in partitions], NOW)


def swap(snapshot: PartitionSnapshot, epoch: int, writer: str = "run") -> ChangeSet:
    """A compaction of the partition's live segments into one, under `epoch`."""
    live = snapshot.live_segments
    merged = new_segment(live[0].start_offset, live[-1].end_offset, topic=snapshot.topic,
                         partition=snapshot.partition, max_ts=NOW)
    return ChangeSet.planned_from(snapshot, fencing_epoch=epoch, writer=writer, new_segments=[merged],
                                  cleaner_offset=live[-1].end_offset + 1,
                                  state_changes=[StateChange(s.segment_id, SegmentState.DELETE_SEGMENT_STARTED)
                                                 for s in live])


def commits_after(table: MetadataTable, version: int) -> list[dict[str, Any]]:
    """The Delta commits after `version`, oldest first (the table's history)."""
    return sorted((h for h in DeltaTable(table.table_uri).history() if h["version"] > version),
                  key=lambda h: h["version"])


def unnamed_data_files(table: MetadataTable) -> set[str]:
    """Data files in the table's directory that no commit of its log adds."""
    root = Path(table.table_uri.removeprefix("file://"))
    named = {json.loads(line)["add"]["path"] for log in (root / "_delta_log").glob("*.json")
             for line in log.read_text().splitlines() if line.startswith('{"add"')}
    return {str(f.relative_to(root)) for f in root.glob("topic=*/partition=*/*.parquet")} - named


def before_each_write(monkeypatch: pytest.MonkeyPatch, action: Callable[[int], object]) -> list[int]:
    """Run `action(n)` before the n-th batch write, after the batch read its partitions; returns the list the number
    of rows of each write is appended to."""
    real, sizes = batch_module.overwrite_partitions, []

    def racing(*args: Any) -> Any:
        sizes.append(sum(len(rows) for rows in args[3].values()))
        monkeypatch.setattr(batch_module, "overwrite_partitions", real)  # the action's own commits write plainly
        try:
            action(len(sizes))
        finally:
            monkeypatch.setattr(batch_module, "overwrite_partitions", racing)
        return real(*args)

    monkeypatch.setattr(batch_module, "overwrite_partitions", racing)
    return sizes


def test_the_predicate_names_exactly_the_batch() -> None:
    assert partitions_predicate([tp(3)]) == "topic = 'orders' AND partition = 3"
    assert partitions_predicate([tp(3), tp(0), tp(3)]) == "topic = 'orders' AND partition IN (0, 3)"
    assert partitions_predicate([tp(1), tp(0, OTHER), tp(0)]) == (
        "(topic = 'orders' AND partition IN (0, 1)) OR (topic = 'payments' AND partition = 0)")


def test_acquiring_many_partitions_is_one_commit_and_returns_what_it_wrote(table: MetadataTable) -> None:
    partitions = [tp(p) for p in range(6)] + [tp(0, OTHER)]
    tier(table, partitions[:3], (0, 99))
    before = table.version()
    acquired = acquire_fencing_epochs(table, partitions, "run", NOW, topic_ids=dict.fromkeys(partitions, TOPIC_ID))
    assert table.version() == before + 1
    assert [h["operationParameters"]["predicate"] for h in commits_after(table, before)] == [
        "(topic = 'orders' AND partition IN (0, 1, 2, 3, 4, 5)) OR (topic = 'payments' AND partition = 0)"]
    fresh = table.partition_snapshots(partitions)
    assert acquired == fresh
    assert {p: s.fencing_epoch for p, s in acquired.items()} == dict.fromkeys(partitions, 1)  # type: ignore[union-attr]
    again = acquire_fencing_epochs(table, partitions[:2], "run 2", NOW)
    assert {p: s.fencing_epoch for p, s in again.items()} == dict.fromkeys(partitions[:2], 2)  # type: ignore[union-attr]


def test_a_commit_outside_the_batch_does_not_conflict(table: MetadataTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit to a partition the batch does not name, to one of another topic with the same number, and one that
    creates a partition, all between the batch's read and its write: the batch lands in its first write."""
    batch = [tp(0), tp(1), tp(2)]
    tier(table, [*batch, tp(3), tp(1, OTHER)], (0, 99))
    changes = [swap(table.partition_snapshot(*p), 0) for p in batch]

    def elsewhere(n: int) -> None:
        tier(table, [tp(3)], (100, 199))
        tier(table, [tp(1, OTHER)], (100, 199))
        tier(table, [tp(7)], (0, 9))

    sizes = before_each_write(monkeypatch, elsewhere)
    results = commit_batch(table, changes, NOW)
    assert len(sizes) == 1, "one write: nothing conflicted"
    assert all(isinstance(r, CommitResult) for r in results.values()), results
    assert len({r.version for r in results.values()}) == 1  # type: ignore[union-attr]


def test_a_batch_loses_only_the_partitions_a_concurrent_commit_touched(
    table: MetadataTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the batch's read and its write, retention expires a segment of partition 1 (a row the swap replaces)
    and a broker appends to partition 2 (above everything its swap touches). The write lands partitions 0 and 3 and
    drops 1 and 2 (their data files deleted again, the commit's predicate without them); partition 1 is then refused
    with the conflict, partition 2 is rebased over the append and lands alone in the next write."""
    batch = [tp(p) for p in range(4)]
    tier(table, batch, (0, 99), (100, 199))
    changes = [swap(table.partition_snapshot(*p), 0) for p in batch]
    expired = table.partition_snapshot(*tp(1)).live_segments[0].segment_id

    def concurrently(n: int) -> None:
        if n == 1:
            commit_current(table, tp(1), NOW, lambda current: ChangeSet.planned_from(
                current, fencing_epoch=current.fencing_epoch, writer="kcompact-retention@test",
                state_changes=[StateChange(expired, SegmentState.DELETE_SEGMENT_STARTED)]))
            tier(table, [tp(2)], (200, 299))

    before = table.version()
    sizes = before_each_write(monkeypatch, concurrently)
    results = commit_batch(table, changes, NOW)

    assert sizes == [16, 5], "4 partitions' rows, then partition 2's alone (its state, 2 segments replaced, the " \
        "merged one and the appended one)"
    refused = results.pop(tp(1))
    assert isinstance(refused, CommitConflictError), refused
    assert "orders-1: expected commit_seq" in str(refused) and f"segment {expired}" in str(refused)
    assert {p: r.version for p, r in results.items()} == {  # type: ignore[union-attr]
        tp(0): before + 3, tp(2): before + 4, tp(3): before + 3}
    first = commits_after(table, before + 2)[0]
    assert first["operationParameters"]["predicate"] == "topic = 'orders' AND partition IN (0, 3)"
    assert first["kcompact.partitions"] == "2"
    assert unnamed_data_files(table) == set(), "the dropped partitions' data files are deleted again"
    assert [(s.start_offset, s.end_offset) for s in table.live_segments(*tp(2))] == [(0, 199), (200, 299)]
    assert [(s.start_offset, s.end_offset) for s in table.live_segments(*tp(1))] == [(100, 199)]
    for p in (tp(0), tp(3)):
        assert [(s.start_offset, s.end_offset, s.writer) for s in table.live_segments(*p)] == [(0, 199, "run")]


def test_a_zombie_is_fenced_only_on_the_partitions_a_newer_run_took(table: MetadataTable) -> None:
    batch = [tp(p) for p in range(4)]
    tier(table, batch, (0, 99), (100, 199))
    zombie = acquire_fencing_epochs(table, batch, "run A", NOW)
    changes = [swap(s, s.fencing_epoch, "run A") for s in zombie.values()]  # type: ignore[union-attr]
    newer = acquire_fencing_epochs(table, [tp(0), tp(2)], "run B", NOW)  # what a newer run's stage does first
    before = table.version()

    results = commit_batch(table, changes, NOW)

    assert table.version() == before + 1, "the partitions left to the zombie land in one commit"
    for p in (tp(0), tp(2)):
        fenced = results[p]
        assert isinstance(fenced, FencedError)
        assert str(fenced).startswith(f"{p.topic}-{p.partition}: expected fencing epoch 1, found 2")
        assert newer[p].fencing_epoch == 2  # type: ignore[union-attr]
        assert [s.writer for s in table.live_segments(*p)] == ["tier", "tier"], "nothing of the zombie landed"
    for p in (tp(1), tp(3)):
        assert results[p] == CommitResult(p.topic, p.partition, before + 1, 3, 1)
        assert [s.writer for s in table.live_segments(*p)] == ["run A"]


def test_a_partition_that_keeps_losing_fails_alone(table: MetadataTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention, planned again on the latest rows (`commit_current_batch`), while a broker appends to partition 0
    before every write: partition 0 runs out of attempts; the others, never charged for its conflicts, land."""
    batch = [tp(p) for p in range(3)]
    tier(table, batch, (0, 99))

    def expiry(current: PartitionSnapshot) -> ChangeSet | None:
        live = [s for s in current.live_segments if s.end_offset < 100]
        return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer="retention",
                                      state_changes=[StateChange(s.segment_id, SegmentState.DELETE_SEGMENT_STARTED)
                                                     for s in live]) if live else None

    sizes = before_each_write(monkeypatch, lambda n: tier(table, [tp(0)], (100 * n, 100 * n + 99)))
    outcomes = commit_current_batch(table, dict.fromkeys(batch, expiry), NOW, attempts=3)
    assert isinstance(outcomes[tp(0)], CommitConflictError), outcomes
    assert "orders-0: expected no commit to the partition after table version" in str(outcomes[tp(0)])
    assert sizes == [6, 3, 4], "the first write lands 1 and 2 without 0, which alone loses twice more (growing)"
    landed = {p: o for p, o in outcomes.items() if p != tp(0)}
    assert all(isinstance(o, CommitResult) for o in landed.values()), landed
    assert all(table.live_segments(*p) == () for p in landed)


def test_a_partition_whose_files_the_store_refuses_fails_alone(
    table: MetadataTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A throttled prefix: every write holding partition 5's rows fails after delta-rs's retries. The batch is halved
    until partition 5 is alone; every other partition lands, in a few commits."""
    batch = [tp(p) for p in range(8)]
    real, writes = batch_module._write, []

    def throttled(reader: Any, dt: Any, base: int, rows: Any, checkpoint: bool) -> Any:
        writes.append([TopicPartition(r.state.topic, r.state.partition) for r in rows])
        if tp(5) in writes[-1]:
            raise TransientStoreError("orders-5: writing the metadata commit failed (simulated: SlowDown)")
        return real(reader, dt, base, rows, checkpoint)

    monkeypatch.setattr(batch_module, "_write", throttled)
    acquired = acquire_fencing_epochs(table, batch, "run", NOW, topic_ids=dict.fromkeys(batch, TOPIC_ID))
    assert isinstance(acquired.pop(tp(5)), TransientStoreError)
    assert all(isinstance(s, PartitionSnapshot) and s.fencing_epoch == 1 for s in acquired.values()), acquired
    assert not table.partition_snapshot(*tp(5)).exists
    assert [len(w) for w in writes] == [8, 4, 4, 2, 2, 1, 1], writes  # halving: 0-3 | 4-7, 4-5 | 6-7, 4 | 5


def test_a_failing_store_stops_after_both_halves_fail(table: MetadataTable, monkeypatch: pytest.MonkeyPatch) -> None:
    writes = []

    def down(reader: Any, dt: Any, base: int, rows: Any, checkpoint: bool) -> Any:
        writes.append(len(rows))
        raise TransientStoreError("simulated: the store is down")

    monkeypatch.setattr(batch_module, "_write", down)
    batch = [tp(p) for p in range(8)]
    acquired = acquire_fencing_epochs(table, batch, "run", NOW, topic_ids=dict.fromkeys(batch, TOPIC_ID))
    assert all(isinstance(o, TransientStoreError) for o in acquired.values()) and len(acquired) == 8
    assert writes == [8, 4, 4]


def test_racing_batches_that_share_a_partition_both_land(table: MetadataTable, monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Two runs acquire overlapping partitions at the same instant: one write wins, the other is checked again on the
    shared partition and lands on top (the later epoch wins there); no partition of either is lost."""
    tier(table, [tp(p) for p in range(4)], (0, 99))
    barrier, real = threading.Barrier(2, timeout=30), batch_module.overwrite_partitions
    gated = iter(range(2))

    def first_writes_wait(*args: Any, **kwargs: Any) -> Any:
        if next(gated, None) is not None:
            barrier.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(batch_module, "overwrite_partitions", first_writes_wait)
    results: list[Any] = [None, None]
    runs = [[tp(0), tp(1), tp(2)], [tp(2), tp(3)]]

    def acquire(i: int) -> None:
        results[i] = acquire_fencing_epochs(table, runs[i], f"run {i}", NOW)

    threads = [threading.Thread(target=acquire, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(s, PartitionSnapshot) for r in results for s in r.values()), results
    assert sorted(r[tp(2)].fencing_epoch for r in results) == [1, 2]
    assert {p: s.fencing_epoch for p, s in table.partition_snapshots([tp(p) for p in range(4)]).items()} == {
        tp(0): 1, tp(1): 1, tp(2): 2, tp(3): 1}


def test_one_partition_commits_as_before(table: MetadataTable) -> None:
    """A batch of one is written with the one-partition predicate and metadata a reader of the log already knows."""
    tier(table, [tp(0)], (0, 99))
    epoch = acquire_fencing_epoch(table, TOPIC, 0, "run", NOW)
    before = table.version()
    commit(table, swap(table.partition_snapshot(*tp(0)), epoch), NOW)
    (entry,) = commits_after(table, before)
    assert entry["operationParameters"]["predicate"] == "topic = 'orders' AND partition = 0"
    assert (entry["kcompact.partition"], entry["kcompact.fencing_epoch"], entry["kcompact.partitions"]) == (
        "orders-0", "1", "1")


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the partitions each read of the table's files asked for (`batch.load_partitions`)."""
    real, reads = batch_module.load_partitions, []

    def counting(dt: Any, partitions: Iterable[TopicPartition], *args: Any) -> Any:
        wanted = list(partitions)
        reads.append(len(wanted))
        return real(dt, wanted, *args)

    monkeypatch.setattr(batch_module, "load_partitions", counting)
    return reads


def test_rows_already_read_are_reused_while_the_table_is_at_their_version(
        table: MetadataTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's plan read the table; its acquire, then its swap, go through one `known_reader`: neither reads the
    partitions' files again, since each commit is the next version and changed only its own partitions. The rows
    landed are those a fresh read gives."""
    batch = [tp(p) for p in range(3)]
    tier(table, [*batch, tp(3)], (0, 99), (100, 199))
    reader = batch_module.known_reader(table, table.partition_snapshots([*batch, tp(3)]))
    reads = counted_reads(monkeypatch)

    acquired = acquire_fencing_epochs(table, batch, "run", NOW, reader=reader)
    results = commit_batch(table, [swap(s, s.fencing_epoch) for s in acquired.values()],  # type: ignore[union-attr]
                           NOW, reader=reader)

    assert reads == [], "no partition's file read again"
    assert {r.version for r in results.values()} == {acquired[tp(0)].version + 1}  # type: ignore[union-attr]
    fresh = table.partition_snapshots([*batch, tp(3)])
    assert reader.read([*batch, tp(3)])[1] == fresh and reads == []
    for p in batch:
        assert [(s.start_offset, s.end_offset, s.writer) for s in fresh[p].live_segments] == [(0, 199, "run")]


def test_rows_already_read_are_read_again_after_another_commit(
        table: MetadataTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the rows were read, a broker appends to partition 1 (one of the batch), then a tier run to partition 7
    (not one of them): the retention planned on the latest rows sees the append (the rows held are stale, the
    table's version tells), and what the reader holds after is what the table holds."""
    batch = [tp(p) for p in range(3)]
    tier(table, batch, (0, 99))
    reader = batch_module.known_reader(table, table.partition_snapshots(batch))
    tier(table, [tp(1)], (100, 199))
    tier(table, [tp(7)], (0, 9))
    reads = counted_reads(monkeypatch)

    def expire_first(current: PartitionSnapshot) -> ChangeSet:
        first = current.live_segments[0]
        return ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer="retention",
                                      state_changes=[StateChange(first.segment_id,
                                                                 SegmentState.DELETE_SEGMENT_STARTED)])

    results = commit_current_batch(table, dict.fromkeys(batch, expire_first), NOW, reader=reader)
    assert reads == [3], "the batch read again, once"
    assert all(isinstance(r, CommitResult) for r in results.values()), results
    assert [(s.start_offset, s.end_offset) for s in table.live_segments(*tp(1))] == [(100, 199)], "append kept"
    assert reader.read(batch)[1] == table.partition_snapshots(batch)
    tier(table, [tp(7)], (10, 19))  # another commit: the rows held are read again
    reads.clear()
    assert reader.read(batch)[1] == table.partition_snapshots(batch) and reads == [3]
