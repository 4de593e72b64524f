"""What the tiered-plugin tests share: the topic, a producer that records what it wrote, consumers, waits, and the
broker settings that put the plugin on a store (`plugin_overrides`).

A `Tier` is a broker (or a cluster of them, tests/kafka_cluster.py) tiering one partition of `TOPIC` into a kcompact
store, and everything produced to it; `view` is what a consumer must get once kcompact compacted below `cleaned`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable

from compaction.errors import MetadataTableNotFoundError
from compaction.metadata import METADATA_TABLE_NAME, PartitionSnapshot, SegmentMetadata, table_in_store
from compaction.storage import ObjectStore
from tests.kafka_runtime import KafkaBroker

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


class Brokers(Protocol):
    """What a client and a failure message need of a broker or a cluster."""

    @property
    def bootstrap(self) -> str: ...

    def tail(self, lines: int = 30) -> str: ...


B = TypeVar("B", bound=Brokers)


@dataclass
class Tier(Generic[B]):
    """The module's broker (or cluster) and store, everything produced to the topic, and what was observed around the
    swap."""

    broker: B
    store: ObjectStore
    produced: list[Produced]
    cleaned: int = 0
    report: dict[str, Any] = field(default_factory=dict)
    mid_read: tuple[list[Record], list[Record]] = ([], [])  # a consumer's records before and after the swap
    mid_reader: Consumer | None = None
    writer: Writer | None = None  # its producers must go before the broker does

    def live(self) -> tuple[SegmentMetadata, ...]:
        try:
            return table_in_store(self.store).live_segments(TOPIC, 0)
        except MetadataTableNotFoundError:  # the broker's first add creates it
            return ()

    def partition(self) -> PartitionSnapshot:
        return table_in_store(self.store).partition_snapshot(TOPIC, 0)

    def history(self) -> list[dict[str, Any]]:
        """The metadata table's commits, newest first, with kcompact's commit info (writer, run id)."""
        uri, options = self.store.delta_uri(METADATA_TABLE_NAME), self.store.delta_storage_options()
        return DeltaTable(uri, storage_options=options).history()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`kcompact ARGS --store STORE` (and the store's endpoint), which must succeed."""
        endpoint = ["--endpoint-url", self.store.spec.endpoint_url] if self.store.spec.endpoint_url else []
        return subprocess.run([sys.executable, "-m", "compaction.cli", *args, "--store", self.store.uri, *endpoint],
                              capture_output=True, text=True, check=True)

    def view(self, *, committed: bool) -> list[Record]:
        """What Kafka's cleaner leaves below `cleaned` (each key's last record there that no abort removed, tombstones
        included: their delete horizon is a day away), and from `cleaned` on every record, an aborted one only for
        a read_uncommitted consumer."""
        last = {r.key: r.offset for r in self.produced if r.offset < self.cleaned and not r.aborted}
        return [(r.offset, r.key, r.value) for r in self.produced
                if (last.get(r.key) == r.offset if r.offset < self.cleaned else not (committed and r.aborted))]

    def uncompacted(self) -> list[Record]:
        return [(r.offset, r.key, r.value) for r in self.produced if not r.aborted]


def wait_for(what: str, condition: Callable[[], bool], broker: Brokers, step: Callable[[], None] | None = None,
             deadline_s: float = DEADLINE_S) -> None:
    """Poll `condition` (running `step` before each look) until it holds; fail naming `what` and the broker log's
    tail after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if step is not None:
            step()
        if condition():
            return
        time.sleep(0.3)
    raise AssertionError(f"not within {deadline_s} s: {what}\n{broker.tail(40)}")


class Writer:
    """Produces to the topic and records each record's offset and timestamp from its delivery report. Every record
    gets its own timestamp (the clock, or one more than the last), so offsetsForTimes has one answer per record."""

    def __init__(self, tier: Tier[Any]) -> None:
        self.tier = tier
        bootstrap = tier.broker.bootstrap
        self.plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        self.txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "kcompact-test", "linger.ms": 5})
        self.txn.init_transactions(30)
        self.count = 0
        self.clock = 0

    def _send(self, producer: Producer, n: int, aborted: bool = False, tombstone_every: int = 0,
              pace_s: float = 0.0, age_ms: int = 0) -> None:
        got: list[Produced] = []

        def delivered(err: object, msg: Message) -> None:
            assert err is None, err
            got.append(Produced(msg.offset(), msg.key(), msg.value(), msg.timestamp()[1], aborted))  # type: ignore[arg-type]

        for _ in range(n):
            self.count += 1
            tombstone = tombstone_every and self.count % tombstone_every == 0
            self.clock = max(int(time.time() * 1000) - age_ms, self.clock + 1)
            producer.produce(TOPIC, key=b"k%d" % (self.count % KEYS), value=None if tombstone else b"v%d" % self.count,
                             timestamp=self.clock, on_delivery=delivered)
            if pace_s:
                producer.poll(pace_s)
        assert producer.flush(30) == 0
        self.tier.produced.extend(sorted(got, key=lambda r: r.offset))

    def updates(self, n: int = 50, pace_s: float = 0.0, age_ms: int = 0, via: Producer | None = None) -> None:
        """`n` records, every ninth a tombstone; with `pace_s`, one every `pace_s` seconds (a stream rather than one
        batch); with `age_ms`, timestamped at least that long ago (one more than the last record's at least); `via`
        another idempotent producer than the writer's own (one that never knew a broker now frozen)."""
        self._send(via or self.plain, n, tombstone_every=9, pace_s=pace_s, age_ms=age_ms)

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


def tiered_topic_config(segment_ms: int) -> dict[str, str]:
    """A topic tiered as soon as the broker can: remote storage on, kept forever, a second of local retention, a
    segment rolled every `segment_ms`."""
    return {
        "remote.storage.enable": "true",
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "local.retention.ms": "1000",
        "local.retention.bytes": "1",
        "segment.ms": str(segment_ms),
    }


def create_tiered_topic(broker: Brokers, replicas: int = 1, segment_ms: int = 1000,
                        extra: Mapping[str, str] | None = None) -> None:
    """`TOPIC`, one partition on `replicas` brokers (min.insync.replicas 2 when there are several), tiered with a
    second of local retention and a segment rolled every `segment_ms` of records, with the `extra` topic configs."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {**tiered_topic_config(segment_ms), **({"min.insync.replicas": "2"} if replicas > 1 else {}),
              **(extra or {})}
    for f in admin.create_topics([NewTopic(TOPIC, 1, replicas, config=config)]).values():
        f.result(30)


def local_log_start(broker: KafkaBroker) -> int:
    bases = [int(p.stem) for p in broker.partition_dir(TOPIC, 0).glob("*.log")]
    return min(bases, default=0)


def tier_settled(tier: Tier[Any], broker: KafkaBroker | None = None) -> bool:
    """The broker (`broker`, else the tier's own), leading the partition, is done: local retention rolls a non-empty
    active segment once it is due (UnifiedLog.deleteOldSegments), so the active segment is empty and every offset
    below it is tiered."""
    leader: KafkaBroker = broker or tier.broker
    active = max(leader.partition_dir(TOPIC, 0).glob("*.log"), key=lambda p: int(p.stem))
    live = tier.live()
    try:
        size = active.stat().st_size
    except FileNotFoundError:  # rolled and deleted by the broker between the listing and the stat: not settled yet
        return False
    return size == 0 and bool(live) and live[-1].end_offset + 1 == int(active.stem)


def consumer(broker: Brokers, isolation: str = "read_committed", config: dict[str, Any] | None = None
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


def read_all(broker: Brokers, count: int, isolation: str = "read_committed") -> list[Record]:
    c = consumer(broker, isolation)
    try:
        return poll(c, count)
    finally:
        c.close()


def plugin_overrides(store: ObjectStore, python: str = sys.executable) -> dict[str, str]:
    """Broker settings that tier through kcompact's plugin into `store` (its endpoint too, for S3), the metadata
    process run by `python`, and the remote log manager's task every 500 ms."""
    overrides = {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": "dev.kcompact.tiered.KcompactRemoteStorageManager",
        "remote.log.metadata.manager.class.name": "dev.kcompact.tiered.KcompactRemoteLogMetadataManager",
        "remote.log.manager.task.interval.ms": "500",
    }
    for prefix in ("rsm.config.", "rlmm.config."):
        overrides[prefix + "kcompact.store"] = store.uri
        overrides[prefix + "kcompact.python"] = python
        if store.spec.endpoint_url:
            overrides[prefix + "kcompact.endpoint.url"] = store.spec.endpoint_url
    return overrides
