"""Record batch v2: golden vector, round trips over every codec, kafka-python as referee, corruption."""

from __future__ import annotations

import struct
import warnings

import pytest
from hypothesis import given

from compaction.errors import CorruptBatchError, CrcMismatchError, InvalidMagicError, UnsupportedMagicError
from compaction.format.batch import (
    Header,
    Record,
    RecordBatch,
    TimestampType,
    build_batch,
    decode_batch,
    empty_batch_header,
    encode_batch,
)
from compaction.format.codecs import Codec
from compaction.format.control import ControlType, parse_control_record
from tests.unit.random_batches import any_batches, data_batches

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

GOLDEN_HEX = (
    "000000000000000000000055ffffffff02e58cf1ff00000000000100000000000454c300000000000454c3"
    "ffffffffffffffffffffffffffff0000000220000000086b6579310c76616c756531002400e1bf2202086b"
    "6579320c76616c75653200"
)


def golden() -> RecordBatch:
    return build_batch([Record(0, 283843, b"key1", b"value1"), Record(1, 1234, b"key2", b"value2")])


def test_golden_batch_is_reproduced_byte_for_byte() -> None:
    data = encode_batch(golden())
    assert data.hex() == GOLDEN_HEX
    assert golden().crc == 3851219455
    assert decode_batch(data).records == golden().records


@given(any_batches)
def test_round_trip_every_codec_and_flag(batch: RecordBatch) -> None:
    data = encode_batch(batch)
    back = decode_batch(data)
    expected_records = batch.records
    if batch.timestamp_type is TimestampType.LOG_APPEND_TIME:
        expected_records = tuple(
            Record(r.offset, batch.max_timestamp, r.key, r.value, r.headers) for r in batch.records
        )
    assert back.records == expected_records
    assert (back.base_offset, back.last_offset_delta, back.attributes) == (
        batch.base_offset,
        batch.last_offset_delta,
        batch.attributes,
    )
    assert (back.producer_id, back.producer_epoch, back.base_sequence, back.partition_leader_epoch) == (
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        batch.partition_leader_epoch,
    )
    assert (back.base_timestamp, back.max_timestamp, back.size) == (
        batch.base_timestamp,
        batch.max_timestamp,
        len(data),
    )
    assert back.delete_horizon_ms == batch.delete_horizon_ms
    assert (
        encode_batch(back) == data
        or batch.codec is not Codec.NONE
        or (batch.timestamp_type is TimestampType.LOG_APPEND_TIME)
    )


@given(data_batches())
def test_kafka_python_decodes_what_we_encode(batch: RecordBatch) -> None:
    data = encode_batch(batch)
    ref = DefaultRecordBatch(bytearray(data))
    assert ref.validate_crc()
    assert (ref.base_offset, ref.last_offset_delta, ref.producer_id, ref.producer_epoch) == (
        batch.base_offset,
        batch.last_offset_delta,
        batch.producer_id,
        batch.producer_epoch,
    )
    assert ref.compression_type == int(batch.codec)
    assert ref.is_transactional == batch.is_transactional
    got = [(r.offset, r.key, r.value, [(k, v) for k, v in r.headers]) for r in ref]
    want = [(r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in batch.records]
    assert got == want


@pytest.mark.parametrize("codec", list(Codec))
def test_we_decode_what_kafka_python_encodes(codec: Codec) -> None:
    builder = DefaultRecordBatchBuilder(2, int(codec), False, 42, 3, 17, 1 << 20)
    expected = []
    for i in range(50):
        key = None if i % 7 == 0 else b"k%d" % (i % 10)
        value = None if i % 5 == 0 else b"value-%d" % i * 3
        hdrs = [("version", struct.pack(">q", i))] if i % 2 else []
        builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=hdrs)
        expected.append(Record(i, 1_700_000_000_000 + i, key, value, tuple(Header(k, v) for k, v in hdrs)))
    data = bytes(builder.build())
    batch = decode_batch(data)
    assert batch.records == tuple(expected)
    assert batch.codec is codec
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (42, 3, 17)


def test_control_batch_round_trip_and_parse() -> None:
    from compaction.format.control import end_txn_marker

    marker = end_txn_marker(ControlType.ABORT, 10, 5, producer_id=9, producer_epoch=2, coordinator_epoch=7)
    back = decode_batch(encode_batch(marker))
    assert back.is_control and back.is_transactional and back.attributes == 0x30
    parsed = parse_control_record(back.records[0])
    assert (parsed.type, parsed.coordinator_epoch) == (ControlType.ABORT, 7)


def test_unknown_control_type_is_kept_opaque() -> None:
    rec = Record(0, 0, struct.pack(">hh", 0, 42), b"opaque")
    batch = decode_batch(encode_batch(build_batch([rec], control=True)))
    assert parse_control_record(batch.records[0]).type_id == 42
    assert batch.records[0].value == b"opaque"


def test_empty_batch_header_keeps_offsets_and_sequence() -> None:
    batch = build_batch(
        [Record(3, 10, b"a", b"1"), Record(4, 12, b"b", b"2")],
        producer_id=1,
        producer_epoch=5,
        base_sequence=10,
        partition_leader_epoch=293,
        codec=Codec.LZ4,
        delete_horizon_ms=99,
    )
    empty = decode_batch(empty_batch_header(batch))
    assert len(empty_batch_header(batch)) == 61
    assert (empty.base_offset, empty.last_offset, empty.records, empty.max_timestamp) == (3, 4, (), 12)
    assert (empty.base_sequence, empty.last_sequence, empty.codec, empty.delete_horizon_ms) == (
        10,
        11,
        Codec.NONE,
        None,
    )
    assert empty.base_timestamp == -1 and empty.partition_leader_epoch == 293


# --- corruption at named byte offsets ---------------------------------------------------------


def corrupt(data: bytes, position: int, value: int) -> bytes:
    out = bytearray(data)
    out[position] = value
    return bytes(out)


def test_crc_mismatch_names_the_crc_position() -> None:
    data = corrupt(encode_batch(golden()), 70, 0x00)
    with pytest.raises(CrcMismatchError) as err:
        decode_batch(data)
    assert err.value.position == 17


def test_invalid_magic_names_byte_16() -> None:
    with pytest.raises(InvalidMagicError) as err:
        decode_batch(corrupt(encode_batch(golden()), 16, 0xFF))
    assert err.value.position == 16


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_magic_is_a_clear_error(magic: int) -> None:
    with pytest.raises(UnsupportedMagicError, match="legacy message set") as err:
        decode_batch(corrupt(encode_batch(golden()), 16, magic))
    assert err.value.position == 16


def test_length_past_the_end_names_the_length_field() -> None:
    data = bytearray(encode_batch(golden()))
    struct.pack_into(">i", data, 8, 5000)
    with pytest.raises(CorruptBatchError) as err:
        decode_batch(bytes(data))
    assert err.value.position == 8


def test_record_overrun_inside_a_batch_is_reported_at_the_records() -> None:
    data = bytearray(encode_batch(golden()))
    struct.pack_into(">i", data, 57, 3)  # three records declared, two present
    with pytest.raises(CorruptBatchError):
        decode_batch(bytes(data), verify_crc=False)
