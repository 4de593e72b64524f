"""What a consumer would receive from a partition's live remote segments, in offset order.

Shared by `kcompact read` (no Spark needed) and `compaction.read_partition` (one Spark task per segment),
so both answer the same question the same way:

- control records are never emitted;
- read_uncommitted (Kafka's default) returns every data record;
- read_committed stops at the log's last stable offset (LSO), as a consumer does (a broker answers its fetch
  with nothing at or past it, and ListOffsets at read_committed with the LSO): the first offset of the
  earliest transaction still open at the end of the log (no marker yet, in the tier or the WAL tail), or the
  log end when none is open. A read from the LSO or past it returns nothing. Below it, records of aborted
  transactions are dropped, identified as the consumer does, from the aborted-transaction index: a
  transactional batch of producer P whose offsets fall within an AbortedTxn(P, firstOffset .. lastOffset =
  the ABORT marker) is skipped. So committed records written after a transaction that is still open are not
  returned until it ends, however many there are.

The log is the partition's live segments, then its WAL tail (`compaction.wal`): a slice of a combined
object is read with a ranged GET of just its bytes, and since the WAL has no transaction index, its
aborted transactions are found from the markers in it, carrying the transactions still open at the end of
the tier; a transaction that starts in the tier and ends in the WAL is aborted or committed there.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from compaction.errors import (
    ConfigError,
    CorruptBatchError,
    CorruptInputError,
    CorruptMetadataError,
    TruncatedSegmentError,
)
from compaction.format.batch import CONTROL_FLAG_MASK, TRANSACTIONAL_FLAG_MASK, Record, RecordBatch
from compaction.format.control import ControlType, parse_control_record
from compaction.format.indexes import AbortedTxn, offset_index_lookup, read_offset_index, read_txn_index
from compaction.format.scan import CONSUMER_SCHEMA, batch_fields, scan_records
from compaction.format.scan_kernels import (
    BATCH_ATTRIBUTES,
    BATCH_BASE_OFFSET,
    BATCH_LAST_OFFSET_DELTA,
    BATCH_PRODUCER_ID,
    RECORD_BATCH,
    RECORD_OFFSET,
)
from compaction.format.segment import BatchHeader, iter_batch_headers, iter_batches
from compaction.metadata import ObjectSuffix, SegmentMetadata
from compaction.metadata.snapshot import PartitionSnapshot
from compaction.storage.base import ObjectStore
from compaction.storage.indexes import parse_part
from compaction.wal.log import PartitionLog, WalSlice
from compaction.wal.view import partition_log


class Isolation(StrEnum):
    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"

    @classmethod
    def parse(cls, text: str) -> Isolation:
        try:
            return cls(text)
        except ValueError:
            raise ConfigError(f"isolation must be read_uncommitted or read_committed, not {text!r}") from None


@dataclass(frozen=True)
class ConsumerRead:
    """How a consumer reads the pieces of a log: from `from_offset`, at `isolation`, up to `stable_offset`
    (excluded; None: to the end of each piece); read_committed skips the transactions `aborted`
    (producerId -> [(firstOffset, lastOffset)]) and those still open (`unstable_from`: producerId -> first
    offset). `consumer_read` finds all three once for the whole log, with `stable_offset` its last stable
    offset; `verify`'s view instead reads below a log end of its own, past open transactions, skipping them."""

    from_offset: int = 0
    isolation: Isolation = Isolation.READ_UNCOMMITTED
    aborted: Mapping[int, Sequence[tuple[int, int]]] = field(default_factory=dict)
    unstable_from: Mapping[int, int] = field(default_factory=dict)
    stable_offset: int | None = None

    def last_offset(self, seg: SegmentRef) -> int:
        """The last offset of `seg` this read may return (below `start_offset` when it returns none of it)."""
        return seg.end_offset if self.stable_offset is None else min(seg.end_offset, self.stable_offset - 1)


FROM_START = ConsumerRead()
"""A read_uncommitted consumer from offset 0."""


@dataclass(frozen=True)
class SegmentRef:
    """The small picklable description of one piece of the log a reader (or a Spark task) needs.

    A live segment, or (`wal=True`) the slice `[start_position, end_position)` of a combined object, of which
    offsets `start_offset..end_offset` are part of the log.
    """

    start_offset: int
    end_offset: int
    log_key: str
    txn_index_key: str | None
    offset_index_key: str | None = None
    wal: bool = False
    start_position: int = 0
    end_position: int | None = None


def segment_ref(segment: SegmentMetadata) -> SegmentRef:
    """The reader's view of a metadata row."""
    log_key = segment.object_key(ObjectSuffix.LOG)
    if log_key is None:
        raise CorruptMetadataError(f"segment {segment.segment_id} has no .log object key")
    return SegmentRef(segment.start_offset, segment.end_offset, log_key, segment.object_key(ObjectSuffix.TXN_INDEX),
                      segment.object_key(ObjectSuffix.OFFSET_INDEX))


def wal_ref(s: WalSlice) -> SegmentRef:
    """The reader's view of a WAL slice."""
    e = s.entry
    return SegmentRef(s.first_offset, s.last_offset, s.object_key, None, None, True, e.start_position, e.end_position)


def log_refs(store: ObjectStore, topic: str, partition: int, version: int | None = None) -> list[SegmentRef]:
    """The partition's whole log: its live segments (at metadata `version`, default latest), then its WAL tail.

    With `version`, the WAL continues from that version's tier end as far as the WAL still holds the data.
    """
    return refs_of(*partition_log(store, topic, partition, metadata_version=version))


def refs_of(tier: PartitionSnapshot | None, log: PartitionLog) -> list[SegmentRef]:
    """A partition's whole log as pieces: its live segments in `tier`, then the slices of its resolved `log`."""
    segments = [segment_ref(s) for s in tier.live_segments] if tier is not None else []
    return segments + [wal_ref(s) for s in log.slices]


def aborted_ranges(store: ObjectStore, segments: Sequence[SegmentRef]) -> dict[int, list[tuple[int, int]]]:
    """producerId -> [(firstOffset, lastOffset)] of every aborted transaction in the log, deduplicated.

    From the tier's transaction indexes, and for WAL slices from their markers (`wal_transactions`).
    """
    if any(seg.wal for seg in segments):
        return log_transactions(store, segments)[0]
    return _indexed_aborts(store, segments)


def _indexed_aborts(store: ObjectStore, segments: Sequence[SegmentRef]) -> dict[int, list[tuple[int, int]]]:
    seen: dict[tuple[int, int], AbortedTxn] = {}
    for seg in segments:
        if seg.txn_index_key is None:
            continue
        for txn in parse_part(store, seg.txn_index_key, ObjectSuffix.TXN_INDEX,
                              lambda data, obj: read_txn_index(data, obj=obj)):
            seen.setdefault((txn.producer_id, txn.first_offset), txn)
    ranges: dict[int, list[tuple[int, int]]] = {}
    for txn in seen.values():
        ranges.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
    return ranges


def _is_aborted(batch: RecordBatch, aborted: Mapping[int, Sequence[tuple[int, int]]]) -> bool:
    return batch.is_transactional and any(
        first <= batch.base_offset <= last for first, last in aborted.get(batch.producer_id, ())
    )


def open_transactions(batches: Iterable[RecordBatch | BatchHeader | TxnBatch]) -> dict[int, int]:
    """producerId -> first offset of its transaction that has data but no marker, after `batches`."""
    open_txns: dict[int, int] = {}
    for batch in batches:
        if not batch.is_transactional:
            continue
        if batch.is_control:
            open_txns.pop(batch.producer_id, None)
        else:
            open_txns.setdefault(batch.producer_id, batch.base_offset)
    return open_txns


def segment_records(store: ObjectStore, seg: SegmentRef, read: ConsumerRead = FROM_START) -> Iterator[Record]:
    """The records of one segment a consumer would receive (see the module docstring).

    Reading from an offset inside the segment fetches only the bytes from the offset index's entry for it on
    (a ranged GET, as a broker serves a fetch); errors still name the position in the whole object.
    """
    high = read.last_offset(seg)
    if high < max(read.from_offset, seg.start_offset):
        return
    uri, data, position, low = _fetched(store, seg, read.from_offset)
    try:
        for _pos, batch in iter_batches(data, obj=uri):
            if batch.base_offset > high:
                break
            if batch.is_control or batch.last_offset < low:
                continue
            if read.isolation is Isolation.READ_COMMITTED and batch.is_transactional:
                if _is_aborted(batch, read.aborted):
                    continue
                first_open = read.unstable_from.get(batch.producer_id)
                if first_open is not None and batch.base_offset >= first_open:
                    continue
            yield from (r for r in batch.records if low <= r.offset <= high)
    except CorruptInputError as exc:  # positions in the fetched tail -> positions in the object
        raise exc.located(uri, position) from None


def _fetched(store: ObjectStore, seg: SegmentRef, from_offset: int) -> tuple[str, bytes | memoryview, int, int]:
    """(object URI, bytes, their position in the object, the first offset to return) of a read of `seg` from
    `from_offset`: a WAL slice's bytes checked for what a CRC misses (`wal_headers`)."""
    uri = store.object_uri(seg.log_key)
    data, position = _segment_tail(store, seg, from_offset)
    if seg.wal:
        wal_headers(data, seg, uri)
    return uri, data, position, max(from_offset, seg.start_offset) if seg.wal else from_offset


def segment_batches(store: ObjectStore, seg: SegmentRef, read: ConsumerRead = FROM_START, *,
                    keys: Callable[[pa.Array], np.ndarray] | None = None) -> Iterator[pa.RecordBatch]:
    """`segment_records` as Arrow batches (`format.scan.CONSUMER_SCHEMA`), decoded by the scan's kernels: the same
    records, fetched and checked the same way, with no Python per record.

    `keys`: only the keyed records whose key it keeps (given the key column of the records read, it returns a mask
    over them), decided before any value or header is built. A read of none of its records is one empty batch."""
    high = read.last_offset(seg)
    if high < max(read.from_offset, seg.start_offset):
        yield pa.RecordBatch.from_pylist([], schema=CONSUMER_SCHEMA)
        return
    uri, data, position, low = _fetched(store, seg, read.from_offset)
    try:
        scan = scan_records(data, obj=uri)
    except CorruptInputError as exc:  # positions in the fetched tail -> positions in the object
        raise exc.located(uri, position) from None
    fields = scan.fields
    keep = (fields[:, BATCH_ATTRIBUTES] & CONTROL_FLAG_MASK) == 0
    if read.isolation is Isolation.READ_COMMITTED:
        keep &= ~_uncommitted(fields, read.aborted, read.unstable_from)
    offsets = scan.ranges[RECORD_OFFSET]
    take = np.flatnonzero(keep[scan.ranges[RECORD_BATCH]] & (offsets >= low) & (offsets <= high))
    if keys is not None:
        column = scan.keys(take)
        take = take[np.asarray(column.is_valid(), bool) & np.asarray(keys(column), bool)]
    yield from scan.consumer_batches(take)


def _uncommitted(fields: np.ndarray, aborted: Mapping[int, Sequence[tuple[int, int]]],
                 unstable_from: Mapping[int, int]) -> np.ndarray:
    """Which batches a read_committed consumer skips: transactional batches of an aborted transaction (the
    `AbortedTxn` ranges holding their base offset) or of one still open (`unstable_from` on)."""
    skip = np.zeros(fields.shape[0], bool)
    transactional = (fields[:, BATCH_ATTRIBUTES] & TRANSACTIONAL_FLAG_MASK) != 0
    for producer in np.unique(fields[transactional, BATCH_PRODUCER_ID]):
        mine = transactional & (fields[:, BATCH_PRODUCER_ID] == producer)
        base = fields[mine, BATCH_BASE_OFFSET]
        spans = sorted(aborted.get(int(producer), ()))
        hit = np.zeros(base.shape[0], bool)
        if spans:
            first = np.array([f for f, _ in spans], np.int64)
            last = np.array([la for _, la in spans], np.int64)
            at = np.searchsorted(first, base, side="right") - 1
            hit = (at >= 0) & (base <= last[np.maximum(at, 0)])
        open_from = unstable_from.get(int(producer))
        if open_from is not None:
            hit |= base >= open_from
        skip[mine] = hit
    return skip


def wal_headers(data: bytes | memoryview, seg: SegmentRef, uri: str, *, verify_crc: bool = False) -> list[BatchHeader]:
    """The headers of the batches of a WAL slice's bytes that hold its offsets, checked for what a CRC misses.

    Errors name absolute positions in the object. A batch's base offset lies outside the CRC (as in Kafka), so
    a damaged one could make a reader stop early or skip batches silently. The bytes are exactly one entry's,
    so every batch in them must follow the previous one, and the batches taken must cover the slice from
    `start_offset` to `end_offset`; anything else is a CorruptBatchError naming the object and byte position.
    """
    try:
        headers = list(iter_batch_headers(data, obj=uri, verify_crc=verify_crc))
    except CorruptInputError as exc:  # positions in the slice -> positions in the object
        raise exc.located(uri, seg.start_position) from None
    taken: list[BatchHeader] = []
    previous: BatchHeader | None = None
    for h in headers:
        last = h.base_offset + h.last_offset_delta
        if previous is not None and h.base_offset <= previous.base_offset + previous.last_offset_delta:
            raise CorruptBatchError(
                f"batch base offset {h.base_offset} does not follow the previous batch's last offset "
                f"{previous.base_offset + previous.last_offset_delta}",
                obj=uri, position=seg.start_position + h.position)
        previous = h
        if last >= seg.start_offset and h.base_offset <= seg.end_offset:
            taken.append(h)
    covered_to = taken[-1].base_offset + taken[-1].last_offset_delta if taken else None
    if not taken or taken[0].base_offset > seg.start_offset or covered_to is None or covered_to < seg.end_offset:
        where = seg.start_position + (taken[-1].position + taken[-1].size if taken else 0)
        raise CorruptBatchError(
            f"the entry's batches do not hold offsets {seg.start_offset}..{seg.end_offset} (they hold "
            f"{taken[0].base_offset if taken else '-'}..{covered_to if taken else '-'}): a damaged batch header",
            obj=uri, position=where)
    return taken


def slice_bytes(store: ObjectStore, seg: SegmentRef) -> bytes:
    """The bytes of a WAL slice (one ranged GET); a short object is a TruncatedSegmentError at its end."""
    assert seg.end_position is not None
    data = store.get(seg.log_key, seg.start_position, seg.end_position)
    if len(data) < seg.end_position - seg.start_position:
        raise TruncatedSegmentError(
            f"combined object ends inside the entry [{seg.start_position}, {seg.end_position}) of offsets "
            f"{seg.start_offset}..{seg.end_offset}: {seg.end_position - seg.start_position - len(data)} bytes missing",
            obj=store.object_uri(seg.log_key),
            position=seg.start_position + len(data),
        )
    return data


def _segment_tail(store: ObjectStore, seg: SegmentRef, from_offset: int) -> tuple[bytes | memoryview, int]:
    """(bytes, their position in the object): from the batch of `from_offset`'s offset index entry on."""
    if seg.wal:
        return slice_bytes(store, seg), seg.start_position
    if from_offset <= seg.start_offset or seg.offset_index_key is None:
        return store.view(seg.log_key), 0
    entries = parse_part(store, seg.offset_index_key, ObjectSuffix.OFFSET_INDEX,
                         lambda data, obj: read_offset_index(data, seg.start_offset, obj=obj))
    _offset, position = offset_index_lookup(entries, seg.start_offset, from_offset)
    return store.view(seg.log_key, position), position


def unstable_transactions(store: ObjectStore, segments: Sequence[SegmentRef]) -> dict[int, int]:
    """Transactions with data in the log but no marker yet (read_committed stops at them)."""
    if any(seg.wal for seg in segments):
        return log_transactions(store, segments)[1]
    return _tier_open_transactions(store, segments)


class TxnBatch(NamedTuple):
    """What the open-transaction fold (`open_transactions`) needs of a transactional batch's header."""

    base_offset: int
    last_offset: int
    producer_id: int
    is_control: bool
    is_transactional: bool = True


def _tier_open_transactions(store: ObjectStore, segments: Iterable[SegmentRef]) -> dict[int, int]:
    """`open_transactions` over the tier's batch headers: which transactions are open needs no records, and the
    headers are walked by the scan's kernel (`batch_fields`), so only transactional batches reach Python."""
    return open_transactions(b for seg in segments for b in _transactional_batches(store, seg))


_HEADER_MEMO: contextvars.ContextVar[dict[tuple[str, SegmentRef], list[TxnBatch]] | None] = contextvars.ContextVar(
    "kcompact_transactional_batches", default=None)


@contextlib.contextmanager
def transactional_batches_read_once() -> Iterator[None]:
    """Within the block, each piece's transactional batches are read from the store once, however many passes ask:
    a table run finds the last stable offset in its plan, then the open and aborted transactions of its read,
    over the same segments. Pieces are immutable objects under their keys (a rewrite gets a new key), and the
    memo holds a few numbers per transactional batch, for the block only."""
    token = _HEADER_MEMO.set({})
    try:
        yield
    finally:
        _HEADER_MEMO.reset(token)


def _transactional_batches(store: ObjectStore, seg: SegmentRef) -> list[TxnBatch]:
    """Every transactional batch of a piece, in file order: a tier segment's walked by the kernel, a WAL slice's
    checked as every WAL read checks it."""
    memo = _HEADER_MEMO.get()
    if memo is None:
        return _read_transactional_batches(store, seg)
    found = memo.get((store.uri, seg))
    if found is None:
        found = memo[(store.uri, seg)] = _read_transactional_batches(store, seg)
    return found


def _read_transactional_batches(store: ObjectStore, seg: SegmentRef) -> list[TxnBatch]:
    uri = store.object_uri(seg.log_key)
    if seg.wal:
        data = slice_bytes(store, seg)
        wal_headers(data, seg, uri)
        return [TxnBatch(h.base_offset, h.base_offset + h.last_offset_delta, h.producer_id, h.is_control)
                for h in iter_batch_headers(data, obj=uri) if h.is_transactional]
    fields = batch_fields(store.view(seg.log_key), obj=uri)
    txn = fields[(fields[:, BATCH_ATTRIBUTES] & TRANSACTIONAL_FLAG_MASK) != 0]
    return [TxnBatch(base, base + delta, producer, bool(attributes & CONTROL_FLAG_MASK)) for base, delta, producer,
            attributes in txn[:, [BATCH_BASE_OFFSET, BATCH_LAST_OFFSET_DELTA, BATCH_PRODUCER_ID,
                                  BATCH_ATTRIBUTES]].tolist()]


def _within(seg: SegmentRef, batches: Iterable[TxnBatch]) -> Iterator[TxnBatch]:
    """The batches that overlap the piece's offsets (a WAL slice's object may hold more on either side)."""
    for b in batches:
        if b.last_offset < seg.start_offset:
            continue
        if b.base_offset > seg.end_offset:
            break
        yield b


def last_stable_offset(store: ObjectStore, segments: Sequence[SegmentRef], from_offset: int = 0) -> int:
    """The log's last stable offset: its end, or the first offset of a transaction still open there.

    Reads batch headers only (an open transaction needs no records), of the tier segments and WAL slices from
    `from_offset`'s on: a transaction that began below an earlier LSO had its marker by then. 0 for an empty log.
    """
    pieces = sorted(segments, key=lambda s: s.start_offset)
    open_txns = open_transactions(b for seg in pieces if seg.end_offset >= from_offset
                                  for b in _within(seg, _transactional_batches(store, seg)))
    return _stable_offset(pieces, open_txns)


def _stable_offset(segments: Iterable[SegmentRef], open_txns: Mapping[int, int]) -> int:
    """The last stable offset of the log of `segments` whose transactions `open_txns` (producerId -> first offset)
    are still open at its end: the earliest of those first offsets, else the log end (0 for an empty log)."""
    end = max((seg.end_offset + 1 for seg in segments), default=0)
    return min([end, *open_txns.values()])


def _is_abort(record: Record) -> bool:
    return parse_control_record(record).type is ControlType.ABORT


def log_transactions(
    store: ObjectStore, segments: Sequence[SegmentRef]
) -> tuple[dict[int, list[tuple[int, int]]], dict[int, int]]:
    """(aborted ranges, still-open transactions) of a log of tier segments followed by WAL slices.

    The tier's come from its indexes and a replay; the WAL's from its markers, carrying what is open at the
    tier's end: an ABORT of producer P aborts P's transaction from its first offset (maybe in the tier) to it.
    """
    tier = [s for s in segments if not s.wal]
    aborted = _indexed_aborts(store, tier)
    open_txns = _tier_open_transactions(store, tier)
    for seg in sorted((s for s in segments if s.wal), key=lambda s: s.start_offset):
        uri = store.object_uri(seg.log_key)
        data = slice_bytes(store, seg)
        wal_headers(data, seg, uri)
        try:
            for _pos, batch in iter_batches(data, obj=uri):
                if batch.base_offset > seg.end_offset:
                    break
                if batch.last_offset < seg.start_offset or not batch.is_transactional:
                    continue
                if not batch.is_control:
                    open_txns.setdefault(batch.producer_id, batch.base_offset)
                    continue
                first = open_txns.pop(batch.producer_id, None)
                if first is not None and batch.records and _is_abort(batch.records[0]):
                    aborted.setdefault(batch.producer_id, []).append((first, batch.base_offset))
        except CorruptInputError as exc:
            raise exc.located(uri, seg.start_position) from None
    return aborted, open_txns


def consumer_records(
    store: ObjectStore,
    segments: Sequence[SegmentRef],
    *,
    from_offset: int = 0,
    isolation: Isolation = Isolation.READ_UNCOMMITTED,
) -> Iterator[Record]:
    """Every record a consumer starting at `from_offset` would receive, in offset order (read_committed: below the
    log's last stable offset)."""
    read = consumer_read(store, segments, from_offset, isolation)
    for seg in consumer_pieces(segments, read):
        yield from segment_records(store, seg, read)


def consumer_batches(
    store: ObjectStore,
    segments: Sequence[SegmentRef],
    *,
    from_offset: int = 0,
    isolation: Isolation = Isolation.READ_UNCOMMITTED,
) -> Iterator[pa.RecordBatch]:
    """`consumer_records` as Arrow batches (`segment_batches`), in offset order."""
    read = consumer_read(store, segments, from_offset, isolation)
    for seg in consumer_pieces(segments, read):
        yield from segment_batches(store, seg, read)


def consumer_read(store: ObjectStore, segments: Sequence[SegmentRef], from_offset: int, isolation: Isolation, *,
                  stable_offset: int | None = None) -> ConsumerRead:
    """How a consumer from `from_offset` reads the log of `segments` (all of it: a transaction still open that began
    below `from_offset` holds the read back too). read_committed stops at the log's last stable offset and skips its
    aborted transactions, all found once for all its pieces (`log_transactions`); read_uncommitted reads to the end.

    `stable_offset`: the log's last stable offset, when the caller found it already (a table run's plan, with
    `last_stable_offset`); then only the pieces from `from_offset`'s on are read, for their aborted transactions
    (one with records there has its marker there too), rather than the whole log's batch headers.
    """
    if isolation is not Isolation.READ_COMMITTED:
        return ConsumerRead(from_offset, isolation)
    if stable_offset is not None:
        aborted, open_txns = log_transactions(store, [seg for seg in segments if seg.end_offset >= from_offset])
        return ConsumerRead(from_offset, isolation, aborted, open_txns, stable_offset)
    aborted, open_txns = log_transactions(store, segments)
    return ConsumerRead(from_offset, isolation, aborted, open_txns, _stable_offset(segments, open_txns))


def consumer_pieces(segments: Sequence[SegmentRef], read: ConsumerRead) -> list[SegmentRef]:
    """The pieces of the log `read` reads (from its `from_offset`, below its `stable_offset`), in offset order."""
    return [seg for seg in sorted(segments, key=lambda s: s.start_offset)
            if seg.end_offset >= read.from_offset and read.last_offset(seg) >= seg.start_offset]


def row_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """`kcompact read`'s JSON line for a row of a `consumer_batches` batch (`RecordBatch.to_pylist()`): key, value and
    header values base64, null stays null."""

    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    headers = [{"key": h["key"], "value": b64(h["value"])} for h in row["headers"]]
    return {"offset": row["offset"], "timestamp": row["timestamp"], "key": b64(row["key"]), "value": b64(row["value"]),
            "headers": headers}
