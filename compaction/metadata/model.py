"""The values the metadata table stores, and its one Arrow schema.

One Delta table, partitioned by `topic` and `partition`, holds two kinds of rows, told apart by
`row_kind`, so that everything a commit changes for one Kafka partition (new segments, replaced segments
and the partition's new state) is written by **one** Delta commit:

- `segment` rows are KIP-405's `RemoteLogSegmentMetadata`, one per upload attempt (`segment_id`);
- the `partition` row (exactly one per partition that was ever committed) carries the fencing epoch,
  the commit sequence number and the cleaner-offset and leader-epoch lineages.

Columns (a column that does not apply to a row kind is null in it):

| column | type | rows | meaning |
|---|---|---|---|
| row_kind | string | both | `segment` or `partition` |
| topic | string | both | Kafka topic name; partition column |
| partition | int32 | both | Kafka partition number; partition column |
| topic_id | string | both | Kafka topic Uuid (22-char url-safe base64); guards against a recreated topic |
| writer | string | both | who wrote the row last, e.g. `kcompact tier@host` (KIP-405's brokerId) |
| run_id | string | both | the run that wrote the row last, if any |
| fencing_epoch | int64 | both | partition: current fencing epoch; segment: epoch of its last writer |
| cleaner_offsets | list<struct<epoch int32, offset int64>> | both | cleaner offset per fencing epoch |
| segment_id | string | segment | Kafka Uuid of the upload attempt (RemoteLogSegmentId.id) |
| start_offset | int64 | segment | base offset |
| end_offset | int64 | segment | next segment's base offset - 1 (inclusive), not the last record's offset |
| max_timestamp_ms | int64 | segment | largest record timestamp |
| first_batch_max_timestamp_ms | int64 | segment | first batch's max timestamp (KIP-354 dirty time) |
| event_timestamp_ms | int64 | segment | time of the last state change |
| segment_leader_epochs | list<struct<epoch int32, start_offset int64>> | segment | epoch -> first offset |
| segment_size_bytes | int64 | segment | size of the `.log` object |
| record_count | int64 | segment | records in the segment, if known |
| state | string | segment | a `SegmentState` name |
| object_keys | list<struct<suffix string, key string>> | segment | store key per file (`.log`, `.indexes`, ...) |
| commit_seq | int64 | partition | +1 per commit that touches the partition; 0 = never committed |
| leader_epochs | list<struct<epoch int32, start_offset int64>> | partition | lineage of tiered data |
| updated_ms | int64 | partition | time of the last commit |
| transactional | bool | segment | holds a transactional or control batch; null = unknown (below) |

The fencing epoch plays the role the leader epoch plays in KIP-405 (docs/fencing.md): `cleaner_offsets` is
keyed by fencing epoch, `segment_leader_epochs`/`leader_epochs` by the Kafka leader epochs found in the
data. All timestamps are epoch milliseconds, as in Kafka. `transactional` is known where kcompact wrote the
segment's bytes (`kcompact tier`, the WAL roll, a compaction's outputs) or the plugin's storage manager read them
(a broker's copy: the copy's KIP-917 custom metadata says, docs/broker.md), and null where nothing said. It was
added last: a table created before it has every other column (`LEGACY_METADATA_SCHEMA`), and is read with it null
and written without it. The table stays plain Delta (reader 1 / writer 2: no deletion vectors, no column mapping) so
that delta-spark on a cluster reads it.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import pyarrow as pa

from compaction.errors import ConfigError, InvalidStateTransitionError
from compaction.format.checkpoints import EpochEntry
from compaction.pipes import WRITER_PREFIX
from compaction.storage.layout import Suffix


class RowKind(StrEnum):
    SEGMENT = "segment"
    PARTITION = "partition"


class SegmentState(StrEnum):
    """KIP-405's `RemoteLogSegmentState`."""

    COPY_SEGMENT_STARTED = "COPY_SEGMENT_STARTED"
    COPY_SEGMENT_FINISHED = "COPY_SEGMENT_FINISHED"
    DELETE_SEGMENT_STARTED = "DELETE_SEGMENT_STARTED"
    DELETE_SEGMENT_FINISHED = "DELETE_SEGMENT_FINISHED"


_NEXT_STATES: dict[SegmentState | None, frozenset[SegmentState]] = {
    None: frozenset({SegmentState.COPY_SEGMENT_STARTED}),
    SegmentState.COPY_SEGMENT_STARTED: frozenset(
        {SegmentState.COPY_SEGMENT_FINISHED, SegmentState.DELETE_SEGMENT_STARTED}
    ),
    SegmentState.COPY_SEGMENT_FINISHED: frozenset({SegmentState.DELETE_SEGMENT_STARTED}),
    SegmentState.DELETE_SEGMENT_STARTED: frozenset({SegmentState.DELETE_SEGMENT_FINISHED}),
    SegmentState.DELETE_SEGMENT_FINISHED: frozenset(),
}


def is_valid_transition(old: SegmentState | None, new: SegmentState) -> bool:
    """Kafka's `RemoteLogSegmentState.isValidTransition`: null->0, any self, 0->1, 0->2, 1->2, 2->3."""
    return old == new or new in _NEXT_STATES[old]


def check_transition(segment_id: str, old: SegmentState | None, new: SegmentState) -> None:
    """Raise `InvalidStateTransitionError` unless `old -> new` is a transition KIP-405 allows."""
    if not is_valid_transition(old, new):
        raise InvalidStateTransitionError(
            f"segment {segment_id}: state transition {old.name if old else 'null'} -> {new.name} "
            "is not allowed (KIP-405 allows null->STARTED, self, 0->1, 0->2, 1->2, 2->3)"
        )


ObjectSuffix = Suffix
"""The files of one remote segment: the object-key suffixes of `compaction.storage.layout`."""


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OfPartition:
    """A value of one topic-partition (its `topic` and `partition` fields): `tp` names it as a `TopicPartition`, so
    no caller rebuilds one from the two fields."""

    __slots__ = ()
    topic: str
    partition: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True)
class CleanerOffset:
    """Under fencing epoch `epoch`, the partition is clean below `offset` (the first dirty offset)."""

    epoch: int
    offset: int


@dataclass(frozen=True)
class ObjectKey:
    suffix: ObjectSuffix
    key: str


@dataclass(frozen=True)
class SegmentMetadata(OfPartition):
    """One remote segment upload attempt (KIP-405 `RemoteLogSegmentMetadata`), as stored in a segment row."""

    segment_id: str
    topic: str
    topic_id: str
    partition: int
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    event_timestamp_ms: int
    segment_leader_epochs: tuple[EpochEntry, ...]
    segment_size_bytes: int
    state: SegmentState
    cleaner_offsets: tuple[CleanerOffset, ...]
    object_keys: tuple[ObjectKey, ...]
    writer: str
    fencing_epoch: int
    record_count: int | None = None
    first_batch_max_timestamp_ms: int | None = None
    run_id: str | None = None
    transactional: bool | None = None  # holds a transactional or control batch; None: unknown

    def object_key(self, suffix: ObjectSuffix) -> str | None:
        """The store key of this segment's file with `suffix`, or None if it has none (e.g. no txnindex). A key ending
        in `.indexes` names the object the file is a part of: read it with `compaction.storage.indexes.get_part`."""
        return next((o.key for o in self.object_keys if o.suffix == suffix), None)

    @property
    def by_broker(self) -> bool:
        """Whether a Kafka broker wrote this row, through kcompact's RemoteLogMetadataManager (`broker_writer`)."""
        return self.writer.startswith(BROKER_WRITER_PREFIX)

    @property
    def largest_timestamp_ms(self) -> int:
        """Kafka's `LogSegment.largestTimestamp`: the max record timestamp, else the file's time (here: when the
        row went live). Read by min.compaction.lag.ms and by retention.ms."""
        return self.max_timestamp_ms if self.max_timestamp_ms >= 0 else self.event_timestamp_ms


BROKER_WRITER_PREFIX = WRITER_PREFIX
"""`broker-`, as the plugin's pipe schema writes it (`compaction/pipes.json`)."""


def broker_writer(broker_id: int) -> str:
    """The writer of the rows a broker adds and updates through kcompact's plugin: `broker-<id>`."""
    return f"{BROKER_WRITER_PREFIX}{broker_id}"


@dataclass(frozen=True)
class PartitionState(OfPartition):
    """The partition row: fencing epoch, commit sequence number and lineages of one Kafka partition."""

    topic: str
    topic_id: str
    partition: int
    fencing_epoch: int
    commit_seq: int
    cleaner_offsets: tuple[CleanerOffset, ...]
    leader_epochs: tuple[EpochEntry, ...]
    updated_ms: int
    writer: str
    run_id: str | None = None


_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_UUID = re.compile(r"^[A-Za-z0-9_-]{21}[AQgw]$")


def check_topic(topic: str) -> str:
    """Return `topic` if it is a legal Kafka topic name (it then needs no quoting in a Delta predicate)."""
    if not _TOPIC.match(topic) or topic in (".", ".."):
        raise ConfigError(f"invalid Kafka topic name {topic!r}: expected 1-249 of [a-zA-Z0-9._-]")
    return topic


def is_kafka_uuid(text: str) -> bool:
    """True if `text` is the text form of a Kafka Uuid: 16 bytes in url-safe base64 without padding."""
    return bool(_UUID.match(text))


def new_kafka_uuid() -> str:
    """A random Kafka Uuid in text form; like Kafka's `Uuid.randomUuid`, it never starts with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


_EPOCH_ENTRY = pa.struct([pa.field("epoch", pa.int32()), pa.field("start_offset", pa.int64())])
_CLEANER_OFFSET = pa.struct([pa.field("epoch", pa.int32()), pa.field("offset", pa.int64())])
_OBJECT_KEY = pa.struct([pa.field("suffix", pa.string()), pa.field("key", pa.string())])

PARTITION_COLUMNS = ("topic", "partition")

METADATA_SCHEMA = pa.schema(
    [
        pa.field("row_kind", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("topic_id", pa.string(), nullable=False),
        pa.field("writer", pa.string(), nullable=False),
        pa.field("run_id", pa.string()),
        pa.field("fencing_epoch", pa.int64(), nullable=False),
        pa.field("cleaner_offsets", pa.list_(pa.field("element", _CLEANER_OFFSET))),
        pa.field("segment_id", pa.string()),
        pa.field("start_offset", pa.int64()),
        pa.field("end_offset", pa.int64()),
        pa.field("max_timestamp_ms", pa.int64()),
        pa.field("first_batch_max_timestamp_ms", pa.int64()),
        pa.field("event_timestamp_ms", pa.int64()),
        pa.field("segment_leader_epochs", pa.list_(pa.field("element", _EPOCH_ENTRY))),
        pa.field("segment_size_bytes", pa.int64()),
        pa.field("record_count", pa.int64()),
        pa.field("state", pa.string()),
        pa.field("object_keys", pa.list_(pa.field("element", _OBJECT_KEY))),
        pa.field("commit_seq", pa.int64()),
        pa.field("leader_epochs", pa.list_(pa.field("element", _EPOCH_ENTRY))),
        pa.field("updated_ms", pa.int64()),
        pa.field("transactional", pa.bool_()),
    ]
)

LEGACY_METADATA_SCHEMA = METADATA_SCHEMA.remove(METADATA_SCHEMA.get_field_index("transactional"))
"""The columns of a table created before `transactional`: kcompact reads it (the column null) and writes it
(without the column) as it is."""


def _common_columns(kind: RowKind, r: SegmentMetadata | PartitionState) -> dict[str, Any]:
    """The columns rows of both kinds have: whose partition it is, who wrote it, and the cleaner offsets."""
    return {
        "row_kind": kind.value,
        "topic": r.topic,
        "partition": r.partition,
        "topic_id": r.topic_id,
        "writer": r.writer,
        "run_id": r.run_id,
        "fencing_epoch": r.fencing_epoch,
        "cleaner_offsets": [{"epoch": c.epoch, "offset": c.offset} for c in r.cleaner_offsets],
    }


def _segment_row(s: SegmentMetadata) -> dict[str, Any]:
    return {
        **_common_columns(RowKind.SEGMENT, s),
        "segment_id": s.segment_id,
        "start_offset": s.start_offset,
        "end_offset": s.end_offset,
        "max_timestamp_ms": s.max_timestamp_ms,
        "first_batch_max_timestamp_ms": s.first_batch_max_timestamp_ms,
        "event_timestamp_ms": s.event_timestamp_ms,
        "segment_leader_epochs": [{"epoch": e.epoch, "start_offset": e.start_offset} for e in s.segment_leader_epochs],
        "segment_size_bytes": s.segment_size_bytes,
        "record_count": s.record_count,
        "transactional": s.transactional,
        "state": s.state.value,
        "object_keys": [{"suffix": o.suffix.value, "key": o.key} for o in s.object_keys],
    }


def _partition_row(p: PartitionState) -> dict[str, Any]:
    return {
        **_common_columns(RowKind.PARTITION, p),
        "commit_seq": p.commit_seq,
        "leader_epochs": [{"epoch": e.epoch, "start_offset": e.start_offset} for e in p.leader_epochs],
        "updated_ms": p.updated_ms,
    }


def rows_to_arrow(partitions: Iterable[PartitionState], segments: Iterable[SegmentMetadata],
                  schema: pa.Schema = METADATA_SCHEMA) -> pa.Table:
    """The rows of `partitions` and `segments` as one Arrow table with `schema` (`METADATA_SCHEMA`, or
    `LEGACY_METADATA_SCHEMA` for a table created before `transactional`: the column left out)."""
    rows = [_partition_row(p) for p in partitions] + [_segment_row(s) for s in segments]
    return pa.Table.from_pylist(rows, schema=schema)


def partition_rows(partitions: Sequence[tuple[PartitionState, Sequence[SegmentMetadata]]]
                   ) -> list[list[dict[str, Any]]]:
    """Each partition's rows as `rows_to_arrow([state], segments)` holds them, as dicts of the columns by name (the
    partition columns included): what `delta_log.overwrite_partitions` encodes, without an Arrow table a partition."""
    return [[_partition_row(state), *(_segment_row(s) for s in segments)] for state, segments in partitions]


def _cleaner_offsets(items: list[Mapping[str, int]] | None) -> tuple[CleanerOffset, ...]:
    return tuple([CleanerOffset(i["epoch"], i["offset"]) for i in items or ()])


def _epoch_entries(items: list[Mapping[str, int]] | None) -> tuple[EpochEntry, ...]:
    return tuple([EpochEntry(i["epoch"], i["start_offset"]) for i in items or ()])


# Enum lookups by value, as dicts: a full read of a table of 10,000 partitions builds 500,000 rows, and Enum's own
# `__call__` was a fifth of that time.
_STATES = {s.value: s for s in SegmentState}
_SUFFIXES = {s.value: s for s in ObjectSuffix}


def _common_fields(r: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `_common_columns`, read back from a row."""
    return {
        "topic": r["topic"],
        "partition": r["partition"],
        "topic_id": r["topic_id"],
        "writer": r["writer"],
        "run_id": r["run_id"],
        "fencing_epoch": r["fencing_epoch"],
        "cleaner_offsets": _cleaner_offsets(r["cleaner_offsets"]),
    }


def segment_from_row(r: Mapping[str, Any]) -> SegmentMetadata:
    """The `SegmentMetadata` of one segment row (a dict as `pa.Table.to_pylist` returns it)."""
    return SegmentMetadata(
        **_common_fields(r),
        segment_id=r["segment_id"],
        start_offset=r["start_offset"],
        end_offset=r["end_offset"],
        max_timestamp_ms=r["max_timestamp_ms"],
        event_timestamp_ms=r["event_timestamp_ms"],
        segment_leader_epochs=_epoch_entries(r["segment_leader_epochs"]),
        segment_size_bytes=r["segment_size_bytes"],
        state=_STATES[r["state"]],
        object_keys=tuple([ObjectKey(_SUFFIXES[o["suffix"]], o["key"]) for o in r["object_keys"] or ()]),
        record_count=r["record_count"],
        first_batch_max_timestamp_ms=r["first_batch_max_timestamp_ms"],
        transactional=r.get("transactional"),  # absent from a table created before the column
    )


def partition_from_row(r: Mapping[str, Any]) -> PartitionState:
    """The `PartitionState` of one partition row."""
    return PartitionState(
        **_common_fields(r),
        commit_seq=r["commit_seq"],
        leader_epochs=_epoch_entries(r["leader_epochs"]),
        updated_ms=r["updated_ms"],
    )
