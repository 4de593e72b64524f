"""Stage a run: take each eligible partition, run the Spark data path, upload; nothing of the compaction becomes
visible.

First `stage` commits the run's retention (`RunPlan.retention`: the compact,delete segments past retention.ms /
retention.bytes go to DELETE_SEGMENT_STARTED, one commit for every partition, each re-decided on its latest rows),
since the compaction was planned on the log as that leaves it. Then it acquires a new fencing epoch for every
eligible partition, like a new leader epoch, in one commit of their own (`acquire_fencing_epochs`; a partition
refused there fails alone), checks per partition that the planned segments are still live, and builds its
`PartitionWork` from the plan (with the producer state and aborted transactions the plan read).
`compaction.spark.pipeline` then scans, decides the winners, tests the filters and rewrites every chunk under a
fresh segment id. A crash here leaves only unreferenced objects, which `kcompact gc` removes; rerunning is safe.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compaction.bloom.sizing import filter_fpp
from compaction.errors import CommitConflictError, KcompactError
from compaction.format.checkpoints import EpochEntry
from compaction.metadata import (
    NewSegment,
    ObjectKey,
    ObjectSuffix,
    PartitionSnapshot,
    SegmentMetadata,
    SegmentState,
    TopicPartition,
    acquire_fencing_epochs,
    table_in_store,
)
from compaction.metadata.batch import Reader, known_reader
from compaction.metadata.change_set import AddedObjectKey
from compaction.planner import PartitionPlan
from compaction.producers import active_producers
from compaction.retention import RetentionReport, execute_retention
from compaction.rewrite.cache import cache_dir
from compaction.rewrite.upload import ChunkResult
from compaction.run.plan import RunPlan
from compaction.run.stats import PartitionStats, partition_stats
from compaction.tasks import PartitionTask, PartitionWork, group_task

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from compaction.spark.pipeline import PartitionStage


@dataclass
class StagedPartition:
    """One partition's uploaded output, ready to commit."""

    plan: PartitionPlan
    snapshot: PartitionSnapshot
    fencing_epoch: int
    new_segments: tuple[NewSegment, ...]
    replaced: tuple[str, ...]
    cleaner_offset: int
    stats: PartitionStats
    map_seconds: float  # the run's scan + winners phase (shared by every partition of the run)
    rewrite_seconds: float  # this partition's rewrite + upload, summed over its chunks on the executors
    kept: tuple[str, ...] = ()  # clean segments left as they are: their filter proved no dirty key in them
    added_object_keys: tuple[AddedObjectKey, ...] = ()  # filters written for segments that had none
    filter_fpp: float = 0.0  # the false-positive rate of the filters written with the outputs


@dataclass
class StagedRun:
    """The uploaded output of a run. Phase times are wall clock for the whole run (all partitions together)."""

    run: RunPlan
    partitions: list[StagedPartition] = field(default_factory=list)
    failed: dict[TopicPartition, KcompactError] = field(default_factory=dict)
    map_seconds: float = 0.0
    rewrite_seconds: float = 0.0
    retention: RetentionReport | None = None  # the expiry committed first (compact,delete partitions)
    reader: Reader | None = field(default=None, compare=False, repr=False)
    """The rows the run read and committed so far (`metadata.batch.known_reader`): the commit reads the table's files
    again only for partitions another commit touched since."""


def default_disk_budget(temp_dir: str | None = None) -> int:
    """A third of the free space where rewrite chunks are downloaded."""
    return shutil.disk_usage(temp_dir or tempfile.gettempdir()).free // 3


def stage(spark: SparkSession, run: RunPlan, *, temp_dir: str | None = None) -> StagedRun:
    """Rewrite and upload every eligible partition of `run` (nothing becomes visible). See the module docstring.

    `temp_dir` is where executors keep the run's segment cache and download rewrite chunks (default: their
    system temporary directory).
    """
    return take(run, temp_dir=temp_dir).stage(spark)


@dataclass
class TakenRun:
    """A run whose partitions are taken (`take`): what the Spark side stages next. Taking them needs no Spark, so a
    command can take them while its session starts (`compaction.cli.options.CommandSession`)."""

    staged: StagedRun
    taken: list[_TakenPartition]

    def stage(self, spark: SparkSession) -> StagedRun:
        """Scan, rewrite and upload the taken partitions (`compaction.spark.pipeline`); nothing becomes visible."""
        from compaction.spark.pipeline import stage_partitions

        staged = self.staged
        result = stage_partitions(spark, staged.run.store, [t.work for t in self.taken])
        for t in self.taken:
            done = result.partitions[t.work.tp]
            if done.error is not None:
                staged.failed[t.work.tp] = done.error
            else:
                staged.partitions.append(_staged_partition(t, done, result.map_seconds))
        staged.map_seconds, staged.rewrite_seconds = result.map_seconds, result.rewrite_seconds
        return staged


def take(run: RunPlan, *, temp_dir: str | None = None) -> TakenRun:
    """`run`'s retention committed, then its eligible partitions taken in one commit of new fencing epochs, each
    checked and given its work (see the module docstring); a partition refused on the way is in `staged.failed`."""
    staged = StagedRun(run)
    staged.failed.update({TopicPartition(t, p): exc for t, p, exc in run.quarantined})
    staged.retention = expire_first(run, staged.failed)
    taken, staged.reader = _take_partitions(run, staged.failed, temp_dir)
    return TakenRun(staged, taken)


def expire_first(run: RunPlan, failed: dict[TopicPartition, KcompactError]) -> RetentionReport | None:
    """Commit `run`'s retention; a partition whose expiry kept conflicting goes into `failed` (not compacted:
    its plan assumed the expiry)."""
    if run.retention is None or not run.retention.in_scope:
        return None
    configs = {p.topic: p.config for p in run.plan.partitions}
    table = table_in_store(run.store.open())
    return execute_retention(table, run.retention, configs.__getitem__, writer=run.writer, failed=failed)


@dataclass(frozen=True)
class _TakenPartition:
    """An eligible partition taken into the run: its plan, the snapshot and fencing epoch read when it was taken,
    and the work the Spark side runs for it."""

    plan: PartitionPlan
    snapshot: PartitionSnapshot
    fencing_epoch: int
    work: PartitionWork


def _take_partitions(run: RunPlan, failed: dict[TopicPartition, KcompactError], temp_dir: str | None
                     ) -> tuple[list[_TakenPartition], Reader]:
    """Every eligible partition not already failed, taken in one commit of new fencing epochs; per partition then a
    check that its planned segments are still live, and its work. A partition where one of them fails goes into
    `failed`. Also the reader the commit was made through, holding the rows it left (for the run's commit)."""
    store = run.store.open()
    table = table_in_store(store)
    budget = run.disk_budget_bytes if run.disk_budget_bytes is not None else default_disk_budget(temp_dir)
    wanted = [p for p in run.plan.eligible
              if (tp := p.tp) not in failed and tp in run.inputs]
    reader = known_reader(table, {p.tp: run.read[p.tp] for p in wanted if p.tp in run.read})
    acquired = acquire_fencing_epochs(table, [p.tp for p in wanted], run.writer,
                                      run.now_ms, run_id=run.run_id, reader=reader)
    taken = []
    for p in wanted:
        tp = p.tp
        snap = acquired[tp]
        if isinstance(snap, KcompactError):
            failed[tp] = snap
            continue
        try:
            planned = {s.segment_id for g in p.groups for s in g}
            replaced_since = planned - {s.segment_id for s in snap.live_segments}
            if replaced_since:
                raise CommitConflictError(f"{p.topic}-{p.partition}: expected planned segments to be live, found "
                                          f"{sorted(replaced_since)} replaced since the plan")
            taken.append(_TakenPartition(p, snap, snap.fencing_epoch,
                                         partition_work(run, p, snap.topic_id or "", budget, temp_dir)))
        except KcompactError as exc:
            failed[tp] = exc
    return taken, reader


def _staged_partition(taken: _TakenPartition, done: PartitionStage, map_seconds: float) -> StagedPartition:
    """What staging uploaded for one partition, as its commit needs it."""
    work = taken.work
    by_id = {s.segment_id: s for s in work.segments}
    groups = {g.group_id: [by_id[i.segment_id] for i in g.inputs] for g in done.task.groups}
    return StagedPartition(
        plan=taken.plan,
        snapshot=taken.snapshot,
        fencing_epoch=taken.fencing_epoch,
        new_segments=tuple(_new_segment(c, groups[c.group_id]) for c in done.chunks),
        replaced=tuple(i.segment_id for g in done.task.groups for i in g.inputs),
        cleaner_offset=work.task.upper_bound_offset,
        stats=partition_stats(work, done),
        map_seconds=map_seconds,
        rewrite_seconds=float(sum(c.seconds for c in done.chunks)),
        kept=tuple(s.segment_id for s in done.kept),
        added_object_keys=tuple(AddedObjectKey(sid, ObjectKey(ObjectSuffix.BLOOM, key))
                                for sid, key in done.scan.filters_built.items()),
        filter_fpp=work.task.bloom_fpp,
    )


def partition_work(run: RunPlan, p: PartitionPlan, topic_id: str, budget: int, temp_dir: str | None
                   ) -> PartitionWork:
    """The round of one eligible partition, as the Spark side runs it."""
    assert p.regions is not None
    inputs = run.inputs[p.tp]
    members = tuple(s for g in p.groups for s in g)
    task = PartitionTask(
        topic=p.topic,
        topic_id=topic_id,
        partition=p.partition,
        upper_bound_offset=p.regions.first_uncleanable_offset,
        now_ms=run.now_ms,
        delete_retention_ms=p.config.delete_retention_ms,
        index_interval_bytes=p.config.index_interval_bytes,
        aborted=inputs.aborted,
        active_producers=active_producers(inputs.producers, run.now_ms, p.config.producer_id_expiration_ms),
        groups=tuple(group_task(gid, group) for gid, group in enumerate(p.groups)),
        strategy=p.config.compaction_strategy,
        strategy_header=p.config.compaction_strategy_header,
        bloom_fpp=filter_fpp(p.config.bloom_filter_fpp, sum(s.segment_size_bytes for s in members)),
        disk_budget_bytes=budget,
        temp_dir=temp_dir,
        cache_dir=cache_dir(temp_dir, run.run_id),
    )
    return PartitionWork(task=task, segments=members, first_dirty_offset=p.regions.first_dirty_offset,
                         skipping=not run.plan.forced, segment_bytes=p.config.segment_bytes,
                         segment_index_bytes=p.config.segment_index_bytes)


def _new_segment(chunk: ChunkResult, group: list[SegmentMetadata]) -> NewSegment:
    """The row of one output segment. One that kept no batch at all has no timestamp of its own: like Kafka's cleaned
    segment, which keeps its last input's mtime (`LogSegment.largestTimestamp` falls back to it), it takes its
    inputs' largest timestamp, so that retention ages it with them."""
    epochs: dict[int, int] = {}
    for seg in group:
        for e in seg.segment_leader_epochs:
            epochs.setdefault(e.epoch, e.start_offset)
    return NewSegment(
        segment_id=chunk.segment_id,
        start_offset=chunk.start_offset,
        end_offset=chunk.end_offset,
        max_timestamp_ms=chunk.max_timestamp_ms if chunk.size else max(s.max_timestamp_ms for s in group),
        segment_leader_epochs=tuple(EpochEntry(k, v) for k, v in sorted(epochs.items())),
        segment_size_bytes=chunk.size,
        object_keys=tuple(ObjectKey(ObjectSuffix(s), k) for s, k in chunk.object_keys.items()),
        record_count=chunk.record_count,
        first_batch_max_timestamp_ms=chunk.first_batch_max_timestamp_ms,
        state=SegmentState.COPY_SEGMENT_FINISHED,
        transactional=chunk.transactional,
    )


__all__ = ["StagedPartition", "StagedRun", "default_disk_budget", "partition_work", "stage"]
