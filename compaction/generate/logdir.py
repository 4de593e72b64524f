"""Writing a broker's partition directory: the one place that knows its files and what goes in each.

A `<topic>-<partition>` directory as Kafka's LocalLog leaves it: segments `<base offset>.log`, each with an
`.index` and `.timeindex` by Kafka's index.interval.bytes rule (`indexes.build_indexes`), a `.txnindex` when it
holds aborted transactions, a producer `.snapshot` named after the base offset of every segment rolled to,
then `leader-epoch-checkpoint` and `partition.metadata`. A segment rolls by Kafka's size rule (`rolls`).

The generators decide what the batches are (`workload`, `bulk`, and the tests' scenario logs); a
`LogDirWriter` decides where their bytes go. Every file is written whole: a rerun writes the same bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

from compaction.format.checkpoints import (
    LEADER_EPOCH_CHECKPOINT,
    PARTITION_METADATA,
    EpochEntry,
    encode_leader_epoch_checkpoint,
    encode_partition_metadata,
    write_checkpoint_file,
)
from compaction.format.indexes import DEFAULT_INDEX_INTERVAL_BYTES, AbortedTxn, build_indexes, encode_txn_index
from compaction.format.producer_snapshot import ProducerStateEntry, encode_producer_snapshot
from compaction.format.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    segment_path,
)

_SEGMENT_FILE = re.compile(r"[0-9]{20}\.(log|index|timeindex|txnindex|snapshot)")


def rolls(segment_size: int, batch_size: int, segment_bytes: int) -> bool:
    """Kafka's size rule (`LogSegment.shouldRoll`): a non-empty segment rolls before a batch that would take it
    past segment.bytes."""
    return segment_size > 0 and segment_size + batch_size > segment_bytes


class LogDirWriter:
    """Writes the files of one partition directory (created if missing)."""

    def __init__(self, directory: Path, index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES) -> None:
        self.directory = directory
        self.index_interval_bytes = index_interval_bytes
        directory.mkdir(parents=True, exist_ok=True)

    def clear_segments(self) -> None:
        """Remove every segment file (20-digit `.log`, indexes, snapshots), so a rerun never leaves a mixture."""
        for p in self.directory.iterdir():
            if _SEGMENT_FILE.fullmatch(p.name) and p.is_file():
                p.unlink()

    def write_segment(self, base: int, log: bytes, aborted: Sequence[AbortedTxn] = ()) -> None:
        """A whole segment: its `.log`, the offset and time indexes Kafka would write, and `.txnindex` if any."""
        segment_path(self.directory, base, LOG_SUFFIX).write_bytes(log)
        indexes = build_indexes(log, base, self.index_interval_bytes, obj=str(segment_path(self.directory, base)))
        self.write_indexes(base, indexes.offset_index, indexes.time_index)
        if aborted:
            segment_path(self.directory, base, TXN_INDEX_SUFFIX).write_bytes(encode_txn_index(aborted))

    def open_log(self, base: int) -> BinaryIO:
        """The `.log` of a segment, opened for streaming; the caller writes its indexes when it closes it."""
        return open(segment_path(self.directory, base, LOG_SUFFIX), "wb")

    def write_indexes(self, base: int, offset_index: bytes, time_index: bytes) -> None:
        segment_path(self.directory, base, INDEX_SUFFIX).write_bytes(offset_index)
        segment_path(self.directory, base, TIME_INDEX_SUFFIX).write_bytes(time_index)

    def write_snapshot(self, base: int, entries: Iterable[ProducerStateEntry], *, durable: bool = True) -> None:
        """The producer snapshot taken when the log rolled to `base`. `durable=False` skips the fsync: a
        benchmark-scale run rolls thousands of times, and each fsync would force a journal commit."""
        path = segment_path(self.directory, base, SNAPSHOT_SUFFIX)
        data = encode_producer_snapshot(entries)
        if durable:
            write_checkpoint_file(path, data)
        else:
            path.write_bytes(data)

    def write_partition_files(self, topic_id: str, epochs: Sequence[EpochEntry]) -> None:
        """`leader-epoch-checkpoint` and `partition.metadata`."""
        write_checkpoint_file(self.directory / LEADER_EPOCH_CHECKPOINT, encode_leader_epoch_checkpoint(epochs))
        write_checkpoint_file(self.directory / PARTITION_METADATA, encode_partition_metadata(topic_id))
