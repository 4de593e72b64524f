"""Producer state snapshots (`<nextOffset>.snapshot`) and the producer state they record.

Kafka writes them with `ProducerStateManager.writeSnapshot`.

Layout: version int16 (= 1) | crc uint32 | count int32 | count × 46-byte entries (producerId int64,
epoch int16, lastSequence int32, lastOffset int64, offsetDelta int32, timestamp int64,
coordinatorEpoch int32, currentTxnFirstOffset int64). The CRC-32C covers bytes [6, end): the count and
the entries. Kafka checks the version, then the CRC; this reader also requires the size to match the count.

`producer_state_from_batches` replays batches the way log recovery does (`ProducerAppendInfo` with origin
REPLICATION: no sequence or epoch validation), keeping only what a snapshot stores, i.e. the last batch of
each producer. It is how generated log dirs get their snapshots and the fallback when none exists.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from compaction.errors import CorruptBatchError, CorruptIndexError, CorruptInputError
from compaction.format.batch import (
    NO_PRODUCER_EPOCH,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    RecordBatch,
    crc32c,
    decode_batch,
    increment_sequence,
)
from compaction.format.control import ControlType, parse_control_record
from compaction.format.segment import BatchHeader, iter_batch_headers

SNAPSHOT_VERSION = 1
VERSION_OFFSET = 0
CRC_OFFSET = VERSION_OFFSET + 2
COUNT_OFFSET = CRC_OFFSET + 4  # also where the CRC-covered bytes start (PRODUCER_ENTRIES_OFFSET)
ENTRIES_OFFSET = COUNT_OFFSET + 4
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000

_HEADER = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")
ENTRY_SIZE = _ENTRY.size  # 46
assert _HEADER.size == ENTRIES_OFFSET

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class ProducerStateEntry:
    """One producer's snapshot entry. The defaults are Kafka's `ProducerStateEntry.empty`.

    `last_offset` is the last data offset (−1 once an epoch bump cleared the batch metadata), `timestamp`
    the last batch's maxTimestamp or the last marker's timestamp, `current_txn_first_offset` −1 when no
    transaction is open.
    """

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_sequence: int = NO_SEQUENCE
    last_offset: int = -1
    offset_delta: int = 0
    timestamp: int = NO_TIMESTAMP
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1

    @property
    def has_open_txn(self) -> bool:
        return self.current_txn_first_offset >= 0


# --- snapshot file ---------------------------------------------------------------------------------


def read_producer_snapshot(data: Buffer, obj: str | None = None) -> list[ProducerStateEntry]:
    """Parse a `.snapshot` image, in file order.

    Raises CorruptIndexError naming `obj` and a byte position: a short header (at the end), an unknown
    version (0), a CRC-32C mismatch (2), a negative count (6), or a size that disagrees with the count.
    """
    name = obj or "<producer snapshot>"
    if len(data) < ENTRIES_OFFSET:
        raise CorruptIndexError(
            f"{len(data)} bytes, too few for the {ENTRIES_OFFSET}-byte header", obj=name, position=len(data)
        )
    version, crc, count = _HEADER.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptIndexError(
            f"unknown snapshot version {version}, expected {SNAPSHOT_VERSION}",
            obj=name,
            position=VERSION_OFFSET,
        )
    computed = crc32c(memoryview(data)[COUNT_OFFSET:])
    if crc != computed:
        raise CorruptIndexError(
            f"CRC-32C mismatch: stored {crc}, computed {computed}", obj=name, position=CRC_OFFSET
        )
    if count < 0:
        raise CorruptIndexError(f"negative entry count {count}", obj=name, position=COUNT_OFFSET)
    expected = ENTRIES_OFFSET + count * ENTRY_SIZE
    if len(data) != expected:
        raise CorruptIndexError(
            f"{count} entries need {expected} bytes, the snapshot has {len(data)}",
            obj=name,
            position=min(len(data), expected),
        )
    return [ProducerStateEntry(*fields) for fields in _ENTRY.iter_unpack(memoryview(data)[ENTRIES_OFFSET:])]


def encode_producer_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    """Serialise entries in the given order with a fresh CRC-32C (`ProducerStateManager.writeSnapshot`)."""
    items = list(entries)
    body = struct.pack(">i", len(items)) + b"".join(
        _ENTRY.pack(
            e.producer_id,
            e.producer_epoch,
            e.last_sequence,
            e.last_offset,
            e.offset_delta,
            e.timestamp,
            e.coordinator_epoch,
            e.current_txn_first_offset,
        )
        for e in items
    )
    return struct.pack(">hI", SNAPSHOT_VERSION, crc32c(body)) + body


# --- producer state --------------------------------------------------------------------------------


def producer_state_from_batches(
    batches: Iterable[RecordBatch | BatchHeader],
    initial: Iterable[ProducerStateEntry] = (),
) -> dict[int, ProducerStateEntry]:
    """Producer state after replaying `batches` (in log order) on top of `initial`, keyed and sorted by id.

    Data batches may be headers; control batches must be decoded `RecordBatch`es, because the coordinator
    epoch and timestamp come from the marker record (see `producer_state_from_log`). Batches without a
    producer id are skipped. Raises CorruptInputError for a non-transactional batch inside an open
    transaction or a producer control batch that is not an end-transaction marker (Kafka throws for both).
    Raises ValueError for an undecoded control batch.
    """
    state = {e.producer_id: e for e in initial}
    for batch in batches:
        if batch.producer_id < 0:
            continue
        current = state.get(batch.producer_id, ProducerStateEntry(batch.producer_id))
        if batch.is_control:
            if not isinstance(batch, RecordBatch):
                raise ValueError(
                    f"control batch at offset {batch.base_offset} must be decoded to read its marker"
                )
            state[batch.producer_id] = _apply_marker(current, batch)
        else:
            state[batch.producer_id] = _apply_data(current, batch)
    return dict(sorted(state.items()))


def producer_state_from_log(
    log_bytes: Buffer, obj: str | None = None, initial: Iterable[ProducerStateEntry] = ()
) -> dict[int, ProducerStateEntry]:
    """`producer_state_from_batches` over a segment image, decoding only the control batches."""
    name = obj or "<segment>"
    batches: list[RecordBatch | BatchHeader] = []
    for header in iter_batch_headers(log_bytes, obj=name):
        if header.is_control and header.producer_id >= 0:
            try:
                batches.append(decode_batch(log_bytes, header.position))
            except CorruptInputError as exc:
                raise exc.located(name) if exc.obj is None else exc from None
        else:
            batches.append(header)
    return producer_state_from_batches(batches, initial)


def expire_producers(
    entries: Mapping[int, ProducerStateEntry],
    now_ms: int,
    expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
) -> dict[int, ProducerStateEntry]:
    """Drop the producers Kafka expires: no open transaction and `now − timestamp >= expiration_ms`."""
    return {pid: e for pid, e in entries.items() if e.has_open_txn or now_ms - e.timestamp < expiration_ms}


def open_transactions(entries: Iterable[ProducerStateEntry]) -> dict[int, int]:
    """Producer id → first offset of its open transaction: the `txn_first_offsets` of `build_indexes`."""
    return {e.producer_id: e.current_txn_first_offset for e in entries if e.has_open_txn}


def _apply_data(entry: ProducerStateEntry, batch: RecordBatch | BatchHeader) -> ProducerStateEntry:
    if entry.has_open_txn and not batch.is_transactional:
        raise CorruptBatchError(
            f"non-transactional batch at offset {batch.base_offset} from producer {batch.producer_id}, whose "
            f"transaction opened at {entry.current_txn_first_offset} is still open",
            position=batch.position if isinstance(batch, BatchHeader) else None,
        )
    last_sequence = (
        NO_SEQUENCE
        if batch.base_sequence == NO_SEQUENCE
        else increment_sequence(batch.base_sequence, batch.last_offset_delta)
    )
    txn_first = (
        batch.base_offset
        if batch.is_transactional and not entry.has_open_txn
        else entry.current_txn_first_offset
    )
    return replace(
        entry,
        producer_epoch=batch.producer_epoch,
        last_sequence=last_sequence,
        last_offset=batch.last_offset,
        offset_delta=batch.last_offset_delta,
        timestamp=batch.max_timestamp,
        current_txn_first_offset=txn_first,
    )


def _apply_marker(entry: ProducerStateEntry, batch: RecordBatch) -> ProducerStateEntry:
    if not batch.records:  # the cleaner emptied it: the transaction's data is gone, nothing to complete
        return entry
    record = batch.records[0]
    marker = parse_control_record(record)
    if marker.type not in (ControlType.ABORT, ControlType.COMMIT) or marker.coordinator_epoch is None:
        raise CorruptBatchError(
            f"control batch of producer {batch.producer_id} at offset {batch.base_offset} is a "
            f"{marker.type.name} record, not an end-transaction marker"
        )
    if batch.producer_epoch != entry.producer_epoch:  # an epoch bump clears the batch metadata
        entry = replace(entry, last_sequence=NO_SEQUENCE, last_offset=-1, offset_delta=0)
    return replace(
        entry,
        producer_epoch=batch.producer_epoch,
        coordinator_epoch=marker.coordinator_epoch,
        timestamp=record.timestamp,
        current_txn_first_offset=-1,
    )
