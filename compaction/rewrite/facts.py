"""Per-batch record counts of a segment, without a Python loop per record.

Deciding what to do with a batch needs only a few numbers about its records: how many are keyless, how many
are keyed tombstones, how many win their key and how many of the winners are tombstones. A batch whose
records all win and need no horizon is then copied verbatim, one that loses every record is dropped (or
emptied), and only the others are re-encoded (`records.py`), all without a Python loop per record.

`scan_facts` gets the counts from the numba columnar scan (`format.scan.scan_ranges`, CRCs verified) over
windows of at most `WINDOW_BYTES` of whole batches, so memory stays bounded on a 1 GiB segment; the winner
test is one walk over the window's offsets and the sorted winners. `known_facts` gets them from what a scan of the
very same bytes already decoded (`RecordBits`, kept by the task that scanned them for its own rewrite), scanning
nothing again: for compressed batches that saves decompressing every records section once more. `reference_facts`
computes the same counts with the readable reference decoder; the three are tested against each other.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from compaction.bloom.hashing import row_key_hashes
from compaction.errors import CorruptInputError
from compaction.format.batch import CODEC_MASK, decode_batch
from compaction.format.scan import scan_ranges
from compaction.format.scan_kernels import (
    BATCH_ATTRIBUTES,
    BATCH_RECORD_COUNT,
    RECORD_KEY_LEN,
    RECORD_OFFSET,
    RECORD_VALUE_LEN,
)
from compaction.format.segment import BatchHeader
from compaction.kernels import kernel

Buffer = bytes | bytearray | memoryview

WINDOW_BYTES = 64 * 1024 * 1024
"""Bytes of whole batches scanned at once (a larger batch is scanned alone)."""


@dataclass(frozen=True)
class KeptKeys:
    """Which records of a segment a rewrite keeps, and their keys' hashes: per record (in the segment's order) the
    XXH64 of its key, whether it is a keyed winner and whether its value is null; where each batch's records
    start (`bounds`, one more than the batches)."""

    hashes: np.ndarray
    wins: np.ndarray
    null_value: np.ndarray
    bounds: np.ndarray

    def of_batch(self, i: int, retain_deletes: bool) -> np.ndarray:
        """The key hashes of the records batch `i` keeps: its winners, their tombstones only if `retain_deletes`
        (what `records.rebuild_data_batch` writes, and all of a batch copied whole)."""
        lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
        keep = self.wins[lo:hi] if retain_deletes else self.wins[lo:hi] & ~self.null_value[lo:hi]
        return self.hashes[lo:hi][keep]


@dataclass(frozen=True)
class RecordFacts:
    """Counts per batch of one segment, aligned with its headers (control batches included)."""

    keyless: list[int]
    tombstones: list[int]
    """Keyed records with a null value."""
    winning: list[int]
    """Keyed records whose offset is a winner."""
    winning_tombstones: list[int]
    kept: KeptKeys | None = field(default=None, compare=False)
    """The hashes of the keys the rewrite keeps, when the facts come from a scan that hashed them (`known_facts`)."""


@dataclass(frozen=True)
class RecordBits:
    """What the counts need of each record of a segment, as a scan of it decoded them (`format.scan.scan_segment`):
    its offset, whether it has a key, whether its value is null, its key's XXH64 (0 if keyless: the output's
    filter is built from the hashes of the records kept, `KeptKeys`, without decoding the output again); and each
    batch's record count (control batches included), in the segment's order. ~18 bytes a record."""

    offsets: np.ndarray
    keyed: np.ndarray
    null_value: np.ndarray
    counts: np.ndarray
    hashes: np.ndarray

    @classmethod
    def of_scan(cls, records: pa.Table, fields: np.ndarray) -> RecordBits | None:
        """From a `SegmentScan`'s `records` and `fields`; None for a segment without a compressed batch, which
        decodes again for less than its bits cost to keep (a P2K scan task paid more for them than its rewrite
        saved, BENCHMARKS.md P10)."""
        if not (fields[:, BATCH_ATTRIBUTES] & CODEC_MASK).any():
            return None
        return cls.decoded(records, fields)

    @classmethod
    def decoded(cls, records: pa.Table, fields: np.ndarray) -> RecordBits:
        """`of_scan` for any segment, compressed or not."""
        # writable copies: numba compiles a kernel once per argument type (`scan_facts` passes writable arrays)
        return cls(np.array(records.column("offset").to_numpy(), np.int64),
                   records.column("key").is_valid().to_numpy(zero_copy_only=False),
                   records.column("value_is_null").to_numpy(zero_copy_only=False),
                   np.array(fields[:, BATCH_RECORD_COUNT], np.int64),
                   row_key_hashes(records.column("key")))


def known_facts(bits: RecordBits, winners: np.ndarray) -> RecordFacts:
    """The counts of every batch from `bits` (a scan of the same bytes): what `scan_facts` returns for them, and
    the hashes of the keys kept (`RecordFacts.kept`)."""
    wins = bits.keyed & _members(bits.offsets, winners)
    bounds = np.concatenate(([0], np.cumsum(bits.counts)))
    keyless, tombstones, winning, winning_tombstones = (c.tolist() for c in _counts(bits.keyed, bits.null_value, wins,
                                                                                     bounds))
    return RecordFacts(keyless, tombstones, winning, winning_tombstones,
                       KeptKeys(bits.hashes, wins, bits.null_value, bounds))


def _counts(keyed: np.ndarray, null_value: np.ndarray, wins: np.ndarray, bounds: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per batch (records [bounds[i], bounds[i+1]) each): keyless records, keyed tombstones, winners (`wins`: keyed
    records whose offset wins), winning tombstones."""
    return (_per_batch(~keyed, bounds), _per_batch(keyed & null_value, bounds), _per_batch(wins, bounds),
            _per_batch(wins & null_value, bounds))


def scan_facts(
    data: Buffer, headers: Sequence[BatchHeader], winners: np.ndarray, *, obj: str, verify_crc: bool = True
) -> RecordFacts:
    """The counts of every batch of `headers` (all of `data`'s batches, in order) via the columnar scan.

    Raises a CorruptInputError subclass naming `obj` and the absolute byte position (bad CRC unless `verify_crc`
    is false, bad records).
    """
    mv = memoryview(data)
    columns: list[list[np.ndarray]] = [[], [], [], []]
    for first, end in _windows(headers, WINDOW_BYTES):
        start = headers[first].position
        stop = headers[end - 1].position + headers[end - 1].size
        try:
            ranges, fields = scan_ranges(mv[start:stop], obj=obj, verify_crc=verify_crc)
        except CorruptInputError as exc:
            raise exc.located(obj, start) from None
        window_winners = _slice(winners, headers[first].base_offset, headers[end - 1].last_offset)
        keyed = ranges[RECORD_KEY_LEN] >= 0
        counted = _counts(keyed, ranges[RECORD_VALUE_LEN] < 0, keyed & _members(ranges[RECORD_OFFSET], window_winners),
                          np.concatenate(([0], np.cumsum(fields[:, BATCH_RECORD_COUNT]))))
        for out, per_batch in zip(columns, counted, strict=True):
            out.append(per_batch)
    keyless, tombstones, winning, winning_tombstones = (
        np.concatenate(c).tolist() if c else [] for c in columns
    )
    return RecordFacts(keyless, tombstones, winning, winning_tombstones)


def reference_facts(
    data: Buffer, headers: Sequence[BatchHeader], winners: np.ndarray, *, obj: str
) -> RecordFacts:
    """The same counts as `scan_facts`, decoding every record in Python (the reference path)."""
    winning_set = set(np.asarray(winners).tolist())
    facts = RecordFacts([], [], [], [])
    for h in headers:
        try:
            batch = decode_batch(data, h.position)
        except CorruptInputError as exc:
            raise exc.located(obj) if exc.obj is None else exc from None
        keyed = [r for r in batch.records if r.key is not None]
        wins = [r for r in keyed if r.offset in winning_set]
        facts.keyless.append(len(batch.records) - len(keyed))
        facts.tombstones.append(sum(r.value is None for r in keyed))
        facts.winning.append(len(wins))
        facts.winning_tombstones.append(sum(r.value is None for r in wins))
    return facts


def _windows(headers: Sequence[BatchHeader], limit: int) -> Iterator[tuple[int, int]]:
    """[first, end) index ranges of consecutive batches spanning at most `limit` bytes (at least one)."""
    first = 0
    size = 0
    for i, h in enumerate(headers):
        if i > first and size + h.size > limit:
            yield first, i
            first, size = i, 0
        size += h.size
    if first < len(headers):
        yield first, len(headers)


def _slice(winners: np.ndarray, low: int, high: int) -> np.ndarray:
    """The winners within [low, high]."""
    return winners[np.searchsorted(winners, low, "left") : np.searchsorted(winners, high, "right")]


def _members(offsets: np.ndarray, sorted_values: np.ndarray) -> np.ndarray:
    """Boolean mask: which `offsets` appear in `sorted_values`."""
    found = np.empty(offsets.shape, dtype=np.bool_)
    _walk_members(np.ascontiguousarray(offsets, np.int64), np.ascontiguousarray(sorted_values, np.int64), found)
    return found


@kernel(nogil=True)
def _walk_members(offsets: np.ndarray, values: np.ndarray, found: np.ndarray) -> None:
    """`found[i]`: whether `offsets[i]` is one of the sorted `values`. A segment's offsets increase, so each
    lookup goes on from where the previous one ended (one pass over both, not a binary search per record, which
    cost a P2K rewrite ~8% of its time); an offset below the previous one is looked up afresh."""
    n = values.shape[0]
    j = 0
    previous = np.iinfo(np.int64).min
    for i in range(offsets.shape[0]):
        offset = offsets[i]
        if offset < previous:
            j = np.searchsorted(values, offset)
        while j < n and values[j] < offset:
            j += 1
        found[i] = j < n and values[j] == offset
        previous = offset


def _per_batch(flags: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Sum of `flags` over each batch's rows [bounds[i], bounds[i+1])."""
    cumulative = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
    return np.asarray(cumulative[bounds[1:]] - cumulative[bounds[:-1]])
