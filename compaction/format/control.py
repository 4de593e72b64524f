"""Control records: transaction markers and the KRaft-only types (Kafka's `ControlRecordType`, `EndTransactionMarker`).

A control record's key is version int16 + type int16; an end-transaction marker's value is
version int16 + coordinatorEpoch int32. Unknown types are kept as opaque (`ControlType.UNKNOWN`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from compaction.errors import CorruptBatchError
from compaction.format.batch import Record, RecordBatch, build_batch

_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")


class ControlType(IntEnum):
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6
    UNKNOWN = -1


@dataclass(frozen=True)
class ControlRecord:
    """A parsed control record key, plus the coordinator epoch for end-transaction markers."""

    version: int
    type: ControlType
    type_id: int
    coordinator_epoch: int | None = None


def control_key(kind: ControlType, version: int = 0) -> bytes:
    return _KEY.pack(version, int(kind))


def parse_control_record(record: Record) -> ControlRecord:
    """Parse a control record; raises CorruptBatchError for a malformed key or marker value."""
    if record.key is None or len(record.key) < _KEY.size:
        raise CorruptBatchError(f"control record at offset {record.offset} has a key shorter than 4 bytes")
    version, type_id = _KEY.unpack_from(record.key)
    if version < 0:
        raise CorruptBatchError(
            f"control record at offset {record.offset} has negative key version {version}"
        )
    try:
        kind = ControlType(type_id)
    except ValueError:
        kind = ControlType.UNKNOWN
    epoch = None
    if kind in (ControlType.ABORT, ControlType.COMMIT):
        if record.value is None or len(record.value) < _MARKER_VALUE.size:
            raise CorruptBatchError(
                f"transaction marker at offset {record.offset} has a value shorter than 6 bytes"
            )
        _v, epoch = _MARKER_VALUE.unpack_from(record.value)
    return ControlRecord(version, kind, type_id, epoch)


def end_txn_marker(
    kind: ControlType,
    offset: int,
    timestamp: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    partition_leader_epoch: int = -1,
) -> RecordBatch:
    """A COMMIT or ABORT marker batch, as `MemoryRecords.withEndTransactionMarker` writes it."""
    if kind not in (ControlType.ABORT, ControlType.COMMIT):
        raise ValueError(f"not an end-transaction marker type: {kind!r}")
    record = Record(offset, timestamp, control_key(kind), _MARKER_VALUE.pack(0, coordinator_epoch))
    return build_batch(
        [record],
        transactional=True,
        control=True,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
    )


def batch_control_type(batch: RecordBatch) -> ControlType | None:
    """The control type of a control batch's (single) record, None for data or emptied batches."""
    if not batch.is_control or not batch.records:
        return None
    return parse_control_record(batch.records[0]).type
