"""Planning, pure: metadata snapshot + config + now_ms -> plan (regions, dirty ratio, grouping).

`regions` holds Kafka's LogCleanerManager arithmetic, `grouping` its groupSegmentsBySize, `partition`
the per-partition plan, `explain` the reasons in words, `planner` the run's ordered plan. Nothing here
imports pyspark, reads a clock, a file or the environment.
"""

from __future__ import annotations

from compaction.planner.grouping import IndexSizes, estimated_index_sizes, group_segments_by_size
from compaction.planner.partition import PartitionPlan, plan_partition
from compaction.planner.planner import CompactionPlan, build_plan
from compaction.planner.regions import Decision, Regions, UncleanableBound, regions_of

__all__ = [
    "CompactionPlan",
    "Decision",
    "IndexSizes",
    "PartitionPlan",
    "Regions",
    "UncleanableBound",
    "build_plan",
    "estimated_index_sizes",
    "group_segments_by_size",
    "plan_partition",
    "regions_of",
]
