"""The metadata table on a local directory: plain Delta, atomic and fenced commits, time travel.

Races are made deterministic by wrapping `overwrite_partitions` in `compaction.metadata.batch`: every
committer has loaded the partition and passed its preconditions before any of them writes, so only
delta-rs's own conflict check can decide the winner.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable, write_deltalake

from compaction.errors import (
    CommitConflictError,
    FencedError,
    InvalidStateTransitionError,
    MetadataSchemaError,
    MetadataTableNotFoundError,
    MetadataVersionNotFoundError,
    TopicIdMismatchError,
)
from compaction.metadata import (
    ChangeSet,
    CleanerOffset,
    MetadataTable,
    NewSegment,
    ObjectSuffix,
    SegmentState,
    StateChange,
    acquire_fencing_epoch,
    commit,
    mark_deleted_finished,
    new_kafka_uuid,
    record_tier_finished,
    referenced_object_keys,
)
from compaction.metadata import model as model_module
from compaction.metadata.model import LEGACY_METADATA_SCHEMA, METADATA_SCHEMA, PARTITION_COLUMNS, rows_to_arrow
from compaction.metadata.table import LOG_CONFIGURATION, table_in_store
from compaction.storage import ObjectStore
from tests import factories
from tests.factories import TOPIC_ID, new_segment

# The package re-exports the function `commit`, which shadows the submodule's attribute on the package.
commit_module = importlib.import_module("compaction.metadata.commit")
batch_module = importlib.import_module("compaction.metadata.batch")  # where every commit's write goes

TOPIC, NOW = "orders", 1_700_000_000_000
compaction = partial(factories.compaction, topic=TOPIC, max_ts=NOW - 1)

DOCUMENTED_COLUMNS = [
    "row_kind", "topic", "partition", "topic_id", "writer", "run_id", "fencing_epoch", "cleaner_offsets",
    "segment_id", "start_offset", "end_offset", "max_timestamp_ms", "first_batch_max_timestamp_ms",
    "event_timestamp_ms", "segment_leader_epochs", "segment_size_bytes", "record_count", "state",
    "object_keys", "commit_seq", "leader_epochs", "updated_ms", "transactional",
]  # fmt: skip


@pytest.fixture
def local_table(tmp_path: Path) -> MetadataTable:
    return MetadataTable.create_if_missing(str(tmp_path / "metadata"))


@pytest.fixture
def table(store: ObjectStore) -> MetadataTable:
    """The table inside each store backend in turn: local directory and S3 (moto, conditional PUT enforced)."""
    return table_in_store(store, create=True)


def new(start: int, end: int, state: SegmentState = SegmentState.COPY_SEGMENT_FINISHED) -> NewSegment:
    return new_segment(start, end, topic=TOPIC, max_ts=NOW - 1, leader_epoch=5, size=1_000, state=state,
                       suffixes=ObjectSuffix, record_count=end - start + 1)


def record_tier_started(table: MetadataTable, topic: str, partition: int, segments: list[NewSegment], *,
                        fencing_epoch: int, writer: str, now_ms: int, topic_id: str = TOPIC_ID) -> None:
    """Add `segments` in COPY_SEGMENT_STARTED, before their objects are uploaded (KIP-405's copy path)."""
    started = [replace(n, state=SegmentState.COPY_SEGMENT_STARTED) for n in segments]
    cs = ChangeSet.planned_from(table.partition_snapshot(topic, partition), fencing_epoch=fencing_epoch,
                                writer=writer, new_segments=started, topic_id=topic_id)
    commit(table, cs, now_ms)


def tier(table: MetadataTable, *ranges: tuple[int, int], partition: int = 0, epoch: int = 0) -> list[str]:
    """Upload-and-finish segments the way the tier command does; returns their ids."""
    segments = [new(a, b) for a, b in ranges]
    kw: dict[str, Any] = {"fencing_epoch": epoch, "writer": "kcompact tier@test", "now_ms": NOW}
    record_tier_started(table, TOPIC, partition, segments, topic_id=TOPIC_ID, **kw)
    record_tier_finished(table, TOPIC, partition, [s.segment_id for s in segments], **kw)
    return [s.segment_id for s in segments]


def live_ranges(table: MetadataTable, version: int | None = None, partition: int = 0) -> list[tuple[int, int]]:
    return [(s.start_offset, s.end_offset) for s in table.live_segments(TOPIC, partition, version)]


def all_segment_ids(table: MetadataTable) -> set[str]:
    return {s.segment_id for p in table.snapshot().partitions.values() for s in p.segments}


@pytest.fixture
def race(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[Callable[[], object]]], list[object]]:
    """Run callables in threads that all reach `overwrite_partitions` before any of them writes.

    Returns each callable's result or the exception it raised, in order.
    """

    def run(calls: list[Callable[[], object]]) -> list[object]:
        barrier = threading.Barrier(len(calls), timeout=30)
        real = batch_module.overwrite_partitions

        gated_calls = iter(range(len(calls)))  # only the first write of each caller waits (retries pass)

        def gated(*args: Any, **kwargs: Any) -> Any:
            if next(gated_calls, None) is not None:
                barrier.wait()
            return real(*args, **kwargs)

        monkeypatch.setattr(batch_module, "overwrite_partitions", gated)
        results: list[object] = [None] * len(calls)

        def target(i: int) -> None:
            try:
                results[i] = calls[i]()
            except Exception as e:
                results[i] = e

        threads = [threading.Thread(target=target, args=(i,)) for i in range(len(calls))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        monkeypatch.setattr(batch_module, "overwrite_partitions", real)
        return results

    return run


# --- the table as Delta sees it ----------------------------------------------------------------------


def test_table_is_plain_delta_with_the_documented_columns(local_table: MetadataTable) -> None:
    table = local_table
    tier(table, (0, 99))
    dt = DeltaTable(table.table_uri, storage_options=table.storage_options)
    assert dt.schema().to_arrow().names == DOCUMENTED_COLUMNS
    assert dt.metadata().partition_columns == ["topic", "partition"]
    protocol = dt.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert not protocol.reader_features and not protocol.writer_features
    assert all(f"| {c} |" in (model_module.__doc__ or "") for c in DOCUMENTED_COLUMNS)


def test_pyarrow_dataset_over_file_uris_reads_the_same_rows(local_table: MetadataTable) -> None:
    table = local_table
    tier(table, (0, 99), (100, 199))
    tier(table, (0, 49), partition=1)
    dt = DeltaTable(table.table_uri, storage_options=table.storage_options)
    partitioning = ds.partitioning(pa.schema([("topic", pa.string()), ("partition", pa.int32())]), flavor="hive")
    dataset = ds.dataset(
        dt.file_uris(), format="parquet", partitioning=partitioning, partition_base_dir=table.table_uri
    )
    via_files = dataset.to_table().select(DOCUMENTED_COLUMNS).to_pylist()
    via_delta = dt.to_pyarrow_table().to_pylist()

    def key(r: dict[str, Any]) -> tuple[str, int, str]:
        return (r["row_kind"], r["partition"], r["segment_id"] or "")

    assert sorted(via_files, key=key) == sorted(via_delta, key=key)
    assert len(via_delta) == 5


def test_the_table_checkpoints_every_10_versions(local_table: MetadataTable) -> None:
    """A read loads the last checkpoint and the commits after it: without one every 10 versions, each read of the
    broker's metadata process on S3 fetched every commit since the last (delta-rs's default interval is 100), and
    one tiered segment (two commits, each reading the table) took 4.4 s at version 80 on moto instead of ~1 s."""
    table = local_table
    for start in range(0, 600, 100):
        tier(table, (start, start + 99))
    assert table.version() >= 10
    log = Path(table.table_uri.removeprefix("file://")) / "_delta_log"
    assert (log / "00000000000000000009.checkpoint.parquet").is_file(), sorted(p.name for p in log.iterdir())


def test_open_refuses_missing_and_foreign_tables(tmp_path: Path) -> None:
    with pytest.raises(MetadataTableNotFoundError):
        MetadataTable.open(str(tmp_path / "nothing"))
    foreign = str(tmp_path / "foreign")
    write_deltalake(foreign, pa.table({"topic": ["x"], "partition": pa.array([0], pa.int32())}))
    with pytest.raises(MetadataSchemaError, match="not a kcompact metadata table"):
        MetadataTable.open(foreign)
    again = MetadataTable.create_if_missing(str(tmp_path / "metadata"))
    assert MetadataTable.create_if_missing(again.table_uri).version() == 0


@pytest.mark.parametrize("legacy", [False, True])
def test_a_table_created_before_the_transactional_column_is_read_and_written_as_it_is(
        tmp_path: Path, legacy: bool) -> None:
    """`transactional` (whether a segment holds a transactional or control batch) was added to a table kcompact
    already wrote: one created before it opens, reads the column as null (unknown) and takes commits without it,
    its schema unchanged; a new table keeps what each row says, null included."""
    uri = str(tmp_path / "metadata")
    if legacy:
        DeltaTable.create(uri, LEGACY_METADATA_SCHEMA, partition_by=list(PARTITION_COLUMNS),
                          configuration=dict(LOG_CONFIGURATION))
    table = MetadataTable.create_if_missing(uri)
    flags = [True, False, None]
    segments = [replace(new(100 * i, 100 * i + 99), transactional=t) for i, t in enumerate(flags)]
    kw: dict[str, Any] = {"fencing_epoch": 0, "writer": "kcompact tier@test", "now_ms": NOW}
    record_tier_started(table, TOPIC, 0, segments, **kw)
    record_tier_finished(table, TOPIC, 0, [s.segment_id for s in segments], **kw)
    read = [s.transactional for s in MetadataTable.open(uri).live_segments(TOPIC, 0)]
    assert read == ([None] * 3 if legacy else flags)
    found = pa.schema(DeltaTable(uri).schema().to_arrow())
    assert found.equals(LEGACY_METADATA_SCHEMA if legacy else METADATA_SCHEMA)


# --- commits -----------------------------------------------------------------------------------------


def test_compaction_swaps_segments_in_one_commit(table: MetadataTable) -> None:
    a, b, _ = tier(table, (0, 99), (100, 199), (200, 299))
    before = table.version()
    cs, merged = compaction(table, [a, b], (0, 199), epoch=0, cleaner_offset=200)
    result = commit(table, cs, NOW + 5)
    assert result.version == before + 1 == table.version()
    assert live_ranges(table) == [(0, 199), (200, 299)]
    p = table.partition_snapshot(TOPIC, 0)
    assert p.commit_seq == result.commit_seq == 3
    assert p.segment(a).state is p.segment(b).state is SegmentState.DELETE_SEGMENT_STARTED  # type: ignore[union-attr]
    assert p.segment(merged.segment_id).cleaner_offsets == (CleanerOffset(0, 200),)  # type: ignore[union-attr]
    assert p.lineage.current == 200
    if table.table_uri.startswith("s3://"):
        return  # delta-rs' history() listing hangs against moto (a list with start-after times out after 180 s)
    history = DeltaTable(table.table_uri).history(1)[0]
    assert history["kcompact.commit_seq"] == "3" and history["operationParameters"]["mode"] == "Overwrite"


def test_commit_lands_whole_or_not_at_all(table: MetadataTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """The new row set's data files are written and the commit file is not (the process dies creating it): no
    version, no partial rows."""
    a, b = tier(table, (0, 99), (100, 199))
    delta = DeltaTable(table.table_uri, storage_options=table.storage_options)
    before, files_before = table.version(), set(delta.file_uris())
    cs, merged = compaction(table, [a, b], (0, 199), epoch=0, cleaner_offset=200)
    real = batch_module.overwrite_partitions

    class CrashingStore:
        """The table's store, but the process dies as it creates the commit file: its data files are written."""

        def __init__(self, store: Any) -> None:
            self.store = store

        def __getattr__(self, name: str) -> Any:
            return getattr(self.store, name)

        def put(self, key: str, data: bytes) -> None:
            if key.startswith("_delta_log/"):
                raise OSError("simulated crash in the middle of writing the commit")
            self.store.put(key, data)

        def put_then(self, objects: Any, key: str, data: bytes) -> None:
            self.store.put_many(objects)
            self.put(key, data)

    def failing(dt: DeltaTable, base: int, store: Any, *rest: Any) -> Any:
        return real(dt, base, CrashingStore(store), *rest)

    monkeypatch.setattr(batch_module, "overwrite_partitions", failing)
    with pytest.raises(Exception, match="simulated crash"):
        commit(table, cs, NOW)
    monkeypatch.setattr(batch_module, "overwrite_partitions", real)
    assert table.version() == before
    assert set(DeltaTable(table.table_uri, storage_options=table.storage_options).file_uris()) == files_before
    assert live_ranges(table) == [(0, 99), (100, 199)] and merged.segment_id not in all_segment_ids(table)
    commit(table, cs, NOW)  # the same change set still applies: nothing of the failed attempt counts
    assert live_ranges(table) == [(0, 199)]


def test_concurrent_commits_on_one_partition_exactly_one_wins(table: MetadataTable, race: Any) -> None:
    a, b = tier(table, (0, 99), (100, 199))
    plans = [compaction(table, [a, b], (0, 199), epoch=0, cleaner_offset=200) for _ in range(2)]
    results = race([lambda cs=cs: commit(table, cs, NOW) for cs, _ in plans])
    wins = [r for r in results if isinstance(r, commit_module.CommitResult)]
    losses = [r for r in results if isinstance(r, CommitConflictError)]
    assert len(wins) == 1 and len(losses) == 1, results
    assert "expected no commit to the partition after table version" in str(losses[0])
    winner = plans[results.index(wins[0])][1]
    loser = plans[results.index(losses[0])][1]
    assert table.live_segments(TOPIC, 0)[0].segment_id == winner.segment_id
    assert loser.segment_id not in all_segment_ids(table)
    assert table.partition_snapshot(TOPIC, 0).commit_seq == 3


def test_stale_plan_and_replay_are_refused_by_commit_seq(table: MetadataTable) -> None:
    a, b = tier(table, (0, 99), (100, 199))
    first, _ = compaction(table, [a], (0, 99), epoch=0, cleaner_offset=100)
    second, _ = compaction(table, [b], (100, 199), epoch=0, cleaner_offset=200)
    commit(table, first, NOW)
    with pytest.raises(CommitConflictError, match="expected commit_seq 2, found 3"):
        commit(table, second, NOW)
    with pytest.raises(CommitConflictError, match="expected commit_seq 2, found 3"):
        commit(table, first, NOW)


def test_commits_on_different_partitions_do_not_conflict(table: MetadataTable, race: Any) -> None:
    other_topic = "payments"
    for p in (0, 1):
        tier(table, (0, 99), partition=p)

    def plan(topic: str, partition: int) -> ChangeSet:
        return ChangeSet.planned_from(
            table.partition_snapshot(topic, partition),
            fencing_epoch=0,
            writer="w",
            new_segments=[new(100, 199)],
            topic_id=TOPIC_ID,
        )

    plans = [plan(TOPIC, 0), plan(TOPIC, 1), plan(other_topic, 0)]
    results = race([lambda cs=cs: commit(table, cs, NOW) for cs in plans])
    assert all(isinstance(r, commit_module.CommitResult) for r in results), results
    assert live_ranges(table, partition=0) == live_ranges(table, partition=1) == [(0, 99), (100, 199)]
    assert [(s.start_offset, s.end_offset) for s in table.live_segments(other_topic, 0)] == [(100, 199)]


def test_concurrent_acquires_get_distinct_epochs(table: MetadataTable, race: Any) -> None:
    results: list[int] = race(
        [lambda w=w: acquire_fencing_epoch(table, TOPIC, 0, w, NOW, topic_id=TOPIC_ID) for w in ("a", "b")]
    )
    assert sorted(results) == [1, 2]
    assert table.partition_snapshot(TOPIC, 0).fencing_epoch == 2


# --- fencing: the zombie cases of docs/fencing.md ------------------------------------------------------


def _seed_start(table: MetadataTable) -> tuple[int, list[str]]:
    """Broker A holds the first epoch, has published seg-0 and cleaned up to 100."""
    epoch_a = acquire_fencing_epoch(table, TOPIC, 0, "broker A", NOW, topic_id=TOPIC_ID)
    ids = tier(table, (0, 99), (100, 199), (200, 299), epoch=epoch_a)
    cs, _ = compaction(table, [ids[0]], (0, 99), epoch=epoch_a, cleaner_offset=100)
    commit(table, cs, NOW)
    return epoch_a, ids


def test_zombie_commits_after_the_new_owner_and_is_fenced(table: MetadataTable) -> None:
    epoch_a, ids = _seed_start(table)
    zombie_cs, zombie_seg = compaction(table, [ids[1]], (100, 199), epoch=epoch_a, cleaner_offset=123)
    epoch_b = acquire_fencing_epoch(table, TOPIC, 0, "broker B", NOW)
    owner_cs, _ = compaction(table, [ids[1], ids[2]], (100, 299), epoch=epoch_b, cleaner_offset=155)
    commit(table, owner_cs, NOW)
    with pytest.raises(FencedError, match=f"expected fencing epoch {epoch_a}, found {epoch_b}"):
        commit(table, zombie_cs, NOW)
    p = table.partition_snapshot(TOPIC, 0)
    assert p.lineage.offsets == (CleanerOffset(epoch_a, 100), CleanerOffset(epoch_b, 155))
    assert zombie_seg.segment_id not in all_segment_ids(table)
    assert not {o.key for o in zombie_seg.object_keys} & referenced_object_keys(table.snapshot())


def test_zombie_commits_before_the_new_owner_and_is_fenced(table: MetadataTable) -> None:
    epoch_a, ids = _seed_start(table)
    zombie_cs, _ = compaction(table, [ids[1]], (100, 199), epoch=epoch_a, cleaner_offset=123)
    epoch_b = acquire_fencing_epoch(table, TOPIC, 0, "broker B", NOW)
    owner_cs, _ = compaction(table, [ids[1], ids[2]], (100, 299), epoch=epoch_b, cleaner_offset=155)
    with pytest.raises(FencedError):
        commit(table, zombie_cs, NOW)
    commit(table, owner_cs, NOW)
    assert live_ranges(table) == [(0, 99), (100, 299)]
    assert table.partition_snapshot(TOPIC, 0).lineage.current == 155


def test_zombie_that_replans_after_the_acquire_is_still_fenced(table: MetadataTable) -> None:
    epoch_a, ids = _seed_start(table)
    acquire_fencing_epoch(table, TOPIC, 0, "broker B", NOW)
    replanned, _ = compaction(table, [ids[1]], (100, 199), epoch=epoch_a, cleaner_offset=123)
    with pytest.raises(FencedError):
        commit(table, replanned, NOW)
    with pytest.raises(FencedError):
        record_tier_started(table, TOPIC, 0, [new(300, 399)], fencing_epoch=epoch_a, writer="A", now_ms=NOW)


def test_zombie_row_that_got_in_anyway_is_not_live(table: MetadataTable) -> None:
    """A row written around the commit path (a blind append) claiming CO 123 for the fenced epoch."""
    epoch_a, _ = _seed_start(table)
    epoch_b = acquire_fencing_epoch(table, TOPIC, 0, "broker B", NOW)
    honest = table.live_segments(TOPIC, 0)
    forged = model_module.SegmentMetadata(
        **{
            **honest[-1].__dict__,
            "segment_id": new_kafka_uuid(),
            "start_offset": 300,
            "end_offset": 399,
            "cleaner_offsets": (CleanerOffset(epoch_a, 123),),
        }
    )
    write_deltalake(table.delta_table(), rows_to_arrow([], [forged]), mode="append")
    p = table.partition_snapshot(TOPIC, 0)
    assert p.live_segments == honest
    assert [s.segment_id for s in p.zombie_segments] == [forged.segment_id]
    assert p.lineage.offsets == (CleanerOffset(epoch_a, 100), CleanerOffset(epoch_b, 100))
    record_tier_started(table, TOPIC, 0, [new(300, 399)], fencing_epoch=epoch_b, writer="B", now_ms=NOW)
    (started,) = (
        s for s in table.partition_snapshot(TOPIC, 0).segments if s.state is SegmentState.COPY_SEGMENT_STARTED
    )
    record_tier_finished(table, TOPIC, 0, [started.segment_id], fencing_epoch=epoch_b, writer="B", now_ms=NOW)
    assert live_ranges(table)[-1] == (300, 399)  # the zombie's range does not block the owner


# --- states, gc, time travel -------------------------------------------------------------------------


def test_tier_then_gc_walk_the_kafka_states(table: MetadataTable) -> None:
    (started,) = [new(0, 99)]
    record_tier_started(table, TOPIC, 0, [started], topic_id=TOPIC_ID, fencing_epoch=0, writer="t", now_ms=NOW)
    assert table.live_segments(TOPIC, 0) == ()
    record_tier_finished(table, TOPIC, 0, [started.segment_id], fencing_epoch=0, writer="t", now_ms=NOW)
    assert live_ranges(table) == [(0, 99)]
    cs, _ = compaction(table, [started.segment_id], (0, 99), epoch=0, cleaner_offset=100)
    commit(table, cs, NOW)
    with pytest.raises(InvalidStateTransitionError):  # 1 -> 3 skips DELETE_SEGMENT_STARTED
        mark_deleted_finished(table, [table.live_segments(TOPIC, 0)[0].segment_id], writer="gc", now_ms=NOW)
    (done,) = mark_deleted_finished(table, [started.segment_id], writer="gc", now_ms=NOW)
    seg = table.partition_snapshot(TOPIC, 0).segment(started.segment_id)
    assert seg is not None and seg.state is SegmentState.DELETE_SEGMENT_FINISHED and seg.writer == "gc"
    assert mark_deleted_finished(table, [started.segment_id], writer="gc", now_ms=NOW) == ()
    assert not {o.key for o in seg.object_keys} & referenced_object_keys(table.snapshot())
    assert done.version == table.version()


def test_invalid_transition_commits_nothing(table: MetadataTable) -> None:
    (sid,) = tier(table, (0, 99))
    before = table.version()
    back = ChangeSet.planned_from(
        table.partition_snapshot(TOPIC, 0),
        fencing_epoch=0,
        writer="w",
        state_changes=[StateChange(sid, SegmentState.COPY_SEGMENT_STARTED)],
    )
    with pytest.raises(InvalidStateTransitionError, match="COPY_SEGMENT_FINISHED -> COPY_SEGMENT_STARTED"):
        commit(table, back, NOW)
    assert table.version() == before


def test_time_travel_shows_the_earlier_live_set(table: MetadataTable) -> None:
    a, b = tier(table, (0, 99), (100, 199))
    v_before = table.version()
    cs, _ = compaction(table, [a, b], (0, 199), epoch=0, cleaner_offset=200)
    commit(table, cs, NOW)
    assert live_ranges(table) == [(0, 199)]
    assert live_ranges(table, version=v_before) == [(0, 99), (100, 199)]
    old = table.snapshot(v_before)
    assert old.version == v_before and old.partition(TOPIC, 0).commit_seq == 2
    assert table.snapshot(0).partitions == {}
    with pytest.raises(MetadataVersionNotFoundError):
        table.snapshot(v_before + 10)


def test_recreated_topic_is_refused(table: MetadataTable) -> None:
    tier(table, (0, 99))
    with pytest.raises(TopicIdMismatchError):
        acquire_fencing_epoch(table, TOPIC, 0, "w", NOW, topic_id="BBBBBBBBBBBBBBBBBBBBBA")
