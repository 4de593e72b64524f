"""Rebuilding a data batch without a Python loop per record: a numba kernel over its records section.

A rebuilt record differs from the original only in its first three fields: the length prefix, the attributes
(written as 0) and the timestamp delta, re-expressed against the new base timestamp (the delete horizon, or
the first retained record's timestamp). Everything after them (offset delta, key, value, headers) is copied
byte for byte: the base offset is kept, so offset deltas stay valid. The kernel walks the records section
once, and the sorted winners beside it (a batch's offsets increase, so each record's lookup starts where the
previous one's ended instead of searching every winner), keeps a record iff it is keyed, its offset is a winner
and it has a value or the batch retains deletes — the vectorized form of
`strategies.retention.should_retain_record` for a data batch that is not discarded — and writes the kept records
re-encoded. The records section is then compressed with the batch's codec and given a fresh header and CRC.

The readable reference is `rebuild.rebuild_batch` over `decode_batch`; the two give the same bytes
(property-tested), as every encoder involved is deterministic and Kafka writes minimal varints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from compaction.errors import CorruptBatchError
from compaction.format.batch import (
    RECORDS_OFFSET,
    TimestampType,
    frame_batch,
    make_attributes,
)
from compaction.format.codecs import Codec, compress, decompress
from compaction.format.segment import BatchHeader
from compaction.format.varint_kernels import put_varint, varint_at, varint_size
from compaction.kernels import kernel

_FIRST_KEPT = np.iinfo(np.int64).min
"""Sentinel for "no base timestamp given": use the first retained record's timestamp."""
_MAX_GROWTH_PER_RECORD = 4 + 9
"""A re-encoded record grows by at most 4 bytes of length prefix and 9 of timestamp delta."""


@kernel(nogil=True)
def _filter_section(
    src: np.ndarray,
    count: int,
    base_offset: int,
    winners: np.ndarray,
    retain_deletes: bool,
    base_timestamp: int,
    log_append_time: int,
    new_base_timestamp: int,
    out: np.ndarray,
) -> tuple[Any, Any, Any, Any, Any]:
    """Write the retained records of `src` into `out`; returns (status, bytes written, records kept,
    max kept timestamp, base timestamp used). status 0 = ok, else the position of a malformed record."""
    end = src.shape[0]
    pos = 0
    written = 0
    kept = 0
    max_ts = _FIRST_KEPT
    base = new_base_timestamp
    n = winners.shape[0]
    slot = np.searchsorted(winners, base_offset)  # the first winner at or after each record, walked forward
    previous = base_offset - 1
    for _ in range(count):
        start = pos
        length, pos = varint_at(src, pos, end, 5)
        if pos < 0 or length < 1 or pos + length > end:
            return start + 1, 0, 0, 0, 0
        body_end = pos + length
        ts_delta, rest = varint_at(src, pos + 1, body_end, 10)
        if rest < 0:
            return start + 1, 0, 0, 0, 0
        offset_delta, p = varint_at(src, rest, body_end, 5)
        if p < 0:
            return start + 1, 0, 0, 0, 0
        key_length, p = varint_at(src, p, body_end, 5)
        if p < 0 or p + max(key_length, 0) > body_end:
            return start + 1, 0, 0, 0, 0
        value_length, p = varint_at(src, p + max(key_length, 0), body_end, 5)
        if p < 0:
            return start + 1, 0, 0, 0, 0
        pos = body_end
        offset = base_offset + offset_delta
        if offset <= previous:  # offset deltas not increasing (Kafka never writes them): look it up afresh
            slot = np.searchsorted(winners, offset)
        while slot < n and winners[slot] < offset:
            slot += 1
        previous = offset
        wins = slot < n and winners[slot] == offset
        if key_length < 0 or not wins or (value_length < 0 and not retain_deletes):
            continue
        timestamp = log_append_time if log_append_time != _FIRST_KEPT else base_timestamp + ts_delta
        if base == _FIRST_KEPT:
            base = timestamp
        delta = timestamp - base
        tail = body_end - rest
        written = put_varint(out, written, 1 + varint_size(delta) + tail)
        out[written] = 0
        written = put_varint(out, written + 1, delta)
        out[written : written + tail] = src[rest:body_end]
        written += tail
        kept += 1
        max_ts = max(max_ts, timestamp)
    if pos != end:
        return pos + 1, 0, 0, 0, 0
    return 0, written, kept, max_ts, base


@dataclass(frozen=True)
class RebuiltBatch:
    """A rebuilt data batch: its bytes, retained record count and maxTimestamp."""

    data: bytes
    records: int
    max_timestamp: int


def rebuild_data_batch(
    data: memoryview,
    header: BatchHeader,
    winners: np.ndarray,
    *,
    retain_deletes: bool,
    delete_horizon_ms: int | None,
    obj: str,
) -> RebuiltBatch:
    """Rebuild the data batch at `header` keeping its keyed winning records (tombstones iff `retain_deletes`).

    `winners`: sorted int64 winners (at least those within the batch). `delete_horizon_ms`: the horizon the
    rebuilt batch carries (see `strategies.retention.rebuilt_delete_horizon`). The caller knows at least one
    record is kept (ValueError otherwise). Raises CorruptBatchError naming `obj` and the batch position for a
    malformed section.
    """
    codec = header.codec
    src = _records_section(data, header, obj)
    out = np.empty(len(src) + _MAX_GROWTH_PER_RECORD * header.records_count, dtype=np.uint8)
    log_append_time = header.max_timestamp if header.is_log_append_time else _FIRST_KEPT
    status, written, kept, max_ts, base = _filter_section(
        src, header.records_count, header.base_offset, winners, retain_deletes, header.base_timestamp,
        log_append_time, _FIRST_KEPT if delete_horizon_ms is None else delete_horizon_ms, out,
    )
    if status:
        raise CorruptBatchError(
            f"malformed records section (record near byte {int(status) - 1} of the section)",
            obj=obj,
            position=header.position + RECORDS_OFFSET,
        )
    if kept == 0:
        raise ValueError(f"the batch at byte {header.position} keeps no record: empty or drop it instead")
    max_timestamp = header.max_timestamp if header.is_log_append_time else int(max_ts)
    timestamp_type = TimestampType.LOG_APPEND_TIME if header.is_log_append_time else TimestampType.CREATE_TIME
    attributes = make_attributes(codec, timestamp_type, header.is_transactional, False, delete_horizon_ms is not None)
    payload = compress(codec, out[:written].tobytes())
    batch = frame_batch(
        payload,
        base_offset=header.base_offset,
        partition_leader_epoch=header.partition_leader_epoch,
        attributes=attributes,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=int(base),
        max_timestamp=max_timestamp,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        records_count=int(kept),
    )
    return RebuiltBatch(batch, int(kept), max_timestamp)


def _records_section(data: memoryview, header: BatchHeader, obj: str) -> np.ndarray:
    """The batch's records section, decompressed."""
    section = data[header.position + RECORDS_OFFSET : header.position + header.size]
    try:
        raw = section if header.codec is Codec.NONE else decompress(header.codec, section)
    except CorruptBatchError as exc:
        raise CorruptBatchError(exc.detail, obj=obj, position=header.position + RECORDS_OFFSET) from None
    return np.frombuffer(raw, dtype=np.uint8)
