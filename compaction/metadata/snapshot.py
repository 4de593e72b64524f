"""Read-side values: what one table version says about a partition, and about every partition.

A snapshot is a frozen value read at one Delta table version; planning code takes it as input and
records `version`, `commit_seq` and `fencing_epoch` in its change set, so the commit can check that
nothing moved in between. Building a snapshot from rows is pure (`build_snapshot`); `table.py` does the
reading.

"Live" means what a reader may serve: rows in COPY_SEGMENT_FINISHED whose cleaner-offset vector passes
`valid_cleaner_offsets` (zombie rows are never live), ordered by start offset.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from compaction.errors import CorruptMetadataError
from compaction.metadata.lineage import CleanerOffsetLineage, valid_cleaner_offsets
from compaction.metadata.model import OfPartition, PartitionState, SegmentMetadata, SegmentState, TopicPartition


@dataclass(frozen=True)
class PartitionSnapshot(OfPartition):
    """One partition at table version `version`.

    `state` is None if no commit ever touched the partition (then `commit_seq` and `fencing_epoch` are 0).
    `segments` holds every segment row, in any state, ordered by (start_offset, segment_id).
    """

    topic: str
    partition: int
    version: int
    state: PartitionState | None
    segments: tuple[SegmentMetadata, ...] = ()
    _by_id: dict[str, SegmentMetadata] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id = {s.segment_id: s for s in self.segments}
        if len(by_id) != len(self.segments):
            raise CorruptMetadataError(
                f"segment ids repeat in {len(self.segments) - len(by_id)} rows",
                obj=f"metadata v{self.version} {self.topic}-{self.partition}",
            )
        object.__setattr__(self, "_by_id", by_id)

    @property
    def exists(self) -> bool:
        """Whether the table holds any row of the partition at this version (a commit touched it, or a segment)."""
        return self.state is not None or bool(self.segments)

    @property
    def commit_seq(self) -> int:
        return self.state.commit_seq if self.state else 0

    @property
    def fencing_epoch(self) -> int:
        return self.state.fencing_epoch if self.state else 0

    @property
    def topic_id(self) -> str | None:
        return self.state.topic_id if self.state else None

    @cached_property
    def lineage(self) -> CleanerOffsetLineage:
        """The validated cleaner offsets, and the zombie rows they reject."""
        return valid_cleaner_offsets([*self.segments, *([self.state] if self.state else [])])

    @cached_property
    def live_segments(self) -> tuple[SegmentMetadata, ...]:
        """COPY_SEGMENT_FINISHED rows not rejected by the lineage, ordered by start offset."""
        return tuple(
            s
            for s in self.segments
            if s.state is SegmentState.COPY_SEGMENT_FINISHED and s.segment_id not in self.lineage.rejected
        )

    @property
    def zombie_segments(self) -> tuple[SegmentMetadata, ...]:
        """Rows rejected by cleaner-offset validation that still reference objects (for gc to retire)."""
        return tuple(
            s
            for s in self.segments
            if s.segment_id in self.lineage.rejected and s.state is not SegmentState.DELETE_SEGMENT_FINISHED
        )

    def segment(self, segment_id: str) -> SegmentMetadata | None:
        return self._by_id.get(segment_id)


@dataclass(frozen=True)
class MetadataSnapshot:
    """Every partition of the table at version `version`."""

    version: int
    partitions: Mapping[TopicPartition, PartitionSnapshot]

    def partition(self, topic: str, partition: int) -> PartitionSnapshot:
        """The partition's snapshot; an empty one (state None) if the table knows nothing about it."""
        tp = TopicPartition(topic, partition)
        return self.partitions.get(tp) or PartitionSnapshot(topic, partition, self.version, None)

    def live_segments(self, topic: str, partition: int) -> tuple[SegmentMetadata, ...]:
        return self.partition(topic, partition).live_segments


def build_snapshot(
    version: int,
    states: Iterable[PartitionState],
    segments: Iterable[SegmentMetadata],
    where: str = "metadata",
) -> MetadataSnapshot:
    """Group rows by partition into a `MetadataSnapshot`.

    Raises:
        CorruptMetadataError: two partition rows for one partition, or a segment id used twice in one.
    """
    by_tp: dict[TopicPartition, PartitionState] = {}
    for p in states:
        tp = p.tp
        if tp in by_tp:
            raise CorruptMetadataError("two partition rows", obj=f"{where} v{version} {p.topic}-{p.partition}")
        by_tp[tp] = p
    segs: dict[TopicPartition, list[SegmentMetadata]] = defaultdict(list)
    for s in segments:
        segs[s.tp].append(s)
    partitions = {
        tp: PartitionSnapshot(
            tp.topic,
            tp.partition,
            version,
            by_tp.get(tp),
            tuple(sorted(segs.get(tp, ()), key=lambda s: (s.start_offset, s.segment_id))),
        )
        for tp in sorted(by_tp.keys() | segs.keys())
    }
    return MetadataSnapshot(version, partitions)


def referenced_object_keys(snapshot: MetadataSnapshot) -> frozenset[str]:
    """Every store key the snapshot still accounts for: rows in any state but DELETE_SEGMENT_FINISHED.

    A gc job lists the store and treats keys outside this set as orphans (what a fenced or crashed run
    uploaded but never committed). It must take the snapshot *after* listing and only delete orphans older
    than a grace period: a live run uploads its objects before the commit that references them.
    DELETE_SEGMENT_STARTED keys stay referenced; gc retires them through the state machine instead.
    """
    return frozenset(
        o.key
        for p in snapshot.partitions.values()
        for s in p.segments
        if s.state is not SegmentState.DELETE_SEGMENT_FINISHED
        for o in s.object_keys
    )
