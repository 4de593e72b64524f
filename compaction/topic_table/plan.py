"""What a table run reads of each partition, and why: a pure function of the metadata, the table's state and the clock.

A partition is **updated** from the offset the table applied up to its last stable offset (LSO: the tier's
end, or the first offset of a transaction still open there), or **rebuilt** from offset 0 when:

- the table has never applied it (new table, new partition) or `--rebuild` asks for it;
- its log start passed the applied offset: records the table never saw are gone (retention, or a tier reset);
- **a tombstone the table never saw may have been removed**. Compaction removes a tombstone once its delete
  horizon (set by the first cleaning that kept it, plus `delete.retention.ms`) has passed, together with the
  older value the table may still hold. The cleaner never cleans past the LSO, so a tombstone at or above
  the applied offset was first cleaned after the table's previous run (clock T); it can only be gone if a
  compaction at T + `delete.retention.ms` or later rewrote the region above the applied offset. That is
  Kafka's consumer contract (keep up within delete.retention.ms); the table then rebuilds the partition
  instead of keeping a deleted key.

Under the `timestamp` and `header` strategies an earlier record (a tombstone included) can beat a later one,
and the table keeps no tombstones, so an update reads the partition from offset 0 and takes the winners of
the keys that changed (`read_from`); under `offset` the newest record always wins and only the new records
are read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from compaction.config import CompactionStrategy
from compaction.metadata import SegmentMetadata
from compaction.topic_table.target import Applied


class Reason(StrEnum):
    NEW = "not in the table yet"
    REQUESTED = "--rebuild"
    LOG_START = "log start passed the applied offset"
    RETENTION = "log start moved up since the last update (retention.ms / retention.bytes): expired keys go"
    TOMBSTONE_HORIZON = "compacted past the applied offset after delete.retention.ms: a tombstone may be gone"
    UPDATE = "update"


@dataclass(frozen=True)
class PartitionSpan:
    """One partition's work: apply the committed records in [from_offset, to_offset), reading from `read_from`.

    `rebuild`: the partition's rows are replaced by the winners over [0, to_offset) (`from_offset` is 0).
    """

    partition: int
    from_offset: int
    to_offset: int
    read_from: int
    reason: Reason
    segment_bytes: int
    log_start: int = 0  # the first live segment's start offset when planned

    @property
    def rebuild(self) -> bool:
        return self.reason is not Reason.UPDATE

    def to_dict(self) -> dict[str, object]:
        return {"partition": self.partition, "from_offset": self.from_offset, "to_offset": self.to_offset,
                "read_from": self.read_from, "rebuild": self.rebuild, "reason": str(self.reason),
                "segment_bytes": self.segment_bytes}


@dataclass(frozen=True)
class TablePlan:
    """The run's work (partitions with nothing new are left out), and the versions and clock it was built from."""

    topic: str
    metadata_version: int
    table_version: int
    now_ms: int
    spans: tuple[PartitionSpan, ...]
    up_to_date: tuple[int, ...]

    def render_text(self) -> list[str]:
        lines = [f"table of {self.topic}: metadata version {self.metadata_version}, table version "
                 f"{self.table_version}, {len(self.spans)} partitions to apply, {len(self.up_to_date)} up to date"]
        for s in self.spans:
            what = "rebuild" if s.rebuild else "update"
            lines.append(f"  {self.topic}-{s.partition}: {what} [{s.from_offset}, {s.to_offset}) reading from "
                         f"{s.read_from} ({s.segment_bytes} segment bytes; {s.reason})")
        return lines

    def to_dict(self) -> dict[str, object]:
        return {"topic": self.topic, "metadata_version": self.metadata_version, "table_version": self.table_version,
                "now_ms": self.now_ms, "spans": [s.to_dict() for s in self.spans], "up_to_date": list(self.up_to_date)}


@dataclass(frozen=True)
class PartitionSource:
    """What the plan needs of one partition: its live segments, its cleaner offset and its last stable offset."""

    partition: int
    segments: Sequence[SegmentMetadata]
    cleaner_offset: int
    stable_offset: int

    @property
    def log_start(self) -> int:
        return self.segments[0].start_offset if self.segments else 0


def plan_partition(source: PartitionSource, applied: Applied | None, strategy: CompactionStrategy,
                   delete_retention_ms: int, rebuild: bool) -> PartitionSpan | None:
    """The partition's span, or None if the table already holds everything below its LSO."""
    reason = _rebuild_reason(source, applied, delete_retention_ms, rebuild)
    start = 0 if reason is not Reason.UPDATE or applied is None else applied.offset
    if reason is Reason.UPDATE and start >= source.stable_offset:
        return None
    read_from = start if strategy is CompactionStrategy.OFFSET else 0
    size = sum(s.segment_size_bytes for s in source.segments
               if s.end_offset >= read_from and s.start_offset < source.stable_offset)
    return PartitionSpan(source.partition, start, source.stable_offset, read_from, reason, size, source.log_start)


def _rebuild_reason(source: PartitionSource, applied: Applied | None, delete_retention_ms: int,
                    rebuild: bool) -> Reason:
    if rebuild:
        return Reason.REQUESTED
    if applied is None:
        return Reason.NEW
    if source.segments and source.segments[0].start_offset > applied.offset:
        return Reason.LOG_START
    if applied.log_start is not None and source.log_start > applied.log_start:
        return Reason.RETENTION
    horizon = applied.updated_ms + delete_retention_ms
    # A live segment of the cleaned region written at or after the horizon: a compaction rewrote it then.
    if any(s.start_offset < source.cleaner_offset and s.end_offset >= applied.offset
           and s.event_timestamp_ms >= horizon for s in source.segments):
        return Reason.TOMBSTONE_HORIZON
    return Reason.UPDATE


def plan_table(topic: str, metadata_version: int, table_version: int, now_ms: int,
               sources: Sequence[PartitionSource], applied: Mapping[int, Applied], strategy: CompactionStrategy,
               delete_retention_ms: int, *, rebuild: bool = False) -> TablePlan:
    """The run's plan: a span per partition with something to apply. Pure."""
    spans: list[PartitionSpan] = []
    up_to_date: list[int] = []
    for source in sorted(sources, key=lambda s: s.partition):
        span = plan_partition(source, applied.get(source.partition), strategy, delete_retention_ms, rebuild)
        if span is None:
            up_to_date.append(source.partition)
        else:
            spans.append(span)
    return TablePlan(topic, metadata_version, table_version, now_ms, tuple(spans), tuple(up_to_date))


__all__ = ["PartitionSource", "PartitionSpan", "Reason", "TablePlan", "plan_partition", "plan_table"]
