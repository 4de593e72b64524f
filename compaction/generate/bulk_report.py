"""What a bulk run reports: progress lines while a partition is written, and per-partition and total results."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BulkProgress:
    """A partition's progress so far (also its final state when `done`)."""

    topic: str
    partition: int
    records: int
    records_total: int
    bytes: int
    segments: int
    seconds: float
    done: bool = False

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        pct = 100.0 * self.records / self.records_total if self.records_total else 100.0
        return (
            f"{self.topic}-{self.partition}: {self.records}/{self.records_total} records ({pct:.0f}%), "
            f"{self.bytes / 2**20:.1f} MiB, {self.segments} segments, {self.seconds:.1f} s, "
            f"{self.records_per_s / 1e6:.2f} M records/s, {self.bytes / 2**20 / max(self.seconds, 1e-9):.0f} MiB/s"
        )


def print_progress(p: BulkProgress) -> None:
    """A `progress` callback printing one line to stderr (top level, so worker processes can use it)."""
    print(("done " if p.done else "") + p.line(), file=sys.stderr, flush=True)


@dataclass(frozen=True)
class BulkPartitionResult:
    """What was written for one partition."""

    topic: str
    partition: int
    topic_id: str
    log_end_offset: int
    bytes: int
    segment_bases: tuple[int, ...]
    seconds: float
    updated_keys: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "topic_id": self.topic_id,
            "log_end_offset": self.log_end_offset,
            "bytes": self.bytes,
            "segments": len(self.segment_bases),
            "updated_keys": self.updated_keys,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class BulkSummary:
    """A whole bulk run: per partition results and totals."""

    partitions: tuple[BulkPartitionResult, ...]
    seconds: float

    @property
    def records(self) -> int:
        return sum(p.log_end_offset for p in self.partitions)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)

    @property
    def segments(self) -> int:
        return sum(len(p.segment_bases) for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        return {
            "records": self.records,
            "bytes": self.bytes,
            "segments": self.segments,
            "seconds": round(self.seconds, 3),
            "records_per_s": round(rate),
            "mib_per_s": round(self.bytes / 2**20 / self.seconds, 1) if self.seconds > 0 else 0.0,
            "partitions": [p.to_dict() for p in self.partitions],
        }

    def line(self) -> str:
        d = self.to_dict()
        return (
            f"{len(self.partitions)} partitions, {self.records} records, {self.bytes / 2**20:.1f} MiB in "
            f"{self.segments} segments, {self.seconds:.1f} s ({d['records_per_s'] / 1e6:.2f} M records/s, "
            f"{d['mib_per_s']} MiB/s)"
        )
