"""Check a segment's `.index` and `.timeindex` against its `.log`, stricter than Kafka's `sanityCheck`."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate

from compaction.errors import CorruptIndexError
from compaction.format.batch import NO_TIMESTAMP
from compaction.format.indexes.entries import Buffer, entry_error
from compaction.format.indexes.offset_index import OFFSET_ENTRY_SIZE, OffsetIndexEntry, read_offset_index
from compaction.format.indexes.time_index import TIME_ENTRY_SIZE, TimeIndexEntry, read_time_index
from compaction.format.segment import BatchHeader, iter_batch_headers


def verify_indexes(
    log_bytes: Buffer,
    base_offset: int,
    offset_index_bytes: Buffer,
    time_index_bytes: Buffer,
    obj: str | None = None,
    *,
    index_obj: str | None = None,
    time_index_obj: str | None = None,
) -> bool:
    """Check that a segment's `.index` and `.timeindex` agree with its `.log`; True, or CorruptIndexError.

    Stricter than Kafka's load-time `sanityCheck`, but every index Kafka writes for an inactive segment
    passes, whatever its index.interval.bytes or chunking:

    * offset entry (O, P): P is a batch start, O ≥ that batch's base offset, and O ≤ the last offset of the
      batches before the next entry's position (an entry maps a chunk's largest offset to its start);
    * time entry (T, O): base ≤ O ≤ the log's last offset and T is the max timestamp of the batches with
      base offset ≤ O; the last entry holds the segment's max timestamp (the inactive-segment append).

    The error names the index object (`index_obj`/`time_index_obj`, else derived from `obj`) and the byte
    position of the offending entry. Callers rebuild with `build_indexes` on failure.
    """
    log_name = obj or "<segment>"
    index_name = index_obj or _sibling(log_name, ".index")
    time_name = time_index_obj or _sibling(log_name, ".timeindex")
    headers = list(iter_batch_headers(log_bytes, obj=log_name))
    _verify_offset_index(
        headers, base_offset, read_offset_index(offset_index_bytes, base_offset, index_name), index_name
    )
    _verify_time_index(
        headers, base_offset, read_time_index(time_index_bytes, base_offset, time_name), time_name
    )
    return True


def _verify_offset_index(
    headers: list[BatchHeader], base_offset: int, entries: list[OffsetIndexEntry], name: str
) -> None:
    starts = [h.position for h in headers]
    last_so_far = list(accumulate((h.last_offset for h in headers), max))
    for i, e in enumerate(entries):
        offset = base_offset + e.relative_offset
        slot = bisect_right(starts, e.position) - 1
        if slot < 0 or starts[slot] != e.position:
            raise entry_error(name, i, OFFSET_ENTRY_SIZE,
                              f"(offset {offset}) points at byte {e.position}, which is not the start of a batch")
        # The chunk this entry indexes ends before the next entry's position.
        chunk_end = bisect_left(starts, entries[i + 1].position) if i + 1 < len(entries) else len(starts)
        highest = last_so_far[chunk_end - 1]
        if not headers[slot].base_offset <= offset <= highest:
            raise entry_error(name, i, OFFSET_ENTRY_SIZE, f"maps offset {offset} to byte {e.position}, whose batches "
                              f"hold offsets [{headers[slot].base_offset}, {highest}]")


def _verify_time_index(
    headers: list[BatchHeader], base_offset: int, entries: list[TimeIndexEntry], name: str
) -> None:
    bases = [h.base_offset for h in headers]
    prefix_max = list(accumulate((h.max_timestamp for h in headers), max))
    log_last = headers[-1].last_offset if headers else base_offset - 1
    for i, e in enumerate(entries):
        offset = base_offset + e.relative_offset
        slot = bisect_right(bases, offset) - 1
        if offset > log_last or slot < 0:
            raise entry_error(name, i, TIME_ENTRY_SIZE, f"points at offset {offset}, outside the log's offsets")
        if e.timestamp != prefix_max[slot]:
            raise entry_error(name, i, TIME_ENTRY_SIZE, f"says {e.timestamp} is the max timestamp up to offset "
                              f"{offset}, the log says {prefix_max[slot]}")
    segment_max = prefix_max[-1] if prefix_max else NO_TIMESTAMP
    if segment_max > NO_TIMESTAMP and (not entries or entries[-1].timestamp != segment_max):
        found = entries[-1].timestamp if entries else "no entry"
        raise CorruptIndexError(
            f"the last entry must hold the segment's max timestamp {segment_max}, found {found}",
            obj=name,
            position=max(len(entries) - 1, 0) * TIME_ENTRY_SIZE,
        )


def _sibling(log_name: str, suffix: str) -> str:
    return log_name[: -len(".log")] + suffix if log_name.endswith(".log") else f"{log_name} ({suffix})"
