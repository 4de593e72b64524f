"""A workload written through a real broker by real producers (librdkafka via confluent-kafka), and what a real
read_committed consumer reads back.

Two producers write one topic in phases separated by more than the topic's `segment.ms`, so the broker rolls a
segment at the first append of each phase (Kafka rolls only on append):

- an idempotent producer (lz4): upserts with a header, some tombstones;
- a transactional producer (zstd): per phase one committed and one aborted transaction (its records flushed to the
  broker before the abort, so they are in the log), upserts and tombstones with headers.

Keys are chosen by a seeded RNG and each record goes to partition `key index % partitions`, so the expected view
is a pure function of the seed and what the broker assigned as offsets.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Seen:
    """One record as a consumer sees it."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True)
class Workload:
    topic: str
    partitions: int = 2
    keys: int = 30
    phases: int = 4
    upserts_per_phase: int = 40
    txn_records: int = 12
    tombstone_ratio: float = 0.15
    seed: int = 25
    snapshot_after_phase: int = 1


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, partitions, 1, config=config)]).values():
        f.result(30)


def alter_topic(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    """Sets `config` on the topic (incrementally: the other topic configs stay)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(30)


def produce(bootstrap: str, w: Workload, segment_ms: int, snapshot: Callable[[], None] | None = None) -> None:
    """Writes the workload, one phase every `segment_ms` + a margin; returns once every record is acknowledged.
    `snapshot` is called once, after phase `w.snapshot_after_phase`, while no producer writes."""
    rng = random.Random(w.seed)
    common = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"}
    plain = Producer({**common, "enable.idempotence": True, "compression.type": "lz4"})
    txn = Producer({**common, "transactional.id": f"{w.topic}-txn", "compression.type": "zstd"})
    txn.init_transactions(30)
    for phase in range(w.phases):
        if phase:
            time.sleep(segment_ms / 1000 + 0.3)  # the next append rolls the segment
        for i in range(w.upserts_per_phase):
            k = rng.randrange(w.keys)
            value = None if rng.random() < w.tombstone_ratio else b"plain-%d-%d" % (phase, i)
            plain.produce(w.topic, key=b"key-%03d" % k, value=value, partition=k % w.partitions,
                          headers=[("phase", b"%d" % phase), ("producer", b"plain")])
        assert plain.flush(30) == 0
        for outcome in ("commit", "abort"):
            txn.begin_transaction()
            for i in range(w.txn_records):
                k = rng.randrange(w.keys)
                value = None if rng.random() < w.tombstone_ratio else b"txn-%s-%d-%d" % (outcome.encode(), phase, i)
                txn.produce(w.topic, key=b"key-%03d" % k, value=value, partition=k % w.partitions,
                            headers=[("phase", b"%d" % phase), ("txn", outcome.encode())])
            assert txn.flush(30) == 0  # in the log before the marker, also when aborted
            if outcome == "commit":
                txn.commit_transaction(30)
            else:
                txn.abort_transaction(30)
        if snapshot is not None and phase == w.snapshot_after_phase:
            snapshot()


def consume(bootstrap: str, topic: str, partitions: Sequence[int], isolation: str = "read_committed",
            timeout_s: float = 60) -> dict[int, list[Seen]]:
    """Every record of the partitions from the log start to their end, as a consumer with `isolation` reads them."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"referee-{time.monotonic_ns()}",
                         "isolation.level": isolation, "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen: dict[int, list[Seen]] = {p: [] for p in partitions}
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while at_end != set(partitions):
            assert time.monotonic() < deadline, f"consumer did not reach the end of {sorted(set(partitions) - at_end)}"
            msg = consumer.poll(1)
            if msg is None:
                continue
            error, partition, offset = msg.error(), msg.partition(), msg.offset()
            assert partition is not None
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(partition)
                continue
            assert offset is not None
            seen[partition].append(Seen(offset, msg.key(), msg.value(), _headers(msg.headers())))
    finally:
        consumer.close()
    return seen


def _headers(headers: object) -> Headers:
    """A consumed record's headers (librdkafka hands a list of (name, bytes or None) pairs, or None)."""
    assert headers is None or isinstance(headers, list), headers
    return tuple((k, v if isinstance(v, bytes) else b"") for k, v in headers or ())


def latest_per_key_below(records: Iterable[Seen], below: int) -> list[Seen]:
    """What compaction may leave of `records` (a read_committed view): the latest record of each key below
    `below` (a tombstone included), then every record at or above it, in offset order."""
    latest: dict[bytes | None, Seen] = {}
    above: list[Seen] = []
    for r in records:
        if r.offset < below:
            latest[r.key] = r
        else:
            above.append(r)
    return sorted(latest.values(), key=lambda r: r.offset) + above
