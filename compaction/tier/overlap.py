"""A broker's copy that overlaps the tier: what the metadata table keeps of it.

Kafka's replicas roll their segments at different offsets (local retention rolls a leader's non-empty active
segment on its own clock, `UnifiedLog.deleteOldSegments`), and a new leader copies from the highest tiered offset
on, starting with the *whole* local segment that holds it (`RemoteLogManager.copyLogSegmentsToRemote`:
`candidateLogSegments(log, copiedOffset + 1, lso)` takes the floor segment). So after a failover its first copy
`[s, e]` overlaps the live segments up to the tier's end `E` (`s <= E < e`). Kafka's own metadata cache keeps both
and resolves reads by leader-epoch lineage; kcompact's rows never overlap (`compaction.metadata.change_set`), and
the offsets `[s, E]` of the tier may already be compacted, where the broker's copy holds the superseded records.

So the copy is *trimmed*: its batches from `E + 1` on are written as a segment of their own (a new segment id,
the offset and time indexes rebuilt as Kafka writes them for that base, the transaction index's entries whose
ABORT marker lies in it, the producer snapshot and leader-epoch checkpoint as they were: both describe the state at
the segment's end), which goes live in place of the copy; the copy goes to DELETE_SEGMENT_STARTED and `kcompact gc`
deletes its objects. A copy wholly below the tier's end adds nothing and goes the same way. The records dropped are
the ones the tier already holds, at the same offsets: replicas hold the same batches below the high watermark, and
only offsets below the last stable offset are ever tiered.

A batch that straddles `E` (its base offset at or below `E`, its last above) cannot be cut without re-encoding, and
replicas never place one there: it is refused with the object and byte position.
"""

from __future__ import annotations

from compaction.errors import MetadataInvariantError
from compaction.format.batch import NO_TIMESTAMP
from compaction.format.checkpoints import EpochEntry
from compaction.format.indexes import offset_index_lookup, read_offset_index, read_txn_index
from compaction.format.indexes.rebuild import build_indexes
from compaction.format.indexes.txn_index import encode_txn_index
from compaction.format.segment import iter_batch_headers
from compaction.metadata import NewSegment, ObjectKey, ObjectSuffix, PartitionSnapshot, SegmentMetadata
from compaction.storage.base import ObjectStore
from compaction.storage.indexes import get_parts, parse_part, segment_objects
from compaction.storage.layout import segment_object_key


def tier_end(current: PartitionSnapshot) -> int | None:
    """The last offset the partition's live segments hold; None when nothing is live."""
    return max((s.end_offset for s in current.live_segments), default=None)


def trimmed_epochs(epochs: tuple[EpochEntry, ...], first_offset: int) -> tuple[EpochEntry, ...]:
    """The leader epochs of a segment's part from `first_offset` on: the epoch in force there starts at it."""
    kept = [e for e in epochs if e.start_offset > first_offset]
    before = [e for e in epochs if e.start_offset <= first_offset]
    return (EpochEntry(before[-1].epoch, first_offset), *kept) if before else tuple(kept)


def trim_copy(store: ObjectStore, row: SegmentMetadata, first_offset: int, segment_id: str) -> NewSegment:
    """Write `row`'s batches from `first_offset` on as segment `segment_id` and return its row (COPY_SEGMENT_FINISHED).

    Reads the `.log` from the offset index's floor entry for `first_offset` on (one ranged GET), not from its start.

    Raises:
        MetadataInvariantError: `first_offset` is outside `(row.start_offset, row.end_offset]`, or a batch holds
            offsets on both sides of it (named with the object and its byte position).
    """
    where = f"{row.topic}-{row.partition} segment {row.segment_id} [{row.start_offset}, {row.end_offset}]"
    if not row.start_offset < first_offset <= row.end_offset:
        raise MetadataInvariantError(f"{where}: cannot keep it from offset {first_offset}")
    log_key = _key(row, ObjectSuffix.LOG, where)
    index_key = row.object_key(ObjectSuffix.OFFSET_INDEX)
    floor = 0
    if index_key is not None:
        entries = parse_part(store, index_key, ObjectSuffix.OFFSET_INDEX,
                             lambda data, obj: read_offset_index(data, row.start_offset, obj=obj))
        floor = offset_index_lookup(entries, row.start_offset, first_offset)[1]
    data = store.get(log_key, floor)
    cut, max_ts, transactional = len(data), NO_TIMESTAMP, False
    for h in iter_batch_headers(data, obj=log_key):
        if h.last_offset < first_offset:
            continue
        if h.base_offset < first_offset:
            raise MetadataInvariantError(
                f"{where}: the batch at byte {floor + h.position} of {log_key} holds offsets {h.base_offset}.."
                f"{h.last_offset}, across the tier's end {first_offset - 1}; it cannot be trimmed there"
            )
        cut = min(cut, h.position)
        max_ts = max(max_ts, h.max_timestamp)
        transactional = transactional or h.is_transactional_or_control
    log = bytes(data[cut:])
    indexes = build_indexes(log, first_offset, obj=log_key)

    def key(suffix: ObjectSuffix) -> str:
        return segment_object_key(row.topic, row.topic_id, row.partition, first_offset, segment_id, suffix)

    files = {ObjectSuffix.LOG: log, ObjectSuffix.OFFSET_INDEX: indexes.offset_index,
             ObjectSuffix.TIME_INDEX: indexes.time_index}
    txn_key = row.object_key(ObjectSuffix.TXN_INDEX)
    if txn_key is not None:
        txns = parse_part(store, txn_key, ObjectSuffix.TXN_INDEX, lambda data, obj: read_txn_index(data, obj=obj))
        aborted = [t for t in txns if t.last_offset >= first_offset]
        if aborted:
            files[ObjectSuffix.TXN_INDEX] = encode_txn_index(aborted)
    carried = (ObjectSuffix.PRODUCER_SNAPSHOT, ObjectSuffix.LEADER_EPOCH_CHECKPOINT)
    files.update(get_parts(store, {s: k for s in carried if (k := row.object_key(s)) is not None}))  # one header read
    log = files.pop(ObjectSuffix.LOG)
    objects, keys = segment_objects(key, log, files)
    for object_key, body in objects.items():
        store.put(object_key, body)
    return NewSegment(
        segment_id=segment_id,
        start_offset=first_offset,
        end_offset=row.end_offset,
        max_timestamp_ms=max_ts if max_ts != NO_TIMESTAMP else row.max_timestamp_ms,
        segment_leader_epochs=trimmed_epochs(row.segment_leader_epochs, first_offset),
        segment_size_bytes=len(log),
        object_keys=tuple(ObjectKey(suffix, k) for suffix, k in keys.items()),
        transactional=transactional,
    )


def _key(row: SegmentMetadata, suffix: ObjectSuffix, where: str) -> str:
    key = row.object_key(suffix)
    if key is None:
        raise MetadataInvariantError(f"{where}: no .{suffix.value} object")
    return key
