"""The `.txnindex` format (Kafka's `TransactionIndex`) and the fetch-time walk over it.

34-byte big-endian `AbortedTxn` entries, one per aborted non-empty transaction whose ABORT marker is in the
segment; `lastOffset` strictly increases (`TransactionIndex.append`). No header, no checksum.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compaction.format.indexes.entries import Buffer, entry_error, raise_ragged

ABORTED_TXN_CURRENT_VERSION = 0
_ABORTED_TXN = struct.Struct(">hqqqq")
ABORTED_TXN_SIZE = _ABORTED_TXN.size  # 34


@dataclass(frozen=True)
class AbortedTxn:
    """One `.txnindex` entry: `last_offset` is the ABORT marker's offset, `last_stable_offset` the LSO."""

    version: int
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def read_txn_index(data: Buffer, obj: str | None = None, base_offset: int | None = None) -> list[AbortedTxn]:
    """Parse and validate a `.txnindex` image.

    The version is read as Kafka reads it, from the first byte only; above 0 is rejected. Raises
    CorruptIndexError naming `obj` and the entry's byte position: a size that is not a multiple of 34, an
    unknown version, firstOffset above lastOffset, lastOffset not above the previous entry's, and (when
    `base_offset` is given, Kafka's `sanityCheck`) lastOffset below the segment's base offset.
    """
    name = obj or "<transaction index>"
    if len(data) % ABORTED_TXN_SIZE:
        raise_ragged(len(data), ABORTED_TXN_SIZE, name, "transaction index")
    entries: list[AbortedTxn] = []
    for i, (_v, pid, first, last, lso) in enumerate(_ABORTED_TXN.iter_unpack(data)):
        version = struct.unpack_from(">b", data, i * ABORTED_TXN_SIZE)[0]
        if version > ABORTED_TXN_CURRENT_VERSION:
            raise entry_error(name, i, ABORTED_TXN_SIZE,
                              f"has version {version}, expected {ABORTED_TXN_CURRENT_VERSION}")
        if first > last:
            raise entry_error(name, i, ABORTED_TXN_SIZE,
                              f"(producer {pid}) has firstOffset {first} above its lastOffset {last}")
        if entries and last <= entries[-1].last_offset:
            raise entry_error(name, i, ABORTED_TXN_SIZE,
                              f"has lastOffset {last}, not above the previous entry's {entries[-1].last_offset}")
        if base_offset is not None and last < base_offset:
            raise entry_error(name, i, ABORTED_TXN_SIZE,
                              f"has lastOffset {last}, below the segment's base offset {base_offset}")
        entries.append(AbortedTxn(version, pid, first, last, lso))
    return entries


def encode_txn_index(entries: Iterable[AbortedTxn]) -> bytes:
    """Serialise aborted transactions (34 bytes each). Raises ValueError if lastOffset does not increase."""
    out = bytearray()
    last: int | None = None
    for e in entries:
        if last is not None and e.last_offset <= last:
            raise ValueError(f"aborted txn lastOffset {e.last_offset} does not increase (previous {last})")
        last = e.last_offset
        out += _ABORTED_TXN.pack(
            e.version, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset
        )
    return bytes(out)


def collect_aborted_txns(
    per_segment_entries: Iterable[Sequence[AbortedTxn]], fetch_offset: int, upper_bound: int
) -> list[AbortedTxn]:
    """Kafka's `LocalLog.collectAbortedTransactions` over consecutive segments' txn indexes.

    Pass the segments in offset order starting at the one containing `fetch_offset` (Kafka's `floorSegment`);
    the cleaner uses fetch_offset = logStartOffset. An entry is kept if `lastOffset >= fetch_offset and
    firstOffset < upper_bound`; the walk stops after the first entry with `lastStableOffset >= upper_bound`.
    Duplicates (same producerId and firstOffset) are returned once, first occurrence kept.
    """
    found: list[AbortedTxn] = []
    seen: set[tuple[int, int]] = set()
    for entries in per_segment_entries:
        for txn in entries:
            key = (txn.producer_id, txn.first_offset)
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound and key not in seen:
                seen.add(key)
                found.append(txn)
            if txn.last_stable_offset >= upper_bound:
                return found
    return found
