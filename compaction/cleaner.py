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

import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from compaction.bloom.skipping import Verdict
from compaction.bloom.work import PartitionWork, group_task
from compaction.config import KcompactConfig
from compaction.errors import (
    CommitConflictError,
    ConfigError,
    CorruptInputError,
    ExitCode,
    KcompactError,
    RetryableError,
)
from compaction.format.indexes import AbortedTxn, collect_aborted_txns, read_txn_index
from compaction.format.producer_snapshot import (
    ProducerStateEntry,
    expire_producers,
    producer_state_from_log,
    read_producer_snapshot,
)
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
from compaction.metadata.change_set import AddedObjectKey
from compaction.plan import CompactionPlan, PartitionPlan, build_plan
from compaction.rewrite.upload import ActiveProducer, PartitionTask
from compaction.storage.base import ObjectStore, StoreSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from compaction.spark.compact import PartitionStage


@dataclass(frozen=True)
class RunPlan:
    """What a run will do: the planner's output plus where and when it was computed."""

    store: StoreSpec
    plan: CompactionPlan
    run_id: str
    writer: str
    disk_budget_bytes: int | None = None  # temporary disk per rewrite chunk; None: free local disk / 3 at stage
    quarantined: tuple[tuple[str, int, CorruptInputError], ...] = ()  # unreadable at planning: held back, reported

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
    kept: tuple[str, ...] = ()  # clean segments left as they are: their filter proved no dirty key in them
    added_object_keys: tuple[AddedObjectKey, ...] = ()  # filters written for segments that had none


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


def first_unstable_offsets(
    store: ObjectStore, snapshot: MetadataSnapshot, unreadable: dict[TopicPartition, CorruptInputError] | None = None
) -> dict[TopicPartition, int]:
    """Per partition, the first offset of a transaction that is still open at the end of the tier.

    Taken from `producer_state` (the last live segment's producer snapshot, else a replay of the tier).
    A partition whose snapshot cannot be read is held back whole (its first live offset) and its error
    goes to `unreadable`, so that one corrupt object does not stop the run.
    """
    out: dict[TopicPartition, int] = {}
    for (topic, partition), part in snapshot.partitions.items():
        live = part.live_segments
        if not live:
            continue
        try:
            entries = producer_state(store, live)
        except CorruptInputError as exc:
            out[TopicPartition(topic, partition)] = live[0].start_offset
            if unreadable is not None:
                unreadable[TopicPartition(topic, partition)] = exc
            continue
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
    disk_budget_bytes: int | None = None,
) -> RunPlan:
    """Plan a run from the latest metadata snapshot. Pure apart from reading the table and producer snapshots.

    `disk_budget_bytes` bounds the temporary disk of each rewrite chunk (default: free local disk / 3 when
    the run is staged); a partition holding a segment larger than it fails with `DiskBudgetError`.
    """
    if disk_budget_bytes is not None and disk_budget_bytes <= 0:
        raise ConfigError(f"--disk-budget-bytes {disk_budget_bytes}: expected a positive number of bytes")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    snapshot = table_in_store(store).snapshot()
    unreadable: dict[TopicPartition, CorruptInputError] = {}
    unstable = first_unstable_offsets(store, snapshot, unreadable)
    compaction_plan = build_plan(snapshot, config, now, topics=topics, partition=partition, force=force,
                                 first_unstable_offsets=unstable)
    quarantined = tuple((p.topic, p.partition, unreadable[TopicPartition(p.topic, p.partition)])
                        for p in compaction_plan.partitions if TopicPartition(p.topic, p.partition) in unreadable)
    notes = tuple(f"{t}-{p} quarantined, not compacted: {e}" for t, p, e in quarantined)
    compaction_plan = replace(compaction_plan, notes=compaction_plan.notes + notes)
    return RunPlan(store.spec, compaction_plan, uuid.uuid4().hex[:12], _writer(), disk_budget_bytes,
                   quarantined=quarantined)


def _aborted(store: ObjectStore, live: Sequence[SegmentMetadata], upper_bound: int) -> tuple[AbortedTxn, ...]:
    """Kafka's `collectAbortedTransactions(logStartOffset, upperBound)`: the aborted transactions with data below
    `upper_bound`, read from every live segment's txn index. An ABORT marker may lie above the cleaned range
    (e.g. held back by min.compaction.lag.ms) while its transaction's data is inside it: that entry lives in
    the marker's segment, so reading only the cleaned segments' indexes would keep aborted data as winners."""
    per_segment = []
    for seg in live:
        key = seg.object_key(ObjectSuffix.TXN_INDEX)
        per_segment.append(read_txn_index(store.get(key), obj=store.object_uri(key)) if key is not None else [])
    start = live[0].start_offset if live else 0
    found = collect_aborted_txns(per_segment, start, upper_bound)
    return tuple(sorted(found, key=lambda t: t.last_offset))


def producer_state(store: ObjectStore, live: Sequence[SegmentMetadata]) -> list[ProducerStateEntry]:
    """The producer state at the end of the tier.

    From the producer snapshot of the last live segment when it has one (the state at its end, as Kafka's
    RemoteLogManager uploads it), else replayed from the tier itself: every live segment's batch headers and
    markers, in offset order (only control batches are decoded).
    """
    if not live:
        return []
    key = live[-1].object_key(ObjectSuffix.PRODUCER_SNAPSHOT)
    if key is not None:
        return read_producer_snapshot(store.get(key), obj=store.object_uri(key))
    state: dict[int, ProducerStateEntry] = {}
    for seg in live:
        log_key = seg.object_key(ObjectSuffix.LOG) or ""
        state = producer_state_from_log(store.get(log_key), obj=store.object_uri(log_key), initial=state.values())
    return list(state.values())


def _active_producers(store: ObjectStore, live: Sequence[SegmentMetadata], now_ms: int,
                      expiration_ms: int) -> dict[int, ActiveProducer]:
    entries = {e.producer_id: e for e in producer_state(store, live)}
    return {
        pid: ActiveProducer(e.last_offset if e.last_offset >= 0 else None, e.producer_epoch)
        for pid, e in expire_producers(entries, now_ms, expiration_ms).items()
    }


def _partition_work(
    store: ObjectStore, run: RunPlan, p: PartitionPlan, snapshot: PartitionSnapshot, budget: int, temp_dir: str | None
) -> PartitionWork:
    assert p.regions is not None
    members = tuple(s for g in p.groups for s in g)
    groups = tuple(group_task(gid, group) for gid, group in enumerate(p.groups))
    now_ms = run.now_ms
    task = PartitionTask(
        topic=p.topic,
        topic_id=snapshot.topic_id or "",
        partition=p.partition,
        upper_bound_offset=p.regions.first_uncleanable_offset,
        now_ms=now_ms,
        delete_retention_ms=p.config.delete_retention_ms,
        index_interval_bytes=p.config.index_interval_bytes,
        aborted=_aborted(store, snapshot.live_segments, p.regions.first_uncleanable_offset),
        active_producers=_active_producers(store, snapshot.live_segments, now_ms, p.config.producer_id_expiration_ms),
        groups=groups,
        strategy=p.config.compaction_strategy.value,
        strategy_header=p.config.compaction_strategy_header,
        bloom_fpp=p.config.bloom_filter_fpp,
        disk_budget_bytes=budget,
        temp_dir=temp_dir,
    )
    return PartitionWork(
        task=task,
        segments=members,
        first_dirty_offset=p.regions.first_dirty_offset,
        skipping=not run.plan.forced,
        segment_bytes=p.config.segment_bytes,
        segment_index_bytes=p.config.segment_index_bytes,
    )


def default_disk_budget(temp_dir: str | None = None) -> int:
    """A third of the free space where rewrite chunks are downloaded (the issue's rule of thumb)."""
    return shutil.disk_usage(temp_dir or tempfile.gettempdir()).free // 3


def _new_segment(result: dict[str, Any], group: Sequence[SegmentMetadata]) -> NewSegment:
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


def stage(spark: SparkSession, run: RunPlan, *, temp_dir: str | None = None) -> StagedRun:
    """Rewrite and upload every eligible partition of `run` (nothing becomes visible). See the module docstring.

    `temp_dir` is where executors download rewrite chunks (default: their system temporary directory).
    """
    from compaction.spark.compact import stage_partitions

    store = run.store.open()
    table = table_in_store(store)
    staged = StagedRun(run)
    staged.failed.update({(t, p): exc for t, p, exc in run.quarantined})
    budget = run.disk_budget_bytes if run.disk_budget_bytes is not None else default_disk_budget(temp_dir)
    works: dict[tuple[str, int], tuple[PartitionPlan, PartitionSnapshot, int, PartitionWork, dict[str, int]]] = {}
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
            before = vars(replace(store.stats))
            work = _partition_work(store, run, p, snap, budget, temp_dir)
            driver = {f"store_{k}": v - before[k] for k, v in vars(store.stats).items()}
            works[tp] = (p, snap, epoch, work, driver)
        except KcompactError as exc:
            staged.failed[tp] = exc
    aborted = {tp: [(t.producer_id, t.first_offset, t.last_offset) for t in entry[3].task.aborted]
               for tp, entry in works.items()}
    result = stage_partitions(spark, run.store, [w[3] for w in works.values()], aborted)
    for tp, (p, snap, epoch, work, driver) in works.items():
        done = result.partitions[tp]
        if done.error is not None:
            staged.failed[tp] = _stage_error(done.error, done.exit_code)
            continue
        by_id = {s.segment_id: s for s in work.segments}
        groups = {g.group_id: [by_id[i.segment_id] for i in g.inputs] for g in done.task.groups}
        staged.partitions.append(
            StagedPartition(
                plan=p,
                snapshot=snap,
                fencing_epoch=epoch,
                new_segments=tuple(_new_segment(r, groups[r["group_id"]]) for r in done.results),
                replaced=tuple(i.segment_id for g in done.task.groups for i in g.inputs),
                cleaner_offset=work.task.upper_bound_offset,
                stats=partition_stats(work, done, driver),
                map_seconds=result.map_seconds,
                rewrite_seconds=float(sum(r.get("seconds", 0.0) for r in done.results)),
                kept=tuple(s.segment_id for s in done.kept),
                added_object_keys=tuple(
                    AddedObjectKey(sid, ObjectKey(ObjectSuffix.BLOOM, key)) for sid, key in done.filters_built.items()
                ),
            )
        )
    staged.map_seconds, staged.rewrite_seconds = result.map_seconds, result.rewrite_seconds
    return staged


def _stage_error(message: str, exit_code: int) -> KcompactError:
    """The error a partition failed with on an executor, rebuilt with the same exit code."""
    if exit_code == ExitCode.CORRUPT_INPUT:
        return CorruptInputError(f"partition quarantined, nothing committed: {message}")
    if exit_code == ExitCode.CONFIG:
        return ConfigError(f"partition not compacted, nothing committed: {message}")
    if exit_code == ExitCode.RETRYABLE:
        return RetryableError(f"partition not compacted, nothing committed (rerun): {message}")
    return KcompactError(f"partition not compacted, nothing committed: {message}")


def partition_stats(work: PartitionWork, done: PartitionStage, driver: dict[str, int]) -> dict[str, int]:
    """The partition's counters: the rewrite's (summed over groups), the filter test's, disk and requests.

    Filter accounting: a kept segment is a true negative (its filter proved no dirty key); a rewritten one
    whose winners were resolved in the task reveals how many dirty keys it really held, so a positive
    segment that held none is a false positive. `bloom_key_*` count (dirty key, filter) tests whose truth
    is known, for the per-key rate the filters were sized for.
    """
    stats: dict[str, int] = {}
    for r in done.results:
        for k, v in r["stats"].items():
            if isinstance(v, int) and not k.endswith("timestamp"):  # counters add up, timestamps don't
                stats[k] = stats.get(k, 0) + v
    stats["invalid_versions"] = int(done.counters.get("invalid_versions", 0))
    resolved: dict[str, int] = done.summary.get("resolved", {})  # segment id -> dirty keys it really held
    known = {i: n for i, n in resolved.items() if i in done.probes and done.probes[i].readable}
    sizes = {s.segment_id: s.segment_size_bytes for s in work.segments}
    kept = {s.segment_id for s in done.kept}
    stats |= {
        "dirty_keys": done.dirty_keys,
        "clean_segments": len(work.clean),
        "segments_skipped": len(kept),
        "bytes_not_downloaded": sum(s.segment_size_bytes for s in done.kept),
        "filters_read": sum(1 for p in done.probes.values() if p.readable),
        "filter_bytes_read": sum(p.filter_bytes for p in done.probes.values()),
        "filters_built": len(done.filters_built),
        "clean_bytes_rewritten": sum(sizes[i] for i in done.verdicts if i not in kept),
        "segments_merged": sum(1 for v in done.verdicts.values() if v is Verdict.MERGED),
        "bloom_segment_true_negatives": len(kept),
        "bloom_segment_false_positives": sum(1 for i, n in known.items() if done.verdicts[i] is Verdict.HIT and n == 0),
        "bloom_key_false_positives": sum(done.probes[i].positives - n for i, n in known.items()),
        "bloom_key_absent_tests": sum(done.dirty_keys - n for n in known.values()) + done.dirty_keys * len(kept),
        "chunks": int(done.summary.get("chunks", 0)),
        "peak_temp_bytes": int(done.summary.get("peak_temp_bytes", 0)),
        "disk_budget_bytes": int(work.task.disk_budget_bytes or 0),
    }
    stats["scan_task_ms"] = int(done.counters.get("scan_task_ms", 0))
    for name in ("store_gets", "store_puts", "store_bytes_read", "store_bytes_written"):
        stats[name] = int(done.counters.get(name, 0)) + driver.get(name, 0)
    return stats


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
    """Land one partition's swap; raises FencedError / CommitConflictError when superseded.

    Idempotent: if this very swap already landed (an earlier attempt whose reply was lost), returns the
    table version that holds it instead of refusing.

    Kept segments are untouched, except that a filter written for one in this run joins its row's
    object keys, in the same commit.
    """
    change = ChangeSet.planned_from(
        sp.snapshot,
        fencing_epoch=sp.fencing_epoch,
        writer=run.writer,
        new_segments=sp.new_segments,
        state_changes=tuple(StateChange(s, SegmentState.DELETE_SEGMENT_STARTED) for s in sp.replaced),
        cleaner_offset=sp.cleaner_offset,
        run_id=run.run_id,
        added_object_keys=sp.added_object_keys,
    )
    try:
        return commit_change_set(table, change, run.now_ms if now_ms is None else now_ms).version
    except CommitConflictError:
        # The outcome may be unknown, not refused: a commit whose reply was lost is reported as a conflict
        # when delta-rs retries it. Its new segment ids are fresh, so finding them in the table proves it landed.
        current = table.partition_snapshot(sp.plan.topic, sp.plan.partition)
        if sp.new_segments and all(current.segment(n.segment_id) is not None for n in sp.new_segments):
            return current.version
        raise
