"""Time and size retention of `compact,delete` topics: `kcompact expire`, Kafka's remote retention for kcompact.

`plan` decides (pure: metadata snapshot + config + now -> `RetentionPlan`), `execute` commits each partition's
expired prefix as DELETE_SEGMENT_STARTED, `report` counts. The objects go later, with `kcompact gc`.
"""

from __future__ import annotations

from compaction.retention.execute import execute_retention, expire
from compaction.retention.plan import (
    Breach,
    ExpiredSegment,
    PartitionRetention,
    RetentionPlan,
    after_expiry,
    expired_prefix,
    plan_retention,
)
from compaction.retention.report import PartitionExpiry, RetentionReport

__all__ = [
    "Breach",
    "ExpiredSegment",
    "PartitionExpiry",
    "PartitionRetention",
    "RetentionPlan",
    "RetentionReport",
    "after_expiry",
    "execute_retention",
    "expire",
    "expired_prefix",
    "plan_retention",
]
