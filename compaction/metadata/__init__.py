"""The Delta metadata table: KIP-405's RemoteLogMetadataManager for kcompact.

`model` holds the row values and the Arrow schema, `lineage` the cleaner-offset vectors and their
zombie check, `snapshot` the read-side values, `change_set` the pure commit computation, `rebase` a stale
change set moved over segments appended since, `table` the reads (latest and time travel), `commit` the
atomic, fenced writes, and `batch` the one Delta commit that lands many partitions' writes, each checked alone.
"""

from __future__ import annotations

from compaction.metadata.batch import BATCH_PARTITIONS, CommitResult
from compaction.metadata.change_set import ChangeSet, NewSegment, PartitionRows, StateChange, apply_change_set
from compaction.metadata.commit import (
    acquire_fencing_epoch,
    acquire_fencing_epochs,
    commit,
    commit_batch,
    commit_current,
    commit_current_batch,
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
from compaction.metadata.table import METADATA_TABLE_NAME, MetadataTable, table_in_store, table_requests

__all__ = [
    "BATCH_PARTITIONS",
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
    "acquire_fencing_epochs",
    "apply_change_set",
    "broker_writer",
    "commit",
    "commit_batch",
    "commit_current",
    "commit_current_batch",
    "is_valid_transition",
    "mark_deleted_finished",
    "new_kafka_uuid",
    "record_tier_finished",
    "referenced_object_keys",
    "table_in_store",
    "table_requests",
    "valid_cleaner_offsets",
]
