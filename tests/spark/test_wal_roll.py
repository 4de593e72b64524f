"""`kcompact wal roll` end to end: WAL -> tiered segments with Kafka's roll rules, complete segments that the
referee decodes, compaction and gc after the roll with nothing lost, bad objects, crashes and concurrent rolls;
on the local store and on S3 (moto) through the `new_store` fixture."""

from __future__ import annotations

import itertools
import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import compaction
from compaction.cli import main
from compaction.config import KcompactConfig, parse_config
from compaction.errors import TransientStoreError
from compaction.format.checkpoints import read_leader_epoch_checkpoint
from compaction.format.indexes import verify_indexes
from compaction.format.producer_snapshot import read_producer_snapshot
from compaction.gc import collect_garbage
from compaction.metadata import ObjectSuffix, SegmentMetadata, SegmentState, table_in_store
from compaction.storage import ObjectStore, open_store
from compaction.storage.indexes import get_part
from compaction.wal import roll as roll_module
from compaction.wal.roll import roll
from compaction.wal.table import WalTable
from compaction.wal.upload import upload_logdir
from tests.latest_view import latest_view, store_problems, view_differences
from tests.scenario_log import ScenarioLog

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from kafka.record.memory_records import MemoryRecords

NOW = 1_700_000_000_000
HOUR = 3_600_000



def part(store: ObjectStore, seg: SegmentMetadata, suffix: ObjectSuffix) -> bytes:
    """`seg`'s file `suffix`, an object of its own or a part of its `.indexes` object."""
    return get_part(store, seg.object_key(suffix) or "", suffix)

def config(segment_bytes: int = 2000, segment_ms: int = HOUR, **extra: object) -> KcompactConfig:
    return parse_config({"defaults": {"cleanup.policy": "compact", "segment.bytes": segment_bytes,
                                      "segment.ms": segment_ms, "min.cleanable.dirty.ratio": 0.01, **extra}}, "test")


def workload(logdir: Path, topic: str = "orders", partitions: int = 2, n: int = 120, *, start: int = NOW - HOUR,
             step_ms: int = 1000) -> list[ScenarioLog]:
    logs = []
    for p in range(partitions):
        log = ScenarioLog(topic, start, p)
        txn = log.producer(100 + p)
        for i in range(n):
            log.timestamp = start + i * step_ms
            if i % 25 == 10:
                txn([i % 13, (i + 1) % 13])
            elif i % 25 == 12:
                log.abort(100 + p) if i % 50 == 12 else log.commit(100 + p)
            else:
                log.record(i % 13, None if i % 17 == 5 else f"{topic}-{p}-{i}".encode())
            if i % 40 == 39:
                log.roll()
        log.write(logdir)
        logs.append(log)
    return logs


def test_roll_makes_complete_segments_with_kafkas_rules_and_leaves_the_open_tail(
    spark: SparkSession, new_store: Callable[[], ObjectStore], tmp_path: Path
) -> None:
    store = new_store()
    logs = workload(tmp_path / "logdir")
    upload_logdir(tmp_path / "logdir", store, NOW, max_object_bytes=3000)
    before = {(log.topic, log.partition): latest_view(store, log.topic, log.partition) for log in logs}
    cfg = config()
    report = roll(spark, store, cfg, NOW)
    assert report.exit_code == 0
    table = table_in_store(store)
    for log in logs:
        live = table.live_segments(log.topic, log.partition)
        assert len(live) >= 3
        assert next(s.start_offset for s in live) == 0
        assert all(a.end_offset + 1 == b.start_offset for a, b in itertools.pairwise(live))
        for s in live:
            assert s.segment_size_bytes <= 2000
            data = store.get(s.object_key(ObjectSuffix.LOG) or "")
            records = MemoryRecords(data)
            last = None
            while (batch := records.next_batch()) is not None:
                assert batch.validate_crc()
                last = batch
            assert last is not None
            verify_indexes(data, s.start_offset, part(store, s, ObjectSuffix.OFFSET_INDEX),
                           part(store, s, ObjectSuffix.TIME_INDEX))
            read_producer_snapshot(part(store, s, ObjectSuffix.PRODUCER_SNAPSHOT))
            epochs = read_leader_epoch_checkpoint(part(store, s, ObjectSuffix.LEADER_EPOCH_CHECKPOINT))
            assert [e.epoch for e in epochs] == [0]
        rolled_to = live[-1].end_offset + 1
        assert rolled_to < log.next_offset, "the open tail was rolled although it is neither full nor old"
        outcome = next(p for p in report.partitions if p.partition == log.partition)
        assert outcome.open_tail_bytes > 0 and outcome.wal_end == log.next_offset
        assert latest_view(store, log.topic, log.partition) == before[log.topic, log.partition]
    # A rerun at the same time rolls nothing; at --now past segment.ms the tail rolls too.
    assert all(not p.new_segments for p in roll(spark, store, cfg, NOW).partitions)
    late = roll(spark, store, cfg, NOW + 2 * HOUR)
    assert all(p.open_tail_bytes == 0 and p.new_segments for p in late.partitions)
    for log in logs:
        assert table.live_segments(log.topic, log.partition)[-1].end_offset + 1 == log.next_offset
        assert latest_view(store, log.topic, log.partition) == before[log.topic, log.partition]
    # gc: every combined object is covered now; deleted a grace after the covering commit, nothing lost.
    gc = collect_garbage(store, table, NOW + 2 * HOUR + 60_000)
    assert gc.wal is not None and gc.wal["objects_needed"] == 0 and gc.wal["objects_deleted"] > 0
    assert not list(store.list("wal/"))
    assert store_problems(store) == []
    for log in logs:
        assert latest_view(store, log.topic, log.partition) == before[log.topic, log.partition]


def test_a_roll_of_many_partitions_is_two_commits(spark: SparkSession, tmp_path: Path) -> None:
    """Issue 41: the fencing epochs of every partition in one Delta commit, their new segments in one more."""
    store = open_store(str(tmp_path / "store"))
    logs = workload(tmp_path / "logdir", partitions=6)
    upload_logdir(tmp_path / "logdir", store, NOW)
    report = roll(spark, store, config(), NOW)
    assert report.exit_code == 0 and all(p.new_segments for p in report.partitions)
    table = table_in_store(store)
    assert table.version() == 2, "version 0 created the table: 1 took the epochs, 2 holds the segments"
    assert {p.committed_version for p in report.partitions} == {2}
    assert all(len(table.live_segments(log.topic, log.partition)) >= 3 for log in logs)


def test_many_small_partitions_share_the_rolls_tasks(spark: SparkSession, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: partitions are packed into Spark tasks by their WAL bytes (`roll_packing`), a few tasks a core
    however many small partitions, and each outcome still comes back for its own partition."""
    store = open_store(str(tmp_path / "store"))
    logs = workload(tmp_path / "logdir", partitions=16, n=50)
    upload_logdir(tmp_path / "logdir", store, NOW)
    packings: list[list[list[int]]] = []
    real = roll_module.roll_packing
    monkeypatch.setattr(roll_module, "roll_packing", lambda tasks, cores: packings.append(real(tasks, cores))
                        or packings[-1])
    report = roll(spark, store, config(), NOW)
    assert report.exit_code == 0 and len(report.partitions) == 16
    [packed] = packings
    assert sorted(i for task in packed for i in task) == list(range(16))
    assert len(packed) <= 2 * 2 * spark.sparkContext.defaultParallelism < 16
    assert [(p.topic, p.partition) for p in report.partitions] == [(log.topic, log.partition) for log in logs]
    table = table_in_store(store)
    for p in report.partitions:
        assert p.new_segments and [s.segment_id for s in table.live_segments(p.topic, p.partition)] == [
            s.segment_id for s in p.new_segments]


def test_time_rolls_split_segments_by_segment_ms(spark: SparkSession, tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    [log] = workload(tmp_path / "logdir", partitions=1, n=60, step_ms=60_000)  # a batch a minute
    upload_logdir(tmp_path / "logdir", store, NOW)
    cfg = config(segment_bytes=10**9, segment_ms=10 * 60_000)
    dry = roll(spark, store, cfg, log.timestamp + 1, dry_run=True)  # reports the cut, writes nothing
    assert len(dry.partitions[0].new_segments) == 5 and dry.metadata_version is None
    assert not list(store.list("orders-")) and table_in_store(store, create=True).live_segments("orders", 0) == ()
    roll(spark, store, cfg, log.timestamp + 1)
    live = table_in_store(store).live_segments("orders", 0)
    firsts = [s.first_batch_max_timestamp_ms for s in live]
    assert len(live) == 5 and all(b - a > 10 * 60_000 for a, b in itertools.pairwise(firsts))
    assert all(s.max_timestamp_ms - (s.first_batch_max_timestamp_ms or 0) <= 10 * 60_000 for s in live)


def test_compaction_after_roll_keeps_every_latest_record(
    spark: SparkSession, new_store: Callable[[], ObjectStore], tmp_path: Path
) -> None:
    store = new_store()
    logs = workload(tmp_path / "logdir", n=160)
    upload_logdir(tmp_path / "logdir", store, NOW)
    cfg = config()
    before = {(log.topic, log.partition): latest_view(store, log.topic, log.partition) for log in logs}
    roll(spark, store, cfg, NOW + 2 * HOUR)
    report = compaction.compact(spark, store, cfg, NOW + 2 * HOUR)
    assert report.exit_code == 0, json.dumps(report.to_dict())[:2000]
    assert [p.committed for p in report.partitions] == [True, True]
    after = {(log.topic, log.partition): latest_view(store, log.topic, log.partition) for log in logs}
    assert view_differences(before, after) == []


def test_a_bad_wal_object_fails_only_its_partition(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(str(tmp_path / "store"))
    workload(tmp_path / "logdir", partitions=1, topic="orders")
    workload(tmp_path / "logdir", partitions=1, topic="users")
    upload_logdir(tmp_path / "logdir", store, NOW, max_object_bytes=1500)
    victim = next(o for o in WalTable.in_store(store).objects()
                  if {e.topic for e in o.entries} == {"orders"})
    entry = victim.entries[0]
    path = tmp_path / "store" / victim.key
    data = bytearray(path.read_bytes())
    data[entry.start_position + 62] ^= 0x55  # a record byte of the entry's first batch (its CRC covers it)
    path.write_bytes(bytes(data))
    (tmp_path / "cfg.yaml").write_text("defaults:\n  cleanup.policy: compact\n  segment.bytes: 2000\n")
    code = main(["wal", "roll", "--store", str(tmp_path / "store"), "--config", str(tmp_path / "cfg.yaml"),
                 "--now", str(NOW + 2 * HOUR), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and doc["exit_code"] == 3
    failed = {p["topic"]: p for p in doc["partitions"]}
    assert failed["orders"]["error_type"] == "CrcMismatchError"
    assert store.object_uri(victim.key) in failed["orders"]["error"] and "byte " in failed["orders"]["error"]
    assert failed["users"]["error"] is None and failed["users"]["committed_version"] is not None
    table = table_in_store(store)
    assert table.live_segments("orders", 0) == () and table.live_segments("users", 0)


def test_a_roll_that_dies_before_its_commit_converges_on_rerun(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(str(tmp_path / "store"))
    logs = workload(tmp_path / "logdir")
    upload_logdir(tmp_path / "logdir", store, NOW)
    before = {(log.topic, log.partition): latest_view(store, log.topic, log.partition) for log in logs}
    real_commit = roll_module.commit_batch

    def dying_commit(*args: object, **kwargs: object) -> object:
        raise TransientStoreError("injected: the process died before its metadata commit")

    monkeypatch.setattr(roll_module, "commit_batch", dying_commit)
    crashed = roll(spark, store, config(), NOW)
    assert crashed.exit_code == 4 and {p.error_type for p in crashed.partitions} == {"TransientStoreError"}
    assert all(not table_in_store(store).live_segments(log.topic, log.partition) for log in logs)
    uploaded = [o.key for o in store.list("orders-")]
    assert uploaded, "the crashed run uploaded nothing: the test is not testing a crash after uploads"
    monkeypatch.setattr(roll_module, "commit_batch", real_commit)
    assert roll(spark, store, config(), NOW).exit_code == 0
    for log in logs:
        assert latest_view(store, log.topic, log.partition) == before[log.topic, log.partition]
    # The crashed run's objects are orphans; gc removes them after the orphan grace (by their mtime), nothing else.
    collect_garbage(store, table_in_store(store), int(time.time() * 1000) + 2 * 86_400_000)
    assert not any(store.exists(k) for k in uploaded)
    assert store_problems(store) == []


def test_concurrent_rolls_commit_once(spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "store"))
    logs = workload(tmp_path / "logdir", partitions=1)
    upload_logdir(tmp_path / "logdir", store, NOW)
    before = latest_view(store, "orders", 0)
    real_commit = roll_module._commit
    others: list[object] = []

    def commit_after_another_run(*args: object, **kwargs: object) -> None:
        if not others:  # a second run starts, rolls and commits while this one is between upload and commit
            monkeypatch.setattr(roll_module, "_commit", real_commit)
            others.append(roll(spark, store, config(), NOW))
        real_commit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(roll_module, "_commit", commit_after_another_run)
    first = roll(spark, store, config(), NOW)
    [other] = others
    assert other.exit_code == 0  # type: ignore[attr-defined]
    assert first.exit_code == 4 and first.partitions[0].error_type in ("FencedError", "CommitConflictError")
    live = table_in_store(store).live_segments("orders", 0)
    assert all(a.end_offset + 1 == b.start_offset for a, b in itertools.pairwise(live))
    assert latest_view(store, "orders", 0) == before
    del logs


def test_gc_that_dies_mid_delete_converges(spark: SparkSession, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "store"))
    logs = workload(tmp_path / "logdir", partitions=1)
    upload_logdir(tmp_path / "logdir", store, NOW, max_object_bytes=1000)
    roll(spark, store, config(), NOW + 2 * HOUR)
    before = latest_view(store, "orders", 0)
    real_delete = type(store).delete
    deleted: list[str] = []

    def dying_delete(self: ObjectStore, key: str) -> None:
        if key.startswith("wal/") and len(deleted) == 2:
            raise TransientStoreError("injected: gc died mid-delete")
        deleted.append(key)
        real_delete(self, key)

    monkeypatch.setattr(type(store), "delete", dying_delete)
    with pytest.raises(TransientStoreError):
        collect_garbage(store, table_in_store(store), NOW + 3 * HOUR)
    states = {o.state for o in WalTable.in_store(store).objects()}
    assert SegmentState.DELETE_SEGMENT_STARTED in states
    monkeypatch.setattr(type(store), "delete", real_delete)
    collect_garbage(store, table_in_store(store), NOW + 3 * HOUR)
    assert {o.state for o in WalTable.in_store(store).objects()} == {SegmentState.DELETE_SEGMENT_FINISHED}
    assert not list(store.list("wal/")) and store_problems(store) == []
    assert latest_view(store, "orders", 0) == before
    del logs


def test_read_partition_continues_into_the_wal_like_kcompact_read(spark: SparkSession, new_store: Callable[[],
                                                                   ObjectStore], tmp_path: Path) -> None:
    from compaction.reader import Isolation, consumer_records, log_refs
    from tests.scenario_log import tier

    store = new_store()
    log = ScenarioLog("orders", NOW - 5000)
    txn = log.producer(7)
    log.record(1, b"a")
    txn([10, 11])
    log.roll()
    log.record(2, b"b")
    log.abort(7)
    committed = log.producer(8)
    committed([12])
    log.commit(8)
    tier([log], tmp_path / "logdir", store, NOW)
    upload_logdir(tmp_path / "logdir", store, NOW)
    for isolation in Isolation:
        df = compaction.read_partition(spark, store, "orders", 0, isolation=isolation.value)
        got = [(r["offset"], r["value"]) for r in df.collect()]
        want = [(r.offset, r.value) for r in consumer_records(store, log_refs(store, "orders", 0), isolation=isolation)]
        assert got == want
    assert [o for o, _v in got] == [0, 3, 5]


def test_tier_after_roll_tiers_a_local_segment_from_where_the_roll_ended(spark: SparkSession, tmp_path: Path) -> None:
    """Brokers tier their rolled segments later (KIP-405); where `wal roll` cut elsewhere, the local segment the
    tier reaches into is tiered from the tier's end: one contiguous tier, nothing read twice, nothing lost."""
    from compaction.tier import tier_logdir

    store = open_store(str(tmp_path / "store"))
    log = ScenarioLog("orders", NOW - HOUR)
    for i in range(60):
        log.record(i % 13, f"v{i}".encode())
        if i == 39:
            log.roll()
    log.write(tmp_path / "logdir")  # local segments 0..39, 40..59 (active)
    upload_logdir(tmp_path / "logdir", store, NOW)
    roll(spark, store, config(segment_bytes=10**6), NOW + 2 * HOUR)  # all of it, as one segment 0..59
    rolled_end = table_in_store(store).live_segments("orders", 0)[-1].end_offset
    assert rolled_end == 59
    for i in range(60, 100):  # the broker writes on and rolls at 80: its local segment 40..79 straddles the tier
        log.record(i % 13, f"v{i}".encode())
        if i == 79:
            log.roll()
    log.write(tmp_path / "logdir")
    upload_logdir(tmp_path / "logdir", store, NOW + 1)  # 60..99 into the WAL
    before = latest_view(store, "orders", 0)
    assert len(before) == 13 and max(e[0] for e in before.values()) == 99
    [result] = tier_logdir(tmp_path / "logdir", store, table_in_store(store), NOW)
    assert result.error is None and result.copied == [rolled_end + 1]
    live = table_in_store(store).live_segments("orders", 0)
    assert all(a.end_offset + 1 == b.start_offset for a, b in itertools.pairwise(live))
    tail = live[-1]
    assert (tail.start_offset, tail.end_offset) == (rolled_end + 1, 79)
    data = store.get(tail.object_key(ObjectSuffix.LOG) or "")
    verify_indexes(data, tail.start_offset, part(store, tail, ObjectSuffix.OFFSET_INDEX),
                   part(store, tail, ObjectSuffix.TIME_INDEX))
    assert latest_view(store, "orders", 0) == before
