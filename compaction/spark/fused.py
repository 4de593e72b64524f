"""The one job without a shuffle: scan, fold and rewrite of a partition in one Python task.

When each partition of the one job (`compaction.spark.pipeline`) is one chunk, and its whole log fits what one
scan task takes anyway (`SCAN_TASK_BYTES`, `SCAN_TASK_RECORDS`: the fold holds a row per distinct key, ~40 bytes),
the task that scans a partition's segments has every record of the partition: its fold (`KeyFold`) is the
partition's winners, and the same task can rewrite the chunk from them at once. Nothing crosses into the JVM but
one outcome row per chunk: no rows handed to Spark, no shuffle, no aggregate. The tasks are the rewrite's slots
(`compaction.spark.pipeline.rewrite_slots`: partitions packed by bytes, as many tasks as cores), so the path is
taken when there are at least as many slots as cores (`fits`); a partition cut into several chunks, or one whose
log is larger than a scan task's share, keeps the shuffle, which spreads its scan over every core.

The results are those of the shuffle path: the fold is the scan's own (`compaction.strategies.winner.fold_segment`),
the rewrite the rewrite job's (`compaction.spark.rewrite_job.run_unit`), and what the scan learns (reports, filters
built, transactional batches) reaches the driver through the same accumulator. A segment that fails its scan fails
its partition (the tracker carries the error) and that partition's chunk is not rewritten.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import Accumulator, Broadcast
from pyspark.sql import SparkSession

from compaction.metadata.model import TopicPartition
from compaction.spark import scan as scan_job
from compaction.spark.rewrite_job import RewriteUnit, UnitOutcome, outcome_batch, outcomes_of, run_unit
from compaction.spark.scan import ScanSettings, ScanTask, SegmentDescriptor, describe
from compaction.storage.base import ObjectStore
from compaction.tasks import SegmentScanTask


@dataclass(frozen=True)
class FusedUnit:
    """One chunk rewritten by the task that folds its partition: the unit, and every segment of the partition to
    fold first (in offset order)."""

    unit: RewriteUnit
    segments: tuple[SegmentDescriptor, ...]


def fits(slots: Sequence[Sequence[RewriteUnit]], scans: Sequence[SegmentScanTask], parallelism: int) -> bool:
    """Whether the one job's `slots` can each fold and rewrite their partitions alone: every partition is one
    unit, no partition's segments (`scans`) exceed a scan task's bytes or records, and the slots keep every core
    busy. Pure."""
    units = [u for units in slots for u in units]
    if len(slots) < parallelism or len({u.partition_index for u in units}) < len(units):
        return False
    sizes: dict[TopicPartition, list[int]] = {}
    for s in scans:
        size = sizes.setdefault(s.tp, [0, 0])
        size[0] += s.size
        size[1] += s.offsets
    return all(b <= scan_job.SCAN_TASK_BYTES and r <= scan_job.SCAN_TASK_RECORDS for b, r in sizes.values())


class _FusedTask:
    """The `mapInArrow` function of the fused job: task i folds and rewrites the units of slot i, one after the
    other, and hands back a pickled `UnitOutcome` each."""

    def __init__(self, settings: ScanSettings, tracker: Accumulator, slots: Broadcast[list[list[FusedUnit]]]) -> None:
        self.settings = settings
        self.tracker = tracker
        self.slots = slots

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        scan = ScanTask(self.settings, self.tracker, [])
        slots = self.slots.value
        store = self.settings.spec.open()
        outcomes: list[UnitOutcome] = []
        with store.deferred_sync():  # the task's objects made durable together, before any outcome is reported
            for slot in (i for ids in batches for i in ids.column(0).to_pylist()):
                for fused in slots[slot]:
                    winners = self._fold(scan, store, fused.segments)
                    if winners is not None:  # else its partition failed (the tracker says why): no rewrite
                        outcomes.append(run_unit(store, fused.unit, slot, winners))
        yield outcome_batch(outcomes)

    def _fold(self, scan: ScanTask, store: ObjectStore, segments: Sequence[SegmentDescriptor]) -> np.ndarray | None:
        """The winning offsets of a partition's `segments` (its whole log), or None when one failed its scan. The
        fold is freed before the rewrite starts: only its offsets stay."""
        from compaction.strategies.keyfold import KeyFold
        from compaction.strategies.winner import fold_segment

        fold = KeyFold()
        for d in segments:
            scanned = scan.fetch(store, d)
            if scanned is None:
                return None
            partition = self.settings.partitions[d.partition_index]
            scan.done(d, scanned, fold_segment(fold, scanned.segment.records, partition.aborted, partition.strategy,
                                               d.dirty))
        return fold.offsets()


def fold_and_rewrite(spark: SparkSession, settings: ScanSettings, scans: Sequence[SegmentScanTask],
                     index_of: Mapping[TopicPartition, int], tracker: Accumulator,
                     slots: Sequence[Sequence[RewriteUnit]]) -> list[UnitOutcome]:
    """The one job as one stage of `len(slots)` tasks (see the module docstring); one outcome per unit whose
    partition scanned cleanly. The scan reports go to `tracker`."""
    by_tp: dict[TopicPartition, list[SegmentScanTask]] = {}
    for s in scans:
        by_tp.setdefault(s.tp, []).append(s)
    tp_of = {index: tp for tp, index in index_of.items()}
    fused = []
    for units in slots:
        parts = [sorted(by_tp.get(tp_of[u.partition_index], []), key=lambda s: s.start_offset) for u in units]
        fused.append([FusedUnit(u, tuple(d)) for u, d in zip(units, describe(scans, parts, index_of), strict=True)])
    shipped = spark.sparkContext.broadcast(fused)
    try:
        ids = spark.range(0, len(fused), numPartitions=max(1, len(fused)))  # task i runs slot i
        rows = ids.mapInArrow(_FusedTask(settings, tracker, shipped), "outcome binary").collect()
    finally:
        shipped.unpersist()
    return outcomes_of(rows)


__all__ = ["FusedUnit", "fits", "fold_and_rewrite"]
