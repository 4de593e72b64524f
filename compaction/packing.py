"""Work packed into Spark tasks by bytes: what every job's tasks are formed by.

Spark pays a fixed cost for each task it runs (scheduling, a Python worker's round trip, the task's own setup: a
store session, a temporary directory), whatever the bytes the task then handles. A job with a task per item
(partition, segment, chunk) therefore costs in proportion to the item count: 400 partitions of 0.4 MB took many
times the wall of 8 partitions of 20 MB. So items are packed into tasks by bytes, the way Spark packs files into
read partitions (`spark.sql.files.maxPartitionBytes`, `openCostInBytes`):

- each item weighs its bytes plus `OPEN_COST_BYTES`, what starting on it costs, counted in bytes, so that thousands
  of tiny items do not make one task each, nor one task of thousands;
- a task holds at most `task_budget` of weight: the total over `TASKS_PER_CORE` tasks per core, kept between one
  item's open cost and `MAX_TASK_BYTES`. A few tasks per core even out uneven tasks; the cap keeps a failed task's
  retry small;
- items go largest first into the first task with room (first-fit decreasing); an item above the budget (a hot
  partition's chunk) takes a task of its own, so a partition larger than the budget, cut into several items, still
  spreads over several tasks and cores.

Pure: sizes in, indices out; nothing here knows what an item is.
"""

from __future__ import annotations

from collections.abc import Sequence

OPEN_COST_BYTES = 512 << 10
"""What starting on one item costs, counted in bytes. Measured, not Spark's `spark.sql.files.openCostInBytes` (4 MiB,
a file's open on HDFS): a small partition's own work in a rewrite task (its objects opened, its output and snapshot
written, its report) is ~5 ms, what ~0.4 MB of its bytes take at the ~80 MB/s a core the compaction runs. At 4 MiB,
1,000 partitions of 0.12 MB packed into 33 tasks of 30, whose fixed cost (a Python worker's round trip, a store
session, a temporary directory) the 8-partition run paid 5 times; at 512 KiB they take 5 (BENCHMARKS.md, P11)."""

MAX_TASK_BYTES = 128 << 20
"""The most weight one task takes, unless a single item weighs more (Spark's `spark.sql.files.maxPartitionBytes`
default)."""

TASKS_PER_CORE = 2
"""Tasks per core a job aims at when its work is smaller than `MAX_TASK_BYTES` per task."""


def weights(sizes: Sequence[int], open_cost: int = OPEN_COST_BYTES) -> list[int]:
    """Each item's weight: its bytes (at least 0) plus the open cost."""
    return [max(0, s) + open_cost for s in sizes]


def task_budget(sizes: Sequence[int], parallelism: int, *, open_cost: int = OPEN_COST_BYTES,
                most: int = MAX_TASK_BYTES) -> int:
    """The weight one task may take for items of `sizes` on `parallelism` cores: their total weight over
    `TASKS_PER_CORE` tasks a core, at least one item's open cost and at most `most`. Pure."""
    total = sum(weights(sizes, open_cost))
    share = -(-total // max(1, TASKS_PER_CORE * parallelism))
    return max(1, open_cost, min(most, share))


def pack(sizes: Sequence[int], budget: int, *, open_cost: int = OPEN_COST_BYTES) -> list[list[int]]:
    """Items of `sizes` (bytes) packed into tasks of at most `budget` weight (bytes plus `open_cost` each), first-fit
    decreasing: the heaviest item first, each into the first task with room, else a new task (an item above the
    budget alone). Returns each task's items (indices into `sizes`) in index order, the tasks in the order of their
    first item. Every item is in exactly one task; ties keep index order, so the result is a function of the sizes.
    Pure."""
    weight = weights(sizes, open_cost)
    tasks: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -weight[i]):
        at = next((t for t, load in enumerate(loads) if load + weight[i] <= budget), len(tasks))
        if at == len(tasks):
            tasks.append([])
            loads.append(0)
        tasks[at].append(i)
        loads[at] += weight[i]
    return sorted((sorted(t) for t in tasks), key=lambda t: t[0])


def pack_for(sizes: Sequence[int], parallelism: int, *, open_cost: int = OPEN_COST_BYTES,
             most: int = MAX_TASK_BYTES) -> list[list[int]]:
    """`pack` with the budget `task_budget` gives for `parallelism` cores: the tasks a job runs items of `sizes`
    in. Pure."""
    return pack(sizes, task_budget(sizes, parallelism, open_cost=open_cost, most=most), open_cost=open_cost)


__all__ = ["MAX_TASK_BYTES", "OPEN_COST_BYTES", "TASKS_PER_CORE", "pack", "pack_for", "task_budget", "weights"]
