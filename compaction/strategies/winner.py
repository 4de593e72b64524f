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

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

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
