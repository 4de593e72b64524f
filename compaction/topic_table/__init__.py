"""A compacted topic as a Delta table: one row per live key, kept current by each run (`kcompact table`).

The table holds, per (partition, key), the record that wins under the topic's `compaction.strategy`
(KIP-280: offset, timestamp or header; ties to the higher offset) among the committed records below each
partition's last stable offset, as a read_committed consumer sees them: `key`, `value`, `partition`,
`offset`, `timestamp`, `headers` and, under timestamp/header, the record's `version`. Keys whose winner is a
tombstone are absent. A key produced to two partitions has a row in each, as the topic keeps one per
partition.

Each run applies only what arrived since the previous one (`plan.py` says what is read and when a partition
is rebuilt instead) and records the offsets it applied in the same Delta commit as its files
(`target.py`), so a crash at any point and a rerun give the table a full rebuild gives, and two concurrent
runs never apply the same records twice. The data path is `compaction.spark.table`; what runs in its tasks (or in
threads of the driver) is `tasks.py`.
"""

from __future__ import annotations

from compaction.topic_table.plan import PartitionSpan, Reason, TablePlan
from compaction.topic_table.run import TableReport, TableRun, execute, plan_run, update_table
from compaction.topic_table.target import Location, TopicTable, table_schema

__all__ = ["Location", "PartitionSpan", "Reason", "TablePlan", "TableReport", "TableRun", "TopicTable", "execute",
           "plan_run", "table_schema", "update_table"]
