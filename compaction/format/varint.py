"""Protobuf-style zigzag varints, as Kafka's `ByteUtils` writes them (`writeVarint`, `writeVarlong`).

An int varint takes at most 5 bytes and a long at most 10; longer encodings are corrupt. This is the readable
codec; `varint_kernels.py` is the same over numpy arrays for the compiled paths, tested against it.
"""

from __future__ import annotations

from compaction.errors import CorruptBatchError

_MASK64 = (1 << 64) - 1


def zigzag_encode(n: int) -> int:
    """Map a signed 64-bit value to its unsigned zigzag form."""
    return ((n << 1) ^ (n >> 63)) & _MASK64


def zigzag_decode(v: int) -> int:
    """Inverse of `zigzag_encode`."""
    return (v >> 1) ^ -(v & 1)


def write_varint(out: bytearray, n: int) -> None:
    """Append the zigzag varint encoding of `n` to `out`."""
    v = zigzag_encode(n)
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def read_varint(buf: bytes | bytearray | memoryview, pos: int, max_bytes: int = 10) -> tuple[int, int]:
    """Decode a zigzag varint at `pos`; returns (value, next position).

    Raises CorruptBatchError if the buffer ends first or the encoding is longer than `max_bytes`.
    """
    result = 0
    shift = 0
    start = pos
    end = len(buf)
    while True:
        if pos >= end:
            raise CorruptBatchError("varint runs past the end of the buffer", position=start)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return zigzag_decode(result), pos
        shift += 7
        if pos - start >= max_bytes:
            raise CorruptBatchError(f"varint longer than {max_bytes} bytes", position=start)
