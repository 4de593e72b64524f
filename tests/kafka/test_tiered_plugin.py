"""A stock Kafka broker tiers through kcompact's plugin (`kafka/tiered-plugin`) and serves what kcompact compacted.

The broker runs KIP-405 with `KcompactRemoteStorageManager` writing kcompact's store layout in a local directory
and `KcompactRemoteLogMetadataManager` keeping the segments in kcompact's metadata table. The topic is
`cleanup.policy=delete` with infinite retention and a small local retention, so the broker copies every rolled
segment to the store and then deletes it locally.

One broker serves the whole module (CI time): the `tier` fixture produces updates, tombstones, committed and aborted
transactions until the broker has tiered several segments and deleted them locally, reads them back through the
broker, leaves a consumer paused a third of the way through the tier, and runs `kcompact compact` while a producer
keeps the broker rolling and tiering. The tests then check, in file order (the last three change the broker:
gc deletes the replaced segments, the broker restarts, the topic is deleted), what consumers and the table show,
and that kcompact's retention leaves the broker's partition to the broker.
Kafka fetches past the offsets compaction removed from a remote segment since KAFKA-15388.
"""

from __future__ import annotations

import importlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

import compaction
from compaction.format.segment import iter_batch_headers
from compaction.metadata import SegmentMetadata, SegmentState
from compaction.storage import open_store
from compaction.storage.layout import Suffix
from tests.kafka.tiered import (
    TOPIC,
    Tier,
    Writer,
    consumer,
    create_tiered_topic,
    local_log_start,
    plugin_overrides,
    poll,
    poll_until,
    read_all,
    tier_settled,
    wait_for,
)
from tests.kafka_runtime import KafkaBroker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

run_commit = importlib.import_module("compaction.run.commit")

def offsets_for_times(broker: KafkaBroker, timestamps: list[int]) -> dict[int, int]:
    """The broker's ListOffsets answer for each timestamp, one request each (a request names a partition once)."""
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "times"})
    try:
        return {t: c.offsets_for_times([TopicPartition(TOPIC, 0, t)], 30)[0].offset for t in timestamps}
    finally:
        c.close()


@pytest.fixture(scope="module")
def tier(kafka_runtime: str, tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Iterator[Tier]:
    workdir = tmp_path_factory.mktemp("tiered")
    store = open_store(str(workdir / "store"))
    broker = KafkaBroker(workdir / "kafka", jars=["tiered-plugin"], overrides=plugin_overrides(store))
    broker.start()
    tier = Tier(broker, store, [])
    create_tiered_topic(broker)
    writer = Writer(tier)
    try:
        wait_for("the broker tiered 3 segments and deleted them locally",
                 lambda: local_log_start(broker) > 0 and len(tier.live()) >= 3, broker, step=writer.round)
        _before_the_swap(tier)
        _compact_while_the_broker_tiers(tier, writer, spark, workdir / "kcompact.yaml")
        yield tier
    finally:
        del writer  # its producers go before the broker does
        broker.stop()


def _before_the_swap(tier: Tier) -> None:
    """Everything read back through the broker's remote fetch; a consumer left a third of the way through the tier,
    paused (librdkafka then fetches nothing more and drops what it prefetched: it resumes at its position)."""
    got = read_all(tier.broker, len(tier.uncompacted()))
    assert got == tier.uncompacted()
    tiered_end = tier.live()[-1].end_offset
    mid = consumer(tier.broker)
    tier.mid_read, tier.mid_reader = (poll(mid, len([o for o, _, _ in got if o < tiered_end]) // 3), []), mid
    mid.pause([TopicPartition(TOPIC, 0)])


def _compact_while_the_broker_tiers(tier: Tier, writer: Writer, spark: SparkSession, config: Path) -> None:
    """`kcompact compact` with a producer running, so the broker rolls and tiers segments while the run plans,
    rewrites and commits; then the producer stops and the mid-read consumer finishes."""
    config.write_text(f"topics:\n  {TOPIC}:\n    cleanup.policy: compact\n    min.cleanable.dirty.ratio: 0.01\n")
    stop = threading.Event()

    def keep_producing() -> None:
        while not stop.is_set():
            writer.updates(20)
            time.sleep(0.2)

    producing = threading.Thread(target=keep_producing, name="producer")
    producing.start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(run_commit, "commit_change_sets", _after_a_broker_commit(tier, run_commit.commit_change_sets))
            tier.report = compaction.compact(spark, tier.store, str(config)).to_dict()
    finally:
        stop.set()
        producing.join(60)
    tier.cleaned = tier.partition().lineage.current
    assert tier.cleaned > 0, json.dumps(tier.report["partitions"] or tier.report["failed"], default=str)[:3000]
    wait_for("the broker tiered everything and its active segment is empty", lambda: tier_settled(tier), tier.broker)
    # the broker's metadata manager follows the table's log: a consumer from offset 0 gets the compacted records
    # once it has read the swap, and only then does the paused one read on (under load it lagged the commit)
    compacted = [r for r in tier.view(committed=True) if r[0] < tier.cleaned]
    wait_for("the broker serves the compacted segments", lambda: read_all(tier.broker, len(compacted)) == compacted,
             tier.broker)
    assert tier.mid_reader is not None
    tier.mid_reader.resume([TopicPartition(TOPIC, 0)])
    try:
        tier.mid_read = (tier.mid_read[0], poll_until(tier.mid_reader, tier.view(committed=True)[-1][0]))
    finally:
        tier.mid_reader.close()


def _after_a_broker_commit(tier: Tier, commit: Callable[..., Any]) -> Callable[..., Any]:
    """`commit` that first waits until the broker has committed to the table since the change set was planned: on a
    quiet machine the run can plan, rewrite and commit between two of the broker's tiering commits, and the race this
    module is about (`compaction.metadata.rebase`) would then not happen."""

    def broker_committed_since(version: int) -> bool:
        return any(h["version"] > version and h.get("kcompact.writer") == "broker-1" for h in tier.history())

    def committing(table: Any, change_sets: Any, now_ms: int, **kwargs: Any) -> Any:
        change_sets = list(change_sets)
        base = min(cs.base_version for cs in change_sets)
        wait_for(f"a broker commit after table version {base}", lambda: broker_committed_since(base), tier.broker)
        return commit(table, change_sets, now_ms, **kwargs)

    return committing


def test_the_compaction_committed_while_the_broker_tiered(tier: Tier) -> None:
    """The broker's tiering commits landed between the compaction's plan and its commit, and did not cost it its
    commit (compaction.metadata.rebase)."""
    (partition,) = tier.report["partitions"]
    assert partition["committed"], tier.report["failed"]
    planned, landed = tier.report["metadata_version_planned"], partition["metadata_version"]
    between = [h for h in tier.history() if planned < h["version"] < landed]
    brokers = [h for h in between if h.get("kcompact.writer") == "broker-1"]
    assert brokers, (planned, landed)
    # the rest is the run's own (it takes its fencing epoch in a commit of its own)
    assert {h.get("kcompact.run_id") for h in between if h not in brokers} <= {tier.report["run_id"]}
    assert any(s.writer != "broker-1" for s in tier.partition().live_segments), "kcompact committed no segment"


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_a_consumer_from_offset_0_gets_the_compacted_view(tier: Tier, isolation: str) -> None:
    expected = tier.view(committed=isolation == "read_committed")
    assert len(expected) < len(tier.uncompacted())
    assert any(r.aborted for r in tier.produced if r.offset < tier.cleaned)
    assert any(v is None for o, _, v in expected if o < tier.cleaned), "no tombstone below the cleaned offset"
    got = read_all(tier.broker, len(expected), isolation)
    assert got == expected


def test_offsets_for_times_finds_the_first_record_left(tier: Tier) -> None:
    """Timestamps grow with offsets, one per record. For the timestamp of a record compaction removed, Kafka answers
    the next record it left (asked only where no transaction marker lies in between: a marker's timestamp is the
    broker's); for one it kept, or one above the cleaned offset, that record itself."""
    produced = {r.offset for r in tier.produced}
    kept = sorted(o for o, _, _ in tier.view(committed=True) if o < tier.cleaned)
    removed = {}
    for r in tier.produced:
        if r.offset < tier.cleaned and not r.aborted and r.offset not in kept:
            left = next((o for o in kept if o > r.offset), None)
            if left is not None and all(o in produced for o in range(r.offset, left + 1)):
                removed[r.timestamp_ms] = left
    assert len(removed) >= 3, removed
    last_kept = next(r for r in tier.produced if r.offset == kept[-1])
    above = next(r for r in tier.produced if r.offset > tier.cleaned + 100)
    expected = {**dict(sorted(removed.items())[-6:]), last_kept.timestamp_ms: last_kept.offset,
                above.timestamp_ms: above.offset}
    assert offsets_for_times(tier.broker, sorted(expected)) == expected


def test_a_consumer_mid_read_when_the_swap_committed_finishes(tier: Tier) -> None:
    """It read a third of the tier, the swap committed, it read on to the end: no error, every record the one
    produced at its offset, nothing the compacted view holds missed, and compacted segments served after the swap."""
    before, after = tier.mid_read
    got = before + after
    assert before[-1][0] < tier.cleaned
    assert [o for o, _, _ in got] == sorted({o for o, _, _ in got})
    assert set(got) <= set(tier.uncompacted())
    assert set(tier.view(committed=True)) <= set(got)
    assert {o for o, _, _ in after} != {o for o, _, _ in tier.uncompacted() if o > before[-1][0]}


def test_the_broker_tiers_on_above_the_compacted_region_with_no_gap_or_overlap(tier: Tier) -> None:
    live = tier.live()
    assert live[0].start_offset == 0
    assert all(a.end_offset + 1 == b.start_offset for a, b in itertools.pairwise(live))
    assert live[-1].end_offset >= max(r.offset for r in tier.produced)
    compacted = [s for s in live if s.writer != "broker-1"]
    assert compacted and compacted[-1].end_offset + 1 == tier.cleaned
    above = [s for s in live if s.start_offset >= tier.cleaned]
    assert above and all(s.writer == "broker-1" for s in above)
    listed = tier.cli("segments", "--topic", TOPIC, "--partition", "0")
    assert f"{len(live)} live segments" in listed.stdout


def test_each_broker_copy_says_whether_it_holds_transactional_batches(tier: Tier) -> None:
    """The plugin's storage manager walks each copied segment's batch headers and hands what it found to the
    metadata manager through Kafka (the copy's custom metadata, KIP-917): every segment the broker tiered records in
    its row whether it holds a transactional or control batch, as its bytes do, so a compaction plans its one-job
    path on known rows (docs/compaction-run.md). The workload's rounds hold both kinds of segment. Asked before gc
    deletes the replaced copies: the copies tiered while the run compacted hold updates only."""
    copies = [s for s in tier.partition().segments
              if s.writer == "broker-1" and s.state is not SegmentState.COPY_SEGMENT_STARTED]
    assert copies
    found = {}
    for s in copies:
        key = s.object_key(Suffix.LOG)
        assert key is not None
        data = tier.store.get(key)
        found[s.segment_id] = any(h.is_transactional or h.is_control for h in iter_batch_headers(data, obj=key))
    assert {s.segment_id: s.transactional for s in copies} == found
    assert set(found.values()) == {True, False}, found


def test_retention_leaves_a_partition_the_broker_tiers_to_the_broker(tier: Tier, tmp_path: Path) -> None:
    """Named compact,delete with retention.bytes 0 in kcompact's config, the partition the broker tiers is held back
    with a note and nothing is committed: a broker's log start does not follow kcompact's expiry, and its consumers
    would loop on OFFSET_OUT_OF_RANGE until it restarts (docs/operating.md, "Retention of compact,delete topics")."""
    config = tmp_path / "kcompact.yaml"
    config.write_text(f"topics:\n  {TOPIC}:\n    cleanup.policy: compact,delete\n    retention.bytes: 0\n")
    report = json.loads(tier.cli("expire", "--config", str(config), "--json").stdout)
    assert (report["segments_expired"], report["partitions"]) == (0, [])
    assert [n.split(" not expired: ")[0] for n in report["notes"]] == [f"{TOPIC}-0"], report["notes"]
    assert not any(s.writer.startswith("kcompact-retention") for s in tier.partition().segments)


def test_gc_after_the_grace_never_breaks_a_reader(tier: Tier) -> None:
    """A consumer is halfway through the compacted region when `kcompact gc` deletes the replaced segments."""
    expected = tier.view(committed=True)
    reader = consumer(tier.broker)
    try:
        got = poll(reader, len(expected) // 2)
        replaced = [s for s in tier.partition().segments if s.state is SegmentState.DELETE_SEGMENT_STARTED]
        assert replaced
        grace_ms = 5000  # waited out: on a quiet machine the fixture ends within a grace of the compaction's commit
        time.sleep(max(0.0, (max(s.event_timestamp_ms for s in replaced) + grace_ms + 200) / 1000 - time.time()))
        gc = tier.cli("gc", "--grace-ms", str(grace_ms), "--json")
        assert json.loads(gc.stdout)["totals"]["segments_finished"] == len(replaced), gc.stdout
        assert not any(tier.store.exists(o.key) for s in replaced for o in s.object_keys)
        got += poll(reader, len(expected) - len(got))
    finally:
        reader.close()
    assert got == expected
    assert read_all(tier.broker, len(expected)) == expected


def test_a_restarted_broker_serves_the_compacted_view(tier: Tier) -> None:
    tier.broker.restart()
    expected = tier.view(committed=True)
    assert read_all(tier.broker, len(expected)) == expected


def test_deleting_the_topic_deletes_its_tier_through_the_plugin(tier: Tier) -> None:
    """Kafka deletes a deleted topic's remote segments itself (RemoteLogManager.stopPartitions: every listed segment
    to DELETE_SEGMENT_STARTED, its objects through the RemoteStorageManager, then DELETE_SEGMENT_FINISHED), the
    broker's and kcompact's alike; Kafka 4.2.1 never calls putRemotePartitionDeleteMetadata."""
    admin = AdminClient({"bootstrap.servers": tier.broker.bootstrap})
    for f in admin.delete_topics([TOPIC]).values():
        f.result(30)

    def left() -> list[SegmentMetadata]:
        return [s for s in tier.partition().segments if s.state is not SegmentState.DELETE_SEGMENT_FINISHED]

    wait_for("every row of the deleted topic is DELETE_SEGMENT_FINISHED", lambda: not left(), tier.broker)
    segments = tier.partition().segments
    assert {s.writer for s in segments} >= {"broker-1"} and any(s.writer != "broker-1" for s in segments)
    assert not [o.key for s in segments for o in s.object_keys if tier.store.exists(o.key)]
