"""KIP-280: which record of a key wins, as a sortable rank (POLICY; no Spark).

Every candidate record gets a rank `(has_version, version, offset)`; the winner of a key is the record with the
greatest rank, compared left to right. So:

- `offset`: has_version = version = 0 for all → the highest offset wins (Kafka's behaviour);
- `timestamp`: version = the record timestamp (LogAppendTime batches: the batch's max timestamp, as consumers
  see it) → the highest timestamp wins, equal timestamps go to the higher offset;
- `header`: version = the value of the **last** occurrence of the configured header (exact, case-sensitive
  name), decoded as an 8-byte big-endian signed long. A value of any other length (or null, or no such header)
  counts as missing: has_version = 0, so a record that has the header beats one that hasn't, and among
  records without it (or with equal values) the higher offset wins. Missing/invalid versions are counted.

Tombstones compete like any record. The rank is computed column-wise with numpy over the scan's Arrow arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compaction.config import CompactionStrategy

VERSION_BYTES = 8


@dataclass(frozen=True)
class Ranks:
    has_version: np.ndarray  # int8
    version: np.ndarray  # int64
    invalid_versions: int  # header strategy: records whose header is missing, null or not 8 bytes


def header_versions(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(has_version, version) from a large_binary column of header values (null = missing)."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    arr = arr.cast(pa.large_binary())
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.int8), np.zeros(0, np.int64)
    validity, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset : arr.offset + n + 1]
    lengths = np.diff(offsets)
    valid = np.ones(n, bool) if validity is None else np.asarray(arr.is_valid())
    has = valid & (lengths == VERSION_BYTES)
    version = np.zeros(n, np.int64)
    if has.any():
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        starts = offsets[:-1][has]
        raw = data[starts[:, None] + np.arange(VERSION_BYTES)]
        version[has] = raw.copy().view(">i8").ravel().astype(np.int64)
    return has.astype(np.int8), version


def ranks(records: pa.Table, strategy: CompactionStrategy) -> Ranks:
    """The (has_version, version) rank columns of `records` (a `scan_segment` table) under `strategy`."""
    n = records.num_rows
    if strategy is CompactionStrategy.OFFSET:
        return Ranks(np.zeros(n, np.int8), np.zeros(n, np.int64), 0)
    if strategy is CompactionStrategy.TIMESTAMP:
        ts = records["timestamp"].to_numpy()
        return Ranks(np.ones(n, np.int8), np.asarray(ts, np.int64), 0)
    has, version = header_versions(records["header_value"])
    return Ranks(has, version, int(n - has.sum()))


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
    """The records of a scan that compete for their key: keyed, not control, not in an aborted transaction."""
    keep = pc.and_(pc.invert(records["control"]), pc.is_valid(records["key"]))
    if ranges:
        keep = pc.and_(keep, pc.invert(in_aborted(records, ranges)))
    return records.filter(keep)


def best_per_key(keys: pa.Array, has_version: np.ndarray, version: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Row indices of each distinct key's greatest rank (has_version, version, offset): the winner rule.

    This is the rule on one executor's rows; `compaction.spark.winners.best_per_key` applies the same rule as a
    Spark aggregate over the whole run (a property test holds the two equal). Keys are compared by their bytes.
    """
    order, first = _ranked(keys, has_version, version, offset)
    return np.asarray(order[first], dtype=np.int64)


def _ranked(keys: pa.Array, has_version: np.ndarray, version: np.ndarray, offset: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """The rows in (key, rank descending) order, and which of them open a key (its best)."""
    if len(keys) == 0:
        return np.empty(0, np.int64), np.empty(0, bool)
    table = pa.table({"key": keys, "h": has_version, "v": version, "o": offset})
    order = pc.sort_indices(
        table, sort_keys=[("key", "ascending"), ("h", "descending"), ("v", "descending"), ("o", "descending")]
    )
    ordered = keys.take(order)
    first = np.ones(len(keys), bool)
    if len(keys) > 1:
        first[1:] = pc.not_equal(ordered[1:], ordered[:-1]).to_numpy(zero_copy_only=False)
    return np.asarray(order.to_numpy(), np.int64), first


@dataclass(frozen=True)
class SegmentBest:
    """One segment's best-ranked record per key (`segment_best`): parallel columns."""

    keys: pa.Array
    has_version: pa.Array
    version: pa.Array
    offset: pa.Array
    invalid_versions: int


def segment_best(records: pa.Table, aborted: Sequence[AbortedRange], strategy: CompactionStrategy,
                 ) -> SegmentBest:
    """Each key's best-ranked candidate record within one scanned segment.

    Pre-aggregating on the executor ships Spark one row per distinct key of the segment instead of one per
    record; the best over the run is the best of these bests. Offset strategy: a hash group-by (max offset);
    the others: `best_per_key` (a sort by key and rank).
    """
    kept = candidate_records(records, aborted)
    keys = kept["key"].cast(pa.binary()).combine_chunks()
    offsets = kept["offset"].combine_chunks()
    if strategy is CompactionStrategy.OFFSET:
        best = pa.table({"key": keys, "offset": offsets}).group_by("key", use_threads=False).aggregate(
            [("offset", "max")])
        return _by_offset(best, 0)
    rank = ranks(kept, strategy)
    has_version = np.asarray(rank.has_version, np.int8)
    version = np.asarray(rank.version, np.int64)
    idx = best_per_key(keys, has_version, version, offsets.to_numpy())
    return _taken(keys, has_version, version, offsets, idx, rank.invalid_versions)


def _by_offset(best: pa.Table, invalid: int) -> SegmentBest:
    """A (key, offset_max) group-by result as bests, with the constant rank of the offset strategy."""
    n = best.num_rows
    return SegmentBest(best["key"].combine_chunks(), pa.repeat(pa.scalar(0, pa.int8()), n),
                       pa.repeat(pa.scalar(0, pa.int64()), n), best["offset_max"].combine_chunks(), invalid)


def _taken(keys: pa.Array, has_version: np.ndarray, version: np.ndarray, offsets: pa.Array, idx: np.ndarray,
           invalid: int) -> SegmentBest:
    """The rows `idx` of parallel rank columns as bests."""
    return SegmentBest(keys.take(idx), pa.array(has_version[idx], pa.int8()), pa.array(version[idx], pa.int64()),
                       offsets.take(idx), invalid)


def merge_bests(parts: Sequence[tuple[SegmentBest, bool]], strategy: CompactionStrategy
                ) -> tuple[SegmentBest, np.ndarray]:
    """The best per key over several segments' bests, each given with whether its segment is dirty, and per key
    whether any of its segments is: what Spark's aggregate (`compaction.spark.winners.best_per_key`) makes of
    the same rows, the greatest rank and any dirty, so a scan task hands Spark one row per key of its
    segments instead of one per segment and key."""
    if len(parts) == 1:
        only, is_dirty = parts[0]
        return only, np.full(len(only.keys), is_dirty)
    keys = pa.concat_arrays([b.keys for b, _d in parts])
    offset = pa.concat_arrays([b.offset for b, _d in parts])
    dirty = np.concatenate([np.full(len(b.keys), d) for b, d in parts])
    invalid = sum(b.invalid_versions for b, _d in parts)
    if strategy is CompactionStrategy.OFFSET:
        best = pa.table({"key": keys, "offset": offset, "dirty": dirty}).group_by("key", use_threads=False).aggregate(
            [("offset", "max"), ("dirty", "any")])
        return _by_offset(best, invalid), best["dirty_any"].to_numpy()
    has_version = np.concatenate([np.asarray(b.has_version, np.int8) for b, _d in parts])
    version = np.concatenate([np.asarray(b.version, np.int64) for b, _d in parts])
    order, first = _ranked(keys, has_version, version, offset.to_numpy())
    idx = order[first]
    any_dirty = np.logical_or.reduceat(dirty[order], np.flatnonzero(first)) if len(idx) else np.zeros(0, bool)
    return _taken(keys, has_version, version, offset, idx, invalid), any_dirty
