"""Rewrite of a group of segments: Kafka's LogCleanerTest scenarios, batch rules, txn markers, indexes.

Every output goes through `clean`, which also checks what must hold for any output: kafka-python decodes
it with valid CRCs and sees our records, offsets strictly increase, every kept batch keeps the base and last
offset of an input batch, and the indexes are `build_indexes` of the output log.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from compaction.bloom.segment import FilterPart, filter_part, joined_filter, known_part, segment_filter
from compaction.errors import CorruptInputError, CrcMismatchError, InvalidMagicError
from compaction.format.batch import (
    CRC_OFFSET,
    MAGIC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    Header,
    Record,
    RecordBatch,
    TimestampType,
    build_batch,
    decode_batch,
    empty_batch_header,
    encode_batch,
)
from compaction.format.codecs import Codec
from compaction.format.control import ControlType, control_key
from compaction.format.indexes import AbortedTxn, build_indexes, read_txn_index, verify_indexes
from compaction.format.scan import scan_segment
from compaction.format.segment import iter_batch_headers, iter_batches
from compaction.rewrite import ActiveProducer, RewriteOutput, SegmentInput, TransactionState, rewrite_group
from compaction.rewrite import facts as facts_module
from compaction.rewrite import group as group_module
from compaction.rewrite.facts import RecordBits, RecordFacts, known_facts, reference_facts, scan_facts
from compaction.rewrite.rebuild import rebuild_batch
from compaction.rewrite.records import rebuild_data_batch
from compaction.strategies.retention import (
    BatchDecision,
    BatchRetention,
    check_batch_retention,
    rebuilt_delete_horizon,
    retains_deletes,
    should_retain_record,
)
from tests import factories
from tests.unit.random_batches import data_batches

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from kafka.record.memory_records import MemoryRecords

NOW = 1_700_000_000_000
RETENTION = 86_400_000
PID = 7


# --- building logs ---------------------------------------------------------------------------------


rec = partial(factories.record, ts=1_000)


def batch(records: Sequence[Record], **kw: Any) -> bytes:
    return encode_batch(build_batch(records, **kw))


def txn_batch(offset: int, keys: Sequence[int], pid: int = PID, *, txn: bool = True, seq: int = 0) -> bytes:
    return batch(
        [rec(offset + i, k) for i, k in enumerate(keys)],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        transactional=txn,
    )


def marker(kind: ControlType, offset: int, pid: int = PID) -> bytes:
    return encode_batch(factories.marker(kind, offset, pid, ts=2_000, coordinator_epoch=3))


def single_record_segments(keys: Sequence[int | None], per_segment: int) -> list[SegmentInput]:
    """One single-record batch `record(k, k)` per offset, `per_segment` batches per segment."""
    out = []
    for start in range(0, len(keys), per_segment):
        data = b"".join(batch([rec(o, keys[o], keys[o])]) for o in range(start, min(start + per_segment, len(keys))))
        out.append(SegmentInput(data, start, f"topic-0/{start:020d}.log"))
    return out


def as_segment(log: bytes, base: int, name: str = "seg") -> SegmentInput:
    return SegmentInput(log, base, f"{name}-{base}.log")


def data_records(inputs: Sequence[SegmentInput]) -> list[tuple[int, bytes | None, bool, int, int]]:
    """(offset, key, has value, producer id, is transactional) of every data record."""
    return [
        (r.offset, r.key, r.value is not None, b.producer_id, int(b.is_transactional))
        for s in inputs
        for _p, b in iter_batches(s.data)
        if not b.is_control
        for r in b.records
    ]


def latest_winners(inputs: Sequence[SegmentInput], aborted: Sequence[AbortedTxn] = ()) -> np.ndarray:
    """The offset strategy over `inputs`: the highest offset of each key, aborted and keyless records excluded."""
    best: dict[bytes, int] = {}
    for offset, key, _v, pid, txn in data_records(inputs):
        in_aborted = txn and any(
            t.producer_id == pid and t.first_offset <= offset <= t.last_offset for t in aborted
        )
        if key is not None and not in_aborted:
            best[key] = max(best.get(key, -1), offset)
    return np.array(sorted(best.values()), dtype=np.int64)


# --- checking outputs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cleaned:
    out: RewriteOutput
    state: TransactionState
    batches: list[RecordBatch]

    @property
    def offsets(self) -> list[int]:
        """Kafka's `offsetsInLog`: keyed, non-null-value records, control records included."""
        return [r.offset for b in self.batches for r in b.records if r.key is not None and r.value is not None]

    @property
    def keys(self) -> list[int]:
        """Kafka's `keysInLog`: keys of non-null-value records of data batches."""
        return [
            int(r.key) for b in self.batches if not b.is_control for r in b.records
            if r.key is not None and r.value is not None
        ]

    @property
    def last_offsets(self) -> list[int]:
        return [b.last_offset for b in self.batches]

    @property
    def txn_index(self) -> list[AbortedTxn]:
        return read_txn_index(self.out.txn_index) if self.out.txn_index else []

    def segment(self, name: str = "cleaned") -> SegmentInput:
        return as_segment(self.out.log, self.out.base_offset, name)


def clean(
    inputs: Sequence[SegmentInput],
    winners: np.ndarray | None = None,
    *,
    now: int = NOW,
    upper: int | None = None,
    aborted: Sequence[AbortedTxn] = (),
    producers: dict[int, ActiveProducer] | None = None,
    state: TransactionState | None = None,
    interval: int = 100,
    retention: int = RETENTION,
) -> Cleaned:
    """Rewrite `inputs` as one group and check the invariants every output must satisfy; rewritten again with
    `on_written`, the same output, whose pieces make it up and give its filter (`upload.py` builds it so)."""
    if winners is None:
        winners = latest_winners(inputs, aborted)
    if upper is None:
        upper = max(h.next_offset for s in inputs for h in iter_batch_headers(s.data, obj=s.obj))
    pieces: list[bytes] = []
    parts: list[FilterPart] = []

    def written(data: bytes, hashes: np.ndarray | None) -> None:
        pieces.append(data)
        parts.append(filter_part(data) if hashes is None else known_part(data, hashes))

    out, next_state = rewrite_group(
        inputs,
        winners,
        upper_bound_offset=upper,
        now_ms=now,
        delete_retention_ms=retention,
        index_interval_bytes=interval,
        aborted=aborted,
        active_producers=producers,
        txn_state=state,
    )
    again, again_state = rewrite_group(
        inputs, winners, upper_bound_offset=upper, now_ms=now, delete_retention_ms=retention,
        index_interval_bytes=interval, aborted=aborted, active_producers=producers, txn_state=state,
        on_written=written,
    )
    assert (again, again_state) == (out, next_state)
    assert b"".join(pieces) == out.log and all(pieces) and len(pieces) <= len(inputs)
    whole = segment_filter(scan_segment(out.log, verify_crc=False), 0.01).to_bytes()
    assert joined_filter(parts, 0.01).to_bytes() == whole
    # as the fused job hands a held segment: verified, with the records its scan decoded; counted and filtered
    # from them (`KeptKeys`: the filter from the kept keys' hashes, no piece decoded), the same output and filter
    held = [replace(s, verified=True, records=RecordBits.decoded(scanned.records, scanned.batch_fields))
            for s in inputs for scanned in [scan_segment(s.data, verify_crc=False)]]
    pieces.clear()
    parts.clear()
    from_bits = rewrite_group(
        held, winners, upper_bound_offset=upper, now_ms=now, delete_retention_ms=retention,
        index_interval_bytes=interval, aborted=aborted, active_producers=producers, txn_state=state,
        on_written=written,
    )
    assert from_bits == (out, next_state) and b"".join(pieces) == out.log
    assert joined_filter(parts, 0.01).to_bytes() == whole
    batches = [b for _p, b in iter_batches(out.log)]
    check_output(out, batches, inputs, interval)
    return Cleaned(out, next_state, batches)


def check_output(out: RewriteOutput, batches: list[RecordBatch], inputs: Sequence[SegmentInput], interval: int) -> None:
    input_ranges = {(h.base_offset, h.last_offset) for s in inputs for h in iter_batch_headers(s.data)}
    previous = out.base_offset - 1
    for b in batches:
        assert (b.base_offset, b.last_offset) in input_ranges
        assert b.base_offset > previous
        offsets = [r.offset for r in b.records]
        assert offsets == sorted(set(offsets))
        assert all(b.base_offset <= o <= b.last_offset for o in offsets)
        previous = b.last_offset
    assert kafka_python_view(out.log) == [
        (b.base_offset, b.last_offset, [(r.offset, r.timestamp, r.key, r.value) for r in b.records]) for b in batches
    ]
    expected = build_indexes(out.log, out.base_offset, interval)
    assert (out.offset_index, out.time_index) == (expected.offset_index, expected.time_index)
    assert verify_indexes(out.log, out.base_offset, out.offset_index, out.time_index)
    assert out.stats.bytes_written == len(out.log)
    assert out.stats.bytes_read == sum(len(s.data) for s in inputs)
    assert out.stats.records_written == sum(len(b.records) for b in batches)
    assert out.stats.batches_read == (
        out.stats.batches_copied_verbatim + out.stats.batches_rebuilt + out.stats.batches_emptied
        + out.stats.batches_dropped
    )
    assert out.stats.max_timestamp == max((b.max_timestamp for b in batches), default=-1)
    assert out.stats.first_batch_max_timestamp == (batches[0].max_timestamp if batches else -1)


def kafka_python_view(log: bytes) -> list[tuple[int, int, list[tuple[int, int, bytes | None, bytes | None]]]]:
    records = MemoryRecords(log)
    view = []
    while records.has_next():
        b = records.next_batch()
        assert b.validate_crc()
        view.append((b.base_offset, b.last_offset, [(r.offset, r.timestamp, r.key, r.value) for r in b]))
    return view


# --- LogCleanerTest scenarios -----------------------------------------------------------------------


def test_scenario_1_basic_key_removal() -> None:
    segments = single_record_segments(list(range(20)), per_segment=5)
    cleaned_range = segments[:3]
    gone = {1, 3, 5, 7, 9}
    winners = np.array([o for o in range(20) if o not in gone], dtype=np.int64)
    c = clean(cleaned_range, winners, upper=segments[3].base_offset)
    assert c.keys == [k for k in range(15) if k not in gone]
    assert len(c.out.offset_index) == 8 * 4 and c.out.time_index  # 10 batches of ~70 bytes, interval 100
    assert c.out.stats.bytes_read == sum(len(s.data) for s in cleaned_range)
    assert (c.out.base_offset, c.out.next_offset) == (0, 15)


def test_scenario_21_superseded_and_winning_tombstones() -> None:
    n = 10
    keys = list(range(n))
    log = b"".join(batch([rec(k, k, k)]) for k in keys)
    log += b"".join(batch([rec(n + i, k, None)]) for i, k in enumerate(keys[::2]))  # tombstones for even keys
    log += b"".join(batch([rec(20 + i, 100 + i, i)]) for i in range(5))  # padding
    log += batch([rec(25, 0, b"back")])  # key 0 comes back: its tombstone is superseded
    c = clean([as_segment(log, 0)])
    assert {k for k in c.keys if k < n and k % 2 == 0} == {0}
    stats = c.out.stats
    assert stats.tombstones_removed == 1  # key 0's tombstone
    assert stats.tombstones_retained == 4  # keys 2,4,6,8: first pass keeps them, with a horizon
    tombstone_batches = [b for b in c.batches if any(r.value is None for r in b.records)]
    assert [b.delete_horizon_ms for b in tombstone_batches] == [NOW + RETENTION] * 4


def test_scenario_22_tombstone_retention_by_horizon_not_record_timestamp() -> None:
    old = NOW - RETENTION - 10_000
    first = clean([as_segment(batch([rec(0, 0, 0, ts=NOW + 10**9)]), 0)])
    assert first.last_offsets == [0]
    second = clean([first.segment(), as_segment(batch([rec(1, 0, None, ts=old)]), 1)])
    assert second.last_offsets == [1]
    (tombstone,) = second.batches
    horizon = tombstone.delete_horizon_ms
    assert horizon == NOW + RETENTION
    assert tombstone.records[0].timestamp == old  # re-expressed against the horizon, unchanged
    third_inputs = [second.segment(), as_segment(batch([rec(2, 1, 1)]), 2)]
    third = clean(third_inputs)
    assert third.out.log[: len(second.out.log)] == second.out.log  # horizon already set: verbatim
    assert third.last_offsets == [1, 2]
    assert clean(third_inputs, now=horizon - 1).last_offsets == [1, 2]
    at_horizon = clean(third_inputs, now=horizon)
    assert at_horizon.last_offsets == [2]
    assert at_horizon.out.stats.tombstones_removed == 1


def test_scenario_23_stats() -> None:
    (segment,) = single_record_segments([0, 1, 0, 1, 0], per_segment=5)
    c = clean([segment])
    s = c.out.stats
    assert c.out.next_offset == 5
    assert (s.records_read, s.records_written, s.invalid_records) == (5, 2, 0)
    assert (s.bytes_read, s.bytes_written) == (len(segment.data), len(c.out.log))
    assert (s.batches_copied_verbatim, s.batches_dropped, s.batches_rebuilt, s.batches_emptied) == (2, 3, 0, 0)
    assert c.offsets == [3, 4]
    assert s.to_dict()["records_written"] == 2


def test_scenario_26_unkeyed_records_dropped_and_counted() -> None:
    unkeyed = [batch([rec(o, None, o)]) for o in range(6)]
    keyed = [batch([rec(6 + i, i, i)]) for i in range(4)]
    mixed = batch([rec(10, None, b"x"), rec(11, 50, b"y")])
    c = clean([as_segment(b"".join(unkeyed), 0), as_segment(b"".join(keyed) + mixed, 6)])
    assert all(r.key is not None for b in c.batches for r in b.records)
    assert c.out.stats.invalid_records == 7
    assert c.out.log[: len(b"".join(keyed))] == b"".join(keyed)
    assert [r.offset for r in c.batches[-1].records] == [11]


def test_scenario_27_last_batch_of_round_kept_empty() -> None:
    segments = single_record_segments(list(range(20)), per_segment=5)
    c = clean(segments[:3], np.array([], dtype=np.int64), upper=segments[3].base_offset)
    (only,) = c.batches
    assert (only.records, only.last_offset, only.size) == ((), segments[3].base_offset - 1, RECORD_BATCH_OVERHEAD)
    assert c.out.stats.batches_emptied == 1


def test_scenario_35_empty_batch_retention_keeps_identity() -> None:
    original = build_batch(
        [rec(3, 1, ts=11), rec(4, 2, ts=12)],
        producer_id=23,
        producer_epoch=5,
        base_sequence=10,
        partition_leader_epoch=293,
    )
    c = clean([as_segment(encode_batch(original), 3)], np.array([], dtype=np.int64), upper=5)
    (empty,) = c.batches
    assert (empty.base_offset, empty.last_offset, len(empty.records), empty.max_timestamp) == (3, 4, 0, 12)
    assert (empty.base_sequence, empty.last_sequence, empty.producer_epoch) == (10, 11, 5)
    assert (empty.partition_leader_epoch, empty.base_timestamp, empty.size) == (293, -1, RECORD_BATCH_OVERHEAD)
    assert c.out.log == empty_batch_header(original)


def test_scenario_35_base_timestamp_to_delete_horizon_conversion() -> None:
    horizon = 1_000
    log = batch([rec(0, 0, 0, ts=5), rec(1, 1, None, ts=10), rec(2, 2, 2, ts=15)])
    c = clean([as_segment(log, 0)], now=horizon - 1, retention=1)
    (rebuilt,) = c.batches
    assert rebuilt.delete_horizon_ms == horizon
    assert [r.timestamp for r in rebuilt.records] == [5, 10, 15]
    assert rebuilt.max_timestamp == 15
    assert c.out.stats.batches_rebuilt == 1


def test_scenario_35_empty_batch_deletion() -> None:
    empty = empty_batch_header(build_batch([rec(0, 1)]))
    c = clean([as_segment(empty + batch([rec(1, 1)]), 0)], np.array([1]))
    assert c.last_offsets == [1]
    alone = clean([as_segment(empty, 0)], np.array([], dtype=np.int64), upper=10)
    assert alone.out.is_empty and alone.out.log == b""
    assert (alone.out.offset_index, alone.out.time_index, alone.out.txn_index) == (b"", b"", None)
    assert alone.out.stats.empty_outputs == 1
    assert alone.out.next_offset == 1


def test_scenario_2_last_batch_of_active_producer_kept_empty() -> None:
    log = (
        txn_batch(0, [1, 2, 3], pid=1, txn=False)
        + txn_batch(3, [3, 1, 4], pid=2, txn=False)
        + txn_batch(6, [1, 4], pid=3, txn=False)
    )
    producers = {1: ActiveProducer(2, 0), 2: ActiveProducer(5, 0), 3: ActiveProducer(7, 0)}
    first = clean([as_segment(log, 0)], producers=producers)
    assert (first.last_offsets, first.keys, first.offsets) == ([2, 5, 7], [2, 3, 1, 4], [1, 3, 6, 7])
    assert [b.last_sequence for b in first.batches] == [2, 2, 1]
    producers[4] = ActiveProducer(8, 0)
    second = clean([first.segment(), as_segment(txn_batch(8, [2], pid=4, txn=False), 8)], producers=producers)
    assert (second.last_offsets, second.keys, second.offsets) == ([2, 5, 7, 8], [3, 1, 4, 2], [3, 6, 7, 8])
    empty = second.batches[0]
    assert (len(empty.records), empty.producer_id, empty.base_sequence, empty.last_sequence) == (0, 1, 0, 2)


# --- batch rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", list(Codec))
def test_untouched_batches_are_copied_verbatim(codec: Codec) -> None:
    batches = [
        batch([rec(0, 0), rec(1, 1), rec(2, 2)], codec=codec),
        batch([rec(3, 3, ts=5)], codec=codec, delete_horizon_ms=NOW + 1),  # no tombstone, has a horizon
        batch([rec(4, 4, None)], codec=codec, delete_horizon_ms=NOW + 1),  # tombstone before its horizon
    ]
    segment = as_segment(b"".join(batches), 0)
    c = clean([segment])
    assert c.out.log == segment.data
    assert c.out.stats.batches_copied_verbatim == 3


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("timestamp_type", list(TimestampType))
def test_changed_batches_are_rebuilt_with_the_same_codec_and_identity(
    codec: Codec, timestamp_type: TimestampType
) -> None:
    records = [
        Record(10, 500, b"a", b"1", (Header("h", b"x"),)),
        Record(11, 900, b"b", b"2"),
        Record(13, 700, b"a", b"3"),
        Record(14, 800, b"c", b"4"),
    ]
    original = build_batch(
        records,
        last_offset=15,
        codec=codec,
        timestamp_type=timestamp_type,
        producer_id=9,
        producer_epoch=2,
        base_sequence=40,
        partition_leader_epoch=6,
        max_timestamp=950 if timestamp_type is TimestampType.LOG_APPEND_TIME else None,
    )
    c = clean([as_segment(encode_batch(original), 10)], np.array([11, 13], dtype=np.int64))
    (rebuilt,) = c.batches
    assert rebuilt.codec is codec and rebuilt.timestamp_type is timestamp_type
    assert (rebuilt.base_offset, rebuilt.last_offset, rebuilt.base_sequence, rebuilt.last_sequence) == (10, 15, 40, 45)
    assert (rebuilt.producer_id, rebuilt.producer_epoch, rebuilt.partition_leader_epoch) == (9, 2, 6)
    assert [(r.offset, r.key, r.value) for r in rebuilt.records] == [(11, b"b", b"2"), (13, b"a", b"3")]
    assert rebuilt.delete_horizon_ms is None
    if timestamp_type is TimestampType.CREATE_TIME:
        assert rebuilt.max_timestamp == 900 and rebuilt.base_timestamp == 900
        assert [r.timestamp for r in rebuilt.records] == [900, 700]
    else:
        assert rebuilt.max_timestamp == 950
    assert c.out.stats.batches_rebuilt == 1


def test_existing_horizon_is_kept_not_refreshed() -> None:
    horizon = NOW + 5
    log = batch([rec(0, 0, None), rec(1, 1, None), rec(2, 0, 2)], delete_horizon_ms=horizon)
    c = clean([as_segment(log, 0)])
    (rebuilt,) = c.batches
    assert rebuilt.delete_horizon_ms == horizon
    assert [r.offset for r in rebuilt.records] == [1, 2]


def test_aborted_data_is_removed_whatever_its_key() -> None:
    log = txn_batch(0, [1, 2]) + marker(ControlType.ABORT, 2) + txn_batch(3, [3], pid=8, txn=False)
    aborted = [AbortedTxn(0, PID, 0, 2, 3)]
    winners = np.array([0, 1, 3], dtype=np.int64)  # even if the aborted records were (wrongly) winners
    c = clean([as_segment(log, 0)], winners, aborted=aborted)
    assert c.offsets == [2, 3]
    assert c.out.stats.aborted_records_removed == 2
    assert c.txn_index == aborted


def test_kraft_control_records_are_never_discarded() -> None:
    leader_change = batch([Record(0, 5, control_key(ControlType.LEADER_CHANGE), b"\x00\x00")], control=True)
    log = leader_change + batch([rec(1, 1)])
    c = clean([as_segment(log, 0)], now=2**62)
    assert c.out.log == log


# --- transaction markers over several passes --------------------------------------------------------


def passes(log: bytes, producers: dict[int, ActiveProducer], aborted: Sequence[AbortedTxn] = ()) -> Cleaned:
    return clean([as_segment(log, 0)], producers=producers, aborted=aborted)


def test_scenario_6_commit_marker_removal() -> None:
    big = NOW
    log = txn_batch(0, [1]) + txn_batch(1, [2, 3]) + marker(ControlType.COMMIT, 3) + txn_batch(4, [2])
    log += marker(ControlType.COMMIT, 5)
    first = clean([as_segment(log, 0)], producers={PID: ActiveProducer(4, 0)}, now=big)
    assert (first.keys, first.offsets) == ([1, 3, 2], [0, 2, 3, 4, 5])
    more = txn_batch(6, [1, 3]) + marker(ControlType.COMMIT, 8)
    producers = {PID: ActiveProducer(7, 0)}
    second = clean([first.segment(), as_segment(more, 6)], producers=producers, now=big)
    assert (second.keys, second.offsets) == ([2, 1, 3], [3, 4, 5, 6, 7, 8])
    third = clean([second.segment()], producers=producers, now=big)
    assert third.offsets == second.offsets
    assert third.batches[0].delete_horizon_ms == big + RETENTION  # the now discardable C@3 gets a horizon
    assert third.out.stats.batches_rebuilt == 1
    fourth = clean([third.segment()], producers=producers, now=big + RETENTION)
    assert fourth.offsets == [4, 5, 6, 7, 8]
    assert fourth.out.stats.markers_removed == 1


def test_scenario_9_empty_control_batch_kept_for_its_producer() -> None:
    log = marker(ControlType.COMMIT, 0) + batch([rec(1, 2)]) + batch([rec(2, 3)])
    producers = {PID: ActiveProducer(None, 0)}
    first = clean([as_segment(log, 0)], producers=producers)
    second = clean([first.segment()], producers=producers, now=NOW + RETENTION + 1)
    assert (second.offsets, second.last_offsets) == ([1, 2], [0, 1, 2])
    assert second.batches[0].is_control and not second.batches[0].records
    third = clean([second.segment()], producers=producers, now=2**62)
    assert third.out.log == second.out.log


def test_scenario_12_abort_marker_removal() -> None:
    log = txn_batch(0, [1]) + txn_batch(1, [2, 3]) + marker(ControlType.ABORT, 3) + txn_batch(4, [3])
    log += marker(ControlType.COMMIT, 5)
    aborted = [AbortedTxn(0, PID, 0, 3, 4)]
    producers = {PID: ActiveProducer(4, 0)}
    first = passes(log, producers, aborted)
    assert (first.keys, first.offsets, first.txn_index) == ([3], [3, 4, 5], aborted)
    second = clean([first.segment()], producers=producers, aborted=first.txn_index)
    assert (second.offsets, second.txn_index) == ([3, 4, 5], [])
    third = clean([second.segment()], producers=producers, aborted=second.txn_index, now=NOW + RETENTION + 1)
    assert third.offsets == [4, 5]


def test_scenario_14_abort_marker_kept_with_an_empty_batch() -> None:
    log = txn_batch(0, [2, 3]) + marker(ControlType.ABORT, 2)
    aborted = [AbortedTxn(0, PID, 0, 2, 3)]
    producers = {PID: ActiveProducer(1, 0)}
    first = passes(log, producers, aborted)
    assert (first.keys, first.offsets, first.last_offsets, first.txn_index) == ([], [2], [1, 2], aborted)
    for now in (NOW, NOW + RETENTION + 1):
        again = clean([first.segment()], producers=producers, aborted=first.txn_index, now=now)
        assert (again.out.log, again.txn_index) == (first.out.log, aborted)
    producers = {PID: ActiveProducer(3, 0)}
    grown = [first.segment(), as_segment(txn_batch(3, [1], txn=False, seq=2), 3)]
    third = clean(grown, producers=producers, aborted=first.txn_index)
    assert (third.offsets, third.last_offsets, third.txn_index) == ([2, 3], [2, 3], aborted)
    fourth = clean([third.segment()], producers=producers, aborted=third.txn_index)
    fifth = clean([fourth.segment()], producers=producers, aborted=fourth.txn_index, now=NOW + RETENTION + 1)
    assert (fifth.offsets, fifth.last_offsets, fifth.txn_index) == ([3], [3], [])


def test_transaction_state_threads_through_groups() -> None:
    """Scenario 3's log, cleaned as one group and as three groups threading the state: same bytes."""
    p1, p2 = 1, 2
    segments_bytes = [
        txn_batch(0, [1, 2], p1) + txn_batch(2, [2, 3], p2) + txn_batch(4, [3, 4], p1),
        marker(ControlType.COMMIT, 6, p1) + marker(ControlType.COMMIT, 7, p2) + txn_batch(8, [2, 3], p1)
        + marker(ControlType.ABORT, 10, p1),
        txn_batch(11, [4, 5], p2) + txn_batch(13, [5, 6], p1) + marker(ControlType.COMMIT, 15, p1)
        + marker(ControlType.ABORT, 16, p2) + txn_batch(17, [6, 7], p2) + marker(ControlType.COMMIT, 19, p2),
    ]
    bases = [0, 6, 11]
    segments = [as_segment(data, base) for data, base in zip(segments_bytes, bases, strict=True)]
    aborted = [AbortedTxn(0, p1, 8, 10, 11), AbortedTxn(0, p2, 11, 16, 17)]
    producers = {p1: ActiveProducer(14, 0), p2: ActiveProducer(18, 0)}
    whole = clean(segments, aborted=aborted, producers=producers)
    assert whole.txn_index == aborted
    assert whole.keys == [1, 2, 3, 4, 5, 6, 7]
    assert whole.offsets == [0, 2, 4, 5, 6, 7, 10, 13, 15, 16, 17, 18, 19]
    winners = latest_winners(segments, aborted)
    state = TransactionState.start(aborted)
    logs, txns = [], []
    for segment in segments:
        part = clean([segment], winners, upper=20, aborted=aborted, producers=producers, state=state)
        state = part.state
        logs.append(part.out.log)
        txns += part.txn_index
    assert b"".join(logs) == whole.out.log
    assert txns == whole.txn_index
    assert state == whole.state
    assert not state.pending and not state.ongoing_aborted and not state.ongoing_committed


def test_transaction_state_ignores_duplicate_and_closed_aborts() -> None:
    txn = AbortedTxn(0, PID, 0, 2, 3)
    state = TransactionState.start([txn, txn])
    assert state.pending == (txn,)
    log = txn_batch(0, [1, 2]) + marker(ControlType.ABORT, 2) + txn_batch(3, [3], txn=False)
    after = clean([as_segment(log, 0)], aborted=[txn], state=state)
    assert after.state.with_aborted([txn]) == after.state  # its marker at 2 was read: closed
    assert after.offsets == [2, 3]


# --- corrupt input ---------------------------------------------------------------------------------


def test_corrupt_crc_names_object_and_position() -> None:
    first = batch([rec(0, 0)])
    second = bytearray(batch([rec(1, 1, b"value")]))
    second[-3] ^= 0xFF
    segment = SegmentInput(first + bytes(second), 0, "topic-0/00000000000000000000.log")
    with pytest.raises(CrcMismatchError) as err:
        clean([segment], np.array([0, 1]))
    assert (err.value.obj, err.value.position) == (segment.obj, len(first) + CRC_OFFSET)


def test_a_held_input_whose_crcs_its_scan_checked_is_not_checked_again() -> None:
    """`SegmentInput.verified` (bytes the same task's scan checked, `compaction.spark.fused`) skips the rewrite's
    CRC check: the same corrupt bytes that fail unverified are rewritten from what they hold (here the corrupt
    batch's one record loses to a later one: it is dropped)."""
    first = batch([rec(0, 0)])
    second = bytearray(batch([rec(1, 1, b"value")]))
    second[-3] ^= 0xFF  # the CRC no longer matches; the records still decode
    data = first + bytes(second)
    with pytest.raises(CrcMismatchError):
        clean([SegmentInput(data, 0, "s.log")], np.array([0]))
    assert clean([SegmentInput(data, 0, "s.log", verified=True)], np.array([0])).out.stats.records_written == 1


@given(st.lists(st.integers(0, 60), max_size=40), st.lists(st.integers(0, 60), max_size=30), st.booleans())
def test_the_winner_walk_finds_the_same_members_as_a_search(offsets: list[int], values: list[int],
                                                            ordered: bool) -> None:
    """`facts._members` walks increasing offsets and the sorted winners together; offsets that go back (no
    Kafka log has them) are looked up afresh."""
    looked = np.array(sorted(offsets) if ordered else offsets, np.int64)
    winners = np.unique(np.array(values, np.int64))
    assert facts_module._members(looked, winners).tolist() == np.isin(looked, winners).tolist()


def test_bad_magic_names_object_and_position() -> None:
    data = bytearray(batch([rec(0, 0)]) + batch([rec(1, 1)]))
    second = len(data) // 2
    data[second + MAGIC_OFFSET] = 0xFF
    with pytest.raises(InvalidMagicError) as err:
        clean([SegmentInput(bytes(data), 0, "s.log")], np.array([0, 1]))
    assert (err.value.obj, err.value.position) == ("s.log", second + MAGIC_OFFSET)


def test_offsets_going_backwards_are_corrupt_input() -> None:
    data = batch([rec(5, 0)]) + batch([rec(3, 1)])
    with pytest.raises(CorruptInputError) as err:
        clean([SegmentInput(data, 0, "s.log")], np.array([3, 5]))
    assert (err.value.obj, err.value.position) == ("s.log", len(batch([rec(5, 0)])))


def test_winners_must_be_sorted() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        clean([as_segment(batch([rec(0, 0), rec(1, 1)]), 0)], np.array([1, 0]))


def test_scan_windows_shift_error_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facts_module, "WINDOW_BYTES", 150)
    batches = [batch([rec(o, o, b"x" * 40)]) for o in range(8)]
    corrupt = bytearray(b"".join(batches))
    at = sum(len(b) for b in batches[:5]) + 70
    corrupt[at] ^= 0x01
    with pytest.raises(CrcMismatchError) as err:
        clean([SegmentInput(bytes(corrupt), 0, "w.log")], np.arange(8))
    assert err.value.obj == "w.log"
    assert err.value.position == sum(len(b) for b in batches[:5]) + CRC_OFFSET


# --- properties ------------------------------------------------------------------------------------

keys = st.one_of(st.none(), st.integers(0, 5).map(lambda k: str(k).encode()))
values = st.one_of(st.none(), st.just(b"v"))


@st.composite
def logs(draw: st.DrawFn) -> list[SegmentInput]:
    """1-3 segments of 1-4 batches of 1-4 records (offset gaps, keyless records, tombstones, every codec)."""
    segments = []
    offset = draw(st.integers(0, 1_000))
    for _s in range(draw(st.integers(1, 3))):
        base = offset
        parts = []
        for _b in range(draw(st.integers(1, 4))):
            records = []
            for _r in range(draw(st.integers(1, 4))):
                records.append(Record(offset, draw(st.integers(0, 10**6)), draw(keys), draw(values)))
                offset += draw(st.integers(1, 2))
            horizon = draw(st.one_of(st.none(), st.sampled_from([NOW - 1, NOW, NOW + 1])))
            parts.append(
                batch(
                    records,
                    codec=draw(st.sampled_from(list(Codec))),
                    last_offset=offset - 1 + draw(st.integers(0, 1)),
                    delete_horizon_ms=horizon,
                )
            )
            offset = records[-1].offset + 3
        segments.append(as_segment(b"".join(parts), base))
    return segments


@settings(max_examples=40, deadline=None)
@given(logs(), st.integers(1, 3))
def test_property_one_record_per_key_and_groups_agree(segments: list[SegmentInput], split: int) -> None:
    winners = latest_winners(segments)
    c = clean(segments, winners)
    kept = [(r.offset, r.key, r.value) for b in c.batches for r in b.records]
    assert {o for o, _k, _v in kept} <= set(winners.tolist())
    survivors = {o for o, _k, v in kept}
    headers = {h.base_offset: h for s in segments for h in iter_batch_headers(s.data)}
    for offset, key, has_value, _pid, _txn in data_records(segments):
        if key is None or offset not in set(winners.tolist()):
            continue
        horizon = next(h for b, h in headers.items() if b <= offset <= h.last_offset).delete_horizon_ms
        assert (offset in survivors) == (has_value or horizon is None or horizon > NOW)
    upper = c.out.next_offset
    split = min(split, len(segments))
    first = clean(segments[:split], winners, upper=upper)
    rest = clean(segments[split:], winners, upper=upper, state=first.state) if segments[split:] else None
    assert first.out.log + (rest.out.log if rest else b"") == c.out.log


@settings(max_examples=25, deadline=None)
@given(logs(), st.integers(61, 400))
def test_property_scan_facts_agree_with_reference(segments: list[SegmentInput], window: int) -> None:
    winners = latest_winners(segments)
    for s in segments:
        headers = list(iter_batch_headers(s.data))
        expected = reference_facts(s.data, headers, winners, obj="x")
        assert scan_facts(s.data, headers, winners, obj="x") == expected
        scanned = scan_segment(s.data)  # what the fused task's scan keeps for its rewrite, when it is compressed
        bits = RecordBits.of_scan(scanned.records, scanned.batch_fields)
        assert bits is None or known_facts(bits, winners) == expected
        assert (bits is None) == all(h.codec is Codec.NONE for h in headers)
    # windows smaller than a batch still scan every batch once
    facts_module_window = facts_module.WINDOW_BYTES
    try:
        facts_module.WINDOW_BYTES = window
        for s in segments:
            headers = list(iter_batch_headers(s.data))
            assert scan_facts(s.data, headers, winners, obj="x") == reference_facts(
                s.data, headers, winners, obj="x"
            )
    finally:
        facts_module.WINDOW_BYTES = facts_module_window



# --- policy tables and edges -----------------------------------------------------------------------


@dataclass(frozen=True)
class FakeBatch:
    producer_id: int = -1
    producer_epoch: int = 0
    last_offset: int = 10
    control: bool = False
    horizon: int | None = None

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def is_control(self) -> bool:
        return self.control

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.horizon


DELETE, RETAIN_EMPTY, DELETE_EMPTY = BatchRetention.DELETE, BatchRetention.RETAIN_EMPTY, BatchRetention.DELETE_EMPTY


@pytest.mark.parametrize(
    ("fake", "can_discard", "upper", "producers", "expected"),
    [
        (FakeBatch(), False, 100, {}, (DELETE_EMPTY, False, False)),
        (FakeBatch(), True, 100, {}, (DELETE, True, False)),
        (FakeBatch(), True, 11, {}, (RETAIN_EMPTY, True, False)),  # KAFKA-17076
        (FakeBatch(producer_id=1), True, 100, {1: ActiveProducer(10, 0)}, (RETAIN_EMPTY, True, False)),
        (FakeBatch(producer_id=1), True, 100, {1: ActiveProducer(9, 0)}, (DELETE, True, False)),
        # a data batch never matches an active producer whose last entry is a marker
        (FakeBatch(producer_id=1), False, 100, {1: ActiveProducer(None, 0)}, (DELETE_EMPTY, False, False)),
        # markers: discarded only once discardable and past their horizon (horizon <= now)
        (FakeBatch(control=True), True, 100, {}, (DELETE_EMPTY, False, True)),
        (FakeBatch(control=True, horizon=NOW + 1), True, 100, {}, (DELETE_EMPTY, False, True)),
        (FakeBatch(control=True, horizon=NOW), True, 100, {}, (DELETE, True, True)),
        (FakeBatch(control=True, horizon=NOW), False, 100, {}, (DELETE_EMPTY, False, False)),
        (
            FakeBatch(producer_id=1, control=True, horizon=NOW),
            True,
            100,
            {1: ActiveProducer(None, 0)},
            (RETAIN_EMPTY, True, True),
        ),
        (
            FakeBatch(producer_id=1, control=True, horizon=NOW),
            True,
            100,
            {1: ActiveProducer(None, 1)},  # another epoch: not its last entry
            (DELETE, True, True),
        ),
    ],
)
def test_check_batch_retention_table(
    fake: FakeBatch, can_discard: bool, upper: int, producers: dict[int, ActiveProducer],
    expected: tuple[BatchRetention, bool, bool],
) -> None:
    decision = check_batch_retention(
        fake, can_discard, now_ms=NOW, upper_bound_offset=upper, active_producers=producers
    )
    assert (decision.retention, decision.discard_records, decision.contains_marker_for_empty_txn) == expected


def test_horizon_past_long_max_is_no_horizon_as_in_kafka() -> None:
    log = batch([rec(0, 0, None)]) + batch([rec(1, 1)])
    c = clean([as_segment(log, 0)], retention=2**63 - 1)
    assert c.offsets == [1] and c.batches[0].records[0].value is None
    assert c.batches[0].delete_horizon_ms is None


@settings(max_examples=60, deadline=None)
@given(data_batches(), st.data())
def test_property_compiled_rebuild_equals_reference(original: RecordBatch, data: st.DataObject) -> None:
    encoded = encode_batch(original)
    header = next(iter_batch_headers(encoded))
    decoded = decode_batch(encoded)
    winners = sorted(data.draw(st.sets(st.sampled_from([r.offset for r in decoded.records]))))
    now = data.draw(st.sampled_from([0, 2**41, 2**43]))
    keep_all_records = BatchDecision(BatchRetention.DELETE_EMPTY, False, False)
    kept = [
        r
        for r in decoded.records
        if should_retain_record(
            keep_all_records, decoded, wins=r.offset in winners, has_key=r.key is not None,
            has_value=r.value is not None, now_ms=now,
        )
    ]
    assume(kept)
    horizon = rebuilt_delete_horizon(decoded.delete_horizon_ms, any(r.value is None for r in kept), now, RETENTION)
    expected = encode_batch(rebuild_batch(decoded, kept, horizon))
    fast = rebuild_data_batch(
        memoryview(encoded),
        header,
        np.array(winners, dtype=np.int64),
        retain_deletes=retains_deletes(decoded.delete_horizon_ms, now),
        delete_horizon_ms=horizon,
        obj="x",
    )
    assert fast.data == expected
    assert (fast.records, fast.max_timestamp) == (len(kept), decode_batch(expected).max_timestamp)


def test_groups_out_of_order_are_refused() -> None:
    later = clean([as_segment(batch([rec(5, 1)]), 5)])
    with pytest.raises(ValueError, match="offset order"):
        clean([as_segment(batch([rec(0, 0)]), 0)], state=later.state)


def test_a_filter_built_piece_by_piece_has_the_facts_of_a_later_piece() -> None:
    """The transactional batch and the delete horizon of the output stand in its second input's piece only:
    `joined_filter` of the pieces `on_written` gives must record both, as the filter of the whole output does."""
    first = as_segment(batch([rec(0, 1), rec(1, 2)]), 0, "first")
    second = as_segment(txn_batch(2, [3, 4]) + marker(ControlType.COMMIT, 4) + batch([rec(5, 1, None)]), 2,
                        "second")
    pieces: list[bytes] = []
    out, _state = rewrite_group([first, second], np.array([1, 2, 3, 5], np.int64), upper_bound_offset=6, now_ms=NOW,
                                delete_retention_ms=RETENTION, on_written=lambda data, _hashes: pieces.append(data))
    assert len(pieces) == 2
    whole = segment_filter(scan_segment(out.log, verify_crc=False), 0.01)
    built = joined_filter([filter_part(p) for p in pieces], 0.01)
    assert whole.facts.transactional and whole.facts.horizon_ms == NOW + RETENTION
    assert built.to_bytes() == whole.to_bytes()


def test_compiled_rebuild_finds_winners_when_offset_deltas_go_back() -> None:
    """The kernel walks the winners forward as a batch's offsets increase; a batch whose offset deltas do not
    (Kafka never writes one, nothing here refuses it) is rebuilt as the reference rebuilds it, no winner missed."""
    original = build_batch([rec(10, 1), rec(14, 2), rec(12, 3), rec(11, 4), rec(15, 5)], last_offset=15)
    encoded = encode_batch(original)
    decoded = decode_batch(encoded)
    assert [r.offset for r in decoded.records] == [10, 14, 12, 11, 15]
    winners = [11, 12, 14]
    kept = [r for r in decoded.records if r.offset in winners]
    expected = encode_batch(rebuild_batch(decoded, kept, None))
    fast = rebuild_data_batch(memoryview(encoded), next(iter_batch_headers(encoded)), np.array(winners, np.int64),
                              retain_deletes=True, delete_horizon_ms=None, obj="x")
    assert fast.data == expected
    assert fast.records == 3


# --- a plain segment in one kernel call ------------------------------------------------------------------


@st.composite
def plain_logs(draw: st.DrawFn) -> tuple[list[SegmentInput], np.ndarray, int, dict[int, ActiveProducer]]:
    """1-3 segments of 1-6 uncompressed data batches (create or log-append time, horizons before, at and after
    NOW, keyless records, tombstones, producer ids), sometimes one compressed or transactional batch among them
    (the segment then takes the per-batch path); any winners among the offsets, an upper bound that may end a
    batch, and maybe an active producer whose last batch is one of them."""
    segments, ends = [], []
    offset = draw(st.integers(0, 1_000))
    pids = []
    for _s in range(draw(st.integers(1, 3))):
        base = offset
        parts = []
        for _b in range(draw(st.integers(1, 6))):
            records = []
            for _r in range(draw(st.integers(1, 5))):
                records.append(Record(offset, draw(st.integers(0, 10**6)), draw(keys), draw(values)))
                offset += draw(st.integers(1, 2))
            pid = draw(st.sampled_from([-1, -1, 7]))
            odd = draw(st.integers(0, 9))  # 0: compressed, 1: transactional, else plain
            parts.append(batch(
                records, codec=Codec.LZ4 if odd == 0 else Codec.NONE,
                timestamp_type=draw(st.sampled_from(list(TimestampType))),
                last_offset=offset - 1 + draw(st.integers(0, 1)),
                delete_horizon_ms=draw(st.one_of(st.none(), st.sampled_from([NOW - 1, NOW, NOW + 1]))),
                producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=0 if pid >= 0 else -1,
                transactional=odd == 1 and pid >= 0))
            ends.append(decode_batch(parts[-1], 0).last_offset)
            pids.append(pid)
            offset = ends[-1] + 1 + draw(st.integers(0, 2))
        segments.append(as_segment(b"".join(parts), base))
    everything = [r[0] for r in data_records(segments)]
    winners = np.array(sorted(set(draw(st.lists(st.sampled_from(everything), max_size=len(everything))))),
                       np.int64)
    upper = draw(st.one_of(st.just(offset + 10), st.sampled_from(ends).map(lambda e: e + 1)))
    active = {7: ActiveProducer(draw(st.sampled_from(ends)), 0)} if 7 in pids and draw(st.booleans()) else {}
    return segments, winners, upper, active


def _rewritten(segments: Sequence[SegmentInput], winners: np.ndarray, upper: int,
               active: dict[int, ActiveProducer], now: int, hashed: list[bytes] | None = None) -> object:
    """The rewrite's output, stats, state, pieces and the filter of its pieces (from the key hashes the rewrite
    gives with a piece, `known_part`, else from the piece's bytes); the pieces given with hashes go to `hashed`."""
    pieces: list[bytes] = []
    parts: list[FilterPart] = []

    def written(data: bytes, hashes: np.ndarray | None) -> None:
        pieces.append(data)
        parts.append(filter_part(data) if hashes is None else known_part(data, hashes))
        if hashes is not None and hashed is not None:
            hashed.append(data)

    try:
        out, state = rewrite_group(segments, winners, upper_bound_offset=upper, now_ms=now,
                                   delete_retention_ms=RETENTION, active_producers=active, index_interval_bytes=100,
                                   on_written=written)
    except CorruptInputError as exc:
        return type(exc), exc.obj, exc.position
    return (out.log, out.offset_index, out.time_index, out.txn_index, out.base_offset, out.next_offset,
            out.stats.to_dict(), out.transactional, state, pieces, joined_filter(parts, 0.01).to_bytes())


@settings(max_examples=100, deadline=None)
@given(st.one_of(logs(), plain_logs().map(lambda log: log[0])), st.sampled_from([NOW - 10, NOW, NOW + 10]))
def test_a_rewrite_from_the_scans_records_is_the_rewrite_that_decodes_them(segments: list[SegmentInput],
                                                                           now: int) -> None:
    """`SegmentInput.records` (what the same task's scan decoded, `compaction.spark.fused`): the rewrite counts each
    batch from them instead of decoding the records again, and writes the same segment, byte for byte, with the
    same stats, indexes, pieces and transaction state as without them; and the filter built from the key hashes it
    hands with each piece of such a segment (not decoding the output) is the filter of the pieces' bytes."""
    winners = latest_winners(segments)
    upper = max(h.next_offset for s in segments for h in iter_batch_headers(s.data, obj=s.obj))
    verified = [replace(s, verified=True) for s in segments]
    with_bits = []
    for s in verified:
        scanned = scan_segment(s.data)
        with_bits.append(replace(s, records=RecordBits.of_scan(scanned.records, scanned.batch_fields)))
    assume(any(s.records is not None for s in with_bits))
    decoded: list[bytes] = []
    real = group_module.scan_facts

    def counted(data: memoryview, *args: Any, **kwargs: Any) -> RecordFacts:
        decoded.append(bytes(data))
        return real(data, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(group_module, "scan_facts", counted)
        expected = _rewritten(verified, winners, upper, {}, now)
        decoded.clear()
        hashed: list[bytes] = []
        assert _rewritten(with_bits, winners, upper, {}, now, hashed) == expected
    # a segment with the scan's records is counted from them, not decoded again, and its piece comes with hashes
    assert not set(decoded) & {bytes(s.data) for s in with_bits if s.records is not None}
    if all(s.records is not None for s in with_bits) and isinstance(expected, tuple) and len(expected) > 3:
        assert hashed == expected[9]


@pytest.mark.parametrize("count", [b"\x7f\xff\xff\xff", b"\x00\x00\x01\x00", b"\x00\x00\x00\x00"])
def test_a_record_count_past_its_batch_is_the_per_batch_rewrite_error_not_a_huge_buffer(count: bytes) -> None:
    """A plain batch whose record count (bytes 57-60, unchecked when its scan's CRC check is trusted) says more
    records than its bytes hold: the one-call rewrite sized its output by that count (a count of 2^31 asked numpy
    for ~26 GiB: MemoryError); now it fails as the per-batch path fails, naming the segment."""
    records = [Record(o, 1_000 + o, b"k%d" % o, b"v" * 10) for o in range(4)]
    data = bytearray(as_segment(batch(records), 0).data)
    data[57:61] = count
    segments = [SegmentInput(bytes(data), 0, "seg-0.log", True)]
    fast = _rewritten(segments, np.arange(4, dtype=np.int64), 10, {}, NOW)  # upper past it: plain
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(group_module._GroupRewriter, "_plain", lambda _self, _fields: False)
        assert _rewritten(segments, np.arange(4, dtype=np.int64), 10, {}, NOW) == fast
    assert isinstance(fast, tuple) and issubclass(fast[0], CorruptInputError) and fast[1] == "seg-0.log", fast


@settings(max_examples=300, deadline=None)
@given(plain_logs(), st.sampled_from([NOW - 10, NOW, NOW + 10]), st.integers(0, 2**16), st.integers(0, 255),
       st.booleans())
def test_a_plain_segment_in_one_call_is_the_per_batch_rewrite(
        log: tuple[list[SegmentInput], np.ndarray, int, dict[int, ActiveProducer]], now: int, at: int, xor: int,
        verified: bool) -> None:
    """`records.rewrite_plain` (a segment whose batches are all plain, in one kernel call) writes what the
    per-batch path writes, byte for byte, with the same stats, indexes, pieces and transaction state; on a
    segment with a byte changed (`verified`: its CRCs not checked), the same output or the same error."""
    segments, winners, upper, active = log
    first = segments[0]
    changed = bytearray(first.data)
    changed[at % len(changed)] ^= xor
    segments = [SegmentInput(bytes(changed), first.base_offset, first.obj, verified), *segments[1:]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = _rewritten(segments, winners, upper, active, now)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(group_module._GroupRewriter, "_plain", lambda _self, _fields: False)
            assert _rewritten(segments, winners, upper, active, now) == fast
