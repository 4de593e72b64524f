"""Fixed-size entry images, shared by the `.index`, `.timeindex` and `.txnindex` readers.

An active segment's `.index`/`.timeindex` are preallocated with zeros and trimmed on roll, so readers drop a
trailing run of all-zero entries. In the offset index an all-zero entry is never real (position 0 is the
first append, which never gets an entry); in the time index `(0, baseOffset)` is a legal first entry (max
timestamp 0 in the first batch), so entry 0 is always kept there (`keep=1`).
"""

from __future__ import annotations

import struct

from compaction.errors import CorruptIndexError

Buffer = bytes | bytearray | memoryview


def unpack_entries(
    data: Buffer, entry: struct.Struct, name: str, what: str, keep: int = 0
) -> list[tuple[int, ...]]:
    """All entries but a trailing all-zero run (preallocation); the first `keep` entries always count."""
    if len(data) % entry.size:
        raise_ragged(len(data), entry.size, name, what)
    used = len(bytes(data).rstrip(b"\x00"))
    used = max(used + -used % entry.size, min(keep * entry.size, len(data)))
    return list(entry.iter_unpack(memoryview(data)[:used]))


def entry_error(name: str, index: int, entry_size: int, problem: str) -> CorruptIndexError:
    """The CorruptIndexError of entry `index` of the index `name`: `entry {index} {problem}`, at the entry's byte
    position."""
    return CorruptIndexError(f"entry {index} {problem}", obj=name, position=index * entry_size)


def raise_ragged(size: int, entry_size: int, name: str, what: str) -> None:
    """Raise CorruptIndexError for an image whose size is not a whole number of entries."""
    raise CorruptIndexError(
        f"{what} of {size} bytes is not a multiple of the {entry_size}-byte entry size; "
        f"{size % entry_size} trailing bytes",
        obj=name,
        position=size - size % entry_size,
    )
