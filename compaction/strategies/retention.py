"""What a batch and its records retain during a clean: Kafka's `checkBatchRetention` and `shouldRetainRecord`.

Kafka's cleaner asks its `RecordFilter` two questions (`Cleaner.cleanInto`): once per batch, *how* the batch is kept
(`BatchRetention`), and then per record, *whether* it is kept. The mechanism (`compaction.rewrite`) asks the
same questions here and never answers them itself. Delete horizons follow KIP-534: the horizon
lives in the batch, tombstones are kept while `now < horizon`, markers are dropped once `horizon <= now`.

Winners replace Kafka's offset map: a record "wins" when its offset is in the sorted array of winning offsets
computed over the whole cleaned range, so Kafka's "beyond the map" and "absent from the map" cases do not
arise (every record of the range was mapped in one pass).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

INT64_MAX = 2**63 - 1


class BatchRetention(Enum):
    """`MemoryRecords.RecordFilter.BatchRetention`."""

    DELETE = "delete"
    """Drop the batch without looking at its records."""
    RETAIN_EMPTY = "retain_empty"
    """Keep the batch; if every record goes, keep its 61-byte empty header (offsets and sequence survive)."""
    DELETE_EMPTY = "delete_empty"
    """Drop the batch only if every record goes."""


@dataclass(frozen=True)
class ActiveProducer:
    """An unexpired producer of the partition (`lastRecordsOfActiveProducers`).

    `last_data_offset` is the last offset of its last data batch, None when its last entry is a marker (or
    its batch metadata was cleared by an epoch bump); `producer_epoch` its current epoch.
    """

    last_data_offset: int | None
    producer_epoch: int


class BatchFacts(Protocol):
    """The header fields the retention rules read; `BatchHeader` and `RecordBatch` both provide them."""

    @property
    def producer_id(self) -> int: ...

    @property
    def producer_epoch(self) -> int: ...

    @property
    def last_offset(self) -> int: ...

    @property
    def next_offset(self) -> int: ...

    @property
    def is_control(self) -> bool: ...

    @property
    def delete_horizon_ms(self) -> int | None: ...


@dataclass(frozen=True)
class BatchDecision:
    """The answer of `check_batch_retention` for one batch.

    `discard_records`: no record of the batch is kept (an aborted transaction's data, or an expired
    discardable marker). `contains_marker_for_empty_txn`: a discardable marker, which gets a delete horizon
    the first time it is kept.
    """

    retention: BatchRetention
    discard_records: bool
    contains_marker_for_empty_txn: bool


def is_last_of_active_producer(batch: BatchFacts, active_producers: Mapping[int, ActiveProducer]) -> bool:
    """True if `batch` is the last entry of an active producer, whose sequence state must survive."""
    if batch.producer_id < 0:
        return False
    entry = active_producers.get(batch.producer_id)
    if entry is None:
        return False
    if entry.last_data_offset is not None:
        return batch.last_offset == entry.last_data_offset
    return batch.is_control and batch.producer_epoch == entry.producer_epoch


def check_batch_retention(
    batch: BatchFacts,
    can_discard: bool,
    *,
    now_ms: int,
    upper_bound_offset: int,
    active_producers: Mapping[int, ActiveProducer],
) -> BatchDecision:
    """Kafka's `checkBatchRetention`, given `can_discard` from the transaction metadata (`CleanedTransactionMetadata`).

    A marker's records are discarded only once it is discardable *and* its horizon has passed
    (`horizon <= now`); a data batch's as soon as it is discardable (aborted). The last batch of an active
    producer and the batch ending at `upper_bound_offset` (KAFKA-17076) are kept, empty if need be.
    """
    if batch.is_control:
        horizon = batch.delete_horizon_ms
        discard = can_discard and horizon is not None and horizon <= now_ms
    else:
        discard = can_discard
    if is_last_of_active_producer(batch, active_producers) or batch.next_offset == upper_bound_offset:
        retention = BatchRetention.RETAIN_EMPTY
    elif discard:
        retention = BatchRetention.DELETE
    else:
        retention = BatchRetention.DELETE_EMPTY
    return BatchDecision(retention, discard, can_discard and batch.is_control)


def retains_deletes(delete_horizon_ms: int | None, now_ms: int) -> bool:
    """Whether a batch's winning tombstones are kept: no horizon yet, or `now < horizon` (KIP-534)."""
    return delete_horizon_ms is None or now_ms < delete_horizon_ms


def should_retain_record(
    decision: BatchDecision,
    batch: BatchFacts,
    *,
    wins: bool,
    has_key: bool,
    has_value: bool,
    now_ms: int,
) -> bool:
    """Kafka's `shouldRetainRecord` with winners in place of the offset map.

    Keyless data records are never kept (the caller counts them as invalid); a control batch's records are
    kept unless the whole batch is discarded.
    """
    if decision.discard_records:
        return False
    if batch.is_control:
        return True
    if not has_key:
        return False
    return wins and (has_value or retains_deletes(batch.delete_horizon_ms, now_ms))


def rebuilt_delete_horizon(
    existing_ms: int | None, needs_horizon: bool, now_ms: int, delete_retention_ms: int
) -> int | None:
    """The horizon a rebuilt batch carries: the existing one (never refreshed), else now + retention if a
    retained tombstone or discardable marker needs one, else none.

    A sum past Long.MaxValue (delete.retention.ms near its maximum) wraps negative in Kafka, and a negative
    horizon is no horizon (`hasDeleteHorizonMs` is `deleteHorizonMs >= 0`): the tombstone stays, unexpiring.
    """
    if existing_ms is not None:
        return existing_ms
    if not needs_horizon or now_ms + delete_retention_ms > INT64_MAX:
        return None
    return now_ms + delete_retention_ms
