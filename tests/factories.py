"""The small values tests build again and again, built one way: metadata rows of tiered segments, records and
transaction markers. Each factory fills what a test does not name with a plain default."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from compaction.format.batch import Header, Record, RecordBatch
from compaction.format.checkpoints import EpochEntry
from compaction.format.control import ControlType, end_txn_marker
from compaction.metadata import (
    ChangeSet,
    CleanerOffset,
    MetadataTable,
    NewSegment,
    ObjectKey,
    ObjectSuffix,
    SegmentMetadata,
    SegmentState,
    StateChange,
    new_kafka_uuid,
)

TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAQ"

Key = int | str | bytes | None


def as_bytes(value: Key) -> bytes | None:
    """A key or value as Kafka's tests write them: an int as its decimal string."""
    if isinstance(value, int):
        return str(value).encode()
    return value.encode() if isinstance(value, str) else value


def record(offset: int, key: Key = b"k", value: Key = b"v", *, ts: int = 0,
           headers: Iterable[Header | tuple[str, bytes | None]] = ()) -> Record:
    """A record; headers as `Header`s or (key, value) pairs."""
    return Record(offset, ts, as_bytes(key), as_bytes(value),
                  tuple(h if isinstance(h, Header) else Header(*h) for h in headers))


def marker(kind: ControlType, offset: int, pid: int, *, ts: int = 0, epoch: int = 0, coordinator_epoch: int = 0,
           leader_epoch: int = -1) -> RecordBatch:
    """A COMMIT or ABORT marker batch of producer `pid` at `offset`."""
    return end_txn_marker(kind, offset, ts, pid, epoch, coordinator_epoch, leader_epoch)


def segment(start: int, end: int, *, segment_id: str | None = None, topic: str = "t", topic_id: str = TOPIC_ID,
            partition: int = 0, size: int = 100, max_ts: int = 0, event_ts: int = 0, first_ts: int | None = None,
            state: SegmentState = SegmentState.COPY_SEGMENT_FINISHED, cleaner_offsets: tuple[CleanerOffset, ...] = (),
            object_keys: tuple[ObjectKey, ...] | None = None, fencing_epoch: int = 0) -> SegmentMetadata:
    """The metadata row of segment [start, end] in leader epoch 0, with its `.log` unless `object_keys` is given
    and a fresh segment id unless `segment_id` is."""
    sid = segment_id or new_kafka_uuid()
    if object_keys is None:
        object_keys = object_keys_of(topic, topic_id, partition, start, sid)
    return SegmentMetadata(
        segment_id=sid,
        topic=topic,
        topic_id=topic_id,
        partition=partition,
        start_offset=start,
        end_offset=end,
        max_timestamp_ms=max_ts,
        event_timestamp_ms=event_ts,
        segment_leader_epochs=(EpochEntry(0, start),),
        segment_size_bytes=size,
        state=state,
        cleaner_offsets=cleaner_offsets,
        object_keys=object_keys,
        writer="w",
        fencing_epoch=fencing_epoch,
        first_batch_max_timestamp_ms=first_ts,
    )


def object_keys_of(topic: str, topic_id: str, partition: int, start: int, segment_id: str,
                   suffixes: Iterable[ObjectSuffix] = (ObjectSuffix.LOG,)) -> tuple[ObjectKey, ...]:
    """A segment's files where `storage.layout` puts them, written out so that any segment id will do."""
    return tuple(ObjectKey(s, f"{topic}-{topic_id}/{partition}/{start:020d}-{segment_id}.{s.value}") for s in suffixes)


def new_segment(start: int, end: int, *, topic: str = "t", topic_id: str = TOPIC_ID, partition: int = 0,
                size: int = 100, max_ts: int = 0, leader_epoch: int = 0,
                state: SegmentState = SegmentState.COPY_SEGMENT_FINISHED,
                suffixes: Iterable[ObjectSuffix] = (ObjectSuffix.LOG,), record_count: int | None = None) -> NewSegment:
    """A segment [start, end] that a change set adds, in `leader_epoch`, with a file of each of `suffixes`."""
    sid = new_kafka_uuid()
    return NewSegment(sid, start, end, max_ts, (EpochEntry(leader_epoch, start),), size,
                      object_keys_of(topic, topic_id, partition, start, sid, suffixes), state=state,
                      record_count=record_count)


def compaction(table: MetadataTable, replaced: Sequence[str], merged: tuple[int, int], cleaner_offset: int, *,
               topic: str = "t", epoch: int = 0, writer: str = "kcompact", topic_id: str = TOPIC_ID,
               max_ts: int = 0) -> tuple[ChangeSet, NewSegment]:
    """A compaction of `topic`-0 planned at the table's latest version: the segments `replaced` swapped for one
    segment `merged`, under fencing epoch `epoch`."""
    segment = new_segment(*merged, topic=topic, topic_id=topic_id, max_ts=max_ts)
    cs = ChangeSet.planned_from(table.partition_snapshot(topic, 0), fencing_epoch=epoch, writer=writer,
                                new_segments=[segment], cleaner_offset=cleaner_offset,
                                state_changes=[StateChange(i, SegmentState.DELETE_SEGMENT_STARTED) for i in replaced])
    return cs, segment
