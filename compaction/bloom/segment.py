"""A segment's filter from its columnar scan, and where the filter lives in the store.

The filter of a segment kcompact writes is a part of its `.indexes` object (`compaction.storage.indexes`), under the
segment's own id: it describes exactly that upload and goes with it (gc deletes every object key of a replaced
segment's row). A clean segment it had to read without one (a tier or broker copy) lazily gets one as the object
`<start offset>-<segment id>.bloom` next to its `.log` (recorded in the row by the round's commit,
`ChangeSet.added_object_keys`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from compaction.bloom.filter import NO_HORIZON, FilterFacts, FilterFormatError, KeyFilter
from compaction.bloom.hashing import key_hashes, plain_key_hashes
from compaction.errors import MissingObjectError
from compaction.format.batch import CONTROL_FLAG_MASK, DELETE_HORIZON_FLAG_MASK, TRANSACTIONAL_FLAG_MASK
from compaction.format.scan import SegmentScan, batch_fields, scan_segment
from compaction.format.scan_kernels import BATCH_ATTRIBUTES, BATCH_BASE_TIMESTAMP
from compaction.storage.base import ObjectStore
from compaction.storage.indexes import CorruptIndexesObjectError, get_part_fetched
from compaction.storage.layout import Suffix, parse_segment_object_key


def segment_facts(scan: SegmentScan) -> FilterFacts:
    """The earliest delete horizon of the segment's batches, and whether any is transactional or control."""
    return _facts(scan.batch_fields)


def _facts(fields: np.ndarray) -> FilterFacts:
    """`segment_facts` of batches whose header fields are `fields` (`scan_kernels.BATCH_*` columns)."""
    attrs = fields[:, BATCH_ATTRIBUTES]
    with_horizon = (attrs & DELETE_HORIZON_FLAG_MASK) != 0
    horizon = int(fields[with_horizon, BATCH_BASE_TIMESTAMP].min()) if with_horizon.any() else NO_HORIZON
    transactional = bool(((attrs & (TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK)) != 0).any())
    return FilterFacts(horizon, transactional)


def segment_filter(scan: SegmentScan, fpp: float) -> KeyFilter:
    """The filter of a scanned segment: every key of its data records (tombstones and aborted ones too)."""
    return joined_filter([_part(scan)], fpp)


@dataclass(frozen=True)
class FilterPart:
    """The key hashes and facts of some consecutive batches of a segment: the filter of a segment written piece
    by piece is `joined_filter` of its pieces' parts, the same bytes as `segment_filter` of the whole."""

    hashes: np.ndarray  # XXH64 of every data record's key (uint64, duplicates kept)
    facts: FilterFacts


def filter_part(data: bytes | memoryview, *, obj: str = "<segment>") -> FilterPart:
    """The `FilterPart` of whole batches `data` (written by kcompact: CRCs not checked again): uncompressed, their
    keys hashed straight from the records (`hashing.plain_key_hashes`), else from the scan's key column."""
    fields = batch_fields(data, obj=obj)
    hashes = plain_key_hashes(data, fields)
    if hashes is not None:
        return FilterPart(hashes, _facts(fields))
    return _part(scan_segment(data, obj=obj, verify_crc=False))


def known_part(data: bytes | memoryview, hashes: np.ndarray, *, obj: str = "<segment>") -> FilterPart:
    """The `FilterPart` of whole batches `data` whose data records' keys hash to `hashes` (known to the writer):
    `filter_part`'s, with only the batch headers walked, no record decoded or decompressed."""
    return FilterPart(np.asarray(hashes, np.uint64), _facts(batch_fields(data, obj=obj)))


def _part(scan: SegmentScan) -> FilterPart:
    records = scan.records
    keys = records["key"].filter(pc.invert(records["control"])) if records.num_rows else records["key"]
    return FilterPart(key_hashes(keys), segment_facts(scan))


def joined_filter(parts: Sequence[FilterPart], fpp: float) -> KeyFilter:
    """The filter of a segment made of `parts` (in any order): every key, the earliest horizon, any transaction."""
    hashes = np.concatenate([p.hashes for p in parts]) if parts else np.empty(0, np.uint64)
    horizons = [p.facts.horizon_ms for p in parts if p.facts.horizon_ms != NO_HORIZON]
    facts = FilterFacts(min(horizons, default=NO_HORIZON), any(p.facts.transactional for p in parts))
    return KeyFilter.build(hashes, fpp, facts)


def filter_key(log_key: str) -> str:
    """The `.bloom` object key of the segment whose `.log` object is `log_key`."""
    return parse_segment_object_key(log_key).with_suffix(Suffix.BLOOM).key


def read_filter(store: ObjectStore, key: str) -> tuple[KeyFilter | None, int]:
    """The filter stored at `key` and the bytes fetched to read it (its `.indexes` object's header too); (None,
    bytes) if it is missing or unreadable.

    An unreadable filter is never an error for the run: the segment is then read like one without a filter.
    """
    try:
        data, fetched = get_part_fetched(store, key, Suffix.BLOOM)
    except (MissingObjectError, CorruptIndexesObjectError):
        return None, 0
    try:
        return KeyFilter.from_bytes(data, obj=store.object_uri(key)), fetched
    except FilterFormatError:
        return None, fetched


__all__ = ["FilterPart", "filter_key", "filter_part", "joined_filter", "known_part", "read_filter", "segment_facts",
           "segment_filter"]

