"""Offset, time and transaction indexes of a segment, and their rebuild from a `.log`.

Kafka's side: `OffsetIndex` (`offset_index.py`), `TimeIndex` (`time_index.py`), `TransactionIndex`
(`txn_index.py`) and `LogSegment.recover` (`rebuild.py`); `verify.py` checks existing indexes against
their log. All formats are big-endian with no header and no checksum: Kafka rebuilds them rather than
trusting them. Every function is pure and deterministic. Import from this package; the modules are its
layout.
"""

from __future__ import annotations

from compaction.format.indexes.offset_index import (
    OFFSET_ENTRY_SIZE,
    OffsetIndexEntry,
    encode_offset_index,
    offset_index_lookup,
    read_offset_index,
)
from compaction.format.indexes.rebuild import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    SegmentIndexes,
    build_indexes,
    build_indexes_of,
)
from compaction.format.indexes.time_index import (
    TIME_ENTRY_SIZE,
    TimeIndexEntry,
    encode_time_index,
    read_time_index,
    time_index_lookup,
)
from compaction.format.indexes.txn_index import (
    ABORTED_TXN_CURRENT_VERSION,
    ABORTED_TXN_SIZE,
    AbortedTxn,
    collect_aborted_txns,
    encode_txn_index,
    read_txn_index,
)
from compaction.format.indexes.verify import verify_indexes

__all__ = [
    "ABORTED_TXN_CURRENT_VERSION",
    "ABORTED_TXN_SIZE",
    "DEFAULT_INDEX_INTERVAL_BYTES",
    "OFFSET_ENTRY_SIZE",
    "TIME_ENTRY_SIZE",
    "AbortedTxn",
    "OffsetIndexEntry",
    "SegmentIndexes",
    "TimeIndexEntry",
    "build_indexes",
    "build_indexes_of",
    "collect_aborted_txns",
    "encode_offset_index",
    "encode_time_index",
    "encode_txn_index",
    "offset_index_lookup",
    "read_offset_index",
    "read_time_index",
    "read_txn_index",
    "time_index_lookup",
    "verify_indexes",
]
