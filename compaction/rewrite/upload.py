"""Executor side of a partition's rewrite: download each group's segments, rewrite, upload under fresh ids.

The values here (`PartitionTask`, `GroupTask`, `InputSegment`, `ActiveProducer`) are small, frozen and picklable:
the driver builds them from the plan and ships them to the task; the task opens the store from its spec.
Groups are rewritten in offset order because Kafka's transaction-marker state runs across a round's groups.
Every output object gets a new segment id, so nothing an earlier (or concurrent) attempt wrote is ever
overwritten; what is uploaded becomes live only when the driver commits the metadata.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compaction.format.indexes import AbortedTxn
from compaction.rewrite.group import ActiveProducer, SegmentInput, TransactionState, rewrite_group
from compaction.storage.base import ObjectStore
from compaction.storage.layout import Suffix, new_segment_id, segment_object_key

__all__ = ["ActiveProducer", "GroupTask", "InputSegment", "PartitionTask", "rewrite_partition"]


@dataclass(frozen=True)
class InputSegment:
    segment_id: str
    start_offset: int
    end_offset: int
    keys: Mapping[str, str]  # suffix -> object key


@dataclass(frozen=True)
class GroupTask:
    group_id: int
    start_offset: int
    end_offset: int
    inputs: tuple[InputSegment, ...]


@dataclass(frozen=True)
class PartitionTask:
    topic: str
    topic_id: str
    partition: int
    upper_bound_offset: int
    now_ms: int
    delete_retention_ms: int
    index_interval_bytes: int
    aborted: tuple[AbortedTxn, ...]
    active_producers: Mapping[int, ActiveProducer]
    groups: tuple[GroupTask, ...]
    strategy: str = "offset"  # compaction.strategy: the Spark side ranks records with it
    strategy_header: str | None = None


# Companions copied from the group's last member: the producer state and the epoch lineage as of its end,
# which compaction does not change (offsets, sequences and the last batch of every producer are kept).
_CARRIED = (Suffix.PRODUCER_SNAPSHOT, Suffix.LEADER_EPOCH_CHECKPOINT)


def rewrite_partition(
    store: ObjectStore, task: PartitionTask, winners: Mapping[int, Sequence[int]]
) -> list[tuple[int, dict[str, Any]]]:
    """Rewrite every group of `task` in order; returns (group_id, result) per group. Uploads, commits nothing."""
    state = TransactionState.start(task.aborted)
    results = []
    for group in task.groups:
        started = time.monotonic()
        log_keys = [seg.keys[Suffix.LOG.value] for seg in group.inputs]
        inputs = [
            SegmentInput(store.get(key), seg.start_offset, store.object_uri(key))
            for seg, key in zip(group.inputs, log_keys, strict=True)
        ]
        output, state = rewrite_group(
            inputs,
            np.asarray(winners.get(group.group_id, ()), dtype=np.int64),
            upper_bound_offset=task.upper_bound_offset,
            now_ms=task.now_ms,
            delete_retention_ms=task.delete_retention_ms,
            index_interval_bytes=task.index_interval_bytes,
            active_producers=task.active_producers,
            txn_state=state,
        )
        segment_id = new_segment_id()

        def key(suffix: Suffix, sid: str = segment_id, start: int = group.start_offset) -> str:
            return segment_object_key(task.topic, task.topic_id, task.partition, start, sid, suffix)

        objects = {
            Suffix.LOG: output.log,
            Suffix.OFFSET_INDEX: output.offset_index,
            Suffix.TIME_INDEX: output.time_index,
        }
        if output.txn_index:
            objects[Suffix.TXN_INDEX] = output.txn_index
        last = group.inputs[-1]
        for suffix in _CARRIED:
            if suffix.value in last.keys:
                objects[suffix] = store.get(last.keys[suffix.value])
        for suffix, data in objects.items():
            store.put(key(suffix), data)
        stats = output.stats
        results.append(
            (
                group.group_id,
                {
                    "group_id": group.group_id,
                    "segment_id": segment_id,
                    "start_offset": group.start_offset,
                    "end_offset": group.end_offset,
                    "size": len(output.log),
                    "max_timestamp_ms": stats.max_timestamp,
                    "first_batch_max_timestamp_ms": stats.first_batch_max_timestamp,
                    "record_count": stats.records_written,
                    "object_keys": {s.value: key(s) for s in objects},
                    "stats": stats.to_dict(),
                    "seconds": time.monotonic() - started,
                },
            )
        )
    return results
