"""A stock Kafka broker tiers through kcompact's plugin (`kafka/tiered-plugin`) and serves the tier back.

The broker runs KIP-405 with `KcompactRemoteStorageManager` writing kcompact's store layout in a local directory
and `KcompactRemoteLogMetadataManager` keeping the segments in kcompact's metadata table. The topic is
`cleanup.policy=delete` with infinite retention and a small local retention, so the broker copies every rolled
segment to the store and then deletes it locally; a consumer from offset 0 then reads the first segments through
the broker's remote fetch, and kcompact lists what the broker tiered. Then `kcompact compact` rewrites the tier
and the same broker goes on tiering above it and serves the compacted view from offset 0 (Kafka fetches past the
offsets compaction removed from a remote segment since KAFKA-15388).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import compaction
from compaction.metadata import SegmentMetadata, table_in_store
from compaction.storage import open_store
from tests.kafka.conftest import BrokerFactory
from tests.kafka_runtime import KafkaBroker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOPIC = "tiered"
DEADLINE_S = 90.0


def tiered_broker(factory: BrokerFactory, store: Path) -> KafkaBroker:
    return factory(overrides={
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": "dev.kcompact.tiered.KcompactRemoteStorageManager",
        "remote.log.metadata.manager.class.name": "dev.kcompact.tiered.KcompactRemoteLogMetadataManager",
        "rsm.config.kcompact.store": str(store),
        "rlmm.config.kcompact.store": str(store),
        "rlmm.config.kcompact.python": sys.executable,
        "remote.log.manager.task.interval.ms": "500",
    }, jars=["tiered-plugin"])


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


def local_log_start(broker: KafkaBroker) -> int:
    bases = [int(p.stem) for p in broker.partition_dir(TOPIC, 0).glob("*.log")]
    return min(bases, default=0)


def tier_settled(broker: KafkaBroker, store: Path) -> bool:
    active = max(broker.partition_dir(TOPIC, 0).glob("*.log"), key=lambda p: int(p.stem))
    return active.stat().st_size == 0 and _live(store)[-1].end_offset + 1 == int(active.stem)


def read_all(broker: KafkaBroker, count: int) -> list[tuple[int, bytes | None, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    got: list[tuple[int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            offset = msg.offset()
            assert msg.error() is None and offset is not None, msg.error()
            got.append((offset, msg.key(), msg.value()))
    finally:
        consumer.close()
    return got


def tiered_topic(factory: BrokerFactory, store: Path) -> tuple[KafkaBroker, list[tuple[bytes, bytes]]]:
    """A broker whose topic has at least 3 segments tiered through the plugin and deleted locally, and what was
    produced to it (updates of 37 keys, offsets from 0)."""
    broker = tiered_broker(factory, store)
    create_tiered_topic(broker)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    produced: list[tuple[bytes, bytes]] = []

    def produce_round() -> None:
        for _ in range(50):
            key, value = b"k%d" % (len(produced) % 37), b"v%d" % len(produced)
            producer.produce(TOPIC, key=key, value=value)
            produced.append((key, value))
        assert producer.flush(30) == 0

    # segment.ms rolls on the next append after a second; local retention removes what the broker tiered.
    wait_for("the broker tiered 3 segments and deleted them locally", lambda: local_log_start(broker) > 0
             and len(_live(store)) >= 3, broker, step=produce_round)
    return broker, produced


def compacted_view(produced: list[tuple[bytes, bytes]], cleaned: int) -> list[tuple[int, bytes, bytes]]:
    """What Kafka's cleaner leaves: below `cleaned`, each key's last record there; from `cleaned` on, every record."""
    last = {key: offset for offset, (key, _) in enumerate(produced[:cleaned])}
    return [(o, k, v) for o, (k, v) in enumerate(produced) if o >= cleaned or last[k] == o]


def test_broker_tiers_through_the_plugin_and_serves_what_kcompact_compacted(
    kafka_broker_factory: BrokerFactory, tmp_path: Path, spark: SparkSession
) -> None:
    store = tmp_path / "store"
    broker, produced = tiered_topic(kafka_broker_factory, store)

    got = read_all(broker, len(produced))
    assert [o for o, _, _ in got] == list(range(len(produced)))
    assert [(k, v) for _, k, v in got] == produced

    # The broker's own commits (a segment it tiers) conflict with a compaction's, so wait until it is done: local
    # retention rolls a non-empty active segment once it is due (UnifiedLog.deleteOldSegments), so the broker is
    # done when the active segment is empty and every offset below it is tiered.
    wait_for("the broker tiered everything and its active segment is empty", lambda: tier_settled(broker, store),
             broker)

    live = _live(store)
    assert live[0].start_offset == 0
    assert all(a.end_offset + 1 == b.start_offset for a, b in itertools.pairwise(live))
    assert live[-1].end_offset == len(produced) - 1
    assert all(s.writer == "broker-1" for s in live)
    listed = subprocess.run([sys.executable, "-m", "compaction.cli", "segments", "--store", str(store),
                             "--topic", TOPIC, "--partition", "0"], capture_output=True, text=True, check=True)
    assert f"{len(live)} live segments" in listed.stdout

    config = tmp_path / "kcompact.yaml"
    config.write_text(f"topics:\n  {TOPIC}:\n    cleanup.policy: compact\n    min.cleanable.dirty.ratio: 0.01\n")
    report = compaction.compact(spark, str(store), str(config))
    snapshot = table_in_store(open_store(str(store))).partition_snapshot(TOPIC, 0)
    cleaned = snapshot.lineage.current
    assert cleaned > 0, json.dumps(report.to_dict()["partitions"], default=str)[:3000]
    assert any(s.writer != "broker-1" for s in snapshot.live_segments), "kcompact committed no segment"

    # The broker goes on tiering above the compacted region, with no gap and no overlap.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})

    def produce_more() -> None:
        for i in range(20):
            produced.append((b"k%d" % i, b"after-%d" % len(produced)))
            producer.produce(TOPIC, key=produced[-1][0], value=produced[-1][1])
        assert producer.flush(30) == 0

    wait_for("the broker tiered a segment above the compacted region",
             lambda: _live(store)[-1].end_offset >= cleaned, broker, step=produce_more)
    live = _live(store)
    assert all(a.end_offset + 1 == b.start_offset for a, b in itertools.pairwise(live))
    assert live[-1].writer == "broker-1"

    # The same broker, without a restart, serves the compacted tier from offset 0, then what it tiered since, then
    # its local log.
    expected = compacted_view(produced, cleaned)
    assert len(expected) < len(produced)
    got = read_all(broker, len(expected))
    assert [(o, k, v) for o, k, v in got] == expected


def _live(store: Path) -> tuple[SegmentMetadata, ...]:
    if not (store / "_kcompact_metadata").is_dir():
        return ()
    return table_in_store(open_store(str(store))).live_segments(TOPIC, 0)
