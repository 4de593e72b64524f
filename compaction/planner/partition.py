"""The plan for one partition: regions, decision, the reason in words, and the output segment groups."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from compaction.config import TopicConfig
from compaction.metadata.model import OfPartition, SegmentMetadata
from compaction.metadata.snapshot import PartitionSnapshot
from compaction.planner import explain
from compaction.planner.grouping import estimated_index_sizes, group_segments_by_size
from compaction.planner.regions import Decision, Regions, decide, regions_of

_CONFIG_SHOWN = ("cleanup.policy", "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "max.compaction.lag.ms")


@dataclass(frozen=True)
class PartitionPlan(OfPartition):
    """The plan for one partition at one metadata table version.

    `regions` is None when the topic is not compacted or nothing is tiered. `groups` (eligible
    partitions only) are Kafka's `groupSegmentsBySize` over every live segment below the first
    uncleanable offset, the clean prefix included; each group becomes one output segment. `commit_seq`
    and `fencing_epoch` are the partition's at the snapshot, for the commit's preconditions. `reason` is
    never empty and, for a partition that is not cleaned, says what would change that.
    """

    topic: str
    partition: int
    config: TopicConfig
    regions: Regions | None
    decision: Decision
    reason: str
    segment_count: int
    commit_seq: int
    fencing_epoch: int
    groups: tuple[tuple[SegmentMetadata, ...], ...] = ()

    @property
    def eligible(self) -> bool:
        return self.decision.eligible

    @property
    def must_clean(self) -> bool:
        """KIP-354: some dirty batch is older than max.compaction.lag.ms (even if nothing is cleanable)."""
        return self.regions is not None and self.regions.must_clean

    @property
    def dirty_ratio(self) -> float:
        return self.regions.dirty_ratio if self.regions else 0.0

    @property
    def max_compaction_delay_ms(self) -> int:
        return self.regions.max_compaction_delay_ms if self.regions else 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (for `kcompact plan --json`)."""
        r = self.regions
        regions = None
        if r is not None:
            regions = {k: v.value if isinstance(v, StrEnum) else v for k, v in vars(r).items()}
            regions |= {"total_bytes": r.total_bytes, "dirty_ratio": r.dirty_ratio}
        return {
            "topic": self.topic,
            "partition": self.partition,
            "eligible": self.eligible,
            "must_clean": self.must_clean,
            "decision": self.decision.value,
            "reason": self.reason,
            "max_compaction_delay_ms": self.max_compaction_delay_ms,
            "segments": self.segment_count,
            "commit_seq": self.commit_seq,
            "fencing_epoch": self.fencing_epoch,
            "config": {k: v for k, v in self.config.to_kafka().items() if k in _CONFIG_SHOWN},
            "regions": regions,
            "groups": [
                {
                    "base_offset": g[0].start_offset,
                    "size_bytes": sum(s.segment_size_bytes for s in g),
                    "segment_ids": [s.segment_id for s in g],
                }
                for g in self.groups
            ],
        }


def plan_partition(
    snapshot: PartitionSnapshot,
    config: TopicConfig,
    now_ms: int,
    *,
    first_unstable_offset: int | None = None,
    force: bool = False,
) -> PartitionPlan:
    """Plan one partition at `now_ms`. Pure and deterministic: the same inputs give the same plan.

    Args:
        snapshot: the partition at one metadata table version; its live segments and its cleaner
            checkpoint (`snapshot.lineage`, None if it was never cleaned) are used.
        config: the topic's config.
        now_ms: the run's clock, read once by the caller.
        first_unstable_offset: the first offset of a transaction tiered without its marker, if any.
        force: make the partition eligible whenever it has cleanable bytes (reason "forced (...)").
    """
    segments = snapshot.live_segments
    lineage = snapshot.lineage
    checkpoint = lineage.current if lineage.offsets else None

    def plan(
        regions: Regions | None, decision: Decision, reason: str, groups: tuple[tuple[SegmentMetadata, ...], ...] = ()
    ) -> PartitionPlan:
        return PartitionPlan(snapshot.topic, snapshot.partition, config, regions, decision, reason, len(segments),
                             snapshot.commit_seq, snapshot.fencing_epoch, groups)

    if not config.is_compacted:
        return plan(None, Decision.NOT_COMPACTED, f"cleanup.policy={config.cleanup_policy_text}: not a compacted topic")
    if not segments:
        return plan(None, Decision.NOTHING_TIERED, "nothing tiered")
    regions = regions_of(segments, checkpoint, config, now_ms, first_unstable_offset)
    natural = decide(regions, config)
    decision = decide(regions, config, force=force)
    reason = explain.reason(regions, config, natural)
    if decision is Decision.FORCED:
        reason = f"forced (without --force: {reason})"
    elif force:
        reason += "; --force cannot help: nothing lies below the first uncleanable offset"
    if not decision.eligible:
        return plan(regions, decision, reason)
    below = [s for s in segments if s.start_offset < regions.first_uncleanable_offset]
    groups = group_segments_by_size(
        below,
        config.segment_bytes,
        config.segment_index_bytes,
        regions.first_uncleanable_offset,
        estimated_index_sizes(config.index_interval_bytes),
    )
    return plan(regions, decision, reason, tuple(groups))
