"""End to end on Spark: generate → tier → plan → stage → commit, and the latest-per-key property.

Every test takes its stores from `new_store` (tests/spark/conftest.py), so it runs on a local directory and on S3.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction.config import KcompactConfig, TopicConfig
from compaction.format.segment import iter_batches
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import ObjectSuffix, SegmentState, table_in_store
from compaction.reader import Isolation, consumer_records, segment_ref
from compaction.run.commit import commit
from compaction.run.plan import plan
from compaction.run.stage import stage
from compaction.storage import ObjectStore
from compaction.tier import tier_logdir
from tests.spark.partition_reads import all_records, latest_per_key

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from kafka.record.memory_records import MemoryRecords

NOW = 1_800_000_000_000
DAY = 86_400_000
CONFIG = KcompactConfig(defaults=TopicConfig.from_kafka({"cleanup.policy": "compact",
                                                         "min.cleanable.dirty.ratio": "0.01"}))


@pytest.fixture
def tiered(tmp_path: Path, new_store: Callable[[], ObjectStore]) -> ObjectStore:
    spec = WorkloadSpec(topics=(TopicSpec("orders", 2),), records_per_partition=4000, keys=300,
                        segment_bytes=64 * 1024, tombstone_ratio=0.05, seed=21)
    generate_logdir(tmp_path / "logs", spec)
    store = new_store()
    tier_logdir(tmp_path / "logs", store, table_in_store(store, create=True), NOW - 10 * DAY)
    return store


@pytest.mark.spark
def test_compaction_keeps_latest_per_key_and_writes_real_segments(spark: SparkSession, tiered: ObjectStore) -> None:
    store = tiered
    before = {p: latest_per_key(store, "orders", p) for p in (0, 1)}
    sizes_before = {p: sum(s.segment_size_bytes for s in table_in_store(store).live_segments("orders", p))
                    for p in (0, 1)}
    run = plan(store, CONFIG, NOW)
    assert [(p.topic, p.partition) for p in run.plan.eligible] == [("orders", 0), ("orders", 1)] or len(
        run.plan.eligible) == 2
    staged = stage(spark, run)
    outcomes = commit(staged)
    assert all(o.committed for o in outcomes), outcomes
    table = table_in_store(store)
    for p in (0, 1):
        after = latest_per_key(store, "orders", p)
        assert after == before[p]
        records = all_records(store, "orders", p)
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets))
        cleaned_below = table.partition_snapshot("orders", p).lineage.current
        keyed = [r for r in records if r.key is not None and r.offset < cleaned_below]
        assert len({r.key for r in keyed}) == len(keyed), "exactly one record per key survives"
        assert cleaned_below == next(x for x in run.plan.eligible if x.partition == p).regions.first_uncleanable_offset
        live = table.live_segments("orders", p)
        assert sum(s.segment_size_bytes for s in live) < sizes_before[p]
        assert all(a.end_offset + 1 == b.start_offset for a, b in itertools.pairwise(live))
        for seg in live:
            data = store.get(seg.object_key(ObjectSuffix.LOG) or "")
            ref = MemoryRecords(data)
            while ref.has_next():
                assert ref.next_batch().validate_crc()
            assert [b.last_offset for _p, b in iter_batches(data)][-1] == seg.end_offset
        snap = table.partition_snapshot("orders", p)
        assert snap.lineage.current in [s.start_offset for s in live] + [live[-1].end_offset + 1]
        assert any(s.state is SegmentState.DELETE_SEGMENT_STARTED for s in snap.segments)


@pytest.mark.spark
def test_rerun_with_nothing_new_changes_nothing(spark: SparkSession, tiered: ObjectStore) -> None:
    store = tiered
    commit(stage(spark, plan(store, CONFIG, NOW)))
    version = table_in_store(store).version()
    run = plan(store, CONFIG, NOW)
    assert run.plan.eligible == ()
    staged = stage(spark, run)
    assert commit(staged) == []
    assert table_in_store(store).version() == version


@pytest.mark.spark
def test_tombstones_go_after_their_delete_horizon(spark: SparkSession, tiered: ObjectStore) -> None:
    store = tiered
    before = latest_per_key(store, "orders", 0)
    commit(stage(spark, plan(store, CONFIG, NOW, force=True)))
    tombstones = [r for r in all_records(store, "orders", 0) if r.value is None]
    assert tombstones, "first run keeps tombstones and sets their horizon"
    commit(stage(spark, plan(store, CONFIG, NOW + DAY + 1, force=True)))
    cleaned_below = table_in_store(store).partition_snapshot("orders", 0).lineage.current
    assert not [r for r in all_records(store, "orders", 0) if r.value is None and r.offset < cleaned_below]
    after = latest_per_key(store, "orders", 0)
    assert after == {k: v for k, v in before.items() if v[1] is not None or v[0] >= cleaned_below}


def expected_winners(store: ObjectStore, topic: str, partition: int, below: int, strategy: str) -> dict:
    """Reference: the winner per key among consumable records below `below`, written out plainly."""
    refs = [segment_ref(s) for s in table_in_store(store).live_segments(topic, partition)]
    best: dict = {}
    for r in consumer_records(store, refs, isolation=Isolation.READ_COMMITTED):
        if r.key is None or r.offset >= below:
            continue
        if strategy == "timestamp":
            rank = (1, r.timestamp, r.offset)
        else:
            values = [h.value for h in r.headers if h.key == "version"]
            last = values[-1] if values else None
            rank = (1, int.from_bytes(last, "big", signed=True), r.offset) if last is not None and len(last) == 8 \
                else (0, 0, r.offset)
        if r.key not in best or rank > best[r.key][0]:
            best[r.key] = (rank, r.offset)
    return {k: v[1] for k, v in best.items()}


@pytest.mark.spark
def test_timestamp_and_header_strategies_keep_the_strategy_winner(
    spark: SparkSession, tmp_path: Path, new_store: Callable[[], ObjectStore]
) -> None:
    spec = WorkloadSpec(topics=(TopicSpec("ts", 1), TopicSpec("hdr", 1)), records_per_partition=3000, keys=200,
                        segment_bytes=64 * 1024, out_of_order_ratio=0.3, seed=8)
    generate_logdir(tmp_path / "logs", spec)
    store = new_store()
    tier_logdir(tmp_path / "logs", store, table_in_store(store, create=True), NOW - DAY)
    config = KcompactConfig(
        defaults=TopicConfig.from_kafka({"cleanup.policy": "compact"}),
        topics={
            "ts": TopicConfig.from_kafka({"cleanup.policy": "compact", "compaction.strategy": "timestamp"}),
            "hdr": TopicConfig.from_kafka({"cleanup.policy": "compact", "compaction.strategy": "header",
                                           "compaction.strategy.header": "version"}),
        },
    )
    run = plan(store, config, NOW, force=True)
    bounds = {p.topic: p.regions.first_uncleanable_offset for p in run.plan.eligible if p.regions}
    expected = {t: expected_winners(store, t, 0, bounds[t], "timestamp" if t == "ts" else "header") for t in bounds}
    by_offset = {t: {k: v[0] for k, v in latest_per_key(store, t, 0, below=bounds[t]).items()} for t in bounds}
    for t in bounds:
        assert expected[t] != by_offset[t], f"{t}: the workload must make the strategy matter"
    staged = stage(spark, run)
    assert all(o.committed for o in commit(staged))
    invalid = {sp.plan.topic: sp.stats.invalid_versions for sp in staged.partitions}
    assert invalid["hdr"] > 0 and invalid["ts"] == 0, "missing/short version headers are counted"
    for topic, want in expected.items():
        survivors = {r.key: r.offset for r in all_records(store, topic, 0)
                     if r.key is not None and r.offset < bounds[topic]}
        assert survivors == want, topic


@pytest.mark.spark
def test_corrupt_segment_quarantines_only_its_partition(spark: SparkSession, tiered: ObjectStore) -> None:
    store = tiered
    table = table_in_store(store)
    victim = table.live_segments("orders", 1)[2]
    key = victim.object_key(ObjectSuffix.LOG) or ""
    data = bytearray(store.get(key))
    data[200] ^= 0xFF
    store.delete(key)  # objects are never overwritten: replace it (as a bit flip at rest would)
    store.put(key, bytes(data))
    before = table.live_segments("orders", 1)
    outcomes = {o.partition: o for o in commit(stage(spark, plan(store, CONFIG, NOW)))}
    assert outcomes[0].committed
    assert not outcomes[1].committed and outcomes[1].exit_code == 3
    assert key in (outcomes[1].error or "") and "byte" in (outcomes[1].error or "")
    assert table_in_store(store).live_segments("orders", 1) == before


@pytest.mark.spark
def test_uncleanable_section_is_left_untouched(spark: SparkSession, tiered: ObjectStore) -> None:
    """Scenario 24 adapted: segments at or above the first uncleanable offset (min.compaction.lag.ms) keep their
    ids and bytes; only the section below is rewritten."""
    store = tiered
    live = table_in_store(store).live_segments("orders", 0)
    lag = 60_000
    now = live[-4].max_timestamp_ms + lag - 1  # the last 4 segments are too young to clean
    config = KcompactConfig(defaults=TopicConfig.from_kafka({
        "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": str(lag)}))
    first_young = next(i for i, s in enumerate(live) if s.max_timestamp_ms > now - lag)
    young = live[first_young:]
    assert 0 < first_young < len(live) - 1
    run = plan(store, config, now, topics=["orders"], partition=0)
    assert len(run.plan.eligible) == 1, run.plan.render_text()
    p = run.plan.eligible[0]
    assert p.regions is not None and p.regions.first_uncleanable_offset == young[0].start_offset
    assert all(o.committed for o in commit(stage(spark, run)))
    after = table_in_store(store).live_segments("orders", 0)
    assert [s.segment_id for s in after if s.start_offset >= young[0].start_offset] == [s.segment_id for s in young]
    assert all(s.segment_id not in {x.segment_id for x in live} for s in after
               if s.start_offset < young[0].start_offset)


@pytest.mark.spark
def test_incremental_rounds_over_cleaned_and_dirty_sections(
    spark: SparkSession, tmp_path: Path, new_store: Callable[[], ObjectStore]
) -> None:
    """Scenarios 18 and 30 adapted: a second round cleans [checkpoint, bound) together with the cleaned prefix,
    across the offset gaps the first round left; the checkpoint always lands on the first uncleanable offset."""
    spec = WorkloadSpec(topics=(TopicSpec("orders", 1),), records_per_partition=4000, keys=250,
                        segment_bytes=48 * 1024, transactional_ratio=0.0, seed=17)
    full = tmp_path / "full"
    generate_logdir(full, spec)
    logs = sorted((full / "orders-0").glob("*.log"))
    half = tmp_path / "half" / "orders-0"
    half.mkdir(parents=True)
    cut = int(logs[len(logs) // 2].name.split(".")[0])
    for f in (full / "orders-0").iterdir():
        stem = f.name.split(".")[0]
        if not stem.isdigit() or int(stem) <= cut:
            (half / f.name).write_bytes(f.read_bytes())
    store = new_store()
    table = table_in_store(store, create=True)
    tier_logdir(tmp_path / "half", store, table, NOW - DAY)
    first = plan(store, CONFIG, NOW)
    assert all(o.committed for o in commit(stage(spark, first)))
    assert table.partition_snapshot("orders", 0).lineage.current == cut
    tier_logdir(full, store, table, NOW - DAY)
    before = latest_per_key(store, "orders", 0)
    second = plan(store, CONFIG, NOW)
    [p] = second.plan.eligible
    assert p.regions is not None and p.regions.first_dirty_offset == cut and p.regions.clean_bytes > 0
    assert all(o.committed for o in commit(stage(spark, second)))
    assert latest_per_key(store, "orders", 0) == before
    assert table.partition_snapshot("orders", 0).lineage.current == p.regions.first_uncleanable_offset
    records = all_records(store, "orders", 0)
    below = [r for r in records if r.offset < p.regions.first_uncleanable_offset and r.key is not None]
    assert len({r.key for r in below}) == len(below)
