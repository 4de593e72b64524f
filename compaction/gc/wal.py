"""gc of combined WAL objects: an object goes once no entry of it is needed, a grace after it stopped being needed.

An entry is **needed** while the log (`compaction.wal.log`) uses it, or while part of its valid range lies at or
beyond the log's end (after a gap a later upload may fill). It stops being needed when tiered segments cover its
valid range, when a newer leader epoch truncated it, or when another copy serves its offsets. The moment that
happened is taken conservatively, from the metadata: the latest event time (the FINISHED commit) of the live
segments overlapping it, of the newer-epoch objects truncating it, of the other objects serving it, and of
the object itself. The object is deleted once `file.delete.delay.ms` (the largest of its topics') has passed
since then, on the `--now` clock, in KIP-405's order: DELETE_SEGMENT_STARTED (only if the object is still in
the state gc planned from), delete, DELETE_SEGMENT_FINISHED. An upload abandoned in COPY_SEGMENT_STARTED for
longer than the grace is retired and deleted the same way; a DELETE_SEGMENT_STARTED object (a gc that stopped
midway) is deleted and finished. An object any entry still needs is never deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from compaction.metadata import MetadataSnapshot, SegmentState, TopicPartition
from compaction.storage.base import ObjectStore
from compaction.wal.log import PartitionLog
from compaction.wal.model import WalEntry, WalObject
from compaction.wal.table import WalTable
from compaction.wal.view import finished_entries, resolve_all


@dataclass(frozen=True)
class WalDeletion:
    object_id: str
    key: str
    size: int
    state: SegmentState  # the state gc planned from
    reason: str  # covered | truncated | abandoned | delete_started


@dataclass
class WalGcPlan:
    deletions: list[WalDeletion] = field(default_factory=list)
    waiting: int = 0
    needed: int = 0

    def to_dict(self, store: ObjectStore | None = None, *, dry_run: bool) -> dict[str, object]:
        return {
            "objects_deleted" if not dry_run else "objects_to_delete": len(self.deletions),
            "bytes_freed" if not dry_run else "bytes_to_free": sum(d.size for d in self.deletions),
            "objects_waiting": self.waiting,
            "objects_needed": self.needed,
            "deleted" if not dry_run else "would_delete": [
                {"object_id": d.object_id, "uri": store.object_uri(d.key) if store else d.key, "size": d.size,
                 "reason": d.reason}
                for d in self.deletions
            ],
        }

    def summary(self, store: ObjectStore | None = None, *, dry_run: bool) -> str:
        """One line of counts; with `dry_run`, then a line per object it would delete (its URI and why)."""
        verb = "would delete" if dry_run else "deleted"
        lines = [f"WAL: {verb} {len(self.deletions)} combined objects ({sum(d.size for d in self.deletions)} bytes), "
                 f"{self.waiting} waiting for their grace, {self.needed} still needed"]
        if dry_run:
            lines += [f"  would delete {store.object_uri(d.key) if store else d.key} ({d.size} bytes, {d.reason})"
                      for d in self.deletions]
        return "\n".join(lines)


def needed_since(obj: WalObject, logs: Mapping[TopicPartition, PartitionLog], snapshot: MetadataSnapshot | None,
                 others: Mapping[TopicPartition, list[tuple[WalObject, WalEntry]]]) -> int | None:
    """None if some entry of `obj` is needed, else the moment the last of them stopped being needed."""
    since = obj.event_timestamp_ms
    for e in obj.entries:
        log = logs[e.tp]
        if obj.object_id in log.used_objects and any(
                s.object_id == obj.object_id and s.entry == e for s in log.slices):
            return None
        valid_last = min(e.end_offset, log.valid_end(e.leader_epoch) - 1)
        end = log.end_offset
        if valid_last >= e.start_offset and (end is None or valid_last >= end):
            return None
        if valid_last < e.end_offset:  # truncated by a newer epoch: when that epoch's data arrived
            since = max([since, *(o.event_timestamp_ms for o, x in others.get(e.tp, ())
                                  if x.leader_epoch > e.leader_epoch and x.start_offset <= e.end_offset)])
        if valid_last >= e.start_offset:  # served by the tier and by other copies since they became live
            p = snapshot.partitions.get(e.tp) if snapshot is not None else None
            for seg in p.live_segments if p is not None else ():
                if seg.start_offset <= valid_last and seg.end_offset >= e.start_offset:
                    since = max(since, seg.event_timestamp_ms)
            for o, x in others.get(e.tp, ()):
                if o.object_id != obj.object_id and o.object_id in log.used_objects and \
                        x.start_offset <= valid_last and x.end_offset >= e.start_offset:
                    since = max(since, o.event_timestamp_ms)
    return since


def plan_wal_gc(objects: Iterable[WalObject], snapshot: MetadataSnapshot | None, now_ms: int,
                grace: Callable[[str], int]) -> WalGcPlan:
    """Decide which combined objects go (see the module docstring). Pure."""
    objects = list(objects)
    logs = resolve_all(snapshot, objects)  # every partition of a FINISHED object has its log
    entries = finished_entries(objects)
    plan = WalGcPlan()
    for o in objects:
        wait = max((grace(t) for t in {e.topic for e in o.entries}), default=0)
        if o.state is SegmentState.DELETE_SEGMENT_FINISHED:
            continue
        if o.state is SegmentState.DELETE_SEGMENT_STARTED:
            plan.deletions.append(WalDeletion(o.object_id, o.key, o.size, o.state, "delete_started"))
        elif o.state is SegmentState.COPY_SEGMENT_STARTED:
            if o.event_timestamp_ms + wait <= now_ms:
                plan.deletions.append(WalDeletion(o.object_id, o.key, o.size, o.state, "abandoned"))
        else:
            since = needed_since(o, logs, snapshot, entries)
            if since is None:
                plan.needed += 1
            elif since + wait <= now_ms:
                plan.deletions.append(WalDeletion(o.object_id, o.key, o.size, o.state, "not_needed"))
            else:
                plan.waiting += 1
    return plan


def execute_wal_gc(plan: WalGcPlan, store: ObjectStore, table: WalTable, now_ms: int) -> WalGcPlan:
    """Retire, delete, finish; returns the plan as executed (objects a concurrent commit moved are dropped)."""
    retired: set[str] = set()
    for state in (SegmentState.COPY_SEGMENT_STARTED, SegmentState.COPY_SEGMENT_FINISHED):
        ids = [d.object_id for d in plan.deletions if d.state is state]
        if ids:
            done = table.change_state(ids, SegmentState.DELETE_SEGMENT_STARTED, now_ms, expected=state)
            retired |= {o.object_id for o in done if o.state is SegmentState.DELETE_SEGMENT_STARTED}
    todo = [d for d in plan.deletions if d.state is SegmentState.DELETE_SEGMENT_STARTED or d.object_id in retired]
    store.delete_many(d.key for d in todo)
    if todo:
        table.change_state([d.object_id for d in todo], SegmentState.DELETE_SEGMENT_FINISHED, now_ms)
    return WalGcPlan(todo, plan.waiting + len(plan.deletions) - len(todo), plan.needed)
