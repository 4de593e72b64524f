"""Plan a run: the metadata table read once, the planner's decisions, and what each partition's round needs.

`plan` returns a frozen `RunPlan`: the planner's output (`compaction.planner`) with the table version it read and
the clock, plus per eligible partition its producer state and aborted transactions (`PartitionInputs`), read
here once so that staging reads nothing of the tier but the segments themselves, and the retention of its
compact,delete partitions (`compaction.retention`): the compaction is planned on the log as that expiry leaves it,
and staging commits the expiry first. Planning writes nothing.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from compaction.config import KcompactConfig
from compaction.errors import ConfigError, CorruptInputError, TransientStoreError
from compaction.format.producer_snapshot import ProducerStateEntry
from compaction.metadata import MetadataSnapshot, PartitionSnapshot, TopicPartition, table_in_store
from compaction.planner import CompactionPlan, build_plan
from compaction.producers import PartitionInputs, aborted_transactions, first_unstable_offset, producer_state
from compaction.retention.plan import RetentionPlan, after_expiry, plan_retention
from compaction.storage.base import ObjectStore, StoreSpec, StoreStats, shared_pool

Unreadable = CorruptInputError | TransientStoreError
"""Why a partition's producer state or txn indexes could not be read: it is quarantined, the others go on."""


@dataclass(frozen=True)
class RunPlan:
    """What a run will do: the planner's output plus where and when it was computed.

    `inputs` holds, per eligible partition, what its round needs besides its segments (read once here);
    `quarantined` the partitions whose producer state or txn indexes could not be read (corrupt, exit 3, or the
    store kept failing, exit 4): held back, reported, while the others run.
    """

    store: StoreSpec
    plan: CompactionPlan
    run_id: str
    writer: str
    disk_budget_bytes: int | None = None  # temporary disk per rewrite chunk; None: free local disk / 3 at stage
    quarantined: tuple[tuple[str, int, Unreadable], ...] = ()
    inputs: Mapping[TopicPartition, PartitionInputs] = field(default_factory=dict)
    retention: RetentionPlan | None = None  # what retention.ms / retention.bytes expire first (compact,delete)
    read: Mapping[TopicPartition, PartitionSnapshot] = field(default_factory=dict, compare=False, repr=False)
    """The eligible partitions as the plan read them (their rows at the version it planned from): staging takes them
    from these rows, without reading them again, while no other commit landed since (`metadata.batch.known_reader`).
    Only the eligible ones are kept: a run holds no more rows than it works on."""
    requests: StoreStats = field(default_factory=StoreStats, compare=False)
    """The plan's own requests to the segments' store: each partition's producer snapshot and the transaction
    indexes of its eligible region, read in the driver (the report's `plan_requests`)."""

    @property
    def now_ms(self) -> int:
        return self.plan.now_ms


def plan(
    store: ObjectStore,
    config: KcompactConfig,
    now_ms: int | None = None,
    *,
    topics: Sequence[str] | None = None,
    partition: int | None = None,
    force: bool = False,
    disk_budget_bytes: int | None = None,
) -> RunPlan:
    """Plan a run from the latest metadata snapshot. Reads the table, producer snapshots and txn indexes.

    `disk_budget_bytes` bounds the temporary disk of each rewrite chunk (default: free local disk / 3 when
    the run is staged); a partition holding a segment larger than it fails with `DiskBudgetError`.
    """
    if disk_budget_bytes is not None and disk_budget_bytes <= 0:
        raise ConfigError(f"--disk-budget-bytes {disk_budget_bytes}: expected a positive number of bytes")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    before = replace(store.stats)
    read = table_in_store(store).snapshot()
    retention = plan_retention(read, config, now, topics=topics, partition=partition)
    snapshot = after_expiry(read, retention)
    unreadable: dict[TopicPartition, Unreadable] = {}
    producers = _producers(store, snapshot, unreadable)
    unstable = {tp: first for tp, entries in producers.items() if (first := first_unstable_offset(entries)) is not None}
    for tp in unreadable:  # hold the whole partition back
        unstable[tp] = snapshot.partitions[tp].live_segments[0].start_offset
    compaction_plan = build_plan(snapshot, config, now, topics=topics, partition=partition, force=force,
                                 first_unstable_offsets=unstable)
    inputs: dict[TopicPartition, PartitionInputs] = {}
    wanted = {p.tp: p.regions.first_uncleanable_offset for p in compaction_plan.eligible
              if p.tp not in unreadable and p.regions is not None}
    for tp, aborted in _each(lambda tp: aborted_transactions(store, snapshot.partitions[tp].live_segments,
                                                             wanted[tp]), wanted, unreadable).items():
        inputs[tp] = PartitionInputs(tuple(producers.get(tp, ())), aborted)
    quarantined = tuple((p.topic, p.partition, unreadable[p.tp])
                        for p in compaction_plan.partitions if p.tp in unreadable)
    notes = tuple(f"{t}-{p} quarantined, not compacted: {e}" for t, p, e in quarantined)
    compaction_plan = replace(compaction_plan, notes=compaction_plan.notes + notes)
    return RunPlan(store.spec, compaction_plan, uuid.uuid4().hex[:12], f"kcompact@{socket.gethostname()}",
                   disk_budget_bytes, quarantined=quarantined, inputs=inputs, retention=retention,
                   read={tp: read.partition(tp.topic, tp.partition) for tp in inputs}, requests=store.stats - before)


PLAN_READ_THREADS = 16
"""Partitions whose producer snapshot (or txn indexes) the plan reads at once: each read is a GET (a round trip on
S3), one per partition, and a plan of 1,000 partitions made them one after the other."""

_T = TypeVar("_T")


def _each(read: Callable[[TopicPartition], _T], partitions: Iterable[TopicPartition],
          unreadable: dict[TopicPartition, Unreadable]) -> dict[TopicPartition, _T]:
    """`read` of every partition, `PLAN_READ_THREADS` at once, in the order given; a partition whose read fails
    (corrupt, or the store kept failing) goes into `unreadable` instead. Any other error is raised."""
    def attempt(tp: TopicPartition) -> _T | Unreadable:
        try:
            return read(tp)
        except (CorruptInputError, TransientStoreError) as exc:
            return exc

    order = list(partitions)
    out: dict[TopicPartition, _T] = {}
    for tp, result in zip(order, shared_pool("plan-reads", PLAN_READ_THREADS).map(attempt, order), strict=True):
        if isinstance(result, (CorruptInputError, TransientStoreError)):
            unreadable[tp] = result
        else:
            out[tp] = result
    return out


def _producers(store: ObjectStore, snapshot: MetadataSnapshot, unreadable: dict[TopicPartition, Unreadable]
               ) -> dict[TopicPartition, list[ProducerStateEntry]]:
    live = {tp: part.live_segments for tp, part in snapshot.partitions.items() if part.live_segments}
    return _each(lambda tp: producer_state(store, live[tp]), live, unreadable)


def first_unstable_offsets(store: ObjectStore, snapshot: MetadataSnapshot) -> dict[TopicPartition, int]:
    """Per partition, the first offset of a transaction that is still open at the end of the tier."""
    found = {tp: first_unstable_offset(entries) for tp, entries in _producers(store, snapshot, {}).items()}
    return {tp: first for tp, first in found.items() if first is not None}


__all__ = ["RunPlan", "first_unstable_offsets", "plan"]
