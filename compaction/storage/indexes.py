"""A segment's small files in one object: `<startOffset>-<segmentId>.indexes`.

Kafka hands a remote storage manager six files per segment (the log, its offset, time and transaction indexes, the
producer snapshot, the leader-epoch checkpoint) and kcompact adds a key filter; as one object each, a segment of a
small partition cost seven object creations (PUTs on S3), which made a topic of many small partitions slow to tier
and to compact for its bytes (docs/benchmarks: P11). kcompact's own writers (`tier`, the rewrite, `wal roll`) put the
segment's `.log` and one `.indexes` object holding the others, as Aiven's plugin keeps a segment's indexes in one
object read by range. The broker plugin's own copies keep one object per file (Kafka's copy call hands it files one
by one, and a stock broker's copies must stay readable by anything that reads Aiven's layout).

A segment row names, for each file, the object it is in (`object_keys`): a key ending in `.indexes` means "this
file is a part of that object" and `get_part` reads it; any other key is the file itself. The layout, all integers
big-endian:

    magic   4 bytes  b"KCIX"
    version 1 byte   1
    count   1 byte   the number of parts, 1..8
    count x (kind 1 byte: the part's code in `PART_CODES`, length 8 bytes)
    the parts' bytes, one after the other in the order listed

so a part's position is the header's length plus the lengths listed before it, and the object's size is the
header's length plus every part's.

A reader does not know where a part lies before it has the header, so its first request asks for the header and
what follows it, `READ_AHEAD` bytes in all; a part within them costs no second request, and one beyond them is asked
for from where the first request ended (no byte fetched twice). kcompact's writers lay the parts out in `PART_ORDER`,
the small parts a run reads of every partition first (the producer snapshot its plan and its rewrite both read, the
leader-epoch checkpoint the rewrite carries), the indexes a reader seeks with last: a small partition's segment is
read in one request instead of two (docs/fidelity.md). Objects written before that (`PART_CODES` order) read the
same.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from compaction.errors import CorruptInputError, MissingObjectError
from compaction.storage.base import ObjectStore
from compaction.storage.layout import Suffix

MAGIC = b"KCIX"
VERSION = 1
MAX_PARTS = 8
INDEXES_SUFFIX = "." + Suffix.INDEXES.value
PART_CODES: dict[Suffix, int] = {
    Suffix.OFFSET_INDEX: 1,
    Suffix.TIME_INDEX: 2,
    Suffix.TXN_INDEX: 3,
    Suffix.PRODUCER_SNAPSHOT: 4,
    Suffix.LEADER_EPOCH_CHECKPOINT: 5,
    Suffix.BLOOM: 6,
}
_BY_CODE = {code: suffix for suffix, code in PART_CODES.items()}
T = TypeVar("T")
_PREAMBLE = struct.Struct(">4sBB")
_ENTRY = struct.Struct(">BQ")
PART_ORDER: tuple[Suffix, ...] = (
    Suffix.PRODUCER_SNAPSHOT,
    Suffix.LEADER_EPOCH_CHECKPOINT,
    Suffix.TXN_INDEX,
    Suffix.BLOOM,
    Suffix.OFFSET_INDEX,
    Suffix.TIME_INDEX,
)
"""The order kcompact's writers lay the parts out in (module docstring): what a run reads of every partition first,
then the key filter its plan reads of a clean segment, then the indexes only a reader seeking an offset or a time
needs."""
MAX_HEADER_BYTES = 6 + MAX_PARTS * 9
"""The longest header (its parts' lengths, so their positions)."""
READ_AHEAD = 16 * 1024
"""What a reader asks for first: the header and the parts after it, up to this many bytes in all (module docstring).
Against an object store's round trip (tens of ms on S3) the bytes beyond the part wanted cost little (16 KiB at
100 MB/s: 0.16 ms); a small partition's producer snapshot and leader-epoch checkpoint lie well within them."""


class CorruptIndexesObjectError(CorruptInputError):
    """An `.indexes` object whose header is not kcompact's, or whose parts do not add up to its size."""


def is_parts_key(key: str) -> bool:
    """Whether `key` names an `.indexes` object (its files are read with `get_part`)."""
    return key.endswith(INDEXES_SUFFIX)


def header_length(count: int) -> int:
    return _PREAMBLE.size + count * _ENTRY.size


def pack_parts(parts: Mapping[Suffix, bytes]) -> bytes:
    """The `.indexes` object holding `parts` (in `PART_ORDER`, whatever the mapping's)."""
    if not parts:
        raise ValueError("an .indexes object holds at least one part")
    unknown = [s for s in parts if s not in PART_CODES]
    if unknown:
        raise ValueError(f"not a part of an .indexes object: {unknown}")
    ordered = sorted(parts.items(), key=lambda item: PART_ORDER.index(item[0]))
    head = [_PREAMBLE.pack(MAGIC, VERSION, len(ordered))]
    head += [_ENTRY.pack(PART_CODES[suffix], len(data)) for suffix, data in ordered]
    return b"".join([*head, *(bytes(data) for _s, data in ordered)])


def segment_objects(key: Callable[[Suffix], str], log: bytes, parts: Mapping[Suffix, bytes]
                    ) -> tuple[dict[str, bytes], dict[Suffix, str]]:
    """What a writer puts for one segment, `{key: bytes}`: its `.log` and one `.indexes` object holding `parts`
    (none without parts); and the key its row names for each file, `{suffix: key}` (`key(suffix)` builds keys)."""
    keys = segment_keys(key, parts)
    objects = {keys[Suffix.LOG]: log}
    if parts:
        objects[keys[Suffix.INDEXES]] = pack_parts(parts)
    return objects, keys


def segment_keys(key: Callable[[Suffix], str], parts: Iterable[Suffix]) -> dict[Suffix, str]:
    """The key a segment's row names for each of its files when `parts` go in its `.indexes` object."""
    keys = {Suffix.LOG: key(Suffix.LOG)}
    ordered = sorted(parts, key=PART_CODES.__getitem__)
    if ordered:
        parts_key = keys[Suffix.INDEXES] = key(Suffix.INDEXES)
        keys.update({suffix: parts_key for suffix in ordered})
    return keys


def read_header(head: bytes, *, obj: str, size: int | None = None) -> dict[Suffix, tuple[int, int]]:
    """Each part's `[start, end)` in the object whose first bytes are `head` (at least the header); `size`, when
    known, is checked against the parts. CorruptIndexesObjectError names `obj` and the byte at fault."""
    if len(head) < _PREAMBLE.size:
        raise CorruptIndexesObjectError(f"{len(head)} bytes, shorter than an .indexes header", obj=obj,
                                        position=len(head))
    magic, version, count = _PREAMBLE.unpack_from(head)
    if magic != MAGIC:
        raise CorruptIndexesObjectError(f"not an .indexes object (magic {magic!r}, expected {MAGIC!r})", obj=obj,
                                        position=0)
    if version != VERSION:
        raise CorruptIndexesObjectError(f"unsupported .indexes version {version} (this kcompact reads {VERSION})",
                                        obj=obj, position=4)
    if not 1 <= count <= MAX_PARTS:
        raise CorruptIndexesObjectError(f"{count} parts (1 to {MAX_PARTS} allowed)", obj=obj, position=5)
    if len(head) < header_length(count):
        raise CorruptIndexesObjectError(f"header of {count} parts cut at byte {len(head)}", obj=obj,
                                        position=len(head))
    parts: dict[Suffix, tuple[int, int]] = {}
    position = header_length(count)
    for i in range(count):
        at = _PREAMBLE.size + i * _ENTRY.size
        code, length = _ENTRY.unpack_from(head, at)
        suffix = _BY_CODE.get(code)
        if suffix is None or suffix in parts:
            what = "unknown" if suffix is None else "repeated"
            raise CorruptIndexesObjectError(f"{what} part kind {code}", obj=obj, position=at)
        parts[suffix] = (position, position + length)
        position += length
    if size is not None and position != size:
        raise CorruptIndexesObjectError(f"parts add up to {position} bytes, the object holds {size}", obj=obj,
                                        position=min(position, size))
    return parts


def unpack_parts(data: bytes, *, obj: str) -> dict[Suffix, bytes]:
    """Every part of the whole `.indexes` object `data`."""
    return {s: bytes(data[a:b]) for s, (a, b) in read_header(data, obj=obj, size=len(data)).items()}


def get_part(store: ObjectStore, key: str, suffix: Suffix) -> bytes:
    """The bytes of `suffix`'s file of a segment whose row names `key` for it: the object itself, or its part of an
    `.indexes` object (two requests: the header's bytes, then the part's). MissingObjectError when the object is
    missing or holds no such part."""
    return _located_part(store, key, suffix)[0]


def get_part_fetched(store: ObjectStore, key: str, suffix: Suffix) -> tuple[bytes, int]:
    """`get_part`'s bytes, and how many bytes it fetched (the header's too), for a reader that reports them."""
    data, _start, fetched = _located_part(store, key, suffix)
    return data, fetched


def parse_part(store: ObjectStore, key: str, suffix: Suffix, parse: Callable[[bytes, str], T]) -> T:
    """`parse(bytes, obj)` of `get_part`'s bytes, `obj` the object's URI; a CorruptInputError it raises names the byte
    of the object, not of the part."""
    data, start, _fetched = _located_part(store, key, suffix)
    obj = store.object_uri(key)
    try:
        return parse(data, obj)
    except CorruptInputError as exc:
        if not is_parts_key(key):
            raise
        position = None if exc.position is None else exc.position + start
        raise type(exc)(f"its .{suffix.value} part (from byte {start}): {exc.detail}", obj=obj,
                        position=position) from exc


def _located_part(store: ObjectStore, key: str, suffix: Suffix) -> tuple[bytes, int, int]:
    """The part's bytes, its position in the object and the bytes fetched."""
    if not is_parts_key(key):
        data = store.get(key)
        return data, 0, len(data)
    ranges, head = _ranges(store, key, [suffix])
    parts, more = _read(store, key, ranges, head)
    return parts[suffix], ranges[suffix][0], len(head) + more


def get_parts(store: ObjectStore, keys: Mapping[Suffix, str]) -> dict[Suffix, bytes]:
    """`get_part` of each `{suffix: key}`; the parts one `.indexes` object holds are read with the request for its
    header, or one more request spanning them (they are next to each other when adjacent in `PART_ORDER`, as the
    producer snapshot and the leader-epoch checkpoint a rewrite carries are)."""
    out: dict[Suffix, bytes] = {}
    by_object: dict[str, list[Suffix]] = {}
    for suffix, key in keys.items():
        if is_parts_key(key):
            by_object.setdefault(key, []).append(suffix)
        else:
            out[suffix] = store.get(key)
    for key, wanted in by_object.items():
        out.update(_read(store, key, *_ranges(store, key, wanted))[0])
    return out


def _ranges(store: ObjectStore, key: str, wanted: Iterable[Suffix]) -> tuple[dict[Suffix, tuple[int, int]], bytes]:
    """Where each `wanted` part lies in the `.indexes` object `key`, from its header, and the object's first bytes,
    header included, as the one request for them returned (`READ_AHEAD` of them, fewer when the object is smaller)."""
    obj = store.object_uri(key)
    head = store.get(key, 0, READ_AHEAD)
    parts = read_header(head, obj=obj)
    missing = [s for s in wanted if s not in parts]
    if missing:
        raise MissingObjectError(f"holds no .{missing[0].value} part (it holds {', '.join(s.value for s in parts)})",
                                 obj=obj)
    return {s: parts[s] for s in wanted}, head


def _read(store: ObjectStore, key: str, ranges: Mapping[Suffix, tuple[int, int]], head: bytes
          ) -> tuple[dict[Suffix, bytes], int]:
    """The parts at `ranges` of object `key` whose first bytes are `head`: from `head` where they lie within it,
    else with one more request for what spans them past it; and the bytes that request fetched."""
    low = min(a for a, _b in ranges.values())
    high = max(b for _a, b in ranges.values())
    start = max(low, len(head))
    if high > start and len(head) < READ_AHEAD:  # `head` is the whole object: nothing lies past it
        raise CorruptIndexesObjectError(f"the header says its parts reach byte {high}, the object ends at byte "
                                        f"{len(head)}", obj=store.object_uri(key), position=len(head))
    more = store.get(key, start, high) if high > start else b""
    if len(more) < high - start:
        end = f"ends at byte {start + len(more)}" if more else f"ends at or before byte {start}"
        raise CorruptIndexesObjectError(f"the header says its parts reach byte {high}, the object {end}",
                                        obj=store.object_uri(key), position=start + len(more))
    window = bytes(head[low:start]) + bytes(more) if low < start else bytes(more)
    return {s: window[a - low:b - low] for s, (a, b) in ranges.items()}, len(more)


__all__ = [
    "INDEXES_SUFFIX",
    "MAX_HEADER_BYTES",
    "PART_ORDER",
    "READ_AHEAD",
    "CorruptIndexesObjectError",
    "get_part",
    "get_part_fetched",
    "get_parts",
    "is_parts_key",
    "pack_parts",
    "parse_part",
    "read_header",
    "segment_keys",
    "segment_objects",
    "unpack_parts",
]
