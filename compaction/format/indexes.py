"""Offset, time and transaction indexes of a segment, and their rebuild from a `.log`.

Kafka's side: `OffsetIndex`, `TimeIndex`, `TransactionIndex` and `LogSegment.recover`.

Formats (all big-endian, no header, no checksum: Kafka rebuilds them rather than trusting them):

* `.index`: 8-byte entries `relativeOffset int32, position int32`; relative offsets strictly increase,
  positions never decrease (`OffsetIndex.append`).
* `.timeindex`: 12-byte entries `timestamp int64, relativeOffset int32`; neither goes backwards
  (`TimeIndex.maybeAppend` throws otherwise) and in practice timestamps strictly increase.
* `.txnindex`: 34-byte `AbortedTxn` entries, one per aborted non-empty transaction whose ABORT marker is in
  the segment; `lastOffset` strictly increases (`TransactionIndex.append`).

An active segment's `.index`/`.timeindex` are preallocated with zeros and trimmed on roll. Readers here drop
a trailing run of all-zero entries. In the offset index an all-zero entry is never real (position 0 is the
first append, which never gets an entry); in the time index `(0, baseOffset)` is a legal first entry (max
timestamp 0 in the first batch), so entry 0 is always kept there.

The rebuild replays `LogSegment.append` (and `LogSegment.recover`, which is the same rule batch by batch),
then the inactive-segment step `onBecomeInactiveSegment`. Every function is pure and deterministic.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from compaction.errors import CorruptBatchError, CorruptIndexError, CorruptInputError
from compaction.format.batch import INT32_MAX, NO_TIMESTAMP, decode_batch
from compaction.format.control import ControlType, parse_control_record
from compaction.format.segment import BatchHeader, iter_batch_headers

DEFAULT_INDEX_INTERVAL_BYTES = 4096
ABORTED_TXN_CURRENT_VERSION = 0

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_ABORTED_TXN = struct.Struct(">hqqqq")
OFFSET_ENTRY_SIZE = _OFFSET_ENTRY.size  # 8
TIME_ENTRY_SIZE = _TIME_ENTRY.size  # 12
ABORTED_TXN_SIZE = _ABORTED_TXN.size  # 34

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class OffsetIndexEntry:
    """`(offset − baseOffset, byte position of a batch start in the .log)`."""

    relative_offset: int
    position: int


@dataclass(frozen=True)
class TimeIndexEntry:
    """`timestamp` is the largest timestamp seen at or before `baseOffset + relative_offset`."""

    timestamp: int
    relative_offset: int


@dataclass(frozen=True)
class AbortedTxn:
    """One `.txnindex` entry: `last_offset` is the ABORT marker's offset, `last_stable_offset` the LSO."""

    version: int
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


@dataclass(frozen=True)
class SegmentIndexes:
    """The index files rebuilt for one segment, plus the transaction state to carry into the next segment.

    `open_txns` maps producer id → first offset of its transaction still open at the end of the segment.
    `unresolved_aborts` lists ABORT-marker offsets whose transaction may have started in an earlier segment
    when no `txn_first_offsets` was given: they are left out of `txn_index`.
    """

    offset_index: bytes
    time_index: bytes
    txn_index: bytes | None
    open_txns: Mapping[int, int] = field(default_factory=dict)
    unresolved_aborts: tuple[int, ...] = ()


# --- offset index ----------------------------------------------------------------------------------


def read_offset_index(data: Buffer, base_offset: int, obj: str | None = None) -> list[OffsetIndexEntry]:
    """Parse and validate a `.index` image, dropping a preallocated all-zero tail.

    Raises CorruptIndexError naming `obj` and the entry's byte position: a size that is not a multiple of 8,
    a negative offset or position, an offset not above the previous one, a position below the previous one.
    """
    name = obj or "<offset index>"
    entries: list[OffsetIndexEntry] = []
    for i, (rel, pos) in enumerate(_unpack_entries(data, _OFFSET_ENTRY, name, "offset index")):
        at = i * OFFSET_ENTRY_SIZE
        if rel < 0 or pos < 0:
            raise CorruptIndexError(
                f"entry {i} has relative offset {rel} and position {pos}; both must be >= 0",
                obj=name,
                position=at,
            )
        if entries and rel <= entries[-1].relative_offset:
            raise CorruptIndexError(
                f"entry {i} has offset {base_offset + rel}, expected above the previous entry's "
                f"{base_offset + entries[-1].relative_offset}",
                obj=name,
                position=at,
            )
        if entries and pos < entries[-1].position:
            raise CorruptIndexError(
                f"entry {i} has position {pos}, below the previous entry's {entries[-1].position}",
                obj=name,
                position=at,
            )
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


# --- time index ------------------------------------------------------------------------------------


def read_time_index(data: Buffer, base_offset: int, obj: str | None = None) -> list[TimeIndexEntry]:
    """Parse and validate a `.timeindex` image, dropping a preallocated all-zero tail.

    Raises CorruptIndexError naming `obj` and the entry's byte position: a size that is not a multiple of 12,
    a negative relative offset, a timestamp or offset below the previous entry's.
    """
    name = obj or "<time index>"
    entries: list[TimeIndexEntry] = []
    for i, (ts, rel) in enumerate(_unpack_entries(data, _TIME_ENTRY, name, "time index", keep=1)):
        at = i * TIME_ENTRY_SIZE
        if rel < 0:
            raise CorruptIndexError(f"entry {i} has negative relative offset {rel}", obj=name, position=at)
        if entries and ts < entries[-1].timestamp:
            raise CorruptIndexError(
                f"entry {i} has timestamp {ts}, below the previous entry's {entries[-1].timestamp}",
                obj=name,
                position=at,
            )
        if entries and rel < entries[-1].relative_offset:
            raise CorruptIndexError(
                f"entry {i} has offset {base_offset + rel}, below the previous entry's "
                f"{base_offset + entries[-1].relative_offset}",
                obj=name,
                position=at,
            )
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


# --- transaction index -----------------------------------------------------------------------------


def read_txn_index(data: Buffer, obj: str | None = None, base_offset: int | None = None) -> list[AbortedTxn]:
    """Parse and validate a `.txnindex` image.

    The version is read as Kafka reads it, from the first byte only; above 0 is rejected. Raises
    CorruptIndexError naming `obj` and the entry's byte position: a size that is not a multiple of 34, an
    unknown version, firstOffset above lastOffset, lastOffset not above the previous entry's, and (when
    `base_offset` is given, Kafka's `sanityCheck`) lastOffset below the segment's base offset.
    """
    name = obj or "<transaction index>"
    if len(data) % ABORTED_TXN_SIZE:
        _raise_ragged(len(data), ABORTED_TXN_SIZE, name, "transaction index")
    entries: list[AbortedTxn] = []
    for i, (_v, pid, first, last, lso) in enumerate(_ABORTED_TXN.iter_unpack(data)):
        at = i * ABORTED_TXN_SIZE
        version = struct.unpack_from(">b", data, at)[0]
        if version > ABORTED_TXN_CURRENT_VERSION:
            raise CorruptIndexError(
                f"entry {i} has version {version}, expected {ABORTED_TXN_CURRENT_VERSION}",
                obj=name,
                position=at,
            )
        if first > last:
            raise CorruptIndexError(
                f"entry {i} (producer {pid}) has firstOffset {first} above its lastOffset {last}",
                obj=name,
                position=at,
            )
        if entries and last <= entries[-1].last_offset:
            raise CorruptIndexError(
                f"entry {i} has lastOffset {last}, not above the previous entry's {entries[-1].last_offset}",
                obj=name,
                position=at,
            )
        if base_offset is not None and last < base_offset:
            raise CorruptIndexError(
                f"entry {i} has lastOffset {last}, below the segment's base offset {base_offset}",
                obj=name,
                position=at,
            )
        entries.append(AbortedTxn(version, pid, first, last, lso))
    return entries


def encode_txn_index(entries: Iterable[AbortedTxn]) -> bytes:
    """Serialise aborted transactions (34 bytes each). Raises ValueError if lastOffset does not increase."""
    out = bytearray()
    last: int | None = None
    for e in entries:
        if last is not None and e.last_offset <= last:
            raise ValueError(f"aborted txn lastOffset {e.last_offset} does not increase (previous {last})")
        last = e.last_offset
        out += _ABORTED_TXN.pack(
            e.version, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset
        )
    return bytes(out)


def collect_aborted_txns(
    per_segment_entries: Iterable[Sequence[AbortedTxn]], fetch_offset: int, upper_bound: int
) -> list[AbortedTxn]:
    """Kafka's `LocalLog.collectAbortedTransactions` over consecutive segments' txn indexes.

    Pass the segments in offset order starting at the one containing `fetch_offset` (Kafka's `floorSegment`);
    the cleaner uses fetch_offset = logStartOffset. An entry is kept if `lastOffset >= fetch_offset and
    firstOffset < upper_bound`; the walk stops after the first entry with `lastStableOffset >= upper_bound`.
    Duplicates (same producerId and firstOffset) are returned once, first occurrence kept.
    """
    found: list[AbortedTxn] = []
    seen: set[tuple[int, int]] = set()
    for entries in per_segment_entries:
        for txn in entries:
            key = (txn.producer_id, txn.first_offset)
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound and key not in seen:
                seen.add(key)
                found.append(txn)
            if txn.last_stable_offset >= upper_bound:
                return found
    return found


# --- rebuild ---------------------------------------------------------------------------------------


def build_indexes(
    log_bytes: Buffer,
    base_offset: int,
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    obj: str | None = None,
    chunks: Sequence[int] | None = None,
    txn_first_offsets: Mapping[int, int] | None = None,
) -> SegmentIndexes:
    """Rebuild the indexes of an inactive segment exactly as Kafka would have written them.

    Each batch is one `LogSegment.append` unless `chunks` gives the number of consecutive batches in each
    append (the cleaner appends multi-batch chunks). Per append: if the bytes since the last entry are
    strictly above `index_interval_bytes`, add the offset entry (chunk's largest offset → chunk start) and
    `maybeAppend(maxTimestampSoFar, offsetOfMaxTimestampSoFar)` to the time index; then count the chunk's
    bytes. On roll the max timestamp is appended once more (kept only if above the last entry's timestamp).
    The offset of the max timestamp is the last offset of the first batch carrying it, as `recover` and
    `appendChunkFromFile` compute it. The txn index has one entry per ABORT closing a non-empty transaction.

    `txn_first_offsets` (producer id → first offset of its transaction open at the segment start, e.g. from
    the producer snapshot or the previous segment's `open_txns`) makes the txn index exact; without it,
    aborts of transactions started earlier are reported in `unresolved_aborts` instead of indexed.

    Raises CorruptInputError subclasses naming `obj` and a byte position for a malformed log, an offset that
    does not fit the segment (Kafka's LogSegmentOffsetOverflowException) or offsets that go backwards.
    Pure: the same inputs always give the same bytes.
    """
    name = obj or "<segment>"
    headers = list(iter_batch_headers(log_bytes, obj=name))
    groups = _group_chunks(headers, chunks)
    offset_entries, time_entries = _offset_and_time_entries(groups, base_offset, index_interval_bytes, name)
    aborted, open_txns, unresolved = _aborted_txns(log_bytes, headers, txn_first_offsets, name)
    return SegmentIndexes(
        offset_index=encode_offset_index(offset_entries),
        time_index=encode_time_index(time_entries),
        txn_index=encode_txn_index(aborted) if aborted else None,
        open_txns=open_txns,
        unresolved_aborts=tuple(unresolved),
    )


def _group_chunks(headers: list[BatchHeader], chunks: Sequence[int] | None) -> list[list[BatchHeader]]:
    if chunks is None:
        return [[h] for h in headers]
    if any(n < 1 for n in chunks) or sum(chunks) != len(headers):
        raise ValueError(
            f"chunks {list(chunks)} must be positive and sum to the {len(headers)} batches of the log"
        )
    ends = list(accumulate(chunks))
    return [headers[end - n : end] for n, end in zip(chunks, ends, strict=True)]


def _offset_and_time_entries(
    groups: list[list[BatchHeader]], base_offset: int, interval: int, name: str
) -> tuple[list[OffsetIndexEntry], list[TimeIndexEntry]]:
    offsets: list[OffsetIndexEntry] = []
    times: list[TimeIndexEntry] = []
    # An empty time index's lastEntry is (NO_TIMESTAMP, baseOffset): nothing at or below -1 is ever indexed.
    last_time = TimeIndexEntry(NO_TIMESTAMP, 0)
    max_ts, max_ts_rel = NO_TIMESTAMP, 0
    bytes_since_last_entry = 0
    for chunk in groups:
        for h in chunk:
            _check_in_range(h, base_offset, name)
            if h.max_timestamp > max_ts:
                max_ts, max_ts_rel = h.max_timestamp, h.last_offset - base_offset
        largest_rel = chunk[-1].last_offset - base_offset
        if bytes_since_last_entry > interval:
            if offsets and largest_rel <= offsets[-1].relative_offset:
                raise CorruptInputError(
                    f"offset {base_offset + largest_rel} is not above the previous indexed offset "
                    f"{base_offset + offsets[-1].relative_offset}",
                    obj=name,
                    position=chunk[0].position,
                )
            offsets.append(OffsetIndexEntry(largest_rel, chunk[0].position))
            if max_ts > last_time.timestamp:
                last_time = TimeIndexEntry(max_ts, max_ts_rel)
                times.append(last_time)
            bytes_since_last_entry = 0
        bytes_since_last_entry += sum(h.size for h in chunk)
    if max_ts > last_time.timestamp:  # onBecomeInactiveSegment: maybeAppend(..., skipFullCheck=true)
        times.append(TimeIndexEntry(max_ts, max_ts_rel))
    return offsets, times


def _check_in_range(h: BatchHeader, base_offset: int, name: str) -> None:
    rel = h.last_offset - base_offset
    if not 0 <= rel <= INT32_MAX:
        raise CorruptInputError(
            f"batch last offset {h.last_offset} does not fit a segment based at {base_offset} "
            "(relative offset must be in [0, 2^31-1])",
            obj=name,
            position=h.position,
        )


def _aborted_txns(
    log_bytes: Buffer, headers: list[BatchHeader], carried: Mapping[int, int] | None, name: str
) -> tuple[list[AbortedTxn], dict[int, int], list[int]]:
    open_txns = dict(carried or {})
    aborted: list[AbortedTxn] = []
    unresolved: list[int] = []
    for h in headers:
        if h.producer_id < 0:
            continue
        if not h.is_control:
            if h.is_transactional and h.producer_id not in open_txns:
                open_txns[h.producer_id] = h.base_offset
            continue
        kind = _marker_type(log_bytes, h, name)
        if kind is None:  # an emptied control batch completes nothing (ProducerAppendInfo.append)
            continue
        first = open_txns.pop(h.producer_id, None)
        if first is None:
            if carried is None and kind is ControlType.ABORT:
                unresolved.append(h.base_offset)
            continue
        if kind is ControlType.ABORT:
            # ProducerStateManager.lastStableOffset: the earliest other still-open transaction.
            lso = min(open_txns.values(), default=h.base_offset + 1)
            aborted.append(AbortedTxn(ABORTED_TXN_CURRENT_VERSION, h.producer_id, first, h.base_offset, lso))
    return aborted, open_txns, unresolved


def _marker_type(log_bytes: Buffer, h: BatchHeader, name: str) -> ControlType | None:
    try:
        batch = decode_batch(log_bytes, h.position)
        if not batch.records:
            return None
        kind = parse_control_record(batch.records[0]).type
    except CorruptInputError as exc:
        raise exc.located(name) if exc.obj is None else exc from None
    if kind not in (ControlType.ABORT, ControlType.COMMIT):
        raise CorruptBatchError(
            f"control batch of producer {h.producer_id} at offset {h.base_offset} is a {kind.name} record, "
            "not an end-transaction marker",
            obj=name,
            position=h.position,
        )
    return kind


# --- verification ----------------------------------------------------------------------------------


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
            raise CorruptIndexError(
                f"entry {i} (offset {offset}) points at byte {e.position}, which is not the start of a batch",
                obj=name,
                position=i * OFFSET_ENTRY_SIZE,
            )
        # The chunk this entry indexes ends before the next entry's position.
        chunk_end = bisect_left(starts, entries[i + 1].position) if i + 1 < len(entries) else len(starts)
        highest = last_so_far[chunk_end - 1]
        if not headers[slot].base_offset <= offset <= highest:
            raise CorruptIndexError(
                f"entry {i} maps offset {offset} to byte {e.position}, whose batches hold offsets "
                f"[{headers[slot].base_offset}, {highest}]",
                obj=name,
                position=i * OFFSET_ENTRY_SIZE,
            )


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
            raise CorruptIndexError(
                f"entry {i} points at offset {offset}, outside the log's offsets",
                obj=name,
                position=i * TIME_ENTRY_SIZE,
            )
        if e.timestamp != prefix_max[slot]:
            raise CorruptIndexError(
                f"entry {i} says {e.timestamp} is the max timestamp up to offset {offset}, the log says "
                f"{prefix_max[slot]}",
                obj=name,
                position=i * TIME_ENTRY_SIZE,
            )
    segment_max = prefix_max[-1] if prefix_max else NO_TIMESTAMP
    if segment_max > NO_TIMESTAMP and (not entries or entries[-1].timestamp != segment_max):
        found = entries[-1].timestamp if entries else "no entry"
        raise CorruptIndexError(
            f"the last entry must hold the segment's max timestamp {segment_max}, found {found}",
            obj=name,
            position=max(len(entries) - 1, 0) * TIME_ENTRY_SIZE,
        )


# --- shared ----------------------------------------------------------------------------------------


def _unpack_entries(
    data: Buffer, entry: struct.Struct, name: str, what: str, keep: int = 0
) -> list[tuple[int, ...]]:
    """All entries but a trailing all-zero run (preallocation); the first `keep` entries always count."""
    if len(data) % entry.size:
        _raise_ragged(len(data), entry.size, name, what)
    used = len(bytes(data).rstrip(b"\x00"))
    used = max(used + -used % entry.size, min(keep * entry.size, len(data)))
    return list(entry.iter_unpack(memoryview(data)[:used]))


def _raise_ragged(size: int, entry_size: int, name: str, what: str) -> None:
    raise CorruptIndexError(
        f"{what} of {size} bytes is not a multiple of the {entry_size}-byte entry size; "
        f"{size % entry_size} trailing bytes",
        obj=name,
        position=size - size % entry_size,
    )


def _sibling(log_name: str, suffix: str) -> str:
    return log_name[: -len(".log")] + suffix if log_name.endswith(".log") else f"{log_name} ({suffix})"
