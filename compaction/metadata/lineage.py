"""Cleaner-offset vectors keyed by fencing epoch, and their read-time validation (docs/fencing.md).

A vector `[(e0, o0), (e1, o1), ...]` says: under fencing epoch `e_i` the partition was cleaned below
`o_i`. Epochs ascend and offsets never decrease along a vector. A vector is only ever written by a run
holding its highest epoch while that epoch was current, so a vector whose highest epoch is `m` *pins*
every earlier epoch `e < m`: when `m` was granted, `e` had cleaned below `bound(vector, e)` (the offset of
`e`'s entry, else of the nearest earlier entry, else 0) and it never cleans further. A row whose vector
claims more than that for an earlier epoch was written by a zombie, whatever order the rows arrived in:

    seg-0 {0: 100}            valid
    seg-2 {0: 100, 1: 155}    valid, and pins epoch 0 at 100
    seg-1 {0: 123}            rejected: claims 123 for epoch 0, pinned at 100

Only a vector that is itself valid may pin: vectors are decided from the highest epoch down, each
checked against the pins of the valid vectors above it. Otherwise a zombie's vector, which lacks the
entries of epochs it never saw, would pin those epochs at 0 and reject honest rows. The partition row
is trusted (only fenced commits write it), and vectors naming an epoch above its fencing epoch (an epoch
nobody was granted) are rejected.

Acquiring a fencing epoch writes the new epoch's entry into the partition row at once (carrying the
current offset), so the pin exists from the moment of the acquire, not only after the new owner's first
compaction. Commits are fenced too (see `change_set`); this validation is the second line, for reads: a
row that got in anyway (a forged or hand-written row) is never treated as live.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from compaction.errors import MetadataInvariantError
from compaction.metadata.model import CleanerOffset, PartitionState, SegmentMetadata

Vector = tuple[CleanerOffset, ...]


@dataclass(frozen=True)
class CleanerOffsetLineage:
    """The validated view of a partition's cleaner offsets.

    `offsets` holds the highest valid offset per epoch, ascending by epoch; `rejected` the ids of segment
    rows whose vectors claim more than a later epoch pinned (zombie rows).
    """

    offsets: Vector
    rejected: frozenset[str]

    @property
    def current(self) -> int:
        """The partition's cleaner offset: the highest epoch's offset, 0 (nothing cleaned) if none."""
        return current_offset(self.offsets)


def current_offset(vector: Vector) -> int:
    """The offset of the vector's highest epoch, or 0 if the vector is empty."""
    return max(vector, key=lambda c: c.epoch).offset if vector else 0


def bound(vector: Vector, epoch: int) -> int:
    """How far `epoch` cleaned according to `vector`: its entry, else the nearest earlier one, else 0."""
    earlier = [c for c in vector if c.epoch <= epoch]
    return max(earlier, key=lambda c: c.epoch).offset if earlier else 0


def with_entry(vector: Vector, epoch: int, offset: int) -> Vector:
    """`vector` with `epoch`'s entry set to `offset`: the cleaner offset a commit from `epoch` publishes.

    Raises:
        MetadataInvariantError: `epoch` is older than the vector's highest epoch, or `offset` is below the
            vector's current offset (a cleaner offset never goes back).
    """
    if vector and epoch < max(c.epoch for c in vector):
        raise MetadataInvariantError(
            f"cleaner offset for fencing epoch {epoch}: expected an epoch >= {max(c.epoch for c in vector)}"
        )
    if offset < current_offset(vector):
        raise MetadataInvariantError(
            f"cleaner offset must not go back: expected >= {current_offset(vector)}, found {offset}"
        )
    kept = tuple(c for c in vector if c.epoch != epoch)
    return (*kept, CleanerOffset(epoch, offset))


def _top(vector: Vector) -> int:
    return max(c.epoch for c in vector)


def _within(vector: Vector, pins: dict[int, int]) -> bool:
    return all(c.offset <= pins.get(c.epoch, c.offset) for c in vector)


def _valid_vectors(vectors: set[Vector], trusted: set[Vector], granted: int | None) -> set[Vector]:
    """The vectors that survive validation, deciding the highest epochs first (see the module docstring)."""
    epochs = {c.epoch for v in vectors for c in v}
    by_top: dict[int, list[Vector]] = defaultdict(list)
    for v in vectors:
        by_top[_top(v)].append(v)
    pins: dict[int, int] = {}
    valid: set[Vector] = set()
    for top in sorted(by_top, reverse=True):
        admitted = [
            v for v in by_top[top] if v in trusted or (_within(v, pins) and (granted is None or top <= granted))
        ]
        valid.update(admitted)
        for v in admitted:
            for e in (e for e in epochs if e < top):
                pins[e] = min(pins.get(e, bound(v, e)), bound(v, e))
    return valid


def valid_cleaner_offsets(rows: Iterable[SegmentMetadata | PartitionState]) -> CleanerOffsetLineage:
    """Validate the cleaner-offset vectors of one partition's rows against each other (see the module docstring).

    Every row is evidence, whatever its state. The partition row, if given, is trusted (only fenced
    commits write it) and rejects any segment row whose vector names an epoch above the partition's
    fencing epoch (an epoch nobody was granted). Pure, and independent of the order of `rows`.
    """
    rows = list(rows)
    trusted = {r.cleaner_offsets for r in rows if isinstance(r, PartitionState)}
    granted = max((r.fencing_epoch for r in rows if isinstance(r, PartitionState)), default=None)
    valid = _valid_vectors({r.cleaner_offsets for r in rows if r.cleaner_offsets}, trusted, granted)
    best: dict[int, int] = {}
    rejected: set[str] = set()
    for r in rows:
        if r.cleaner_offsets and r.cleaner_offsets not in valid:
            if isinstance(r, SegmentMetadata):
                rejected.add(r.segment_id)
            continue
        for c in r.cleaner_offsets:
            best[c.epoch] = max(best.get(c.epoch, c.offset), c.offset)
    offsets = tuple(CleanerOffset(e, o) for e, o in sorted(best.items()))
    return CleanerOffsetLineage(offsets, frozenset(rejected))
