"""KIP-405's copy path: every rolled segment of a Kafka log dir into the store (`kcompact tier`).

Per partition: validate the new segments first (a corrupt one fails the partition before anything is
committed), upload every object under a fresh segment id, then record the segments COPY_SEGMENT_FINISHED. The
partitions go in batches of up to `TIER_BATCH_BYTES` of segments (and `BATCH_PARTITIONS` partitions, uploaded
`UPLOAD_THREADS` at once), each batch one metadata commit whatever its partition count (`commit_current_batch`:
each partition planned on its latest rows, and refused alone). As the broker plugin's copy, a segment gets no
COPY_SEGMENT_STARTED row of its own: a crash before the commit leaves objects no row names, which `kcompact gc`
deletes once older than its orphan grace (it never deletes a younger one: an upload in flight), and nothing live.
A rerun copies only what is new. COPY_SEGMENT_STARTED rows another writer left (an older kcompact's tier, a
broker's copy that died between its two commits) are moved to DELETE_SEGMENT_STARTED, for gc, in the commit that
records the partition's next segments.

Every segment goes up with a producer snapshot, the producer state at its end, as Kafka's RemoteLogManager
uploads one: the broker's `<next base>.snapshot` when the log dir has it, else one built here by replaying the
segment's batches on top of the state at its start (the previous segment's snapshot; for the first segment
of a run, the snapshot of the tier's last segment in the store, or the log dir's `<base>.snapshot` for a
partition the store does not hold yet). Without it every compaction would replay the whole tier to find the
producer state (`compaction.producers.producer_state`).
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    BATCH_PARTITIONS,
    ChangeSet,
    MetadataTable,
    NewSegment,
    ObjectKey,
    PartitionSnapshot,
    SegmentMetadata,
    SegmentState,
    StateChange,
    TopicPartition,
    commit_current_batch,
)
from compaction.metadata.batch import Reader, known_reader
from compaction.metadata.commit import Plan
from compaction.metadata.model import OfPartition
from compaction.producers import producer_state
from compaction.storage.base import ObjectStore
from compaction.storage.indexes import pack_parts, segment_keys
from compaction.storage.layout import Suffix, new_segment_id, segment_object_key
from compaction.tier.logdir import LocalPartition, PreparedSegment, partitions, prepare_segment


@dataclass
class PartitionTierResult(Failure, OfPartition):
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
    files = segment_keys(
        lambda s: segment_object_key(topic, topic_id, partition, seg.start_offset, segment_id, s, store_prefix),
        [Suffix(s) for s in seg.companions])
    keys = tuple(ObjectKey(s, key) for s, key in files.items())
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
        state=SegmentState.COPY_SEGMENT_FINISHED,
        transactional=seg.transactional,
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


TIER_BATCH_BYTES = 1 << 30
"""Segment bytes a tier run uploads before a metadata commit: what a crash there leaves to upload again."""

FINISH_ATTEMPTS = 3


@dataclass
class _Copy:
    """One partition's share of a batch: its prepared segments and their rows, and whether there is anything to
    commit (segments to record, or abandoned attempts to retire)."""

    result: PartitionTierResult
    prepared: list[PreparedSegment] = field(default_factory=list)
    new: list[NewSegment] = field(default_factory=list)
    topic_id: str = ""
    todo: bool = False

    @property
    def tp(self) -> TopicPartition:
        return self.result.tp

    @property
    def size(self) -> int:
        return sum(seg.size for seg in self.prepared)

    def plan(self, writer: str) -> Plan:
        """The commit of the uploaded segments, planned on the partition's latest rows (`commit_current_batch`):
        under its current fencing epoch (a tier run holds none; a compaction that took the partition since only
        rewrote segments below these), retiring the COPY_SEGMENT_STARTED rows it holds then. A segment that another
        writer tiered since overlaps the tier: the partition is refused (`MetadataInvariantError`), nothing of it
        live, and a rerun copies what is still new."""
        def change(current: PartitionSnapshot) -> ChangeSet:
            abandoned = [s for s in current.segments if s.state is SegmentState.COPY_SEGMENT_STARTED]
            self.result.abandoned_attempts = len(abandoned)
            return ChangeSet.planned_from(
                current,
                fencing_epoch=current.fencing_epoch,
                writer=writer,
                new_segments=tuple(self.new),
                state_changes=tuple(StateChange(s.segment_id, SegmentState.DELETE_SEGMENT_STARTED) for s in abandoned),
                topic_id=self.topic_id,
            )

        return change


def _plan_copy(part: LocalPartition, store: ObjectStore, current: PartitionSnapshot) -> _Copy:
    """What tiering `part` takes, on its rows `current`: the rolled segments the store does not hold yet, validated
    and prepared, with their rows (`todo` when there are some, or abandoned attempts to retire)."""
    copy = _Copy(PartitionTierResult(part.topic, part.partition), topic_id=part.topic_id)
    tiered_end = max((s.end_offset for s in current.live_segments), default=-1)
    abandoned = any(s.state is SegmentState.COPY_SEGMENT_STARTED for s in current.segments)
    todo = []
    for base, next_base in itertools.pairwise(part.segment_bases()):
        if next_base - 1 <= tiered_end:
            copy.result.already_tiered += 1
        else:  # a segment the tier reaches into (`kcompact wal roll` cut elsewhere) is tiered from the tier's end
            todo.append((base, next_base, tiered_end + 1 if base <= tiered_end else None))
    if not todo and not abandoned:
        return copy
    copy.todo = True
    if not todo:
        return copy
    epochs = part.leader_epochs()
    carried = open_transactions(producer_state(store, current.live_segments)) if any(t[2] for t in todo) else {}
    prepared = [prepare_segment(part, base, next_base, epochs, start, carried) for base, next_base, start in todo]
    if any(_SNAPSHOT not in seg.companions for seg in prepared):
        at_start = _state_at(part, store, current.live_segments, prepared[0].start_offset)
        prepared, copy.result.built_snapshots = with_producer_snapshots(prepared, at_start)
    copy.prepared = prepared
    copy.new = [_new_segment("", part.topic, part.topic_id, part.partition, seg) for seg in prepared]
    return copy


def _upload(copy: _Copy, store: ObjectStore) -> None:
    for seg, meta in zip(copy.prepared, copy.new, strict=True):
        in_memory = {}
        for obj in meta.object_keys:
            if obj.suffix is Suffix.LOG and seg.log_bytes is not None:
                in_memory[obj.key] = seg.log_bytes
            elif obj.suffix is Suffix.LOG:
                store.put_file(obj.key, seg.log_path)
            elif obj.suffix is Suffix.INDEXES:
                in_memory[obj.key] = pack_parts({Suffix(s): data for s, data in seg.companions.items()})
        store.put_many(in_memory)
        copy.result.copied.append(seg.start_offset)
        copy.result.bytes_copied += seg.size
        copy.result.rebuilt_indexes += int(seg.rebuilt_indexes)


UPLOAD_THREADS = 16
"""Partitions of a batch uploaded at once: each put waits on the store (an S3 round trip, a local fsync), so with
many small partitions the waits, not the bytes, would set a tier's wall."""


def _upload_all(copies: Sequence[_Copy], store: ObjectStore) -> dict[TopicPartition, KcompactError]:
    """`_upload` every copy, `UPLOAD_THREADS` partitions at once (a partition's objects one after the other); the
    partitions whose upload failed, with the error. Every object is durable when it returns (`deferred_sync`: a
    local store fsyncs them together, not one after the other), before the commit that makes them live."""
    with store.deferred_sync():
        if len(copies) < 2:
            uploads = [_attempt(c, store) for c in copies]
        else:
            with ThreadPoolExecutor(min(UPLOAD_THREADS, len(copies)), thread_name_prefix="kcompact-tier") as pool:
                uploads = list(pool.map(lambda c: _attempt(c, store), copies))
    return {c.tp: exc for c, exc in zip(copies, uploads, strict=True) if exc is not None}


def _attempt(copy: _Copy, store: ObjectStore) -> KcompactError | None:
    try:
        _upload(copy, store)
    except KcompactError as exc:
        return exc
    return None


def _copy_batch(copies: Sequence[_Copy], store: ObjectStore, table: MetadataTable, now_ms: int, writer: str,
                reader: Reader | None = None) -> dict[TopicPartition, KcompactError]:
    """Tier a batch: the uploads, then one commit of every partition's new rows. Returns the partitions that
    failed (their results say why, and only that); nothing of one becomes live. `reader`: where the commit reads
    the partitions' latest rows (default: the table, afresh)."""
    failed = _upload_all(copies, store)
    plans = {c.tp: c.plan(writer) for c in copies if c.tp not in failed}
    landed = commit_current_batch(table, plans, now_ms, attempts=FINISH_ATTEMPTS, reader=reader)
    failed.update({tp: r for tp, r in landed.items() if isinstance(r, KcompactError)})
    for c in copies:
        if c.tp in failed:  # what it copied is not live: the result is the failure alone
            c.result = PartitionTierResult(c.result.topic, c.result.partition, **failed[c.tp].outcome_fields())
    return failed


def tier_partition(
    part: LocalPartition, store: ObjectStore, table: MetadataTable, now_ms: int, writer: str
) -> PartitionTierResult:
    """Tier the rolled segments of one partition directory that the store does not hold yet (a batch of one).

    Raises:
        KcompactError: what failed the partition (corrupt input, a refused commit, the store); nothing became live.
    """
    copy = _plan_copy(part, store, table.partition_snapshot(part.topic, part.partition))
    if copy.todo and (failed := _copy_batch([copy], store, table, now_ms, writer)):
        raise failed[copy.tp]
    return copy.result


def tier_logdir(
    logdir: Path,
    store: ObjectStore,
    table: MetadataTable,
    now_ms: int,
    *,
    writer: str | None = None,
    progress: Callable[[int, int, PartitionTierResult], None] | None = None,
) -> list[PartitionTierResult]:
    """Tier every partition of `logdir`, in batches (module docstring), the table read once. A partition that fails
    (corrupt input, conflict) is reported with its error and the others still go on; nothing of a failed partition
    becomes live. Results are in the log dir's order; `progress` hears of each once it is final."""
    parts = list(partitions(logdir))
    writer = writer or default_writer()
    current = table.partition_snapshots(p.tp for p in parts)
    reader = known_reader(table, current)  # each commit starts from these rows while no one else committed since
    results: dict[TopicPartition, PartitionTierResult] = {}
    batch: list[_Copy] = []
    batch_bytes = 0

    def report(done: Iterable[PartitionTierResult]) -> None:
        for res in done:
            results[res.tp] = res
            if progress:
                progress(len(results), len(parts), res)

    def flush() -> None:
        nonlocal batch_bytes
        _copy_batch(batch, store, table, now_ms, writer, reader)
        report(c.result for c in batch)
        batch.clear()
        batch_bytes = 0

    for part in parts:
        try:
            copy = _plan_copy(part, store, current[part.tp])
        except KcompactError as exc:
            report([PartitionTierResult(part.topic, part.partition, **exc.outcome_fields())])
            continue
        if not copy.todo:
            report([copy.result])
            continue
        batch.append(copy)
        batch_bytes += copy.size
        if len(batch) >= BATCH_PARTITIONS or batch_bytes >= TIER_BATCH_BYTES:
            flush()
    if batch:
        flush()
    return [results[p.tp] for p in parts]
