"""One partition's log as the store holds it: the tiered segments, then the WAL entries above them. Pure.

The log follows the highest leader epoch, as Kafka truncates a follower to its leader
(`docs/wal.md` has the worked examples):

- every epoch starts at the lowest offset any FINISHED entry (or tiered segment) of it starts at;
- data of epoch `e` is valid below the start of the first newer epoch, `valid_end(e) = min(start(e') for e' > e)`:
  what an older leader wrote at or above a newer epoch's start is not part of the log (read, roll,
  compaction and gc all use this one resolution);
- from the tier's end (or, with nothing tiered, the lowest valid entry start) the log continues with the entry
  holding the next offset in its epoch's valid range; copies of the same epoch and offsets (a rerun racing
  another upload) are equal bytes, and the longest is taken. The log ends where no entry holds the next offset.

Tiered segments are committed data (a broker tiers only below its high watermark, and `kcompact wal roll`
rolls only from this resolution), so the tier is never truncated by the WAL; a newer epoch starting below
the tier's end is used from the tier's end on.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from compaction.format.checkpoints import EpochEntry
from compaction.wal.model import WalEntry, WalObject

NO_END = 2**63 - 1


@dataclass(frozen=True)
class WalSlice:
    """The part of one entry that the log uses: offsets `first_offset..last_offset` of `entry`."""

    object_id: str
    object_key: str
    entry: WalEntry
    first_offset: int
    last_offset: int


@dataclass(frozen=True)
class PartitionLog:
    """A partition's log: `tier_end` (next offset after the tier, None if nothing is tiered), then `slices`."""

    topic: str
    partition: int
    tier_end: int | None
    slices: tuple[WalSlice, ...]
    epoch_starts: Mapping[int, int] = field(default_factory=dict)

    @property
    def end_offset(self) -> int | None:
        """The next offset after the whole log (tier and WAL); None for an empty log."""
        return self.slices[-1].last_offset + 1 if self.slices else self.tier_end

    @property
    def latest_epoch(self) -> int | None:
        """The newest leader epoch the store knows for the partition (a deposed leader's is older)."""
        return max(self.epoch_starts, default=None)

    @property
    def used_objects(self) -> frozenset[str]:
        return frozenset(s.object_id for s in self.slices)

    def valid_end(self, epoch: int) -> int:
        """The first offset at which data of `epoch` is no longer part of the log (NO_END: none)."""
        return min((s for e, s in self.epoch_starts.items() if e > epoch), default=NO_END)

    def epoch_end(self, epoch: int) -> int | None:
        """Kafka's OffsetsForLeaderEpoch answer for this log (`epoch_end`)."""
        return epoch_end(self.epoch_starts, self.end_offset, epoch)


def epoch_end(epoch_starts: Mapping[int, int], log_end: int | None, epoch: int) -> int | None:
    """Kafka's OffsetsForLeaderEpoch answer: the end offset of the largest epoch <= `epoch` in a lineage.

    That is the next epoch's start, or `log_end` for the latest epoch; None if no epoch <= `epoch`.
    """
    older = [e for e in epoch_starts if e <= epoch]
    if not older:
        return None
    newer = [s for e, s in epoch_starts.items() if e > max(older)]
    return min(newer) if newer else log_end


def resolve(
    topic: str,
    partition: int,
    tier_end: int | None,
    tier_epochs: Iterable[EpochEntry],
    entries: Sequence[tuple[WalObject, WalEntry]],
) -> PartitionLog:
    """The partition's log from its tier end and its FINISHED entries (see the module docstring)."""
    starts: dict[int, int] = {}
    for e in tier_epochs:
        starts[e.epoch] = min(starts.get(e.epoch, e.start_offset), e.start_offset)
    for _obj, en in entries:
        starts[en.leader_epoch] = min(starts.get(en.leader_epoch, en.start_offset), en.start_offset)
    epochs = sorted(starts)
    valid_end = {e: min((starts[n] for n in epochs if n > e), default=NO_END) for e in epochs}

    by_epoch: dict[int, list[tuple[WalObject, WalEntry]]] = defaultdict(list)
    for obj, en in entries:
        if en.start_offset < valid_end[en.leader_epoch]:
            by_epoch[en.leader_epoch].append((obj, en))
    for items in by_epoch.values():
        items.sort(key=lambda oe: (oe[1].start_offset, -oe[1].end_offset, oe[0].created_ms, oe[0].object_id))
    first_starts = {e: [en.start_offset for _o, en in items] for e, items in by_epoch.items()}

    if tier_end is not None:
        offset = tier_end
    else:
        offset = min((items[0][1].start_offset for items in by_epoch.values()), default=0)
    slices: list[WalSlice] = []
    dead = dict.fromkeys(by_epoch, 0)
    while True:
        epoch = _epoch_at(epochs, starts, valid_end, offset)
        if epoch is None or epoch not in by_epoch:
            break
        items = by_epoch[epoch]
        # Candidates start at or below `offset`; the one reaching furthest wins (ties: the first listed).
        # Entries before `dead[epoch]` end below the offsets still to come (offsets only grow).
        upto = bisect.bisect_right(first_starts[epoch], offset)
        lo = dead[epoch]
        while lo < upto and items[lo][1].end_offset < offset:
            lo += 1
        dead[epoch] = lo
        best = max((oe for oe in items[lo:upto] if oe[1].end_offset >= offset), key=lambda oe: oe[1].end_offset,
                   default=None)
        if best is None:
            break
        obj, en = best
        last = min(en.end_offset, valid_end[epoch] - 1)
        slices.append(WalSlice(obj.object_id, obj.key, en, offset, last))
        offset = last + 1
    return PartitionLog(topic, partition, tier_end, tuple(slices), starts)


def _epoch_at(epochs: list[int], starts: Mapping[int, int], valid_end: Mapping[int, int], offset: int) -> int | None:
    """The epoch whose valid range [start, valid_end) holds `offset` (valid ranges are disjoint)."""
    for e in epochs:
        if starts[e] <= offset < valid_end[e]:
            return e
    return None
