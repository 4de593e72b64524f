"""Offset, time and txn indexes: round trips, lookups, `LogSegment.recover`'s rebuild rule, verification, corruption."""

from __future__ import annotations

import struct
from collections.abc import Callable
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction.errors import CorruptIndexError, CorruptInputError
from compaction.format.batch import Record, build_batch, encode_batch
from compaction.format.control import ControlType
from compaction.format.indexes import (
    AbortedTxn,
    OffsetIndexEntry,
    SegmentIndexes,
    TimeIndexEntry,
    build_indexes,
    build_indexes_of,
    collect_aborted_txns,
    encode_offset_index,
    encode_time_index,
    encode_txn_index,
    offset_index_lookup,
    read_offset_index,
    read_time_index,
    read_txn_index,
    time_index_lookup,
    verify_indexes,
)
from compaction.format.segment import iter_batch_headers
from tests import factories

BASE = 10
INDEX = "topic-0/00000000000000000010.index"
TIME_INDEX = "topic-0/00000000000000000010.timeindex"
TXN_INDEX = "topic-0/00000000000000000010.txnindex"


def data_batch(base: int, ts: int, *, pid: int = -1, txn: bool = False, n: int = 2) -> bytes:
    """`n` records at offsets base.. with the same timestamp and size, so every such batch has one size."""
    records = [Record(base + i, ts, b"key", b"v" * 100) for i in range(n)]
    return encode_batch(
        build_batch(records, producer_id=pid, producer_epoch=0 if pid >= 0 else -1, transactional=txn)
    )


def marker(kind: ControlType, offset: int, pid: int) -> bytes:
    return encode_batch(factories.marker(kind, offset, pid, ts=1_000, coordinator_epoch=5))


def six_batch_segment(timestamps: list[int]) -> tuple[bytes, int]:
    """Batches with offsets [10,11], [12,13], ... ; returns the segment and the (common) batch size."""
    batches = [data_batch(BASE + 2 * i, ts) for i, ts in enumerate(timestamps)]
    assert len({len(b) for b in batches}) == 1
    return b"".join(batches), len(batches[0])


# --- formats: round trips --------------------------------------------------------------------------


@st.composite
def offset_entries(draw: st.DrawFn) -> list[OffsetIndexEntry]:
    gaps = draw(st.lists(st.integers(1, 1000), max_size=30))
    steps = draw(st.lists(st.integers(0, 10_000), min_size=len(gaps), max_size=len(gaps)))
    rel, pos, out = 0, 0, []
    for gap, step in zip(gaps, steps, strict=True):
        rel, pos = rel + gap, pos + step
        out.append(OffsetIndexEntry(rel, pos))
    return out


@st.composite
def time_entries(draw: st.DrawFn) -> list[TimeIndexEntry]:
    gaps = draw(st.lists(st.integers(1, 10**6), max_size=30))
    steps = draw(st.lists(st.integers(0, 1000), min_size=len(gaps), max_size=len(gaps)))
    ts, rel, out = draw(st.integers(-1, 2**42)), 0, []
    for gap, step in zip(gaps, steps, strict=True):
        ts, rel = ts + gap, rel + step
        out.append(TimeIndexEntry(ts, rel))
    return out


@st.composite
def aborted_txns(draw: st.DrawFn) -> list[AbortedTxn]:
    n = draw(st.integers(0, 20))
    lasts = sorted(draw(st.sets(st.integers(0, 2**62), min_size=n, max_size=n)))
    return [
        AbortedTxn(
            0,
            draw(st.integers(-1, 2**63 - 1)),
            last - draw(st.integers(0, min(last, 10**6))),
            last,
            draw(st.integers(last + 1, 2**63 - 1)),
        )
        for last in lasts
    ]


@given(offset_entries(), st.integers(0, 1000))
def test_offset_index_round_trip_with_preallocated_tail(
    entries: list[OffsetIndexEntry], prealloc: int
) -> None:
    data = encode_offset_index(entries)
    assert len(data) == 8 * len(entries)
    assert read_offset_index(data, BASE, INDEX) == entries
    assert read_offset_index(data + bytes(8 * prealloc), BASE, INDEX) == entries


@given(time_entries(), st.integers(0, 1000))
def test_time_index_round_trip_with_preallocated_tail(entries: list[TimeIndexEntry], prealloc: int) -> None:
    data = encode_time_index(entries)
    assert len(data) == 12 * len(entries)
    assert read_time_index(data, BASE, TIME_INDEX) == entries
    # An empty preallocated file is indistinguishable from one real (ts 0, base offset) entry: that is kept.
    expected = entries or [TimeIndexEntry(0, 0)] * min(prealloc, 1)
    assert read_time_index(data + bytes(12 * prealloc), BASE, TIME_INDEX) == expected


@given(aborted_txns())
def test_txn_index_round_trip(entries: list[AbortedTxn]) -> None:
    data = encode_txn_index(entries)
    assert len(data) == 34 * len(entries)
    assert read_txn_index(data, TXN_INDEX) == entries


def test_offset_index_layout_is_relative_offset_then_position() -> None:
    assert encode_offset_index([OffsetIndexEntry(3, 4242)]) == bytes.fromhex("00000003 00001092")
    assert encode_time_index([TimeIndexEntry(1_700_000_000_000, 3)]) == struct.pack(
        ">qi", 1_700_000_000_000, 3
    )
    txn = encode_txn_index([AbortedTxn(0, 7, 100, 120, 121)])
    assert txn == struct.pack(">hqqqq", 0, 7, 100, 120, 121)


# --- formats: corruption at a named byte position --------------------------------------------------


def test_offset_index_non_monotonic_entry_3_names_file_and_byte_24() -> None:
    entries = [OffsetIndexEntry(5, 100), OffsetIndexEntry(9, 200), OffsetIndexEntry(12, 300)]
    garbage = encode_offset_index(entries) + struct.pack(">ii", 11, 400)  # entry 3 goes backwards
    with pytest.raises(CorruptIndexError) as info:
        read_offset_index(garbage, BASE, INDEX)
    assert (info.value.obj, info.value.position) == (INDEX, 24)
    assert INDEX in str(info.value) and "byte 24" in str(info.value) and "21" in str(info.value)


def test_offset_index_position_going_backwards_is_corrupt() -> None:
    data = encode_offset_index([OffsetIndexEntry(5, 100)]) + struct.pack(">ii", 6, 99)
    with pytest.raises(CorruptIndexError) as info:
        read_offset_index(data, BASE, INDEX)
    assert info.value.position == 8


@pytest.mark.parametrize(
    ("reader", "entry_size"),
    [
        (lambda d: read_offset_index(d, BASE, INDEX), 8),
        (lambda d: read_time_index(d, BASE, INDEX), 12),
        (lambda d: read_txn_index(d, INDEX), 34),
    ],
)
def test_size_not_a_multiple_of_the_entry_size(reader: Callable[[bytes], object], entry_size: int) -> None:
    data = b"\x01" * (2 * entry_size + 3)
    with pytest.raises(CorruptIndexError) as info:
        reader(data)
    assert (info.value.obj, info.value.position) == (INDEX, 2 * entry_size)
    assert "3 trailing bytes" in str(info.value)


def test_time_index_timestamp_going_backwards_names_the_entry() -> None:
    entries = [TimeIndexEntry(100, 1), TimeIndexEntry(200, 2), TimeIndexEntry(150, 3)]
    with pytest.raises(CorruptIndexError) as info:
        read_time_index(encode_time_index(entries), BASE, TIME_INDEX)
    assert (info.value.obj, info.value.position) == (TIME_INDEX, 24)


def test_time_index_offset_going_backwards_names_the_entry() -> None:
    entries = [TimeIndexEntry(100, 5), TimeIndexEntry(200, 4)]
    with pytest.raises(CorruptIndexError) as info:
        read_time_index(encode_time_index(entries), BASE, TIME_INDEX)
    assert info.value.position == 12


def test_txn_index_last_offset_must_increase() -> None:
    data = struct.pack(">hqqqq", 0, 7, 1, 20, 21) + struct.pack(">hqqqq", 0, 8, 3, 20, 21)
    with pytest.raises(CorruptIndexError) as info:
        read_txn_index(data, TXN_INDEX)
    assert (info.value.obj, info.value.position) == (TXN_INDEX, 34)


def test_txn_index_version_is_read_from_the_first_byte_and_must_be_0() -> None:
    good = struct.pack(">hqqqq", 0, 7, 1, 20, 21)
    with pytest.raises(CorruptIndexError) as info:
        read_txn_index(good + struct.pack(">hqqqq", 256, 7, 30, 40, 41), TXN_INDEX)  # first byte 1
    assert info.value.position == 34 and "version 1" in str(info.value)
    # Kafka reads `buffer.get(0)`: an int16 of 1 has a zero first byte and passes as version 0.
    assert read_txn_index(struct.pack(">hqqqq", 1, 7, 1, 20, 21), TXN_INDEX)[0].version == 0


def test_txn_index_sanity_check_against_base_offset() -> None:
    with pytest.raises(CorruptIndexError, match="below the segment's base offset 100"):
        read_txn_index(struct.pack(">hqqqq", 0, 7, 1, 20, 21), TXN_INDEX, base_offset=100)


def test_encoders_refuse_what_readers_reject() -> None:
    with pytest.raises(ValueError):
        encode_txn_index([AbortedTxn(0, 1, 0, 5, 6), AbortedTxn(0, 2, 0, 5, 6)])


# --- lookups ---------------------------------------------------------------------------------------


def test_offset_index_lookup_is_greatest_entry_at_or_below_target() -> None:
    entries = [OffsetIndexEntry(5, 400), OffsetIndexEntry(9, 800), OffsetIndexEntry(20, 1600)]
    assert offset_index_lookup(entries, BASE, BASE + 4) == (BASE, 0)
    assert offset_index_lookup(entries, BASE, BASE + 5) == (BASE + 5, 400)
    assert offset_index_lookup(entries, BASE, BASE + 8) == (BASE + 5, 400)
    assert offset_index_lookup(entries, BASE, BASE + 9) == (BASE + 9, 800)
    assert offset_index_lookup(entries, BASE, 10**12) == (BASE + 20, 1600)
    assert offset_index_lookup([], BASE, 10**12) == (BASE, 0)


def test_time_index_lookup_is_greatest_entry_at_or_below_target() -> None:
    entries = [TimeIndexEntry(100, 3), TimeIndexEntry(300, 7)]
    assert time_index_lookup(entries, BASE, 99) == (-1, BASE)
    assert time_index_lookup(entries, BASE, 100) == (100, BASE + 3)
    assert time_index_lookup(entries, BASE, 299) == (100, BASE + 3)
    assert time_index_lookup(entries, BASE, 10**15) == (300, BASE + 7)
    assert time_index_lookup([], BASE, 10**15) == (-1, BASE)


# --- collectAbortedTxns ----------------------------------------------------------------------------


def test_collect_aborted_txns_filters_stops_and_dedupes() -> None:
    a = AbortedTxn(0, 1, 0, 5, 6)  # ends before the fetch offset
    b = AbortedTxn(0, 2, 8, 12, 13)
    c = AbortedTxn(0, 3, 9, 30, 31)
    d = AbortedTxn(0, 4, 40, 45, 46)  # starts at/after the upper bound
    e = AbortedTxn(0, 5, 41, 60, 100)  # LSO >= upper bound: stop here
    f = AbortedTxn(0, 6, 10, 70, 71)  # would match but is past the stop
    segments = [[a, b], [b, c], [d, e, f], [f]]
    assert collect_aborted_txns(segments, fetch_offset=10, upper_bound=40) == [b, c]
    assert collect_aborted_txns(segments, fetch_offset=0, upper_bound=10**6) == [a, b, c, d, e, f]


def test_collect_aborted_txns_dedupes_on_producer_and_first_offset_only() -> None:
    first = AbortedTxn(0, 2, 8, 12, 13)
    same_txn_other_view = AbortedTxn(0, 2, 8, 14, 15)
    other_producer = AbortedTxn(0, 3, 8, 16, 17)
    got = collect_aborted_txns([[first], [same_txn_other_view, other_producer]], 0, 100)
    assert got == [first, other_producer]


# --- rebuild: LogSegment.recover's rule by hand ------------------------------------------------------


def test_rebuild_strict_interval_one_batch_per_append() -> None:
    log, size = six_batch_segment([100, 300, 200, 300, 250, 500])
    built = build_indexes(log, BASE, index_interval_bytes=size, obj="seg.log")
    # b0: first append, counter 0: no entry; b1: counter S, S > S is false; b2: 2S > S -> (b2 last, 2S) and
    # time maybeAppend(300 @ b1's last offset 13); b3: counter S: no; b4: (b4 last, 4S), max still 300: no
    # time entry; b5: no. On roll the max timestamp 500 @ offset 21 is appended.
    assert read_offset_index(built.offset_index, BASE) == [
        OffsetIndexEntry(5, 2 * size),
        OffsetIndexEntry(9, 4 * size),
    ]
    assert read_time_index(built.time_index, BASE) == [TimeIndexEntry(300, 3), TimeIndexEntry(500, 11)]
    assert built.txn_index is None
    assert verify_indexes(log, BASE, built.offset_index, built.time_index, "seg.log")


def test_rebuild_roll_append_is_skipped_when_max_already_indexed() -> None:
    log, size = six_batch_segment([100, 300, 200, 300, 400, 50])
    built = build_indexes(log, BASE, index_interval_bytes=size)
    assert read_time_index(built.time_index, BASE) == [TimeIndexEntry(300, 3), TimeIndexEntry(400, 9)]


def test_rebuild_first_append_never_creates_an_entry() -> None:
    log, size = six_batch_segment([1, 2, 3, 4, 5, 6])
    built = build_indexes(log, BASE, index_interval_bytes=0)
    assert read_offset_index(built.offset_index, BASE) == [
        OffsetIndexEntry(2 * i + 1, i * size) for i in range(1, 6)
    ]
    assert read_time_index(built.time_index, BASE) == [TimeIndexEntry(i + 1, 2 * i + 1) for i in range(1, 6)]
    assert build_indexes(log, BASE, index_interval_bytes=6 * size).offset_index == b""


def test_rebuild_ties_keep_the_first_batch_with_the_max_timestamp() -> None:
    log, size = six_batch_segment([100, 500, 500, 500, 500, 500])
    built = build_indexes(log, BASE, index_interval_bytes=10 * size)
    assert read_time_index(built.time_index, BASE) == [TimeIndexEntry(500, 3)]


def test_rebuild_without_timestamps_has_an_empty_time_index() -> None:
    log, _ = six_batch_segment([-1] * 6)
    assert build_indexes(log, BASE, index_interval_bytes=0).time_index == b""


def test_rebuild_chunks_map_the_chunk_largest_offset_to_its_start() -> None:
    log, size = six_batch_segment([100, 300, 200, 300, 250, 500])
    built = build_indexes(log, BASE, index_interval_bytes=size, chunks=[2, 2, 2])
    # chunk0: no entry (2S counted); chunk1: 2S > S -> (offset 17, 2S), time (300 @ 13); chunk2: 2S > S ->
    # (offset 21, 4S), time (500 @ 21); the roll append repeats (500 @ 21) and is skipped.
    assert read_offset_index(built.offset_index, BASE) == [
        OffsetIndexEntry(7, 2 * size),
        OffsetIndexEntry(11, 4 * size),
    ]
    assert read_time_index(built.time_index, BASE) == [TimeIndexEntry(300, 3), TimeIndexEntry(500, 11)]
    assert verify_indexes(log, BASE, built.offset_index, built.time_index)
    with pytest.raises(ValueError):
        build_indexes(log, BASE, chunks=[2, 2])


def test_rebuild_rejects_offsets_outside_the_segment() -> None:
    log, size = six_batch_segment([1, 2, 3, 4, 5, 6])
    with pytest.raises(CorruptInputError) as info:
        build_indexes(log, BASE + 2, obj="seg.log")  # the first batch ends at 11, below the base
    assert (info.value.obj, info.value.position) == ("seg.log", 0)
    overflow = data_batch(BASE, 1) + data_batch(BASE + 2**31, 2)  # relative offset past int32
    with pytest.raises(CorruptInputError) as info:
        build_indexes(overflow, BASE, obj="seg.log")
    assert info.value.position == size


@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(-1, 10**6)), min_size=1, max_size=25),
    st.integers(0, 3000),
)
def test_rebuild_matches_the_recover_formulation(batches: list[tuple[int, int]], interval: int) -> None:
    """`LogSegment.recover` states the rule by position: an entry at a batch start more than `interval` bytes
    after the previous entry's (or 0). Check the append formulation against it, and that it verifies."""
    encoded, offset = [], BASE
    for n, ts in batches:
        encoded.append(data_batch(offset, ts, n=n))
        offset += n
    log = b"".join(encoded)
    built = build_indexes(log, BASE, index_interval_bytes=interval)
    expected, last_entry = [], 0
    for h in iter_batch_headers(log):
        if h.position - last_entry > interval:
            expected.append(OffsetIndexEntry(h.last_offset - BASE, h.position))
            last_entry = h.position
    assert read_offset_index(built.offset_index, BASE) == expected
    times = read_time_index(built.time_index, BASE)
    max_ts = max(ts for _, ts in batches)
    assert (times[-1].timestamp if times else -1) == max(max_ts, -1)
    assert verify_indexes(log, BASE, built.offset_index, built.time_index)


@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(-1, 10**6), st.integers(0, 3)), min_size=0, max_size=30),
    st.integers(0, 3000),
    st.integers(-3, 3),
)
def test_rebuild_compiled_path_equals_the_reference_path(batches: list[tuple[int, int, int]], interval: int,
                                                         shift: int) -> None:
    """A log of one append per batch without transactions is indexed by the numba walk (`index_kernels`); the
    same log given as chunks of one batch takes the reference path: the same bytes, or the same error (offsets
    that go backwards, or fall outside a segment based `shift` offsets away)."""
    encoded, offset = [], BASE
    for n, ts, gap in batches:
        encoded.append(data_batch(offset, ts, n=n))
        offset += n + gap if gap < 3 else n - 4  # a gap of 3 goes back: offsets the rule may reject
    log = b"".join(encoded)

    def built(chunks: list[int] | None) -> object:
        try:
            got = build_indexes(log, BASE + shift, index_interval_bytes=interval, obj="seg.log", chunks=chunks)
        except CorruptInputError as exc:
            return type(exc), exc.obj, exc.position, exc.detail
        return got.offset_index, got.time_index, got.txn_index, dict(got.open_txns), got.unresolved_aborts

    assert built(None) == built([1] * len(batches))


@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(-1, 10**6), st.integers(0, 3)), min_size=0, max_size=30),
    st.integers(0, 3000),
    st.integers(-3, 3),
    st.lists(st.integers(0, 30), max_size=6),
    st.booleans(),
)
def test_indexes_of_pieces_equal_those_of_the_joined_log(batches: list[tuple[int, int, int]], interval: int,
                                                         shift: int, cuts: list[int], transactional: bool) -> None:
    """`build_indexes_of` a log cut into pieces at batch boundaries (empty pieces included) gives what
    `build_indexes` gives the whole log: the same bytes, or the same error at the same byte of the whole log; a
    transactional batch (the reference path, on the joined pieces) likewise."""
    encoded, offset = [], BASE
    for i, (n, ts, gap) in enumerate(batches):
        encoded.append(data_batch(offset, ts, n=n, pid=7 if transactional and i == 0 else -1,
                                  txn=transactional and i == 0))
        offset += n + gap if gap < 3 else n - 4  # a gap of 3 goes back: offsets the rule may reject
    bounds = sorted({0, len(encoded), *(min(c, len(encoded)) for c in cuts)})
    pieces = [b"".join(encoded[a:b]) for a, b in pairwise(bounds)] or [b""]
    if len(cuts) > 3:
        pieces.insert(len(pieces) // 2, b"")

    def built(build: Callable[[], SegmentIndexes]) -> object:
        try:
            got = build()
        except CorruptInputError as exc:
            return type(exc), exc.obj, exc.position, exc.detail
        return got.offset_index, got.time_index, got.txn_index, dict(got.open_txns), got.unresolved_aborts

    log = b"".join(encoded)
    assert built(lambda: build_indexes_of(pieces, BASE + shift, interval, obj="seg.log")) == built(
        lambda: build_indexes(log, BASE + shift, index_interval_bytes=interval, obj="seg.log"))


def test_rebuild_of_a_transactional_log_takes_the_reference_path() -> None:
    """The compiled path builds no transaction index: a log with a transactional or control batch is left to
    the reference path, whose index holds its aborts."""
    log = txn_segment()
    assert build_indexes(log, 10).txn_index == build_indexes(log, 10, chunks=[1] * 10).txn_index is not None


# --- rebuild: transaction index --------------------------------------------------------------------


def txn_segment() -> bytes:
    return b"".join(
        [
            data_batch(10, 100, pid=7, txn=True),  # 10-11: producer 7 opens at 10
            data_batch(12, 100, pid=8, txn=True),  # 12-13: producer 8 opens at 12
            data_batch(14, 100, pid=7, txn=True),  # 14-15
            marker(ControlType.ABORT, 16, 7),  # abort 7: LSO = 12 (8 still open)
            marker(ControlType.ABORT, 17, 9),  # producer 9 had no data: empty, not indexed
            marker(ControlType.COMMIT, 18, 8),  # commit 8: not indexed
            data_batch(19, 100, pid=8, txn=True),  # 19-20: producer 8 opens again
            data_batch(21, 100, pid=7, txn=True),  # 21-22: producer 7 opens again
            marker(ControlType.ABORT, 23, 8),  # abort 8: LSO = 21 (7 open)
            data_batch(24, 100),  # non-transactional
        ]
    )


def test_rebuild_txn_index_one_entry_per_non_empty_abort() -> None:
    built = build_indexes(txn_segment(), BASE, txn_first_offsets={})
    assert built.txn_index is not None
    assert read_txn_index(built.txn_index, TXN_INDEX, base_offset=BASE) == [
        AbortedTxn(0, 7, 10, 16, 12),
        AbortedTxn(0, 8, 19, 23, 21),
    ]
    assert built.open_txns == {7: 21}
    assert built.unresolved_aborts == ()


def test_rebuild_txn_index_across_segments() -> None:
    first = build_indexes(txn_segment(), BASE, txn_first_offsets={})
    second_log = data_batch(26, 100, pid=9, txn=True) + marker(ControlType.ABORT, 28, 7)
    second = build_indexes(second_log, 26, txn_first_offsets=first.open_txns)
    assert second.txn_index is not None
    # 7's transaction started in the previous segment (21); 9's, still open, bounds the LSO.
    assert read_txn_index(second.txn_index) == [AbortedTxn(0, 7, 21, 28, 26)]
    assert second.open_txns == {9: 26}
    without_help = build_indexes(second_log, 26)
    assert without_help.txn_index is None and without_help.unresolved_aborts == (28,)


# --- verify ----------------------------------------------------------------------------------------


def test_verify_rejects_an_entry_that_is_not_at_a_batch_start() -> None:
    log, size = six_batch_segment([1, 2, 3, 4, 5, 6])
    built = build_indexes(log, BASE, index_interval_bytes=size)
    bad = built.offset_index[:8] + struct.pack(">ii", 9, 4 * size + 1)
    with pytest.raises(CorruptIndexError) as info:
        verify_indexes(log, BASE, bad, built.time_index, "t-0/00000000000000000010.log")
    assert (info.value.obj, info.value.position) == ("t-0/00000000000000000010.index", 8)


def test_verify_rejects_an_offset_outside_the_indexed_chunk() -> None:
    log, size = six_batch_segment([1, 2, 3, 4, 5, 6])
    too_far = encode_offset_index([OffsetIndexEntry(3, 2 * size)])  # offset 13 is in the batch before 2S
    with pytest.raises(CorruptIndexError, match="entry 0 maps offset 13"):
        verify_indexes(log, BASE, too_far, b"", index_obj=INDEX)


def test_verify_rejects_a_wrong_timestamp_and_a_missing_roll_entry() -> None:
    log, size = six_batch_segment([100, 300, 200, 300, 250, 500])
    built = build_indexes(log, BASE, index_interval_bytes=size)
    wrong = encode_time_index([TimeIndexEntry(200, 3), TimeIndexEntry(500, 11)])
    with pytest.raises(CorruptIndexError) as info:
        verify_indexes(log, BASE, built.offset_index, wrong, time_index_obj=TIME_INDEX)
    assert (info.value.obj, info.value.position) == (TIME_INDEX, 0)
    missing_roll = encode_time_index([TimeIndexEntry(300, 3)])
    with pytest.raises(CorruptIndexError, match="max timestamp 500"):
        verify_indexes(log, BASE, built.offset_index, missing_roll)


def test_zero_entries_offset_index_drops_all_time_index_keeps_the_first() -> None:
    assert read_offset_index(bytes(80), BASE) == []
    assert read_time_index(bytes(120), BASE) == [TimeIndexEntry(0, 0)]  # (ts 0, base offset) can be real


def test_verify_accepts_a_preallocated_kafka_style_index() -> None:
    log, size = six_batch_segment([1, 2, 3, 4, 5, 6])
    built = build_indexes(log, BASE, index_interval_bytes=size)
    assert verify_indexes(log, BASE, built.offset_index + bytes(80), built.time_index + bytes(120))
