"""plan → stage → commit: the compaction run, as the Python API and the CLI use it.

- `plan` reads the metadata table once and returns a frozen `RunPlan` (it records the table version and the
  clock). A dry run renders it and stops.
- `stage` takes ownership of each eligible partition (a new fencing epoch, committed on its own like a new
  leader epoch), runs the Spark data path, and uploads every output segment under a fresh id. Nothing
  is visible yet; a crash here leaves only unreferenced objects, which `kcompact gc` removes.
- `commit` lands each partition's swap in one metadata commit: new segments COPY_SEGMENT_FINISHED, replaced ones
  DELETE_SEGMENT_STARTED, the cleaner checkpoint advanced to the first uncleanable offset. It raises
  `FencedError` / `CommitConflictError` (retryable: nothing landed) when a newer run or a conflicting commit got
  there first. Rerunning any step is safe.

`now_ms` is read once (by the caller) and is the only clock every rule uses.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compaction.config import KcompactConfig
from compaction.errors import CommitConflictError, CorruptInputError, KcompactError
from compaction.format.indexes import AbortedTxn, read_txn_index
from compaction.format.producer_snapshot import expire_producers, read_producer_snapshot
from compaction.metadata import (
    ChangeSet,
    MetadataSnapshot,
    MetadataTable,
    NewSegment,
    ObjectKey,
    ObjectSuffix,
    PartitionSnapshot,
    SegmentMetadata,
    SegmentState,
    StateChange,
    TopicPartition,
    acquire_fencing_epoch,
    table_in_store,
)
from compaction.metadata import (
    commit as commit_change_set,
)
from compaction.plan import CompactionPlan, PartitionPlan, build_plan
from compaction.rewrite.upload import ActiveProducer, GroupTask, InputSegment, PartitionTask
from compaction.storage.base import ObjectStore, StoreSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class RunPlan:
    """What a run will do: the planner's output plus where and when it was computed."""

    store: StoreSpec
    plan: CompactionPlan
    run_id: str
    writer: str

    @property
    def now_ms(self) -> int:
        return self.plan.now_ms


@dataclass
class StagedPartition:
    """One partition's uploaded output, ready to commit."""

    plan: PartitionPlan
    snapshot: PartitionSnapshot
    fencing_epoch: int
    new_segments: tuple[NewSegment, ...]
    replaced: tuple[str, ...]
    cleaner_offset: int
    stats: dict[str, int]
    map_seconds: float  # the run's scan + winners phase (shared by every partition of the run)
    rewrite_seconds: float  # this partition's rewrite + upload, summed over its groups on the executor


@dataclass
class StagedRun:
    """The uploaded output of a run. Phase times are wall clock for the whole run (all partitions together)."""

    run: RunPlan
    partitions: list[StagedPartition] = field(default_factory=list)
    failed: dict[tuple[str, int], KcompactError] = field(default_factory=dict)
    map_seconds: float = 0.0
    rewrite_seconds: float = 0.0


def _writer() -> str:
    return f"kcompact@{socket.gethostname()}"


def first_unstable_offsets(store: ObjectStore, snapshot: MetadataSnapshot) -> dict[TopicPartition, int]:
    """Per partition, the first offset of a transaction that is still open at the end of the tier.

    Read from the producer snapshot of the last live segment (the state at its end, as Kafka's
    RemoteLogManager uploads it); partitions without a snapshot are taken as having no open transaction.
    """
    out: dict[TopicPartition, int] = {}
    for (topic, partition), part in snapshot.partitions.items():
        live = part.live_segments
        key = live[-1].object_key(ObjectSuffix.PRODUCER_SNAPSHOT) if live else None
        if key is None:
            continue
        entries = read_producer_snapshot(store.get(key), obj=store.object_uri(key))
        open_firsts = [e.current_txn_first_offset for e in entries if e.current_txn_first_offset >= 0]
        if open_firsts:
            out[TopicPartition(topic, partition)] = min(open_firsts)
    return out


def plan(
    store: ObjectStore,
    config: KcompactConfig,
    now_ms: int | None = None,
    *,
    topics: Sequence[str] | None = None,
    partition: int | None = None,
    force: bool = False,
) -> RunPlan:
    """Plan a run from the latest metadata snapshot. Pure apart from reading the table and producer snapshots."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    snapshot = table_in_store(store).snapshot()
    unstable = first_unstable_offsets(store, snapshot)
    compaction_plan = build_plan(snapshot, config, now, topics=topics, partition=partition, force=force,
                                 first_unstable_offsets=unstable)
    return RunPlan(store.spec, compaction_plan, uuid.uuid4().hex[:12], _writer())


def _aborted(store: ObjectStore, segments: Sequence[SegmentMetadata]) -> tuple[AbortedTxn, ...]:
    seen: dict[tuple[int, int], AbortedTxn] = {}
    for seg in segments:
        key = seg.object_key(ObjectSuffix.TXN_INDEX)
        if key is not None:
            for txn in read_txn_index(store.get(key), obj=store.object_uri(key)):
                seen.setdefault((txn.producer_id, txn.first_offset), txn)
    return tuple(sorted(seen.values(), key=lambda t: t.last_offset))


def _active_producers(store: ObjectStore, live: Sequence[SegmentMetadata], now_ms: int,
                      expiration_ms: int) -> dict[int, ActiveProducer]:
    key = live[-1].object_key(ObjectSuffix.PRODUCER_SNAPSHOT) if live else None
    if key is None:
        return {}
    entries = {e.producer_id: e for e in read_producer_snapshot(store.get(key), obj=store.object_uri(key))}
    return {
        pid: ActiveProducer(e.last_offset if e.last_offset >= 0 else None, e.producer_epoch)
        for pid, e in expire_producers(entries, now_ms, expiration_ms).items()
    }


def _partition_task(store: ObjectStore, p: PartitionPlan, snapshot: PartitionSnapshot, now_ms: int) -> PartitionTask:
    assert p.regions is not None
    members = [s for g in p.groups for s in g]
    groups = []
    for gid, group in enumerate(p.groups):
        inputs = tuple(
            InputSegment(
                segment_id=s.segment_id,
                start_offset=s.start_offset,
                end_offset=s.end_offset,
                keys={o.suffix.value: o.key for o in s.object_keys},
            )
            for s in group
        )
        groups.append(GroupTask(gid, group[0].start_offset, group[-1].end_offset, inputs))
    return PartitionTask(
        topic=p.topic,
        topic_id=snapshot.topic_id or "",
        partition=p.partition,
        upper_bound_offset=p.regions.first_uncleanable_offset,
        now_ms=now_ms,
        delete_retention_ms=p.config.delete_retention_ms,
        index_interval_bytes=p.config.index_interval_bytes,
        aborted=_aborted(store, members),
        active_producers=_active_producers(store, snapshot.live_segments, now_ms, p.config.producer_id_expiration_ms),
        groups=tuple(groups),
        strategy=p.config.compaction_strategy.value,
        strategy_header=p.config.compaction_strategy_header,
    )


def _new_segment(result: dict[str, Any], group: tuple[SegmentMetadata, ...]) -> NewSegment:
    epochs: dict[int, int] = {}
    for seg in group:
        for e in seg.segment_leader_epochs:
            epochs.setdefault(e.epoch, e.start_offset)
    from compaction.format.checkpoints import EpochEntry

    return NewSegment(
        segment_id=result["segment_id"],
        start_offset=result["start_offset"],
        end_offset=result["end_offset"],
        max_timestamp_ms=result["max_timestamp_ms"],
        segment_leader_epochs=tuple(EpochEntry(k, v) for k, v in sorted(epochs.items())),
        segment_size_bytes=result["size"],
        object_keys=tuple(ObjectKey(ObjectSuffix(s), k) for s, k in result["object_keys"].items()),
        record_count=result["record_count"],
        first_batch_max_timestamp_ms=result["first_batch_max_timestamp_ms"],
        state=SegmentState.COPY_SEGMENT_FINISHED,
    )


def stage(spark: SparkSession, run: RunPlan) -> StagedRun:
    """Rewrite and upload every eligible partition of `run` (nothing becomes visible). See the module docstring."""
    from compaction.spark.compact import stage_partitions

    store = run.store.open()
    table = table_in_store(store)
    staged = StagedRun(run)
    tasks: dict[tuple[str, int], tuple[PartitionPlan, PartitionSnapshot, int, PartitionTask]] = {}
    for p in run.plan.eligible:
        tp = (p.topic, p.partition)
        try:
            epoch = acquire_fencing_epoch(table, p.topic, p.partition, run.writer, run.now_ms, run_id=run.run_id)
            snap = table.partition_snapshot(p.topic, p.partition)
            planned = [s.segment_id for g in p.groups for s in g]
            live = {s.segment_id for s in snap.live_segments}
            if not set(planned) <= live:
                raise CommitConflictError(
                    f"{p.topic}-{p.partition}: expected planned segments to be live, found "
                    f"{sorted(set(planned) - live)} replaced since the plan"
                )
            tasks[tp] = (p, snap, epoch, _partition_task(store, p, snap, run.now_ms))
        except KcompactError as exc:
            staged.failed[tp] = exc
    aborted = {tp: [(t.producer_id, t.first_offset, t.last_offset) for t in entry[3].aborted]
               for tp, entry in tasks.items()}
    result = stage_partitions(spark, run.store, [t[3] for t in tasks.values()], aborted)
    for tp, (p, snap, epoch, task) in tasks.items():
        problem = result.problems.get(tp, {})
        if "error" in problem:
            staged.failed[tp] = CorruptInputError(f"partition quarantined, nothing committed: {problem['error']}")
            continue
        outputs = result.groups.get(tp, [])
        stats: dict[str, int] = {}
        for r in outputs:
            for k, v in r["stats"].items():
                if isinstance(v, int) and not k.endswith("timestamp"):  # counters add up, timestamps don't
                    stats[k] = stats.get(k, 0) + v
        stats["invalid_versions"] = int(problem.get("invalid_versions", 0))
        staged.partitions.append(
            StagedPartition(
                plan=p,
                snapshot=snap,
                fencing_epoch=epoch,
                new_segments=tuple(_new_segment(r, p.groups[r["group_id"]]) for r in outputs),
                replaced=tuple(s.segment_id for g in p.groups for s in g),
                cleaner_offset=task.upper_bound_offset,
                stats=stats,
                map_seconds=result.map_seconds,
                rewrite_seconds=float(sum(r.get("seconds", 0.0) for r in outputs)),
            )
        )
    staged.map_seconds, staged.rewrite_seconds = result.map_seconds, result.rewrite_seconds
    return staged


@dataclass(frozen=True)
class PartitionOutcome:
    topic: str
    partition: int
    committed: bool
    version: int | None
    error: str | None = None
    error_type: str | None = None
    exit_code: int = 0


def commit(staged: StagedRun, now_ms: int | None = None) -> list[PartitionOutcome]:
    """Commit every staged partition (one atomic metadata commit each).

    Raises nothing for a single partition's conflict: it is reported in its outcome (retryable, nothing landed),
    so the others still commit. Use `commit_partition` to get the exception itself.
    """
    table = table_in_store(staged.run.store.open())
    outcomes = []
    for sp in staged.partitions:
        try:
            version = commit_partition(table, staged.run, sp, now_ms)
            outcomes.append(PartitionOutcome(sp.plan.topic, sp.plan.partition, True, version))
        except KcompactError as exc:
            outcomes.append(PartitionOutcome(sp.plan.topic, sp.plan.partition, False, None, str(exc),
                                             type(exc).__name__, int(exc.exit_code)))
    for (topic, partition), error in staged.failed.items():
        outcomes.append(PartitionOutcome(topic, partition, False, None, str(error), type(error).__name__,
                                         int(error.exit_code)))
    return outcomes


def commit_partition(table: MetadataTable, run: RunPlan, sp: StagedPartition, now_ms: int | None = None) -> int:
    """Land one partition's swap; raises FencedError / CommitConflictError when superseded."""
    change = ChangeSet.planned_from(
        sp.snapshot,
        fencing_epoch=sp.fencing_epoch,
        writer=run.writer,
        new_segments=sp.new_segments,
        state_changes=tuple(StateChange(s, SegmentState.DELETE_SEGMENT_STARTED) for s in sp.replaced),
        cleaner_offset=sp.cleaner_offset,
        run_id=run.run_id,
    )
    return commit_change_set(table, change, run.now_ms if now_ms is None else now_ms).version
