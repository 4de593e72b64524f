"""The plan's per-partition reads (producer snapshots, txn indexes) run `PLAN_READ_THREADS` at once
(`compaction.run.plan._each`): each is a GET, a round trip on S3, one per partition. What a partition's read raises
is kept per partition, in the order the partitions were given."""

from __future__ import annotations

import threading
import time

import pytest

from compaction.errors import CorruptInputError, TransientStoreError
from compaction.metadata import TopicPartition
from compaction.run import plan as plan_module


def tp(n: int) -> TopicPartition:
    return TopicPartition("t", n)


def test_reads_run_at_once_and_keep_the_partitions_order() -> None:
    inside, most, lock = 0, 0, threading.Lock()

    def read(p: TopicPartition) -> int:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.01)
        with lock:
            inside -= 1
        return p.partition * 10

    order = [tp(n) for n in (5, 1, 9, 3, 7, 0, 2, 8, 6, 4) * 4]
    unreadable: dict = {}
    found = plan_module._each(read, list(dict.fromkeys(order)), unreadable)
    assert list(found) == list(dict.fromkeys(order)) and found[tp(9)] == 90
    assert unreadable == {}
    assert most > 1, "the reads overlapped"


def test_a_partition_whose_read_fails_is_unreadable_and_the_others_are_read() -> None:
    corrupt, gone = CorruptInputError("bad snapshot", obj="s3://b/t-1.snapshot"), TransientStoreError("503 SlowDown")

    def read(p: TopicPartition) -> str:
        if p.partition == 1:
            raise corrupt
        if p.partition == 3:
            raise gone
        return f"state of {p.partition}"

    unreadable: dict = {}
    found = plan_module._each(read, [tp(n) for n in range(5)], unreadable)
    assert found == {tp(0): "state of 0", tp(2): "state of 2", tp(4): "state of 4"}
    assert unreadable == {tp(1): corrupt, tp(3): gone}


def test_any_other_error_is_raised() -> None:
    def read(p: TopicPartition) -> None:
        raise ValueError(f"a bug at {p}")

    with pytest.raises(ValueError, match="a bug"):
        plan_module._each(read, [tp(0), tp(1)], {})
