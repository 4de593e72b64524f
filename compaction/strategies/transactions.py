"""Kafka's `CleanedTransactionMetadata`: which data is aborted and which markers may go.

One cleaning round walks the batches of a partition in offset order, across all its groups. Along the way
it tracks the aborted transactions reached so far (from the txn indexes, ordered by first offset), the
transactions whose data was traversed in *this* pass, and the ABORT markers that must stay indexed.

* A transactional data batch of a producer with an ongoing aborted transaction is discarded.
* A COMMIT marker is discardable only if no batch of its transaction was traversed in this pass.
* An ABORT marker is kept, and re-indexed into the cleaned txn index, while some batch of its transaction was
  traversed in this pass (even if that batch is being dropped now); otherwise it is discardable.
* An emptied control batch is discardable; other control types (KRaft) never are.

`TransactionState` is the state between two groups, as a frozen, picklable value: `rewrite_group` takes one
and returns the next, so a caller threads it through a partition's groups in offset order. Within a group
the mutable `CleanedTransactionMetadata` does the work.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from compaction.format.control import ControlType
from compaction.format.indexes import AbortedTxn


class TxnBatch(Protocol):
    """The header fields the transaction rules read (`BatchHeader` and `RecordBatch` provide them)."""

    @property
    def producer_id(self) -> int: ...

    @property
    def last_offset(self) -> int: ...

    @property
    def is_transactional(self) -> bool: ...


@dataclass(frozen=True)
class OngoingAbort:
    """An aborted transaction reached by the walk whose ABORT marker is not yet read.

    `last_observed_offset` is the last offset of its latest data batch traversed in this pass, None if none.
    """

    txn: AbortedTxn
    last_observed_offset: int | None = None


@dataclass(frozen=True)
class TransactionState:
    """`CleanedTransactionMetadata` between two groups of one cleaning round.

    `pending`: aborted transactions not reached yet, ordered by first offset. `ongoing_aborted`: reached,
    marker not read yet (one per producer). `ongoing_committed`: producers with transactional data traversed
    in this pass whose marker is not read yet. `position`: the next offset after the last batch read (None
    before the first batch); an aborted transaction whose marker lies below it is already closed and is
    ignored if offered again, as are duplicates (same producer and first offset), so the caller may pass
    each group the txn-index entries overlapping it, or everything at `start`.
    """

    pending: tuple[AbortedTxn, ...] = ()
    ongoing_aborted: tuple[OngoingAbort, ...] = ()
    ongoing_committed: frozenset[int] = frozenset()
    position: int | None = None

    @classmethod
    def start(cls, aborted: Iterable[AbortedTxn] = ()) -> TransactionState:
        """The state at the start of a round, knowing the aborted transactions of its txn indexes."""
        return cls().with_aborted(aborted)

    def with_aborted(self, aborted: Iterable[AbortedTxn]) -> TransactionState:
        """This state plus the aborted transactions not already known or closed. Idempotent."""
        known = {(t.producer_id, t.first_offset) for t in self.pending}
        known |= {(o.txn.producer_id, o.txn.first_offset) for o in self.ongoing_aborted}
        added = []
        for txn in aborted:
            key = (txn.producer_id, txn.first_offset)
            closed = self.position is not None and txn.last_offset < self.position
            if key not in known and not closed:
                known.add(key)
                added.append(txn)
        if not added:
            return self
        pending = tuple(sorted((*self.pending, *added), key=lambda t: (t.first_offset, t.producer_id)))
        return TransactionState(pending, self.ongoing_aborted, self.ongoing_committed, self.position)


class CleanedTransactionMetadata:
    """The mutable walker over one group's batches, started from and exported as a `TransactionState`.

    Call `on_batch_read` for every data batch and `on_control_batch_read` for every control batch, in offset
    order; `reindexed` lists the ABORT entries to write into the cleaned txn index, in marker order.
    """

    def __init__(self, state: TransactionState) -> None:
        self._pending = [(t.first_offset, t.producer_id, t) for t in state.pending]
        heapq.heapify(self._pending)
        self._aborted = {o.txn.producer_id: o for o in state.ongoing_aborted}
        self._committed = set(state.ongoing_committed)
        self._position = state.position
        self.reindexed: list[AbortedTxn] = []

    def on_batch_read(self, batch: TxnBatch) -> bool:
        """A data batch was read; True if its records are discarded (its transaction was aborted)."""
        self._advance(batch.last_offset)
        if not batch.is_transactional:
            return False
        ongoing = self._aborted.get(batch.producer_id)
        if ongoing is not None:
            self._aborted[batch.producer_id] = OngoingAbort(ongoing.txn, batch.last_offset)
            return True
        self._committed.add(batch.producer_id)
        return False

    def on_plain_batches_read(self, last_offset: int) -> None:
        """Data batches neither transactional nor control were read, up to `last_offset`: `on_batch_read` of each
        (none is discarded; the walk moves past them)."""
        self._advance(last_offset)

    def on_control_batch_read(self, batch: TxnBatch, control: ControlType | None) -> bool:
        """A control batch was read (`control` None if it has no record); True if it is discardable."""
        self._advance(batch.last_offset)
        if control is None:
            return True  # already emptied by an earlier clean
        if control is ControlType.ABORT:
            ongoing = self._aborted.pop(batch.producer_id, None)
            if ongoing is not None and ongoing.last_observed_offset is not None:
                self.reindexed.append(ongoing.txn)
                return False
            return True
        if control is ControlType.COMMIT:
            if batch.producer_id in self._committed:
                self._committed.discard(batch.producer_id)
                return False
            return True
        return False

    def state(self) -> TransactionState:
        """The state after the batches read so far, to hand to the next group."""
        return TransactionState(
            tuple(t for _f, _p, t in sorted(self._pending)),
            tuple(self._aborted.values()),
            frozenset(self._committed),
            self._position,
        )

    def _advance(self, last_offset: int) -> None:
        """`consumeAbortedTxnsUpTo`: every aborted txn starting at or before `last_offset` becomes ongoing."""
        while self._pending and self._pending[0][0] <= last_offset:
            _first, pid, txn = heapq.heappop(self._pending)
            self._aborted.setdefault(pid, OngoingAbort(txn))
        self._position = last_offset + 1


@dataclass(frozen=True)
class TxnEvent:
    """A transactional or control batch, as the marker walk reads it (every other batch only moves the walk).

    `control`: None for a data batch, -1 for a control batch without a record (emptied by an earlier clean),
    else the control record's type (`ControlType` value; other types are kept opaque)."""

    last_offset: int
    producer_id: int
    is_transactional: bool
    control: int | None = None


def states_at(starts: Iterable[int], aborted: Iterable[AbortedTxn], events: Iterable[TxnEvent]
              ) -> list[TransactionState]:
    """The `TransactionState` at each offset of `starts` (ascending group start offsets) of one round.

    The walk a sequential rewrite makes across its groups, done ahead from the transactional and control
    batches alone (`events`): a data batch outside any transaction changes nothing but the walk's position,
    and an aborted transaction becomes ongoing at its own first batch, which is an event. So each group can
    be rewritten on its own, in parallel, from the state this returns for it. Pure.
    """
    walker = CleanedTransactionMetadata(TransactionState.start(aborted))
    ordered = sorted(events, key=lambda e: e.last_offset)
    out: list[TransactionState] = []
    i = 0
    for start in starts:
        while i < len(ordered) and ordered[i].last_offset < start:
            event = ordered[i]
            if event.control is None:
                walker.on_batch_read(event)
            else:
                walker.on_control_batch_read(event, None if event.control < 0 else _control_type(event.control))
            i += 1
        state = walker.state()
        out.append(state if state.position is None else replace(state, position=min(state.position, start)))
    return out


def _control_type(value: int) -> ControlType | None:
    try:
        return ControlType(value)
    except ValueError:
        return _OPAQUE


class _Opaque:
    """A control type the walk does not know (KRaft's): kept, like `on_control_batch_read` keeps it."""


_OPAQUE: ControlType = _Opaque()  # type: ignore[assignment]
