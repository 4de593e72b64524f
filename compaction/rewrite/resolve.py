"""Which records can win their key, and the winners of a clean segment found in the rewrite task itself.

`candidate_records` is the one definition of a record that competes for its key: keyed, not a control
record, not in an aborted transaction. The Spark scan ranks exactly these, and so does
`resolve_clean_segment`.

Why resolve in the task: a clean segment whose filter says it may hold a dirty key must be rewritten, but
it was not part of the Spark scan (whether to read it was only known after that scan). Scanning it on Spark
and downloading it again in the rewrite would read it twice. Instead the rewrite task, which downloads it
anyway, computes its winners from the clean-region invariant (`compaction.bloom.skipping`): a key of the
segment that is not dirty has no other record in the round, so its best record in the segment wins; a dirty
key's record wins only if it outranks the best record Spark found for that key, which the task receives
with the partition's dirty keys (`DirtyKeys`). When it does, that best record is *superseded*: its offset
is removed from the winners of the groups after this one (clean segments lie below every dirty offset).
Keys are compared by their full bytes; the 64-bit hashes only find candidates.

Pure: no Spark, no store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compaction.bloom.hashing import key_hashes
from compaction.config import CompactionStrategy
from compaction.format.scan import scan_segment
from compaction.strategies.winner import ranks

AbortedRange = tuple[int, int, int]  # (producer id, first offset, last offset) of an aborted transaction


def in_aborted(records: pa.Table, ranges: Sequence[AbortedRange]) -> pa.ChunkedArray:
    """Records of transactional batches that an aborted transaction (pid, first..last) covers."""
    hit = pc.equal(records["offset"], -1)  # all false
    for pid, first, last in ranges:
        covered = pc.and_(
            pc.equal(records["producer_id"], pid),
            pc.and_(
                pc.greater_equal(records["batch_base_offset"], first),
                pc.less_equal(records["batch_base_offset"], last),
            ),
        )
        hit = pc.or_(hit, covered)
    return pc.and_(hit, records["transactional"])


def candidate_records(records: pa.Table, ranges: Sequence[AbortedRange]) -> pa.Table:
    """The records of a scan that compete for their key: keyed, not control, not aborted."""
    keep = pc.and_(pc.invert(records["control"]), pc.is_valid(records["key"]))
    if ranges:
        keep = pc.and_(keep, pc.invert(in_aborted(records, ranges)))
    return records.filter(keep)


@dataclass(frozen=True)
class DirtyKeys:
    """One partition's dirty keys, each with the best rank (has_version, version, offset) Spark found for it."""

    keys: pa.Array  # large_binary, no nulls, distinct
    has_version: np.ndarray
    version: np.ndarray
    offset: np.ndarray
    _sorted_hashes: np.ndarray = field(init=False, repr=False, compare=False)
    _order: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hashes = key_hashes(self.keys)
        order = np.argsort(hashes, kind="stable")
        object.__setattr__(self, "_order", order)
        object.__setattr__(self, "_sorted_hashes", hashes[order])

    @classmethod
    def from_table(cls, table: pa.Table) -> DirtyKeys:
        """From columns key, has_version, version, offset (any binary type for key)."""
        keys = table["key"].combine_chunks().cast(pa.large_binary()) if table.num_rows else pa.array(
            [], pa.large_binary()
        )
        return cls(
            keys,
            np.asarray(table["has_version"].to_numpy(), dtype=np.int8),
            np.asarray(table["version"].to_numpy(), dtype=np.int64),
            np.asarray(table["offset"].to_numpy(), dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.keys)

    def lookup(self, keys: pa.Array) -> np.ndarray:
        """Per key of `keys` (large_binary, no nulls), its index here, or -1 if it is not dirty."""
        found = np.full(len(keys), -1, np.int64)
        if len(keys) == 0 or len(self) == 0:
            return found
        hashes = key_hashes(keys)
        slots = np.searchsorted(self._sorted_hashes, hashes)
        inside = slots < self._sorted_hashes.size
        hit = np.zeros(len(keys), bool)
        hit[inside] = self._sorted_hashes[slots[inside]] == hashes[inside]
        rows = np.flatnonzero(hit)
        if rows.size == 0:
            return found
        index = self._order[slots[rows]]
        same = pc.equal(keys.take(pa.array(rows)), self.keys.take(pa.array(index))).to_numpy(zero_copy_only=False)
        found[rows[same]] = index[same]
        for row in rows[~same]:  # two dirty keys share a 64-bit hash: look at the others with it
            found[row] = self._exact(keys[int(row)].as_py(), int(hashes[row]), int(slots[row]))
        return found

    def _exact(self, key: bytes, h: int, slot: int) -> int:
        while slot < self._sorted_hashes.size and int(self._sorted_hashes[slot]) == h:
            index = int(self._order[slot])
            if self.keys[index].as_py() == key:
                return index
            slot += 1
        return -1


@dataclass(frozen=True)
class Resolved:
    """A clean segment's winners (sorted offsets), the offsets it supersedes, and how many dirty keys it holds."""

    winners: np.ndarray
    superseded: np.ndarray
    dirty_found: int


def best_per_key(keys: pa.Array, has_version: np.ndarray, version: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Row indices of the greatest (has_version, version, offset) of each distinct key."""
    if len(keys) == 0:
        return np.empty(0, np.int64)
    table = pa.table({"key": keys, "h": has_version, "v": version, "o": offset})
    order = pc.sort_indices(
        table, sort_keys=[("key", "ascending"), ("h", "descending"), ("v", "descending"), ("o", "descending")]
    )
    ordered = keys.take(order)
    first = np.ones(len(keys), bool)
    if len(keys) > 1:
        first[1:] = pc.not_equal(ordered[1:], ordered[:-1]).to_numpy(zero_copy_only=False)
    return np.asarray(order.to_numpy()[first], dtype=np.int64)


def resolve_clean_segment(
    data: bytes | bytearray | memoryview,
    *,
    obj: str,
    strategy: CompactionStrategy,
    header: str | None,
    aborted: Sequence[AbortedRange],
    dirty: DirtyKeys,
) -> Resolved:
    """The winners of a clean segment against `dirty` (see the module docstring).

    Raises a CorruptInputError subclass naming `obj` and the byte position for a malformed segment.
    """
    scan = scan_segment(data, obj=obj, header_key=header)
    kept = candidate_records(scan.records, aborted)
    rank = ranks(kept, strategy)
    keys = kept["key"].combine_chunks().cast(pa.large_binary())
    hv = np.asarray(rank.has_version, dtype=np.int8)
    v = np.asarray(rank.version, dtype=np.int64)
    off = np.asarray(kept["offset"].to_numpy(), dtype=np.int64)
    best = best_per_key(keys, hv, v, off)
    keys, hv, v, off = keys.take(pa.array(best)), hv[best], v[best], off[best]
    index = dirty.lookup(keys)
    is_dirty = index >= 0
    d = index[is_dirty]
    dh, dv, do = dirty.has_version[d], dirty.version[d], dirty.offset[d]
    sh, sv, so = hv[is_dirty], v[is_dirty], off[is_dirty]
    outranks = (sh > dh) | ((sh == dh) & ((sv > dv) | ((sv == dv) & (so > do))))
    wins = ~is_dirty
    wins[np.flatnonzero(is_dirty)[outranks]] = True
    return Resolved(np.sort(off[wins]), np.sort(do[outranks]), int(is_dirty.sum()))
