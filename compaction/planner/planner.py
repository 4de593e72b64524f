"""The run's plan: every selected partition planned at one `now_ms` from one metadata table version.

Order is the order of work: eligible partitions first, must-clean ones (KIP-354) before the rest, then
filthiest (highest dirty ratio) first; ties go by topic and partition, so the plan is deterministic.
Kafka's `grabFilthiestCompactedLog` ranks by ratio alone and takes one log per pass; KIP-354's text
ranks must-clean logs first, which is what a batch job that may stop early needs.

The plan records the table version it was read from; a commit built from it must find the same
version's partition state (`commit_seq`) or refuse. The aggregates mirror Kafka's cleaner metrics:
max-compaction-delay-secs, max-dirty-percent, and the delayed / cleanable partition counts of
`PreCleanStats`. Dry run, `kcompact plan` and the compaction job all consume this one value. Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from compaction.config import KcompactConfig
from compaction.errors import ConfigError
from compaction.metadata.model import TopicPartition
from compaction.metadata.snapshot import MetadataSnapshot
from compaction.planner.explain import byte_size, duration, timestamp
from compaction.planner.partition import PartitionPlan, plan_partition


@dataclass(frozen=True)
class CompactionPlan:
    """Per-partition plans in work order, with the table version and clock they were computed at."""

    metadata_version: int
    now_ms: int
    forced: bool
    partitions: tuple[PartitionPlan, ...]
    notes: tuple[str, ...] = ()

    @property
    def eligible(self) -> tuple[PartitionPlan, ...]:
        """The partitions to clean, in order."""
        return tuple(p for p in self.partitions if p.eligible)

    @property
    def max_compaction_delay_ms(self) -> int:
        """KIP-354's max-compaction-delay over every compacted partition (0 if none is late)."""
        return max((p.max_compaction_delay_ms for p in self.partitions), default=0)

    @property
    def delayed_partitions(self) -> int:
        """Partitions with a positive max compaction delay (Kafka's `delayedPartitions`)."""
        return sum(1 for p in self.partitions if p.max_compaction_delay_ms > 0)

    @property
    def max_dirty_percent(self) -> int:
        """Kafka's max-dirty-percent: 100 x the highest dirty ratio among partitions with bytes to weigh."""
        ratios = [p.dirty_ratio for p in self.partitions if p.regions and p.regions.total_bytes > 0]
        return int(100 * max(ratios, default=0.0))

    @property
    def cleanable_bytes(self) -> int:
        """Cleanable bytes of the eligible partitions: what this run will read as dirty."""
        return sum(p.regions.cleanable_bytes for p in self.eligible if p.regions)

    @property
    def uncleanable_bytes(self) -> int:
        """Tiered bytes at or above some partition's first uncleanable offset."""
        return sum(p.regions.uncleanable_bytes for p in self.partitions if p.regions)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (for `kcompact plan --json`)."""
        return {
            "metadata_version": self.metadata_version,
            "now_ms": self.now_ms,
            "forced": self.forced,
            "summary": {
                "partitions": len(self.partitions),
                "cleanable_partitions": len(self.eligible),
                "delayed_partitions": self.delayed_partitions,
                "max_compaction_delay_ms": self.max_compaction_delay_ms,
                "max_compaction_delay_secs": self.max_compaction_delay_ms // 1000,
                "max_dirty_percent": self.max_dirty_percent,
                "cleanable_bytes": self.cleanable_bytes,
                "uncleanable_bytes": self.uncleanable_bytes,
            },
            "notes": list(self.notes),
            "partitions": [p.to_dict() for p in self.partitions],
        }

    def render_text(self) -> str:
        """The plan for people: a summary, then one block per partition, in work order."""
        lines = [
            f"kcompact plan at metadata table version {self.metadata_version}, now {timestamp(self.now_ms)} "
            f"({self.now_ms}){' (forced)' if self.forced else ''}",
            f"{len(self.eligible)} of {len(self.partitions)} partitions to clean "
            f"({byte_size(self.cleanable_bytes)} dirty); {self.delayed_partitions} past max.compaction.lag.ms, "
            f"max compaction delay {duration(self.max_compaction_delay_ms)}; max dirty {self.max_dirty_percent}%; "
            f"{byte_size(self.uncleanable_bytes)} uncleanable",
            *(f"note: {n}" for n in self.notes),
        ]
        for p in self.partitions:
            lines += ["", *_partition_lines(p)]
        return "\n".join(lines) + "\n"


def _partition_lines(p: PartitionPlan) -> list[str]:
    verdict = ("MUST CLEAN" if p.must_clean else "CLEAN") if p.eligible else "SKIP"
    lines = [f"{p.topic}-{p.partition}  {verdict}  ({p.decision.value}, {p.segment_count} segments)"]
    r = p.regions
    if r is not None:
        lines += [
            f"  offsets  clean [{r.log_start_offset}, {r.first_dirty_offset})  "
            f"dirty [{r.first_dirty_offset}, {r.first_uncleanable_offset})  "
            f"uncleanable [{r.first_uncleanable_offset}, {r.log_end_offset})  bound: {r.uncleanable_bound.value}",
            f"  bytes    clean {byte_size(r.clean_bytes)}  dirty {byte_size(r.cleanable_bytes)}  "
            f"uncleanable {byte_size(r.uncleanable_bytes)}  ratio {r.dirty_ratio:.2f} "
            f"(min.cleanable.dirty.ratio {p.config.min_cleanable_dirty_ratio:.2f})",
            f"  delay    {duration(r.max_compaction_delay_ms)}"
            + (f" (oldest dirty batch {timestamp(r.earliest_dirty_batch_ms)})" if r.earliest_dirty_batch_ms else ""),
        ]
    if p.groups:
        lines.append(f"  rewrite  {sum(len(g) for g in p.groups)} segments into {len(p.groups)}")
    lines.append(f"  why      {p.reason}")
    return lines


def _rank(p: PartitionPlan) -> tuple[bool, bool, float, str, int]:
    return (not p.eligible, not p.must_clean, -p.dirty_ratio, p.topic, p.partition)


def build_plan(
    snapshot: MetadataSnapshot,
    config: KcompactConfig,
    now_ms: int,
    *,
    topics: Collection[str] | None = None,
    partition: int | None = None,
    force: bool = False,
    first_unstable_offsets: Mapping[TopicPartition, int] | None = None,
) -> CompactionPlan:
    """Plan every selected partition of `snapshot` at `now_ms`. Pure and deterministic.

    Args:
        snapshot: the metadata table at one version.
        config: topic configs; a topic without its own uses the defaults.
        now_ms: the run's clock (epoch ms), read once by the caller; every time rule uses it.
        topics: only these topics (all if None). A named topic the table does not know gives a note.
        partition: only this partition number; with `topics`, a partition the table does not know is
            planned as "nothing tiered".
        force: every partition with cleanable bytes is eligible (reason "forced (...)").
        first_unstable_offsets: per partition, the first offset of a transaction tiered without its
            marker; nothing at or above it is cleaned.

    Raises:
        ConfigError: `partition` is negative.
    """
    if partition is not None and partition < 0:
        raise ConfigError(f"--partition {partition}: a partition number is >= 0")
    wanted = None if topics is None else ({topics} if isinstance(topics, str) else set(topics))
    selected = [
        tp
        for tp in snapshot.partitions
        if (wanted is None or tp.topic in wanted) and (partition is None or tp.partition == partition)
    ]
    notes: list[str] = []
    for topic in sorted(wanted or ()):
        if partition is not None and TopicPartition(topic, partition) not in snapshot.partitions:
            selected.append(TopicPartition(topic, partition))
        elif partition is None and not any(tp.topic == topic for tp in snapshot.partitions):
            notes.append(f"topic {topic}: nothing tiered (not in metadata table version {snapshot.version})")
    unstable = first_unstable_offsets or {}
    plans = [
        plan_partition(
            snapshot.partition(tp.topic, tp.partition),
            config.for_topic(tp.topic),
            now_ms,
            first_unstable_offset=unstable.get(tp),
            force=force,
        )
        for tp in selected
    ]
    return CompactionPlan(snapshot.version, now_ms, force, tuple(sorted(plans, key=_rank)), tuple(notes))
