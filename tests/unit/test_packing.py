"""How work is packed into Spark tasks by bytes (`compaction.packing`): every item in exactly one task, no task over
its budget unless one item is, few tasks for many tiny items, a large item alone, and the same answer every time."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compaction.packing import MAX_TASK_BYTES, OPEN_COST_BYTES, TASKS_PER_CORE, pack, pack_for, task_budget, weights

SIZES = st.lists(st.integers(0, 3 * MAX_TASK_BYTES), max_size=300)


@given(SIZES, st.integers(1, 4 * MAX_TASK_BYTES), st.integers(0, 8 << 20))
def test_every_item_in_one_task_and_no_task_over_budget_unless_one_item_is(sizes: list[int], budget: int,
                                                                           open_cost: int) -> None:
    tasks = pack(sizes, budget, open_cost=open_cost)
    assert sorted(i for t in tasks for i in t) == list(range(len(sizes)))
    weight = weights(sizes, open_cost)
    for t in tasks:
        assert t and (sum(weight[i] for i in t) <= budget or len(t) == 1)
        assert t == sorted(t)
    assert [t[0] for t in tasks] == sorted(t[0] for t in tasks)


@given(SIZES, st.integers(1, 4 * MAX_TASK_BYTES))
def test_first_fit_leaves_no_two_tasks_that_would_fit_in_one(sizes: list[int], budget: int) -> None:
    """First fit: an item opened a new task only when no earlier one had room for it, so any two tasks together
    weigh more than the budget, and the tasks are fewer than twice the total over the budget, plus one."""
    tasks = pack(sizes, budget)
    weight = weights(sizes)
    loads = [sum(weight[i] for i in t) for t in tasks]
    assert all(a + b > budget for i, a in enumerate(loads) for b in loads[i + 1:])
    assert len(tasks) <= 2 * -(-sum(weight) // budget) + 1


@given(SIZES, st.integers(1, 64))
def test_packing_is_a_function_of_the_sizes(sizes: list[int], parallelism: int) -> None:
    assert pack_for(sizes, parallelism) == pack_for(list(sizes), parallelism)


@given(st.integers(1, 10_000), st.integers(0, 1 << 20), st.integers(1, 64))
def test_tiny_items_make_a_few_tasks_per_core_whatever_their_count(count: int, size: int, parallelism: int) -> None:
    """Equal tiny items (partitions of a few hundred KB each): as many to a task as its budget holds, so about
    `TASKS_PER_CORE` tasks a core, or one per `MAX_TASK_BYTES` of weight, never one per item once they outnumber
    the cores' tasks (a budget holding 1.9 items holds one: up to twice the tasks the share per core asks for)."""
    tasks = pack_for([size] * count, parallelism)
    weight = size + OPEN_COST_BYTES
    per_task = max(1, task_budget([size] * count, parallelism) // weight)
    assert len(tasks) == -(-count // per_task)
    assert len(tasks) <= max(2 * TASKS_PER_CORE * parallelism, count * weight // (MAX_TASK_BYTES - weight) + 1)


def test_a_hot_partition_cut_into_chunks_still_spreads_over_the_cores() -> None:
    """One partition of eight 200 MB chunks beside 400 partitions of 0.4 MB: each chunk takes a task of its own, the
    small ones share a few."""
    hot = [200 << 20] * 8
    sizes = hot + [400_000] * 400
    tasks = pack_for(sizes, 2)
    assert [t for t in tasks if t[0] < 8] == [[i] for i in range(8)]
    assert len(tasks) - 8 <= -(-400 * (400_000 + OPEN_COST_BYTES) // MAX_TASK_BYTES)


def test_the_budget_is_the_share_of_a_core_within_the_open_cost_and_the_cap() -> None:
    assert task_budget([], 2) == OPEN_COST_BYTES
    assert task_budget([0] * 4, 2) == OPEN_COST_BYTES  # four tiny items on four task slots: one each
    assert task_budget([10 << 20] * 4, 1) == 2 * ((10 << 20) + OPEN_COST_BYTES)
    assert task_budget([1 << 30] * 4, 2) == MAX_TASK_BYTES
    assert pack([5, 5, 5], 12, open_cost=2) == [[0], [1], [2]]
    assert pack([5, 5, 5], 12, open_cost=0) == [[0, 1], [2]]
    assert pack([1, 9, 2, 8], 10, open_cost=0) == [[0, 1], [2, 3]]
    assert pack([], 10) == []


def test_a_thousand_small_partitions_take_a_few_tasks_per_core_and_large_ones_keep_theirs() -> None:
    """The open cost is what a small partition's own work costs (~5 ms, ~0.4 MB at a core's compaction speed), not a
    file open's 4 MiB: P11's 1,000 partitions of 0.12 MB on 2 cores take about `TASKS_PER_CORE` tasks a core (33 at
    4 MiB, each paying a task's fixed cost), while 8 partitions of 18 MB and P2's 40 segments of 32 MiB are packed as
    they were."""
    assert len(pack_for([118_400] * 1000, 2)) <= 2 * TASKS_PER_CORE + 1
    assert len(pack_for([17_600_000] * 8, 2)) == 4
    assert len(pack_for([32 << 20] * 40, 2)) == 14
