"""What a consumer reads back from a partition's live segments, as the end-to-end tests compare it."""

from __future__ import annotations

from collections.abc import Iterable

from compaction.format.batch import Record
from compaction.metadata import SegmentMetadata, table_in_store
from compaction.reader import Isolation, consumer_records, segment_ref
from compaction.storage import ObjectStore


def latest_per_key(
    store: ObjectStore, topic: str, partition: int, below: int | None = None
) -> dict[bytes, tuple[int, bytes | None]]:
    """key -> (offset, value) of its last read_committed record (tombstones included), below `below` if given."""
    return _latest(store, table_in_store(store).live_segments(topic, partition), below)


def latest_per_key_of_topic(store: ObjectStore, topic: str) -> dict[int, dict[bytes, tuple[int, bytes | None]]]:
    """`latest_per_key` of every partition of `topic`, from one read of the metadata table."""
    snapshot = table_in_store(store).snapshot()
    return {p.partition: _latest(store, snapshot.live_segments(topic, p.partition))
            for p in snapshot.partitions.values() if p.topic == topic}


def _latest(store: ObjectStore, live: Iterable[SegmentMetadata], below: int | None = None
            ) -> dict[bytes, tuple[int, bytes | None]]:
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for r in consumer_records(store, [segment_ref(s) for s in live], isolation=Isolation.READ_COMMITTED):
        if r.key is not None and (below is None or r.offset < below):
            latest[r.key] = (r.offset, r.value)
    return latest


def all_records(store: ObjectStore, topic: str, partition: int) -> list[Record]:
    """Every record of the partition's live segments, read_uncommitted, in offset order."""
    refs = [segment_ref(s) for s in table_in_store(store).live_segments(topic, partition)]
    return list(consumer_records(store, refs))
