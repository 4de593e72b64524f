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

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from compaction.errors import CorruptBatchError
from compaction.format.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    RECORDS_OFFSET,
    BatchFields,
    TimestampType,
    crc32c,
    frame_batch,
    frame_into,
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
    # an uncompressed section is written where the rebuilt batch holds it, behind room for its header
    at = RECORD_BATCH_OVERHEAD if codec is Codec.NONE else 0
    out = np.empty(at + len(src) + _MAX_GROWTH_PER_RECORD * header.records_count, dtype=np.uint8)
    log_append_time = header.max_timestamp if header.is_log_append_time else _FIRST_KEPT
    status, written, kept, max_ts, base = _filter_section(
        src, header.records_count, header.base_offset, winners, retain_deletes, header.base_timestamp,
        log_append_time, _FIRST_KEPT if delete_horizon_ms is None else delete_horizon_ms, out[at:],
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
    fields: BatchFields = {
        "base_offset": header.base_offset, "partition_leader_epoch": header.partition_leader_epoch,
        "attributes": attributes, "last_offset_delta": header.last_offset_delta, "base_timestamp": int(base),
        "max_timestamp": max_timestamp, "producer_id": header.producer_id, "producer_epoch": header.producer_epoch,
        "base_sequence": header.base_sequence, "records_count": int(kept)}
    if codec is Codec.NONE:  # framed where it lies: one copy, to the batch's own size
        frame_into(out.data, int(written), **fields)
        batch = out[: RECORD_BATCH_OVERHEAD + written].tobytes()
    else:
        batch = frame_batch(compress(codec, out[:written].tobytes()), **fields)
    return RebuiltBatch(batch, int(kept), max_timestamp)


def _records_section(data: memoryview, header: BatchHeader, obj: str) -> np.ndarray:
    """The batch's records section, decompressed."""
    section = data[header.position + RECORDS_OFFSET : header.position + header.size]
    try:
        raw = section if header.codec is Codec.NONE else decompress(header.codec, section)
    except CorruptBatchError as exc:
        raise CorruptBatchError(exc.detail, obj=obj, position=header.position + RECORDS_OFFSET) from None
    return np.frombuffer(raw, dtype=np.uint8)


# --- a segment of plain batches in one call ----------------------------------------------------------------------

(
    PLAIN_KEYLESS,
    PLAIN_TOMBSTONES_RETAINED,
    PLAIN_TOMBSTONES_REMOVED,
    PLAIN_COPIED,
    PLAIN_REBUILT,
    PLAIN_DROPPED,
    PLAIN_RECORDS_READ,
    PLAIN_RECORDS_WRITTEN,
    PLAIN_MAX_TIMESTAMP,
    PLAIN_FIRST_MAX_TIMESTAMP,
) = range(10)
N_PLAIN_COUNTS = 10
_INT64_MAX = np.iinfo(np.int64).max


@kernel(nogil=True)
def _put_be(out: np.ndarray, pos: int, value: int, n: int) -> None:
    for i in range(n):
        out[pos + n - 1 - i] = np.uint8((value >> (8 * i)) & 0xFF)


@kernel(nogil=True)
def _plain_counts(src: np.ndarray, count: int, base_offset: int, winners: np.ndarray, slot: int
                  ) -> tuple[Any, Any, Any, Any, Any, Any]:
    """One pass over a records section: (status, keyless, keyed tombstones, winners, winning tombstones, the
    winner slot after it). status 0 = ok, else the section needs the reference path: a record that
    `scan_kernels.decode_record_ranges` rejects (every field, headers included, within the record, which ends
    where its last header does), or offsets that do not increase."""
    end = src.shape[0]
    pos = 0
    keyless = tombstones = winning = winning_tombstones = 0
    n = winners.shape[0]
    previous = base_offset - 1
    for _ in range(count):
        length, pos = varint_at(src, pos, end, 5)
        if pos < 0 or length < 1 or pos + length > end:
            return 1, 0, 0, 0, 0, slot
        body_end = pos + length
        _ts_delta, rest = varint_at(src, pos + 1, body_end, 10)
        if rest < 0:
            return 1, 0, 0, 0, 0, slot
        offset_delta, p = varint_at(src, rest, body_end, 5)
        if p < 0:
            return 1, 0, 0, 0, 0, slot
        key_length, p = varint_at(src, p, body_end, 5)
        if p < 0 or p + max(key_length, 0) > body_end:
            return 1, 0, 0, 0, 0, slot
        value_length, p = varint_at(src, p + max(key_length, 0), body_end, 5)
        if p < 0 or p + max(value_length, 0) > body_end:
            return 1, 0, 0, 0, 0, slot
        headers, p = varint_at(src, p + max(value_length, 0), body_end, 5)
        if p < 0 or headers < 0 or headers > body_end - p:
            return 1, 0, 0, 0, 0, slot
        for _h in range(headers):
            header_key, p = varint_at(src, p, body_end, 5)
            if p < 0 or header_key < 0 or p + header_key > body_end:
                return 1, 0, 0, 0, 0, slot
            header_value, p = varint_at(src, p + header_key, body_end, 5)
            if p < 0 or p + max(header_value, 0) > body_end:
                return 1, 0, 0, 0, 0, slot
            p += max(header_value, 0)
        if p != body_end:
            return 1, 0, 0, 0, 0, slot
        pos = body_end
        offset = base_offset + offset_delta
        if offset <= previous:  # offsets not increasing within the batch: leave it to the reference path
            return 1, 0, 0, 0, 0, slot
        previous = offset
        while slot < n and winners[slot] < offset:
            slot += 1
        if key_length < 0:
            keyless += 1
            continue
        wins = slot < n and winners[slot] == offset
        if value_length < 0:
            tombstones += 1
        if wins:
            winning += 1
            if value_length < 0:
                winning_tombstones += 1
    if pos != end:
        return 1, 0, 0, 0, 0, slot
    return 0, keyless, tombstones, winning, winning_tombstones, slot


@kernel(nogil=True)
def _rewrite_plain(data: np.ndarray, fields: np.ndarray, winners: np.ndarray, floor: int, now_ms: int,
                   delete_retention_ms: int, out: np.ndarray, counts: np.ndarray, framed: np.ndarray
                   ) -> tuple[Any, Any, Any]:
    """The rewrite of a segment's batches (`fields`: `scan_kernels.walk_batches` rows), every one uncompressed,
    neither transactional nor control, none an active producer's last or the round's last (their retention is
    DELETE_EMPTY: the caller checks): the per-batch rule of `group._GroupRewriter._data_batch` with
    `_filter_section`'s rebuild, batch after batch into `out`. Rebuilt batches are written with a zero CRC, their
    positions in `framed` (the caller computes each CRC-32C). Returns (status, bytes written, rebuilt batches);
    status 0 = ok, else (offsets out of order, a malformed section) nothing is to be used: the reference path
    names the error. `counts` (zeroed, `N_PLAIN_COUNTS`) gets the `PLAIN_*` totals."""
    w = 0
    rebuilt = 0
    slot = 0
    counts[PLAIN_MAX_TIMESTAMP] = -1
    counts[PLAIN_FIRST_MAX_TIMESTAMP] = -1
    emitted = False
    for i in range(fields.shape[0]):
        pos, size, base_offset = fields[i, 0], fields[i, 1], fields[i, 2]
        attributes, last_delta, base_ts, max_ts = fields[i, 5], fields[i, 6], fields[i, 7], fields[i, 8]
        records = fields[i, 12]
        if base_offset < floor or last_delta < 0:
            return 1, 0, 0
        floor = base_offset + last_delta + 1
        src = data[pos + 61 : pos + size]
        status, keyless, tombstones, winning, winning_tombstones, slot = _plain_counts(
            src, records, base_offset, winners, slot)
        if status:
            return 1, 0, 0
        has_horizon = (attributes & 0x40) != 0
        retain_deletes = not has_horizon or now_ms < base_ts
        kept_tombstones = winning_tombstones if retain_deletes else 0
        kept = winning - winning_tombstones + kept_tombstones
        counts[PLAIN_RECORDS_READ] += records
        counts[PLAIN_KEYLESS] += keyless
        counts[PLAIN_TOMBSTONES_RETAINED] += kept_tombstones
        counts[PLAIN_TOMBSTONES_REMOVED] += tombstones - kept_tombstones
        sets_horizon = kept_tombstones > 0 and not has_horizon
        if kept == 0:
            counts[PLAIN_DROPPED] += 1
            continue
        if kept == records and not sets_horizon:
            out[w : w + size] = data[pos : pos + size]
            w += size
            batch_max = max_ts
            counts[PLAIN_COPIED] += 1
        else:
            horizon = _FIRST_KEPT
            if has_horizon:
                horizon = base_ts
            elif kept_tombstones > 0 and now_ms <= _INT64_MAX - delete_retention_ms:
                horizon = now_ms + delete_retention_ms
            lat = (attributes & 0x08) != 0
            status, section, got, kept_max, base = _filter_section(
                src, records, base_offset, winners, retain_deletes, base_ts, max_ts if lat else _FIRST_KEPT,
                horizon, out[w + 61:])
            if status or got != kept:
                return 1, 0, 0
            batch_max = max_ts if lat else kept_max
            _put_be(out, w, base_offset, 8)
            _put_be(out, w + 8, 49 + section, 4)
            _put_be(out, w + 12, fields[i, 3], 4)  # partition leader epoch
            out[w + 16] = 2
            _put_be(out, w + 17, 0, 4)  # the CRC, computed by the caller
            _put_be(out, w + 21, (0x08 if lat else 0) | (0x40 if horizon != _FIRST_KEPT else 0), 2)
            _put_be(out, w + 23, last_delta, 4)
            _put_be(out, w + 27, base, 8)
            _put_be(out, w + 35, batch_max, 8)
            _put_be(out, w + 43, fields[i, 9], 8)  # producer id, epoch, base sequence
            _put_be(out, w + 51, fields[i, 10], 2)
            _put_be(out, w + 53, fields[i, 11], 4)
            _put_be(out, w + 57, kept, 4)
            framed[rebuilt] = w
            rebuilt += 1
            w += 61 + section
            counts[PLAIN_REBUILT] += 1
        counts[PLAIN_RECORDS_WRITTEN] += kept
        if not emitted:
            counts[PLAIN_FIRST_MAX_TIMESTAMP] = batch_max
            emitted = True
        counts[PLAIN_MAX_TIMESTAMP] = max(counts[PLAIN_MAX_TIMESTAMP], batch_max)
    return 0, w, rebuilt


@dataclass(frozen=True)
class PlainRewrite:
    """A segment's plain batches rewritten by `rewrite_plain`: the bytes written (a view of the kernel's own output
    buffer, never of the input: not copied again), the `PLAIN_*` counts, and the offset after its last batch."""

    data: memoryview
    counts: np.ndarray
    next_offset: int


def rewrite_plain(data: memoryview, fields: np.ndarray, winners: np.ndarray, *, floor: int, now_ms: int,
                  delete_retention_ms: int) -> PlainRewrite | None:
    """`_rewrite_plain` over a segment whose batches (`fields`) the caller found plain, each rebuilt batch then
    given its CRC-32C; None when the kernel leaves the segment to the reference path (which raises)."""
    source = np.frombuffer(data, np.uint8)
    # a batch holds no more records than bytes, whatever its (unchecked, when its scan's CRC check is trusted)
    # record count says: a count flipped to billions must reach the kernel's error, not a 20 GiB buffer
    records = int(np.minimum(fields[:, 12], fields[:, 1]).sum())
    out = np.empty(len(source) + _MAX_GROWTH_PER_RECORD * records, np.uint8)
    counts = np.zeros(N_PLAIN_COUNTS, np.int64)
    framed = np.empty(len(fields), np.int64)
    status, written, rebuilt = _rewrite_plain(source, fields, winners, floor, now_ms, delete_retention_ms, out,
                                              counts, framed)
    if status:
        return None
    view = out.data
    for at in framed[:rebuilt].tolist():
        end = at + 12 + int.from_bytes(view[at + 8 : at + 12], "big")
        struct.pack_into(">I", view, at + CRC_OFFSET, crc32c(view[at + ATTRIBUTES_OFFSET : end]))
    last = fields[-1]
    return PlainRewrite(view[:written], counts, int(last[2] + last[6] + 1))
