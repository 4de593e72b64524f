"""Rewrite one group of consecutive segments into one cleaned segment: Kafka's `Cleaner.cleanSegments`.

Which Kafka rule lives where: docs/cleaner-rules.md.

The winners (one offset per key over the whole cleaned range, decided upstream) say which data records
survive; `compaction.strategies` says what each batch retains; this module only moves bytes:

* every input batch is copied verbatim (byte for byte), rebuilt (`rebuild.py`), written as a 61-byte empty
  header (RETAIN_EMPTY) or dropped, in offset order, so offsets strictly increase and every kept batch keeps
  its base and last offset;
* no Python code runs per record: the counts that decide a data batch's fate come from the columnar scan
  (`facts.py`), changed data batches are re-encoded by a compiled kernel (`records.py`), and only control
  batches (one record each) are decoded in Python;
* no Python code runs per batch of a plain segment (every batch uncompressed, neither transactional nor control,
  none an active producer's last or the round's last, so each one's retention is DELETE_EMPTY): one kernel call
  counts, copies and re-encodes all its batches (`records.rewrite_plain`; the same bytes as the per-batch path,
  property-tested); a segment it cannot take, or one whose bytes it finds wrong, goes batch by batch (which names
  the error);
* the offset and time indexes are rebuilt from the output with `build_indexes`, each kept batch being one
  append. Kafka appends multi-batch chunks of up to its I/O buffer size, so its cleaned indexes are sparser;
  ours follow the same rule (`> index.interval.bytes` since the last entry) at batch granularity;
* the txn index holds the ABORT entries re-indexed in this pass (original entries, lastStableOffset
  included), in marker order;
* every input CRC is verified before anything is written (here, or by the scan of the same task that holds the
  very bytes, `SegmentInput.verified`): Kafka's cleaner never checks CRCs and would copy a corrupt batch
  forward; here it is a CorruptInputError naming the object and byte;
* each batch's counts (keyless records, tombstones, winners) come from one columnar scan of the segment
  (`facts.scan_facts`), or from what that same task's scan decoded of these bytes (`SegmentInput.records`),
  without decoding (or decompressing) the records again.

Transaction state runs across the groups of a round: `rewrite_group` takes a `TransactionState` and returns
the next one; rewrite a partition's groups in offset order, threading it through. Pure: the same inputs give
the same bytes (re-running a group is safe; only the caller's upload has effects).

No pyspark here: this runs on executors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property

import numpy as np

from compaction.errors import CorruptBatchError, CorruptInputError, KcompactError
from compaction.format.batch import (
    CODEC_MASK,
    CONTROL_FLAG_MASK,
    TRANSACTIONAL_FLAG_MASK,
    BatchAttributes,
    RecordBatch,
    decode_batch,
    encode_batch,
)
from compaction.format.control import ControlType, parse_control_record
from compaction.format.indexes import DEFAULT_INDEX_INTERVAL_BYTES, AbortedTxn, build_indexes_of, encode_txn_index
from compaction.format.scan import batch_fields, check_crcs, headers_of
from compaction.format.scan_kernels import (
    BATCH_ATTRIBUTES,
    BATCH_BASE_OFFSET,
    BATCH_LAST_OFFSET_DELTA,
    BATCH_PRODUCER_ID,
)
from compaction.format.segment import BatchHeader
from compaction.rewrite.facts import RecordBits, RecordFacts, known_facts, scan_facts
from compaction.rewrite.rebuild import empty_header, rebuild_batch
from compaction.rewrite.records import (
    PLAIN_COPIED,
    PLAIN_DROPPED,
    PLAIN_FIRST_MAX_TIMESTAMP,
    PLAIN_KEYLESS,
    PLAIN_MAX_TIMESTAMP,
    PLAIN_REBUILT,
    PLAIN_RECORDS_READ,
    PLAIN_RECORDS_WRITTEN,
    PLAIN_TOMBSTONES_REMOVED,
    PLAIN_TOMBSTONES_RETAINED,
    rebuild_data_batch,
    rewrite_plain,
)
from compaction.rewrite.stats import RewriteStats
from compaction.strategies.retention import (
    ActiveProducer,
    BatchDecision,
    BatchRetention,
    check_batch_retention,
    rebuilt_delete_horizon,
    retains_deletes,
)
from compaction.strategies.transactions import CleanedTransactionMetadata, TransactionState

__all__ = ["ActiveProducer", "Held", "RewriteOutput", "RewriteStats", "SegmentInput", "TransactionState",
           "rewrite_group"]

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class SegmentInput:
    """One input segment: its `.log` bytes, base offset and object key (named in errors). `verified`: these very
    bytes had their CRCs checked by the scan of the same task (`compaction.spark.fused` holds them from its scan
    to its rewrite), so the rewrite does not check them again. `records`: what that scan decoded of each record
    (`facts.RecordBits`), from which the rewrite counts each batch's winners without decoding the records again
    (for compressed batches, without decompressing them a second time)."""

    data: Buffer
    base_offset: int
    obj: str
    verified: bool = False
    records: RecordBits | None = None


@dataclass(frozen=True)
class Held:
    """A segment's `.log` bytes that the task which scanned them holds for its rewrite, with what the scan decoded
    of its records (`SegmentInput.verified` and `records`)."""

    data: Buffer
    records: RecordBits | None = None


@dataclass(frozen=True, eq=False)
class RewriteOutput:
    """The cleaned segment of a group.

    `pieces` are its `.log`'s bytes in order: what each input segment added when the rewrite handed them to
    `on_written` as it went (a caller that wrote them out then need not join them: `log` is joined on first use),
    else one piece. `base_offset` is the first input's base offset (the output segment's name); `next_offset` the
    input's next offset (after its last batch, or the last input's base offset if later), which compaction never
    moves. An empty log means the group kept no batch at all (`stats.empty_outputs` = 1): Kafka would still swap
    in an empty segment; the caller may write one or drop the range, offsets may have gaps. Two outputs are equal
    when their logs and every other field are, however their pieces are cut.
    """

    pieces: tuple[bytes | memoryview, ...] = field(repr=False)
    offset_index: bytes
    time_index: bytes
    txn_index: bytes | None
    base_offset: int
    next_offset: int
    stats: RewriteStats
    transactional: bool = False  # it kept a transactional or control batch (the segment row's `transactional`)

    @cached_property
    def log(self) -> bytes:
        """The `.log`: the pieces joined (the piece itself when there is one)."""
        only = self.pieces[0] if len(self.pieces) == 1 else None
        return only if isinstance(only, bytes) else b"".join(self.pieces)

    @property
    def size(self) -> int:
        return sum(len(piece) for piece in self.pieces)

    @property
    def is_empty(self) -> bool:
        return not self.size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RewriteOutput):
            return NotImplemented
        rest = [f.name for f in fields(self) if f.name != "pieces"]
        return self.log == other.log and all(getattr(self, n) == getattr(other, n) for n in rest)

    __hash__ = None  # type: ignore[assignment]  # mutable-looking: never a set member or a key


def rewrite_group(
    inputs: Sequence[SegmentInput],
    winners: np.ndarray,
    *,
    upper_bound_offset: int,
    now_ms: int,
    delete_retention_ms: int,
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    aborted: Sequence[AbortedTxn] = (),
    active_producers: Mapping[int, ActiveProducer] | None = None,
    txn_state: TransactionState | None = None,
    on_written: Callable[[bytes | memoryview, np.ndarray | None], None] | None = None,
) -> tuple[RewriteOutput, TransactionState]:
    """Clean `inputs` (consecutive segments, in offset order) into one segment.

    Args:
        inputs: the group's segments.
        winners: sorted int64 offsets of the records that win their key (may cover more than the group).
        upper_bound_offset: the round's first uncleanable offset; the batch ending just below it is kept,
            empty if need be (KAFKA-17076).
        now_ms: the run's clock, for delete horizons.
        delete_retention_ms: delete.retention.ms, for horizons set in this pass.
        index_interval_bytes: index.interval.bytes, for the rebuilt offset and time indexes.
        aborted: aborted transactions (txn-index entries) overlapping the group, added to `txn_state`;
            duplicates and already closed ones are ignored.
        active_producers: producer id -> its last entry; that batch is kept, empty if need be.
        txn_state: the state returned for the previous group of the round; None starts a round.
        on_written: called, in order, with the output bytes each input segment added (none: not called) and the
            XXH64 of the key of every data record they hold when the segment's `SegmentInput.records` carry them
            (else None), while the next input is rewritten: the caller builds the output's filter alongside
            (`upload.py`), from those hashes rather than by decoding the bytes again.

    Returns:
        The cleaned segment and the transaction state to pass to the next group.

    Raises:
        CorruptInputError (subclasses) naming the input object and byte position: malformed batches or
            records, CRC mismatches, offsets that go backwards.
        ValueError: no inputs, winners not a strictly increasing 1-d array, or a `txn_state` from a later group.
    """
    if not inputs:
        raise ValueError("a group has at least one segment")
    state = _state_at_start(txn_state, aborted, inputs[0].base_offset)
    rewriter = _GroupRewriter(
        _checked_winners(winners),
        now_ms=now_ms,
        delete_retention_ms=delete_retention_ms,
        upper_bound_offset=upper_bound_offset,
        active_producers=active_producers or {},
        txns=CleanedTransactionMetadata(state),
    )
    for segment in inputs:
        written = len(rewriter.parts)
        rewriter.rewrite_segment(segment)
        if on_written is not None and len(rewriter.parts) > written:
            # held once: the log is made of these; a plain segment's one part is the kernel's own buffer, kept as it
            # is (a copy of its ~input size in fresh memory, else), any other part may be a slice of the input
            own = len(rewriter.parts) == written + 1 and written in rewriter.owned
            added = rewriter.parts[written] if own else b"".join(rewriter.parts[written:])
            rewriter.parts[written:] = [added]
            kept = rewriter.kept_hashes
            on_written(added, None if kept is None else np.concatenate(kept) if kept else np.empty(0, np.uint64))
    return rewriter.finish(inputs, index_interval_bytes, whole=on_written is None), rewriter.txns.state()


def _state_at_start(txn_state: TransactionState | None, aborted: Sequence[AbortedTxn], base_offset: int
                    ) -> TransactionState:
    """The transaction state a group starting at `base_offset` begins with; ValueError if it is a later group's."""
    state = (txn_state or TransactionState.start()).with_aborted(aborted)
    if state.position is not None and state.position > base_offset:
        raise ValueError(
            f"groups must be rewritten in offset order: the transaction state is at offset {state.position}, "
            f"this group starts at {base_offset}"
        )
    return state


def _checked_winners(winners: np.ndarray) -> np.ndarray:
    array = np.asarray(winners, dtype=np.int64)
    if array.ndim != 1:
        raise ValueError(f"winners must be a 1-d array of offsets, got shape {array.shape}")
    if array.size > 1 and not bool(np.all(array[1:] > array[:-1])):
        raise ValueError("winners must be strictly increasing")
    return array


class _GroupRewriter:
    """The per-batch loop of one group; accumulates the output parts and the stats."""

    def __init__(
        self,
        winners: np.ndarray,
        *,
        now_ms: int,
        delete_retention_ms: int,
        upper_bound_offset: int,
        active_producers: Mapping[int, ActiveProducer],
        txns: CleanedTransactionMetadata,
    ) -> None:
        self.winners = winners
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        self.upper_bound_offset = upper_bound_offset
        self.active_producers = active_producers
        self.txns = txns
        self.stats = RewriteStats()
        self.parts: list[bytes | memoryview] = []
        self.owned: set[int] = set()
        """The indexes of `parts` that are views of a buffer of the rewrite's own (`rewrite_plain`'s), not of an
        input."""
        self.next_offset: int | None = None
        self.transactional = False  # a transactional or control batch was written
        self.kept_hashes: list[np.ndarray] | None = None
        """The current segment's kept key hashes, batch by batch (`KeptKeys`); None once a batch was written
        whose records' hashes are not known."""

    def rewrite_segment(self, segment: SegmentInput) -> None:
        data = memoryview(segment.data)
        fields = batch_fields(data, obj=segment.obj)
        self.kept_hashes = []
        if self._plain(fields):
            if not segment.verified:
                check_crcs(data, fields, segment.obj)
            if self._rewrite_plain(data, fields, segment):
                self.kept_hashes = None
                return
        headers = headers_of(fields)
        facts = self._facts(data, headers, segment)
        self.stats.bytes_read += len(data)
        for i, header in enumerate(headers):
            self._check_order(header, segment)
            self.stats.batches_read += 1
            self.stats.records_read += header.records_count
            if header.is_control:
                self._control_batch(data, header, segment.obj)
            else:
                self._data_batch(data, header, facts, i, segment.obj)
        self.next_offset = self._floor(segment)

    def _facts(self, data: memoryview, headers: list[BatchHeader], segment: SegmentInput) -> RecordFacts:
        """Each batch's counts: from what the task's scan decoded of these very bytes (`SegmentInput.records`), or
        by scanning them."""
        bits = segment.records
        if bits is not None and segment.verified and len(bits.counts) == len(headers):
            return known_facts(bits, self.winners)
        return scan_facts(data, headers, self.winners, obj=segment.obj, verify_crc=not segment.verified)

    def _plain(self, fields: np.ndarray) -> bool:
        """Whether every batch of a segment (`fields`, `walk_batches` rows; at least one) is uncompressed, neither
        transactional nor control, and neither an active producer's last nor the batch ending at the round's
        upper bound: then each batch's retention is DELETE_EMPTY and its records go by the winners and the
        horizons alone (`records.rewrite_plain`)."""
        if not len(fields):
            return False
        attributes = fields[:, BATCH_ATTRIBUTES]
        if (attributes & (CODEC_MASK | TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK)).any():
            return False
        if (fields[:, BATCH_BASE_OFFSET] + fields[:, BATCH_LAST_OFFSET_DELTA] + 1 == self.upper_bound_offset).any():
            return False
        producers = fields[:, BATCH_PRODUCER_ID]
        return not (self.active_producers and np.isin(producers[producers >= 0], list(self.active_producers)).any())

    def _rewrite_plain(self, data: memoryview, fields: np.ndarray, segment: SegmentInput) -> bool:
        """A plain segment (`_plain`) rewritten in one kernel call, its output one part; False when the kernel
        leaves it to the per-batch path (which names what is wrong with it)."""
        done = rewrite_plain(data, fields, self.winners, floor=self._floor(segment), now_ms=self.now_ms,
                             delete_retention_ms=self.delete_retention_ms)
        if done is None:
            return False
        c, stats = done.counts.tolist(), self.stats
        stats.bytes_read += len(data)
        stats.batches_read += len(fields)
        stats.records_read += c[PLAIN_RECORDS_READ]
        stats.invalid_records += c[PLAIN_KEYLESS]
        stats.tombstones_retained += c[PLAIN_TOMBSTONES_RETAINED]
        stats.tombstones_removed += c[PLAIN_TOMBSTONES_REMOVED]
        stats.batches_copied_verbatim += c[PLAIN_COPIED]
        stats.batches_rebuilt += c[PLAIN_REBUILT]
        stats.batches_dropped += c[PLAIN_DROPPED]
        stats.records_written += c[PLAIN_RECORDS_WRITTEN]
        if done.data:
            if not self.parts:
                stats.first_batch_max_timestamp = c[PLAIN_FIRST_MAX_TIMESTAMP]
            self.owned.add(len(self.parts))
            self.parts.append(done.data)
            stats.max_timestamp = max(stats.max_timestamp, c[PLAIN_MAX_TIMESTAMP])
            stats.bytes_written += len(done.data)
        self.txns.on_plain_batches_read(done.next_offset - 1)
        self.next_offset = done.next_offset  # above the segment's base: the kernel checked every batch's floor
        return True

    def _floor(self, segment: SegmentInput) -> int:
        """The lowest offset the next batch of `segment` may start at."""
        return segment.base_offset if self.next_offset is None else max(segment.base_offset, self.next_offset)

    def _check_order(self, header: BatchHeader, segment: SegmentInput) -> None:
        floor = self._floor(segment)
        if header.base_offset < floor or header.last_offset_delta < 0:
            raise CorruptInputError(
                f"batch offsets [{header.base_offset}, {header.last_offset}] do not start at or above {floor}, "
                "the segment's base offset or the previous batch's next offset: offsets must strictly increase",
                obj=segment.obj,
                position=header.position,
            )
        self.next_offset = header.next_offset

    def _decide(self, header: BatchHeader, can_discard: bool) -> BatchDecision:
        return check_batch_retention(
            header,
            can_discard,
            now_ms=self.now_ms,
            upper_bound_offset=self.upper_bound_offset,
            active_producers=self.active_producers,
        )

    def _data_batch(self, data: memoryview, header: BatchHeader, facts: RecordFacts, i: int, obj: str) -> None:
        decision = self._decide(header, self.txns.on_batch_read(header))
        if decision.discard_records:
            self.stats.aborted_records_removed += header.records_count
            self._write_nothing(header, decision)
            return
        self.stats.invalid_records += facts.keyless[i]
        retain_deletes = retains_deletes(header.delete_horizon_ms, self.now_ms)
        kept_tombstones = facts.winning_tombstones[i] if retain_deletes else 0
        kept = facts.winning[i] - facts.winning_tombstones[i] + kept_tombstones
        self.stats.tombstones_retained += kept_tombstones
        self.stats.tombstones_removed += facts.tombstones[i] - kept_tombstones
        sets_horizon = kept_tombstones > 0 and header.delete_horizon_ms is None
        if kept == 0:
            self._write_nothing(header, decision)
            return
        if kept == header.records_count and not sets_horizon:
            self._copy(data, header)
        else:
            self._rebuild_data(
                data, header, obj, expected=kept, retain_deletes=retain_deletes, needs_horizon=kept_tombstones > 0
            )
        self._kept(facts, i, retain_deletes, kept, header, obj)

    def _kept(self, facts: RecordFacts, i: int, retain_deletes: bool, kept: int, header: BatchHeader, obj: str
              ) -> None:
        """Add the key hashes of the `kept` records written for batch `i` (if the facts know them)."""
        if facts.kept is None or self.kept_hashes is None:
            self.kept_hashes = None
            return
        hashes = facts.kept.of_batch(i, retain_deletes)
        if len(hashes) != kept:
            raise KcompactError(
                f"{obj}, byte {header.position}: {kept} records kept, the scan's records name {len(hashes)}; a bug, "
                "not bad input"
            )
        self.kept_hashes.append(hashes)

    def _control_batch(self, data: memoryview, header: BatchHeader, obj: str) -> None:
        batch = _decode(data, header, obj)
        control = _control_type(batch, header, obj)
        decision = self._decide(header, self.txns.on_control_batch_read(header, control))
        if decision.discard_records or not batch.records:
            self.stats.markers_removed += header.records_count
            self._write_nothing(header, decision)
        elif decision.contains_marker_for_empty_txn and header.delete_horizon_ms is None:
            self._rebuild_marker(batch)
        else:
            self._copy(data, header)

    def _rebuild_data(
        self, data: memoryview, header: BatchHeader, obj: str, *, expected: int, retain_deletes: bool,
        needs_horizon: bool,
    ) -> None:
        """Re-encode a data batch with its retained records (compiled path, `records.py`)."""
        horizon = rebuilt_delete_horizon(header.delete_horizon_ms, needs_horizon, self.now_ms, self.delete_retention_ms)
        rebuilt = rebuild_data_batch(
            data, header, self.winners, retain_deletes=retain_deletes, delete_horizon_ms=horizon, obj=obj
        )
        if rebuilt.records != expected:
            raise KcompactError(
                f"{obj}, byte {header.position}: the scan counted {expected} records to keep, the rebuild "
                f"{rebuilt.records}; a bug, not bad input"
            )
        self._emit(rebuilt.data, header, rebuilt.max_timestamp, rebuilt.records)
        self.stats.batches_rebuilt += 1

    def _rebuild_marker(self, batch: RecordBatch) -> None:
        """Re-encode a discardable marker with a delete horizon (reference path, `rebuild.py`)."""
        horizon = rebuilt_delete_horizon(None, True, self.now_ms, self.delete_retention_ms)
        rebuilt = rebuild_batch(batch, batch.records, horizon)
        self._emit(encode_batch(rebuilt), rebuilt, rebuilt.max_timestamp, len(rebuilt.records))
        self.stats.batches_rebuilt += 1

    def _copy(self, data: memoryview, header: BatchHeader) -> None:
        self._emit(data[header.position : header.position + header.size], header, header.max_timestamp,
                   header.records_count)
        self.stats.batches_copied_verbatim += 1

    def _write_nothing(self, header: BatchHeader, decision: BatchDecision) -> None:
        """No record kept: the empty header under RETAIN_EMPTY, else nothing."""
        if decision.retention is BatchRetention.RETAIN_EMPTY:
            self._emit(empty_header(header), header, header.max_timestamp, 0)  # attributes kept
            self.stats.batches_emptied += 1
        else:
            self.stats.batches_dropped += 1

    def _emit(self, batch: bytes | memoryview, attributes: BatchAttributes, max_timestamp: int, records: int
              ) -> None:
        """Write `batch`, whose transactional and control flags are `attributes`'."""
        self.transactional = self.transactional or attributes.is_transactional_or_control
        if not self.parts:
            self.stats.first_batch_max_timestamp = max_timestamp
        self.parts.append(batch)
        self.stats.max_timestamp = max(self.stats.max_timestamp, max_timestamp)
        self.stats.records_written += records
        self.stats.bytes_written += len(batch)

    def finish(self, inputs: Sequence[SegmentInput], index_interval_bytes: int, *, whole: bool = True
               ) -> RewriteOutput:
        """The output; `whole`: as one piece (else the parts as they are: each segment's, joined by
        `rewrite_group` as it handed them over, or a plain segment's kernel output: none is a slice of an input,
        which is released after)."""
        pieces = (b"".join(self.parts),) if whole or not self.parts else tuple(self.parts)
        base_offset = inputs[0].base_offset
        indexes = build_indexes_of(pieces, base_offset, index_interval_bytes, obj=f"cleaned {inputs[0].obj}")
        reindexed = self.txns.reindexed
        self.stats.empty_outputs = 0 if any(pieces) else 1
        return RewriteOutput(
            pieces=pieces,
            offset_index=indexes.offset_index,
            time_index=indexes.time_index,
            txn_index=encode_txn_index(reindexed) if reindexed else None,
            base_offset=base_offset,
            next_offset=self.next_offset if self.next_offset is not None else base_offset,
            stats=self.stats,
            transactional=self.transactional,
        )


def _decode(data: memoryview, header: BatchHeader, obj: str) -> RecordBatch:
    try:
        return decode_batch(data, header.position, verify_crc=False)  # the scan verified every CRC
    except CorruptInputError as exc:
        raise exc.located(obj) if exc.obj is None else exc from None


def _control_type(batch: RecordBatch, header: BatchHeader, obj: str) -> ControlType | None:
    if not batch.records:
        return None
    try:
        return parse_control_record(batch.records[0]).type
    except CorruptInputError as exc:
        raise CorruptBatchError(exc.detail, obj=obj, position=header.position) from None
