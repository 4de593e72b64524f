"""The verify views column-wise: what one Spark task computes from one segment. Pure: no Spark, no store.

`view_rows` is `view.read_view` for one segment, as Arrow columns from the numba scan: every record a
read_committed consumer could receive below the compared log end, with its KIP-280 rank and its full headers
(the fields `compare` judges). Transactions still open are not known from one segment alone, so rows keep
their producer id and, for transactional batches, the batch's base offset (`txn_base`), and the segment's
`TxnSummary` lets the driver fold the open transactions of the whole view (`open_transactions_after`) and
drop those rows as `reader.segment_records` does. `carried_tombstones` is `view._carried_tombstones` as
columns: the evidence a replaced segment holds about a vanished tombstone.

The scan gives keys and values but not headers, so `record_headers` walks the records once more with a small
numba kernel to find each record's header section; only records that have headers are decoded in Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compaction.config import CompactionStrategy
from compaction.errors import CorruptBatchError
from compaction.format.batch import RECORDS_OFFSET
from compaction.format.codecs import Codec, decompress
from compaction.format.scan import SegmentScan, scan_segment
from compaction.format.segment import BatchHeader, iter_batch_headers
from compaction.format.varint import read_varint
from compaction.kernels import kernel
from compaction.strategies.winner import AbortedRange, in_aborted, ranks

HEADER = pa.struct([pa.field("key", pa.binary(), False), pa.field("value", pa.binary())])
"""A record header as verify carries it: the key as raw bytes, so invalid UTF-8 compares exactly too."""

VIEW_ROWS = pa.schema(
    [
        pa.field("offset", pa.int64(), False),
        pa.field("timestamp", pa.int64(), False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(HEADER), False),
        pa.field("has_version", pa.int8(), False),
        pa.field("version", pa.int64(), False),
        pa.field("producer_id", pa.int64(), False),
        pa.field("txn_base", pa.int64()),
    ]
)
"""One row per record a read_committed consumer may receive; `txn_base` is null outside transactions."""

TOMBSTONES = pa.schema(
    [
        pa.field("key", pa.binary(), False),
        pa.field("offset", pa.int64(), False),
        pa.field("horizon_ms", pa.int64()),
    ]
)
"""One row per keyed tombstone of a segment, with its batch's deleteHorizonMs (null if none)."""


@dataclass(frozen=True)
class TxnSummary:
    """What one segment does to the open transactions: producers whose transaction a marker ended in it, and
    producer -> first offset of a transaction still open at its end (`reader.open_transactions`)."""

    ended: frozenset[int] = frozenset()
    opened: dict[int, int] = field(default_factory=dict)


def txn_summary(headers: Iterable[BatchHeader]) -> TxnSummary:
    """The `TxnSummary` of a segment's batches, in file order."""
    ended: set[int] = set()
    opened: dict[int, int] = {}
    for batch in headers:
        if not batch.is_transactional:
            continue
        if batch.is_control:
            ended.add(batch.producer_id)
            opened.pop(batch.producer_id, None)
        else:
            opened.setdefault(batch.producer_id, batch.base_offset)
    return TxnSummary(frozenset(ended), opened)


def open_transactions_after(summaries: Iterable[TxnSummary]) -> dict[int, int]:
    """The open transactions after segments with these summaries, in offset order: `reader.open_transactions`
    over all their batches."""
    state: dict[int, int] = {}
    for summary in summaries:
        state = {pid: first for pid, first in state.items() if pid not in summary.ended}
        for pid, first in summary.opened.items():
            state.setdefault(pid, first)
    return state


def view_rows(
    data: bytes | bytearray | memoryview,
    *,
    obj: str,
    strategy: CompactionStrategy,
    header: str | None,
    aborted: Sequence[AbortedRange],
    below: int,
) -> tuple[pa.Table, TxnSummary]:
    """The `VIEW_ROWS` of a segment image below offset `below` (control and aborted records left out) and its
    `TxnSummary`. Raises CorruptInputError naming `obj` and the byte position for malformed input."""
    scan = scan_segment(data, obj=obj, header_key=header, with_values=True)
    batches = list(iter_batch_headers(data, obj=obj))
    records = scan.records.append_column("headers", record_headers(data, scan, batches, obj))
    keep = pc.and_(pc.invert(records["control"]), pc.less(records["offset"], below))
    if aborted:
        keep = pc.and_(keep, pc.invert(in_aborted(records, aborted)))
    kept = records.filter(keep)
    rank = ranks(kept, strategy)
    txn_base = pc.if_else(kept["transactional"], kept["batch_base_offset"], pa.scalar(None, pa.int64()))
    rows = pa.Table.from_arrays(
        [
            kept["offset"],
            kept["timestamp"],
            kept["key"].cast(pa.binary()),
            kept["value"].cast(pa.binary()),
            kept["headers"],
            pa.array(rank.has_version, pa.int8()),
            pa.array(rank.version, pa.int64()),
            kept["producer_id"],
            txn_base,
        ],
        schema=VIEW_ROWS,
    )
    return rows, txn_summary(batches)


def carried_tombstones(data: bytes | bytearray | memoryview, *, obj: str) -> pa.Table:
    """The `TOMBSTONES` of a segment image: its keyed tombstones outside control batches."""
    records = scan_segment(data, obj=obj).records
    tomb = records.filter(pc.and_(pc.and_(pc.invert(records["control"]), records["value_is_null"]),
                                  pc.is_valid(records["key"])))
    horizon = tomb["delete_horizon_ms"]
    return pa.Table.from_arrays(
        [tomb["key"].cast(pa.binary()), tomb["offset"],
         pc.if_else(pc.less(horizon, 0), pa.scalar(None, pa.int64()), horizon)],
        schema=TOMBSTONES,
    )


# --- headers ---------------------------------------------------------------------------------------


@kernel(nogil=True)
def _skip_varint(buf: np.ndarray, pos: int, end: int) -> tuple[Any, int]:
    """(zigzag value, next position) of the varint at `pos`; next position -1 past `end`."""
    result = np.uint64(0)
    shift = 0
    while pos < end and shift < 64:
        b = np.uint64(buf[pos])
        pos += 1
        result |= (b & np.uint64(0x7F)) << np.uint64(shift)
        if b < 0x80:
            return np.int64(result >> np.uint64(1)) ^ -np.int64(result & np.uint64(1)), pos
        shift += 7
    return 0, -1


@kernel(nogil=True)
def _header_sections(
    main: np.ndarray, side: np.ndarray, use_side: np.ndarray, sec_start: np.ndarray, sec_end: np.ndarray,
    counts: np.ndarray, total: int,
) -> tuple[np.ndarray, int]:
    """Per record in file order, (header count, where its headers start and end) in its batch's buffer as
    rows of an [3, total] array; and the index of the first record that could not be walked (-1: none)."""
    out = np.zeros((3, total), np.int64)
    r = 0
    for b in range(counts.shape[0]):
        buf = side if use_side[b] else main
        pos, stop = sec_start[b], sec_end[b]
        for _ in range(counts[b]):
            length, pos = _skip_varint(buf, pos, stop)
            if pos < 0 or length < 1 or pos + length > stop:
                return out, r
            rec_end = pos + length
            pos += 1  # attributes
            for field_no in range(5):  # timestamp delta, offset delta, key and value (length, bytes), count
                n, pos = _skip_varint(buf, pos, rec_end)
                if pos < 0:
                    return out, r
                if field_no in (2, 3) and n > 0:
                    pos += n
            out[0, r], out[1, r], out[2, r] = n, pos, rec_end
            r += 1
            pos = rec_end
    return out, -1


def record_headers(
    data: bytes | bytearray | memoryview, scan: SegmentScan, batches: Sequence[BatchHeader], obj: str
) -> pa.ListArray:
    """Every scanned record's headers (list of `HEADER`), in the scan's row order."""
    mv = memoryview(data)
    main = np.frombuffer(mv, dtype=np.uint8)
    sec_start = np.array([b.position + RECORDS_OFFSET for b in batches], np.int64)
    sec_end = np.array([b.position + b.size for b in batches], np.int64)
    use_side = np.array([b.codec is not Codec.NONE for b in batches], np.bool_)
    chunks, cursor = [], 0
    for i in map(int, np.flatnonzero(use_side)):
        raw = decompress(batches[i].codec, mv[int(sec_start[i]) : int(sec_end[i])])
        chunks.append(raw)
        sec_start[i], sec_end[i] = cursor, cursor + len(raw)
        cursor += len(raw)
    side = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    counts = np.array([b.records_count for b in batches], np.int64)
    sections, failed = _header_sections(main, side, use_side, sec_start, sec_end, counts, scan.records.num_rows)
    if failed >= 0:  # the scan accepted these bytes, so the kernel is wrong, not the segment
        raise CorruptBatchError(f"record {failed}: header section not found", obj=obj)
    batch_of = np.repeat(np.arange(len(batches)), counts)
    lengths = np.zeros(scan.records.num_rows + 1, np.int32)
    keys: list[bytes] = []
    values: list[bytes | None] = []
    for r in np.flatnonzero(sections[0]):
        buf = side if use_side[batch_of[r]] else main
        for key, value in _decode_headers(buf[sections[1, r] : sections[2, r]].tobytes(), int(sections[0, r])):
            keys.append(key)
            values.append(value)
        lengths[r + 1] = sections[0, r]
    entries = pa.StructArray.from_arrays([pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
                                         fields=list(HEADER))
    return pa.ListArray.from_arrays(pa.array(np.cumsum(lengths, dtype=np.int32)), entries)


def _decode_headers(section: bytes, count: int) -> list[tuple[bytes, bytes | None]]:
    """`count` headers, each a key and a value (length-prefixed, length -1 = null)."""
    pos = 0
    out = []
    for _ in range(count):
        key_len, pos = read_varint(section, pos, 5)
        key, pos = section[pos : pos + key_len], pos + key_len
        value_len, pos = read_varint(section, pos, 5)
        value = None if value_len < 0 else section[pos : pos + value_len]
        out.append((key, value))
        pos += max(value_len, 0)
    return out
