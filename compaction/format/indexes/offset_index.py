"""The `.index` format (Kafka's `OffsetIndex`): read, write and look up.

8-byte big-endian entries `relativeOffset int32, position int32`, no header, no checksum (Kafka rebuilds
indexes rather than trusting them); relative offsets strictly increase and positions never decrease
(`OffsetIndex.append`).
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compaction.format.indexes.entries import Buffer, entry_error, unpack_entries

_OFFSET_ENTRY = struct.Struct(">ii")
OFFSET_ENTRY_SIZE = _OFFSET_ENTRY.size  # 8


@dataclass(frozen=True)
class OffsetIndexEntry:
    """`(offset − baseOffset, byte position of a batch start in the .log)`."""

    relative_offset: int
    position: int


def read_offset_index(data: Buffer, base_offset: int, obj: str | None = None) -> list[OffsetIndexEntry]:
    """Parse and validate a `.index` image, dropping a preallocated all-zero tail.

    Raises CorruptIndexError naming `obj` and the entry's byte position: a size that is not a multiple of 8,
    a negative offset or position, an offset not above the previous one, a position below the previous one.
    """
    name = obj or "<offset index>"
    entries: list[OffsetIndexEntry] = []
    for i, (rel, pos) in enumerate(unpack_entries(data, _OFFSET_ENTRY, name, "offset index")):
        if rel < 0 or pos < 0:
            raise entry_error(name, i, OFFSET_ENTRY_SIZE,
                              f"has relative offset {rel} and position {pos}; both must be >= 0")
        if entries and rel <= entries[-1].relative_offset:
            raise entry_error(name, i, OFFSET_ENTRY_SIZE, f"has offset {base_offset + rel}, expected above the "
                              f"previous entry's {base_offset + entries[-1].relative_offset}")
        if entries and pos < entries[-1].position:
            raise entry_error(name, i, OFFSET_ENTRY_SIZE,
                              f"has position {pos}, below the previous entry's {entries[-1].position}")
        entries.append(OffsetIndexEntry(rel, pos))
    return entries


def encode_offset_index(entries: Iterable[OffsetIndexEntry]) -> bytes:
    """Serialise offset-index entries (8 bytes each, trimmed: no preallocated tail)."""
    return b"".join(_OFFSET_ENTRY.pack(e.relative_offset, e.position) for e in entries)


def offset_index_lookup(
    entries: Sequence[OffsetIndexEntry], base_offset: int, target: int
) -> tuple[int, int]:
    """Kafka's `OffsetIndex.lookup`: `(offset, position)` of the greatest entry ≤ target, else `(base, 0)`."""
    slot = bisect_right(entries, target - base_offset, key=lambda e: e.relative_offset) - 1
    if slot < 0:
        return base_offset, 0
    return base_offset + entries[slot].relative_offset, entries[slot].position
