"""KIP-280 ranks: which record of a key wins under each strategy (the policy the Spark aggregate applies)."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from compaction.config import CompactionStrategy
from compaction.format.batch import Record, TimestampType, build_batch, encode_batch
from compaction.format.scan import scan_segment
from compaction.strategies.keyfold import KeyFold
from compaction.strategies.winner import header_versions, ranks
from tests.factories import record


def long(v: int) -> bytes:
    return struct.pack(">q", v)


def winner(records: list[Record], strategy: CompactionStrategy, log_append: bool = False) -> int:
    """The offset that wins key b"k" among `records` (all share it), the way Spark's struct max decides."""
    ts_type = TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME
    table = scan_segment(encode_batch(build_batch(records, timestamp_type=ts_type, max_timestamp=None)),
                         header_key="version").records
    r = ranks(table, strategy)
    offsets = table["offset"].to_numpy()
    best = max(zip(r.has_version.tolist(), r.version.tolist(), offsets.tolist(), strict=True))
    return int(best[2])


def rec(offset: int, ts: int, *headers: tuple[str, bytes | None], value: bytes | None = b"v") -> Record:
    return record(offset, b"k", value, ts=ts, headers=headers)


def test_offset_strategy_is_the_highest_offset() -> None:
    assert winner([rec(0, 50), rec(1, 10), rec(2, 5)], CompactionStrategy.OFFSET) == 2


def test_timestamp_strategy_handles_out_of_order_producer_timestamps() -> None:
    assert winner([rec(0, 50), rec(1, 10), rec(2, 5)], CompactionStrategy.TIMESTAMP) == 0
    assert winner([rec(0, 50), rec(1, 50), rec(2, 5)], CompactionStrategy.TIMESTAMP) == 1, "ties → higher offset"


def test_timestamp_strategy_with_log_append_time_falls_back_to_offset() -> None:
    assert winner([rec(0, 50), rec(1, 10)], CompactionStrategy.TIMESTAMP, log_append=True) == 1


def test_header_strategy_rules() -> None:
    h = CompactionStrategy.HEADER
    assert winner([rec(0, 1, ("version", long(9))), rec(1, 1, ("version", long(3)))], h) == 0
    assert winner([rec(0, 1, ("version", long(3))), rec(1, 1, ("version", long(3)))], h) == 1, "equal → higher offset"
    assert winner([rec(0, 1, ("version", long(-5))), rec(1, 1)], h) == 0, "present beats missing"
    assert winner([rec(0, 1), rec(1, 1)], h) == 1, "both missing → higher offset"
    assert winner([rec(0, 1, ("version", long(1))), rec(1, 1, ("version", b"\x00\x07"))], h) == 0, "short = missing"
    assert winner([rec(0, 1, ("version", long(1))), rec(1, 1, ("version", None))], h) == 0, "null = missing"
    dup = rec(1, 1, ("version", long(100)), ("version", long(2)))
    assert winner([rec(0, 1, ("version", long(5))), dup], h) == 0, "the LAST occurrence counts"
    assert winner([rec(0, 1, ("Version", long(50))), rec(1, 1, ("version", long(1)))], h) == 1, "exact name"
    assert winner([rec(0, 1, ("version", long(9))), rec(1, 1, ("version", long(10)), value=None)], h) == 1, (
        "tombstones compete like any record")


def test_invalid_versions_are_counted() -> None:
    batch = build_batch([rec(0, 1, ("version", b"xx")), rec(1, 1), rec(2, 1, ("version", long(1)))])
    table = scan_segment(encode_batch(batch), header_key="version").records
    assert ranks(table, CompactionStrategy.HEADER).invalid_versions == 2


def test_header_versions_on_sliced_arrays() -> None:
    arr = pa.array([long(1), None, b"abc", long(-2)], pa.large_binary()).slice(1)
    has, version = header_versions(arr)
    assert has.tolist() == [0, 0, 1] and version[2] == -2 and version.dtype == np.int64


SEGMENT_ROWS = st.lists(st.tuples(st.binary(min_size=0, max_size=2), st.integers(0, 1), st.integers(-2, 2)),
                        min_size=0, max_size=12)


@given(st.lists(st.tuples(SEGMENT_ROWS, st.booleans()), min_size=1, max_size=5),
       st.sampled_from(list(CompactionStrategy)), st.integers(1, 64))
def test_folding_segments_equals_the_best_over_their_union(segments: list, strategy: CompactionStrategy,
                                                           capacity: int) -> None:
    """What a scan task hands Spark for several segments of a partition (a `KeyFold` of their candidates) is the
    winner rule over every candidate of those segments, and a key is dirty when any segment holding it is; from
    any starting capacity (the table grows and rehashes as keys come)."""
    fold, union = KeyFold(capacity), []
    offset = 0
    for rows, dirty in segments:
        keys = pa.array([k for k, _h, _v in rows], pa.large_binary())
        hv = np.array([0 if strategy is CompactionStrategy.OFFSET else h for _k, h, _v in rows], np.int8)
        v = np.array([0 if strategy is CompactionStrategy.OFFSET else x for _k, _h, x in rows], np.int64)
        offsets = np.arange(offset, offset + len(rows), dtype=np.int64)
        offset += len(rows)
        fold.add(keys, hv, v, offsets, dirty)
        union.extend((k, int(hv[i]), int(v[i]), int(offsets[i]), dirty) for i, k in enumerate(keys.to_pylist()))
    keys, has_version, version, offsets, any_dirty = fold.result()
    got = {(k, int(h), int(v), int(o), bool(d)) for k, h, v, o, d in zip(
        keys.to_pylist(), has_version, version, offsets, any_dirty, strict=True)}
    want = set()
    for key in {r[0] for r in union}:
        mine = [r for r in union if r[0] == key]
        best = max(mine, key=lambda r: (r[1], r[2], r[3]))
        want.add((*best[:4], any(r[4] for r in mine)))
    assert got == want
    assert len(keys) == len(got) == fold.keys  # one row per key
