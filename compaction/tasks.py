"""The values a run hands to its executors: one home for the task model.

The driver builds them from the plan; Spark ships them (they are small, frozen and picklable); the
executor side (`compaction.rewrite.upload`, `compaction.spark.scan`) opens the store from its spec. No
pyspark and no metadata-table imports here, so unpickling a task on an executor stays cheap.

- `SegmentScanTask`: one segment for the Spark scan.
- `InputSegment` / `GroupTask`: one rewrite chunk, a run of consecutive segments cleaned into one.
- `PartitionTask`: what every chunk of one partition shares (offsets, clock, retention settings, the
  aborted transactions and active producers read once at planning).
- `PartitionWork`: the driver's view of one partition's round: which segments are scanned, which the filter
  test may keep, and the task over what is left once it has.
- `task_groups`: pieces of work shared among a few tasks by size (the scan's slices, a table update's partitions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field, replace

from compaction.bloom.segment import filter_key
from compaction.bloom.skipping import clean_segments, regroup_around
from compaction.config import CompactionStrategy
from compaction.format.indexes import AbortedTxn
from compaction.metadata.model import ObjectSuffix, OfPartition, SegmentMetadata, TopicPartition
from compaction.planner.grouping import estimated_index_sizes
from compaction.strategies.retention import ActiveProducer
from compaction.strategies.transactions import TransactionState


@dataclass(frozen=True)
class SegmentScanTask(OfPartition):
    """One segment for the Spark scan; `dirty` marks its keys as the run's dirty keys.

    `cache` asks the scan to keep the downloaded bytes for the rewrite (`compaction.rewrite.cache`), so the
    segment is fetched once per run.
    """

    topic: str
    partition: int
    segment_id: str
    log_key: str
    start_offset: int
    dirty: bool = True
    filter_key: str | None = None  # build this clean segment's filter from the scan and upload it here
    size: int = 0  # the segment's bytes, to balance scan tasks
    cache: bool = False
    offsets: int = 0  # the offsets it spans: at least its records, to bound a scan task's rows


@dataclass(frozen=True)
class InputSegment:
    segment_id: str
    start_offset: int
    end_offset: int
    keys: Mapping[str, str]  # suffix -> object key
    size: int = 0  # bytes of the `.log` object (metadata's segment_size_bytes)


@dataclass(frozen=True)
class GroupTask:
    """One rewrite chunk; `txn_state` is Kafka's transaction-marker state at its start (None: a round's first
    group, or computed by the task that rewrites the groups before it)."""

    group_id: int
    start_offset: int
    end_offset: int
    inputs: tuple[InputSegment, ...]
    txn_state: TransactionState | None = None

    @property
    def size(self) -> int:
        return sum(i.size for i in self.inputs)


@dataclass(frozen=True)
class PartitionTask(OfPartition):
    topic: str
    topic_id: str
    partition: int
    upper_bound_offset: int
    now_ms: int
    delete_retention_ms: int
    index_interval_bytes: int
    aborted: tuple[AbortedTxn, ...]
    active_producers: Mapping[int, ActiveProducer]
    groups: tuple[GroupTask, ...]
    strategy: CompactionStrategy = CompactionStrategy.OFFSET  # the Spark side ranks records with it
    strategy_header: str | None = None
    bloom_fpp: float = 0.01  # false-positive rate of the filters written with the outputs
    disk_budget_bytes: int | None = None  # the most temporary disk one chunk may use; None: no limit
    temp_dir: str | None = None  # where chunks are downloaded; None: the system's temporary directory
    cache_dir: str | None = None  # where the scan left the segments it fetched (`compaction.rewrite.cache`)


def group_task(group_id: int, segments: Sequence[SegmentMetadata]) -> GroupTask:
    """The rewrite chunk over `segments` (contiguous, in offset order)."""
    return GroupTask(
        group_id,
        segments[0].start_offset,
        segments[-1].end_offset,
        tuple(
            InputSegment(s.segment_id, s.start_offset, s.end_offset, {o.suffix.value: o.key for o in s.object_keys},
                         s.segment_size_bytes)
            for s in segments
        ),
    )


@dataclass(frozen=True)
class PartitionWork:
    """What the driver asks of one partition: its planned task, and what it needs to keep segments unread.

    `segments` are the ones the plan rewrites (every live segment below the first uncleanable offset), in
    order; `task.groups` is the planner's grouping of them. `skipping` is False in a `--force` run.
    """

    task: PartitionTask
    segments: tuple[SegmentMetadata, ...]
    first_dirty_offset: int
    skipping: bool
    segment_bytes: int
    segment_index_bytes: int
    clean: tuple[SegmentMetadata, ...] = field(init=False)  # the segments the filter test may keep unread (none
    # when skipping is off)
    scans: tuple[SegmentScanTask, ...] = field(init=False)  # what the first Spark scan reads

    def __post_init__(self) -> None:
        """Derives `clean` and `scans` here, on the driver's planning side, so that the Spark side only reads them."""
        clean = tuple(clean_segments(self.segments, self.first_dirty_offset)) if self.skipping else ()
        object.__setattr__(self, "clean", clean)
        object.__setattr__(self, "scans", self._first_scans({s.segment_id for s in clean}))

    @property
    def tp(self) -> TopicPartition:
        return self.task.tp

    def _first_scans(self, clean: Set[str]) -> tuple[SegmentScanTask, ...]:
        """Dirty segments, and clean ones without a filter (building it). Whether the scan keeps their bytes for
        the rewrite is the run's decision (its disk budget)."""
        out = []
        for s in self.segments:
            log = s.object_key(ObjectSuffix.LOG) or ""
            if s.segment_id not in clean:
                out.append(SegmentScanTask(*self.tp, s.segment_id, log, s.start_offset, True,
                                           size=s.segment_size_bytes, offsets=_span(s)))
            elif s.object_key(ObjectSuffix.BLOOM) is None:
                out.append(SegmentScanTask(*self.tp, s.segment_id, log, s.start_offset, False, filter_key(log),
                                           size=s.segment_size_bytes, offsets=_span(s)))
        return tuple(out)

    def rescans(self, kept: Set[str], scanned: Set[str]) -> list[SegmentScanTask]:
        """The clean segments to rewrite that the first scan did not read: their filters said they may hold a
        dirty key (or could not say). Scanned now, so that every winner is known before any chunk is rewritten
        (and, the budget allowing, cached for the rewrite: each is still fetched once)."""
        out = []
        for s in self.clean:
            if s.segment_id not in kept and s.segment_id not in scanned:
                log = s.object_key(ObjectSuffix.LOG) or ""
                out.append(SegmentScanTask(*self.tp, s.segment_id, log, s.start_offset, False,
                                           size=s.segment_size_bytes, offsets=_span(s)))
        return out

    def reshaped(self, kept: Set[str]) -> PartitionTask:
        """The task with the kept segments left out and the rest regrouped (chunks within the budget).

        A single segment above the budget still forms its own chunk: `check_budget` refuses it.
        """
        budget = self.task.disk_budget_bytes
        limit = self.segment_bytes if budget is None else min(self.segment_bytes, budget)
        groups = (
            [tuple(g) for g in self._planned()]
            if not kept and limit >= self.segment_bytes
            else regroup_around(
                self.segments,
                kept,
                max_size=limit,
                max_index_size=self.segment_index_bytes,
                first_uncleanable_offset=self.task.upper_bound_offset,
                index_sizes=estimated_index_sizes(self.task.index_interval_bytes),
            )
        )
        return replace(self.task, groups=tuple(group_task(gid, g) for gid, g in enumerate(groups)))

    def _planned(self) -> list[tuple[SegmentMetadata, ...]]:
        by_id = {s.segment_id: s for s in self.segments}
        return [tuple(by_id[i.segment_id] for i in g.inputs) for g in self.task.groups]


def _span(segment: SegmentMetadata) -> int:
    return max(0, segment.end_offset - segment.start_offset + 1)


def task_groups(sizes: Sequence[int], tasks: int) -> list[list[int]]:
    """Pieces of work of `sizes` (bytes) shared among at most `tasks` tasks (and never more tasks than pieces),
    largest first into the lightest task (ties: the one with fewer pieces, then the first); each task lists its
    pieces (indices into `sizes`) in order. Spark pays a fixed cost for each Python task it runs, so work of many
    small pieces goes in as few tasks as the cores allow. Pure."""
    n = min(len(sizes), max(1, tasks))
    groups: list[list[int]] = [[] for _ in range(n)]
    loads = [0] * n
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        lightest = min(range(n), key=lambda g: (loads[g], len(groups[g])))
        groups[lightest].append(i)
        loads[lightest] += sizes[i]
    return [sorted(g) for g in groups]


__all__ = [
    "ActiveProducer",
    "GroupTask",
    "InputSegment",
    "PartitionTask",
    "PartitionWork",
    "SegmentScanTask",
    "group_task",
    "task_groups",
]
