"""A table run: plan (metadata, the table's state, the clock) → rows on Spark → at most two Delta commits.

Delta's own writer commits (`compaction.spark.delta_table`): first the replace of the partitions rebuilt (an
overwrite with `replaceWhere`), then one MERGE of the partitions updated, each stamped with the run's next sequence
number (Delta's idempotent-write transaction) and the record of what the table holds once it lands
(`compaction.topic_table.target.record`). So a run that dies before a commit left nothing of it visible, a run that
died between the two left the rebuilt partitions applied and the rerun updates the others, and a run that lost the
race to a concurrent one (Delta skipped its command, or failed it with a concurrent-modification exception) fails
with `CommitConflictError` (exit 4) and its rerun starts from what the winner applied. The report's rows and bytes
are Delta's `operationMetrics` of those commits.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any

from compaction.config import CompactionStrategy, KcompactConfig
from compaction.errors import CommitConflictError, ConfigError, ExitCode
from compaction.metadata import MetadataSnapshot
from compaction.reader import SegmentRef, last_stable_offset, refs_of, transactional_batches_read_once
from compaction.storage.base import ObjectStore
from compaction.topic_table.plan import PartitionSource, PartitionSpan, TablePlan, plan_table
from compaction.topic_table.target import Applied, Location, TableState, TopicTable, app_id, record
from compaction.topic_table.upkeep import Upkeep, keep_healthy
from compaction.wal.view import store_log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from compaction.progress import Progress


@dataclass(frozen=True)
class TableRun:
    """A planned run: the plan, and the table opened at the version the plan read."""

    plan: TablePlan
    table: TopicTable
    state: TableState
    strategy: CompactionStrategy
    header: str | None
    refs: Mapping[int, tuple[SegmentRef, ...]]
    """Each partition's log as the plan read it (metadata, then WAL table, once): what the run reads."""
    run_id: str = field(default_factory=lambda: str(uuid.uuid4()))


def plan_run(store: ObjectStore, config: KcompactConfig, topic: str, location: Location, now_ms: int, *,
             rebuild: bool = False, dry_run: bool = False) -> TableRun:
    """Read the metadata and the table once and plan the run (the table is created by the run's first command).

    Raises:
        ConfigError: the store has no such topic, or the table holds another topic or strategy.
    """
    topic_config = config.for_topic(topic)
    view = store_log(store)  # the tier's partitions and those only the WAL holds yet
    snapshot = view.snapshot or MetadataSnapshot(-1, {})
    partitions = [snapshot.partition(tp.topic, tp.partition) for tp in sorted(view.logs) if tp.topic == topic]
    if not partitions:
        raise ConfigError(f"topic {topic!r} has no partitions in the store {store.uri}")
    strategy, header = topic_config.compaction_strategy, topic_config.compaction_strategy_header
    table = TopicTable(location, topic, strategy, header)
    numbers = [p.partition for p in partitions]
    state = table.open(numbers)
    sources = []
    refs = {p.partition: tuple(refs_of(p, view.partition(topic, p.partition))) for p in partitions}
    for p in partitions:
        applied = state.applied.get(p.partition)
        start = 0 if rebuild or applied is None else applied.offset
        sources.append(PartitionSource(p.partition, p.live_segments, p.lineage.current,
                                       last_stable_offset(store, refs[p.partition], start)))
    plan = plan_table(topic, snapshot.version, state.version, now_ms, sources, state.applied, strategy,
                      topic_config.delete_retention_ms, rebuild=rebuild)
    return TableRun(plan, table, state, strategy, header, refs)


@dataclass
class TableReport:
    """What a run did; `to_dict` is the JSON report, `summary` the text one. The counts are Delta's
    `operationMetrics` of the run's commits (`commits`: their versions)."""

    run: TableRun
    committed_version: int | None = None
    commits: list[int] = field(default_factory=list)
    files_added: int = 0
    files_removed: int = 0
    files_marked: int = 0
    rows_marked: int = 0
    rows_written: int = 0
    bytes_written: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    dry_run: bool = False
    upkeep: Upkeep | None = None

    @property
    def exit_code(self) -> int:
        return int(ExitCode.OK)

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.run.table.uri, "run_id": self.run.run_id, "dry_run": self.dry_run,
                "plan": self.run.plan.to_dict(), "committed_version": self.committed_version,
                "commits": list(self.commits), "files_added": self.files_added, "files_removed": self.files_removed,
                "files_marked": self.files_marked, "rows_marked": self.rows_marked,
                "rows_written": self.rows_written, "bytes_written": self.bytes_written,
                "segment_bytes_read": sum(s.segment_bytes for s in self.run.plan.spans),
                "upkeep": None if self.upkeep is None else self.upkeep.to_dict(),
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "exit_code": self.exit_code}

    def summary(self) -> list[str]:
        lines = self.run.plan.render_text()
        if self.dry_run:
            return [*lines, "dry run: nothing written"]
        if self.committed_version is None:
            lines.append("nothing to apply: the table is up to date")
        else:
            marked = (f", {self.files_marked} marked ({self.rows_marked} rows deleted by deletion vectors)"
                      if self.files_marked else "")
            lines.append(f"committed table version{'s' * (len(self.commits) > 1)} "
                         f"{', '.join(map(str, self.commits))}: {self.files_added} files added ({self.rows_written} "
                         f"rows, {self.bytes_written} bytes), {self.files_removed} removed" + marked)
        return lines if self.upkeep is None else [*lines, self.upkeep.summary()]

    def add(self, version: int, metrics: Mapping[str, str]) -> None:
        """Count a commit of the run from its `operationMetrics` (a WRITE's or a MERGE's, as Delta names them)."""
        def m(*names: str) -> int:
            return sum(int(metrics.get(n, 0) or 0) for n in names)

        self.commits.append(version)
        self.committed_version = version
        self.files_added += m("numFiles", "numTargetFilesAdded")
        self.files_removed += m("numRemovedFiles", "numTargetFilesRemoved")
        self.files_marked += m("numTargetDeletionVectorsAdded", "numTargetDeletionVectorsUpdated")
        self.rows_marked += m("numTargetRowsDeleted", "numTargetRowsUpdated") if self.files_marked else 0
        self.rows_written += m("numOutputRows") if "numFiles" in metrics else m("numTargetRowsInserted",
                                                                                 "numTargetRowsUpdated",
                                                                                 "numTargetRowsCopied")
        self.bytes_written += m("numOutputBytes", "numTargetBytesAdded")


def execute(spark: SparkSession, store: ObjectStore, run: TableRun, progress: Progress | None = None
            ) -> TableReport:
    """Compute the plan's rows on Spark and commit them through Delta's writer: the rebuilt partitions' replace,
    then the updated partitions' MERGE, each with the applied offsets (see the module).

    Raises:
        CommitConflictError: a concurrent run applied some of the same partitions first; rerun.
    """
    from compaction.spark import delta_table as delta
    from compaction.spark import table as data

    report = TableReport(run)
    plan, table = run.plan, run.table
    if not plan.spans:
        return report
    started = time.monotonic()
    delta.configure(spark, table.uri, table.options)
    since = run.state.version
    if since < 0:
        delta.create(spark, table.spark_path, data.row_struct(table.schema), table.description)
        opened = table.delta_table()
        table.check_protocol(opened)
        table.check(opened)
    applied, sequence = dict(run.state.applied), run.state.sequence
    rebuilt = [s for s in plan.spans if s.rebuild]
    updated = [s for s in plan.spans if not s.rebuild]
    for spans in (rebuilt, updated):
        if not spans:
            continue
        sequence += 1
        applied |= {s.partition: Applied(s.to_offset, plan.now_ms, s.log_start) for s in spans}
        stamp = delta.Stamp(app_id(table.topic), sequence, record(
            table.topic, run.run_id, sequence, applied, metadata_version=plan.metadata_version,
            rebuilt=sorted(s.partition for s in spans if s.rebuild)))
        rows = _rows(spark, store, run, spans, progress)
        with data.task_errors():  # a task's kcompact error (corrupt input) is raised here as itself
            commit(spark, table, rows, spans, stamp)
        version, metrics = _landed(spark, run, sequence, stamp)
        report.add(version, metrics)
        if progress:
            progress.phase(f"table: committed version {version} ({'rebuilt' if spans[0].rebuild else 'updated'} "
                           f"{len(spans)} partitions)")
    report.seconds["write"] = time.monotonic() - started
    return report


def commit(spark: SparkSession, table: TopicTable, rows: DataFrame, spans: list[PartitionSpan], stamp: Any) -> None:
    """One Delta command of the run: the replace of rebuilt `spans`, or the MERGE of updated ones."""
    from compaction.spark import delta_table as delta

    partitions = [s.partition for s in spans]
    if spans[0].rebuild:
        delta.replace(spark, table.spark_path, rows, partitions, stamp)
    else:
        delta.merge(spark, table.spark_path, rows, partitions, stamp)


def _landed(spark: SparkSession, run: TableRun, sequence: int, stamp: Any) -> tuple[int, Mapping[str, str]]:
    """The version and `operationMetrics` of the run's commit of `sequence`. Delta skips a command whose sequence
    number the table recorded already (a concurrent run's commit took it: `CommitConflictError`); a MERGE that
    changed nothing commits nothing, and an empty append records the applied offsets instead."""
    from compaction.spark import delta_table as delta
    from compaction.spark import table as data

    for attempt in range(2):
        for version, info in sorted(run.table.landed(run.run_id, run.state.version).items()):
            if json.loads(info["userMetadata"]).get("sequence") == sequence:
                return version, info.get("operationMetrics") or {}
        recorded = run.table.delta_table().transaction_version(app_id(run.table.topic)) or 0
        if recorded >= sequence or attempt:
            raise CommitConflictError(f"table {run.table.uri}: a concurrent run committed sequence number {sequence} "
                                      f"of {app_id(run.table.topic)} first; nothing of this run's was committed "
                                      "there: rerun")
        empty = data.local_rows(spark, run.table.schema.empty_table(), run.table.schema)
        delta.append(spark, run.table.spark_path, empty, stamp)
    raise AssertionError("unreachable")


def _rows(spark: SparkSession, store: ObjectStore, run: TableRun, spans: list[PartitionSpan],
          progress: Progress | None) -> DataFrame:
    """The rows of `spans` (all rebuilt, or all updated): by tasks where they fit (a rebuild in key buckets,
    `rebuild_rows`; an update in threads of the driver or Spark tasks, `update_rows`), else through Spark's
    aggregate (`spark_rows`)."""
    from compaction.spark import table as data

    frames: list[DataFrame] = []
    if spans[0].rebuild:
        parallelism = spark.sparkContext.defaultParallelism
        buckets = {s.partition: data.rebuild_buckets(s.segment_bytes, len(spans), parallelism) for s in spans}
        by_task = [(s, b) for s in spans if (b := buckets[s.partition]) is not None]
        if by_task:
            rows, tasks = data.rebuild_rows(spark, store, run.refs, by_task, run.table.schema, run.strategy,
                                            run.header)
            frames.append(rows)
            if progress:
                progress.phase(f"table: {len(by_task)} partitions to rebuild by {tasks} tasks")
        others = [s for s in spans if buckets[s.partition] is None]
    else:
        fit = [s for s in spans if s.segment_bytes <= data.UPDATE_TASK_BYTES]
        if fit:
            updated = data.update_rows(spark, store, run.refs, fit, run.table.schema, run.strategy, run.header)
            frames.append(updated.rows)
            if progress:
                where = "threads of the driver's process" if updated.on_driver else "Spark tasks"
                progress.phase(f"table: {len(fit)} partitions to update by {updated.tasks} {where}")
        others = [s for s in spans if s.segment_bytes > data.UPDATE_TASK_BYTES]
    if others:
        frames.append(data.spark_rows(spark, store, run.refs, others, run.table.schema, run.strategy, run.header))
    return reduce(lambda a, b: a.unionByName(b), frames)


def update_table(spark: SparkSession, store: ObjectStore, config: KcompactConfig, topic: str, location: Location,
                 now_ms: int, *, rebuild: bool = False, dry_run: bool = False,
                 progress: Progress | None = None) -> TableReport:
    """Bring the topic's table up to date (see `compaction.table`); returns what the run did.

    Safe to rerun at any point; concurrent runs apply each record once (the loser raises
    `CommitConflictError`).
    """
    started = time.monotonic()
    if not dry_run:
        from compaction.spark.delta_table import own_session

        spark = own_session(spark)  # the run's stamps stay in its own SQL conf
    with transactional_batches_read_once():  # the plan's stable offsets, then the read's transactions
        run = plan_run(store, config, topic, location, now_ms, rebuild=rebuild, dry_run=dry_run)
        if progress:
            progress.phase(f"table plan: {len(run.plan.spans)} partitions to apply, {len(run.plan.up_to_date)} up "
                           f"to date (metadata version {run.plan.metadata_version}, table version "
                           f"{run.state.version})")
        report = TableReport(run, dry_run=True) if dry_run else execute(spark, store, run, progress)
    if not dry_run:
        upkept = time.monotonic()
        partitions = [s.partition for s in run.plan.spans] + list(run.plan.up_to_date)
        report.upkeep = keep_healthy(spark, run.table, run.run_id, partitions, now_ms)
        report.seconds["upkeep"] = time.monotonic() - upkept
        if progress:
            progress.phase(f"table {report.upkeep.summary()}")
    report.seconds["total"] = time.monotonic() - started
    return report


__all__ = ["TableReport", "TableRun", "commit", "execute", "plan_run", "update_table"]
