"""Garbage collection of the store: `kcompact gc`, KIP-405's delete path plus an orphan sweep.

`plan` decides (pure: store listing + metadata snapshot + now -> `GcPlan`), `execute` acts in the
manifest-first order (retire rows -> delete objects -> record DELETE_SEGMENT_FINISHED), `report` counts.
A dry run renders the same plan without executing it.
"""

from __future__ import annotations

from compaction.gc.execute import collect_garbage, execute_gc
from compaction.gc.plan import (
    DEFAULT_GRACE_MS,
    DEFAULT_ORPHAN_GRACE_MS,
    GcPlan,
    GraceMs,
    PartitionGcPlan,
    SegmentAction,
    SegmentDeletion,
    plan_gc,
    segment_action,
)
from compaction.gc.report import GcCounts, GcReport, PartitionGcReport

__all__ = [
    "DEFAULT_GRACE_MS",
    "DEFAULT_ORPHAN_GRACE_MS",
    "GcCounts",
    "GcPlan",
    "GcReport",
    "GraceMs",
    "PartitionGcPlan",
    "PartitionGcReport",
    "SegmentAction",
    "SegmentDeletion",
    "collect_garbage",
    "execute_gc",
    "plan_gc",
    "segment_action",
]
