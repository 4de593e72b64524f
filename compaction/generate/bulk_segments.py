"""Streaming encoded bulk batches into segment files: the CRC (and codec) of each batch, Kafka's roll rule, and
each segment's offset and time indexes computed from the batch sizes instead of reading the log back.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, BinaryIO

import crc32c as _crc32c
import numpy as np

from compaction.format.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    RECORDS_OFFSET,
)
from compaction.format.codecs import Codec, compress
from compaction.generate.logdir import LogDirWriter, rolls

if TYPE_CHECKING:
    from compaction.generate.bulk_spec import BulkSpec

_CRC = struct.Struct(">I")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_OFFSET_ENTRY = struct.Struct(">ii")  # .index: relativeOffset, position
_TIME_ENTRY = struct.Struct(">qi")  # .timeindex: timestamp, relativeOffset


class SegmentStream:
    """Streams batches to `<base>.log` files, rolling by Kafka's size rule, and writes each segment's `.index`
    and `.timeindex` when it is closed (from the batch sizes: the batches' offsets and timestamps follow from
    the spec). A plain producer has no state a broker snapshots: every roll writes an empty snapshot."""

    def __init__(self, files: LogDirWriter, spec: BulkSpec) -> None:
        self.files = files
        self.spec = spec
        self.bases = [0]
        self.size = 0  # bytes written to the current segment
        self.total = 0
        self.batch_sizes: list[int] = []  # of the current segment's batches, written or pending
        self.file: BinaryIO = files.open_log(0)

    def write(self, parts: list[Any], size: int) -> None:
        self.file.writelines(parts)
        self.size += size
        self.total += size

    def roll(self, next_base: int) -> None:
        self._close()
        self.files.write_snapshot(next_base, [], durable=False)
        self.bases.append(next_base)
        self.size = 0
        self.batch_sizes = []
        self.file = self.files.open_log(next_base)

    def finish(self) -> None:
        self._close()

    def abort(self) -> None:
        self.file.close()

    def _close(self) -> None:
        self.file.close()
        base = self.bases[-1]
        self.files.write_indexes(base, *segment_indexes(self.spec, base, self.batch_sizes))


def segment_indexes(spec: BulkSpec, base: int, batch_sizes: list[int]) -> tuple[bytes, bytes]:
    """`.index` and `.timeindex` of a bulk segment starting at `base` with batches of these sizes.

    `indexes.build_indexes` replayed without reading the log back: the batches of a bulk segment hold
    `records_per_batch` consecutive offsets each and the max timestamp of a batch is its last record's.
    Per batch (one `LogSegment.append` each): if more than index.interval.bytes were appended since the last
    entry, index (last offset → position) and `maybeAppend` the max timestamp so far; on roll the max
    timestamp is appended once more if above the last entry. Tests check it equals `build_indexes`.
    """
    offsets = bytearray()
    times = bytearray()
    end = spec.log_end_offset
    rpb = spec.records_per_batch
    last_time = NO_TIMESTAMP
    max_ts, max_ts_rel = NO_TIMESTAMP, 0
    since_last_entry = 0
    position = 0
    for j, size in enumerate(batch_sizes):
        last_rel = min(base + (j + 1) * rpb, end) - 1 - base
        ts = spec.start_ms + (base + last_rel) * spec.ms_per_record
        if ts > max_ts:
            max_ts, max_ts_rel = ts, last_rel
        if since_last_entry > spec.index_interval_bytes:
            offsets += _OFFSET_ENTRY.pack(last_rel, position)
            if max_ts > last_time:
                times += _TIME_ENTRY.pack(max_ts, max_ts_rel)
                last_time = max_ts
            since_last_entry = 0
        since_last_entry += size
        position += size
    if max_ts > last_time:
        times += _TIME_ENTRY.pack(max_ts, max_ts_rel)
    return bytes(offsets), bytes(times)


def write_plain(stream: SegmentStream, buf: np.ndarray, starts: list[int], first: int) -> None:
    """CRC each batch in place, then write each run of batches that belong to one segment in one call."""
    mv = buf.data  # a writable memoryview of the chunk
    crc32c = _crc32c.crc32c
    pack_crc = _CRC.pack_into
    segment_bytes = stream.spec.segment_bytes
    rpb = stream.spec.records_per_batch
    sizes = stream.batch_sizes
    run = starts[0]
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        pack_crc(mv, s + CRC_OFFSET, crc32c(mv[s + ATTRIBUTES_OFFSET : e]))
        if rolls(stream.size + s - run, e - s, segment_bytes):
            stream.write([mv[run:s]], s - run)
            stream.roll(first + b * rpb)
            sizes = stream.batch_sizes
            run = s
        sizes.append(e - s)
    stream.write([mv[run : starts[-1]]], starts[-1] - run)


def write_compressed(stream: SegmentStream, buf: np.ndarray, starts: list[int], first: int, attributes: int) -> None:
    """Compress each batch's records section, fix its header (length, codec, CRC) and write it."""
    mv = buf.data  # a writable memoryview of the chunk
    codec: Codec = stream.spec.codec
    rpb = stream.spec.records_per_batch
    parts: list[bytes] = []
    pending = 0
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        payload = compress(codec, bytes(mv[s + RECORDS_OFFSET : e]))
        header = bytearray(mv[s : s + RECORDS_OFFSET])
        _INT32.pack_into(header, LENGTH_OFFSET, RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(payload))
        _INT16.pack_into(header, ATTRIBUTES_OFFSET, attributes)
        crc = _crc32c.crc32c(payload, _crc32c.crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
        _CRC.pack_into(header, CRC_OFFSET, crc)
        batch_size = RECORDS_OFFSET + len(payload)
        if rolls(stream.size + pending, batch_size, stream.spec.segment_bytes):
            stream.write(parts, pending)
            stream.roll(first + b * rpb)
            parts, pending = [], 0
        parts += (bytes(header), payload)
        pending += batch_size
        stream.batch_sizes.append(batch_size)
    stream.write(parts, pending)
