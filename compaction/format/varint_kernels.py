"""The zigzag varints of `varint.py` as numba kernels over uint8 arrays, for the scan, the rewrite and the bulk
generator. `varint.py` is the reference they are tested against (tests/unit/test_varint.py).

Apart from `varint.py` because importing numba takes seconds, which the readable decoders, the CLI's dump and every
caller of `varint.py` do not pay. Errors are reported as a position of -1, not raised: numba cannot build the
typed errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compaction.kernels import kernel


@kernel(nogil=True)
def varint_at(buf: np.ndarray, pos: int, end: int, max_bytes: int) -> tuple[Any, int]:
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


@kernel(nogil=True)
def put_varint(out: np.ndarray, pos: int, value: int) -> int:
    """Write the zigzag varint of `value` at `pos` of `out`; returns the position after it."""
    v = np.uint64((np.int64(value) << np.int64(1)) ^ (np.int64(value) >> np.int64(63)))
    while v >= np.uint64(0x80):
        out[pos] = np.uint8((v & np.uint64(0x7F)) | np.uint64(0x80))
        v >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(v)
    return pos + 1


@kernel(nogil=True)
def varint_size(value: int) -> int:
    """How many bytes the zigzag varint of `value` takes."""
    v = np.uint64((np.int64(value) << np.int64(1)) ^ (np.int64(value) >> np.int64(63)))
    size = 1
    while v >= np.uint64(0x80):
        v >>= np.uint64(7)
        size += 1
    return size
