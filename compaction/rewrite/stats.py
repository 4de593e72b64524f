"""What one group's rewrite read, wrote and removed: Kafka's `CleanerStats` counters and more."""

from __future__ import annotations

from dataclasses import asdict, dataclass

NO_TIMESTAMP = -1


@dataclass
class RewriteStats:
    """Counters of one rewrite; filled while a group is rewritten, a value once returned.

    Records are counted as physically present (`recordsCount`), control records included, so
    `records_read - records_written` is everything removed. Kafka's `messagesRead` skips the records of
    batches deleted unread (aborted data), so ours can be higher for transactional logs.

    * `invalid_records`: keyless records of data batches (dropped), Kafka's `invalidMessagesRead`.
    * `batches_*`: every input batch is exactly one of copied verbatim, rebuilt (some records dropped or a
      horizon set), emptied (written as a 61-byte empty header) or dropped.
    * `tombstones_retained` / `tombstones_removed`: keyed null-value records of non-aborted data batches kept /
      dropped (superseded or past their horizon).
    * `aborted_records_removed`: records of aborted transactions' data batches.
    * `markers_removed`: control records not written.
    * `max_timestamp` / `first_batch_max_timestamp`: over the written batches' headers (−1 if none), for
      the segment metadata and max.compaction.lag.ms.
    * `empty_outputs`: 1 if the group wrote no batch at all (see `rewrite_group`), else 0.
    """

    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    invalid_records: int = 0
    batches_read: int = 0
    batches_copied_verbatim: int = 0
    batches_rebuilt: int = 0
    batches_emptied: int = 0
    batches_dropped: int = 0
    tombstones_retained: int = 0
    tombstones_removed: int = 0
    aborted_records_removed: int = 0
    markers_removed: int = 0
    empty_outputs: int = 0
    max_timestamp: int = NO_TIMESTAMP
    first_batch_max_timestamp: int = NO_TIMESTAMP

    def to_dict(self) -> dict[str, int]:
        """Plain ints by field name (JSON-ready)."""
        return asdict(self)
