"""KIP-280 on an executor: each scanned record's rank, computed column-wise (POLICY; no Spark).

The rule is `compaction.strategies.ranking` (a record's rank `(has_version, version, offset)`, the greatest of a
key's ranks wins): `ranks` computes the same ranks with numpy over a scan's Arrow arrays (the scan has already
taken each record's last value of the configured header, `header_value`), and `fold_segment` keeps each key's
greatest in a `KeyFold`. `tests/unit/test_ranking.py` holds both equal to the reference record by record.
Missing or invalid header versions are counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compaction.config import CompactionStrategy
from compaction.format.scan import binary_buffers
from compaction.strategies.keyfold import KeyFold
from compaction.strategies.ranking import VERSION_BYTES


@dataclass(frozen=True)
class Ranks:
    has_version: np.ndarray  # int8
    version: np.ndarray  # int64
    invalid_versions: int  # header strategy: records whose header is missing, null or not 8 bytes


def header_versions(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(has_version, version) from a large_binary column of header values (null = missing)."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.int8), np.zeros(0, np.int64)
    offsets, data = binary_buffers(arr)
    lengths = np.diff(offsets)
    valid = np.ones(n, bool) if arr.null_count == 0 else np.asarray(arr.is_valid())
    has = valid & (lengths == VERSION_BYTES)
    version = np.zeros(n, np.int64)
    if has.any():
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


def candidate_records(records: pa.Table, ranges: Sequence[AbortedRange],
                      columns: Sequence[str] | None = None) -> pa.Table:
    """The records of a scan that compete for their key: keyed, not control, not in an aborted transaction; with
    only `columns` when given (filtering copies every column it keeps)."""
    keep = pc.and_(pc.invert(records["control"]), pc.is_valid(records["key"]))
    if ranges:
        keep = pc.and_(keep, pc.invert(in_aborted(records, ranges)))
    return (records if columns is None else records.select(list(columns))).filter(keep)


def rank_columns(strategy: CompactionStrategy) -> tuple[str, ...]:
    """The scan columns `ranks` reads under `strategy`, besides the key and the offset."""
    return {CompactionStrategy.OFFSET: (), CompactionStrategy.TIMESTAMP: ("timestamp",),
            CompactionStrategy.HEADER: ("header_value",)}[strategy]


@dataclass(frozen=True)
class SegmentBest:
    """One segment's best-ranked record per key (`segment_best`): parallel columns."""

    keys: pa.Array
    has_version: pa.Array
    version: pa.Array
    offset: pa.Array
    invalid_versions: int


def fold_segment(fold: KeyFold, records: pa.Table, aborted: Sequence[AbortedRange], strategy: CompactionStrategy,
                 dirty: bool) -> int:
    """Fold one scanned segment's candidate records into `fold` (`compaction.strategies.keyfold`: per key the
    greatest rank, and whether any of its rows came from a dirty segment); returns its invalid versions."""
    kept = candidate_records(records, aborted, ("key", "offset", *rank_columns(strategy)))
    rank = ranks(kept, strategy)
    fold.add(kept["key"], rank.has_version, rank.version, kept["offset"].to_numpy(), dirty)
    return rank.invalid_versions


def folded(fold: KeyFold, invalid_versions: int) -> tuple[SegmentBest, np.ndarray]:
    """What `fold` holds as bests, and per key whether it is dirty."""
    keys, has_version, version, offset, dirty = fold.result()
    return SegmentBest(keys, pa.array(has_version, pa.int8()), pa.array(version, pa.int64()),
                       pa.array(offset, pa.int64()), invalid_versions), dirty


def segment_best(records: pa.Table, aborted: Sequence[AbortedRange], strategy: CompactionStrategy,
                 ) -> SegmentBest:
    """Each key's best-ranked candidate record within one scanned segment: a scan ships Spark one row per
    distinct key of the segment instead of one per record, and the best over the run is the best of these."""
    fold = KeyFold(records.num_rows)
    return folded(fold, fold_segment(fold, records, aborted, strategy, False))[0]
