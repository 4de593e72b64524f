"""How an update of the topic table shares its partitions among tasks (`compaction.tasks.task_groups`): each
partition in exactly one task, at most one task per core and none empty, largest first into the lightest task, so
that no task holds more than an even share plus one partition."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compaction.tasks import task_groups


@given(st.lists(st.integers(0, 1 << 30), max_size=40), st.integers(1, 12))
def test_each_partition_goes_to_one_task_of_at_most_one_per_core(sizes: list[int], parallelism: int) -> None:
    groups = task_groups(sizes, parallelism)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    assert len(groups) == min(len(sizes), parallelism)
    assert all(g and g == sorted(g) for g in groups)
    loads = [sum(sizes[i] for i in g) for g in groups]
    if sizes:
        assert max(loads) <= sum(sizes) / len(groups) + max(sizes)


def test_partitions_of_one_size_are_dealt_evenly_and_a_large_one_keeps_a_task_to_itself() -> None:
    assert task_groups([10] * 8, 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert task_groups([100, 10, 10, 10], 2) == [[0], [1, 2, 3]]
    assert task_groups([5, 5], 8) == [[0], [1]]
    assert task_groups([], 4) == []
