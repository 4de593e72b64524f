"""Reading a broker's log dir for tiering: partitions, rolled segments and everything a remote copy needs.

A segment is prepared as Kafka's RemoteLogManager prepares `LogSegmentData`: the `.log`, its offset and
time indexes (verified, and rebuilt as Kafka does on load when missing or inconsistent), the transaction
index, the producer snapshot named after the next segment's base offset, and the leader-epoch checkpoint
for all epochs up to that base. The active (highest) segment is never tiered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from compaction.errors import ConfigError, CorruptIndexError, CorruptInputError
from compaction.format.checkpoints import (
    LEADER_EPOCH_CHECKPOINT,
    EpochEntry,
    encode_leader_epoch_checkpoint,
    epochs_in_range,
    read_leader_epoch_checkpoint,
    read_partition_metadata,
)
from compaction.format.indexes import build_indexes, read_txn_index, verify_indexes
from compaction.format.producer_snapshot import open_transactions, read_producer_snapshot
from compaction.format.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    BatchHeader,
    iter_batch_headers,
    segment_path,
)
from compaction.metadata.model import OfPartition

PARTITION_METADATA = "partition.metadata"


@dataclass(frozen=True)
class LocalPartition(OfPartition):
    """A `<topic>-<partition>` directory of a log dir."""

    topic: str
    partition: int
    directory: Path

    @property
    def topic_id(self) -> str:
        path = self.directory / PARTITION_METADATA
        if not path.exists():
            raise CorruptInputError("missing partition.metadata (the topic id is needed to tier)", obj=str(path))
        return read_partition_metadata(path.read_bytes(), obj=str(path)).topic_id

    def leader_epochs(self) -> list[EpochEntry]:
        path = self.directory / LEADER_EPOCH_CHECKPOINT
        return read_leader_epoch_checkpoint(path.read_bytes(), obj=str(path)) if path.exists() else []

    def segment_bases(self) -> list[int]:
        return sorted(int(p.name[: -len(LOG_SUFFIX)]) for p in self.directory.glob("*" + LOG_SUFFIX)
                      if p.name[: -len(LOG_SUFFIX)].isdigit())


@dataclass(frozen=True)
class PreparedSegment:
    """One rolled segment, validated, with the bytes of every companion object to upload."""

    start_offset: int
    end_offset: int
    log_path: Path
    size: int
    max_timestamp_ms: int
    first_batch_max_timestamp_ms: int
    record_count: int
    leader_epochs: tuple[EpochEntry, ...]
    companions: dict[str, bytes]  # suffix (storage layout) -> bytes
    rebuilt_indexes: bool
    transactional: bool  # holds a transactional or control batch (the segment row's `transactional`)
    log_bytes: bytes | None = None  # the `.log` to upload when it is not the whole file (a tail, see `start`)

    def log(self) -> bytes:
        return self.log_bytes if self.log_bytes is not None else self.log_path.read_bytes()


KAFKA_INTERNAL_TOPICS = frozenset({
    "__cluster_metadata",  # KRaft's metadata log (Kafka's Topic.CLUSTER_METADATA_TOPIC_NAME)
    "__consumer_offsets",  # Topic.INTERNAL_TOPICS: the coordinators' own compacted logs
    "__transaction_state",
    "__share_group_state",
    "__remote_log_metadata",  # TopicBasedRemoteLogMetadataManager's topic
})
"""Partitions a broker's log dir holds besides the topics' own: Kafka never tiers them (its RemoteLogManager copies
only topics with remote.storage.enable, which internal topics cannot set, and the metadata log is no topic), and
their brokers compact them themselves, so kcompact neither tiers nor uploads them."""


def _partition_dirs(logdir: Path) -> Iterator[LocalPartition]:
    if not logdir.is_dir():
        raise ConfigError(f"--logdir {logdir}: not a directory")
    for d in sorted(logdir.iterdir()):
        topic, sep, part = d.name.rpartition("-")
        if d.is_dir() and sep and topic and part.isdigit():
            yield LocalPartition(topic, int(part), d)


def partitions(logdir: Path) -> Iterator[LocalPartition]:
    """Every `<topic>-<partition>` directory of a topic, in name order. Directories marked -delete, -future or
    -stray are skipped, and so are Kafka's internal partitions (`KAFKA_INTERNAL_TOPICS`, see `internal_partitions`).
    """
    return (p for p in _partition_dirs(logdir) if p.topic not in KAFKA_INTERNAL_TOPICS)


def internal_partitions(logdir: Path) -> list[str]:
    """The `<topic>-<partition>` names of the internal partitions `partitions` skips, for the caller to say so."""
    return [p.directory.name for p in _partition_dirs(logdir) if p.topic in KAFKA_INTERNAL_TOPICS]


def internal_note(logdir: Path) -> str | None:
    """The line a command prints when it leaves Kafka's internal partitions of `logdir` alone, or None."""
    names = internal_partitions(logdir)
    if not names:
        return None
    return f"skipped Kafka's internal partitions (the broker compacts them; never tiered): {', '.join(names)}"


def prepare_segment(part: LocalPartition, base: int, next_base: int, epochs: list[EpochEntry],
                    start: int | None = None, open_txns_at_start: dict[int, int] | None = None) -> PreparedSegment:
    """Validate segment `base` (CRCs included) and gather what a remote copy needs.

    Raises CorruptInputError naming the file and byte position if the `.log` is malformed. Indexes that are
    missing or inconsistent are rebuilt; a corrupt transaction index is an error (it cannot be rebuilt
    without the producer state at the segment's start, which a snapshot may not give).

    With `start` (above `base`), only the segment's tail from the batch at offset `start` is prepared, as a
    segment of its own: the part above a tier that `kcompact wal roll` extended into this local segment. Its
    indexes are rebuilt, the transaction index from `open_txns_at_start` (the producer state at `start`).
    """
    d = part.directory
    log_path = segment_path(d, base, LOG_SUFFIX)
    log = log_path.read_bytes()
    headers = list(iter_batch_headers(log, obj=str(log_path), verify_crc=True))
    if start is not None and start > base:
        return _prepare_tail(part, log_path, log, headers, start, next_base, epochs, open_txns_at_start or {})
    index_path, time_path = segment_path(d, base, INDEX_SUFFIX), segment_path(d, base, TIME_INDEX_SUFFIX)
    rebuilt = False
    try:
        if not (index_path.exists() and time_path.exists()):
            raise CorruptIndexError("missing", obj=str(index_path))
        offset_index, time_index = index_path.read_bytes(), time_path.read_bytes()
        verify_indexes(log, base, offset_index, time_index, obj=str(log_path),
                       index_obj=str(index_path), time_index_obj=str(time_path))
    except CorruptIndexError:
        carried = _open_txns_at(d, base)
        built = build_indexes(log, base, obj=str(log_path), txn_first_offsets=carried)
        offset_index, time_index, rebuilt = built.offset_index, built.time_index, True
    companions = {"index": offset_index, "timeindex": time_index}
    txn_path = segment_path(d, base, TXN_INDEX_SUFFIX)
    if txn_path.exists() and txn_path.stat().st_size:
        txn = txn_path.read_bytes()
        read_txn_index(txn, obj=str(txn_path))  # validates
        companions["txnindex"] = txn
    companions.update(_closing_files(d, next_base, epochs))
    data_headers = headers or []
    return PreparedSegment(
        start_offset=base,
        end_offset=next_base - 1,
        log_path=log_path,
        size=len(log),
        max_timestamp_ms=max((h.max_timestamp for h in data_headers), default=-1),
        first_batch_max_timestamp_ms=data_headers[0].max_timestamp if data_headers else -1,
        record_count=sum(h.records_count for h in data_headers),
        leader_epochs=tuple(epochs_in_range(epochs, base, next_base)),
        companions=companions,
        rebuilt_indexes=rebuilt,
        transactional=any(h.is_transactional_or_control for h in data_headers),
    )


def _closing_files(directory: Path, next_base: int, epochs: list[EpochEntry]) -> dict[str, bytes]:
    """The producer snapshot at the segment's end (the broker's `<next base>.snapshot`, validated, if it has one)
    and the leader-epoch checkpoint of every epoch up to it."""
    files = {}
    snapshot_path = segment_path(directory, next_base, SNAPSHOT_SUFFIX)
    if snapshot_path.exists():
        snap = snapshot_path.read_bytes()
        read_producer_snapshot(snap, obj=str(snapshot_path))
        files["snapshot"] = snap
    files["leader-epoch-checkpoint"] = encode_leader_epoch_checkpoint([e for e in epochs if e.start_offset < next_base])
    return files


def _prepare_tail(part: LocalPartition, log_path: Path, log: bytes, headers: list[BatchHeader], start: int,
                  next_base: int, epochs: list[EpochEntry], open_txns: dict[int, int]) -> PreparedSegment:
    at = next((h for h in headers if h.base_offset == start), None)
    if at is None:
        raise CorruptInputError(
            f"the tier ends at offset {start - 1}, which is not the end of a batch of this segment: it cannot be "
            "tiered from there (was the tier rolled from another broker's log?)", obj=str(log_path))
    tail = log[at.position :]
    built = build_indexes(tail, start, obj=str(log_path), txn_first_offsets=open_txns)
    companions = {"index": built.offset_index, "timeindex": built.time_index}
    if built.txn_index is not None:
        companions["txnindex"] = built.txn_index
    companions.update(_closing_files(part.directory, next_base, epochs))
    kept = [h for h in headers if h.base_offset >= start]
    return PreparedSegment(
        start_offset=start,
        end_offset=next_base - 1,
        log_path=log_path,
        size=len(tail),
        max_timestamp_ms=max(h.max_timestamp for h in kept),
        first_batch_max_timestamp_ms=kept[0].max_timestamp,
        record_count=sum(h.records_count for h in kept),
        leader_epochs=tuple(epochs_in_range(epochs, start, next_base)),
        companions=companions,
        rebuilt_indexes=True,
        transactional=any(h.is_transactional_or_control for h in kept),
        log_bytes=tail,
    )


def _open_txns_at(directory: Path, base: int) -> dict[int, int]:
    snap = segment_path(directory, base, SNAPSHOT_SUFFIX)
    if not snap.exists():
        return {}
    return open_transactions(read_producer_snapshot(snap.read_bytes(), obj=str(snap)))
