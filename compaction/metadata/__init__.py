"""The Delta metadata table: KIP-405's RemoteLogMetadataManager for kcompact.

`model` holds the row values and the Arrow schema, `lineage` the cleaner-offset vectors and their
zombie check, `snapshot` the read-side values, `change_set` the pure commit computation, `rebase` a stale
change set moved over segments appended since, `table` the reads (latest and time travel) and `commit` the
atomic, fenced writes.
"""

from __future__ import annotations

from compaction.metadata.change_set import ChangeSet, NewSegment, PartitionRows, StateChange, apply_change_set
from compaction.metadata.commit import (
    CommitResult,
    acquire_fencing_epoch,
    commit,
    commit_current,
    mark_deleted_finished,
    record_tier_finished,
)
from compaction.metadata.lineage import CleanerOffsetLineage, valid_cleaner_offsets
from compaction.metadata.model import (
    METADATA_SCHEMA,
    CleanerOffset,
    EpochEntry,
    ObjectKey,
    ObjectSuffix,
    PartitionState,
    SegmentMetadata,
    SegmentState,
    TopicPartition,
    broker_writer,
    is_valid_transition,
    new_kafka_uuid,
)
from compaction.metadata.snapshot import MetadataSnapshot, PartitionSnapshot, referenced_object_keys
from compaction.metadata.table import METADATA_TABLE_NAME, MetadataTable, table_in_store

__all__ = [
    "METADATA_SCHEMA",
    "METADATA_TABLE_NAME",
    "ChangeSet",
    "CleanerOffset",
    "CleanerOffsetLineage",
    "CommitResult",
    "EpochEntry",
    "MetadataSnapshot",
    "MetadataTable",
    "NewSegment",
    "ObjectKey",
    "ObjectSuffix",
    "PartitionRows",
    "PartitionSnapshot",
    "PartitionState",
    "SegmentMetadata",
    "SegmentState",
    "StateChange",
    "TopicPartition",
    "acquire_fencing_epoch",
    "apply_change_set",
    "broker_writer",
    "commit",
    "commit_current",
    "is_valid_transition",
    "mark_deleted_finished",
    "new_kafka_uuid",
    "record_tier_finished",
    "referenced_object_keys",
    "table_in_store",
    "valid_cleaner_offsets",
]
