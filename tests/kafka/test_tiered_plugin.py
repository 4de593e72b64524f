"""A stock Kafka broker tiers through kcompact's plugin (`kafka/tiered-plugin`) and serves what kcompact compacted.

The broker runs KIP-405 with `KcompactRemoteStorageManager` writing kcompact's store layout in a local directory
and `KcompactRemoteLogMetadataManager` keeping the segments in kcompact's metadata table. The topic is
`cleanup.policy=delete` with infinite retention and a small local retention, so the broker copies every rolled
segment to the store and then deletes it locally.

One broker serves the whole module (CI time): the `tier` fixture produces updates, tombstones, committed and aborted
transactions until the broker has tiered several segments and deleted them locally, reads them back through the
broker, leaves a consumer paused a third of the way through the tier, and runs `kcompact compact` while a producer
keeps the broker rolling and tiering. The tests then check, in file order (the last two change the broker:
gc deletes the replaced segments, then the broker restarts), what consumers and the table show. Kafka fetches past
the offsets compaction removed from a remote segment since KAFKA-15388.
"""

from __future__ import annotations

import importlib
import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable

import compaction
from compaction.metadata import SegmentMetadata, SegmentState, table_in_store
from compaction.storage import open_store
from tests.kafka_runtime import KafkaBroker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

run_commit = importlib.import_module("compaction.run.commit")

TOPIC = "tiered"
KEYS = 37
DEADLINE_S = 90.0
Record = tuple[int, bytes | None, bytes | None]
"""What a consumer got: offset, key, value."""


@dataclass(frozen=True)
class Produced:
    offset: int
    key: bytes
    value: bytes | None
    timestamp_ms: int
    aborted: bool = False


@dataclass
class Tier:
    """The module's broker and store, everything produced to the topic, and what was observed around the swap."""

    broker: KafkaBroker
    store: Path
    produced: list[Produced]
    cleaned: int = 0
    report: dict[str, Any] = field(default_factory=dict)
    mid_read: tuple[list[Record], list[Record]] = ([], [])  # a consumer's records before and after the swap
    mid_reader: Consumer | None = None

    def live(self) -> tuple[SegmentMetadata, ...]:
        if not (self.store / "_kcompact_metadata").is_dir():
            return ()
        return table_in_store(open_store(str(self.store))).live_segments(TOPIC, 0)

    def view(self, *, committed: bool) -> list[Record]:
        """What Kafka's cleaner leaves below `cleaned` (each key's last record there that no abort removed, tombstones
        included: their delete horizon is a day away), and from `cleaned` on every record, an aborted one only for
        a read_uncommitted consumer."""
        last = {r.key: r.offset for r in self.produced if r.offset < self.cleaned and not r.aborted}
        return [(r.offset, r.key, r.value) for r in self.produced
                if (last.get(r.key) == r.offset if r.offset < self.cleaned else not (committed and r.aborted))]

    def uncompacted(self) -> list[Record]:
        return [(r.offset, r.key, r.value) for r in self.produced if not r.aborted]


def wait_for(what: str, condition: Callable[[], bool], broker: KafkaBroker, step: Callable[[], None] | None = None
             ) -> None:
    """Poll `condition` (running `step` before each look) until it holds; fail naming `what` after the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if step is not None:
            step()
        if condition():
            return
        time.sleep(0.3)
    raise AssertionError(f"not within {DEADLINE_S} s: {what}\n{broker._tail(40)}")


class Writer:
    """Produces to the topic and records each record's offset and timestamp from its delivery report. Every record
    gets its own timestamp (the clock, or one more than the last), so offsetsForTimes has one answer per record."""

    def __init__(self, tier: Tier) -> None:
        self.tier = tier
        bootstrap = tier.broker.bootstrap
        self.plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        self.txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "kcompact-test", "linger.ms": 5})
        self.txn.init_transactions(30)
        self.count = 0
        self.clock = 0

    def _send(self, producer: Producer, n: int, aborted: bool = False, tombstone_every: int = 0) -> None:
        got: list[Produced] = []

        def delivered(err: object, msg: Message) -> None:
            assert err is None, err
            got.append(Produced(msg.offset(), msg.key(), msg.value(), msg.timestamp()[1], aborted))  # type: ignore[arg-type]

        for _ in range(n):
            self.count += 1
            tombstone = tombstone_every and self.count % tombstone_every == 0
            self.clock = max(int(time.time() * 1000), self.clock + 1)
            producer.produce(TOPIC, key=b"k%d" % (self.count % KEYS), value=None if tombstone else b"v%d" % self.count,
                             timestamp=self.clock, on_delivery=delivered)
        assert producer.flush(30) == 0
        self.tier.produced.extend(sorted(got, key=lambda r: r.offset))

    def updates(self, n: int = 50) -> None:
        self._send(self.plain, n, tombstone_every=9)

    def transaction(self, n: int, *, commit: bool) -> None:
        self.txn.begin_transaction()
        self._send(self.txn, n, aborted=not commit)
        if commit:
            self.txn.commit_transaction(30)
        else:
            self.txn.abort_transaction(30)

    def round(self) -> None:
        self.updates()
        self.transaction(10, commit=True)
        self.transaction(10, commit=False)


def create_tiered_topic(broker: KafkaBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "remote.storage.enable": "true",
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "local.retention.ms": "1000",
        "local.retention.bytes": "1",
        "segment.ms": "1000",
    }
    for f in admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)]).values():
        f.result(30)


def local_log_start(broker: KafkaBroker) -> int:
    bases = [int(p.stem) for p in broker.partition_dir(TOPIC, 0).glob("*.log")]
    return min(bases, default=0)


def tier_settled(tier: Tier) -> bool:
    """The broker is done: local retention rolls a non-empty active segment once it is due
    (UnifiedLog.deleteOldSegments), so the active segment is empty and every offset below it is tiered."""
    active = max(tier.broker.partition_dir(TOPIC, 0).glob("*.log"), key=lambda p: int(p.stem))
    live = tier.live()
    return active.stat().st_size == 0 and bool(live) and live[-1].end_offset + 1 == int(active.stem)


def consumer(broker: KafkaBroker, isolation: str = "read_committed", config: dict[str, Any] | None = None
             ) -> Consumer:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader", "enable.auto.commit": False,
                  "isolation.level": isolation, **(config or {})})
    c.assign([TopicPartition(TOPIC, 0, 0)])
    return c


def poll(c: Consumer, count: int) -> list[Record]:
    """The next `count` records (fewer only at the deadline); any error fails."""
    got: list[Record] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < count and time.monotonic() < deadline:
        msg = c.poll(1.0)
        if msg is None:
            continue
        offset = msg.offset()
        assert msg.error() is None and offset is not None, msg.error()
        got.append((offset, msg.key(), msg.value()))
    return got


def poll_until(c: Consumer, last_offset: int) -> list[Record]:
    """Records up to and including `last_offset` (fewer only at the deadline); any error fails."""
    got: list[Record] = []
    while not got or got[-1][0] < last_offset:
        more = poll(c, 1)
        if not more:
            break
        got += more
    return got


def read_all(broker: KafkaBroker, count: int, isolation: str = "read_committed") -> list[Record]:
    c = consumer(broker, isolation)
    try:
        return poll(c, count)
    finally:
        c.close()


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
    store = workdir / "store"
    broker = KafkaBroker(workdir / "kafka", jars=["tiered-plugin"], overrides={
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": "dev.kcompact.tiered.KcompactRemoteStorageManager",
        "remote.log.metadata.manager.class.name": "dev.kcompact.tiered.KcompactRemoteLogMetadataManager",
        "rsm.config.kcompact.store": str(store),
        "rlmm.config.kcompact.store": str(store),
        "rlmm.config.kcompact.python": sys.executable,
        "remote.log.manager.task.interval.ms": "500",
    })
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
            patch.setattr(run_commit, "commit_change_set", _after_a_broker_commit(tier, run_commit.commit_change_set))
            tier.report = compaction.compact(spark, str(tier.store), str(config)).to_dict()
    finally:
        stop.set()
        producing.join(60)
    tier.cleaned = table_in_store(open_store(str(tier.store))).partition_snapshot(TOPIC, 0).lineage.current
    assert tier.cleaned > 0, json.dumps(tier.report["partitions"] or tier.report["failed"], default=str)[:3000]
    wait_for("the broker tiered everything and its active segment is empty", lambda: tier_settled(tier), tier.broker)
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
        history = DeltaTable(str(tier.store / "_kcompact_metadata")).history()
        return any(h["version"] > version and h.get("kcompact.writer") == "broker-1" for h in history)

    def committing(table: Any, change_set: Any, now_ms: int) -> Any:
        wait_for(f"a broker commit after table version {change_set.base_version}",
                 lambda: broker_committed_since(change_set.base_version), tier.broker)
        return commit(table, change_set, now_ms)

    return committing


def test_the_compaction_committed_while_the_broker_tiered(tier: Tier) -> None:
    """The broker's tiering commits landed between the compaction's plan and its commit, and did not cost it its
    commit (compaction.metadata.rebase)."""
    (partition,) = tier.report["partitions"]
    assert partition["committed"], tier.report["failed"]
    planned, landed = tier.report["metadata_version_planned"], partition["metadata_version"]
    history = DeltaTable(str(tier.store / "_kcompact_metadata")).history()
    between = [h for h in history if planned < h["version"] < landed]
    brokers = [h for h in between if h.get("kcompact.writer") == "broker-1"]
    assert brokers, (planned, landed)
    # the rest is the run's own (it takes its fencing epoch in a commit of its own)
    assert {h.get("kcompact.run_id") for h in between if h not in brokers} <= {tier.report["run_id"]}
    snapshot = table_in_store(open_store(str(tier.store))).partition_snapshot(TOPIC, 0)
    assert any(s.writer != "broker-1" for s in snapshot.live_segments), "kcompact committed no segment"


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
    listed = subprocess.run([sys.executable, "-m", "compaction.cli", "segments", "--store", str(tier.store),
                             "--topic", TOPIC, "--partition", "0"], capture_output=True, text=True, check=True)
    assert f"{len(live)} live segments" in listed.stdout


def test_gc_after_the_grace_never_breaks_a_reader(tier: Tier) -> None:
    """A consumer is halfway through the compacted region when `kcompact gc` deletes the replaced segments."""
    expected = tier.view(committed=True)
    reader = consumer(tier.broker)
    try:
        got = poll(reader, len(expected) // 2)
        replaced = [s for s in table_in_store(open_store(str(tier.store))).partition_snapshot(TOPIC, 0).segments
                    if s.state is SegmentState.DELETE_SEGMENT_STARTED]
        assert replaced
        grace_ms = 5000  # waited out: on a quiet machine the fixture ends within a grace of the compaction's commit
        time.sleep(max(0.0, (max(s.event_timestamp_ms for s in replaced) + grace_ms + 200) / 1000 - time.time()))
        gc = subprocess.run([sys.executable, "-m", "compaction.cli", "gc", "--store", str(tier.store),
                             "--grace-ms", str(grace_ms), "--json"], capture_output=True, text=True, check=True)
        assert json.loads(gc.stdout)["totals"]["segments_finished"] == len(replaced), gc.stdout
        assert not any((tier.store / o.key).exists() for s in replaced for o in s.object_keys)
        got += poll(reader, len(expected) - len(got))
    finally:
        reader.close()
    assert got == expected
    assert read_all(tier.broker, len(expected)) == expected


def test_a_restarted_broker_serves_the_compacted_view(tier: Tier) -> None:
    tier.broker.restart()
    expected = tier.view(committed=True)
    assert read_all(tier.broker, len(expected)) == expected
