"""Kafka's LogCleanerTest helpers, over the remote tier: build a partition from explicit batches, tier it,
clean it with plan → stage → commit, and look at the live remote segments the way Kafka's assertions do.

`ScenarioLog` is one partition as Kafka's tests append to it: `record(k, v)` single-record batches,
`producer(pid)` appenders for idempotent or transactional batches (each appender starts at sequence 0, as
`appendTransactionalAsLeader` does), `commit` / `abort` markers and `roll()`. `write` lays it out as a
broker's `<topic>-<partition>` directory: `.log` files named by base offset with their offset and time
indexes, a `.txnindex` per segment holding an AbortedTxn for every ABORT that closes a non-empty
transaction (lastStableOffset as `ProducerStateManager.lastStableOffset` computes it), a producer
`.snapshot` at every roll, `leader-epoch-checkpoint` and `partition.metadata`. The segment after the last
roll is the active one, which tiering never copies, so everything appended before a `roll()` is tiered.

`remote_batches` decodes a partition's live remote segments with kafka-python, the referee, checking every CRC on
the way; Kafka's assertion helpers (`keys_in_log`, `offsets_in_log`, `last_offsets_per_batch`,
`last_sequences`) read what it returns.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from compaction.config import CompactionStrategy, KcompactConfig
from compaction.format.batch import (
    DELETE_HORIZON_FLAG_MASK,
    Header,
    Record,
    RecordBatch,
    TimestampType,
    build_batch,
    encode_batch,
)
from compaction.format.checkpoints import EpochEntry
from compaction.format.control import ControlType, batch_control_type
from compaction.format.indexes import AbortedTxn, read_txn_index
from compaction.format.producer_snapshot import producer_state_from_batches
from compaction.generate.logdir import LogDirWriter, rolls
from compaction.generate.topics import seeded_topic_id
from compaction.metadata import ObjectSuffix, SegmentMetadata, table_in_store
from compaction.reader import Isolation, consumer_records, segment_ref
from compaction.run.commit import commit
from compaction.run.plan import plan
from compaction.run.stage import StagedRun, stage
from compaction.storage import ObjectStore
from compaction.storage.indexes import get_part
from compaction.tier import tier_partition
from compaction.tier.logdir import LocalPartition
from tests import factories
from tests.factories import Key, record

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from kafka.record.memory_records import MemoryRecords

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

@dataclass
class ScenarioLog:
    """One partition's log, appended to batch by batch (see the module docstring).

    `timestamp` is the clock of the next append (Kafka's `time.milliseconds()`); move it to age segments.
    With `segment_bytes`, an append that would overflow a non-empty segment rolls first, as `maybeRoll` does.
    """

    topic: str
    timestamp: int
    partition: int = 0
    leader_epoch: int = 0
    segment_bytes: int | None = None
    batches: list[RecordBatch] = field(default_factory=list)
    segment_bases: list[int] = field(default_factory=lambda: [0])

    @property
    def next_offset(self) -> int:
        return self.batches[-1].next_offset if self.batches else 0

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def append(self, records: Sequence[tuple[Key, Key]], **batch_fields: object) -> RecordBatch:
        """One batch of `(key, value)` records at the next offsets, stamped with the clock."""
        start = self.next_offset
        built = [record(start + i, k, v, ts=self.timestamp) for i, (k, v) in enumerate(records)]
        return self.append_records(built, **batch_fields)

    def append_records(self, records: Sequence[Record], **batch_fields: object) -> RecordBatch:
        """One batch of fully specified records; their offsets must start at `next_offset`."""
        if not records or records[0].offset != self.next_offset:
            raise ValueError(f"{self.name}: records must start at offset {self.next_offset}")
        batch = build_batch(records, partition_leader_epoch=self.leader_epoch, **batch_fields)  # type: ignore[arg-type]
        self._add(batch)
        return batch

    def _add(self, batch: RecordBatch) -> None:
        if self.segment_bytes is not None:
            active = sum(b.size for b in self.batches if b.base_offset >= self.segment_bases[-1])
            if rolls(active, batch.size, self.segment_bytes):
                self.roll()
        self.batches.append(batch)

    def record(self, key: Key, value: Key, *, timestamp: int | None = None, headers: Iterable[Header] = (),
               timestamp_type: TimestampType = TimestampType.CREATE_TIME, max_timestamp: int | None = None) -> int:
        """Kafka's `record(k, v)`: a single-record batch without producer id; returns its offset."""
        offset = self.next_offset
        ts = self.timestamp if timestamp is None else timestamp
        self.append_records([record(offset, key, value, ts=ts, headers=headers)],
                            timestamp_type=timestamp_type, max_timestamp=max_timestamp)
        return offset

    def producer(self, pid: int, epoch: int = 0, *, transactional: bool = True,
                 sequence: int = 0) -> Callable[[Sequence[int]], RecordBatch]:
        """Kafka's `appendTransactionalAsLeader` / `appendIdempotentAsLeader`: each call appends one batch of
        records `(k, k)`; each appender counts its own sequence from `sequence` (0, as Kafka's helpers do)."""

        def append(keys: Sequence[int]) -> RecordBatch:
            nonlocal sequence
            batch = self.append([(k, k) for k in keys], producer_id=pid, producer_epoch=epoch,
                                base_sequence=sequence, transactional=transactional)
            sequence += len(keys)
            return batch

        return append

    def marker(self, kind: ControlType, pid: int, epoch: int = 0) -> int:
        """A COMMIT or ABORT marker for producer `pid`; returns its offset."""
        offset = self.next_offset
        self._add(factories.marker(kind, offset, pid, ts=self.timestamp, epoch=epoch, leader_epoch=self.leader_epoch))
        return offset

    def commit(self, pid: int, epoch: int = 0) -> int:
        return self.marker(ControlType.COMMIT, pid, epoch)

    def abort(self, pid: int, epoch: int = 0) -> int:
        return self.marker(ControlType.ABORT, pid, epoch)

    def roll(self) -> None:
        """Start a new (active) segment at the next offset: everything before it becomes tierable."""
        if self.segment_bases[-1] != self.next_offset:
            self.segment_bases.append(self.next_offset)

    def aborted_txns(self) -> dict[int, list[AbortedTxn]]:
        """Segment base → the AbortedTxn entries its `.txnindex` holds (one per ABORT of a non-empty txn)."""
        open_txns: dict[int, int] = {}
        out: dict[int, list[AbortedTxn]] = {}
        for batch in self.batches:
            if not batch.is_transactional:
                continue
            if not batch.is_control:
                open_txns.setdefault(batch.producer_id, batch.base_offset)
                continue
            first = open_txns.pop(batch.producer_id, None)
            if first is not None and batch_control_type(batch) is ControlType.ABORT:
                lso = min(open_txns.values(), default=batch.last_offset + 1)
                base = max(b for b in self.segment_bases if b <= batch.base_offset)
                out.setdefault(base, []).append(AbortedTxn(0, batch.producer_id, first, batch.last_offset, lso))
        return out

    def write(self, logdir: Path) -> Path:
        """Write (or rewrite, identically) the partition directory under `logdir`; returns it."""
        files = LogDirWriter(logdir / self.name)
        aborted = self.aborted_txns()
        for base, next_base in itertools.pairwise([*self.segment_bases, None]):
            assert base is not None
            members = [b for b in self.batches
                       if b.base_offset >= base and (next_base is None or b.base_offset < next_base)]
            files.write_segment(base, b"".join(encode_batch(b) for b in members), aborted.get(base, ()))
            if base > 0:
                before = [b for b in self.batches if b.base_offset < base]
                files.write_snapshot(base, producer_state_from_batches(before).values())
        files.write_partition_files(seeded_topic_id(self.topic), self.epochs())
        return files.directory

    def epochs(self) -> list[EpochEntry]:
        """The leader-epoch checkpoint: each epoch of the batches at its first offset (set `leader_epoch` between
        appends to change leaders)."""
        starts: dict[int, int] = {}
        for b in self.batches:
            starts.setdefault(b.partition_leader_epoch, b.base_offset)
        return [EpochEntry(e, o) for e, o in starts.items()] or [EpochEntry(self.leader_epoch, 0)]


# --- tiering and cleaning ----------------------------------------------------------------------------


def tier(logs: Iterable[ScenarioLog], logdir: Path, store: ObjectStore, now_ms: int) -> None:
    """Write each log under `logdir` and tier what it has rolled and the store lacks; fails on any tier error."""
    table = table_in_store(store, create=True)
    for log in logs:
        directory = log.write(logdir)
        tier_partition(LocalPartition(log.topic, log.partition, directory), store, table, now_ms, "scenario")



def transactions_across_tier_and_wal(store: ObjectStore, logdir: Path, now_ms: int) -> ScenarioLog:
    """orders-0 with transactions that begin in the tier and end in its WAL tail: producer 7 aborts, 8 commits,
    9 stays open; the first roll is tiered, the markers arrive in the active segment, uploaded as a WAL object."""
    from compaction.wal.upload import upload_logdir

    log = ScenarioLog("orders", now_ms - 5000)
    aborted, committed, still_open = log.producer(7), log.producer(8), log.producer(9)
    log.record(1, b"plain")
    aborted([10, 11])
    committed([20])
    log.roll()
    log.record(2, b"plain-2")
    aborted([12])
    log.abort(7)
    committed([21])
    log.commit(8)
    still_open([30])
    tier([log], logdir, store, now_ms)
    upload_logdir(logdir, store, now_ms)
    return log


OPEN_IN_TIER, OPEN_IN_WAL = 9, 19
"""The producers whose transaction `open_transactions_mid_log` leaves open: in orders-0's tier, in orders-1's WAL."""


def open_transactions_mid_log(store: ObjectStore, logdir: Path, now_ms: int) -> tuple[ScenarioLog, ScenarioLog]:
    """orders-0 and orders-1, each with a transaction left open mid-log and committed records after it.

    orders-0: producer 9's (`OPEN_IN_TIER`) opens at offset 6, in the tier, and writes on in the WAL tail; below it
    are a committed transaction, producer 7's whose ABORT and producer 8's whose COMMIT come later, in the WAL; after
    it, plain records and committed transactions in the tier and the WAL. orders-1: producer 19's (`OPEN_IN_WAL`)
    opens in the WAL tail, after an aborted and a committed transaction that began in the tier and end in the WAL.
    The first rolls are tiered; the active segments are uploaded as small combined objects holding both partitions.
    """
    from compaction.wal.upload import upload_logdir

    tiered = ScenarioLog("orders", now_ms - 5000)
    aborted, committed, still_open, later = (tiered.producer(p) for p in (7, 8, OPEN_IN_TIER, 10))
    tiered.record(1, b"a")  # 0
    committed([2, 3])  # 1, 2
    tiered.commit(8)  # 3
    aborted([4])  # 4: aborted in the WAL
    committed([5])  # 5: committed in the WAL
    still_open([6, 7])  # 6, 7: the last stable offset
    tiered.record(8, b"b")
    later([9])
    tiered.commit(10)
    tiered.roll()
    tiered.record(11, b"c")
    tiered.abort(7)
    tiered.commit(8)
    still_open([12])
    tiered.record(13, b"d")
    later([14])
    tiered.commit(10)

    in_wal = ScenarioLog("orders", now_ms - 5000, partition=1)
    aborted, committed, still_open = (in_wal.producer(p) for p in (17, 18, OPEN_IN_WAL))
    in_wal.record(21, b"e")
    committed([22])
    in_wal.commit(18)
    aborted([23])
    committed([24])
    in_wal.roll()
    in_wal.record(25, b"f")
    in_wal.abort(17)
    still_open([26, 27])
    in_wal.record(28, b"g")
    in_wal.commit(18)
    in_wal.record(29, b"h")
    logs = (tiered, in_wal)
    tier(logs, logdir, store, now_ms)
    upload_logdir(logdir, store, now_ms, max_object_bytes=400)
    return logs


def consumed(batches: Sequence[RecordBatch], isolation: Isolation = Isolation.READ_UNCOMMITTED,
             from_offset: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of what a consumer from `from_offset` reads of the log `batches`, computed plainly: control
    records never; with read_committed, only the records below the last stable offset (the first offset of the
    earliest transaction with no marker at the end of the log, else the log end), and not those of aborted
    transactions."""
    outcome: dict[tuple[int, int], ControlType | None] = {}  # (producer, first offset) -> its marker's type
    first: dict[int, int] = {}
    for b in batches:
        if b.is_transactional and b.is_control:
            start = first.pop(b.producer_id, None)
            if start is not None:
                outcome[b.producer_id, start] = batch_control_type(b)
        elif b.is_transactional:
            first.setdefault(b.producer_id, b.base_offset)
    stable = min(first.values(), default=batches[-1].next_offset if batches else 0)
    out: list[tuple[int, bytes]] = []
    current: dict[int, int] = {}
    for b in batches:
        if b.is_control:
            current.pop(b.producer_id, None)
            continue
        if isolation is Isolation.READ_COMMITTED:
            if b.base_offset >= stable:
                break
            if b.is_transactional:
                start = current.setdefault(b.producer_id, b.base_offset)
                if outcome.get((b.producer_id, start)) is not ControlType.COMMIT:
                    continue
        out.extend((r.offset, r.value or b"") for r in b.records if r.offset >= from_offset)
    return out


@dataclass(frozen=True)
class Pass:
    """A committed pass, and every offset-strategy partition whose consumer view it changed (before, after)."""

    staged: StagedRun
    view_changes: dict[tuple[str, int], tuple[dict[bytes, tuple[int, bytes]], dict[bytes, tuple[int, bytes]]]]


def clean(spark: SparkSession, store: ObjectStore, config: KcompactConfig, now_ms: int, topics: Iterable[str]) -> Pass:
    """One forced pass (Kafka's tests call the cleaner directly) over `topics` at `now_ms`, committed.

    Every partition with anything below its first uncleanable offset is cleaned, all in one Spark stage. The
    consumer's view (`live_view`) of every cleaned offset-strategy partition is compared before and after:
    compaction must never change it. Fails if any partition's commit fails.
    """
    run = plan(store, config, now_ms, topics=sorted(set(topics)), force=True)
    watched = [(p.topic, p.partition) for p in run.plan.eligible
               if p.config.compaction_strategy is CompactionStrategy.OFFSET]
    snapshot = table_in_store(store).snapshot()
    before = {tp: live_view(store, snapshot.live_segments(*tp)) for tp in watched}
    staged = stage(spark, run)
    outcomes = commit(staged)
    assert outcomes and all(o.committed for o in outcomes), outcomes
    snapshot = table_in_store(store).snapshot()
    after = {tp: live_view(store, snapshot.live_segments(*tp)) for tp in watched}
    return Pass(staged, {tp: (before[tp], after[tp]) for tp in watched if after[tp] != before[tp]})


# --- views of the live remote segments ---------------------------------------------------------------


@dataclass(frozen=True)
class RemoteRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class RemoteBatch:
    """A batch of a live remote segment, as kafka-python decodes it (CRC checked)."""

    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_sequence: int
    is_control: bool
    is_transactional: bool
    delete_horizon_ms: int | None
    records: tuple[RemoteRecord, ...]


def remote_batches(store: ObjectStore, segments: Sequence[SegmentMetadata]) -> list[RemoteBatch]:
    """Every batch of `segments` (a partition's live segments, in order), empty ones included."""
    out = []
    for seg in segments:
        key = seg.object_key(ObjectSuffix.LOG) or ""
        records = MemoryRecords(store.get(key))
        while records.has_next():
            b = records.next_batch()
            assert b.validate_crc(), f"{key}: bad CRC in the batch at {b.base_offset}"
            horizon = b.first_timestamp if b.attributes & DELETE_HORIZON_FLAG_MASK else None
            out.append(RemoteBatch(
                b.base_offset, b.last_offset, b.producer_id, b.producer_epoch, b.base_sequence, b.last_sequence,
                b.is_control_batch, b.is_transactional, horizon,
                tuple(RemoteRecord(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in b),
            ))
    return out


def keys_in_log(batches: Sequence[RemoteBatch]) -> list[int]:
    """Kafka's `keysInLog`: keys (decimal strings) of the records with a value, in data batches."""
    return [int(r.key) for b in batches if not b.is_control for r in b.records
            if r.key is not None and r.value is not None]


def offsets_in_log(batches: Sequence[RemoteBatch]) -> list[int]:
    """Kafka's `offsetsInLog`: offsets of keyed records with a value, control records included."""
    return [r.offset for b in batches for r in b.records if r.key is not None and r.value is not None]


def last_offsets_per_batch(batches: Sequence[RemoteBatch]) -> list[int]:
    """Kafka's `lastOffsetsPerBatchInLog`: every batch, empty ones included."""
    return [b.last_offset for b in batches]


def last_sequences(batches: Sequence[RemoteBatch]) -> dict[int, int]:
    """Kafka's `lastSequencesInLog`: producer id → last sequence of its last data batch."""
    return {b.producer_id: b.last_sequence for b in batches if not b.is_control and b.producer_id >= 0}


def indexed_aborted_txns(store: ObjectStore, segments: Sequence[SegmentMetadata]) -> list[tuple[int, int, int]]:
    """(producer id, first offset, last offset) of every AbortedTxn in the txn indexes of `segments`."""
    out = []
    for seg in segments:
        key = seg.object_key(ObjectSuffix.TXN_INDEX)
        if key is not None:
            txns = read_txn_index(get_part(store, key, ObjectSuffix.TXN_INDEX))
            out += [(t.producer_id, t.first_offset, t.last_offset) for t in txns]
    return out


def live_view(store: ObjectStore, segments: Sequence[SegmentMetadata]) -> dict[bytes, tuple[int, bytes]]:
    """What a read_committed consumer of `segments` ends up with: key → (offset, value) of its latest record,
    tombstoned keys left out. Compaction (offset strategy) must never change it."""
    refs = [segment_ref(s) for s in segments]
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for r in consumer_records(store, refs, isolation=Isolation.READ_COMMITTED):
        if r.key is not None:
            latest[r.key] = (r.offset, r.value)
    return {k: (o, v) for k, (o, v) in latest.items() if v is not None}
