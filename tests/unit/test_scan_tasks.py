"""How the Spark scan cuts segments into tasks (`compaction.spark.scan.scan_slices`): every segment in
exactly one task, as many tasks as the bytes and cores call for, each task whole runs of one partition's
consecutive segments (so it can reduce them to one row per key). And how the
rewrite tasks get their chunks: packed by bytes into tasks (`rewrite_slots`), one Spark partition per task
(`slot_keys`), winners split by group. And the
values that cross to the executors: scan rows in their `RowLayout`. And which partitions the one job takes."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import compaction.spark.fused as fused_job
import compaction.spark.scan as scan_module
from compaction.config import CompactionStrategy
from compaction.metadata.model import TopicPartition
from compaction.packing import MAX_TASK_BYTES, OPEN_COST_BYTES
from compaction.spark.fused import (
    FOLD_RECORDS,
    HELD_BYTES,
    HELD_IN_FLIGHT_BYTES,
    RESERVE_MARGIN,
    UNITS_IN_FLIGHT,
    FusedUnit,
    _needs,
    _parts,
    exchange_plan,
    expected_keys,
    fits,
    spread,
    units_in_flight,
)
from compaction.spark.pipeline import _states_known, rewrite_slots
from compaction.spark.rewrite_job import RewriteUnit, sorted_offsets, split_winners
from compaction.spark.scan import (
    SCAN_TASK_BYTES,
    SCAN_TASK_RECORDS,
    PartitionScanSettings,
    RowLayout,
    ScanSettings,
    ScanTask,
    scan_slices,
)
from compaction.spark.winners import slot_keys, spark_hash_long
from compaction.storage import open_store
from compaction.storage.s3_client import S3_PUT_THREADS
from compaction.strategies import packed_fold
from compaction.strategies.packed_fold import merged_folds, pack_fold, pack_offsets
from compaction.strategies.winner import SegmentBest
from compaction.tasks import GroupTask, InputSegment, PartitionTask, SegmentScanTask


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2 * SCAN_TASK_BYTES), st.integers(0, SCAN_TASK_RECORDS)),
                max_size=80), st.integers(1, 16))
def test_slices_cover_every_segment_once_in_runs_of_a_partition(raw: list[tuple[int, int, int]], parallelism: int
                                                                ) -> None:
    segments = [SegmentScanTask("t", p, f"s{i}", f"k{i}", i, size=n, offsets=r) for i, (p, n, r) in enumerate(raw)]
    slices = scan_slices(segments, parallelism)
    flat = [s for part in slices for s in part]
    assert sorted(s.segment_id for s in flat) == sorted(s.segment_id for s in segments)
    n = min(len(segments), max(parallelism, -(-sum(n for _p, n, _r in raw) // SCAN_TASK_BYTES),
                               -(-sum(r for _p, _n, r in raw) // SCAN_TASK_RECORDS)))
    assert len(slices) == n and all(part for part in slices)  # every core gets work, however few partitions
    for part in slices:  # a task holds whole runs: within a partition, consecutive segments in offset order
        for p in {s.partition for s in part}:
            mine = [s.start_offset for s in part if s.partition == p]
            assert mine == sorted(mine)


def test_small_partitions_are_scanned_whole_one_task_per_core() -> None:
    """8 partitions of 5 segments on 4 cores: 4 tasks, each taking two partitions' whole logs, so it hands Spark
    one row per key of each. Past the bytes or the records a task may take, there are more tasks."""
    segments = [SegmentScanTask("t", p, f"s{p}-{i}", f"k{p}-{i}", 100 * i, size=2 * 2**20 + p + i, offsets=100)
                for p in range(8) for i in range(5)]
    slices = scan_slices(segments, 4)
    assert len(slices) == 4
    for part in slices:
        assert sorted(s.segment_id for s in part) == sorted(
            f"s{p}-{i}" for p in {s.partition for s in part} for i in range(5))
    big = [SegmentScanTask("t", 0, f"s{i}", f"k{i}", i, size=SCAN_TASK_BYTES) for i in range(40)]
    assert len(scan_slices(big, 4)) == 40
    many = [SegmentScanTask("t", 0, f"s{i}", f"k{i}", i, size=2**20, offsets=SCAN_TASK_RECORDS // 2)
            for i in range(40)]
    assert len(scan_slices(many, 4)) == 20


def test_one_hot_partition_is_cut_into_consecutive_runs_on_every_core() -> None:
    segments = [SegmentScanTask("t", 0, f"s{i}", f"k{i}", 100 * i, size=32 * 2**20) for i in range(47)]
    slices = scan_slices(segments, 4)
    assert len(slices) == 4
    for part in slices:
        offsets = sorted(s.start_offset for s in part)
        assert offsets == list(range(offsets[0], offsets[-1] + 100, 100))  # no gap: one run each
    assert max(len(p) for p in slices) - min(len(p) for p in slices) <= 1


@given(st.integers(1, 300))
def test_every_chunk_slot_lands_in_a_spark_partition_of_its_own(n: int) -> None:
    keys = slot_keys(n)
    assert len(set(keys)) == n
    assert sorted(spark_hash_long(k) % n for k in keys) == list(range(n))


def test_spark_hash_of_a_long_matches_murmur3_reference_values() -> None:
    # Spark: SELECT hash(CAST(0 AS BIGINT)), hash(CAST(1 AS BIGINT)), hash(CAST(-1 AS BIGINT)), hash(1234567890123L)
    assert [spark_hash_long(v) for v in (0, 1, -1, 1234567890123)] == SPARK_HASHES


SPARK_HASHES = [-1670924195, -1712319331, -939490007, 1304145252]  # printed by Spark 4.3 (local[1])


def test_winners_are_split_by_group_sorted_and_markers_dropped() -> None:
    import numpy as np

    groups = [GroupTask(0, 0, 9, ()), GroupTask(1, 10, 19, ()), GroupTask(2, 20, 29, ())]
    got = split_winners(np.array([15, -1, 3, 29, 10, -1, 0], np.int64), groups)
    assert {g: v.tolist() for g, v in got.items()} == {0: [0, 3], 1: [10, 15], 2: [29]}
    assert all(v.dtype == np.int64 for v in got.values())


@given(st.lists(st.integers(0, 2**40), max_size=300), st.integers(0, 2**50), st.booleans())
def test_sorted_offsets_are_a_sort(offsets: list[int], base: int, dense: bool) -> None:
    """Dense offsets (marked over their span) or sparse ones, equal ones included: the same as numpy's sort."""
    import numpy as np

    values = np.array([base + (v % 600 if dense else v) for v in offsets], np.int64)
    got = sorted_offsets(values)
    assert got.dtype == np.int64
    assert got.tolist() == sorted(values.tolist())


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 70)), max_size=200), st.integers(1, 5),
       st.integers(1, 4))
def test_packed_winners_reach_the_chunk_holding_them(rows: list[tuple[int, int]], limit: int, batches: int) -> None:
    """`chunk_winners`' packing (`pack_offsets`) and the rewrite task's unpacking (`_received`) hand each chunk
    exactly the winners in its range, whatever the batches in and out, the offsets per packed row and the
    partitions; offsets in no chunk (a kept segment's, a marker's -1) reach none, and every chunk's empty marker
    row stands for -1."""
    import numpy as np
    import pyarrow as pa

    import compaction.spark.winners as winners
    from compaction.spark.rewrite_job import WinnerRows, _received
    from compaction.spark.winners import Chunk

    chunks = [Chunk(0, 0, 9, 7), Chunk(0, 20, 39, 3), Chunk(1, 0, 49, 5), Chunk(2, 10, 19, 7), Chunk(2, 30, 30, 2)]
    old, winners.PACK_LIMIT, rows_per_batch, winners._PACK_ROWS = winners.PACK_LIMIT, limit, winners._PACK_ROWS, 3
    try:
        step = max(1, -(-len(rows) // batches))
        arrow = [pa.RecordBatch.from_pydict({"tp": pa.array([t for t, _o in part], pa.int32()),
                                             "offset": pa.array([o for _t, o in part], pa.int64())})
                 for part in (rows[i:i + step] for i in range(0, len(rows), step))]
        packed = list(winners.pack_offsets(chunks)(iter(arrow)))
    finally:
        winners.PACK_LIMIT, winners._PACK_ROWS = old, rows_per_batch
    assert all(b.num_rows <= 3 for b in packed)
    assert all(len(b) // 8 <= limit for batch in packed for b in batch.column(2).to_pylist())
    markers = pa.RecordBatch.from_pydict({"slot": pa.array([c.slot for c in chunks], pa.int64()),
                                          "tp": pa.array([c.partition_index for c in chunks], pa.int32()),
                                          "offsets": pa.array([b""] * len(chunks), pa.binary())})
    slot_of, tps, offsets = _received([*packed, markers], WinnerRows.PACKED)
    assert tps is not None
    got = sorted(zip(slot_of.tolist(), tps.tolist(), offsets.tolist(), strict=True))
    expected = sorted([(slot, t, o) for t, o in rows for tp, s, e, slot in chunks if tp == t and s <= o <= e]
                      + [(slot, tp, -1) for tp, _s, _e, slot in chunks])
    assert got == expected
    assert offsets.dtype == np.int64


# --- what crosses the Spark boundary: rows in their layout ---------------------------------------------------------


_LAYOUTS = [  # every layout a run uses (step by step, a rescan, the one job's three), by offset and ranked
    (RowLayout.STEP_BY_STEP, False, ("tp", "key", "offset", "dirty")),
    (RowLayout.STEP_BY_STEP, True, ("tp", "key", "has_version", "version", "offset", "dirty")),
    (RowLayout.RESCAN, False, ("tp", "key", "offset", "dirty", "seg")),
    (RowLayout.RESCAN, True, ("tp", "key", "has_version", "version", "offset", "dirty", "seg")),
    (RowLayout.ONE_JOB_BY_KEY, False, ("tp", "key", "offset")),
    (RowLayout.ONE_JOB_BY_KEY, True, ("tp", "key", "has_version", "version", "offset")),
    (RowLayout.ONE_JOB_OWN_SLOTS, False, ("key", "offset", "slot")),
    (RowLayout.ONE_JOB_OWN_SLOTS, True, ("key", "has_version", "version", "offset", "slot")),
    (RowLayout.ONE_JOB_SHARED_SLOTS, False, ("tp", "key", "offset", "slot")),
    (RowLayout.ONE_JOB_SHARED_SLOTS, True, ("tp", "key", "has_version", "version", "offset", "slot")),
]


@pytest.mark.parametrize(("layout", "ranked", "names"), _LAYOUTS)
def test_a_scan_task_writes_the_columns_its_layout_names(layout: RowLayout, ranked: bool, names: tuple[str, ...]
                                                         ) -> None:
    """The Spark schema the driver declares and the Arrow batches a scan task writes are one layout: same
    columns in the same order, the key nullable only where marker rows come (the one job by slot)."""
    partition = PartitionScanSettings(CompactionStrategy.OFFSET, None, (), 0.01, rewrite_slot=11)
    settings = ScanSettings(None, (partition, partition), layout, ranked, rows_per_batch=2)  # type: ignore[arg-type]
    best = SegmentBest(pa.array([b"a", b"b", b"c"], pa.binary()), pa.array([1, 0, 1], pa.int8()),
                       pa.array([7, 0, 9], pa.int64()), pa.array([3, 4, 5], pa.int64()), 0)
    batches = list(ScanTask(settings, None, [])._rows(1, best, np.array([True, False, True]), 6))  # type: ignore[arg-type]
    assert layout.names(ranked) == names == tuple(settings.schema().fieldNames())
    by_slot = layout in (RowLayout.ONE_JOB_OWN_SLOTS, RowLayout.ONE_JOB_SHARED_SLOTS)
    assert layout.by_slot == by_slot
    assert [f.nullable for f in settings.schema().fields] == [by_slot and n == "key" for n in names]
    assert [b.num_rows for b in batches] == [2, 1]
    assert all(b.schema == settings.arrow_schema() for b in batches)
    rows = pa.Table.from_batches(batches).to_pylist()
    expected = {"tp": 1, "has_version": 1, "version": 7, "dirty": True, "seg": 6, "slot": 11}
    assert {n: v for n, v in rows[0].items() if n not in ("key", "offset")} == {n: expected[n] for n in names
                                                                              if n not in ("key", "offset")}
    assert [(r["key"], r["offset"]) for r in rows] == [(b"a", 3), (b"b", 4), (b"c", 5)]


_CHUNKS = (("s0", "s1"), ("s2",), ("s3",))  # a partition's segments in three rewrite chunks


@pytest.mark.parametrize(("flags", "known"), [
    ({}, True),  # every row says: no transactional or control batch
    ({"s3": True}, True), ({"s3": None}, True),  # in the last chunk: no later chunk's start depends on it
    ({"s2": True}, False), ({"s2": None}, False), ({"s0": None}, False), ({"s1": True}, False),
])
def test_the_one_job_takes_a_partition_whose_marker_walk_states_its_rows_give(
        flags: dict[str, bool | None], known: bool) -> None:
    """Before the scan (`pipeline._states_known`), a partition's first chunk starts the marker walk, and a later
    chunk's start state is known when every segment before it holds no transactional or control batch by its row
    (`transactional` False). One that holds one, or whose row cannot say (None: a broker's copy, a row older than
    the column), before a later chunk sends the partition step by step; a single chunk never does."""
    groups = tuple(GroupTask(g, 10 * g, 10 * g + 9, tuple(InputSegment(i, 10 * g, 10 * g + 9, {}) for i in ids))
                   for g, ids in enumerate(_CHUNKS))
    task = PartitionTask("t", "id", 0, 40, 0, 0, 4096, (), {}, groups)
    rows = [SimpleNamespace(segment_id=i, transactional=flags.get(i, False)) for ids in _CHUNKS for i in ids]
    assert _states_known(SimpleNamespace(segments=rows), task) is known  # type: ignore[arg-type]
    assert _states_known(SimpleNamespace(segments=rows), replace(task, groups=groups[:1]))  # type: ignore[arg-type]


def _unit(index: int, group_id: int, size: int) -> RewriteUnit:
    task = PartitionTask("t", "id", index, 10, 0, 0, 4096, (), {}, ())
    return RewriteUnit(index, task, (GroupTask(group_id, 0, 9, (InputSegment("s", 0, 9, {}, size),)),))


def test_rewrite_tasks_pack_small_partitions_and_spread_a_hot_one() -> None:
    """Issue 41: 400 partitions of one 400 KB chunk each and one hot partition of six 200 MB chunks on 2 cores: the
    small chunks share a few tasks (Spark's cost is per task), each hot chunk has a task of its own (the partition
    still uses every core), every chunk runs once. With the disk budget below a chunk per core, `concurrency` tasks."""
    units = [_unit(p, 0, 400_000) for p in range(400)] + [_unit(400, g, 200 << 20) for g in range(6)]
    slots = rewrite_slots(units, concurrency=2, parallelism=2)
    assert sorted((u.partition_index, u.groups[0].group_id) for s in slots for u in s) == sorted(
        (u.partition_index, u.groups[0].group_id) for u in units)
    hot = [s for s in slots if any(u.partition_index == 400 for u in s)]
    assert len(hot) == 6 and all(len(s) == 1 for s in hot)
    assert len(slots) - 6 <= -(-400 * (400_000 + OPEN_COST_BYTES) // MAX_TASK_BYTES)
    assert len(rewrite_slots(units[:8], concurrency=2, parallelism=2)) <= 8
    assert len(rewrite_slots(units, concurrency=1, parallelism=2)) == 1


def test_the_fused_job_takes_one_chunk_partitions_a_task_can_fold_when_every_core_has_a_slot() -> None:
    """`compaction.spark.fused.fits`: partitions of one chunk each, packed into at least as many slots as cores,
    each partition's segments within a scan task's bytes and records; otherwise the one job shuffles."""
    def segments(partition: int, n: int, size: int = 2**20, offsets: int = 1000) -> list[SegmentScanTask]:
        return [SegmentScanTask("t", partition, f"s{partition}-{i}", f"k{partition}-{i}", i * offsets, size=size,
                                offsets=offsets) for i in range(n)]

    scans = segments(0, 3) + segments(1, 3)
    assert fits([[_unit(0, 0, 3)], [_unit(1, 0, 3)]], scans, parallelism=2)
    assert not fits([[_unit(0, 0, 3), _unit(1, 0, 3)]], scans, parallelism=2)  # one slot: a core would idle (and
    # the partition `spread` would cut has scans in no unit)
    assert not fits([[_unit(0, 0, 3)], [_unit(0, 1, 3)]], segments(0, 3), parallelism=2)  # scans in no chunk
    big = segments(0, 2, size=SCAN_TASK_BYTES // 2 + 1) + segments(1, 1)
    assert not fits([[_unit(0, 0, 3)], [_unit(1, 0, 3)]], big, parallelism=2)  # over a scan task's bytes
    many = segments(0, 2, offsets=SCAN_TASK_RECORDS // 2 + 1) + segments(1, 1)
    assert not fits([[_unit(0, 0, 3)], [_unit(1, 0, 3)]], many, parallelism=2)  # over its records


def _chunk(index: int, group_id: int, scans: list[SegmentScanTask]) -> RewriteUnit:
    """A rewrite unit of partition `index` whose inputs are `scans`' segments."""
    inputs = tuple(InputSegment(s.segment_id, s.start_offset, s.start_offset + s.offsets - 1, {}, s.size)
                   for s in scans)
    task = PartitionTask("t", "id", index, 10, 0, 0, 4096, (), {}, ())
    return RewriteUnit(index, task, (GroupTask(group_id, inputs[0].start_offset, inputs[-1].end_offset, inputs),))


def test_the_fused_job_takes_a_partition_of_several_chunks_whose_folds_its_tasks_can_merge() -> None:
    """A hot partition cut into chunks of slots of their own is fused too (each chunk's task folds its own
    segments, the folds are exchanged packed): as long as the partition's offsets stay within `FOLD_RECORDS` (each
    merging task holds a row per key of the partition), each chunk's segments within a scan task's bytes, and every
    scanned segment is an input of one of its chunks."""
    def segments(n: int, size: int = 2**20, offsets: int = 1000) -> list[SegmentScanTask]:
        return [SegmentScanTask("t", 0, f"s{i}", f"k{i}", i * offsets, size=size, offsets=offsets) for i in range(n)]

    scans = segments(4)
    assert fits([[_chunk(0, 0, scans[:2])], [_chunk(0, 1, scans[2:])]], scans, parallelism=2)
    assert fits([[_chunk(0, 0, scans[:1])], [_chunk(0, 1, scans[1:3])], [_chunk(0, 2, scans[3:])]], scans, 2)
    assert not fits([[_chunk(0, 0, scans[:2])], [_chunk(0, 1, scans[2:3])]], scans, 2)  # s3 is in no chunk
    many = segments(4, offsets=FOLD_RECORDS // 4 + 1)
    assert not fits([[_chunk(0, 0, many[:2])], [_chunk(0, 1, many[2:])]], many, 2)  # the merge's keys
    big = segments(3, size=SCAN_TASK_BYTES // 2 + 1)
    assert not fits([[_chunk(0, 0, big[:2])], [_chunk(0, 1, big[2:])]], big, 2)  # a chunk over a scan task
    assert fits([[_chunk(0, 0, big[:1])], [_chunk(0, 1, big[1:2])], [_chunk(0, 2, big[2:])]], big, 2)


@pytest.mark.parametrize("strategy", [CompactionStrategy.OFFSET, CompactionStrategy.HEADER])
def test_a_partition_of_one_unit_is_folded_by_every_core_when_the_slots_are_fewer(
        strategy: CompactionStrategy) -> None:
    """`spread`: with fewer rewrite slots than cores, the largest partitions of one unit are cut into fold parts
    (at most a part per segment) until every core has a task; `exchange_plan` gives each part after the first a
    task of its own after the slots', folding that part and sending its fold to the unit's slot, which merges
    every part and rewrites the unit in the second stage. A partition of one segment cannot be cut; with every
    core a slot, nothing is; nor is a partition whose segments the run does not cache (its rewrite would fetch
    them again). The merge's bounds hold as for a partition of several units."""
    hot = [SegmentScanTask("t", 0, f"h{i}", f"kh{i}", i * 100, size=10, offsets=100, cache=True) for i in range(4)]
    one = [SegmentScanTask("t", 1, "o0", "ko0", 0, size=50, offsets=100, cache=True)]
    unit, single = _chunk(0, 0, hot), _chunk(1, 0, one)
    assert spread([[unit]], [replace(s, cache=False) for s in hot], 2) == {}
    index_of = {TopicPartition("t", 0): 0, TopicPartition("t", 1): 1}
    assert spread([[unit, single]], hot + one, 2) == {0: 2}  # the larger partition of one segment is not cut
    assert spread([[unit, single]], hot + one, 4) == {0: 4}
    assert spread([[unit, single]], hot + one, 8) == {0: 4}  # a part per segment at most
    assert spread([[unit], [single]], hot + one, 2) == {} == spread([[single]], one, 2)
    assert fits([[unit, single]], hot + one, 2) and fits([[unit]], hot, 4)
    assert not fits([[unit]], hot, 5) and not fits([[single]], one, 2)  # a core would idle
    many = [SegmentScanTask("t", 0, f"h{i}", f"kh{i}", i * FOLD_RECORDS, size=10, offsets=FOLD_RECORDS // 2 + 1,
                            cache=True) for i in range(2)]
    assert not fits([[_chunk(0, 0, many)]], many, 2)  # the merge's keys
    keys = slot_keys(3)
    stage_one, merges = exchange_plan([[unit, single]], hot + one, index_of, {0: strategy, 1: strategy}, keys,
                                      cut=spread([[unit, single]], hot + one, 3))
    (f0, f_single), (f1,), (f2,) = stage_one
    assert (f_single.unit, f_single.send_to) == (single, None)  # folded and rewritten at once
    assert [[d.segment_id for d in f.segments] for f in (f0, f1, f2)] == [["h0", "h1"], ["h2"], ["h3"]]
    assert all(f.unit is unit and f.send_to == (keys[0],) and f.offsets_to == () and not f.hold
               for f in (f0, f1, f2))
    assert len({f0.chunk, f1.chunk, f2.chunk}) == 3
    assert [(m.unit, m.chunks) for m in merges[0]] == [(unit, {f0.chunk, f1.chunk, f2.chunk})] and len(merges) == 1


def test_under_offset_a_chunk_needs_only_the_parts_reaching_it() -> None:
    """`_needs`: a record is beaten under `offset` only by a later one of its key, so a chunk's winners follow
    from the folds of the parts that reach its first offset; under a ranked strategy from every part's."""
    scans = [SegmentScanTask("t", 0, f"s{i}", f"k{i}", i * 100, size=1, offsets=100) for i in range(3)]
    first, _second, third = (_chunk(0, i, [s]) for i, s in enumerate(scans))
    ends = [100, 200, None]  # the parts [0, 100), [100, 200), [200, ...)
    assert [_needs(first, end, CompactionStrategy.OFFSET) for end in ends] == [True] * 3
    assert [_needs(third, end, CompactionStrategy.OFFSET) for end in ends] == [False, False, True]
    assert all(_needs(third, end, s) for end in ends for s in (CompactionStrategy.TIMESTAMP, CompactionStrategy.HEADER))


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=30), st.integers(1, 8))
def test_fold_parts_are_consecutive_runs_of_about_equal_bytes(sizes: list[int], n: int) -> None:
    """`_parts`: min(n, segments) runs, none empty, in offset order, together every segment once; no run holds
    more than its share of the bytes plus one segment."""
    scans = [SegmentScanTask("t", 0, f"s{i}", f"k{i}", i * 10, size=b, offsets=10) for i, b in enumerate(sizes)]
    parts = _parts(list(reversed(scans)), n)
    assert len(parts) == min(n, len(scans)) and all(parts)
    assert [s for p in parts for s in p] == scans
    share = sum(sizes) / len(parts)
    assert all(sum(s.size for s in p) <= share + max(sizes) for p in parts)


def test_packed_folds_merge_into_the_winners_of_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk's fold travels packed (`pack_fold`: Arrow IPC pieces of at most `PIECE_KEYS` keys, one empty piece for
    an empty fold) and the merge of the pieces of every chunk (`merged_folds`) gives each key's winner as one fold of
    all the rows would."""
    from compaction.strategies.keyfold import KeyFold

    monkeypatch.setattr(packed_fold, "PIECE_KEYS", 1000)

    rng = np.random.default_rng(5)
    keys = [b"k%d" % k for k in rng.integers(0, 3000, 20_000)]
    version = rng.integers(0, 50, 20_000)
    has_version = (rng.random(20_000) < 0.8).astype(np.int8)
    offsets = np.arange(20_000, dtype=np.int64)
    whole = KeyFold()
    whole.add(pa.array(keys, pa.binary()), has_version, version, offsets, True)
    parts = []
    for lo, hi in ((0, 7000), (7000, 7000), (7000, 20_000)):
        fold = KeyFold()
        fold.add(pa.array(keys[lo:hi], pa.binary()), has_version[lo:hi], version[lo:hi], offsets[lo:hi], True)
        parts.append(list(pack_fold(fold.result(), ranked=True)))
    assert [len(p) for p in parts] == [3, 1, 3]  # 2.7 k keys in the first chunk's fold, none in the second's
    monkeypatch.setattr(packed_fold, "PIECE_KEY_BYTES", 2000)  # and pieces cut by their keys' bytes
    fold = KeyFold()
    fold.add(pa.array(keys, pa.binary()), has_version, version, offsets, True)
    assert len(cut := list(pack_fold(fold.result(), ranked=True))) > 3
    assert sorted(merged_folds(cut).tolist()) == sorted(whole.offsets().tolist())
    pieces = [b for p in parts for b in p]
    assert sorted(merged_folds(pieces).tolist()) == sorted(whole.offsets().tolist())
    zeros = np.zeros(20_000, np.int8), np.zeros(20_000, np.int64)  # `offset`'s rank: its folds travel without it
    by_offset = KeyFold()
    by_offset.add(pa.array(keys, pa.binary()), *zeros, offsets, True)
    halves = [KeyFold(), KeyFold()]
    halves[0].add(pa.array(keys[:9000], pa.binary()), zeros[0][:9000], zeros[1][:9000], offsets[:9000], True)
    halves[1].add(pa.array(keys[9000:], pa.binary()), zeros[0][9000:], zeros[1][9000:], offsets[9000:], True)
    light = [b for h in halves for b in pack_fold(h.result(), ranked=False)]
    assert pa.ipc.open_stream(light[0]).schema.names == ["key", "offset"]
    assert sorted(merged_folds(light).tolist()) == sorted(by_offset.offsets().tolist())
    alone = pack_offsets(whole.offsets())  # a chunk that needs no other's fold gets its winners alone
    assert merged_folds([alone]).tolist() == whole.offsets().tolist()


def test_folds_written_to_files_merge_as_their_packed_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """In Spark local mode the fused job hands folds on as files (`write_fold`, `write_offsets`: one Arrow IPC
    stream of batches of at most `PIECE_KEYS` keys each, renamed into place), which the second stage maps
    (`read_packed`): merged, they give what the same folds' packed pieces give, an empty fold included; nothing but
    the file is left in its directory."""
    from compaction.strategies.keyfold import KeyFold

    monkeypatch.setattr(packed_fold, "PIECE_KEYS", 1000)
    rng = np.random.default_rng(6)
    keys = [b"k%d" % k for k in rng.integers(0, 3000, 20_000)]
    version, has_version = rng.integers(0, 50, 20_000), (rng.random(20_000) < 0.8).astype(np.int8)
    offsets = np.arange(20_000, dtype=np.int64)
    for ranked in (True, False):
        rank = (has_version, version) if ranked else (np.zeros(20_000, np.int8), np.zeros(20_000, np.int64))
        folds = []
        for lo, hi in ((0, 7000), (7000, 7000), (7000, 20_000)):
            fold = KeyFold()
            fold.add(pa.array(keys[lo:hi], pa.binary()), rank[0][lo:hi], rank[1][lo:hi], offsets[lo:hi], True)
            folds.append(fold)
        pieces = [b for f in folds for b in pack_fold(f.result(), ranked)]
        directory = tmp_path / f"folds-{ranked}"
        for i, f in enumerate(folds):
            packed_fold.write_fold(directory / f"fold-{i}.arrow", f.result(), ranked)
        assert sorted(p.name for p in directory.iterdir()) == ["fold-0.arrow", "fold-1.arrow", "fold-2.arrow"]
        mapped = [packed_fold.read_packed(directory / f"fold-{i}.arrow") for i in range(3)]
        assert len(pa.ipc.open_stream(mapped[2]).read_all().to_batches()) == 3  # 2.7 k keys, pieces of 1,000
        assert merged_folds(mapped).tolist() == merged_folds(pieces).tolist()
        assert merged_folds([mapped[1]]).tolist() == []
        packed_fold.write_offsets(directory / "offsets-2.arrow", folds[2].offsets())
        assert merged_folds([packed_fold.read_packed(directory / "offsets-2.arrow")]).tolist() == \
            folds[2].offsets().tolist()
    gone = tmp_path / "folds-True" / "fold-7.arrow"  # the run's cache directory removed under the job: a clear error
    with pytest.raises(RuntimeError, match=f"fold of part 7 .* wrote to {gone} is gone"):
        fused_job._read_fold(str(gone), 7)


@pytest.mark.parametrize("strategy", list(CompactionStrategy))
def test_the_exchange_sends_each_chunks_fold_where_it_is_needed(strategy: CompactionStrategy) -> None:
    """`exchange_plan` for a hot partition of two chunks (slots 0 and 1) beside a small one (slot 0 too): the small
    partition is folded and rewritten at once; under `offset` the first chunk's fold goes to its own slot only, the
    second's whole to the first chunk's slot and its winners alone to its own (it needs no other fold); under a
    ranked strategy both folds go whole to both slots. Every segment is folded by exactly one task."""
    hot = [SegmentScanTask("t", 0, f"h{i}", f"kh{i}", i * 100, size=10, offsets=100) for i in range(4)]
    small = [SegmentScanTask("t", 1, "s0", "ks0", 0, size=1, offsets=100)]
    first, second, alone = _chunk(0, 0, hot[:2]), _chunk(0, 1, hot[2:]), _chunk(1, 0, small)
    index_of = {TopicPartition("t", 0): 0, TopicPartition("t", 1): 1}
    keys = slot_keys(2)
    stage_one, merges = exchange_plan([[first, alone], [second]], hot + small, index_of, {0: strategy, 1: strategy},
                                      keys)
    (f0, f_small), (f1,) = stage_one
    assert (f_small.unit, f_small.send_to, [d.segment_id for d in f_small.segments]) == (alone, None, ["s0"])
    assert (f_small.hold, f_small.held) == (True, 1) and (f0.hold, f0.held) == (False, 0)  # `units_in_flight` counts it
    assert [d.segment_id for d in f0.segments] == ["h0", "h1"] and [d.segment_id for d in f1.segments] == ["h2", "h3"]
    if strategy is CompactionStrategy.OFFSET:
        assert (f0.send_to, f0.offsets_to) == ((keys[0],), ())
        assert (f1.send_to, f1.offsets_to) == ((keys[0],), (keys[1],))
    else:
        assert (f0.send_to, f0.offsets_to) == (tuple(sorted(keys)), ()) == (f1.send_to, f1.offsets_to)
    assert [m.unit for m in merges[0]] == [first] and [m.unit for m in merges[1]] == [second]
    assert merges[0][0].chunks == {f0.chunk, f1.chunk}
    assert merges[1][0].chunks == ({f1.chunk} if strategy is CompactionStrategy.OFFSET else {f0.chunk, f1.chunk})
    uneven, _ = exchange_plan([[_chunk(0, 0, hot[:1])], [_chunk(0, 1, hot[1:])]], hot, index_of, {0: strategy}, keys)
    assert [[d.segment_id for d in f.segments] for (f,) in uneven] == [["h0", "h1"], ["h2", "h3"]]  # by bytes
    if strategy is CompactionStrategy.OFFSET:  # the second chunk starts inside the first part: it needs both
        assert uneven[0][0].send_to == tuple(sorted(keys)) and uneven[0][0].offsets_to == ()
    assert exchange_plan([[alone], [_chunk(2, 0, small)]], small, index_of | {TopicPartition("t", 2): 2},
                         {1: strategy, 2: strategy}, keys)[1] == {}  # every partition one unit: one stage


def test_a_partition_of_one_unit_is_held_whatever_its_size_on_a_store_that_maps_its_objects() -> None:
    """Above `HELD_BYTES` a partition's segments go through the run's disk cache on S3; on a local store
    (`mapped`) they are mapped, so the task holds them from its scan to its rewrite and caches none."""
    big = [SegmentScanTask("t", 0, f"b{i}", f"kb{i}", i * 100, size=HELD_BYTES, offsets=100, cache=True)
           for i in range(3)]
    unit, index_of, keys = _chunk(0, 0, big), {TopicPartition("t", 0): 0}, slot_keys(2)
    for mapped, held in ((False, 0), (True, 3 * HELD_BYTES)):
        ((f,),), _ = exchange_plan([[unit]], big, index_of, {0: CompactionStrategy.OFFSET}, keys, mapped)
        assert (f.hold, f.held, [d.cache for d in f.segments]) == (bool(held), held, [not held] * 3)


def test_a_task_on_s3_works_on_as_many_held_partitions_at_once_as_its_byte_budget_holds() -> None:
    """Small partitions: as many at once as the S3 client has connections; partitions of `HELD_BYTES`: four, as
    before the budget; never more than the task has, never none; at most one (a local store's) is one at a time."""
    assert units_in_flight([120_000] * 200) == UNITS_IN_FLIGHT == S3_PUT_THREADS == 32
    assert units_in_flight([HELD_BYTES] * 200) == HELD_IN_FLIGHT_BYTES // HELD_BYTES == 4
    assert units_in_flight([18 << 20] * 2) == 2
    assert units_in_flight([120_000] * 100 + [HELD_BYTES]) == 4  # counted at its largest
    assert units_in_flight([]) == 1
    assert units_in_flight([1 << 30] * 3) == 1
    assert units_in_flight([120_000] * 200, most=1) == 1
    for sizes in ([5] * 7, [HELD_BYTES // 3] * 40, [0] * 50):
        n = units_in_flight(sizes)
        assert 1 <= n <= min(len(sizes) or 1, UNITS_IN_FLIGHT) and n * max(sizes) <= HELD_IN_FLIGHT_BYTES


@pytest.mark.parametrize(("held", "units", "bound"), [(HELD_BYTES, 12, 4), (120_000, 48, UNITS_IN_FLIGHT)])
def test_a_task_holds_no_more_partitions_at_once_than_its_budget_while_they_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: int, units: int, bound: int) -> None:
    """`_FusedTask._at_once`, each unit's scan and rewrite held open a while, on the process's pool of 32 threads:
    units of `HELD_BYTES` never run more than 4 at once (`HELD_IN_FLIGHT_BYTES` of held bytes), small ones up to 32;
    every outcome comes back, in order."""
    task = object.__new__(fused_job._FusedTask)
    task.settings, task.tracker, task.in_flight = None, None, UNITS_IN_FLIGHT
    monkeypatch.setattr(fused_job, "ScanTask", lambda *args: None)
    lock, running, peak = threading.Lock(), [0], [0]

    def fold(scan: object, store: object, segments: object, keyfold: object, kept: object) -> SimpleNamespace:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        return SimpleNamespace(offsets=lambda: None)

    def rewrite(store: object, unit: RewriteUnit, slot: int, offsets: object, kept: object) -> RewriteUnit:
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return unit

    monkeypatch.setattr(task, "_fold", fold)
    monkeypatch.setattr(fused_job, "run_unit", rewrite)
    work = [FusedUnit(_chunk(p, 0, [SegmentScanTask("t", p, "s", "k", 0, size=held, offsets=1)]), (), hold=True,
                      held=held) for p in range(units)]
    at_once = units_in_flight([f.held for f in work], task.in_flight)
    assert at_once == bound
    outcomes = task._at_once(open_store(str(tmp_path)), 0, work, at_once)
    assert outcomes == [f.unit for f in work]
    assert peak[0] <= bound and (peak[0] > 4 if bound > 4 else peak[0] >= 2), peak


def test_the_exchange_plan_indexes_the_runs_segments_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of many small partitions describes each partition's segments alone, against one index of the run's
    segments (built per partition, 10,000 partitions cost 10,000 x 10,000 dict entries: 13.5 s of a 73 s run)."""
    calls = []
    real = scan_module.positions
    for module in (fused_job, scan_module):  # the fused plan's own index, and any `describe` builds
        monkeypatch.setattr(module, "positions", lambda scans: (calls.append(len(scans)), real(scans))[1])
    scans = [SegmentScanTask("t", p, f"s{p}", f"k{p}", 0, size=1, offsets=100) for p in range(300)]
    index_of = {TopicPartition("t", p): p for p in range(300)}
    slots = [[_chunk(p, 0, [scans[p]]) for p in range(q, 300, 2)] for q in range(2)]
    stage_one, merges = exchange_plan(slots, scans, index_of, dict.fromkeys(range(300), CompactionStrategy.OFFSET),
                                      slot_keys(2))
    assert calls == [300] and merges == {}
    assert [[d.seg for d in f.segments] for f in stage_one[1][:3]] == [[1], [3], [5]]


def test_expected_keys_follow_the_falling_rate_of_new_keys_and_never_shrink_the_table() -> None:
    """Keys drawn again from a fixed set (new keys falling by a ratio a segment), every key new (a linear rate),
    and the cases with nothing to go by (no keys in the first segment, none new in the second, none left)."""
    rng = np.random.default_rng(5)
    draws = rng.integers(0, 300_000, 24 * 50_000)  # 24 segments of 50 k records over 300 k keys
    seen = [len(np.unique(draws[:(i + 1) * 50_000])) for i in range(24)]
    got = expected_keys(seen[0], seen[1], 22)
    assert seen[-1] <= got <= 1.3 * seen[-1] * RESERVE_MARGIN, (seen[-1], got)
    assert expected_keys(100, 200, 6) == int(800 * RESERVE_MARGIN)  # every key new: 100 more a segment
    assert expected_keys(0, 500, 6) == 500 and expected_keys(500, 500, 6) == 500 and expected_keys(300, 500, 0) == 500
