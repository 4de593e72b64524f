"""Expire what retention removes: one metadata commit moving each partition's expired prefix to
DELETE_SEGMENT_STARTED, re-decided on the partition's latest rows (`commit_current_batch`: a partition that keeps
losing to other commits fails alone, the others land).

Like Kafka's `RemoteLogManager`, expiry only changes metadata here: from that commit on no reader serves the
segments, and `kcompact gc` deletes their objects once the topic's file.delete.delay.ms has passed (a reader that
listed them just before still finds them). The commit is made under the partition's current fencing epoch, as
gc's are: a compaction staging the same partition meanwhile finds its commit refused as a conflict (exit 4, rerun
safe), and a compaction that commits first makes this one re-decide on its rows.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

from compaction.config import KcompactConfig, TopicConfig
from compaction.errors import CommitConflictError, ConfigError, FencedError, KcompactError
from compaction.metadata import (
    ChangeSet,
    MetadataTable,
    PartitionSnapshot,
    SegmentState,
    StateChange,
    TopicPartition,
    commit_current_batch,
)
from compaction.retention.plan import PartitionRetention, RetentionPlan, plan_partition_retention, plan_retention
from compaction.retention.report import PartitionExpiry, RetentionReport

ATTEMPTS = 3
SUPERSEDED = (CommitConflictError, FencedError)
"""A partition whose expiry kept losing to other commits (`commit_current` decides again after each)."""


def default_writer() -> str:
    return f"kcompact-retention@{socket.gethostname()}"


def expire(table: MetadataTable, config: KcompactConfig, now_ms: int, *, topics: Iterable[str] | None = None,
           partition: int | None = None, dry_run: bool = False, writer: str | None = None) -> RetentionReport:
    """Apply retention.ms / retention.bytes to every `compact,delete` partition in scope (`compaction.retention`).

    Idempotent: a rerun finds nothing more to expire until the clock or the log moves.

    Raises:
        ConfigError: a negative `partition`.
        CommitConflictError: a partition kept changing under the run (`ATTEMPTS` times); rerun.
    """
    if partition is not None and partition < 0:
        raise ConfigError(f"partition {partition}: partitions are numbered from 0")
    plan = plan_retention(table.snapshot(), config, now_ms, topics=topics, partition=partition)
    if dry_run:
        return RetentionReport.planned(plan)
    return execute_retention(table, plan, config.for_topic, writer=writer or default_writer())


def execute_retention(table: MetadataTable, plan: RetentionPlan, config_of: Callable[[str], TopicConfig], *,
                      writer: str, failed: dict[TopicPartition, KcompactError] | None = None) -> RetentionReport:
    """Commit `plan`'s expiries in one commit, each re-decided on its partition's latest rows by its topic's config.

    With `failed`, a partition whose commit kept conflicting goes there (and out of the report); without it, the
    error is raised, after the other partitions' expiries landed.
    """
    decided: dict[TopicPartition, PartitionRetention] = {}
    plans = {p.tp: _expiry(config_of(p.topic), plan.now_ms, writer, decided)
             for p in plan.partitions if p.expired}
    outcomes = commit_current_batch(table, plans, plan.now_ms, attempts=ATTEMPTS)
    done, refused = [], []
    for p in plan.partitions:
        tp = p.tp
        outcome = outcomes.get(tp)
        if isinstance(outcome, KcompactError):
            if failed is None or not isinstance(outcome, SUPERSEDED):
                refused.append(outcome)
            else:
                failed[tp] = outcome
            continue
        done.append(PartitionExpiry(decided.get(tp, p), None if outcome is None else outcome.version))
    if refused:
        raise refused[0]
    return RetentionReport.of(plan, done, dry_run=False)


def _expiry(config: TopicConfig, now_ms: int, writer: str, decided: dict[TopicPartition, PartitionRetention]
            ) -> Callable[[PartitionSnapshot], ChangeSet | None]:
    """The expiry of one partition, decided again on its latest rows; what it decided last goes into `decided`."""

    def plan(current: PartitionSnapshot) -> ChangeSet | None:
        retention = decided[current.tp] = plan_partition_retention(
            current, config, now_ms)
        if not retention.expired:
            return None
        return ChangeSet.planned_from(
            current,
            fencing_epoch=current.fencing_epoch,
            writer=writer,
            state_changes=[StateChange(s.segment_id, SegmentState.DELETE_SEGMENT_STARTED) for s in retention.expired],
        )

    return plan


__all__ = ["default_writer", "execute_retention", "expire"]
