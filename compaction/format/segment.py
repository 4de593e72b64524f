"""Segment (`.log`) files: batches back to back, each `baseOffset int64, batchLength int32, ...`.

Kafka reads and writes them as `FileRecords`.

`iter_batch_headers` walks a segment reading only the 61-byte headers: it is what index rebuilds,
planning and byte-for-byte copying need. Unlike Kafka's iterator, a trailing incomplete batch is an
error here: a tiered segment is immutable and complete, so a short tail means a truncated object.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from compaction.errors import CorruptBatchError, CorruptInputError, CrcMismatchError, TruncatedSegmentError
from compaction.format.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER,
    CRC_OFFSET,
    HEADER_SIZE_UP_TO_MAGIC,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MIN_BATCH_SIZE_FIELD,
    RECORD_BATCH_OVERHEAD,
    BatchAttributes,
    RecordBatch,
    check_magic,
    crc32c,
    decode_batch,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
DEFAULT_MAX_MESSAGE_BYTES = 1048588


def filename_prefix(base_offset: int) -> str:
    """Kafka's `filenamePrefixFromOffset`: 20 zero-padded digits."""
    return f"{base_offset:020d}"


def segment_path(directory: Path, base_offset: int, suffix: str = LOG_SUFFIX) -> Path:
    return directory / (filename_prefix(base_offset) + suffix)


@dataclass(frozen=True)
class BatchHeader(BatchAttributes):
    """The fixed 61-byte header of a batch and where it sits in its segment."""

    position: int
    size: int
    base_offset: int
    partition_leader_epoch: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int


def iter_batch_headers(
    data: bytes | bytearray | memoryview,
    *,
    obj: str | None = None,
    start: int = 0,
    verify_crc: bool = False,
    max_batch_size: int = 2**31 - 1,
) -> Iterator[BatchHeader]:
    """Yield the header of every batch of a segment image, in file order.

    Raises CorruptInputError subclasses naming `obj` and the absolute byte position: a batch length
    below 14 or above `max_batch_size`, a bad magic (legacy magic gets UnsupportedMagicError), a
    truncated tail, and (with `verify_crc`) a CRC-32C mismatch.
    """
    mv = memoryview(data)
    end = len(mv)
    pos = start
    while pos < end:
        try:
            yield _read_header(mv, pos, end, verify_crc, max_batch_size)
        except CorruptInputError as exc:
            raise exc.located(obj or "<segment>") if exc.obj is None and obj is not None else exc from None
        pos += LOG_OVERHEAD + struct.unpack_from(">i", mv, pos + LENGTH_OFFSET)[0]


def _read_header(mv: memoryview, pos: int, end: int, verify_crc: bool, max_batch_size: int) -> BatchHeader:
    if end - pos < LOG_OVERHEAD:
        raise TruncatedSegmentError(f"{end - pos} trailing bytes, too few for a batch", position=pos)
    (length,) = struct.unpack_from(">i", mv, pos + LENGTH_OFFSET)
    if length < MIN_BATCH_SIZE_FIELD:
        raise CorruptBatchError(
            f"batch size {length} is less than the minimum record overhead ({MIN_BATCH_SIZE_FIELD})",
            position=pos + LENGTH_OFFSET,
        )
    if length > max_batch_size:
        raise CorruptBatchError(
            f"batch size {length} exceeds the maximum {max_batch_size}", position=pos + LENGTH_OFFSET
        )
    if end - pos < HEADER_SIZE_UP_TO_MAGIC:
        raise TruncatedSegmentError(f"{end - pos} trailing bytes, too few for a batch header", position=pos)
    check_magic(mv, pos)
    size = length + LOG_OVERHEAD
    if size < RECORD_BATCH_OVERHEAD:
        raise CorruptBatchError(
            f"v2 batch size {size} is below the 61-byte header", position=pos + LENGTH_OFFSET
        )
    if pos + size > end:
        raise TruncatedSegmentError(
            f"batch of {size} bytes but only {end - pos} bytes left in the segment", position=pos
        )
    fields = BATCH_HEADER.unpack_from(mv, pos)
    if verify_crc:
        computed = crc32c(mv[pos + ATTRIBUTES_OFFSET : pos + size])
        if computed != fields[4]:
            raise CrcMismatchError(
                f"CRC-32C mismatch: stored {fields[4]}, computed {computed}", position=pos + CRC_OFFSET
            )
    return BatchHeader(
        pos,
        size,
        fields[0],
        fields[2],
        fields[4],
        fields[5],
        fields[6],
        fields[7],
        fields[8],
        fields[9],
        fields[10],
        fields[11],
        fields[12],
    )


def iter_batches(
    data: bytes | bytearray | memoryview, *, obj: str | None = None, verify_crc: bool = True
) -> Iterator[tuple[int, RecordBatch]]:
    """Yield (byte position, decoded batch) for every batch, checking CRCs. Errors name `obj`."""
    for header in iter_batch_headers(data, obj=obj):
        try:
            yield header.position, decode_batch(data, header.position, verify_crc=verify_crc)
        except CorruptInputError as exc:
            raise exc.located(obj or "<segment>") from None


def write_segment(path: str | os.PathLike[str], batches: Iterable[bytes]) -> int:
    """Write encoded batches back to back (unchanged batches are passed as their original bytes).

    Written to `<path>.tmp` then renamed, so a crash never leaves a half-written segment. Returns the size.
    """
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    size = 0
    with open(tmp, "wb") as out:
        for batch in batches:
            out.write(batch)
            size += len(batch)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)
    return size
