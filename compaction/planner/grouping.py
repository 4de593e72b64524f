"""Which adjacent segments are rewritten into one output segment: Kafka's `Cleaner.groupSegmentsBySize`.

Greedy and in offset order: a group starts with the next segment and takes the one after it while all of
these hold (every size is a *pre-clean* size, so an output segment can never outgrow the limits):

- the group's log bytes plus the candidate's stay <= `max_size` (segment.bytes);
- the group's offset-index bytes plus the candidate's stay <= `max_index_size` (segment.index.bytes);
- the same for time-index bytes;
- the candidate is empty, or its estimated last offset minus the group's base offset is <= Int.MaxValue,
  so every relative offset of the output fits its int32 index fields. The estimate is the next
  segment's base - 1, or `first_uncleanable_offset` - 1 for the last candidate (Kafka's
  `lastOffsetForFirstSegment`); empty segments skip the check so that they merge away.

The metadata table does not record index sizes. `estimated_index_sizes` bounds them from the segment size
and index.interval.bytes, the way `LogSegment.append` adds entries; pass any other callable
(e.g. sizes read from the store) as `index_sizes`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from compaction.metadata.model import SegmentMetadata

INT_MAX = 2**31 - 1
OFFSET_INDEX_ENTRY_BYTES = 8
TIME_INDEX_ENTRY_BYTES = 12
MIN_BATCH_BYTES = 61
"""RECORD_BATCH_OVERHEAD: no append is smaller than one batch header."""


@dataclass(frozen=True)
class IndexSizes:
    """The `.index` and `.timeindex` sizes of one segment, in bytes."""

    offset_index_bytes: int
    time_index_bytes: int


IndexSizer = Callable[[SegmentMetadata], IndexSizes]


def estimated_index_sizes(index_interval_bytes: int) -> IndexSizer:
    """An upper bound on a segment's index sizes from its log size and index.interval.bytes.

    `LogSegment.append` adds an offset-index entry only after more than index.interval.bytes were
    appended since the last one, and every append is at least one 61-byte batch, so a segment of S bytes
    has at most S // max(interval + 1, 61) entries. The time index gets at most one entry per offset-index
    entry plus the final one written when the segment is rolled.
    """
    step = max(index_interval_bytes + 1, MIN_BATCH_BYTES)

    def sizes(segment: SegmentMetadata) -> IndexSizes:
        entries = segment.segment_size_bytes // step
        time_entries = entries + 1 if segment.segment_size_bytes > 0 else 0
        return IndexSizes(entries * OFFSET_INDEX_ENTRY_BYTES, time_entries * TIME_INDEX_ENTRY_BYTES)

    return sizes


def group_segments_by_size(
    segments: Sequence[SegmentMetadata],
    max_size: int,
    max_index_size: int,
    first_uncleanable_offset: int,
    index_sizes: IndexSizer | None = None,
) -> list[tuple[SegmentMetadata, ...]]:
    """Kafka's `groupSegmentsBySize` over `segments` (ordered by start offset).

    Args:
        segments: the segments to rewrite, ordered by start offset (for a clean: every live segment
            below `first_uncleanable_offset`, the already-clean prefix included).
        max_size: segment.bytes.
        max_index_size: segment.index.bytes, applied to the offset and the time index separately.
        first_uncleanable_offset: the exclusive upper bound of the cleaning round; bounds the last
            segment's offsets.
        index_sizes: index sizes per segment; `estimated_index_sizes(4096)` (Kafka's default
            index.interval.bytes) if None.

    Returns:
        The groups, in order; their concatenation is `segments`. Each becomes one output segment named
        after its first member's start offset.
    """
    sizer = index_sizes or estimated_index_sizes(4096)
    indexes = [sizer(s) for s in segments]
    groups: list[tuple[SegmentMetadata, ...]] = []
    i = 0
    while i < len(segments):
        head = segments[i]
        log_size = head.segment_size_bytes
        offset_index = indexes[i].offset_index_bytes
        time_index = indexes[i].time_index_bytes
        j = i + 1
        while (
            j < len(segments)
            and log_size + segments[j].segment_size_bytes <= max_size
            and offset_index + indexes[j].offset_index_bytes <= max_index_size
            and time_index + indexes[j].time_index_bytes <= max_index_size
            and (
                segments[j].segment_size_bytes == 0
                or _last_offset_estimate(segments, j, first_uncleanable_offset) - head.start_offset <= INT_MAX
            )
        ):
            log_size += segments[j].segment_size_bytes
            offset_index += indexes[j].offset_index_bytes
            time_index += indexes[j].time_index_bytes
            j += 1
        groups.append(tuple(segments[i:j]))
        i = j
    return groups


def _last_offset_estimate(segments: Sequence[SegmentMetadata], j: int, first_uncleanable_offset: int) -> int:
    """Kafka's `lastOffsetForFirstSegment`: the next segment's base - 1, else first uncleanable - 1."""
    if j + 1 < len(segments):
        return segments[j + 1].start_offset - 1
    return first_uncleanable_offset - 1
