"""The shape of one partition's round: what the scan reads, which segments the filter test may keep, and the
task over what is left once it has (regrouped, in chunks within the disk budget).

The driver builds a `PartitionWork` from the plan; the Spark side (`compaction.spark.compact`) asks it for
the segments to scan (`scans`) and, after the filter test, for the final task (`reshaped`). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass, replace

from compaction.bloom.segment import filter_key
from compaction.bloom.skipping import clean_segments, regroup_around
from compaction.metadata.model import ObjectSuffix, SegmentMetadata
from compaction.plan.grouping import estimated_index_sizes
from compaction.rewrite.upload import GroupTask, InputSegment, PartitionTask


def group_task(group_id: int, segments: Sequence[SegmentMetadata], resolve: Set[str] = frozenset()) -> GroupTask:
    """The rewrite chunk over `segments` (contiguous, in offset order); those in `resolve` get their winners
    in the task (see `PartitionWork.reshaped`)."""
    return GroupTask(
        group_id,
        segments[0].start_offset,
        segments[-1].end_offset,
        tuple(
            InputSegment(s.segment_id, s.start_offset, s.end_offset, {o.suffix.value: o.key for o in s.object_keys},
                         s.segment_size_bytes, resolve=s.segment_id in resolve)
            for s in segments
        ),
    )


@dataclass(frozen=True)
class SegmentScanTask:
    """One segment for the Spark scan; `dirty` marks its keys as the run's dirty keys."""

    topic: str
    partition: int
    segment_id: str
    log_key: str
    start_offset: int
    dirty: bool = True
    filter_key: str | None = None  # build this clean segment's filter from the scan and upload it here
    size: int = 0  # the segment's bytes, to balance scan tasks


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

    @property
    def tp(self) -> tuple[str, int]:
        return (self.task.topic, self.task.partition)

    @property
    def clean(self) -> list[SegmentMetadata]:
        """The segments the filter test may keep unread (none when skipping is off)."""
        return clean_segments(self.segments, self.first_dirty_offset) if self.skipping else []

    def scans(self) -> list[SegmentScanTask]:
        """What the Spark scan reads: dirty segments, and clean ones without a filter (building it)."""
        clean = {s.segment_id for s in self.clean}
        out = []
        for s in self.segments:
            log = s.object_key(ObjectSuffix.LOG) or ""
            if s.segment_id not in clean:
                out.append(SegmentScanTask(*self.tp, s.segment_id, log, s.start_offset, True,
                                           size=s.segment_size_bytes))
            elif s.object_key(ObjectSuffix.BLOOM) is None:
                out.append(SegmentScanTask(*self.tp, s.segment_id, log, s.start_offset, False, filter_key(log),
                                           size=s.segment_size_bytes))
        return out

    def reshaped(self, kept: set[str], scanned: set[str]) -> PartitionTask:
        """The task with the kept segments left out and the rest regrouped (chunks within the budget).

        An input that is clean and was not `scanned` by Spark gets its winners in the task (`resolve`).
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
        resolve = {s.segment_id for s in self.clean} - scanned
        return replace(self.task, groups=tuple(group_task(gid, g, resolve) for gid, g in enumerate(groups)))

    def _planned(self) -> list[tuple[SegmentMetadata, ...]]:
        by_id = {s.segment_id: s for s in self.segments}
        return [tuple(by_id[i.segment_id] for i in g.inputs) for g in self.task.groups]
