"""What a gc run did (or, in a dry run, would do): counts per partition and in total, as JSON and as text."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from compaction.counters import Counters

_MiB = 1024 * 1024
_SHOWN_UNKNOWN = 5


@dataclass(frozen=True)
class GcCounts(Counters):
    """gc's counters. `objects_deleted` and `bytes_freed` cover segment objects and orphans alike,
    counting only objects the listing saw (a rerun after a crash does not count them twice)."""

    segments_finished: int = 0
    segments_retired: int = 0
    objects_deleted: int = 0
    bytes_freed: int = 0
    orphans_deleted: int = 0
    segments_waiting: int = 0
    orphans_waiting: int = 0
    shared_keys_kept: int = 0

    @property
    def is_empty(self) -> bool:
        return self == GcCounts()

    def describe(self, dry_run: bool) -> str:
        """One line, e.g. `2 segments finished, 14 objects deleted (1.2 MiB), 3 orphans, 1 waiting`."""
        verb = "would be " if dry_run else ""
        parts = [
            f"{self.segments_finished} segments {verb}finished",
            f"{self.objects_deleted} objects {verb}deleted ({self.bytes_freed / _MiB:.1f} MiB)",
            f"{self.orphans_deleted} of them orphans",
        ]
        if self.segments_retired:
            parts.append(f"{self.segments_retired} rows {verb}retired")
        if self.segments_waiting or self.orphans_waiting:
            parts.append(f"{self.segments_waiting} segments and {self.orphans_waiting} orphans within the grace")
        if self.shared_keys_kept:
            parts.append(f"{self.shared_keys_kept} keys kept: still referenced by another row")
        return ", ".join(parts)


@dataclass(frozen=True)
class PartitionGcReport:
    topic: str
    partition: int
    counts: GcCounts


@dataclass(frozen=True)
class GcReport:
    """One gc run: per partition (only those with something to report), totals, and unknown objects."""

    now_ms: int
    metadata_version: int
    dry_run: bool
    partitions: tuple[PartitionGcReport, ...]
    unknown_objects: tuple[str, ...]
    wal: dict[str, object] | None = None  # the combined WAL objects' part (`compaction.gc.wal`), if any
    wal_summary: str | None = None
    metadata_log: str | None = None  # the metadata table's log upkeep (`metadata.upkeep.expire_log`), in summary only

    @property
    def totals(self) -> GcCounts:
        return sum((p.counts for p in self.partitions), GcCounts())

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict: `partitions` list only partitions with something done or pending."""
        return {
            "now_ms": self.now_ms,
            "metadata_version": self.metadata_version,
            "dry_run": self.dry_run,
            "totals": asdict(self.totals),
            "partitions": [
                {"topic": p.topic, "partition": p.partition, **asdict(p.counts)}
                for p in self.partitions
                if not p.counts.is_empty
            ],
            "unknown_objects": list(self.unknown_objects),
            "wal": self.wal,
        }

    def summary(self) -> list[str]:
        """Human-readable lines: one per partition with something to report, then the totals."""
        lines = [
            f"{p.topic}-{p.partition}: {p.counts.describe(self.dry_run)}"
            for p in self.partitions
            if not p.counts.is_empty
        ]
        prefix = "dry run, nothing changed: " if self.dry_run else ""
        lines.append(f"{prefix}total: {self.totals.describe(self.dry_run)} (metadata v{self.metadata_version})")
        if self.wal_summary is not None:
            lines.append(prefix + self.wal_summary)
        if self.metadata_log is not None:
            lines.append(self.metadata_log)
        if self.unknown_objects:
            n = len(self.unknown_objects)
            shown = ", ".join(self.unknown_objects[:_SHOWN_UNKNOWN])
            more = f" and {n - _SHOWN_UNKNOWN} more" if n > _SHOWN_UNKNOWN else ""
            lines.append(f"{n} unknown objects left alone (not segment keys): {shown}{more}")
        return lines
