"""What a retention run expired (or, in a dry run, would expire): per partition and in total, as JSON and text."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from compaction.retention.plan import Breach, PartitionRetention, RetentionPlan

_MiB = 1024 * 1024


@dataclass(frozen=True)
class PartitionExpiry:
    """A partition's retention as carried out: `version` is the metadata commit that expired it (None: nothing
    committed, in a dry run or because nothing expired)."""

    retention: PartitionRetention
    version: int | None

    def to_dict(self) -> dict[str, Any]:
        r = self.retention
        return {
            "topic": r.topic,
            "partition": r.partition,
            "segments_expired": len(r.expired),
            "bytes_expired": r.expired_bytes,
            "by_retention_ms": sum(s.breach is Breach.TIME for s in r.expired),
            "by_retention_bytes": sum(s.breach is Breach.SIZE for s in r.expired),
            "log_start_offset": r.log_start_offset,
            "retained_bytes": r.retained_bytes,
            "metadata_version": self.version,
            "segment_ids": [s.segment_id for s in r.expired],
        }


@dataclass(frozen=True)
class RetentionReport:
    """One retention run over the `compact,delete` partitions in scope (those with nothing expired included)."""

    now_ms: int
    metadata_version: int  # the table version the run planned from
    dry_run: bool
    partitions: tuple[PartitionExpiry, ...]
    notes: tuple[str, ...] = ()  # partitions held back, and why

    @classmethod
    def of(cls, plan: RetentionPlan, partitions: Iterable[PartitionExpiry], *, dry_run: bool) -> RetentionReport:
        return cls(plan.now_ms, plan.metadata_version, dry_run, tuple(partitions), plan.notes)

    @classmethod
    def planned(cls, plan: RetentionPlan) -> RetentionReport:
        """A dry run's report: what `plan` would expire."""
        return cls.of(plan, [PartitionExpiry(p, None) for p in plan.partitions], dry_run=True)

    @property
    def segments_expired(self) -> int:
        return sum(len(p.retention.expired) for p in self.partitions)

    @property
    def bytes_expired(self) -> int:
        return sum(p.retention.expired_bytes for p in self.partitions)

    @property
    def noteworthy(self) -> bool:
        """Whether a run's report shows it: something expired (or would), or a partition was held back."""
        return bool(self.segments_expired or self.notes)

    def summary(self) -> str:
        """A line for people, then one per partition that expired something."""
        verb = "would expire" if self.dry_run else "expired"
        expiring = [p for p in self.partitions if p.retention.expired]
        lines = [f"retention at metadata version {self.metadata_version}: {verb} {self.segments_expired} segments "
                 f"({self.bytes_expired / _MiB:.1f} MiB) in {len(expiring)} of {len(self.partitions)} compact,delete "
                 "partitions"]
        for p in expiring:
            r = p.retention
            why = ", ".join(f"{n} by {b.value}" for b in Breach if (n := sum(s.breach is b for s in r.expired)))
            lines.append(f"  {r.topic}-{r.partition}: {len(r.expired)} segments ({why}); log start offset now "
                         f"{r.log_start_offset}")
        if expiring and not self.dry_run:
            lines.append("their objects go with `kcompact gc` after each topic's file.delete.delay.ms")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "now_ms": self.now_ms,
            "metadata_version": self.metadata_version,
            "dry_run": self.dry_run,
            "segments_expired": self.segments_expired,
            "bytes_expired": self.bytes_expired,
            "partitions": [p.to_dict() for p in self.partitions],
            "notes": list(self.notes),
        }


__all__ = ["PartitionExpiry", "RetentionReport"]
