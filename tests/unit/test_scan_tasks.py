"""How the Spark scan cuts segments into tasks (`compaction.spark.scan.scan_slices`): every segment in
exactly one task, as many tasks as the bytes and cores call for, loads balanced, and the cut is the one
`SparkContext.parallelize` makes of the concatenation (so each task gets exactly its slice). And how the
rewrite tasks get their chunks: one Spark partition per chunk (`slot_keys`), winners split by group."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compaction.run.tasks import GroupTask, SegmentScanTask
from compaction.spark.rewrite_job import split_winners
from compaction.spark.scan import SCAN_TASK_BYTES, scan_slices
from compaction.spark.winners import slot_keys, spark_hash_long


@given(st.lists(st.integers(0, 2 * SCAN_TASK_BYTES), max_size=80), st.integers(1, 16))
def test_slices_cover_every_segment_once_and_match_parallelize(sizes: list[int], parallelism: int) -> None:
    segments = [SegmentScanTask("t", 0, f"s{i}", f"k{i}", i, size=n) for i, n in enumerate(sizes)]
    slices = scan_slices(segments, parallelism)
    flat = [s for part in slices for s in part]
    assert sorted(s.segment_id for s in flat) == sorted(s.segment_id for s in segments)
    n = len(slices)
    assert n == min(len(segments), max(2 * parallelism, -(-sum(sizes) // SCAN_TASK_BYTES)))
    assert [flat[i * len(flat) // n : (i + 1) * len(flat) // n] for i in range(n)] == slices
    if n:
        loads = [sum(s.size for s in part) for part in slices]
        assert all(part for part in slices)
        assert max(loads) - min(loads) <= 2 * max(sizes)  # greedy within the count each slice must hold


def test_forty_small_segments_make_a_few_tasks_not_forty() -> None:
    segments = [SegmentScanTask("t", p, f"s{p}-{i}", f"k{p}-{i}", i, size=2 * 2**20) for p in range(8)
                for i in range(5)]
    assert len(scan_slices(segments, 4)) == 8
    big = [SegmentScanTask("t", 0, f"s{i}", f"k{i}", i, size=SCAN_TASK_BYTES) for i in range(40)]
    assert len(scan_slices(big, 4)) == 40


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
