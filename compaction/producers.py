"""Producer state and aborted transactions of a partition, read from its tier (each once per run).

Kafka's cleaner reads them from the log: `ProducerStateManager` (the active producers, whose last batch is kept,
and the open transactions that bound the last stable offset) and `LogCleaner.collectAbortedTransactions` (the
txn indexes). On the tier they come from the last live segment's producer snapshot and every live segment's txn
index; without a snapshot, the state is replayed from the segments' batch headers and markers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compaction.format.indexes import AbortedTxn, collect_aborted_txns, read_txn_index
from compaction.format.producer_snapshot import (
    ProducerStateEntry,
    expire_producers,
    producer_state_from_log,
    read_producer_snapshot,
)
from compaction.metadata import ObjectSuffix, SegmentMetadata
from compaction.storage.base import ObjectStore
from compaction.storage.indexes import parse_part
from compaction.strategies.retention import ActiveProducer


def producer_state(store: ObjectStore, live: Sequence[SegmentMetadata]) -> list[ProducerStateEntry]:
    """The producer state at the end of the tier.

    From the producer snapshot of the last live segment when it has one (the state at its end, as Kafka's
    RemoteLogManager uploads it), else replayed from the tier itself: every live segment's batch headers and
    markers, in offset order (only control batches are decoded).
    """
    if not live:
        return []
    key = live[-1].object_key(ObjectSuffix.PRODUCER_SNAPSHOT)
    if key is not None:
        return parse_part(store, key, ObjectSuffix.PRODUCER_SNAPSHOT,
                          lambda data, obj: read_producer_snapshot(data, obj=obj))
    state: dict[int, ProducerStateEntry] = {}
    for seg in live:
        log_key = seg.object_key(ObjectSuffix.LOG) or ""
        state = producer_state_from_log(store.get(log_key), obj=store.object_uri(log_key), initial=state.values())
    return list(state.values())


def first_unstable_offset(entries: Sequence[ProducerStateEntry]) -> int | None:
    """The first offset of a transaction still open at the end of the tier, None if none is."""
    open_firsts = [e.current_txn_first_offset for e in entries if e.current_txn_first_offset >= 0]
    return min(open_firsts) if open_firsts else None


def active_producers(entries: Sequence[ProducerStateEntry], now_ms: int, expiration_ms: int
                     ) -> dict[int, ActiveProducer]:
    """The producers not expired at `now_ms`, with the last offset of their last data batch."""
    by_id = {e.producer_id: e for e in entries}
    return {
        pid: ActiveProducer(e.last_offset if e.last_offset >= 0 else None, e.producer_epoch)
        for pid, e in expire_producers(by_id, now_ms, expiration_ms).items()
    }


def aborted_transactions(store: ObjectStore, live: Sequence[SegmentMetadata], upper_bound: int
                         ) -> tuple[AbortedTxn, ...]:
    """Kafka's `collectAbortedTransactions(logStartOffset, upperBound)`: the aborted transactions with data below
    `upper_bound`, read from every live segment's txn index. An ABORT marker may lie above the cleaned range
    (e.g. held back by min.compaction.lag.ms) while its transaction's data is inside it: that entry lives in
    the marker's segment, so reading only the cleaned segments' indexes would keep aborted data as winners."""
    per_segment = []
    for seg in live:
        key = seg.object_key(ObjectSuffix.TXN_INDEX)
        per_segment.append([] if key is None else parse_part(store, key, ObjectSuffix.TXN_INDEX,
                                                             lambda data, obj: read_txn_index(data, obj=obj)))
    start = live[0].start_offset if live else 0
    found = collect_aborted_txns(per_segment, start, upper_bound)
    return tuple(sorted(found, key=lambda t: t.last_offset))


@dataclass(frozen=True)
class PartitionInputs:
    """What a partition's round needs from beyond its segments' records, read once at planning."""

    producers: tuple[ProducerStateEntry, ...]
    aborted: tuple[AbortedTxn, ...] = ()


__all__ = ["PartitionInputs", "aborted_transactions", "active_producers", "first_unstable_offset",
           "producer_state"]
