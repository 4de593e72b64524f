"""KIP-405's copy path: every rolled segment of a Kafka log dir into the store (`kcompact tier`).

Per partition: validate the new segments first (a corrupt one fails the partition before anything is
committed), record them COPY_SEGMENT_STARTED in one metadata commit, upload every object under a fresh
segment id, then record COPY_SEGMENT_FINISHED in a second commit. A crash between the two leaves
STARTED rows that are never live; the next run moves them to DELETE_SEGMENT_STARTED (for gc) in the
same commit that starts their replacements. A rerun copies only what is new.

Every segment goes up with a producer snapshot, the producer state at its end, as Kafka's RemoteLogManager
uploads one: the broker's `<next base>.snapshot` when the log dir has it, else one built here by replaying the
segment's batches on top of the state at its start (the previous segment's snapshot; for the first segment
of a run, the snapshot of the tier's last segment in the store, or the log dir's `<base>.snapshot` for a
partition the store does not hold yet). Without it every compaction would replay the whole tier to find the
producer state (`compaction.run.producers.producer_state`).
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from compaction.errors import Failure, KcompactError
from compaction.format.producer_snapshot import (
    ProducerStateEntry,
    encode_producer_snapshot,
    open_transactions,
    producer_state_from_log,
    read_producer_snapshot,
)
from compaction.format.segment import SNAPSHOT_SUFFIX, segment_path
from compaction.metadata import (
    ChangeSet,
    MetadataTable,
    NewSegment,
    ObjectKey,
    SegmentMetadata,
    SegmentState,
    StateChange,
    commit,
    record_tier_finished,
)
from compaction.run.producers import producer_state
from compaction.storage.base import ObjectStore
from compaction.storage.layout import Suffix, new_segment_id, segment_object_key
from compaction.tier.logdir import LocalPartition, PreparedSegment, partitions, prepare_segment


@dataclass
class PartitionTierResult(Failure):
    """What one partition's tiering did (or why it failed)."""

    topic: str
    partition: int
    copied: list[int] = field(default_factory=list)  # start offsets
    already_tiered: int = 0
    bytes_copied: int = 0
    rebuilt_indexes: int = 0
    built_snapshots: int = 0  # producer snapshots built by replay (the log dir had none for the segment)
    abandoned_attempts: int = 0


def default_writer() -> str:
    return f"kcompact-tier@{socket.gethostname()}"


def _new_segment(store_prefix: str, topic: str, topic_id: str, partition: int, seg: PreparedSegment) -> NewSegment:
    segment_id = new_segment_id()
    suffixes = [Suffix.LOG, *(Suffix(s) for s in seg.companions)]
    keys = tuple(
        ObjectKey(s, segment_object_key(topic, topic_id, partition, seg.start_offset, segment_id, s, store_prefix))
        for s in suffixes
    )
    return NewSegment(
        segment_id=segment_id,
        start_offset=seg.start_offset,
        end_offset=seg.end_offset,
        max_timestamp_ms=seg.max_timestamp_ms,
        segment_leader_epochs=seg.leader_epochs,
        segment_size_bytes=seg.size,
        object_keys=keys,
        record_count=seg.record_count,
        first_batch_max_timestamp_ms=seg.first_batch_max_timestamp_ms,
        state=SegmentState.COPY_SEGMENT_STARTED,
    )


_SNAPSHOT = Suffix.PRODUCER_SNAPSHOT.value


def with_producer_snapshots(
    segments: Sequence[PreparedSegment], start: Iterable[ProducerStateEntry]
) -> tuple[list[PreparedSegment], int]:
    """`segments` (consecutive, in offset order) each with a producer snapshot, and how many were built.

    A segment without one gets the state at its end: its batches replayed (`producer_state_from_log`) on top
    of the state at its start, i.e. the previous segment's snapshot, or `start` for the first. A broker's own
    snapshot is kept as it is and carried on to the next segment.
    """
    state = {e.producer_id: e for e in start}
    out, built = [], 0
    for seg in segments:
        own = seg.companions.get(_SNAPSHOT)
        if own is not None:
            state = {e.producer_id: e for e in read_producer_snapshot(own, obj=str(seg.log_path))}
            out.append(seg)
            continue
        state = producer_state_from_log(seg.log(), obj=str(seg.log_path), initial=state.values())
        out.append(replace(seg, companions={**seg.companions, _SNAPSHOT: encode_producer_snapshot(state.values())}))
        built += 1
    return out, built


def _state_at(part: LocalPartition, store: ObjectStore, live: Sequence[SegmentMetadata], base: int
              ) -> list[ProducerStateEntry]:
    """The producer state at offset `base`, where this run's first segment starts: at the end of the tier if
    the store holds the partition (its last segment's snapshot), else the log dir's `<base>.snapshot` if any."""
    if live:
        return producer_state(store, live)
    path = segment_path(part.directory, base, SNAPSHOT_SUFFIX)
    return read_producer_snapshot(path.read_bytes(), obj=str(path)) if path.exists() else []


def tier_partition(
    part: LocalPartition, store: ObjectStore, table: MetadataTable, now_ms: int, writer: str
) -> PartitionTierResult:
    """Tier the rolled segments of one partition directory that the store does not hold yet."""
    result = PartitionTierResult(part.topic, part.partition)
    topic_id = part.topic_id
    current = table.partition_snapshot(part.topic, part.partition)
    tiered_end = max((s.end_offset for s in current.live_segments), default=-1)
    abandoned = [s for s in current.segments if s.state is SegmentState.COPY_SEGMENT_STARTED]
    bases = part.segment_bases()
    rolled = list(itertools.pairwise(bases))
    todo = []
    for base, next_base in rolled:
        if next_base - 1 <= tiered_end:
            result.already_tiered += 1
        else:  # a segment the tier reaches into (`kcompact wal roll` cut elsewhere) is tiered from the tier's end
            todo.append((base, next_base, tiered_end + 1 if base <= tiered_end else None))
    if not todo and not abandoned:
        return result
    epochs = part.leader_epochs()
    carried = open_transactions(producer_state(store, current.live_segments)) if any(t[2] for t in todo) else {}
    prepared = [prepare_segment(part, base, next_base, epochs, start, carried) for base, next_base, start in todo]
    if any(_SNAPSHOT not in seg.companions for seg in prepared):
        at_start = _state_at(part, store, current.live_segments, prepared[0].start_offset)
        prepared, result.built_snapshots = with_producer_snapshots(prepared, at_start)
    new = [_new_segment("", part.topic, topic_id, part.partition, seg) for seg in prepared]
    start = ChangeSet.planned_from(
        current,
        fencing_epoch=current.fencing_epoch,
        writer=writer,
        new_segments=tuple(new),
        state_changes=tuple(StateChange(s.segment_id, SegmentState.DELETE_SEGMENT_STARTED) for s in abandoned),
        topic_id=topic_id,
    )
    landed = commit(table, start, now_ms)
    result.abandoned_attempts = len(abandoned)
    for seg, meta in zip(prepared, new, strict=True):
        for obj in meta.object_keys:
            if obj.suffix is Suffix.LOG and seg.log_bytes is not None:
                store.put(obj.key, seg.log_bytes)
            elif obj.suffix is Suffix.LOG:
                store.put_file(obj.key, seg.log_path)
            else:
                store.put(obj.key, seg.companions[obj.suffix.value])
        result.copied.append(seg.start_offset)
        result.bytes_copied += seg.size
        result.rebuilt_indexes += int(seg.rebuilt_indexes)
    if new:
        record_tier_finished(
            table, part.topic, part.partition, [n.segment_id for n in new],
            fencing_epoch=landed.fencing_epoch, writer=writer, now_ms=now_ms,
        )
    return result


def tier_logdir(
    logdir: Path,
    store: ObjectStore,
    table: MetadataTable,
    now_ms: int,
    *,
    writer: str | None = None,
    progress: Callable[[int, int, PartitionTierResult], None] | None = None,
) -> list[PartitionTierResult]:
    """Tier every partition of `logdir`. A partition that fails (corrupt input, conflict) is reported with its
    error and the others still go on; nothing of a failed partition becomes live."""
    parts = list(partitions(logdir))
    results = []
    for i, part in enumerate(parts, 1):
        try:
            res = tier_partition(part, store, table, now_ms, writer or default_writer())
        except KcompactError as exc:
            res = PartitionTierResult(part.topic, part.partition, **exc.outcome_fields())
        results.append(res)
        if progress:
            progress(i, len(parts), res)
    return results
