"""The five record-batch compression codecs, byte-compatible with Kafka's Java writers.

Kafka's side: `CompressionType` and its `Compression` classes.

Only the records section (bytes after offset 61) is compressed, as one stream:
- gzip: a standard gzip member.
- snappy: xerial framing (`\\x82SNAPPY\\0`, version 1, compatible 1, then [int32 BE length][raw block]...),
  written with 32 KiB input blocks. Reading also accepts a bare raw snappy block, as xerial's reader does.
- lz4: Kafka's frame (magic 0x184D2204, independent 64 KiB blocks, no checksums, no content size).
- zstd: a standard frame without a content size, so decompression must stream.
"""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from enum import IntEnum

import cramjam
import lz4.frame
import numpy as np
import zstandard

from compaction.errors import CorruptBatchError


class Codec(IntEnum):
    """Compression codec ids, attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_ZSTD_DEFAULT_LEVEL = 3


def compress(codec: Codec, data: bytes) -> bytes:
    """Compress a records section the way Kafka's producer does at the codec's default level."""
    if codec is Codec.NONE:
        return data
    if codec is Codec.GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    if codec is Codec.SNAPPY:
        out = bytearray(_XERIAL_HEADER)
        for start in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[start : start + _XERIAL_BLOCK]))
            out += struct.pack(">i", len(block))
            out += block
        return bytes(out)
    if codec is Codec.LZ4:
        return bytes(
            lz4.frame.compress(
                data,
                block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                block_linked=False,
                content_checksum=False,
                block_checksum=False,
                store_size=False,
            )
        )
    if codec is Codec.ZSTD:
        return bytes(
            zstandard.ZstdCompressor(level=_ZSTD_DEFAULT_LEVEL, write_content_size=False).compress(data)
        )
    raise ValueError(f"unknown codec {codec!r}")


def decompress(codec: Codec, data: bytes | memoryview) -> bytes:
    """Decompress a records section. Raises CorruptBatchError (position relative to `data`) on bad input."""
    try:
        if codec is Codec.NONE:
            return bytes(data)
        if codec is Codec.GZIP:
            return zlib.decompress(bytes(data), wbits=47)
        if codec is Codec.SNAPPY:
            return _snappy_decompress(bytes(data))
        if codec is Codec.LZ4:
            return bytes(lz4.frame.decompress(data))
        if codec is Codec.ZSTD:
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(bytes(data))) as reader:
                return reader.read()
    except CorruptBatchError:
        raise
    except Exception as exc:  # each codec library has its own error types
        raise CorruptBatchError(f"cannot decompress {codec.name.lower()} records: {exc}", position=0) from exc
    raise ValueError(f"unknown codec {codec!r}")


FIRST_RATIO_GUESS = 8
"""`DecompressedSections`' first size, in times the compressed bytes to come: above Kafka's usual ratios on records
(2-5x); after each section the buffer is sized again from the ratio seen so far."""


class DecompressedSections:
    """Records sections decompressed back to back into one numpy buffer (`add`; `buffer` holds the bytes added so
    far). zstd decompresses straight into it, a frame at a time; the other codecs' output is copied in. Decompressing
    each section to its own `bytes` and joining them touched every byte twice: for 4 KiB zstd values, a third of the
    scan. Kafka's frames carry no content size, so the buffer is sized from the `compressed` bytes to come, first at
    `FIRST_RATIO_GUESS` times them, then, after each section, at the ratio seen so far (a quarter more): it grows,
    copying what it holds, mostly right after the first section; within a section that outruns it, it doubles.
    Pages beyond what is written are never touched."""

    def __init__(self, compressed: int) -> None:
        self._buffer = np.empty(max(FIRST_RATIO_GUESS * compressed, 1 << 16), np.uint8)
        self._seen, self._left = 0, compressed  # compressed bytes added, and still to come
        self.size = 0

    @property
    def buffer(self) -> np.ndarray:
        """The bytes added so far (a view of the buffer)."""
        return self._buffer[: self.size]

    def add(self, codec: Codec, data: bytes | memoryview) -> int:
        """Decompress one records section to the end of the buffer; returns its decompressed size. Raises
        CorruptBatchError (position relative to `data`) on bad input, as `decompress`."""
        size = self._decompress(codec, data)
        self._seen, self._left = self._seen + len(data), max(0, self._left - len(data))
        projected = self.size + self._left * self.size // max(1, self._seen)
        if projected > len(self._buffer):
            self._resize(projected + projected // 4)
        return size

    def emptied(self, compressed: int) -> DecompressedSections:
        """This object, holding nothing again (what it held is overwritten), for the sections of `compressed`
        bytes to come; its buffer, already written to, is kept (and grows as `add` needs)."""
        self.size, self._seen, self._left = 0, 0, compressed
        return self

    def _decompress(self, codec: Codec, data: bytes | memoryview) -> int:
        start = self.size
        if codec is not Codec.ZSTD:
            raw = decompress(codec, data)
            if start + len(raw) > len(self._buffer):
                self._resize(max(2 * len(self._buffer), start + len(raw)))
            self._buffer[start : start + len(raw)] = np.frombuffer(raw, np.uint8)
            self.size += len(raw)
            return len(raw)
        try:
            with zstandard.ZstdDecompressor().stream_reader(data) as reader:
                while True:
                    if self.size == len(self._buffer):
                        self._resize(2 * len(self._buffer))
                    n = reader.readinto(memoryview(self._buffer.data)[self.size :])
                    if not n:
                        return self.size - start
                    self.size += n
        except zstandard.ZstdError as exc:
            self.size = start
            raise CorruptBatchError(f"cannot decompress zstd records: {exc}", position=0) from exc

    def _resize(self, capacity: int) -> None:
        """A buffer of `capacity` bytes holding what this one holds."""
        grown = np.empty(capacity, np.uint8)
        grown[: self.size] = self._buffer[: self.size]
        self._buffer = grown


def _snappy_decompress(data: bytes) -> bytes:
    if not data.startswith(XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    pos = len(_XERIAL_HEADER)
    chunks = []
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptBatchError("truncated xerial snappy block length", position=pos)
        (size,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if size < 0 or pos + size > len(data):
            raise CorruptBatchError(
                f"xerial snappy block of {size} bytes overruns the stream", position=pos - 4
            )
        chunks.append(bytes(cramjam.snappy.decompress_raw(data[pos : pos + size])))
        pos += size
    return b"".join(chunks)
