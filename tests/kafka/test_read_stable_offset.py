"""`kcompact read --isolation read_committed` stops where a real broker's read_committed consumer stops (issue 40).

Real producers (librdkafka through confluent-kafka) write `held` (2 partitions) through a single-node KRaft broker
whose segments roll every `segment.ms`, in three phases (a roll at the first append of each):

1. an idempotent producer's records, an aborted and a committed transaction of a second, transactional producer;
2. that producer begins a transaction on partition 0; a third one ("holder") begins one there too, sends and
   flushes, and never commits it; the second commits afterwards, so its records lie below the holder's and its
   marker above; plain records and another committed transaction follow;
3. (the active segment) the holder writes on, now on partition 1 as well, its first records there; plain records
   and a committed transaction follow on both.

So partition 0's open transaction begins in a rolled segment (the tier) and partition 1's in the active one (the WAL
tail). The broker is the referee: ListOffsets at read_committed answers each partition's last stable offset (the
holder's first offset there), and a read_committed consumer reads to it and stops. Then a copy of the partitions'
directories (taken while nobody writes) goes through `kcompact tier` (the rolled segments) and `kcompact wal upload`
(the active one), as in test_broker_input.py, and `kcompact read` must return what the consumers read: at
read_committed exactly the records below the last stable offset (offsets, keys, values, headers), none from it on,
and at read_uncommitted everything a read_uncommitted consumer reads, the holder's records included.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from compaction.cli import main
from compaction.reader import log_refs
from compaction.storage import ObjectStore, open_store
from tests.kafka.broker_workload import Seen, consume, create_topic
from tests.kafka_runtime import KafkaBroker

TOPIC = "held"
PARTITIONS = (0, 1)
SEGMENT_MS = 1000
HOLDER = b"holder"


@dataclass(frozen=True)
class Refereed:
    """What the broker answered, and what kcompact read from the same log once tiered and uploaded."""

    store: ObjectStore
    stable: dict[int, int]  # ListOffsets LATEST at read_committed
    end: dict[int, int]  # ListOffsets LATEST at read_uncommitted
    committed: dict[int, list[Seen]]  # a read_committed consumer, to where it stops
    uncommitted: dict[int, list[Seen]]  # a read_uncommitted consumer, to the log end
    kcompact_committed: dict[int, list[Seen]]
    kcompact_uncommitted: dict[int, list[Seen]]


def _kcompact_read(store: ObjectStore, partition: int, isolation: str, from_offset: int = 0) -> list[Seen]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["read", "--store", store.uri, "--topic", TOPIC, "--partition", str(partition),
                     "--isolation", isolation, "--from-offset", str(from_offset)])
    assert code == 0, err.getvalue()[-3000:]
    return [_seen(json.loads(line)) for line in out.getvalue().splitlines()]


def _seen(row: dict[str, object]) -> Seen:
    def unb64(text: object) -> bytes | None:
        return None if text is None else base64.b64decode(str(text))

    headers = row["headers"]
    assert isinstance(headers, list)
    return Seen(int(str(row["offset"])), unb64(row["key"]), unb64(row["value"]),
                tuple((h["key"], unb64(h["value"]) or b"") for h in headers))


def _cli(args: list[str]) -> None:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(args)
    assert code == 0, f"kcompact {' '.join(args)} exited {code}: {err.getvalue()[-3000:]}"


def _latest(bootstrap: str, isolation: IsolationLevel) -> dict[int, int]:
    """ListOffsets LATEST at `isolation`: the last stable offset at read_committed, the high watermark else."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    asked = {TopicPartition(TOPIC, p): OffsetSpec.latest() for p in PARTITIONS}
    answers = admin.list_offsets(asked, isolation_level=isolation, request_timeout=30)
    return {tp.partition: future.result().offset for tp, future in answers.items()}


def _produce(bootstrap: str) -> Producer:
    """The three phases (module docstring); returns the holder, its transaction still open."""
    common = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"}
    plain = Producer({**common, "enable.idempotence": True})
    txn = Producer({**common, "transactional.id": f"{TOPIC}-txn"})
    holder = Producer({**common, "transactional.id": f"{TOPIC}-holder", "transaction.timeout.ms": 600_000})
    txn.init_transactions(30)
    holder.init_transactions(30)
    counter = iter(range(1_000_000))

    def send(producer: Producer, name: bytes, partitions: tuple[int, ...], count: int) -> None:
        for p in partitions:
            for _ in range(count):
                i = next(counter)
                producer.produce(TOPIC, key=b"key-%02d" % (i % 17), value=b"%s-%d" % (name, i), partition=p,
                                 headers=[("producer", name)])
        assert producer.flush(30) == 0

    def transaction(name: bytes, commit: bool, partitions: tuple[int, ...] = PARTITIONS) -> None:
        txn.begin_transaction()
        send(txn, name, partitions, 4)
        txn.commit_transaction(30) if commit else txn.abort_transaction(30)

    send(plain, b"plain", PARTITIONS, 10)
    transaction(b"aborted", commit=False)
    transaction(b"committed", commit=True)
    time.sleep(SEGMENT_MS / 1000 + 0.3)  # the next append rolls the segment
    txn.begin_transaction()
    send(txn, b"spanning", (0,), 3)  # below the holder's first offset, its COMMIT above it
    holder.begin_transaction()
    send(holder, HOLDER, (0,), 5)
    txn.commit_transaction(30)
    send(plain, b"plain", PARTITIONS, 10)
    transaction(b"committed", commit=True)
    time.sleep(SEGMENT_MS / 1000 + 0.3)
    send(plain, b"plain", PARTITIONS, 5)
    send(holder, HOLDER, PARTITIONS, 5)
    send(plain, b"plain", PARTITIONS, 10)
    transaction(b"committed", commit=True)
    return holder


@pytest.fixture(scope="module")
def refereed(kafka_runtime: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Refereed]:
    root = tmp_path_factory.mktemp("read-stable-offset")
    broker = KafkaBroker(root / "broker")
    try:
        broker.start()
        create_topic(broker.bootstrap, TOPIC, len(PARTITIONS), {"cleanup.policy": "delete",
                                                                "segment.ms": str(SEGMENT_MS)})
        holder = _produce(broker.bootstrap)
        stable = _latest(broker.bootstrap, IsolationLevel.READ_COMMITTED)
        end = _latest(broker.bootstrap, IsolationLevel.READ_UNCOMMITTED)
        committed = consume(broker.bootstrap, TOPIC, PARTITIONS, "read_committed")
        uncommitted = consume(broker.bootstrap, TOPIC, PARTITIONS, "read_uncommitted")
        (root / "logdir").mkdir()
        for p in PARTITIONS:  # nobody writes: closed segments are immutable, the active one holds whole batches
            shutil.copytree(broker.partition_dir(TOPIC, p), root / "logdir" / f"{TOPIC}-{p}")
        holder.abort_transaction(30)
        store = open_store(str(root / "store"))
        _cli(["tier", "--logdir", str(root / "logdir"), "--store", store.uri])
        _cli(["wal", "upload", "--logdir", str(root / "logdir"), "--store", store.uri, "--broker-id", "1"])
        yield Refereed(store, stable, end, committed, uncommitted,
                       {p: _kcompact_read(store, p, "read_committed") for p in PARTITIONS},
                       {p: _kcompact_read(store, p, "read_uncommitted") for p in PARTITIONS})
    finally:
        broker.stop()


def test_the_broker_holds_committed_records_back_behind_the_open_transaction(refereed: Refereed) -> None:
    """The setting the brief asks for, as the broker sees it: the last stable offset is the holder's first offset,
    below the log end, with committed records past it; the open transaction begins in the tier on partition 0 and
    in the WAL tail on partition 1."""
    for p in PARTITIONS:
        holders = [r.offset for r in refereed.uncommitted[p] if dict(r.headers).get("producer") == HOLDER]
        assert refereed.stable[p] == holders[0] < refereed.end[p]
        assert [r.offset for r in refereed.committed[p]] == [r.offset for r in refereed.uncommitted[p]
                                                              if r.offset < refereed.stable[p]
                                                              and dict(r.headers)["producer"] != b"aborted"]
        assert any(r.offset > refereed.stable[p] and dict(r.headers)["producer"] == b"committed"
                   for r in refereed.uncommitted[p]), "nothing committed after the open transaction"
        piece = next(r for r in log_refs(refereed.store, TOPIC, p)
                     if r.start_offset <= refereed.stable[p] <= r.end_offset)
        assert piece.wal is (p == 1)
    assert any(dict(r.headers)["producer"] == b"spanning" for r in refereed.committed[0])


def test_read_committed_stops_where_the_consumer_stops(refereed: Refereed) -> None:
    for p in PARTITIONS:
        assert refereed.kcompact_committed[p] == refereed.committed[p], f"partition {p}"


def test_a_read_from_the_last_stable_offset_returns_nothing(refereed: Refereed) -> None:
    for p in PARTITIONS:
        assert _kcompact_read(refereed.store, p, "read_committed", refereed.stable[p]) == []
        assert _kcompact_read(refereed.store, p, "read_committed", refereed.stable[p] - 1) == [
            r for r in refereed.committed[p] if r.offset == refereed.stable[p] - 1]


def test_read_uncommitted_still_returns_the_open_transaction(refereed: Refereed) -> None:
    for p in PARTITIONS:
        assert refereed.kcompact_uncommitted[p] == refereed.uncommitted[p], f"partition {p}"
        assert any(dict(r.headers)["producer"] == HOLDER for r in refereed.kcompact_uncommitted[p])
