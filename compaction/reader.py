"""What a consumer would receive from a partition's live remote segments, in offset order.

Shared by `kcompact read` (no Spark needed) and `compaction.read_partition` (one Spark task per segment),
so both answer the same question the same way:

- control records are never emitted;
- read_uncommitted (Kafka's default) returns every data record;
- read_committed drops records of aborted transactions, identified as the consumer does, from the
  aborted-transaction index: a transactional batch of producer P whose offsets fall within an
  AbortedTxn(P, firstOffset .. lastOffset = the ABORT marker) is skipped. Transactions still open at the
  end of the tier (no marker yet) are not returned either, since a read_committed consumer stops at the LSO.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from compaction.errors import ConfigError, CorruptInputError, CorruptMetadataError
from compaction.format.batch import Record, RecordBatch
from compaction.format.indexes import AbortedTxn, offset_index_lookup, read_offset_index, read_txn_index
from compaction.format.segment import iter_batches
from compaction.metadata import ObjectSuffix, SegmentMetadata
from compaction.storage.base import ObjectStore


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
class SegmentRef:
    """The small picklable description of one live segment that a reader (or a Spark task) needs."""

    start_offset: int
    end_offset: int
    log_key: str
    txn_index_key: str | None
    offset_index_key: str | None = None


def segment_ref(segment: SegmentMetadata) -> SegmentRef:
    """The reader's view of a metadata row."""
    log_key = segment.object_key(ObjectSuffix.LOG)
    if log_key is None:
        raise CorruptMetadataError(f"segment {segment.segment_id} has no .log object key")
    return SegmentRef(segment.start_offset, segment.end_offset, log_key, segment.object_key(ObjectSuffix.TXN_INDEX),
                      segment.object_key(ObjectSuffix.OFFSET_INDEX))


def aborted_ranges(store: ObjectStore, segments: Sequence[SegmentRef]) -> dict[int, list[tuple[int, int]]]:
    """producerId -> [(firstOffset, lastOffset)] of every aborted transaction in the tier, deduplicated."""
    seen: dict[tuple[int, int], AbortedTxn] = {}
    for seg in segments:
        if seg.txn_index_key is None:
            continue
        for txn in read_txn_index(store.get(seg.txn_index_key), obj=store.object_uri(seg.txn_index_key)):
            seen.setdefault((txn.producer_id, txn.first_offset), txn)
    ranges: dict[int, list[tuple[int, int]]] = {}
    for txn in seen.values():
        ranges.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
    return ranges


def _is_aborted(batch: RecordBatch, aborted: dict[int, list[tuple[int, int]]]) -> bool:
    return batch.is_transactional and any(
        first <= batch.base_offset <= last for first, last in aborted.get(batch.producer_id, ())
    )


def open_transactions(batches: Iterable[RecordBatch]) -> dict[int, int]:
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


def segment_records(
    store: ObjectStore,
    seg: SegmentRef,
    *,
    from_offset: int = 0,
    isolation: Isolation = Isolation.READ_UNCOMMITTED,
    aborted: dict[int, list[tuple[int, int]]] | None = None,
    unstable_from: dict[int, int] | None = None,
) -> Iterator[Record]:
    """The records of one segment a consumer would receive (see the module docstring).

    Reading from an offset inside the segment fetches only the bytes from the offset index's entry for it on
    (a ranged GET, as a broker serves a fetch); errors still name the position in the whole object.
    """
    uri = store.object_uri(seg.log_key)
    data, position = _segment_tail(store, seg, from_offset)
    try:
        for _pos, batch in iter_batches(data, obj=uri):
            if batch.is_control or batch.last_offset < from_offset:
                continue
            if isolation is Isolation.READ_COMMITTED and batch.is_transactional:
                if _is_aborted(batch, aborted or {}):
                    continue
                first_open = (unstable_from or {}).get(batch.producer_id)
                if first_open is not None and batch.base_offset >= first_open:
                    continue
            yield from (r for r in batch.records if r.offset >= from_offset)
    except CorruptInputError as exc:  # positions in the fetched tail -> positions in the object
        raise exc.located(uri, position) from None


def _segment_tail(store: ObjectStore, seg: SegmentRef, from_offset: int) -> tuple[bytes, int]:
    """(bytes, their position in the object): from the batch of `from_offset`'s offset index entry on."""
    if from_offset <= seg.start_offset or seg.offset_index_key is None:
        return store.get(seg.log_key), 0
    index = store.get(seg.offset_index_key)
    entries = read_offset_index(index, seg.start_offset, obj=store.object_uri(seg.offset_index_key))
    _offset, position = offset_index_lookup(entries, seg.start_offset, from_offset)
    return store.get(seg.log_key, position), position


def unstable_transactions(store: ObjectStore, segments: Sequence[SegmentRef]) -> dict[int, int]:
    """Transactions with data in the tier but no marker yet (read_committed stops at them)."""

    def batches() -> Iterator[RecordBatch]:
        for seg in segments:
            for _pos, batch in iter_batches(store.get(seg.log_key), obj=store.object_uri(seg.log_key)):
                yield batch

    return open_transactions(batches())


def record_json(record: Record) -> dict[str, Any]:
    """`kcompact read`'s JSON line: key, value and header values base64, null stays null."""

    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    return {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": b64(record.key),
        "value": b64(record.value),
        "headers": [{"key": h.key, "value": b64(h.value)} for h in record.headers],
    }


def consumer_records(
    store: ObjectStore,
    segments: Sequence[SegmentRef],
    *,
    from_offset: int = 0,
    isolation: Isolation = Isolation.READ_UNCOMMITTED,
) -> Iterator[Record]:
    """Every record a consumer starting at `from_offset` would receive, in offset order."""
    aborted: dict[int, list[tuple[int, int]]] = {}
    unstable: dict[int, int] = {}
    if isolation is Isolation.READ_COMMITTED:
        aborted = aborted_ranges(store, segments)
        unstable = unstable_transactions(store, segments)
    for seg in sorted(segments, key=lambda s: s.start_offset):
        if seg.end_offset < from_offset:
            continue
        yield from segment_records(
            store, seg, from_offset=from_offset, isolation=isolation, aborted=aborted, unstable_from=unstable
        )
