"""The values the WAL metadata table stores, its Arrow schema and where combined objects live.

A **combined object** (KIP-1176's combined log segment) holds whole record batches of many partitions,
back to back, exactly as they sit in the brokers' `.log` files; nothing else is in it, so every byte range
an entry names decodes as a Kafka log. Its **entries** say, per partition, which offsets and bytes it holds.
One entry holds batches of one leader epoch only (an upload cuts at epoch changes), so the log a reader
sees can follow the highest epoch as Kafka's truncation does (`compaction.wal.log`).

The table (`<store>/_kcompact_wal`, plain Delta like the segment metadata table) has one row per entry;
the object's columns are repeated on each of its rows, so one predicate on `object_id` selects and
rewrites an object's rows whole:

| column | type | meaning |
|---|---|---|
| object_id | string | Kafka Uuid of the object (KIP-1176's combinedSegmentId) |
| object_key | string | store key of the object (`wal/<object_id>.wal`) |
| object_size | int64 | size of the object in bytes |
| state | string | KIP-405 `RemoteLogSegmentState` name (COPY_SEGMENT_STARTED ... DELETE_SEGMENT_FINISHED) |
| broker_id | int32 | the broker (log dir) whose data it holds |
| writer | string | who uploaded it, e.g. `kcompact wal upload@host` |
| created_ms | int64 | time of the STARTED commit |
| event_timestamp_ms | int64 | time of the last state change |
| topic | string | the entry's topic |
| topic_id | string | the topic's Uuid (from `partition.metadata`) |
| partition | int32 | the entry's partition |
| start_offset | int64 | base offset of the entry's first batch |
| end_offset | int64 | last offset of the entry's last batch (inclusive) |
| leader_epoch | int32 | the partition leader epoch of every batch of the entry |
| start_position | int64 | byte position of the entry's first batch in the object |
| end_position | int64 | byte position just past the entry's last batch (exclusive) |
| max_timestamp_ms | int64 | largest batch max timestamp of the entry |
| record_count | int64 | records in the entry |

Lifecycle (KIP-1176, after KIP-405): a row set is appended in COPY_SEGMENT_STARTED before the object is
written, and moved to COPY_SEGMENT_FINISHED after; only FINISHED entries are part of the log, so a crash
in between leaves nothing visible. `kcompact gc` moves an object nobody needs to DELETE_SEGMENT_STARTED,
deletes it and records DELETE_SEGMENT_FINISHED.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from compaction.metadata.model import OfPartition, SegmentState

WAL_TABLE_NAME = "_kcompact_wal"
WAL_OBJECT_PREFIX = "wal/"
WAL_OBJECT_SUFFIX = ".wal"
_WAL_KEY = re.compile(r"wal/(?P<object_id>[A-Za-z0-9_-]{22})\.wal")


def wal_object_key(object_id: str) -> str:
    """The store key of combined object `object_id`."""
    return f"{WAL_OBJECT_PREFIX}{object_id}{WAL_OBJECT_SUFFIX}"


def parse_wal_object_key(key: str) -> str | None:
    """The object id of a combined-object key, or None if `key` is not one."""
    m = _WAL_KEY.fullmatch(key)
    return m.group("object_id") if m else None


@dataclass(frozen=True)
class WalEntry(OfPartition):
    """The batches of one partition (one leader epoch) inside a combined object."""

    topic: str
    topic_id: str
    partition: int
    start_offset: int
    end_offset: int
    leader_epoch: int
    start_position: int
    end_position: int
    max_timestamp_ms: int
    record_count: int

    @property
    def size(self) -> int:
        return self.end_position - self.start_position


@dataclass(frozen=True)
class WalObject:
    """One combined object and its entries, as its rows in the WAL table describe it."""

    object_id: str
    key: str
    size: int
    state: SegmentState
    broker_id: int
    writer: str
    created_ms: int
    event_timestamp_ms: int
    entries: tuple[WalEntry, ...]

    def to_dict(self, uri: str) -> dict[str, Any]:
        """`kcompact wal list --json`'s item: `uri` is the object's full URI."""
        return {
            "object_id": self.object_id,
            "uri": uri,
            "size": self.size,
            "state": self.state.value,
            "broker_id": self.broker_id,
            "created_ms": self.created_ms,
            "entries": [
                {
                    "topic": e.topic,
                    "partition": e.partition,
                    "start_offset": e.start_offset,
                    "end_offset": e.end_offset,
                    "leader_epoch": e.leader_epoch,
                    "start_position": e.start_position,
                    "end_position": e.end_position,
                }
                for e in self.entries
            ],
        }


WAL_SCHEMA = pa.schema(
    [
        pa.field("object_id", pa.string(), nullable=False),
        pa.field("object_key", pa.string(), nullable=False),
        pa.field("object_size", pa.int64(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("broker_id", pa.int32(), nullable=False),
        pa.field("writer", pa.string(), nullable=False),
        pa.field("created_ms", pa.int64(), nullable=False),
        pa.field("event_timestamp_ms", pa.int64(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("topic_id", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("start_offset", pa.int64(), nullable=False),
        pa.field("end_offset", pa.int64(), nullable=False),
        pa.field("leader_epoch", pa.int32(), nullable=False),
        pa.field("start_position", pa.int64(), nullable=False),
        pa.field("end_position", pa.int64(), nullable=False),
        pa.field("max_timestamp_ms", pa.int64(), nullable=False),
        pa.field("record_count", pa.int64(), nullable=False),
    ]
)


def objects_to_arrow(objects: Iterable[WalObject]) -> pa.Table:
    """The rows of `objects` (one per entry) as an Arrow table with `WAL_SCHEMA`."""
    rows = [
        {
            "object_id": o.object_id,
            "object_key": o.key,
            "object_size": o.size,
            "state": o.state.value,
            "broker_id": o.broker_id,
            "writer": o.writer,
            "created_ms": o.created_ms,
            "event_timestamp_ms": o.event_timestamp_ms,
            **{k: getattr(e, k) for k in _ENTRY_FIELDS},
        }
        for o in objects
        for e in o.entries
    ]
    return pa.Table.from_pylist(rows, schema=WAL_SCHEMA)


_ENTRY_FIELDS = (
    "topic",
    "topic_id",
    "partition",
    "start_offset",
    "end_offset",
    "leader_epoch",
    "start_position",
    "end_position",
    "max_timestamp_ms",
    "record_count",
)


def objects_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[WalObject]:
    """Group entry rows (dicts as `pa.Table.to_pylist` gives them) back into objects, by object id."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        grouped.setdefault(r["object_id"], []).append(r)
    out = []
    for object_id, rs in grouped.items():
        first = rs[0]
        entries = sorted(
            (WalEntry(**{k: r[k] for k in _ENTRY_FIELDS}) for r in rs), key=lambda e: e.start_position
        )
        out.append(
            WalObject(
                object_id=object_id,
                key=first["object_key"],
                size=first["object_size"],
                state=SegmentState(first["state"]),
                broker_id=first["broker_id"],
                writer=first["writer"],
                created_ms=first["created_ms"],
                event_timestamp_ms=first["event_timestamp_ms"],
                entries=tuple(entries),
            )
        )
    out.sort(key=lambda o: (o.created_ms, o.object_id))
    return out
