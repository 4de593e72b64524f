"""The offset and time index entries of a segment from its batch table, in one numba pass (`rebuild.py`).

`rebuild.build_indexes` replays `LogSegment.append` batch by batch over Python headers; a cleaned segment of
20,000 batches spent a fifth of its rewrite there (BENCHMARKS.md, P10). `index_entries` applies the same rule to
`scan_kernels.walk_batches`'s table (one append per batch) and reports anything the rule would reject as a status
instead of raising: the caller then takes the reference path, which names the error. Offsets into the batch
table are `scan_kernels`' columns, as literals (numba freezes them anyway).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compaction.kernels import kernel

_INT32_MAX = 2**31 - 1
_NO_TIMESTAMP = -1  # an empty time index's last entry: nothing at or below it is ever indexed


@kernel(nogil=True)
def index_entries(fields: np.ndarray, base_offset: int, interval: int) -> tuple[int, Any, Any]:
    """(status, offset entries [k, 2]: relative offset and position, time entries [m, 2]: timestamp and relative
    offset) of a segment whose batches are the rows of `fields` (`walk_batches`), each batch one append. status 0
    = ok; 1 = a batch's last offset does not fit the segment, an indexed offset is not above the previous one, or
    a position does not fit an entry (the reference path raises for each)."""
    n = fields.shape[0]
    offsets = np.empty((n, 2), np.int64)
    times = np.empty((n + 1, 2), np.int64)
    k = 0
    m = 0
    last_time = np.int64(_NO_TIMESTAMP)
    max_ts = np.int64(_NO_TIMESTAMP)
    max_rel = np.int64(0)
    since = np.int64(0)
    for i in range(n):
        rel = fields[i, 2] + fields[i, 6] - base_offset  # base offset + last offset delta
        if rel < 0 or rel > _INT32_MAX or fields[i, 0] > _INT32_MAX:
            return 1, offsets[:0], times[:0]
        if fields[i, 8] > max_ts:  # max timestamp
            max_ts = fields[i, 8]
            max_rel = rel
        if since > interval:
            if k > 0 and rel <= offsets[k - 1, 0]:
                return 1, offsets[:0], times[:0]
            offsets[k, 0] = rel
            offsets[k, 1] = fields[i, 0]
            k += 1
            if max_ts > last_time:
                times[m, 0] = max_ts
                times[m, 1] = max_rel
                m += 1
                last_time = max_ts
            since = np.int64(0)
        since += fields[i, 1]
    if max_ts > last_time:  # onBecomeInactiveSegment: maybeAppend(..., skipFullCheck=true)
        times[m, 0] = max_ts
        times[m, 1] = max_rel
        m += 1
    return 0, offsets[:k], times[:m]


__all__ = ["index_entries"]
