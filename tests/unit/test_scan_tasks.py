"""How the Spark scan cuts segments into tasks (`compaction.spark.compact.scan_slices`): every segment in
exactly one task, as many tasks as the bytes and cores call for, loads balanced, and the cut is the one
`SparkContext.parallelize` makes of the concatenation (so each task gets exactly its slice). And how the
rewrite task reads its groups' winners (`group_winners`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compaction.bloom.work import SegmentScanTask
from compaction.spark.compact import SCAN_TASK_BYTES, scan_slices


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


def test_group_winners_merge_repeated_groups_straight_from_arrow() -> None:
    import numpy as np
    import pyarrow as pa

    from compaction.spark.compact import group_winners

    groups = pa.table({
        "group_id": pa.array([0, 1, 0, 2, 2], pa.int32()),
        "winners": pa.array([[5, 9], [], [], None, [1, 3]], pa.list_(pa.int64())),
    })
    got = group_winners(groups)
    assert sorted(got) == [0, 1, 2]
    assert got[0].tolist() == [5, 9] and got[1].tolist() == [] and got[2].tolist() == [1, 3]
    assert all(v.dtype == np.int64 for v in got.values())
    split = group_winners(pa.table({"group_id": pa.array([4, 4], pa.int32()),
                                    "winners": pa.array([[7, 8], [2]], pa.list_(pa.int64()))}))
    assert split[4].tolist() == [2, 7, 8]
