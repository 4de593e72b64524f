"""`kcompact tier`: copy the rolled segments of a Kafka log dir into the store, as KIP-405's copy path does.

- `logdir`: reading a broker's log dir: its partitions (Kafka's internal ones skipped), and each rolled segment
  validated and prepared with every companion a remote copy needs (indexes rebuilt when missing or inconsistent);
- `copy`: the uploads and the one metadata commit after them (COPY_SEGMENT_FINISHED) for each batch of partitions,
  and the producer snapshot every segment goes up with.

`kcompact wal upload` reads log dirs through `logdir` too.
"""

from __future__ import annotations

from compaction.tier.copy import PartitionTierResult, tier_logdir, tier_partition, with_producer_snapshots
from compaction.tier.logdir import (
    KAFKA_INTERNAL_TOPICS,
    LocalPartition,
    PreparedSegment,
    internal_note,
    internal_partitions,
    partitions,
    prepare_segment,
)

__all__ = [
    "KAFKA_INTERNAL_TOPICS",
    "LocalPartition",
    "PartitionTierResult",
    "PreparedSegment",
    "internal_note",
    "internal_partitions",
    "partitions",
    "prepare_segment",
    "tier_logdir",
    "tier_partition",
    "with_producer_snapshots",
]
