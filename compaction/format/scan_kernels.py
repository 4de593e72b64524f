"""The numba kernels of the columnar scan (`scan.py`): batch headers, records, byte gathers.

Each kernel reports a problem as a status code and a position instead of raising: numba cannot build the
typed errors, and `scan.py` re-reads the bytes with the reference decoder to describe them. Offsets into
the 61-byte header are literals here (numba freezes them anyway); `batch.py` is where they are named.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compaction.format.varint_kernels import varint_at
from compaction.kernels import kernel

# Batch-table columns produced by `walk_batches`, in order.
(
    BATCH_POS,
    BATCH_SIZE,
    BATCH_BASE_OFFSET,
    BATCH_LEADER_EPOCH,
    BATCH_CRC,
    BATCH_ATTRIBUTES,
    BATCH_LAST_OFFSET_DELTA,
    BATCH_BASE_TIMESTAMP,
    BATCH_MAX_TIMESTAMP,
    BATCH_PRODUCER_ID,
    BATCH_PRODUCER_EPOCH,
    BATCH_BASE_SEQUENCE,
    BATCH_RECORD_COUNT,
) = range(13)
N_BATCH_FIELDS = 13

# Record-table rows produced by `decode_record_ranges`, in order.
(
    RECORD_OFFSET,
    RECORD_TIMESTAMP,
    RECORD_KEY_POS,
    RECORD_KEY_LEN,
    RECORD_VALUE_POS,
    RECORD_VALUE_LEN,
    RECORD_HEADER_POS,
    RECORD_HEADER_LEN,
    RECORD_BATCH,
) = range(9)
N_RECORD_FIELDS = 9


@kernel(nogil=True)
def _be(buf: np.ndarray, pos: int, n: int) -> Any:
    v = np.int64(0)
    for i in range(n):
        v = (v << 8) | np.int64(buf[pos + i])
    # sign-extend n-byte big-endian
    shift = 64 - 8 * n
    if shift > 0:
        v = (v << shift) >> shift
    return v


@kernel(nogil=True, inline="always")
def _nullable_bytes(buf: np.ndarray, pos: int, end: int) -> tuple[Any, int, int]:
    """A varint length and the bytes it announces at `pos` (a record's key or value, a header's value; a negative
    length is null, no bytes) -> (length, position of the bytes, position after them). The last is -1 when the
    varint is malformed or the bytes run past `end`."""
    length, pos = varint_at(buf, pos, end, 5)
    if pos < 0 or pos + max(length, 0) > end:
        return length, pos, -1
    return length, pos, pos + max(length, 0)


@kernel(nogil=True)
def walk_batches(buf: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Header fields of every batch; returns (fields[n, 13], status, error position). status 0 = ok."""
    end = buf.shape[0]
    # first pass: count
    n = 0
    pos = 0
    while pos < end:
        if end - pos < 17:
            return np.empty((0, N_BATCH_FIELDS), np.int64), 1, pos
        length = _be(buf, pos + 8, 4)
        if length < 49 or buf[pos + 16] != 2 or pos + length + 12 > end:
            return np.empty((0, N_BATCH_FIELDS), np.int64), 1, pos
        n += 1
        pos += length + 12
    out = np.empty((n, N_BATCH_FIELDS), np.int64)
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


@kernel(nogil=True)
def decode_record_ranges(
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
            length, pos = varint_at(buf, pos, end, 5)
            if pos < 0 or length < 0 or pos + length > end:
                return 1, b, rec_start
            body_start = pos
            rec_end = pos + length
            pos += 1  # attributes
            ts_delta, pos = varint_at(buf, pos, rec_end, 10)
            if pos < 0:
                return 1, b, rec_start
            off_delta, pos = varint_at(buf, pos, rec_end, 5)
            if pos < 0:
                return 1, b, rec_start
            klen, kpos, pos = _nullable_bytes(buf, pos, rec_end)
            if pos < 0:
                return 1, b, rec_start
            vlen, vpos, pos = _nullable_bytes(buf, pos, rec_end)
            if pos < 0:
                return 1, b, rec_start
            nh, pos = varint_at(buf, pos, rec_end, 5)
            if pos < 0 or nh < 0 or nh > rec_end - pos:
                return 1, b, rec_start
            hpos = -1
            hlen = -2  # -2: header absent, -1: present with a null value
            for _h in range(nh):
                hkl, pos = varint_at(buf, pos, rec_end, 5)
                if pos < 0 or hkl < 0 or pos + hkl > rec_end:
                    return 1, b, rec_start
                match = want_header and hkl == hk_len
                if match:
                    for i in range(hk_len):
                        if buf[pos + i] != header_key[i]:
                            match = False
                            break
                pos += hkl
                hvl, hvpos, pos = _nullable_bytes(buf, pos, rec_end)
                if pos < 0:
                    return 1, b, rec_start
                if match:
                    hpos = hvpos
                    hlen = hvl
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


@kernel(nogil=True)
def gather_ranges(
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
            if ln <= 32:  # keys are short: a byte loop beats a slice copy's setup cost
                for j in range(ln):
                    data[dst + j] = buf[src + j]
            else:  # values: the slice copy is a memmove
                data[dst:dst + ln] = buf[src:src + ln]
    return offsets, data


@kernel(nogil=True)
def header_ranges(
    main: np.ndarray,
    side: np.ndarray,
    use_side: np.ndarray,
    batch_of: np.ndarray,
    start: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every header of the records whose headers section begins at `start` (in the buffer of batch `batch_of`).

    Returns (list offsets [records + 1], key pos, key len, value pos, value len, batch of each header): the
    parts of an Arrow list<struct<key, value>> column. The records were checked by `decode_record_ranges`, so
    their headers sections are well formed and lie inside their records.
    """
    n = start.shape[0]
    list_offsets = np.empty(n + 1, np.int64)
    list_offsets[0] = 0
    total = 0
    for i in range(n):
        buf = side if use_side[batch_of[i]] else main
        count, _ = varint_at(buf, start[i], buf.shape[0], 5)
        total += count
        list_offsets[i + 1] = total
    key_pos = np.empty(total, np.int64)
    key_len = np.empty(total, np.int64)
    value_pos = np.empty(total, np.int64)
    value_len = np.empty(total, np.int64)
    owner = np.empty(total, np.int64)
    h = 0
    for i in range(n):
        b = batch_of[i]
        buf = side if use_side[b] else main
        end = buf.shape[0]
        count, pos = varint_at(buf, start[i], end, 5)
        for _ in range(count):
            klen, pos = varint_at(buf, pos, end, 5)
            key_pos[h] = pos
            key_len[h] = klen
            pos += klen
            vlen, pos = varint_at(buf, pos, end, 5)
            value_pos[h] = pos
            value_len[h] = vlen
            if vlen > 0:
                pos += vlen
            owner[h] = b
            h += 1
    return list_offsets, key_pos, key_len, value_pos, value_len, owner
