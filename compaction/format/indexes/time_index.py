"""The `.timeindex` format (Kafka's `TimeIndex`): read, write and look up.

12-byte big-endian entries `timestamp int64, relativeOffset int32`, no header, no checksum; neither goes
backwards (`TimeIndex.maybeAppend` throws otherwise) and in practice timestamps strictly increase.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compaction.format.batch import NO_TIMESTAMP
from compaction.format.indexes.entries import Buffer, entry_error, unpack_entries

_TIME_ENTRY = struct.Struct(">qi")
TIME_ENTRY_SIZE = _TIME_ENTRY.size  # 12


@dataclass(frozen=True)
class TimeIndexEntry:
    """`timestamp` is the largest timestamp seen at or before `baseOffset + relative_offset`."""

    timestamp: int
    relative_offset: int


def read_time_index(data: Buffer, base_offset: int, obj: str | None = None) -> list[TimeIndexEntry]:
    """Parse and validate a `.timeindex` image, dropping a preallocated all-zero tail.

    Raises CorruptIndexError naming `obj` and the entry's byte position: a size that is not a multiple of 12,
    a negative relative offset, a timestamp or offset below the previous entry's.
    """
    name = obj or "<time index>"
    entries: list[TimeIndexEntry] = []
    for i, (ts, rel) in enumerate(unpack_entries(data, _TIME_ENTRY, name, "time index", keep=1)):
        if rel < 0:
            raise entry_error(name, i, TIME_ENTRY_SIZE, f"has negative relative offset {rel}")
        if entries and ts < entries[-1].timestamp:
            raise entry_error(name, i, TIME_ENTRY_SIZE,
                              f"has timestamp {ts}, below the previous entry's {entries[-1].timestamp}")
        if entries and rel < entries[-1].relative_offset:
            raise entry_error(name, i, TIME_ENTRY_SIZE, f"has offset {base_offset + rel}, below the previous "
                              f"entry's {base_offset + entries[-1].relative_offset}")
        entries.append(TimeIndexEntry(ts, rel))
    return entries


def encode_time_index(entries: Iterable[TimeIndexEntry]) -> bytes:
    """Serialise time-index entries (12 bytes each, trimmed)."""
    return b"".join(_TIME_ENTRY.pack(e.timestamp, e.relative_offset) for e in entries)


def time_index_lookup(
    entries: Sequence[TimeIndexEntry], base_offset: int, target_timestamp: int
) -> tuple[int, int]:
    """Kafka's `TimeIndex.lookup`: `(timestamp, offset)` of the greatest entry with timestamp ≤ target.

    Returns `(NO_TIMESTAMP, base_offset)` when every entry is above the target (or there is none).
    """
    slot = bisect_right(entries, target_timestamp, key=lambda e: e.timestamp) - 1
    if slot < 0:
        return NO_TIMESTAMP, base_offset
    return entries[slot].timestamp, base_offset + entries[slot].relative_offset
