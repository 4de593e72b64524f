"""Record v2 (Kafka's `DefaultRecord`): one record's fields and its varint-framed encoding inside a batch.

A record is `length varint` then attributes (int8), timestampDelta (varlong), offsetDelta, key, value
(varint-length bytes, -1 for null) and headers (a count, then key/value pairs), all relative to the batch's
base offset and base timestamp. Header keys are UTF-8 strings in Kafka; undecodable bytes survive via
surrogateescape. Decoding checks that every length stays inside the record and the section; positions in
errors are relative to the records section (the batch decoder makes them absolute).
"""

from __future__ import annotations

from dataclasses import dataclass

from compaction.errors import CorruptBatchError
from compaction.format.varint import read_varint, write_varint


@dataclass(frozen=True)
class Header:
    """A record header. Keys are UTF-8 strings in Kafka; undecodable bytes survive via surrogateescape."""

    key: str
    value: bytes | None


@dataclass(frozen=True)
class Record:
    """One record, with its absolute offset and timestamp resolved against its batch."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    attributes: int = 0


def decode_records(
    data: bytes | memoryview, count: int, base_offset: int, base_ts: int, log_append_ts: int | None
) -> tuple[Record, ...]:
    """The `count` records of a batch's uncompressed records section `data`.

    Offsets and timestamps are resolved against the batch's; `log_append_ts` (the batch's maxTimestamp
    under LogAppendTime) replaces every record's timestamp when given. Raises CorruptBatchError with a
    position within `data` for a length that overruns, a null header key, or bytes left over.
    """
    records = []
    pos = 0
    for _ in range(count):
        start = pos
        length, pos = read_varint(data, pos, 5)
        body_start = pos
        if length < 0 or pos + length > len(data):
            raise CorruptBatchError(f"record length {length} overruns the batch", position=start)
        attributes = data[pos]
        pos += 1
        ts_delta, pos = read_varint(data, pos)
        offset_delta, pos = read_varint(data, pos, 5)
        key, pos = _read_bytes(data, pos)
        value, pos = _read_bytes(data, pos)
        n_headers, pos = read_varint(data, pos, 5)
        if n_headers < 0 or n_headers > len(data) - pos:
            raise CorruptBatchError(f"invalid header count {n_headers}", position=pos)
        headers = []
        for _h in range(n_headers):
            hkey, pos = _read_bytes(data, pos)
            if hkey is None:
                raise CorruptBatchError("null header key", position=pos)
            hvalue, pos = _read_bytes(data, pos)
            headers.append(Header(hkey.decode("utf-8", "surrogateescape"), hvalue))
        if pos - body_start != length:
            raise CorruptBatchError(
                f"record declares {length} bytes but has {pos - body_start}", position=start
            )
        timestamp = log_append_ts if log_append_ts is not None else base_ts + ts_delta
        records.append(Record(base_offset + offset_delta, timestamp, key, value, tuple(headers), attributes))
    if pos != len(data):
        raise CorruptBatchError(
            f"incorrect declared batch size: {len(data) - pos} bytes remain after {count} records",
            position=pos,
        )
    return tuple(records)


def _read_bytes(data: bytes | memoryview, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_varint(data, pos, 5)
    if length < 0:
        return None, pos
    if pos + length > len(data):
        raise CorruptBatchError(f"field of {length} bytes overruns the record", position=pos)
    return bytes(data[pos : pos + length]), pos + length


def _write_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        write_varint(out, -1)
    else:
        write_varint(out, len(value))
        out += value


def encode_record(record: Record, base_offset: int, base_timestamp: int) -> bytes:
    """One record (length-prefixed) relative to its batch's base offset and base timestamp."""
    body = bytearray()
    body.append(record.attributes & 0xFF)
    write_varint(body, record.timestamp - base_timestamp)
    write_varint(body, record.offset - base_offset)
    _write_bytes(body, record.key)
    _write_bytes(body, record.value)
    write_varint(body, len(record.headers))
    for header in record.headers:
        _write_bytes(body, header.key.encode("utf-8", "surrogateescape"))
        _write_bytes(body, header.value)
    out = bytearray()
    write_varint(out, len(body))
    return bytes(out + body)
