"""Columnar scan: one segment image -> Arrow arrays, with no Python loop per record.

Two numba kernels do the work: `_walk_batches` reads every 61-byte batch header, and `_decode_records`
walks the records of all batches in file order, writing offsets, timestamps and the byte ranges of
keys, values and one named header. Compressed batches are decompressed first (one Python call per
batch, in C) into a side buffer and go through the same record kernel. A final gather copies key and
header bytes into Arrow buffers.

Errors are found by the kernels but described by the readable reference decoder (`batch.py`,
`segment.py`): when a kernel reports a problem, the same bytes are re-read with the reference path,
which raises the typed error naming the object and the byte position. The two paths are tested
against each other on generated segments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import pyarrow as pa

from compaction.errors import CorruptBatchError, CorruptInputError, CrcMismatchError
from compaction.format.batch import (
    ATTRIBUTES_OFFSET,
    CODEC_MASK,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    DELETE_HORIZON_FLAG_MASK,
    LOG_OVERHEAD,
    RECORDS_OFFSET,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    crc32c,
    decode_batch,
)
from compaction.format.codecs import Codec, decompress
from compaction.format.segment import iter_batch_headers

# Batch-table columns produced by `_walk_batches`, in order.
(
    _B_POS,
    _B_SIZE,
    _B_BASE,
    _B_PLE,
    _B_CRC,
    _B_ATTR,
    _B_LOD,
    _B_BTS,
    _B_MTS,
    _B_PID,
    _B_PEPOCH,
    _B_BSEQ,
    _B_COUNT,
) = range(13)
_N_BATCH_FIELDS = 13


@numba.njit(cache=True, nogil=True)
def _be(buf: np.ndarray, pos: int, n: int) -> Any:
    v = np.int64(0)
    for i in range(n):
        v = (v << 8) | np.int64(buf[pos + i])
    # sign-extend n-byte big-endian
    shift = 64 - 8 * n
    if shift > 0:
        v = (v << shift) >> shift
    return v


@numba.njit(cache=True, nogil=True)
def _walk_batches(buf: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Header fields of every batch; returns (fields[n, 13], status, error position). status 0 = ok."""
    end = buf.shape[0]
    # first pass: count
    n = 0
    pos = 0
    while pos < end:
        if end - pos < 17:
            return np.empty((0, _N_BATCH_FIELDS), np.int64), 1, pos
        length = _be(buf, pos + 8, 4)
        if length < 49 or buf[pos + 16] != 2 or pos + length + 12 > end:
            return np.empty((0, _N_BATCH_FIELDS), np.int64), 1, pos
        n += 1
        pos += length + 12
    out = np.empty((n, _N_BATCH_FIELDS), np.int64)
    pos = 0
    for i in range(n):
        length = _be(buf, pos + 8, 4)
        out[i, 0] = pos
        out[i, 1] = length + 12
        out[i, 2] = _be(buf, pos, 8)
        out[i, 3] = _be(buf, pos + 12, 4)
        out[i, 4] = _be(buf, pos + 17, 4) & 0xFFFFFFFF
        out[i, 5] = _be(buf, pos + 21, 2)
        out[i, 6] = _be(buf, pos + 23, 4)
        out[i, 7] = _be(buf, pos + 27, 8)
        out[i, 8] = _be(buf, pos + 35, 8)
        out[i, 9] = _be(buf, pos + 43, 8)
        out[i, 10] = _be(buf, pos + 51, 2)
        out[i, 11] = _be(buf, pos + 53, 4)
        out[i, 12] = _be(buf, pos + 57, 4)
        if out[i, 12] < 0:
            return out, 1, pos
        pos += length + 12
    return out, 0, 0


@numba.njit(cache=True, nogil=True)
def _varint(buf: np.ndarray, pos: int, end: int, max_bytes: int) -> tuple[Any, int]:
    """Zigzag varint at pos -> (value, next pos); next pos = -1 on error."""
    result = np.uint64(0)
    shift = 0
    start = pos
    while True:
        if pos >= end or pos - start >= max_bytes:
            return 0, -1
        b = np.uint64(buf[pos])
        pos += 1
        result |= (b & np.uint64(0x7F)) << np.uint64(shift)
        if b < 0x80:
            value = np.int64(result >> np.uint64(1)) ^ -np.int64(result & np.uint64(1))
            return value, pos
        shift += 7


@numba.njit(cache=True, nogil=True)
def _decode_records(
    main: np.ndarray,
    side: np.ndarray,
    use_side: np.ndarray,
    sec_start: np.ndarray,
    sec_end: np.ndarray,
    counts: np.ndarray,
    base_offsets: np.ndarray,
    base_ts: np.ndarray,
    append_ts: np.ndarray,
    header_key: np.ndarray,
    want_header: bool,
    total: int,
    ints: np.ndarray,
) -> tuple[int, int, int]:
    """Decode all records in order into the rows of `ints[9, total]`:
    offset, timestamp, key pos, key len, value pos, value len, header pos, header len, batch index.

    Returns (status, batch index, position within its section) — status 0 = ok.
    """
    r = 0
    hk_len = header_key.shape[0]
    for b in range(counts.shape[0]):
        buf = side if use_side[b] else main
        pos = sec_start[b]
        end = sec_end[b]
        for _ in range(counts[b]):
            rec_start = pos
            length, pos = _varint(buf, pos, end, 5)
            if pos < 0 or length < 0 or pos + length > end:
                return 1, b, rec_start
            body_start = pos
            rec_end = pos + length
            pos += 1  # attributes
            ts_delta, pos = _varint(buf, pos, rec_end, 10)
            if pos < 0:
                return 1, b, rec_start
            off_delta, pos = _varint(buf, pos, rec_end, 5)
            if pos < 0:
                return 1, b, rec_start
            klen, pos = _varint(buf, pos, rec_end, 5)
            if pos < 0 or pos + max(klen, 0) > rec_end:
                return 1, b, rec_start
            kpos = pos
            if klen > 0:
                pos += klen
            vlen, pos = _varint(buf, pos, rec_end, 5)
            if pos < 0 or pos + max(vlen, 0) > rec_end:
                return 1, b, rec_start
            vpos = pos
            if vlen > 0:
                pos += vlen
            nh, pos = _varint(buf, pos, rec_end, 5)
            if pos < 0 or nh < 0 or nh > rec_end - pos:
                return 1, b, rec_start
            hpos = -1
            hlen = -2  # -2: header absent, -1: present with a null value
            for _h in range(nh):
                hkl, pos = _varint(buf, pos, rec_end, 5)
                if pos < 0 or hkl < 0 or pos + hkl > rec_end:
                    return 1, b, rec_start
                match = want_header and hkl == hk_len
                if match:
                    for i in range(hk_len):
                        if buf[pos + i] != header_key[i]:
                            match = False
                            break
                pos += hkl
                hvl, pos = _varint(buf, pos, rec_end, 5)
                if pos < 0 or pos + max(hvl, 0) > rec_end:
                    return 1, b, rec_start
                if match:
                    hpos = pos
                    hlen = hvl
                if hvl > 0:
                    pos += hvl
            if pos != body_start + length:
                return 1, b, rec_start
            ints[0, r] = base_offsets[b] + off_delta
            ints[1, r] = append_ts[b] if append_ts[b] != -9223372036854775808 else base_ts[b] + ts_delta
            ints[2, r] = kpos
            ints[3, r] = klen
            ints[4, r] = vpos
            ints[5, r] = vlen
            ints[6, r] = hpos
            ints[7, r] = hlen
            ints[8, r] = b
            r += 1
        if pos != end:
            return 1, b, pos
    return 0, 0, 0


@numba.njit(cache=True, nogil=True)
def _gather(
    main: np.ndarray,
    side: np.ndarray,
    use_side: np.ndarray,
    batch_of: np.ndarray,
    pos: np.ndarray,
    length: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Copy byte ranges (length < 0 = null) into one buffer; returns (int64 offsets, data)."""
    n = pos.shape[0]
    offsets = np.empty(n + 1, np.int64)
    total = 0
    offsets[0] = 0
    for i in range(n):
        if length[i] > 0:
            total += length[i]
        offsets[i + 1] = total
    data = np.empty(total, np.uint8)
    for i in range(n):
        ln = length[i]
        if ln > 0:
            buf = side if use_side[batch_of[i]] else main
            src = pos[i]
            dst = offsets[i]
            for j in range(ln):  # keys are short: a byte loop beats a slice copy's setup cost
                data[dst + j] = buf[src + j]
    return offsets, data


RECORD_SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.large_binary()),
        ("value_is_null", pa.bool_()),
        ("value_size", pa.int32()),
        ("header_value", pa.large_binary()),
        ("producer_id", pa.int64()),
        ("producer_epoch", pa.int16()),
        ("batch_base_offset", pa.int64()),
        ("batch_last_offset", pa.int64()),
        ("batch_position", pa.int64()),
        ("partition_leader_epoch", pa.int32()),
        ("transactional", pa.bool_()),
        ("control", pa.bool_()),
        ("codec", pa.int8()),
        ("delete_horizon_ms", pa.int64()),
    ]
)
"""Columns of `scan_segment`; `value` (large_binary) is appended when values are requested."""


@dataclass(frozen=True)
class SegmentScan:
    """A scanned segment: one row per record (`records`) and the raw header fields per batch."""

    records: pa.Table
    batch_fields: np.ndarray  # [n_batches, 13] int64, columns as `_walk_batches`

    @property
    def batch_count(self) -> int:
        return int(self.batch_fields.shape[0])


def _binary(offsets: np.ndarray, data: np.ndarray, null: np.ndarray) -> pa.Array:
    n = offsets.shape[0] - 1
    validity = None
    if null.any():
        validity = pa.py_buffer(np.packbits(~null, bitorder="little"))
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _reference_error(data: memoryview, obj: str, batch_position: int | None) -> CorruptInputError:
    """Re-read with the reference decoder to obtain the precise typed error."""
    try:
        headers = list(iter_batch_headers(data, obj=obj))
        for h in headers:
            if batch_position is None or h.position == batch_position:
                decode_batch(data, h.position, verify_crc=False)
    except CorruptInputError as exc:
        return exc if exc.obj is not None else exc.located(obj)
    return CorruptBatchError(
        "malformed records (scan kernel and reference decoder disagree)", obj=obj, position=batch_position
    )


def scan_segment(
    data: bytes | bytearray | memoryview,
    *,
    obj: str = "<segment>",
    header_key: str | None = None,
    with_values: bool = False,
    verify_crc: bool = True,
) -> SegmentScan:
    """Scan a whole segment image into Arrow columns (see `RECORD_SCHEMA`).

    `header_key` names the header whose value (last occurrence, exact match) fills `header_value`.
    Control records are included (`control` = true; their key is the control key). Raises a
    CorruptInputError subclass naming `obj` and the byte position for any malformed input.
    """
    mv = memoryview(data)
    buf = np.frombuffer(mv, dtype=np.uint8)
    fields, status, _err_pos = _walk_batches(buf)
    if status:
        raise _reference_error(mv, obj, None)
    if verify_crc:
        for i in range(fields.shape[0]):
            p, size = int(fields[i, _B_POS]), int(fields[i, _B_SIZE])
            computed = crc32c(mv[p + ATTRIBUTES_OFFSET : p + size])
            if computed != fields[i, _B_CRC]:
                raise CrcMismatchError(
                    f"CRC-32C mismatch: stored {int(fields[i, _B_CRC])}, computed {computed}",
                    obj=obj,
                    position=p + CRC_OFFSET,
                )
    attrs = fields[:, _B_ATTR]
    codecs = attrs & CODEC_MASK
    if (codecs > Codec.ZSTD).any():
        bad = int(fields[np.argmax(codecs > Codec.ZSTD), _B_POS])
        raise CorruptBatchError(
            f"unknown compression codec id {int(codecs.max())}", obj=obj, position=bad + ATTRIBUTES_OFFSET
        )
    sec_start = fields[:, _B_POS] + RECORDS_OFFSET
    sec_end = fields[:, _B_POS] + fields[:, _B_SIZE]
    use_side = codecs != Codec.NONE
    side = np.empty(0, np.uint8)
    if use_side.any():
        sec_start = sec_start.copy()
        sec_end = sec_end.copy()
        chunks = []
        cursor = 0
        for b in np.flatnonzero(use_side):
            p = int(fields[b, _B_POS])
            try:
                raw = decompress(Codec(int(codecs[b])), mv[int(sec_start[b]) : int(sec_end[b])])
            except CorruptInputError as exc:
                raise CorruptBatchError(exc.detail, obj=obj, position=p + RECORDS_OFFSET) from None
            chunks.append(raw)
            sec_start[b] = cursor
            cursor = cursor + len(raw)
            sec_end[b] = cursor
        side = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    counts = fields[:, _B_COUNT]
    total = int(counts.sum())
    append_ts = np.where(attrs & TIMESTAMP_TYPE_MASK, fields[:, _B_MTS], np.iinfo(np.int64).min)
    hk = np.frombuffer((header_key or "").encode("utf-8"), dtype=np.uint8)
    ints = np.empty((9, total), np.int64)
    decode_status, bad_batch, _ = _decode_records(
        buf,
        side,
        use_side,
        sec_start,
        sec_end,
        counts,
        fields[:, _B_BASE],
        fields[:, _B_BTS],
        append_ts,
        hk,
        header_key is not None,
        total,
        ints,
    )
    if decode_status:
        raise _reference_error(mv, obj, int(fields[bad_batch, _B_POS]))
    batch_of = ints[8]
    key_len = ints[3]
    koffs, kdata = _gather(buf, side, use_side, batch_of, ints[2], key_len)
    columns: dict[str, pa.Array] = {
        "offset": pa.array(ints[0]),
        "timestamp": pa.array(ints[1]),
        "key": _binary(koffs, kdata, key_len < 0),
        "value_is_null": pa.array(ints[5] < 0),
        "value_size": pa.array(np.maximum(ints[5], 0).astype(np.int32)),
    }
    if header_key is not None:
        hoffs, hdata = _gather(buf, side, use_side, batch_of, ints[6], ints[7])
        columns["header_value"] = _binary(hoffs, hdata, ints[7] < 0)
    else:
        columns["header_value"] = pa.nulls(total, pa.large_binary())
    def per_record(column: np.ndarray) -> np.ndarray:
        return np.repeat(column, counts)  # cheaper than a gather: records are grouped by batch

    battrs = per_record(attrs)
    base = per_record(fields[:, _B_BASE])
    columns.update(
        producer_id=pa.array(per_record(fields[:, _B_PID])),
        producer_epoch=pa.array(per_record(fields[:, _B_PEPOCH].astype(np.int16))),
        batch_base_offset=pa.array(base),
        batch_last_offset=pa.array(base + per_record(fields[:, _B_LOD])),
        batch_position=pa.array(per_record(fields[:, _B_POS])),
        partition_leader_epoch=pa.array(per_record(fields[:, _B_PLE].astype(np.int32))),
        transactional=pa.array((battrs & TRANSACTIONAL_FLAG_MASK) != 0),
        control=pa.array((battrs & CONTROL_FLAG_MASK) != 0),
        codec=pa.array((battrs & CODEC_MASK).astype(np.int8)),
        delete_horizon_ms=pa.array(
            per_record(np.where(attrs & DELETE_HORIZON_FLAG_MASK, fields[:, _B_BTS], -1))
        ),
    )
    schema = RECORD_SCHEMA
    if with_values:
        voffs, vdata = _gather(buf, side, use_side, batch_of, ints[4], ints[5])
        columns["value"] = _binary(voffs, vdata, ints[5] < 0)
        schema = schema.append(pa.field("value", pa.large_binary()))
    return SegmentScan(pa.Table.from_pydict(columns, schema=schema), fields)


__all__ = ["LOG_OVERHEAD", "RECORD_SCHEMA", "SegmentScan", "scan_segment"]
