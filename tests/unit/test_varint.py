"""The varint kernels (`format/varint_kernels.py`) against the readable codec (`format/varint.py`)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from compaction.errors import CorruptBatchError
from compaction.format.varint import read_varint, write_varint
from compaction.format.varint_kernels import put_varint, varint_at, varint_size

LONGS = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def reference(n: int) -> bytes:
    out = bytearray()
    write_varint(out, n)
    return bytes(out)


@given(LONGS)
@example(0)
@example(-1)
@example(63)
@example(-64)
@example(64)
@example(2**31 - 1)
@example(-(2**31))
@example(2**63 - 1)
@example(-(2**63))
def test_kernels_write_and_read_what_the_reference_does(n: int) -> None:
    expected = reference(n)
    out = np.zeros(12, np.uint8)
    end = put_varint(out, 1, n)
    assert (end - 1, varint_size(n)) == (len(expected), len(expected))
    assert out[1:end].tobytes() == expected
    assert varint_at(out, 1, end, 10) == (n, end)
    assert read_varint(expected, 0) == (n, len(expected))


def test_truncated_or_overlong_is_an_error_in_both() -> None:
    overlong = bytes([0x80] * 5 + [0x01])
    assert varint_at(np.frombuffer(overlong, np.uint8), 0, len(overlong), 5)[1] == -1
    with pytest.raises(CorruptBatchError):
        read_varint(overlong, 0, max_bytes=5)
    truncated = np.frombuffer(bytes([0x80, 0x80]), np.uint8)
    assert varint_at(truncated, 0, 2, 10)[1] == -1
    with pytest.raises(CorruptBatchError):
        read_varint(truncated.tobytes(), 0)
