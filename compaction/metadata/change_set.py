"""Change sets and the pure function that turns a partition's rows plus a change set into its new rows.

A `ChangeSet` is planned from a `PartitionSnapshot` and records what it was planned from: the table
version, the partition's `commit_seq` and the writer's fencing epoch. Committing it is
`check_preconditions` (values, in the style of pyiceberg's `AssertRefSnapshotId`: "expected X, found Y")
followed by `apply_change_set`, which computes the partition's complete new row set; `commit.py` then
writes that row set in one Delta commit.

Invariants `apply_change_set` enforces on every commit:

- state changes follow KIP-405's transitions; a new row enters as COPY_SEGMENT_STARTED, or goes
  null -> STARTED -> FINISHED inside the one commit (a compacted segment is uploaded before the commit
  and becomes visible already finished: no reader can observe the intermediate state);
- segment ids are Kafka Uuids, unique within the partition; every segment names its `.log` object;
- live segments (COPY_SEGMENT_FINISHED, not zombie) never overlap in offsets. Gaps are allowed
  (compaction and retention leave them); STARTED rows are not checked, so a retried upload can coexist
  with an abandoned one until the latter is retired;
- the cleaner offset only moves forward, under the committing epoch's entry;
- a change set may add object keys to existing rows (a suffix the row does not have yet, e.g. a bloom
  filter written lazily); nothing else of such a row changes, and the addition lands with the rest;
- every commit bumps `commit_seq` by one, so a change set can land at most once: replaying one that
  already landed fails its `expected_commit_seq` check.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import pairwise

from compaction.errors import (
    CommitConflictError,
    FencedError,
    InvalidStateTransitionError,
    MetadataInvariantError,
    TopicIdMismatchError,
)
from compaction.metadata.lineage import current_offset, with_entry
from compaction.metadata.model import (
    EpochEntry,
    ObjectKey,
    ObjectSuffix,
    OfPartition,
    PartitionState,
    SegmentMetadata,
    SegmentState,
    check_transition,
    is_kafka_uuid,
)
from compaction.metadata.snapshot import PartitionSnapshot

MAX_EPOCH = 2**31 - 1


@dataclass(frozen=True)
class NewSegment:
    """A segment a change set adds; the commit fills in topic, writer, epoch, time and cleaner offsets."""

    segment_id: str
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    segment_leader_epochs: tuple[EpochEntry, ...]
    segment_size_bytes: int
    object_keys: tuple[ObjectKey, ...]
    record_count: int | None = None
    first_batch_max_timestamp_ms: int | None = None
    state: SegmentState = SegmentState.COPY_SEGMENT_FINISHED
    transactional: bool | None = None  # holds a transactional or control batch; None: unknown (a broker's copy)


@dataclass(frozen=True)
class StateChange:
    segment_id: str
    state: SegmentState
    transactional: bool | None = None
    """What the writer learnt of the segment's bytes while it went to `state` (a broker's copy: the plugin's storage
    manager reads its batch headers); None leaves the row's `transactional` as it is."""


@dataclass(frozen=True)
class AddedObjectKey:
    """A file added to an existing segment row, e.g. a bloom filter written after the segment was."""

    segment_id: str
    object: ObjectKey


@dataclass(frozen=True)
class ChangeSet(OfPartition):
    """Everything one commit changes in one partition, and the state it was planned from.

    `cleaner_offset`, if set, becomes the entry of `fencing_epoch` in the partition's cleaner-offset
    vector. Build it with `ChangeSet.planned_from(snapshot, ...)` so the preconditions are filled in.
    """

    topic: str
    topic_id: str
    partition: int
    base_version: int
    expected_commit_seq: int
    fencing_epoch: int
    writer: str
    new_segments: tuple[NewSegment, ...] = ()
    state_changes: tuple[StateChange, ...] = ()
    cleaner_offset: int | None = None
    run_id: str | None = None
    added_object_keys: tuple[AddedObjectKey, ...] = ()

    @classmethod
    def planned_from(
        cls,
        snapshot: PartitionSnapshot,
        *,
        fencing_epoch: int,
        writer: str,
        new_segments: Iterable[NewSegment] = (),
        state_changes: Iterable[StateChange] = (),
        cleaner_offset: int | None = None,
        run_id: str | None = None,
        topic_id: str | None = None,
        added_object_keys: Iterable[AddedObjectKey] = (),
    ) -> ChangeSet:
        """A change set whose preconditions are `snapshot`'s version, commit_seq and topic id.

        `topic_id` is needed only for a partition the table does not know yet.
        """
        known = snapshot.topic_id or topic_id
        if known is None:
            raise MetadataInvariantError(f"{snapshot.topic}-{snapshot.partition} is new: pass its topic_id")
        return cls(
            topic=snapshot.topic,
            topic_id=known,
            partition=snapshot.partition,
            base_version=snapshot.version,
            expected_commit_seq=snapshot.commit_seq,
            fencing_epoch=fencing_epoch,
            writer=writer,
            new_segments=tuple(new_segments),
            state_changes=tuple(state_changes),
            cleaner_offset=cleaner_offset,
            run_id=run_id,
            added_object_keys=tuple(added_object_keys),
        )


@dataclass(frozen=True)
class PartitionRows:
    """The complete row set of one partition: what a commit writes in place of the old one."""

    state: PartitionState
    segments: tuple[SegmentMetadata, ...]


def check_preconditions(current: PartitionSnapshot, cs: ChangeSet) -> None:
    """Refuse a change set planned from another state of the partition than `current`.

    Raises:
        FencedError: the partition's fencing epoch is not the change set's (a newer run owns it).
        CommitConflictError: another commit touched the partition since the change set was planned.
        TopicIdMismatchError: the topic was recreated under the same name.
    """
    where = f"{cs.topic}-{cs.partition}"
    if (current.topic, current.partition) != (cs.topic, cs.partition):
        raise MetadataInvariantError(f"change set for {where} checked against {current.topic}-{current.partition}")
    if current.topic_id is not None and current.topic_id != cs.topic_id:
        raise TopicIdMismatchError(f"{where}: expected topic id {cs.topic_id}, found {current.topic_id}")
    if current.fencing_epoch != cs.fencing_epoch:
        raise FencedError(
            f"{where}: expected fencing epoch {cs.fencing_epoch}, found {current.fencing_epoch} "
            f"(writer {cs.writer!r}; a run with a newer epoch owns the partition, this run must stop)"
        )
    if current.commit_seq != cs.expected_commit_seq:
        raise CommitConflictError(
            f"{where}: expected commit_seq {cs.expected_commit_seq}, found {current.commit_seq} "
            f"(planned at table version {cs.base_version}, now at {current.version}); re-plan and retry"
        )


def _check_new_segment(where: str, n: NewSegment) -> None:
    if not is_kafka_uuid(n.segment_id):
        raise MetadataInvariantError(f"{where}: segment id {n.segment_id!r} is not a Kafka Uuid")
    if not 0 <= n.start_offset <= n.end_offset:
        raise MetadataInvariantError(f"{where}: segment {n.segment_id} has offsets [{n.start_offset}, {n.end_offset}]")
    epochs = n.segment_leader_epochs
    ordered = all(a.epoch < b.epoch and a.start_offset <= b.start_offset for a, b in pairwise(epochs))
    if not epochs or not ordered or not all(n.start_offset <= e.start_offset <= n.end_offset for e in epochs):
        raise MetadataInvariantError(
            f"{where}: segment {n.segment_id} leader epochs {epochs} must be non-empty, ascending and within "
            f"[{n.start_offset}, {n.end_offset}]"
        )
    suffixes = [o.suffix for o in n.object_keys]
    if ObjectSuffix.LOG not in suffixes or len(set(suffixes)) != len(suffixes):
        raise MetadataInvariantError(f"{where}: segment {n.segment_id} needs one .log key and unique suffixes")
    if n.state not in (SegmentState.COPY_SEGMENT_STARTED, SegmentState.COPY_SEGMENT_FINISHED):
        raise InvalidStateTransitionError(
            f"{where}: new segment {n.segment_id} enters as {n.state.name}; a new row is "
            "COPY_SEGMENT_STARTED (null->0) or COPY_SEGMENT_FINISHED (null->0->1 within one commit)"
        )


def _check_no_overlap(where: str, segments: Iterable[SegmentMetadata], zombies: frozenset[str]) -> None:
    live = sorted(
        (s for s in segments if s.state is SegmentState.COPY_SEGMENT_FINISHED and s.segment_id not in zombies),
        key=lambda s: s.start_offset,
    )
    for a, b in pairwise(live):
        if b.start_offset <= a.end_offset:
            raise MetadataInvariantError(
                f"{where}: live segments {a.segment_id} [{a.start_offset}, {a.end_offset}] and "
                f"{b.segment_id} [{b.start_offset}, {b.end_offset}] overlap; "
                "retire the old one in the same change set"
            )


def _with_object_key(where: str, old: SegmentMetadata | None, added: AddedObjectKey) -> SegmentMetadata:
    """`old` with one more file; only its object list changes (its writer, epoch and times stay)."""
    if old is None:
        raise MetadataInvariantError(f"{where}: object key added to unknown segment {added.segment_id}")
    if old.state is SegmentState.DELETE_SEGMENT_FINISHED:
        raise MetadataInvariantError(f"{where}: segment {added.segment_id} is deleted; no object can be added")
    existing = old.object_key(added.object.suffix)
    if existing == added.object.key:
        return old
    if existing is not None:
        raise MetadataInvariantError(
            f"{where}: segment {added.segment_id}: expected no .{added.object.suffix.value} object, found {existing}"
        )
    return replace(old, object_keys=(*old.object_keys, added.object))


def merge_leader_epochs(lineage: Iterable[EpochEntry], added: Iterable[EpochEntry]) -> tuple[EpochEntry, ...]:
    """The union of two leader-epoch lineages, keeping each epoch's lowest start offset, by epoch."""
    first: dict[int, int] = {}
    for e in (*lineage, *added):
        first[e.epoch] = min(first.get(e.epoch, e.start_offset), e.start_offset)
    return tuple(EpochEntry(epoch, offset) for epoch, offset in sorted(first.items()))


def _stamped(cs: ChangeSet, n: NewSegment, vector: tuple, now_ms: int) -> SegmentMetadata:
    return SegmentMetadata(
        segment_id=n.segment_id,
        topic=cs.topic,
        topic_id=cs.topic_id,
        partition=cs.partition,
        start_offset=n.start_offset,
        end_offset=n.end_offset,
        max_timestamp_ms=n.max_timestamp_ms,
        event_timestamp_ms=now_ms,
        segment_leader_epochs=n.segment_leader_epochs,
        segment_size_bytes=n.segment_size_bytes,
        state=n.state,
        cleaner_offsets=vector,
        object_keys=n.object_keys,
        writer=cs.writer,
        fencing_epoch=cs.fencing_epoch,
        record_count=n.record_count,
        first_batch_max_timestamp_ms=n.first_batch_max_timestamp_ms,
        run_id=cs.run_id,
        transactional=n.transactional,
    )


def apply_change_set(current: PartitionSnapshot, cs: ChangeSet, now_ms: int) -> PartitionRows:
    """The partition's complete new row set after `cs`, checked against the invariants above. Pure.

    Raises:
        FencedError, CommitConflictError, TopicIdMismatchError: see `check_preconditions`.
        InvalidStateTransitionError: a state change KIP-405 does not allow.
        MetadataInvariantError: unknown or duplicate segment ids, malformed new segments, overlapping live
            segments, a cleaner offset going back.
    """
    check_preconditions(current, cs)
    where = f"{cs.topic}-{cs.partition}"
    old_vector = current.state.cleaner_offsets if current.state else ()
    vector = old_vector if cs.cleaner_offset is None else with_entry(old_vector, cs.fencing_epoch, cs.cleaner_offset)
    by_id = {s.segment_id: s for s in current.segments}
    changed_ids = [c.segment_id for c in cs.state_changes]
    if len(set(changed_ids)) != len(changed_ids):
        raise MetadataInvariantError(f"{where}: a segment changes state twice in one change set")
    for c in cs.state_changes:
        old = by_id.get(c.segment_id)
        if old is None:
            raise MetadataInvariantError(f"{where}: state change for unknown segment {c.segment_id}")
        check_transition(c.segment_id, old.state, c.state)
        by_id[c.segment_id] = replace(
            old,
            state=c.state,
            event_timestamp_ms=now_ms,
            writer=cs.writer,
            fencing_epoch=cs.fencing_epoch,
            run_id=cs.run_id,
            transactional=old.transactional if c.transactional is None else c.transactional,
        )
    for added in cs.added_object_keys:
        by_id[added.segment_id] = _with_object_key(where, by_id.get(added.segment_id), added)
    for n in cs.new_segments:
        _check_new_segment(where, n)
        if n.segment_id in by_id:
            raise MetadataInvariantError(f"{where}: segment id {n.segment_id} is already in the table")
        by_id[n.segment_id] = _stamped(cs, n, vector, now_ms)
    segments = tuple(sorted(by_id.values(), key=lambda s: (s.start_offset, s.segment_id)))
    _check_no_overlap(where, segments, current.lineage.rejected)
    state = PartitionState(
        topic=cs.topic,
        topic_id=cs.topic_id,
        partition=cs.partition,
        fencing_epoch=cs.fencing_epoch,
        commit_seq=current.commit_seq + 1,
        cleaner_offsets=vector,
        leader_epochs=merge_leader_epochs(
            current.state.leader_epochs if current.state else (),
            (e for n in cs.new_segments for e in n.segment_leader_epochs),
        ),
        updated_ms=now_ms,
        writer=cs.writer,
        run_id=cs.run_id,
    )
    return PartitionRows(state, segments)


def acquire_rows(
    current: PartitionSnapshot, topic_id: str | None, writer: str, now_ms: int, run_id: str | None = None
) -> PartitionRows:
    """The row set after a new run takes the partition: fencing epoch + 1, like a new leader epoch.

    The new epoch's cleaner-offset entry carries the current offset, which pins every older epoch at once
    (see `lineage`). Segment rows are unchanged. Pure.

    Raises:
        TopicIdMismatchError: `topic_id` is given and differs from the recorded one.
        MetadataInvariantError: the partition is new and no `topic_id` was given, or epochs ran out.
    """
    where = f"{current.topic}-{current.partition}"
    known = current.topic_id
    if known is not None and topic_id is not None and known != topic_id:
        raise TopicIdMismatchError(f"{where}: expected topic id {topic_id}, found {known}")
    resolved = known or topic_id
    if resolved is None:
        raise MetadataInvariantError(f"{where} is new: pass its topic_id to acquire a fencing epoch")
    epoch = current.fencing_epoch + 1
    if epoch > MAX_EPOCH:
        raise MetadataInvariantError(f"{where}: fencing epoch {epoch} does not fit an int32 cleaner-offset entry")
    old = current.state
    vector = old.cleaner_offsets if old else ()
    state = PartitionState(
        topic=current.topic,
        topic_id=resolved,
        partition=current.partition,
        fencing_epoch=epoch,
        commit_seq=current.commit_seq + 1,
        cleaner_offsets=with_entry(vector, epoch, current_offset(vector)),
        leader_epochs=old.leader_epochs if old else (),
        updated_ms=now_ms,
        writer=writer,
        run_id=run_id,
    )
    return PartitionRows(state, current.segments)
