"""The whole log of every partition of a store: its metadata snapshot and its WAL table, resolved together."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from compaction.errors import MetadataTableNotFoundError, UnknownPartitionError
from compaction.format.checkpoints import EpochEntry
from compaction.metadata import MetadataSnapshot, PartitionSnapshot, SegmentState, TopicPartition
from compaction.metadata.table import ObjectStoreLike, table_in_store
from compaction.wal.log import PartitionLog, resolve
from compaction.wal.model import WalEntry, WalObject
from compaction.wal.table import WalTable


def tier_end(p: PartitionSnapshot | None) -> int | None:
    """The next offset after the partition's live segments, None if it has none."""
    live = p.live_segments if p is not None else ()
    return max(s.end_offset for s in live) + 1 if live else None


def tier_epochs(p: PartitionSnapshot | None) -> list[EpochEntry]:
    """The leader epochs of the partition's live segments (each epoch at its lowest start)."""
    starts: dict[int, int] = {}
    for s in p.live_segments if p is not None else ():
        for e in s.segment_leader_epochs:
            starts[e.epoch] = min(starts.get(e.epoch, e.start_offset), e.start_offset)
    return [EpochEntry(e, o) for e, o in sorted(starts.items())]


def finished_entries(objects: Iterable[WalObject]) -> dict[TopicPartition, list[tuple[WalObject, WalEntry]]]:
    """The entries of FINISHED objects, per partition: what the log is resolved from."""
    out: dict[TopicPartition, list[tuple[WalObject, WalEntry]]] = defaultdict(list)
    for o in objects:
        if o.state is SegmentState.COPY_SEGMENT_FINISHED:
            for e in o.entries:
                out[e.tp].append((o, e))
    return out


@dataclass(frozen=True)
class StoreLog:
    """A metadata snapshot, the WAL objects read after it, and every partition's resolved log."""

    snapshot: MetadataSnapshot | None
    objects: tuple[WalObject, ...]
    logs: Mapping[TopicPartition, PartitionLog]

    def partition(self, topic: str, partition: int) -> PartitionLog:
        tp = TopicPartition(topic, partition)
        found = self.logs.get(tp)
        if found is not None:
            return found
        p = self.snapshot.partitions.get(tp) if self.snapshot is not None else None
        return resolve(topic, partition, tier_end(p), tier_epochs(p), ())


def resolve_all(snapshot: MetadataSnapshot | None, objects: Sequence[WalObject]) -> dict[TopicPartition, PartitionLog]:
    """Every partition's log, for partitions with tiered segments or WAL entries."""
    entries = finished_entries(objects)
    parts = set(entries) | (set(snapshot.partitions) if snapshot is not None else set())
    out = {}
    for tp in sorted(parts):
        p = snapshot.partitions.get(tp) if snapshot is not None else None
        out[tp] = resolve(tp.topic, tp.partition, tier_end(p), tier_epochs(p), entries.get(tp, ()))
    return out


def partition_log(store: ObjectStoreLike, topic: str, partition: int, *, metadata_version: int | None = None
                  ) -> tuple[PartitionSnapshot | None, PartitionLog]:
    """One partition's tier snapshot and resolved log, from filtered reads of both tables (same order as
    `store_log`: metadata first).

    Raises:
        UnknownPartitionError: neither table has a row of the partition (at `metadata_version`, for the metadata
            table): a consumer would get UNKNOWN_TOPIC_OR_PARTITION, not an empty log.
    """
    if partition < 0:
        raise UnknownPartitionError(f"partition {partition}: partitions are numbered from 0")
    try:
        tier = table_in_store(store, write=False)  # read only: a writer feature another writer turned on is fine
        p: PartitionSnapshot | None = tier.partition_snapshot(topic, partition, metadata_version)
    except MetadataTableNotFoundError:
        p = None
    objects = WalTable.in_store(store).partition_objects(topic, partition)
    if not objects and (p is None or not p.exists):
        at = "" if metadata_version is None else f" at metadata version {metadata_version}"
        raise UnknownPartitionError(f"the store {store.uri} holds no partition {topic}-{partition}{at}: no metadata "
                                    "row and no WAL object names it (check the topic, the partition and --store)")
    entries = finished_entries(objects).get(TopicPartition(topic, partition), [])
    return p, resolve(topic, partition, tier_end(p), tier_epochs(p), entries)


def store_log(store: ObjectStoreLike, *, metadata_version: int | None = None) -> StoreLog:
    """Read the metadata table (at `metadata_version`, default latest), then the WAL table, and resolve.

    The WAL table is read second: an object a concurrent roll just covered is then still in it, so the log
    never has a hole between the tier and the WAL (at worst an entry the tier already covers, which is skipped).
    """
    try:
        snapshot: MetadataSnapshot | None = table_in_store(store, write=False).snapshot(metadata_version)
    except MetadataTableNotFoundError:
        snapshot = None
    objects = tuple(WalTable.in_store(store).objects())
    return StoreLog(snapshot, objects, resolve_all(snapshot, objects))
