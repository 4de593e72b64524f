"""Re-encoding one batch the way `MemoryRecords.filterTo` does.

A rebuilt batch keeps everything that identifies it: base offset and lastOffsetDelta (so the last offset and
the producer's last sequence survive even when its last record is gone), codec (at that codec's default
level), timestamp type, producer id and epoch, base sequence, transactional and control flags and partition
leader epoch. Retained records keep their absolute offsets, timestamps, keys, values and headers; their
attributes are written as 0. The base timestamp is the delete horizon if there is one (record timestamps are
re-expressed against it, deltas may go negative), else the first retained record's timestamp. maxTimestamp is
the max over the retained records for CreateTime and the original for LogAppendTime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from compaction.format.batch import Record, RecordBatch, TimestampType, empty_batch_header, make_attributes
from compaction.format.segment import BatchHeader


def rebuild_batch(batch: RecordBatch, records: Sequence[Record], delete_horizon_ms: int | None) -> RecordBatch:
    """`batch` holding only `records` (non-empty, a subset of its own), with the given horizon (None: none)."""
    if not records:
        raise ValueError("a rebuilt batch keeps at least one record; use empty_header for none")
    kept = tuple(r if r.attributes == 0 else replace(r, attributes=0) for r in records)
    if batch.timestamp_type is TimestampType.LOG_APPEND_TIME:
        max_timestamp = batch.max_timestamp
    else:
        max_timestamp = max(r.timestamp for r in kept)
    attributes = make_attributes(
        batch.codec, batch.timestamp_type, batch.is_transactional, batch.is_control, delete_horizon_ms is not None
    )
    return replace(
        batch,
        records=kept,
        attributes=attributes,
        base_timestamp=kept[0].timestamp if delete_horizon_ms is None else delete_horizon_ms,
        max_timestamp=max_timestamp,
    )


def empty_header(header: BatchHeader) -> bytes:
    """The 61-byte RETAIN_EMPTY form of the batch behind `header` (`writeEmptyHeader`)."""
    return empty_batch_header(
        RecordBatch(
            base_offset=header.base_offset,
            last_offset_delta=header.last_offset_delta,
            partition_leader_epoch=header.partition_leader_epoch,
            attributes=header.attributes,
            base_timestamp=header.base_timestamp,
            max_timestamp=header.max_timestamp,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
        )
    )
