"""Which tiered segments of a `compact,delete` topic have passed retention.ms or retention.bytes. Pure.

kcompact holds the whole log in the store, so for a topic it compacts with `cleanup.policy=compact,delete` it also
applies the topic's retention, as Kafka's `UnifiedLog.deleteOldSegments` does after each cleaning of such a log (Kafka
cannot tier a compact,delete topic, so its local-log rules are the ones its users know). Two passes, each from the
oldest live segment up and each stopping at the first segment it keeps, so the log start only moves up and the log
keeps no hole:

1. size (`deleteRetentionSizeBreachedSegments`): with `diff` = the partition's bytes - retention.bytes, a segment
   goes while `diff - size >= 0` (the partition stays at or above retention.bytes without it);
2. time (`deleteRetentionMsBreachedSegments`): a segment goes while `now - largestTimestamp > retention.ms`.

A negative retention.ms / retention.bytes turns its pass off (Kafka's -1). Three rules are kcompact's own:

- the partition's last live segment never expires: it marks where the tier ends and the WAL's part of the log
  begins (`compaction.wal.view.tier_end`); Kafka, when every segment has expired, rolls an empty active segment
  first, and kcompact's last one goes once a later segment is tiered;
- retention.bytes counts the tiered segments only; records still only in combined WAL objects (Kafka's active
  segment) are not counted, so kcompact may keep more than Kafka would, never less;
- a segment whose batches carry no timestamp (largest timestamp -1) is aged by the time its row went live
  (`event_timestamp_ms`): Kafka falls back to the file's mtime, which the store does not keep. (A compaction output
  that kept no batch carries its inputs' largest timestamp instead: `compaction.run.stage`.)

A plain `delete` topic is never expired here: its retention belongs to whoever tiers it (the broker's own
`RemoteLogManager`, through kcompact's plugins). Nor is a partition a broker tiers (a row written by `broker-<id>`):
a stock broker keeps advertising its old log start until its next leader election, and its consumers that reset to
earliest loop on OFFSET_OUT_OF_RANGE meanwhile (tried on Kafka 4.2.1); it is held back with a note saying to set
retention on the broker's topic instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from compaction.config import KcompactConfig, TopicConfig
from compaction.metadata import MetadataSnapshot, PartitionSnapshot, SegmentMetadata, SegmentState
from compaction.metadata.model import OfPartition


class Breach(StrEnum):
    """Why a segment expires: the pass that removed it."""

    TIME = "retention.ms"
    SIZE = "retention.bytes"


@dataclass(frozen=True)
class ExpiredSegment:
    """A live segment retention removes, and the pass that removed it."""

    segment_id: str
    start_offset: int
    end_offset: int
    size_bytes: int
    max_timestamp_ms: int
    breach: Breach


@dataclass(frozen=True)
class PartitionRetention(OfPartition):
    """One partition's expired prefix (oldest first) and the log start offset it leaves."""

    topic: str
    partition: int
    expired: tuple[ExpiredSegment, ...]
    log_start_offset: int  # the first offset a reader can still get (the first remaining segment's start)
    retained_bytes: int  # the tiered segments left

    @property
    def expired_bytes(self) -> int:
        return sum(s.size_bytes for s in self.expired)


def expired_prefix(segments: Sequence[SegmentMetadata], config: TopicConfig, now_ms: int
                   ) -> tuple[ExpiredSegment, ...]:
    """The live `segments` (ordered by start offset) that retention removes at `now_ms`, oldest first."""
    if not config.has_retention:
        return ()
    candidates = list(segments[:-1])  # the last one stays
    out: list[ExpiredSegment] = []
    if config.retention_bytes >= 0:
        diff = sum(s.segment_size_bytes for s in segments) - config.retention_bytes
        while candidates and diff - candidates[0].segment_size_bytes >= 0:
            diff -= candidates[0].segment_size_bytes
            out.append(_expired(candidates.pop(0), Breach.SIZE))
    if config.retention_ms >= 0:
        while candidates and _older(candidates[0], now_ms, config.retention_ms):
            out.append(_expired(candidates.pop(0), Breach.TIME))
    return tuple(out)


def _older(s: SegmentMetadata, now_ms: int, retention_ms: int) -> bool:
    return now_ms - s.largest_timestamp_ms > retention_ms


def _expired(s: SegmentMetadata, breach: Breach) -> ExpiredSegment:
    return ExpiredSegment(s.segment_id, s.start_offset, s.end_offset, s.segment_size_bytes, s.max_timestamp_ms, breach)


def plan_partition_retention(p: PartitionSnapshot, config: TopicConfig, now_ms: int) -> PartitionRetention:
    live = p.live_segments
    expired = expired_prefix(live, config, now_ms)
    rest = live[len(expired):]
    return PartitionRetention(p.topic, p.partition, expired, rest[0].start_offset if rest else 0,
                              sum(s.segment_size_bytes for s in rest))


def after_expiry(snapshot: MetadataSnapshot, plan: RetentionPlan) -> MetadataSnapshot:
    """`snapshot` as it will be once `plan` is carried out: each expired row in DELETE_SEGMENT_STARTED (pure; what a
    compaction planned before the expiry commits plans on)."""
    gone = {s.segment_id for p in plan.expiring for s in p.expired}
    if not gone:
        return snapshot
    partitions = {tp: replace(p, segments=tuple(replace(s, state=SegmentState.DELETE_SEGMENT_STARTED)
                                                if s.segment_id in gone else s for s in p.segments))
                  for tp, p in snapshot.partitions.items()}
    return replace(snapshot, partitions=partitions)


@dataclass(frozen=True)
class RetentionPlan:
    """Every `compact,delete` partition in scope at one metadata version, and what expires in each; `notes` names
    the partitions held back (a broker tiers them)."""

    now_ms: int
    metadata_version: int
    partitions: tuple[PartitionRetention, ...]
    notes: tuple[str, ...] = ()

    @property
    def expiring(self) -> tuple[PartitionRetention, ...]:
        return tuple(p for p in self.partitions if p.expired)

    @property
    def in_scope(self) -> bool:
        """Whether any compact,delete partition is in scope, held back or not: a run then reports its retention."""
        return bool(self.partitions or self.notes)


def plan_retention(snapshot: MetadataSnapshot, config: KcompactConfig, now_ms: int, *,
                   topics: Iterable[str] | None = None, partition: int | None = None) -> RetentionPlan:
    """The retention of every partition of `snapshot` whose topic is `compact,delete` in `config` (and in `topics`,
    `partition`, if given)."""
    wanted = None if topics is None else frozenset(topics)
    out, notes = [], []
    for tp, p in sorted(snapshot.partitions.items()):
        config_of = config.for_topic(tp.topic)
        if not config_of.has_retention or (wanted is not None and tp.topic not in wanted):
            continue
        if partition is not None and tp.partition != partition:
            continue
        broker = next((s.writer for s in p.segments if s.by_broker), None)
        if broker is not None:
            notes.append(f"{tp.topic}-{tp.partition} not expired: {broker} tiers it, and a broker's log start does "
                         "not follow kcompact's expiry (its consumers would loop on OFFSET_OUT_OF_RANGE until it "
                         "restarts); set retention.ms / retention.bytes on the broker's topic instead")
            continue
        out.append(plan_partition_retention(p, config_of, now_ms))
    return RetentionPlan(now_ms, snapshot.version, tuple(out), tuple(notes))


__all__ = ["Breach", "ExpiredSegment", "PartitionRetention", "RetentionPlan", "after_expiry", "expired_prefix",
           "plan_partition_retention", "plan_retention"]
