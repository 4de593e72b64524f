"""Record batch v2: the readable reference decoder and the encoder (Kafka's `DefaultRecordBatch`).

The records inside a batch are `record.py` (Kafka's `DefaultRecord`); `Record` and `Header` are re-exported
here because a batch is built from them.

The batch layout is written down once below, each field's offset derived from the one before, as in
Kafka's `DefaultRecordBatch`. The CRC-32C covers bytes [21, end): attributes through the last record, so
baseOffset, batchLength, partitionLeaderEpoch and magic may change without recomputing it.

This decoder is the reference the columnar scan (`scan.py`) is tested against; it favours clarity
over speed and materialises every record.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import TypedDict, Unpack

import crc32c as _crc32c

from compaction.errors import CorruptBatchError, CrcMismatchError, InvalidMagicError, UnsupportedMagicError
from compaction.format.codecs import Codec, compress, decompress
from compaction.format.record import Header as Header
from compaction.format.record import Record, decode_records, encode_record

# --- layout (DefaultRecordBatch) -------------------------------------------------------------------
BASE_OFFSET_OFFSET = 0
BASE_OFFSET_LENGTH = 8
LENGTH_OFFSET = BASE_OFFSET_OFFSET + BASE_OFFSET_LENGTH
LENGTH_LENGTH = 4
PARTITION_LEADER_EPOCH_OFFSET = LENGTH_OFFSET + LENGTH_LENGTH
PARTITION_LEADER_EPOCH_LENGTH = 4
MAGIC_OFFSET = PARTITION_LEADER_EPOCH_OFFSET + PARTITION_LEADER_EPOCH_LENGTH
MAGIC_LENGTH = 1
CRC_OFFSET = MAGIC_OFFSET + MAGIC_LENGTH
CRC_LENGTH = 4
ATTRIBUTES_OFFSET = CRC_OFFSET + CRC_LENGTH
ATTRIBUTE_LENGTH = 2
LAST_OFFSET_DELTA_OFFSET = ATTRIBUTES_OFFSET + ATTRIBUTE_LENGTH
LAST_OFFSET_DELTA_LENGTH = 4
BASE_TIMESTAMP_OFFSET = LAST_OFFSET_DELTA_OFFSET + LAST_OFFSET_DELTA_LENGTH
BASE_TIMESTAMP_LENGTH = 8
MAX_TIMESTAMP_OFFSET = BASE_TIMESTAMP_OFFSET + BASE_TIMESTAMP_LENGTH
MAX_TIMESTAMP_LENGTH = 8
PRODUCER_ID_OFFSET = MAX_TIMESTAMP_OFFSET + MAX_TIMESTAMP_LENGTH
PRODUCER_ID_LENGTH = 8
PRODUCER_EPOCH_OFFSET = PRODUCER_ID_OFFSET + PRODUCER_ID_LENGTH
PRODUCER_EPOCH_LENGTH = 2
BASE_SEQUENCE_OFFSET = PRODUCER_EPOCH_OFFSET + PRODUCER_EPOCH_LENGTH
BASE_SEQUENCE_LENGTH = 4
RECORDS_COUNT_OFFSET = BASE_SEQUENCE_OFFSET + BASE_SEQUENCE_LENGTH
RECORDS_COUNT_LENGTH = 4
RECORDS_OFFSET = RECORDS_COUNT_OFFSET + RECORDS_COUNT_LENGTH
RECORD_BATCH_OVERHEAD = RECORDS_OFFSET  # 61
LOG_OVERHEAD = LENGTH_OFFSET + LENGTH_LENGTH  # 12
HEADER_SIZE_UP_TO_MAGIC = MAGIC_OFFSET + MAGIC_LENGTH  # 17
MIN_BATCH_SIZE_FIELD = 14  # LegacyRecord.RECORD_OVERHEAD_V0: the smallest legal batchLength

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
"""The header's fields in layout order, baseOffset to recordsCount (the CRC unsigned)."""
assert BATCH_HEADER.size == RECORD_BATCH_OVERHEAD

CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1
CURRENT_MAGIC = 2
INT32_MAX = 2**31 - 1


class TimestampType(IntEnum):
    """Attribute bit 3."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli), hardware accelerated."""
    return int(_crc32c.crc32c(data))


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's `DefaultRecordBatch.incrementSequence`: wraps at Int.MaxValue."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def decrement_sequence(sequence: int, decrement: int) -> int:
    """Kafka's `DefaultRecordBatch.decrementSequence`: wraps back past 0 to Int.MaxValue."""
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


class BatchAttributes:
    """What a batch's attributes and offsets imply; shared by `RecordBatch` and the header-only `BatchHeader`.

    Subclasses provide `attributes`, `base_offset`, `last_offset_delta` and `base_timestamp`.
    """

    attributes: int
    base_offset: int
    last_offset_delta: int
    base_timestamp: int

    @property
    def codec(self) -> Codec:
        return Codec(self.attributes & CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes & TIMESTAMP_TYPE_MASK) >> 3)

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def is_transactional_or_control(self) -> bool:
        """A batch the transaction-marker walk reads (`compaction.strategies.transactions.states_at`)."""
        return bool(self.attributes & (TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK))

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_FLAG_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.has_delete_horizon else None

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1



@dataclass(frozen=True)
class RecordBatch(BatchAttributes):
    """A decoded v2 record batch. `records` holds what is physically present (may be fewer than offsets)."""

    base_offset: int
    last_offset_delta: int
    records: tuple[Record, ...] = ()
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH
    attributes: int = 0
    base_timestamp: int = NO_TIMESTAMP
    max_timestamp: int = NO_TIMESTAMP
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    crc: int = 0
    size: int = field(default=0, compare=False)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)


def make_attributes(
    codec: Codec = Codec.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    transactional: bool = False,
    control: bool = False,
    delete_horizon: bool = False,
) -> int:
    """Kafka's `computeAttributes`."""
    attrs = int(codec) & CODEC_MASK
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attrs |= TIMESTAMP_TYPE_MASK
    if transactional:
        attrs |= TRANSACTIONAL_FLAG_MASK
    if control:
        attrs |= CONTROL_FLAG_MASK
    if delete_horizon:
        attrs |= DELETE_HORIZON_FLAG_MASK
    return attrs


# --- decoding --------------------------------------------------------------------------------------


def check_magic(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """Validate the magic byte of the batch at `pos`; returns it. Legacy magic gets its own error."""
    magic = buf[pos + MAGIC_OFFSET]
    if magic > 127:
        magic -= 256
    if magic in (0, 1):
        raise UnsupportedMagicError(
            f"legacy message set (magic {magic}); kcompact reads record batch v2 (magic 2) only",
            position=pos + MAGIC_OFFSET,
        )
    if magic != CURRENT_MAGIC:
        raise InvalidMagicError(f"invalid magic {magic}, expected 2", position=pos + MAGIC_OFFSET)
    return magic


def decode_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, verify_crc: bool = True
) -> RecordBatch:
    """Decode the complete v2 batch starting at `pos` of `buf`.

    Raises a CorruptInputError subclass whose `position` is absolute within `buf`.
    """
    mv = memoryview(buf)
    if len(mv) - pos < RECORD_BATCH_OVERHEAD:
        raise CorruptBatchError(
            f"batch header needs {RECORD_BATCH_OVERHEAD} bytes, {len(mv) - pos} left", position=pos
        )
    check_magic(mv, pos)
    (base_offset, length, ple, _magic, crc, attrs, lod, base_ts, max_ts, pid, pepoch, bseq, count) = (
        BATCH_HEADER.unpack_from(mv, pos)
    )
    size = _checked_size(mv, pos, length, crc, verify_crc)
    if count < 0:
        raise CorruptBatchError(f"negative record count {count}", position=pos + RECORDS_COUNT_OFFSET)
    codec_id = attrs & CODEC_MASK
    if codec_id > Codec.ZSTD:
        raise CorruptBatchError(f"unknown compression codec id {codec_id}", position=pos + ATTRIBUTES_OFFSET)
    section = mv[pos + RECORDS_OFFSET : pos + size]
    log_append_time = max_ts if attrs & TIMESTAMP_TYPE_MASK else None
    records = _decode_section(section, pos + RECORDS_OFFSET, Codec(codec_id), count, base_offset, base_ts,
                              log_append_time)
    return RecordBatch(
        base_offset=base_offset,
        last_offset_delta=lod,
        records=records,
        partition_leader_epoch=ple,
        attributes=attrs,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        producer_id=pid,
        producer_epoch=pepoch,
        base_sequence=bseq,
        crc=crc,
        size=size,
    )


def _checked_size(mv: memoryview, pos: int, length: int, crc: int, verify_crc: bool) -> int:
    """The batch's size from its batchLength, checked against the buffer (and its CRC-32C, with `verify_crc`)."""
    size = length + LOG_OVERHEAD
    if length < RECORD_BATCH_OVERHEAD - LOG_OVERHEAD:
        raise CorruptBatchError(
            f"batch length {length} is smaller than the v2 header", position=pos + LENGTH_OFFSET
        )
    if pos + size > len(mv):
        raise CorruptBatchError(
            f"batch of {size} bytes runs past the end ({len(mv) - pos} bytes left)",
            position=pos + LENGTH_OFFSET,
        )
    if verify_crc:
        computed = crc32c(mv[pos + ATTRIBUTES_OFFSET : pos + size])
        if computed != crc:
            raise CrcMismatchError(
                f"CRC-32C mismatch: stored {crc}, computed {computed}", position=pos + CRC_OFFSET
            )
    return size


def _decode_section(section: memoryview, records_pos: int, codec: Codec, count: int, base_offset: int,
                    base_ts: int, log_append_time: int | None) -> tuple[Record, ...]:
    try:
        data: bytes | memoryview = section if codec is Codec.NONE else decompress(codec, section)
        return decode_records(data, count, base_offset, base_ts, log_append_time)
    except CorruptBatchError as exc:
        # Inside a compressed stream there is no file position; point at the records section instead.
        inner = exc.position if exc.position is not None and codec is Codec.NONE else 0
        raise CorruptBatchError(exc.detail, position=records_pos + inner) from exc


# --- encoding --------------------------------------------------------------------------------------


def encode_batch(batch: RecordBatch) -> bytes:
    """Serialise `batch`, compressing with its codec and writing a fresh CRC-32C.

    `base_timestamp` and `max_timestamp` are taken as given: use `build_batch` to derive them.
    """
    records = b"".join(encode_record(r, batch.base_offset, batch.base_timestamp) for r in batch.records)
    return frame_batch(
        compress(batch.codec, records),
        base_offset=batch.base_offset,
        partition_leader_epoch=batch.partition_leader_epoch,
        attributes=batch.attributes,
        last_offset_delta=batch.last_offset_delta,
        base_timestamp=batch.base_timestamp,
        max_timestamp=batch.max_timestamp,
        producer_id=batch.producer_id,
        producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence,
        records_count=len(batch.records),
    )


class BatchFields(TypedDict):
    """The header fields a writer chooses for a framed batch (`frame_batch`, `frame_into`); batchLength, magic and
    the CRC are filled in from the section."""

    base_offset: int
    partition_leader_epoch: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int


def frame_batch(payload: bytes, **fields: Unpack[BatchFields]) -> bytes:
    """A v2 batch around `payload`, its records section as stored (compressed or not): the header with
    batchLength and magic filled in, then a fresh CRC-32C."""
    out = bytearray(RECORD_BATCH_OVERHEAD + len(payload))
    out[RECORD_BATCH_OVERHEAD:] = payload
    frame_into(out, len(payload), **fields)
    return bytes(out)


def frame_into(buf: bytearray | memoryview, payload_size: int, **fields: Unpack[BatchFields]) -> None:
    """`frame_batch` in place: `buf` holds the records section (`payload_size` bytes, as stored) from byte 61 on;
    its first 61 bytes become the header, CRC-32C included (for a writer that builds the section where the batch
    goes, instead of copying it behind a header)."""
    BATCH_HEADER.pack_into(
        buf,
        0,
        fields["base_offset"],
        RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + payload_size,
        fields["partition_leader_epoch"],
        CURRENT_MAGIC,
        0,
        fields["attributes"],
        fields["last_offset_delta"],
        fields["base_timestamp"],
        fields["max_timestamp"],
        fields["producer_id"],
        fields["producer_epoch"],
        fields["base_sequence"],
        fields["records_count"],
    )
    struct.pack_into(">I", buf, CRC_OFFSET,
                     crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:RECORD_BATCH_OVERHEAD + payload_size]))


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int | None = None,
    last_offset: int | None = None,
    codec: Codec = Codec.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    transactional: bool = False,
    control: bool = False,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    delete_horizon_ms: int | None = None,
    max_timestamp: int | None = None,
) -> RecordBatch:
    """A batch over `records` with the header fields derived as `MemoryRecordsBuilder` derives them.

    base/last offset default to the first/last record's offset (an explicit `last_offset` keeps
    lastOffsetDelta when records were removed). The base timestamp is the delete horizon when given,
    else the first record's timestamp; maxTimestamp is the max over the records unless given (it is
    kept for LogAppendTime and empty batches).
    """
    if base_offset is None:
        if not records:
            raise ValueError("an empty batch needs an explicit base_offset")
        base_offset = records[0].offset
    if last_offset is None:
        last_offset = records[-1].offset if records else base_offset
    first_ts = records[0].timestamp if records else NO_TIMESTAMP
    base_ts = delete_horizon_ms if delete_horizon_ms is not None else first_ts
    if max_timestamp is None:
        max_timestamp = max((r.timestamp for r in records), default=NO_TIMESTAMP)
    attrs = make_attributes(codec, timestamp_type, transactional, control, delete_horizon_ms is not None)
    batch = RecordBatch(
        base_offset=base_offset,
        last_offset_delta=last_offset - base_offset,
        records=tuple(records),
        partition_leader_epoch=partition_leader_epoch,
        attributes=attrs,
        base_timestamp=base_ts,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    data = encode_batch(batch)
    return replace(batch, crc=struct.unpack_from(">I", data, CRC_OFFSET)[0], size=len(data))


def empty_batch_header(batch: RecordBatch) -> bytes:
    """Kafka's `writeEmptyHeader`: the 61-byte RETAIN_EMPTY form of `batch` (codec none, horizon cleared)."""
    attrs = make_attributes(
        Codec.NONE, batch.timestamp_type, batch.is_transactional, batch.is_control, delete_horizon=False
    )
    return encode_batch(
        RecordBatch(
            base_offset=batch.base_offset,
            last_offset_delta=batch.last_offset_delta,
            records=(),
            partition_leader_epoch=batch.partition_leader_epoch,
            attributes=attrs,
            base_timestamp=NO_TIMESTAMP,
            max_timestamp=batch.max_timestamp,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
        )
    )
