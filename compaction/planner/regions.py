"""Where a partition is clean, dirty and uncleanable, and whether to clean it now (KIP-354; docs/cleaner-rules.md).

This is Kafka's `LogCleanerManager.cleanableOffsets` / `calculateCleanableBytes` / `maxCompactionDelay`
and the eligibility test of `grabFilthiestCompactedLog`, over the live segments of the remote tier:

- **first dirty offset**: the cleaner checkpoint, reset to the log start offset if it is below it or
  above the log end offset (`checkpoint_reset`, Kafka's `forceUpdateCheckpoint`); the log start if the
  partition was never cleaned.
- **first uncleanable offset**: the min of the log end offset (the tier never holds the active segment
  and only data below the LSO is tiered), the `first_unstable_offset` if one is given (a transaction
  with data in the tier and no marker yet) and, if min.compaction.lag.ms > 0, the base of the first dirty
  segment whose largest timestamp is > now - min.compaction.lag.ms; never below the first dirty offset;
  then rounded down to the base of the segment holding it.
- **bytes**: clean = segments starting below the first dirty offset; cleanable (dirty) = segments from
  the one holding min(first dirty, first uncleanable) up to the first uncleanable offset; uncleanable =
  segments from the first uncleanable offset on. As in Kafka, a checkpoint in the middle of a segment
  counts that segment as clean *and* dirty; kcompact's own checkpoints are always
  segment-aligned, so only an imported Kafka checkpoint can do this.
- **dirty ratio** = cleanable / (clean + cleanable); **max compaction delay** (KIP-354) from the
  earliest positive `first_batch_max_timestamp_ms` of the dirty segments: now - max.compaction.lag.ms -
  earliest when positive, else 0. A positive delay makes the partition *must-clean*.
- **decision** (`decide`): eligible when (must-clean and cleanable bytes > 0) or dirty ratio >
  min.cleanable.dirty.ratio (strictly), or, with `force`, whenever cleanable bytes > 0.

Pure: `now_ms` is an argument; nothing here reads a clock, a file or the environment.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from compaction.config import TopicConfig
from compaction.metadata.model import SegmentMetadata


class UncleanableBound(StrEnum):
    """What set the first uncleanable offset."""

    LOG_END = "log end"
    FIRST_UNSTABLE_OFFSET = "first unstable offset"
    MIN_COMPACTION_LAG = "min.compaction.lag.ms"


class Decision(StrEnum):
    """The planner's verdict for one partition; the first three are eligible."""

    MUST_CLEAN = "must_clean"
    DIRTY_RATIO = "dirty_ratio"
    FORCED = "forced"
    BELOW_RATIO = "below_ratio"
    NOTHING_CLEANABLE = "nothing_cleanable"
    NOTHING_TIERED = "nothing_tiered"
    NOT_COMPACTED = "not_compacted"

    @property
    def eligible(self) -> bool:
        return self in (Decision.MUST_CLEAN, Decision.DIRTY_RATIO, Decision.FORCED)


@dataclass(frozen=True)
class Regions:
    """Kafka's `OffsetsToClean` plus `LogToClean` for one partition of the tier (see the module docstring).

    `first_uncleanable_dirty_offset` is the raw bound (Kafka's `OffsetsToClean.firstUncleanableDirtyOffset`),
    `first_uncleanable_offset` the same rounded down to a segment base (what the cleaner works up to).
    `next_cleanable_at_ms` is when the segment holding back the dirty data passes min.compaction.lag.ms,
    if that is what bounds it.
    """

    log_start_offset: int
    log_end_offset: int
    checkpoint: int | None
    first_dirty_offset: int
    checkpoint_reset: bool
    first_uncleanable_dirty_offset: int
    first_uncleanable_offset: int
    uncleanable_bound: UncleanableBound
    clean_bytes: int
    cleanable_bytes: int
    uncleanable_bytes: int
    dirty_segment_count: int
    cleanable_segment_count: int
    earliest_dirty_batch_ms: int | None
    max_compaction_delay_ms: int
    next_cleanable_at_ms: int | None = None

    @property
    def total_bytes(self) -> int:
        """clean + cleanable bytes: the denominator of the dirty ratio (Kafka's `totalBytes`)."""
        return self.clean_bytes + self.cleanable_bytes

    @property
    def dirty_ratio(self) -> float:
        """cleanable / (clean + cleanable); 0 when both are 0 (Kafka skips such logs)."""
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def must_clean(self) -> bool:
        """KIP-354's `needCompactionNow`: a dirty batch is older than max.compaction.lag.ms."""
        return self.max_compaction_delay_ms > 0


def _floor(segments: Sequence[SegmentMetadata], offset: int) -> int:
    """Index of the segment holding `offset` (the last one starting at or below it), 0 below the first."""
    return max(bisect.bisect_right([s.start_offset for s in segments], offset) - 1, 0)


def _between(segments: Sequence[SegmentMetadata], start: int, end: int) -> Sequence[SegmentMetadata]:
    """Kafka's `logSegments(from, to)`: from the segment holding `start`, those starting below `end`."""
    if start >= end:
        return ()
    return [s for s in segments[_floor(segments, start) :] if s.start_offset < end]


def _dirty(segments: Sequence[SegmentMetadata], first_dirty: int, log_end: int) -> Sequence[SegmentMetadata]:
    """Kafka's `nonActiveLogSegmentsFrom(first_dirty)`; the tier's "active segment" starts at log end."""
    return _between(segments, first_dirty, log_end)


def first_dirty_offset(checkpoint: int | None, log_start: int, log_end: int) -> tuple[int, bool]:
    """The first dirty offset and whether the checkpoint had to be reset (below log start or above end)."""
    if checkpoint is None:
        return log_start, False
    if checkpoint < log_start or checkpoint > log_end:
        return log_start, True
    return checkpoint, False


def cleanable_offsets(
    segments: Sequence[SegmentMetadata],
    first_dirty: int,
    config: TopicConfig,
    now_ms: int,
    first_unstable_offset: int | None = None,
) -> tuple[int, UncleanableBound, int | None]:
    """The raw first uncleanable offset (>= first_dirty), what set it, and when min lag releases it.

    `segments` are the live segments, ordered and non-empty.
    """
    log_end = segments[-1].end_offset + 1
    bounds: list[tuple[int, int, UncleanableBound]] = [(log_end, 2, UncleanableBound.LOG_END)]
    if first_unstable_offset is not None:
        bounds.append((first_unstable_offset, 0, UncleanableBound.FIRST_UNSTABLE_OFFSET))
    released_at = None
    min_lag = max(config.min_compaction_lag_ms, 0)
    if min_lag > 0:
        young = next(
            (s for s in _dirty(segments, first_dirty, log_end) if s.largest_timestamp_ms > now_ms - min_lag), None
        )
        if young is not None:
            bounds.append((young.start_offset, 1, UncleanableBound.MIN_COMPACTION_LAG))
            released_at = young.largest_timestamp_ms + min_lag
    offset, _, bound = min(bounds)
    return max(first_dirty, offset), bound, released_at if bound is UncleanableBound.MIN_COMPACTION_LAG else None


def calculate_cleanable_bytes(
    segments: Sequence[SegmentMetadata], first_dirty: int, uncleanable: int
) -> tuple[int, int]:
    """Kafka's `calculateCleanableBytes`: (uncleanable rounded down to a segment base, cleanable bytes)."""
    log_end = segments[-1].end_offset + 1
    first_uncleanable = segments[_floor(segments, uncleanable)].start_offset if uncleanable < log_end else log_end
    cleanable = _between(segments, min(first_dirty, first_uncleanable), first_uncleanable)
    return first_uncleanable, sum(s.segment_size_bytes for s in cleanable)


def clean_bytes(segments: Sequence[SegmentMetadata], first_dirty: int) -> int:
    """Kafka's `LogToClean.cleanBytes`: the bytes of segments starting below the first dirty offset."""
    return sum(s.segment_size_bytes for s in segments if s.start_offset < first_dirty)


def max_compaction_delay(
    segments: Sequence[SegmentMetadata], first_dirty: int, max_compaction_lag_ms: int, now_ms: int
) -> tuple[int, int | None]:
    """KIP-354's delay in ms (0 if none) and the earliest positive first-batch timestamp of the dirty segments."""
    log_end = segments[-1].end_offset + 1
    stamps = [
        ts
        for s in _dirty(segments, first_dirty, log_end)
        if (ts := s.first_batch_max_timestamp_ms) is not None and ts > 0
    ]
    earliest = min(stamps, default=None)
    clean_until = now_ms - max(max_compaction_lag_ms, 0)
    delay = clean_until - earliest if earliest is not None and earliest < clean_until else 0
    return delay, earliest


def regions_of(
    segments: Sequence[SegmentMetadata],
    checkpoint: int | None,
    config: TopicConfig,
    now_ms: int,
    first_unstable_offset: int | None = None,
) -> Regions:
    """The regions of a partition whose live segments are `segments` (ordered by start offset, non-empty)."""
    log_start, log_end = segments[0].start_offset, segments[-1].end_offset + 1
    first_dirty, reset = first_dirty_offset(checkpoint, log_start, log_end)
    uncleanable, bound, released_at = cleanable_offsets(segments, first_dirty, config, now_ms, first_unstable_offset)
    first_uncleanable, cleanable = calculate_cleanable_bytes(segments, first_dirty, uncleanable)
    delay, earliest = max_compaction_delay(segments, first_dirty, config.max_compaction_lag_ms, now_ms)
    return Regions(
        log_start_offset=log_start,
        log_end_offset=log_end,
        checkpoint=checkpoint,
        first_dirty_offset=first_dirty,
        checkpoint_reset=reset,
        first_uncleanable_dirty_offset=uncleanable,
        first_uncleanable_offset=first_uncleanable,
        uncleanable_bound=bound,
        clean_bytes=clean_bytes(segments, first_dirty),
        cleanable_bytes=cleanable,
        uncleanable_bytes=sum(s.segment_size_bytes for s in segments if s.start_offset >= first_uncleanable),
        dirty_segment_count=len(_dirty(segments, first_dirty, log_end)),
        cleanable_segment_count=len(_between(segments, min(first_dirty, first_uncleanable), first_uncleanable)),
        earliest_dirty_batch_ms=earliest,
        max_compaction_delay_ms=delay,
        next_cleanable_at_ms=released_at,
    )


def decide(regions: Regions, config: TopicConfig, *, force: bool = False) -> Decision:
    """Kafka's eligibility test of `grabFilthiestCompactedLog`, plus kcompact's `--force`.

    `--force` recompacts everything below the first uncleanable offset even when nothing is dirty: Kafka
    only drops an expired tombstone or marker when some later round happens to run, an operator may
    want that round now.
    """
    if force and regions.clean_bytes + regions.cleanable_bytes > 0:
        return Decision.FORCED
    if regions.cleanable_bytes <= 0:
        return Decision.NOTHING_CLEANABLE
    if regions.must_clean:
        return Decision.MUST_CLEAN
    if regions.dirty_ratio > config.min_cleanable_dirty_ratio:
        return Decision.DIRTY_RATIO
    return Decision.BELOW_RATIO
