"""gc's plan: from a store listing and a metadata snapshot, what to retire and delete. Pure.

Per segment row (`segment_action`):

- DELETE_SEGMENT_STARTED older than the grace (Kafka's file.delete.delay.ms, per topic): delete its
  objects, then record DELETE_SEGMENT_FINISHED. A row whose objects are all gone already (a gc that
  crashed before its commit, a tier attempt that never uploaded) is finished without waiting: nothing
  is left for a reader to read.
- COPY_SEGMENT_STARTED older than the grace (an abandoned copy, never live: a broker's that died between its add
  and its finish, or an older kcompact tier's): first moved to
  DELETE_SEGMENT_STARTED, then handled as above in the same run. The move comes first so that a slow
  writer can no longer make the row live (STARTED -> FINISHED after our delete would lose data).
- A zombie (rejected by the cleaner-offset lineage): moved to DELETE_SEGMENT_STARTED only. An older
  table version may show the row as live, so its objects wait a full grace from the move.

Per listed object: an object under a segment key that no row references is an orphan (an upload of a
failed, fenced or crashed run) and is deleted once older than `max(grace, orphan_grace_ms)` by its mtime. A
running compaction, a tier batch and a broker's copy upload before they commit, so their objects look like orphans
until then: the orphan grace must exceed a run's longest upload-to-commit time, hence its larger default.

Combined WAL objects and the WAL table are `compaction.gc.wal`'s. Never deleted here: anything under the
metadata table, a key that does not parse as a segment object key
(reported as unknown), and a key that a row outside this run's deletions still references (a forged
row may share keys with a live one; `shared_keys_kept` counts them).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from compaction.config import TopicConfig
from compaction.gc.report import GcCounts, GcReport, PartitionGcReport
from compaction.metadata import (
    METADATA_TABLE_NAME,
    MetadataSnapshot,
    PartitionSnapshot,
    SegmentMetadata,
    SegmentState,
    TopicPartition,
    referenced_object_keys,
)
from compaction.metadata.model import OfPartition
from compaction.storage.base import ObjectInfo
from compaction.storage.layout import parse_segment_object_key
from compaction.wal.model import WAL_TABLE_NAME, parse_wal_object_key

DEFAULT_GRACE_MS = TopicConfig().file_delete_delay_ms
"""Kafka's file.delete.delay.ms default (60 s)."""

DEFAULT_ORPHAN_GRACE_MS = 24 * 3_600_000
"""How old an unreferenced object must be before gc deletes it (Iceberg's orphan removal waits 3 days)."""

GraceMs = int | Callable[[str], int]
"""A grace in ms for every topic, or a function of the topic name (e.g. its file.delete.delay.ms)."""

METADATA_PREFIX = METADATA_TABLE_NAME + "/"
WAL_TABLE_PREFIX = WAL_TABLE_NAME + "/"


def is_wal_key(key: str) -> bool:
    """A key of the WAL table or of a combined object: `compaction.gc.wal` decides about those."""
    return key.startswith(WAL_TABLE_PREFIX) or parse_wal_object_key(key) is not None


class SegmentAction(StrEnum):
    """What gc does with one segment row."""

    KEEP = "keep"  # live, a recent COPY_SEGMENT_STARTED, or already DELETE_SEGMENT_FINISHED
    RETIRE = "retire"  # zombie: to DELETE_SEGMENT_STARTED now, its objects after a grace from now
    RETIRE_AND_DELETE = "retire_and_delete"  # abandoned COPY_SEGMENT_STARTED older than the grace
    DELETE = "delete"  # DELETE_SEGMENT_STARTED past the grace, or with no object left
    WAIT = "wait"  # DELETE_SEGMENT_STARTED within the grace

    @property
    def retires(self) -> bool:
        return self in (SegmentAction.RETIRE, SegmentAction.RETIRE_AND_DELETE)

    @property
    def deletes(self) -> bool:
        return self in (SegmentAction.DELETE, SegmentAction.RETIRE_AND_DELETE)


def segment_action(
    p: PartitionSnapshot, s: SegmentMetadata, now_ms: int, grace_ms: int, listed: Container[str]
) -> SegmentAction:
    """The action for row `s` of partition `p`, given the keys `listed` in the store."""
    due = s.event_timestamp_ms + grace_ms <= now_ms
    if s.state is SegmentState.DELETE_SEGMENT_FINISHED:
        return SegmentAction.KEEP
    if s.state is SegmentState.DELETE_SEGMENT_STARTED:
        gone = not any(o.key in listed for o in s.object_keys)
        return SegmentAction.DELETE if due or gone else SegmentAction.WAIT
    if s.state is SegmentState.COPY_SEGMENT_STARTED and due:
        return SegmentAction.RETIRE_AND_DELETE
    if s.segment_id in p.lineage.rejected:
        return SegmentAction.RETIRE
    return SegmentAction.KEEP


@dataclass(frozen=True)
class SegmentDeletion:
    """One row whose objects gc deletes: every key in `keys`; `listed` holds those the listing saw."""

    segment_id: str
    retire_first: bool
    keys: tuple[str, ...]
    listed: tuple[ObjectInfo, ...]


@dataclass(frozen=True)
class PartitionGcPlan(OfPartition):
    """gc's decisions for one partition: rows to retire, rows whose objects go, orphans."""

    topic: str
    partition: int
    retire: tuple[str, ...] = ()
    deletions: tuple[SegmentDeletion, ...] = ()
    orphans: tuple[ObjectInfo, ...] = ()
    segments_waiting: int = 0
    orphans_waiting: int = 0
    shared_keys_kept: int = 0

    def report(self) -> PartitionGcReport:
        deleted = [o for d in self.deletions for o in d.listed] + list(self.orphans)
        counts = GcCounts(
            segments_finished=len(self.deletions),
            segments_retired=len(self.retire),
            objects_deleted=len(deleted),
            bytes_freed=sum(o.size for o in deleted),
            orphans_deleted=len(self.orphans),
            segments_waiting=self.segments_waiting,
            orphans_waiting=self.orphans_waiting,
            shared_keys_kept=self.shared_keys_kept,
        )
        return PartitionGcReport(self.topic, self.partition, counts)


@dataclass(frozen=True)
class GcPlan:
    """Everything one gc run does, decided from a listing and the metadata table at `metadata_version`."""

    now_ms: int
    metadata_version: int
    partitions: tuple[PartitionGcPlan, ...]
    unknown_objects: tuple[str, ...]

    def report(self, *, dry_run: bool) -> GcReport:
        partitions = tuple(p.report() for p in self.partitions)
        return GcReport(self.now_ms, self.metadata_version, dry_run, partitions, self.unknown_objects)


def grace_function(grace_ms: GraceMs) -> Callable[[str], int]:
    """`grace_ms` as a function of the topic name."""
    return grace_ms if callable(grace_ms) else (lambda _topic: grace_ms)


def plan_gc(
    listing: Iterable[ObjectInfo],
    snapshot: MetadataSnapshot,
    now_ms: int,
    *,
    grace_ms: GraceMs = DEFAULT_GRACE_MS,
    orphan_grace_ms: int = DEFAULT_ORPHAN_GRACE_MS,
) -> GcPlan:
    """Decide what gc retires and deletes (see the module docstring).

    Args:
        listing: the store's objects, listed *before* `snapshot` was read, so that an upload landing in
            between is either referenced by the snapshot or too young to be an orphan.
    """
    grace = grace_function(grace_ms)
    listed = {o.key: o for o in listing if not o.key.startswith(METADATA_PREFIX) and not is_wal_key(o.key)}
    actions = {
        (tp, s.segment_id): segment_action(p, s, now_ms, grace(tp.topic), listed)
        for tp, p in snapshot.partitions.items()
        for s in p.segments
    }
    protected = {
        o.key
        for tp, p in snapshot.partitions.items()
        for s in p.segments
        if s.state is not SegmentState.DELETE_SEGMENT_FINISHED and not actions[tp, s.segment_id].deletes
        for o in s.object_keys
    }
    plans = {tp: _partition_plan(tp, p, actions, listed, protected) for tp, p in snapshot.partitions.items()}
    unknown = _add_orphans(plans, listed, referenced_object_keys(snapshot), now_ms, grace, orphan_grace_ms)
    return GcPlan(now_ms, snapshot.version, tuple(plans[tp] for tp in sorted(plans)), unknown)


def _partition_plan(
    tp: TopicPartition,
    p: PartitionSnapshot,
    actions: dict[tuple[TopicPartition, str], SegmentAction],
    listed: dict[str, ObjectInfo],
    protected: set[str],
) -> PartitionGcPlan:
    rows = [(s, actions[tp, s.segment_id]) for s in p.segments]
    deletions = []
    shared = 0
    for s, action in rows:
        if action.deletes:
            distinct = dict.fromkeys(o.key for o in s.object_keys)  # an .indexes object is named once a file in it
            keys = tuple(k for k in distinct if k not in protected)
            shared += len(distinct) - len(keys)
            seen = tuple(listed[k] for k in keys if k in listed)
            deletions.append(SegmentDeletion(s.segment_id, action is SegmentAction.RETIRE_AND_DELETE, keys, seen))
    return PartitionGcPlan(
        tp.topic,
        tp.partition,
        retire=tuple(s.segment_id for s, action in rows if action.retires),
        deletions=tuple(deletions),
        segments_waiting=sum(action in (SegmentAction.WAIT, SegmentAction.RETIRE) for _s, action in rows),
        shared_keys_kept=shared,
    )


def _add_orphans(
    plans: dict[TopicPartition, PartitionGcPlan],
    listed: dict[str, ObjectInfo],
    referenced: frozenset[str],
    now_ms: int,
    grace: Callable[[str], int],
    orphan_grace_ms: int,
) -> tuple[str, ...]:
    """Add each partition's orphans to `plans` (in place); return the listed keys that are no segment keys."""
    unknown: list[str] = []
    orphans: dict[TopicPartition, list[ObjectInfo]] = defaultdict(list)
    waiting: dict[TopicPartition, int] = defaultdict(int)
    for key, info in sorted(listed.items()):
        try:
            parsed = parse_segment_object_key(key)
        except ValueError:
            unknown.append(key)
            continue
        if key in referenced:
            continue
        tp = TopicPartition(parsed.topic, parsed.partition)
        if info.mtime_ms + max(grace(parsed.topic), orphan_grace_ms) <= now_ms:
            orphans[tp].append(info)
        else:
            waiting[tp] += 1
    for tp in orphans.keys() | waiting.keys():
        base = plans.get(tp) or PartitionGcPlan(tp.topic, tp.partition)
        plans[tp] = replace(base, orphans=tuple(orphans[tp]), orphans_waiting=waiting[tp])
    return tuple(unknown)
