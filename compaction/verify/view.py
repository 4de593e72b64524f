"""The latest-per-key view of a partition at one metadata table version, and what replaced segments testify.

`read_view` reads a partition as a read_committed consumer does (the reader's functions, segment by segment),
but on past a transaction still open (skipping only its records) to the compared log end, and keeps each key's
winner under KIP-280's rule (`compaction.strategies.ranking`, the reference every other form of the rule is tested
against), plus every record of the region compaction must leave alone. `tombstone_evidence` reads the replaced
segments that carried a vanished tombstone: its delete horizon, and the clock of the run
that dropped it. Reads only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from compaction.errors import MissingObjectError
from compaction.format.batch import Record
from compaction.format.segment import iter_batches
from compaction.metadata import ObjectSuffix, PartitionSnapshot, SegmentMetadata, SegmentState
from compaction.reader import (
    ConsumerRead,
    Isolation,
    SegmentRef,
    aborted_ranges,
    segment_records,
    segment_ref,
    unstable_transactions,
)
from compaction.storage.base import ObjectStore
from compaction.strategies.ranking import Ranking, Winners


@dataclass(frozen=True)
class PartitionView:
    """What a read_committed consumer gets from a partition at one table version, below `log_end_offset`.

    `latest` maps each key to its winning record; `tail` holds every record at or above `tail_from` (the
    region compaction must leave untouched); `unstable` the open transactions (producer id -> first offset).
    """

    version: int
    log_end_offset: int
    cleaner_offset: int
    latest: Mapping[bytes, Record]
    tail: tuple[Record, ...] = ()
    unstable: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TombstoneEvidence:
    """What the replaced segments that carried a vanished tombstone say about its removal.

    `horizon_ms`: the deleteHorizonMs of a batch that carried it (None if no carrier had one);
    `dropped_at_ms`: the clock of the run that replaced the last carrier (None if no carrier was readable).
    """

    horizon_ms: int | None
    dropped_at_ms: int | None


def log_end_offset(snapshot: PartitionSnapshot) -> int:
    """The first offset past the partition's live segments (0 if none)."""
    live = snapshot.live_segments
    return live[-1].end_offset + 1 if live else 0


def read_view(
    store: ObjectStore,
    snapshot: PartitionSnapshot,
    ranking: Ranking,
    *,
    below: int,
    tail_from: int,
    also_unstable: Mapping[int, int] | None = None,
) -> PartitionView:
    """The read_committed latest-per-key view of `snapshot` below offset `below`.

    `also_unstable` adds open transactions (producer id -> first offset) to those found in the snapshot, so
    a transaction open at an earlier version stays invisible at a later one.
    """
    refs = [segment_ref(s) for s in snapshot.live_segments if s.start_offset < below]
    aborted = aborted_ranges(store, refs)
    unstable = dict(unstable_transactions(store, refs))
    for pid, first in (also_unstable or {}).items():
        unstable[pid] = min(first, unstable.get(pid, first))
    latest: Winners[bytes, Record] = Winners()
    tail: list[Record] = []
    for record in _records(store, refs, below, ConsumerRead(0, Isolation.READ_COMMITTED, aborted, unstable)):
        if record.offset >= tail_from:
            tail.append(record)
        if record.key is not None:
            latest.offer(record.key, ranking.rank(record), record)
    return PartitionView(snapshot.version, below, snapshot.lineage.current, latest.items(), tuple(tail), unstable)


def _records(store: ObjectStore, refs: list[SegmentRef], below: int, read: ConsumerRead) -> Iterator[Record]:
    for ref in sorted(refs, key=lambda r: r.start_offset):
        for record in segment_records(store, ref, read):
            if record.offset >= below:
                return
            yield record


def _carried_tombstones(store: ObjectStore, segment: SegmentMetadata) -> dict[int, tuple[bytes | None, int | None]]:
    """offset -> (key, deleteHorizonMs of its batch) of every tombstone in a segment; {} if its object is gone."""
    key = segment.object_key(ObjectSuffix.LOG)
    if key is None:
        return {}
    try:
        data = store.get(key)
    except MissingObjectError:
        return {}
    out: dict[int, tuple[bytes | None, int | None]] = {}
    for _pos, batch in iter_batches(data, obj=store.object_uri(key)):
        if batch.is_control:
            continue
        for r in batch.records:
            if r.value is None:
                out[r.offset] = (r.key, batch.delete_horizon_ms)
    return out


def tombstone_evidence(
    store: ObjectStore, snapshot: PartitionSnapshot, tombstones: Mapping[bytes, Record]
) -> dict[bytes, TombstoneEvidence]:
    """For each vanished tombstone, its delete horizon and the clock of the run that dropped it.

    Read from the segments of `snapshot` replaced by compaction (DELETE_SEGMENT_STARTED) whose offsets cover
    the tombstone and whose `.log` still holds it: the horizon from the batch, the drop time from the latest
    `event_timestamp_ms` among them (the run that replaced the last carrier stamped it with its clock).
    """
    replaced = [s for s in snapshot.segments if s.state is SegmentState.DELETE_SEGMENT_STARTED]
    cache: dict[str, dict[int, tuple[bytes | None, int | None]]] = {}
    out: dict[bytes, TombstoneEvidence] = {}
    for key, record in tombstones.items():
        horizons, dropped = [], []
        for seg in replaced:
            if not seg.start_offset <= record.offset <= seg.end_offset:
                continue
            if seg.segment_id not in cache:
                cache[seg.segment_id] = _carried_tombstones(store, seg)
            carried = cache[seg.segment_id].get(record.offset)
            if carried is None or carried[0] != key:
                continue
            dropped.append(seg.event_timestamp_ms)
            if carried[1] is not None:
                horizons.append(carried[1])
        out[key] = TombstoneEvidence(max(horizons, default=None), max(dropped, default=None))
    return out
