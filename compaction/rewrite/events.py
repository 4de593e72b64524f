"""The transaction-marker walk's input, taken from a segment's columnar scan (no second read).

`txn_events` lists a scanned segment's transactional and control batches in offset order, as
`compaction.strategies.transactions.states_at` needs them to give every rewrite chunk of a round the
state the sequential walk would reach at its start. Pure.
"""

from __future__ import annotations

import numpy as np

from compaction.format.batch import CONTROL_FLAG_MASK, TRANSACTIONAL_FLAG_MASK
from compaction.format.scan import SegmentScan
from compaction.strategies.transactions import TxnEvent

# columns of `SegmentScan.batch_fields`
_BASE, _ATTRIBUTES, _LAST_OFFSET_DELTA, _PRODUCER_ID, _COUNT = 2, 5, 6, 9, 12


def txn_events(scan: SegmentScan) -> list[TxnEvent]:
    """The segment's transactional and control batches, in offset order."""
    fields = scan.batch_fields
    attrs = fields[:, _ATTRIBUTES]
    marked = np.nonzero((attrs & (TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK)) != 0)[0]
    if not marked.size:
        return []
    types: dict[int, int] = {}
    records = scan.records
    if records.num_rows:
        control = records.filter(records["control"])
        for last, key in zip(control["batch_last_offset"].to_pylist(), control["key"].to_pylist(), strict=True):
            types.setdefault(int(last), int.from_bytes(key[2:4], "big", signed=True) if key and len(key) >= 4 else -1)
    out = []
    for i in marked:
        last = int(fields[i, _BASE] + fields[i, _LAST_OFFSET_DELTA])
        is_control = bool(attrs[i] & CONTROL_FLAG_MASK)
        control = (types.get(last, -1) if fields[i, _COUNT] else -1) if is_control else None
        out.append(TxnEvent(last, int(fields[i, _PRODUCER_ID]), bool(attrs[i] & TRANSACTIONAL_FLAG_MASK), control))
    return out


__all__ = ["txn_events"]
