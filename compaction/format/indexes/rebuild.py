"""Rebuild a segment's offset, time and transaction indexes from its `.log`, as Kafka would write them.

The rebuild replays `LogSegment.append` (and `LogSegment.recover`, which is the same rule batch by batch),
then the inactive-segment step `onBecomeInactiveSegment`. Pure and deterministic: the same inputs always
give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from compaction.errors import CorruptBatchError, CorruptInputError
from compaction.format.batch import (
    CONTROL_FLAG_MASK,
    INT32_MAX,
    NO_TIMESTAMP,
    TRANSACTIONAL_FLAG_MASK,
    decode_batch,
)
from compaction.format.control import ControlType, parse_control_record
from compaction.format.indexes.entries import Buffer
from compaction.format.indexes.index_kernels import index_entries
from compaction.format.indexes.offset_index import OffsetIndexEntry, encode_offset_index
from compaction.format.indexes.time_index import TimeIndexEntry, encode_time_index
from compaction.format.indexes.txn_index import ABORTED_TXN_CURRENT_VERSION, AbortedTxn, encode_txn_index
from compaction.format.scan_kernels import BATCH_ATTRIBUTES, BATCH_POS, N_BATCH_FIELDS, walk_batches
from compaction.format.segment import BatchHeader, iter_batch_headers

DEFAULT_INDEX_INTERVAL_BYTES = 4096


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
    fast = _compiled(log_bytes, base_offset, index_interval_bytes, txn_first_offsets) if chunks is None else None
    if fast is not None:
        return fast
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


def build_indexes_of(pieces: Sequence[Buffer], base_offset: int,
                     index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES, obj: str | None = None
                     ) -> SegmentIndexes:
    """`build_indexes` of the log that is the concatenation of `pieces` (each whole batches, one append per batch),
    without concatenating them where the numba walk applies: each piece is walked where it lies and its batches'
    positions moved by the bytes before it. A rewrite whose output was written piece by piece (`rewrite_group`'s
    `on_written`) need not build the whole log in memory again for its indexes: for P6's hot partition, a 236 MiB
    join of fresh memory took 0.85 s of the chunk that ends the run. Otherwise (a transactional or control batch, a
    malformed piece) the pieces are joined and `build_indexes` decides, naming any error's byte position in the
    whole log."""
    if len(pieces) == 1:
        return build_indexes(pieces[0], base_offset, index_interval_bytes, obj=obj)
    walked, start = [], 0
    for piece in pieces:
        fields, status, _position = walk_batches(np.frombuffer(piece, np.uint8))
        if status:
            break
        fields[:, BATCH_POS] += start
        walked.append(fields)
        start += len(piece)
    else:
        fields = np.concatenate(walked) if walked else np.empty((0, N_BATCH_FIELDS), np.int64)
        fast = _indexed(fields, base_offset, index_interval_bytes, None)
        if fast is not None:
            return fast
    return build_indexes(b"".join(pieces), base_offset, index_interval_bytes, obj=obj)


def _compiled(log_bytes: Buffer, base_offset: int, interval: int, carried: Mapping[int, int] | None
              ) -> SegmentIndexes | None:
    """`build_indexes` of a log of one append per batch, none transactional or control (no transaction index to
    build), by the numba walk (`index_kernels`); None for any other log, or one the rule rejects (the reference
    path then builds the indexes or names the error). Equal to the reference path (tested on generated logs)."""
    data = np.frombuffer(log_bytes, np.uint8)
    fields, status, _position = walk_batches(data)
    return None if status else _indexed(fields, base_offset, interval, carried)


def _indexed(fields: np.ndarray, base_offset: int, interval: int, carried: Mapping[int, int] | None
             ) -> SegmentIndexes | None:
    """`_compiled` from the log's batch fields (`walk_batches` rows)."""
    if (fields[:, BATCH_ATTRIBUTES] & (TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK)).any():
        return None
    status, offsets, times = index_entries(fields, base_offset, interval)
    if status:
        return None
    offset_index = np.empty(len(offsets), _OFFSET_ENTRY)
    offset_index["relative_offset"], offset_index["position"] = offsets[:, 0], offsets[:, 1]
    time_index = np.empty(len(times), _TIME_ENTRY)
    time_index["timestamp"], time_index["relative_offset"] = times[:, 0], times[:, 1]
    return SegmentIndexes(offset_index.tobytes(), time_index.tobytes(), None, open_txns=dict(carried or {}))


_OFFSET_ENTRY = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
_TIME_ENTRY = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])
"""The entries' layouts (`offset_index`, `time_index`), as numpy records."""


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
