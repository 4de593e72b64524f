"""A realistic Kafka log directory, generated: what `kcompact generate`, the demo and the tests use.

Each `<topic>-<partition>` directory holds many rolled segments plus an active one, written as a
broker writes them: `.log`, `.index`/`.timeindex` by Kafka's index.interval.bytes rule, `.txnindex`
for segments holding ABORT markers, a producer `.snapshot` at every roll, `leader-epoch-checkpoint`
and `partition.metadata`. The records are a mixture a platform team would recognise:

- keys drawn from a Zipf-like distribution (a few hot keys are updated very often), some tombstones;
- plain, idempotent and transactional producers, each with its own codec (so every codec appears),
  transactions that commit and that abort, interleaved with other producers' batches;
- a `version` header (8-byte big-endian long, increasing per key, sometimes missing or short) for
  KIP-280's header strategy, and producer timestamps that go backwards now and then;
- leader epoch changes at random offsets.

Everything is a pure function of `WorkloadSpec` (the seed included), so tests can regenerate a log dir
and know exactly what is in it (`PartitionTruth`).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

from compaction.format.batch import Header, Record, RecordBatch, build_batch, encode_batch
from compaction.format.checkpoints import EpochEntry
from compaction.format.codecs import Codec
from compaction.format.control import ControlType, end_txn_marker
from compaction.format.indexes import AbortedTxn
from compaction.format.producer_snapshot import ProducerStateEntry
from compaction.generate.logdir import LogDirWriter, rolls
from compaction.generate.topics import TopicSpec, iter_partitions, topic_ids

VERSION_HEADER = "version"
_LONG = struct.Struct(">q")


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that determines a generated log dir."""

    topics: tuple[TopicSpec, ...] = (TopicSpec("orders", 2), TopicSpec("users", 2), TopicSpec("inventory", 1))
    records_per_partition: int = 20_000
    keys: int = 2_000
    key_skew: float = 1.1
    value_bytes: int = 100
    tombstone_ratio: float = 0.03
    segment_bytes: int = 256 * 1024
    index_interval_bytes: int = 4096
    records_per_batch: int = 20
    transactional_ratio: float = 0.25
    abort_ratio: float = 0.3
    idempotent_ratio: float = 0.35
    leader_epoch_changes: int = 2
    start_ms: int = 1_700_000_000_000
    ms_per_record: int = 50
    out_of_order_ratio: float = 0.02
    codecs: tuple[Codec, ...] = tuple(Codec)
    seed: int = 42

    def ending_at(self, now_ms: int) -> WorkloadSpec:
        """This spec with its clock moved so that the last of its `records_per_partition` records is stamped
        `now_ms` (the clock advances `ms_per_record` before each record; a transaction still open then ends a
        few records later)."""
        return dataclasses.replace(self, start_ms=now_ms - self.records_per_partition * self.ms_per_record)


@dataclass
class _Producer:
    pid: int
    epoch: int
    codec: Codec
    transactional: bool
    idempotent: bool
    seq: int = 0
    txn_first_offset: int | None = None
    txn_batches_left: int = 0
    coordinator_epoch: int = 0
    last_offset: int = -1
    last_seq: int = -1
    last_offset_delta: int = 0
    last_timestamp: int = -1

    def appended(self, batch: RecordBatch, rng: random.Random) -> None:
        """Track a data batch of this producer: its open transaction (1-3 batches long) and its sequence."""
        if self.transactional:
            if self.txn_first_offset is None:
                self.txn_first_offset = batch.base_offset
                self.txn_batches_left = rng.randrange(1, 4)
            self.txn_batches_left -= 1
        if self.idempotent:
            n = len(batch.records)
            self.last_seq = self.seq + n - 1
            self.seq += n
            self.last_offset = batch.last_offset
            self.last_offset_delta = batch.last_offset_delta
            self.last_timestamp = batch.max_timestamp


@dataclass
class PartitionTruth:
    """What was written, for tests: every batch in offset order and the roll points."""

    topic: str
    partition: int
    topic_id: str
    batches: list[RecordBatch] = field(default_factory=list)
    segment_bases: list[int] = field(default_factory=list)
    log_end_offset: int = 0
    aborted: list[AbortedTxn] = field(default_factory=list)


class _PartitionWriter:
    """Rolls segments by size as a broker's LocalLog would, and hands each whole segment to a `LogDirWriter`."""

    def __init__(self, directory: Path, spec: WorkloadSpec, truth: PartitionTruth) -> None:
        self.files = LogDirWriter(directory, spec.index_interval_bytes)
        self.segment_bytes = spec.segment_bytes
        self.truth = truth
        self.base = 0
        self.chunks: list[bytes] = []
        self.size = 0
        self.aborted: list[AbortedTxn] = []
        truth.segment_bases.append(0)

    def append(self, batch: RecordBatch, data: bytes, producers: dict[int, _Producer]) -> None:
        if rolls(self.size, len(data), self.segment_bytes):
            self.roll(batch.base_offset, producers)
        self.chunks.append(data)
        self.size += len(data)
        self.truth.batches.append(batch)

    def abort_recorded(self, txn: AbortedTxn) -> None:
        self.aborted.append(txn)
        self.truth.aborted.append(txn)

    def roll(self, next_base: int, producers: dict[int, _Producer]) -> None:
        self.flush()
        self.files.write_snapshot(next_base, _snapshot(producers))
        self.base = next_base
        self.chunks, self.size, self.aborted = [], 0, []
        self.truth.segment_bases.append(next_base)

    def flush(self) -> None:
        self.files.write_segment(self.base, b"".join(self.chunks), self.aborted)


def _snapshot(producers: dict[int, _Producer]) -> list[ProducerStateEntry]:
    return [
        ProducerStateEntry(
            producer_id=p.pid,
            producer_epoch=p.epoch,
            last_sequence=p.last_seq,
            last_offset=p.last_offset,
            offset_delta=p.last_offset_delta,
            timestamp=p.last_timestamp,
            coordinator_epoch=p.coordinator_epoch,
            current_txn_first_offset=-1 if p.txn_first_offset is None else p.txn_first_offset,
        )
        for p in sorted(producers.values(), key=lambda p: p.pid)
        if p.last_offset >= 0 and (p.idempotent or p.transactional)
    ]


def _zipf_cumulative(rng: random.Random, n_keys: int, skew: float) -> list[float]:
    """Cumulative Zipf weights over shuffled key ids (so hot keys are spread over the key space)."""
    weights = [1.0 / (rank**skew) for rank in range(1, n_keys + 1)]
    rng.shuffle(weights)
    return list(itertools.accumulate(weights))


class _RecordSource:
    """The records of one partition in order: Zipf-drawn keys, values or tombstones, a `version` header.

    Owns the partition's clock, which advances `ms_per_record` per record; now and then a record's timestamp
    goes back up to a minute.
    """

    def __init__(self, rng: random.Random, spec: WorkloadSpec) -> None:
        self.rng = rng
        self.spec = spec
        self.key_cumulative = _zipf_cumulative(rng, spec.keys, spec.key_skew)
        self.key_ids = list(range(spec.keys))
        self.versions: dict[int, int] = {}
        self.pool = bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(4096))
        self.clock = spec.start_ms

    def next_record(self, offset: int) -> Record:
        """The record at `offset`."""
        rng, spec = self.rng, self.spec
        self.clock += spec.ms_per_record
        ts = self.clock - rng.randrange(1, 60_000) if rng.random() < spec.out_of_order_ratio else self.clock
        k = rng.choices(self.key_ids, cum_weights=self.key_cumulative)[0]
        value = self._value(k, ts)
        self.versions[k] = self.versions.get(k, 0) + rng.randrange(1, 4)
        return Record(offset, ts, b"key-%08d" % k, value, self._headers(k))

    def _value(self, k: int, ts: int) -> bytes | None:
        if self.rng.random() < self.spec.tombstone_ratio:
            return None
        size = self.spec.value_bytes
        start = self.rng.randrange(0, len(self.pool) - size)
        return b'{"id":%d,"at":%d,"p":"' % (k, ts) + self.pool[start : start + size] + b'"}'

    def _headers(self, k: int) -> tuple[Header, ...]:
        """Mostly the key's current version; sometimes missing, short, or preceded by a stale one."""
        h = self.rng.random()
        if h < 0.02:
            return ()
        if h < 0.03:
            return (Header(VERSION_HEADER, b"\x01\x02"),)
        version = _LONG.pack(self.versions[k])
        if h < 0.05:
            return (Header(VERSION_HEADER, _LONG.pack(0)), Header(VERSION_HEADER, version))
        return (Header(VERSION_HEADER, version), Header("source", b"generator"))


def _producers(rng: random.Random, spec: WorkloadSpec, partition: int) -> dict[int, _Producer]:
    """Six producers by slot, each plain, idempotent or transactional, each with its own codec."""
    producers: dict[int, _Producer] = {}
    for i in range(6):
        roll = rng.random()
        transactional = roll < spec.transactional_ratio
        idempotent = transactional or roll < spec.transactional_ratio + spec.idempotent_ratio
        slot = 1000 + partition * 100 + i
        epoch = rng.randrange(0, 3)
        # A producer without idempotence has no producer id (-1), as in Kafka; the broker tracks only the others.
        producers[slot] = _Producer(
            slot if idempotent else -1, epoch if idempotent else -1, spec.codecs[(i + 1) % len(spec.codecs)],
            transactional, idempotent,
        )
    return producers


class _LeaderEpochs:
    """The partition's leader epochs: `leader_epoch_changes` bumps of 1 or 2 at random offsets."""

    def __init__(self, rng: random.Random, spec: WorkloadSpec) -> None:
        self.rng = rng
        self.entries = [EpochEntry(0, 0)]
        self.change_at = sorted(
            rng.randrange(1, max(2, spec.records_per_partition)) for _ in range(spec.leader_epoch_changes)
        )

    def at(self, offset: int) -> int:
        """The leader epoch of the batch about to be written at `offset` (at most one change per batch)."""
        if self.change_at and offset >= self.change_at[0]:
            self.change_at.pop(0)
            self.entries.append(EpochEntry(self.entries[-1].epoch + self.rng.randrange(1, 3), offset))
        return self.entries[-1].epoch


def generate_partition(
    directory: Path, spec: WorkloadSpec, topic: str, partition: int, topic_id: str
) -> PartitionTruth:
    """Write one partition directory; returns what was written.

    Writes `records_per_partition` records, then only ends the transactions still open. Deterministic in
    `spec`, `topic` and `partition`.
    """
    rng = random.Random(f"{spec.seed}/{topic}/{partition}")
    truth = PartitionTruth(topic, partition, topic_id)
    writer = _PartitionWriter(directory, spec, truth)
    source = _RecordSource(rng, spec)
    producers = _producers(rng, spec, partition)
    writers = [_Producer(-1, -1, spec.codecs[0], transactional=False, idempotent=False), *producers.values()]
    epochs = _LeaderEpochs(rng, spec)
    offset = 0
    while offset < spec.records_per_partition or _open_transactions(producers):
        leader_epoch = epochs.at(offset)
        open_txns = _open_transactions(producers)
        producer = open_txns[0] if offset >= spec.records_per_partition else rng.choice(writers)
        if producer.transactional and producer.txn_first_offset is not None and producer.txn_batches_left == 0:
            offset = _end_transaction(writer, producer, producers, offset, source.clock, leader_epoch, rng, spec)
        else:
            offset = _append_batch(writer, producer, producers, source, offset, leader_epoch)
    writer.flush()
    truth.log_end_offset = offset
    writer.files.write_partition_files(topic_id, epochs.entries)
    return truth


def _open_transactions(producers: dict[int, _Producer]) -> list[_Producer]:
    return [p for p in producers.values() if p.txn_first_offset is not None]


def _append_batch(
    writer: _PartitionWriter,
    producer: _Producer,
    producers: dict[int, _Producer],
    source: _RecordSource,
    offset: int,
    leader_epoch: int,
) -> int:
    """Write `producer`'s next data batch at `offset`; returns the offset after it.

    The record count is exponentially distributed around `records_per_batch`, capped at four times that.
    """
    rng, spec = source.rng, source.spec
    n = max(1, min(int(rng.expovariate(1.0 / spec.records_per_batch)) + 1, 4 * spec.records_per_batch))
    records = [source.next_record(offset + i) for i in range(n)]
    batch = build_batch(
        records,
        codec=producer.codec,
        transactional=producer.transactional,
        producer_id=producer.pid,
        producer_epoch=producer.epoch,
        base_sequence=producer.seq if producer.idempotent else -1,
        partition_leader_epoch=leader_epoch,
    )
    writer.append(batch, encode_batch(batch), producers)  # may roll: producer state is still pre-batch
    producer.appended(batch, rng)
    return offset + n


def _end_transaction(
    writer: _PartitionWriter,
    producer: _Producer,
    producers: dict[int, _Producer],
    offset: int,
    clock: int,
    leader_epoch: int,
    rng: random.Random,
    spec: WorkloadSpec,
) -> int:
    first = producer.txn_first_offset
    assert first is not None
    kind = ControlType.ABORT if rng.random() < spec.abort_ratio else ControlType.COMMIT
    marker = end_txn_marker(
        kind, offset, clock, producer.pid, producer.epoch, producer.coordinator_epoch, leader_epoch
    )
    writer.append(marker, encode_batch(marker), producers)
    producer.txn_first_offset = None
    producer.last_timestamp = clock  # a marker is not a data batch: lastOffset (Kafka's lastDataOffset) stays
    if kind is ControlType.ABORT:
        others = [p.txn_first_offset for p in producers.values() if p.txn_first_offset is not None]
        lso = min(others) if others else offset + 1
        writer.abort_recorded(AbortedTxn(0, producer.pid, first, offset, lso))
    return offset + 1


def generate_logdir(logdir: Path, spec: WorkloadSpec) -> list[PartitionTruth]:
    """Write a whole log dir (one sub-directory per topic-partition). Deterministic in `spec`."""
    logdir.mkdir(parents=True, exist_ok=True)
    ids = topic_ids(spec.topics, spec.seed)
    return [
        generate_partition(logdir / f"{topic}-{partition}", spec, topic, partition, ids[topic])
        for topic, partition in iter_partitions(spec.topics)
    ]
