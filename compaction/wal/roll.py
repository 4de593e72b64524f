"""`kcompact wal roll`: the WAL above each partition's tier becomes tiered segments, as Kafka rolls a log.

Per partition, on a Spark executor (`roll_partition`; partitions packed into tasks by their WAL bytes,
`roll_packing`, so that many small partitions share a task):

1. fetch the partition's WAL slices (one ranged GET each), check every batch's CRC;
2. cut the batches into segments with Kafka's `LogSegment.shouldRoll` rules: a new segment when the next
   batch would take it past `segment.bytes`, or when the next batch's max timestamp is more than
   `segment.ms` after the segment's first batch's max timestamp (for a compacted topic the limit is
   min(segment.ms, max.compaction.lag.ms), Kafka's `LogConfig.maxSegmentMs`), or when an offset would no
   longer fit the segment's relative offsets. The last, open segment stays in the WAL unless it is full
   (at least `segment.bytes`) or its first batch is older than that limit at `--now`;
3. make every rolled segment complete, as `kcompact tier` makes them: `.log` (the batches byte for byte), offset
   and time indexes (`index.interval.bytes`), transaction index (open transactions carried from the tier's
   producer state), producer snapshot (the state at the segment's end), leader-epoch checkpoint;
4. upload its objects under a fresh segment id (unreferenced until the commit; gc removes a failed run's).

The driver first acquires a fencing epoch for every partition, in one metadata commit, and at the end commits every
partition's new segments in one more, each partition expected unchanged since (`commit_batch`): concurrent rolls (or
a roll and a compaction) commit a partition once, the other gets a conflict or is fenced (exit 4, rerun safe), and
the partitions it does not share with them land. A partition whose WAL object is missing,
truncated or corrupt fails alone (exit 3, naming the object and byte position); the others roll.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compaction.config import KcompactConfig, TopicConfig
from compaction.errors import CorruptInputError, Failure, KcompactError, worst_exit_code
from compaction.format.batch import INT32_MAX
from compaction.format.checkpoints import EpochEntry, encode_leader_epoch_checkpoint, epochs_in_range
from compaction.format.indexes import build_indexes
from compaction.format.producer_snapshot import (
    ProducerStateEntry,
    encode_producer_snapshot,
    open_transactions,
    producer_state_from_log,
)
from compaction.format.segment import BatchHeader
from compaction.metadata import (
    ChangeSet,
    CommitResult,
    MetadataTable,
    NewSegment,
    ObjectKey,
    SegmentMetadata,
    acquire_fencing_epochs,
    commit_batch,
    table_in_store,
)
from compaction.metadata.model import OfPartition, TopicPartition
from compaction.packing import pack_for
from compaction.producers import producer_state
from compaction.reader import SegmentRef, slice_bytes, wal_headers, wal_ref
from compaction.storage.base import ObjectStore, StoreSpec
from compaction.storage.indexes import segment_objects
from compaction.storage.layout import Suffix, new_segment_id, segment_object_key
from compaction.wal.log import PartitionLog
from compaction.wal.view import StoreLog, store_log, tier_epochs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class RollRules:
    """When a segment rolls: Kafka's size, time and relative-offset rules."""

    segment_bytes: int
    max_segment_ms: int
    index_interval_bytes: int

    @classmethod
    def of(cls, topic: TopicConfig) -> RollRules:
        limit = min(topic.segment_ms, topic.max_compaction_lag_ms) if topic.is_compacted else topic.segment_ms
        return cls(topic.segment_bytes, limit, topic.index_interval_bytes)


@dataclass(frozen=True)
class _Batch:
    header: BatchHeader
    data: memoryview  # the batch's bytes
    uri: str  # the object it came from, for errors

    @property
    def last_offset(self) -> int:
        return self.header.base_offset + self.header.last_offset_delta


def cut(batches: Sequence[_Batch], rules: RollRules, now_ms: int) -> tuple[list[list[_Batch]], list[_Batch]]:
    """(rolled segments, open tail) of consecutive batches, by `LogSegment.shouldRoll` (module docstring)."""
    rolled: list[list[_Batch]] = []
    cur: list[_Batch] = []
    size = 0
    rolling_ts = -1
    for b in batches:
        h = b.header
        if cur and (
            size + h.size > rules.segment_bytes
            or (rolling_ts >= 0 and h.max_timestamp - rolling_ts > rules.max_segment_ms)
            or b.last_offset - cur[0].header.base_offset > INT32_MAX
        ):
            rolled.append(cur)
            cur, size = [], 0
        if not cur:
            rolling_ts = h.max_timestamp
        cur.append(b)
        size += h.size
    if cur and (size >= rules.segment_bytes or (rolling_ts >= 0 and now_ms - rolling_ts > rules.max_segment_ms)):
        rolled.append(cur)
        cur = []
    return rolled, cur


@dataclass(frozen=True)
class RollTask(OfPartition):
    """One partition's roll, as shipped to an executor."""

    topic: str
    topic_id: str
    partition: int
    tier_end: int | None
    tier_epochs: tuple[EpochEntry, ...]
    live: tuple[SegmentMetadata, ...]
    slices: tuple[SegmentRef, ...]
    rules: RollRules
    now_ms: int
    dry_run: bool


@dataclass
class RollOutcome(Failure):
    """What one partition's roll produced (or why it failed); returned by the executor."""

    topic: str
    partition: int
    new_segments: list[NewSegment] = field(default_factory=list)
    wal_bytes: int = 0
    rolled_bytes: int = 0
    open_tail_bytes: int = 0
    open_tail_batches: int = 0
    wal_end: int | None = None
    gets: int = 0
    puts: int = 0
    committed_version: int | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "segments": [{"start_offset": n.start_offset, "end_offset": n.end_offset, "size": n.segment_size_bytes,
                          "segment_id": n.segment_id} for n in self.new_segments],
            "wal_bytes": self.wal_bytes,
            "rolled_bytes": self.rolled_bytes,
            "open_tail_bytes": self.open_tail_bytes,
            "open_tail_batches": self.open_tail_batches,
            "wal_end": self.wal_end,
            "error": self.error,
            "error_type": self.error_type,
            "exit_code": self.exit_code,
            "committed_version": self.committed_version,
            "gets": self.gets,
            "puts": self.puts,
            "seconds": round(self.seconds, 3),
        }


def _batches(store: ObjectStore, refs: Sequence[SegmentRef]) -> list[_Batch]:
    """The batches of the WAL slices, CRC-checked, trimmed to the slices' offsets, in offset order."""
    out: list[_Batch] = []
    for ref in refs:
        uri = store.object_uri(ref.log_key)
        data = memoryview(slice_bytes(store, ref))
        for h in wal_headers(data, ref, uri, verify_crc=True):
            last = h.base_offset + h.last_offset_delta
            if h.base_offset < ref.start_offset or last > ref.end_offset:
                raise CorruptInputError(
                    f"batch of offsets {h.base_offset}..{last} straddles the log's slice {ref.start_offset}.."
                    f"{ref.end_offset} of this object: it cannot be cut at a batch boundary",
                    obj=uri, position=ref.start_position + h.position,
                )
            if out and h.base_offset <= out[-1].last_offset:
                raise CorruptInputError(
                    f"batch base offset {h.base_offset} is not above the previous batch's last offset "
                    f"{out[-1].last_offset}", obj=uri, position=ref.start_position + h.position,
                )
            out.append(_Batch(h, data[h.position : h.position + h.size], uri))
    return out


def _lineage(task: RollTask, batches: Iterable[_Batch]) -> list[EpochEntry]:
    starts = {e.epoch: e.start_offset for e in task.tier_epochs}
    for b in batches:
        starts.setdefault(b.header.partition_leader_epoch, b.header.base_offset)
    return [EpochEntry(e, s) for e, s in sorted(starts.items(), key=lambda es: (es[1], es[0]))]


def roll_partition(spec: StoreSpec, task: RollTask) -> RollOutcome:
    """Cut, build and upload one partition's rolled segments (executor side). Never raises a KcompactError:
    a failure is the outcome's error, so that the other partitions still roll."""
    started = time.monotonic()
    out = RollOutcome(task.topic, task.partition)
    store = spec.open()
    try:
        batches = _batches(store, task.slices)
        out.wal_bytes = sum(b.header.size for b in batches)
        out.wal_end = batches[-1].last_offset + 1 if batches else task.tier_end
        rolled, tail = cut(batches, task.rules, task.now_ms)
        out.open_tail_bytes = sum(b.header.size for b in tail)
        out.open_tail_batches = len(tail)
        if rolled:
            _build(store, task, rolled, tail, batches, out)
    except KcompactError as exc:
        out.new_segments = []
        out.fail(exc)
    out.gets, out.puts = store.stats.gets, store.stats.puts
    out.seconds = time.monotonic() - started
    return out


def _build(store: ObjectStore, task: RollTask, rolled: list[list[_Batch]], tail: list[_Batch],
           batches: list[_Batch], out: RollOutcome) -> None:
    lineage = _lineage(task, batches)
    state: dict[int, ProducerStateEntry] = {e.producer_id: e for e in producer_state(store, task.live)}
    for i, seg in enumerate(rolled):
        base = seg[0].header.base_offset
        following = rolled[i + 1][0] if i + 1 < len(rolled) else (tail[0] if tail else None)
        next_base = following.header.base_offset if following is not None else seg[-1].last_offset + 1
        log = b"".join(b.data for b in seg)
        name = f"{task.topic}-{task.partition} rolled segment {base}"
        indexes = build_indexes(log, base, task.rules.index_interval_bytes, obj=name,
                                txn_first_offsets=open_transactions(state.values()))
        state = producer_state_from_log(log, obj=name, initial=state.values())
        files: dict[Suffix, bytes] = {
            Suffix.OFFSET_INDEX: indexes.offset_index,
            Suffix.TIME_INDEX: indexes.time_index,
            Suffix.PRODUCER_SNAPSHOT: encode_producer_snapshot(state.values()),
            Suffix.LEADER_EPOCH_CHECKPOINT: encode_leader_epoch_checkpoint(
                [e for e in lineage if e.start_offset < next_base]),
        }
        if indexes.txn_index is not None:
            files[Suffix.TXN_INDEX] = indexes.txn_index
        segment_id = new_segment_id()
        objects, keys = segment_objects(
            lambda s: segment_object_key(task.topic, task.topic_id, task.partition, base, segment_id, s),  # noqa: B023
            log, files)
        if not task.dry_run:
            for k, data in objects.items():
                store.put(k, data)
        headers = [b.header for b in seg]
        out.rolled_bytes += len(log)
        out.new_segments.append(NewSegment(
            segment_id=segment_id,
            start_offset=base,
            end_offset=next_base - 1,
            max_timestamp_ms=max(h.max_timestamp for h in headers),
            segment_leader_epochs=tuple(epochs_in_range(lineage, base, next_base)),
            segment_size_bytes=len(log),
            object_keys=tuple(ObjectKey(s, k) for s, k in keys.items()),
            record_count=sum(h.records_count for h in headers),
            first_batch_max_timestamp_ms=headers[0].max_timestamp,
            transactional=any(h.is_transactional_or_control for h in headers),
        ))


@dataclass
class RollReport:
    now_ms: int
    dry_run: bool
    partitions: list[RollOutcome] = field(default_factory=list)
    metadata_version: int | None = None
    job_seconds: float = 0.0  # the Spark job (fetch, cut, build, upload on the executors)

    @property
    def exit_code(self) -> int:
        return worst_exit_code(self.partitions)

    def to_dict(self) -> dict[str, object]:
        return {
            "now_ms": self.now_ms,
            "dry_run": self.dry_run,
            "exit_code": self.exit_code,
            "segments_rolled": sum(len(p.new_segments) for p in self.partitions if p.error is None),
            "bytes_rolled": sum(p.rolled_bytes for p in self.partitions if p.error is None),
            "job_seconds": round(self.job_seconds, 3),
            "partitions": [p.to_dict() for p in self.partitions],
        }


def default_writer() -> str:
    return f"kcompact-wal-roll@{socket.gethostname()}"


def roll_tasks(view: StoreLog, config: KcompactConfig, now_ms: int, *, topic: str | None = None,
               partition: int | None = None, dry_run: bool = False) -> list[RollTask]:
    """A task per partition (matching the filters) with WAL data above its tier."""
    tasks = []
    for tp, log in sorted(view.logs.items()):
        if not log.slices or (topic is not None and tp.topic != topic) or (
                partition is not None and tp.partition != partition):
            continue
        tasks.append(_task(view, tp, log, config.for_topic(tp.topic), now_ms, dry_run))
    return tasks


def _task(view: StoreLog, tp: TopicPartition, log: PartitionLog, cfg: TopicConfig, now_ms: int, dry_run: bool
          ) -> RollTask:
    p = view.snapshot.partitions.get(tp) if view.snapshot is not None else None
    live = p.live_segments if p is not None else ()
    topic_id = (p.topic_id if p is not None else None) or log.slices[0].entry.topic_id
    return RollTask(tp.topic, topic_id, tp.partition, log.tier_end, tuple(tier_epochs(p)), tuple(live),
                    tuple(wal_ref(s) for s in log.slices), RollRules.of(cfg), now_ms, dry_run)


def roll(
    spark: SparkSession,
    store: ObjectStore,
    config: KcompactConfig,
    now_ms: int,
    *,
    topic: str | None = None,
    partition: int | None = None,
    dry_run: bool = False,
    writer: str | None = None,
    progress: Callable[[RollOutcome], None] | None = None,
) -> RollReport:
    """Roll the WAL of every partition (or the one selected) into tiered segments; see the module docstring."""
    writer = writer or default_writer()
    report = RollReport(now_ms, dry_run)
    table = None if dry_run else table_in_store(store, create=True)
    candidates = roll_tasks(store_log(store), config, now_ms, topic=topic, partition=partition, dry_run=dry_run)
    epochs: dict[TopicPartition, int] = {}
    failed: list[RollOutcome] = []
    if table is not None:
        acquired = acquire_fencing_epochs(table, [t.tp for t in candidates], writer,
                                          now_ms, topic_ids={t.tp: t.topic_id
                                                             for t in candidates})
        for t in candidates:
            got = acquired[t.tp]
            if isinstance(got, KcompactError):
                failed.append(RollOutcome(t.topic, t.partition, **got.outcome_fields()))
            else:
                epochs[t.tp] = got.fencing_epoch
    view = store_log(store)  # after the epochs: what this run plans from is what its commits expect
    tasks = [t for t in roll_tasks(view, config, now_ms, topic=topic, partition=partition, dry_run=dry_run)
             if dry_run or t.tp in epochs]
    spec = store.spec
    outcomes: list[RollOutcome] = []
    if tasks:
        started = time.monotonic()
        packed = [[(i, tasks[i]) for i in ids] for ids in roll_packing(tasks, spark.sparkContext.defaultParallelism)]
        rdd = spark.sparkContext.parallelize(packed, len(packed))  # a packed list per Spark task
        done = rdd.flatMap(lambda part: [(i, roll_partition(spec, t)) for i, t in part]).collect()
        outcomes = [o for _i, o in sorted(done, key=lambda io: io[0])]
        report.job_seconds = time.monotonic() - started
    if table is not None:
        rolled = [(t, o) for t, o in zip(tasks, outcomes, strict=True) if o.error is None and o.new_segments]
        _commit(table, view, rolled, epochs, writer, now_ms)
    for o in outcomes:
        report.partitions.append(o)
        if progress is not None:
            progress(o)
    report.partitions.extend(failed)
    report.metadata_version = table.version() if table is not None else None
    return report


def roll_packing(tasks: Sequence[RollTask], parallelism: int) -> list[list[int]]:
    """The roll's Spark tasks, each a list of indexes into `tasks`: partitions packed by their WAL bytes
    (`compaction.packing`), so that many small partitions share a task and a large one has its own. Pure."""
    return pack_for([task_wal_bytes(t) for t in tasks], parallelism)


def task_wal_bytes(task: RollTask) -> int:
    """The WAL bytes `task` reads: the sum of its slices' lengths (a slice without an end counts as none)."""
    return sum(max(0, (r.end_position or r.start_position) - r.start_position) for r in task.slices)


def _commit(table: MetadataTable, view: StoreLog, rolled: Sequence[tuple[RollTask, RollOutcome]],
            epochs: Mapping[TopicPartition, int], writer: str, now_ms: int) -> None:
    """One metadata commit of every rolled partition's new segments, each expecting its partition as `view` saw it;
    a partition refused there records why in its outcome."""
    assert view.snapshot is not None
    changes: dict[TopicPartition, ChangeSet] = {}
    for task, out in rolled:
        tp = task.tp
        try:
            changes[tp] = ChangeSet.planned_from(view.snapshot.partition(task.topic, task.partition),
                                                 fencing_epoch=epochs[tp], writer=writer,
                                                 new_segments=tuple(out.new_segments), topic_id=task.topic_id)
        except KcompactError as exc:
            out.fail(exc)
    try:
        results: Mapping[TopicPartition, CommitResult | KcompactError] = commit_batch(table, changes.values(), now_ms)
    except KcompactError as exc:  # the commit as a whole failed: so does every partition of it
        results = dict.fromkeys(changes, exc)
    for task, out in rolled:
        result = results.get(task.tp)
        if isinstance(result, KcompactError):
            out.fail(result)
        elif isinstance(result, CommitResult):
            out.committed_version = result.version
