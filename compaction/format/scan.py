"""Columnar scan: one segment image -> Arrow arrays, with no Python loop per record.

Two numba kernels (`scan_kernels.py`) do the work: `walk_batches` reads every 61-byte batch header, and
`decode_record_ranges` walks the records of all batches in file order, writing offsets, timestamps and the
byte ranges of keys, values and one named header. Compressed batches are decompressed first (one Python
call per batch, in C) into a side buffer and go through the same record kernel, a window of batches at a time
(`_windows`: a few MiB decompressed, the buffer reused from window to window). A gather copies each window's key
and header bytes into Arrow buffers.

Errors are found by the kernels but described by the readable reference decoder (`batch.py`,
`segment.py`): when a kernel reports a problem, the same bytes are re-read with the reference path,
which raises the typed error naming the object and the byte position. The two paths are tested
against each other on generated segments.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

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
from compaction.format.codecs import FIRST_RATIO_GUESS, Codec, DecompressedSections
from compaction.format.scan_kernels import (
    BATCH_ATTRIBUTES,
    BATCH_BASE_OFFSET,
    BATCH_BASE_TIMESTAMP,
    BATCH_CRC,
    BATCH_LAST_OFFSET_DELTA,
    BATCH_LEADER_EPOCH,
    BATCH_MAX_TIMESTAMP,
    BATCH_POS,
    BATCH_PRODUCER_EPOCH,
    BATCH_PRODUCER_ID,
    BATCH_RECORD_COUNT,
    BATCH_SIZE,
    N_RECORD_FIELDS,
    RECORD_BATCH,
    RECORD_HEADER_LEN,
    RECORD_HEADER_POS,
    RECORD_KEY_LEN,
    RECORD_KEY_POS,
    RECORD_OFFSET,
    RECORD_TIMESTAMP,
    RECORD_VALUE_LEN,
    RECORD_VALUE_POS,
    decode_record_ranges,
    gather_ranges,
    header_ranges,
    walk_batches,
)
from compaction.format.segment import BatchHeader, iter_batch_headers

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
    batch_fields: np.ndarray  # [n_batches, 13] int64, columns as `scan_kernels.walk_batches`


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
    mv = _readonly(data)
    fields = _checked_fields(mv, obj, verify_crc)
    pieces = []
    for _first, sections, ranges in _windows(mv, fields, header_key, obj):
        piece = _record_columns(sections, ranges, header_key)
        if with_values:
            piece["value"] = sections.gather(ranges, RECORD_VALUE_POS, RECORD_VALUE_LEN)
        pieces.append(piece)  # copies: the next window reuses the side buffer
    columns = {name: pa.concat_arrays([p[name] for p in pieces]) if len(pieces) > 1 else pieces[0][name]
               for name in pieces[0]}
    columns.update(_batch_columns(fields))
    schema = RECORD_SCHEMA
    if with_values:
        schema = schema.append(pa.field("value", pa.large_binary()))
    return SegmentScan(pa.Table.from_pydict(columns, schema=schema), fields)


def scan_ranges(data: bytes | bytearray | memoryview, *, obj: str = "<segment>", verify_crc: bool = True
                ) -> tuple[np.ndarray, np.ndarray]:
    """What `scan_segment` checks and decodes, without building columns: every batch's header fields (`fields`,
    `scan_kernels.BATCH_*` columns) and every record's fields (`[N_RECORD_FIELDS, records]`, rows
    `scan_kernels.RECORD_*`; positions point into buffers not returned). For callers that need offsets and
    key or value lengths only (the rewrite's per-batch counts). CRCs are verified unless `verify_crc` is false (the
    caller's scan of the very same bytes verified them); errors as `scan_segment`."""
    mv = _readonly(data)
    fields = _checked_fields(mv, obj, verify_crc)
    windows = [(first, ranges) for first, _sections, ranges in _windows(mv, fields, None, obj)]
    if len(windows) == 1:
        return windows[0][1], fields
    for first, ranges in windows:  # each window's batch numbers count from its first batch
        ranges[RECORD_BATCH] += first
    return np.concatenate([ranges for _first, ranges in windows], axis=1), fields


def batch_fields(data: bytes | bytearray | memoryview, *, obj: str = "<segment>") -> np.ndarray:
    """Every batch's header fields (`scan_kernels.BATCH_*` columns), walked by the kernel: no record decoded, no
    CRC checked (as `iter_batch_headers` by default), and no Python object per batch, for readers that need the
    headers only (which transactions are open). Errors as `scan_segment`."""
    return _walk(_readonly(data), obj)


def headers_of(fields: np.ndarray) -> list[BatchHeader]:
    """The `BatchHeader` of each row of `fields` (`batch_fields`; its columns are the header's fields, in order):
    with `batch_fields`, `iter_batch_headers`'s headers (no CRC checked) walked by the kernel, one Python object
    per batch and none of the parsing (a fifth of a rewrite's Python time went to parsing 20,000 headers)."""
    return [BatchHeader(*row) for row in fields.tolist()]


def _decoded(data: bytes | bytearray | memoryview, obj: str, header_key: str | None, verify_crc: bool
             ) -> tuple[np.ndarray, _Sections, np.ndarray]:
    """Every batch's header fields (CRCs checked when `verify_crc`), where each records section lies (compressed
    ones decompressed, all of them at once) and every record's fields (`scan_records`, which keeps them)."""
    mv = _readonly(data)
    fields = _checked_fields(mv, obj, verify_crc)
    sections = _record_sections(mv, fields, obj)
    return fields, sections, _decode(mv, sections, fields, header_key, obj)


def _checked_fields(mv: memoryview, obj: str, verify_crc: bool) -> np.ndarray:
    """Every batch's header fields, their CRCs checked when `verify_crc`, and their codecs known ones."""
    fields = _walk(mv, obj)
    if verify_crc:
        _check_crcs(mv, fields, obj)
    _check_codecs(fields, obj)
    return fields


WINDOW_DECOMPRESSED_BYTES = 4 << 20
"""About how many decompressed bytes `_windows` holds at once: a window of batches is decompressed, decoded and
gathered, then the next one is decompressed into the same buffer."""


def _windows(mv: memoryview, fields: np.ndarray, header_key: str | None, obj: str
             ) -> Iterator[tuple[int, _Sections, np.ndarray]]:
    """The records of consecutive windows of batches: each window's first batch, its sections and its records'
    fields (`_decode` of the window's batches; batch numbers count from its first). A segment without compressed
    batches is one window. Compressed ones are decompressed a window of about `WINDOW_DECOMPRESSED_BYTES` at a
    time into one buffer that each window reuses, sized from the compression seen so far: decompressing a whole
    segment at once wrote every byte of it to memory the process had not touched yet (for 4 KiB zstd values, 2 GB a
    partition), which ran at ~1 GB/s on a VM; a window stays in the cache. Each window's sections are only valid
    until the next one is asked for."""
    compressed = (fields[:, BATCH_ATTRIBUTES] & CODEC_MASK) != Codec.NONE
    if not compressed.any():
        sections = _record_sections(mv, fields, obj)
        yield 0, sections, _decode(mv, sections, fields, header_key, obj)
        return
    reused = DecompressedSections(0)
    section_bytes = np.where(compressed, fields[:, BATCH_SIZE] - RECORDS_OFFSET, 0)
    cumulative = np.cumsum(fields[:, BATCH_SIZE])
    ratio, first, n = float(FIRST_RATIO_GUESS), 0, len(fields)
    while first < n:
        budget = max(1, int(WINDOW_DECOMPRESSED_BYTES / ratio))
        before = int(cumulative[first - 1]) if first else 0
        end = max(first + 1, int(np.searchsorted(cumulative, before + budget, "right")))
        window = fields[first:end]
        sections = _record_sections(mv, window, obj, reused)
        yield first, sections, _decode(mv, sections, window, header_key, obj)
        if (packed := int(section_bytes[first:end].sum())) > 0:
            ratio = max(1.0, reused.size / packed)
        first = end


_NO_SIDE = np.empty(0, np.uint8)
_NO_SIDE.setflags(write=False)


def _readonly(data: bytes | bytearray | memoryview) -> memoryview:
    """A read-only view of `data`. numba compiles a kernel once per argument type, and a writable array is another
    type than a read-only one: every buffer the kernels get is read-only, whatever the caller read the segment
    into (bytes, a numpy buffer of the run's cache, an mmap), so that one compiled (and cached) version serves
    them all, and a warmed-up executor never compiles in a run."""
    mv = memoryview(data)
    return mv if mv.readonly else mv.toreadonly()


@dataclass(frozen=True)
class _Sections:
    """Where each batch's records section lies: `[start, end)` of the segment, or of `side` if decompressed."""

    main: np.ndarray
    side: np.ndarray
    use_side: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def gather(self, ranges: np.ndarray, pos_row: int, len_row: int) -> pa.Array:
        """One binary column from the byte ranges in rows `pos_row`/`len_row` (length < 0 = null)."""
        length = ranges[len_row]
        offsets, data = gather_ranges(
            self.main, self.side, self.use_side, ranges[RECORD_BATCH], ranges[pos_row], length
        )
        return _binary(offsets, data, length < 0)


def _walk(mv: memoryview, obj: str) -> np.ndarray:
    """The header fields of every batch (`scan_kernels.walk_batches`), or the reference decoder's error."""
    fields, status, _err_pos = walk_batches(np.frombuffer(mv, dtype=np.uint8))
    if status:
        raise _reference_error(mv, obj, None)
    return fields


def check_crcs(data: bytes | bytearray | memoryview, fields: np.ndarray, obj: str) -> None:
    """Check the CRC-32C of every batch of `data` whose header fields are `fields` (`batch_fields`); raises
    CrcMismatchError naming `obj` and the batch's CRC field."""
    _check_crcs(memoryview(data), fields, obj)


def _check_crcs(mv: memoryview, fields: np.ndarray, obj: str) -> None:
    for i in range(fields.shape[0]):
        p, size = int(fields[i, BATCH_POS]), int(fields[i, BATCH_SIZE])
        computed = crc32c(mv[p + ATTRIBUTES_OFFSET : p + size])
        if computed != fields[i, BATCH_CRC]:
            raise CrcMismatchError(
                f"CRC-32C mismatch: stored {int(fields[i, BATCH_CRC])}, computed {computed}",
                obj=obj,
                position=p + CRC_OFFSET,
            )


def _check_codecs(fields: np.ndarray, obj: str) -> None:
    codecs = fields[:, BATCH_ATTRIBUTES] & CODEC_MASK
    if (codecs > Codec.ZSTD).any():
        bad = int(fields[np.argmax(codecs > Codec.ZSTD), BATCH_POS])
        raise CorruptBatchError(
            f"unknown compression codec id {int(codecs.max())}", obj=obj, position=bad + ATTRIBUTES_OFFSET
        )


def _record_sections(mv: memoryview, fields: np.ndarray, obj: str, into: DecompressedSections | None = None
                     ) -> _Sections:
    """Each batch's records section (of the batches of `fields`: every batch's codec known, `_check_codecs`);
    compressed ones are decompressed, back to back, into the side buffer: `into`, emptied first, when given (its
    earlier contents are gone), else a new one."""
    codecs = fields[:, BATCH_ATTRIBUTES] & CODEC_MASK
    start = fields[:, BATCH_POS] + RECORDS_OFFSET
    end = fields[:, BATCH_POS] + fields[:, BATCH_SIZE]
    use_side = codecs != Codec.NONE
    side = _NO_SIDE
    if use_side.any():
        start, end = start.copy(), end.copy()
        compressed = np.flatnonzero(use_side)
        total = int((end[compressed] - start[compressed]).sum())
        sections = into.emptied(total) if into is not None else DecompressedSections(total)
        for b in compressed:
            try:
                size = sections.add(Codec(int(codecs[b])), mv[int(start[b]) : int(end[b])])
            except CorruptInputError as exc:
                position = int(fields[b, BATCH_POS]) + RECORDS_OFFSET
                raise CorruptBatchError(exc.detail, obj=obj, position=position) from None
            end[b] = sections.size
            start[b] = sections.size - size
        side = sections.buffer
        side.setflags(write=False)  # as `_readonly`
    return _Sections(np.frombuffer(mv, dtype=np.uint8), side, use_side, start, end)


MIN_RECORD_BYTES = 7
"""The fewest bytes a record takes (its length, attributes, timestamp delta, offset delta, key length, value length
and header count, one byte each at least): a batch whose record count asks for more than its section holds is
corrupt, and is reported before a table is allocated for that many records."""


def _decode(
    mv: memoryview, sections: _Sections, fields: np.ndarray, header_key: str | None, obj: str
) -> np.ndarray:
    """The `[N_RECORD_FIELDS, records]` table of `scan_kernels.decode_record_ranges`, or the reference error."""
    counts = fields[:, BATCH_RECORD_COUNT]
    if (overstated := counts * MIN_RECORD_BYTES > sections.end - sections.start).any():  # before allocating for them
        raise _reference_error(mv, obj, int(fields[np.argmax(overstated), BATCH_POS]))
    log_append = fields[:, BATCH_ATTRIBUTES] & TIMESTAMP_TYPE_MASK
    append_ts = np.where(log_append, fields[:, BATCH_MAX_TIMESTAMP], np.iinfo(np.int64).min)
    total = int(counts.sum())
    ranges = np.empty((N_RECORD_FIELDS, total), np.int64)
    status, bad_batch, _ = decode_record_ranges(
        sections.main,
        sections.side,
        sections.use_side,
        sections.start,
        sections.end,
        counts,
        fields[:, BATCH_BASE_OFFSET],
        fields[:, BATCH_BASE_TIMESTAMP],
        append_ts,
        np.frombuffer((header_key or "").encode("utf-8"), dtype=np.uint8),
        header_key is not None,
        total,
        ranges,
    )
    if status:
        raise _reference_error(mv, obj, int(fields[bad_batch, BATCH_POS]))
    return ranges


def _record_columns(sections: _Sections, ranges: np.ndarray, header_key: str | None) -> dict[str, pa.Array]:
    """The columns that differ per record: offset, timestamp, key, value null/size, the named header."""
    value_len = ranges[RECORD_VALUE_LEN]
    if header_key is None:
        header_value = pa.nulls(ranges.shape[1], pa.large_binary())
    else:
        header_value = sections.gather(ranges, RECORD_HEADER_POS, RECORD_HEADER_LEN)
    return {
        "offset": pa.array(ranges[RECORD_OFFSET]),
        "timestamp": pa.array(ranges[RECORD_TIMESTAMP]),
        "key": sections.gather(ranges, RECORD_KEY_POS, RECORD_KEY_LEN),
        "value_is_null": pa.array(value_len < 0),
        "value_size": pa.array(np.maximum(value_len, 0).astype(np.int32)),
        "header_value": header_value,
    }


def _batch_columns(fields: np.ndarray) -> dict[str, pa.Array]:
    """The columns each record takes from its batch, repeated per record (records are grouped by batch)."""
    counts = fields[:, BATCH_RECORD_COUNT]

    def per_record(column: np.ndarray) -> np.ndarray:
        return np.repeat(column, counts)  # cheaper than a gather

    attrs = fields[:, BATCH_ATTRIBUTES]
    battrs = per_record(attrs)
    base = per_record(fields[:, BATCH_BASE_OFFSET])
    horizon = np.where(attrs & DELETE_HORIZON_FLAG_MASK, fields[:, BATCH_BASE_TIMESTAMP], -1)
    return {
        "producer_id": pa.array(per_record(fields[:, BATCH_PRODUCER_ID])),
        "producer_epoch": pa.array(per_record(fields[:, BATCH_PRODUCER_EPOCH].astype(np.int16))),
        "batch_base_offset": pa.array(base),
        "batch_last_offset": pa.array(base + per_record(fields[:, BATCH_LAST_OFFSET_DELTA])),
        "batch_position": pa.array(per_record(fields[:, BATCH_POS])),
        "partition_leader_epoch": pa.array(per_record(fields[:, BATCH_LEADER_EPOCH].astype(np.int32))),
        "transactional": pa.array((battrs & TRANSACTIONAL_FLAG_MASK) != 0),
        "control": pa.array((battrs & CONTROL_FLAG_MASK) != 0),
        "codec": pa.array((battrs & CODEC_MASK).astype(np.int8)),
        "delete_horizon_ms": pa.array(per_record(horizon)),
    }


_LARGE_BINARY = pa.large_binary()


def _binary(offsets: np.ndarray, data: np.ndarray, null: np.ndarray, kind: pa.DataType = _LARGE_BINARY) -> pa.Array:
    """A binary column over `data`; `kind` pa.binary() takes 32-bit offsets (the caller keeps it under 2 GiB)."""
    n = offsets.shape[0] - 1
    validity = None
    if null.any():
        validity = pa.py_buffer(np.packbits(~null, bitorder="little"))
    if kind == pa.binary():
        offsets = offsets.astype(np.int32)
    return pa.Array.from_buffers(kind, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)])


def binary_buffers(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """The (offsets as int64, data bytes) of a binary or large_binary column, the inverse of the scan's `_binary`:
    `offsets[i]:offsets[i + 1]` are value i's bytes in `data` (for a null value, whatever the array holds there:
    read its validity apart). Zero-copy where the offsets are int64 already; a sliced array keeps its slice."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        arr = arr.cast(pa.large_binary())
    n = len(arr)
    _validity, offsets_buf, data_buf = arr.buffers()
    if offsets_buf is None:
        return np.zeros(n + 1, np.int64), np.zeros(0, np.uint8)
    wide = pa.types.is_large_binary(arr.type)
    offsets = np.frombuffer(offsets_buf, np.int64 if wide else np.int32)[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64, copy=False), data


CONSUMER_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), False),
        pa.field("timestamp", pa.int64(), False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field(
            "headers",
            pa.list_(pa.struct([pa.field("key", pa.string(), False), pa.field("value", pa.binary())])),
            False,
        ),
    ]
)
"""A record as a consumer receives it: what `RecordScan.consumer_batches` yields (and `read_partition` returns)."""

CONSUMER_BATCH_BYTES = 256 << 20
"""The most key, value and header bytes in one yielded batch: Arrow's binary columns address 2 GiB at most."""


@dataclass(frozen=True)
class RecordScan:
    """A segment image decoded down to byte ranges: every batch's header fields and every record's fields, with
    no column built yet, so that a reader builds only the records it keeps."""

    fields: np.ndarray  # [n_batches, 13], columns `scan_kernels.BATCH_*`
    ranges: np.ndarray  # [N_RECORD_FIELDS, records], rows `scan_kernels.RECORD_*`
    sections: _Sections

    def consumer_batches(self, take: np.ndarray) -> Iterator[pa.RecordBatch]:
        """Records `take` (indexes into `ranges`' columns, ascending) as `CONSUMER_SCHEMA` batches, every header
        included, in at most `CONSUMER_BATCH_BYTES` of payload each (a larger record goes alone)."""
        kept = self.ranges[:, take]
        value_len = np.maximum(kept[RECORD_VALUE_LEN], 0)
        header_start = kept[RECORD_VALUE_POS] + value_len
        lists, *headers = header_ranges(self.sections.main, self.sections.side, self.sections.use_side,
                                        kept[RECORD_BATCH], header_start)
        header_sizes = np.concatenate([[0], np.cumsum(headers[1] + np.maximum(headers[3], 0))])
        payload = np.cumsum(np.maximum(kept[RECORD_KEY_LEN], 0) + value_len
                            + header_sizes[lists[1:]] - header_sizes[lists[:-1]])
        bounds = [0]
        while bounds[-1] < len(take):
            below = payload[bounds[-1] - 1] if bounds[-1] else 0
            stop = int(np.searchsorted(payload, below + CONSUMER_BATCH_BYTES, side="right"))
            bounds.append(max(stop, bounds[-1] + 1))
        if len(bounds) == 1:
            bounds.append(0)  # no record: one empty batch
        for start, stop in itertools.pairwise(bounds):
            yield self._batch(kept[:, start:stop], lists[start:stop + 1], headers)

    def keys(self, take: np.ndarray) -> pa.Array:
        """The keys of records `take` (null for a keyless record), without building anything else."""
        kept = self.ranges[:, take]
        return self._bytes(kept[RECORD_BATCH], kept[RECORD_KEY_POS], kept[RECORD_KEY_LEN])

    def _batch(self, records: np.ndarray, lists: np.ndarray, headers: list[np.ndarray]) -> pa.RecordBatch:
        """`CONSUMER_SCHEMA` columns of `records` (columns of `ranges`), whose headers are `lists` of `headers`."""
        first, last = int(lists[0]), int(lists[-1])
        key_pos, key_len, value_pos, value_len, owner = (column[first:last] for column in headers)
        return pa.RecordBatch.from_arrays(
            [pa.array(records[RECORD_OFFSET]), pa.array(records[RECORD_TIMESTAMP]),
             self._bytes(records[RECORD_BATCH], records[RECORD_KEY_POS], records[RECORD_KEY_LEN]),
             self._bytes(records[RECORD_BATCH], records[RECORD_VALUE_POS], records[RECORD_VALUE_LEN]),
             self._headers(lists - first, self._bytes(owner, key_pos, key_len), self._bytes(owner, value_pos,
                                                                                              value_len))],
            schema=CONSUMER_SCHEMA)

    def _bytes(self, batch_of: np.ndarray, pos: np.ndarray, length: np.ndarray) -> pa.Array:
        offsets, data = gather_ranges(self.sections.main, self.sections.side, self.sections.use_side, batch_of,
                                      pos, length)
        return _binary(offsets, data, length < 0, pa.binary())

    def _headers(self, lists: np.ndarray, keys: pa.Array, values: pa.Array) -> pa.Array:
        names = keys.view(pa.string())
        try:
            names.validate(full=True)
        except pa.ArrowInvalid:  # decoded as Kafka's consumer does (new String(bytes, UTF_8))
            names = pa.array([k.decode("utf-8", "replace") for k in keys.to_pylist()], pa.string())
        pairs = pa.StructArray.from_arrays([names, values],
                                           fields=list(CONSUMER_SCHEMA.field("headers").type.value_type))
        return pa.ListArray.from_arrays(pa.array(lists.astype(np.int32)), pairs)


def scan_records(data: bytes | bytearray | memoryview, *, obj: str = "<segment>") -> RecordScan:
    """Check and decode a segment image (CRCs included) into byte ranges; errors as `scan_segment`."""
    mv = _readonly(data)
    fields, sections, ranges = _decoded(mv, obj, None, True)
    return RecordScan(fields, ranges, sections)


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


__all__ = [
    "CONSUMER_SCHEMA", "LOG_OVERHEAD", "RECORD_SCHEMA", "RecordScan", "SegmentScan", "batch_fields", "check_crcs",
    "headers_of", "scan_ranges", "scan_records", "scan_segment",
]
