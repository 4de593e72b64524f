"""A table run: plan (metadata, the table's state, the clock) → execute (Spark writes files) → one Delta commit.

Idempotent and exactly once: the offsets a run applies are recorded in the commit that adds its files, so a
run that dies before that commit left only unreferenced files (vacuum removes them) and the rerun starts from
the same offsets; a run that lost the race to a concurrent one fails with `CommitConflictError` (exit 4) and
its rerun starts from what the winner applied.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compaction.config import CompactionStrategy, KcompactConfig
from compaction.errors import ConfigError, ExitCode
from compaction.metadata import MetadataSnapshot
from compaction.reader import SegmentRef, last_stable_offset, refs_of, transactional_batches_read_once
from compaction.storage.base import ObjectStore
from compaction.topic_table.deletion_vectors import DeletionVector
from compaction.topic_table.plan import PartitionSource, PartitionSpan, TablePlan, plan_table
from compaction.topic_table.target import FILE_BYTES, Applied, DataFile, Location, TableState, TopicTable
from compaction.topic_table.upkeep import Upkeep, keep_healthy
from compaction.wal.view import store_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
    """Read the metadata and the table once and plan the run; creates the (empty) table unless `dry_run`.

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
    state = table.open(numbers, create=True) if not dry_run or table.exists() else TableState(-1, {}, ())
    sources = []
    refs = {p.partition: tuple(refs_of(p, view.partition(topic, p.partition))) for p in partitions}
    for p in partitions:
        applied = state.applied.get(p.partition)
        start = 0 if rebuild or applied is None else applied.offset
        sources.append(PartitionSource(p.partition, p.live_segments, p.lineage.current,
                                       last_stable_offset(store, refs[p.partition], start)))
    plan = plan_table(topic, snapshot.version, state.version, now_ms, sources, state.applied, strategy,
                      topic_config.delete_retention_ms, rebuild=rebuild)
    if not dry_run and state.files_of({s.partition for s in plan.spans if not s.rebuild}):
        table.use_deletion_vectors()  # an update of existing rows: marked deleted, not rewritten (in the run's commit)
    return TableRun(plan, table, state, strategy, header, refs)


@dataclass
class TableReport:
    """What a run did; `to_dict` is the JSON report, `summary` the text one."""

    run: TableRun
    committed_version: int | None = None
    files_added: int = 0
    files_removed: int = 0
    files_marked: int = 0
    rows_marked: int = 0
    vector_bytes: int = 0
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
                "files_added": self.files_added, "files_removed": self.files_removed,
                "files_marked": self.files_marked, "rows_marked": self.rows_marked,
                "vector_bytes": self.vector_bytes,
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
            marked = (f", {self.files_marked} marked ({self.rows_marked} rows deleted by deletion vectors of "
                      f"{self.vector_bytes} bytes)" if self.files_marked else "")
            lines.append(f"committed table version {self.committed_version}: {self.files_added} files added "
                         f"({self.rows_written} rows, {self.bytes_written} bytes), {self.files_removed} removed"
                         + marked)
        return lines if self.upkeep is None else [*lines, self.upkeep.summary()]


def execute(spark: SparkSession, store: ObjectStore, run: TableRun, progress: Progress | None = None
            ) -> TableReport:
    """Write the plan's files on Spark and commit them with the applied offsets (one Delta commit).

    Raises:
        CommitConflictError: a concurrent run applied some of the same partitions first; rerun.
    """
    report = TableReport(run)
    plan = run.plan
    if not plan.spans:
        return report
    started = time.monotonic()
    written = _write(spark, store, run, progress)  # a task's kcompact error (corrupt input) is raised here as itself
    report.seconds["write"] = time.monotonic() - started
    adds = written.files
    rows = sum(a.rows for a in adds)
    if progress:
        progress.phase(f"table: {len(adds)} files written ({rows} rows)")
    rebuilt = {s.partition for s in plan.spans if s.rebuild}
    removes = [f for f in run.state.files if f.path in written.replaced or f.partition in rebuilt]
    marks = [(f, written.marked[f.path]) for f in run.state.files if f.path in written.marked]
    applied = {s.partition: Applied(s.to_offset, plan.now_ms, s.log_start) for s in plan.spans}
    info = {"run_id": run.run_id, "metadata_version": plan.metadata_version,
            "applied": {str(p): a.offset for p, a in applied.items()}, "rebuilt": sorted(rebuilt)}
    committed = time.monotonic()
    report.committed_version = run.table.commit(adds, removes, applied, plan.now_ms, info, marks)
    report.seconds["commit"] = time.monotonic() - committed
    report.files_added, report.files_removed, report.files_marked = len(adds), len(removes), len(marks)
    report.rows_written, report.bytes_written = rows, sum(a.size for a in adds)
    report.rows_marked = sum(v.cardinality - (f.vector.cardinality if f.vector else 0) for f, v in marks)
    report.vector_bytes = _vector_bytes(v for _, v in marks)
    if progress:
        progress.phase(f"table: committed version {report.committed_version}")
    return report


@dataclass
class _Written:
    """What a run's tasks wrote: its new files, the paths of the old files they rewrote, and the old files whose
    rows they marked deleted, with their new vectors."""

    files: list[DataFile] = field(default_factory=list)
    replaced: set[str] = field(default_factory=set)
    marked: dict[str, DeletionVector] = field(default_factory=dict)

    def add(self, files: list[DataFile], replaced: set[str], marked: dict[str, DeletionVector]) -> None:
        self.files += files
        self.replaced |= replaced
        self.marked |= marked


def _write(spark: SparkSession, store: ObjectStore, run: TableRun, progress: Progress | None) -> _Written:
    """The run's files: partitions to rebuild by tasks in key buckets (`rebuild_files`), updates that fit a task
    by tasks (`update_files`; in the driver's process when they are small), the rest through Spark's aggregate and
    joins (`_spark_files`)."""
    from compaction.spark import table as data

    plan, written = run.plan, _Written()
    rebuilds = [s for s in plan.spans if s.rebuild]
    parallelism = spark.sparkContext.defaultParallelism
    buckets = {s.partition: data.rebuild_buckets(s.segment_bytes, len(rebuilds), parallelism) for s in rebuilds}
    by_task = [(s, b) for s in rebuilds if (b := buckets[s.partition]) is not None]
    if by_task:
        written.files += data.rebuild_files(spark, store, run.refs, by_task, run.table.location, run.table.schema,
                                            run.strategy, run.header)
        if progress:
            progress.phase(f"table: {len(by_task)} partitions rebuilt by {sum(b for _, b in by_task)} tasks, "
                           f"{len(written.files)} files written")
    files = {p: run.state.files_of({p}) for p in {s.partition for s in plan.spans if not s.rebuild}}
    updates = [s for s in plan.spans if not s.rebuild
               and s.segment_bytes + sum(f.size for f in files[s.partition]) <= data.UPDATE_TASK_BYTES]
    if updates:
        updated = data.update_files(spark, store, run.refs, updates, files, run.table.location, run.table.schema,
                                    run.strategy, run.header, vectors=run.table.deletion_vectors())
        written.add(updated.written, updated.replaced, updated.marked)
        if progress:
            where = "threads of the driver's process" if updated.on_driver else "Spark tasks"
            progress.phase(f"table: {len(updates)} partitions updated by {updated.tasks} {where}: "
                           f"{len(updated.marked)} files holding a changed key marked by deletion vectors, "
                           f"{len(updated.replaced)} rewritten")
    by_update = {s.partition for s in updates}
    others = [s for s in plan.spans if (not s.rebuild and s.partition not in by_update)
              or (s.rebuild and buckets[s.partition] is None)]
    if others:
        written.add(*_spark_files(spark, store, run, others, progress))
    return written


def _vector_bytes(vectors: Iterable[DeletionVector]) -> int:
    """The bytes of the deletion vector files that hold `vectors` (each file up to the end of its last vector)."""
    ends: dict[str, int] = {}
    for v in vectors:
        ends[v.path_or_inline] = max(ends.get(v.path_or_inline, 0), v.offset + 8 + v.size)
    return sum(ends.values())


def _spark_files(spark: SparkSession, store: ObjectStore, run: TableRun, spans: list[PartitionSpan],
                 progress: Progress | None) -> tuple[list[DataFile], set[str], dict[str, DeletionVector]]:
    """Write the files of `spans` through Spark (`compaction.spark.table`): the winners by an aggregate; for updates,
    the rows of changed keys in the partitions' files marked deleted (or, past `PURGE_SHARE`, the file rewritten
    without them). Returns what was written, the paths of the files it rewrote and the marked files' new vectors.
    A kcompact error of any of its tasks is raised once the job that ran the task is done (`TaskErrors`)."""
    from compaction.spark import table as data

    location, state = run.table.location, run.state
    schema = data.row_schema(run.strategy)
    rebuilt = {s.partition for s in spans if s.rebuild}
    updated = {s.partition for s in spans if not s.rebuild}
    errors = data.TaskErrors(spark)
    fresh = data.winners(data.topic_records(spark, store, run.refs, spans, errors), run.strategy, run.header)
    candidates = state.files_of(updated)
    if candidates:
        fresh = fresh.persist()
    part = fresh[data.PARTITION_COLUMN]
    changed = fresh.where(part.isin(sorted(updated)))
    share = data.PURGE_SHARE if run.table.deletion_vectors() else 0.0
    replaced, marked = data.mark_rows(spark, location, candidates, schema, changed, share, errors)
    if progress and candidates:
        progress.phase(f"table: {len(marked)} of {len(candidates)} files of updated partitions marked by deletion "
                       f"vectors, {len(replaced)} to rewrite")
    columns = [c for c in schema.fieldNames() if c != "key"]
    rows = fresh.where(part.isin(sorted(rebuilt | updated)) & fresh["value"].isNotNull()).select(
        data.PARTITION_COLUMN, "key", *columns)
    purged = [f for f in state.files if f.path in replaced]
    if purged:
        rows = rows.unionByName(data.kept_rows(spark, location, purged, schema, changed, errors).select(
            data.PARTITION_COLUMN, "key", *columns))
    input_bytes = sum(s.segment_bytes for s in spans) + sum(f.size for f in purged)
    tasks = max(1, -(-input_bytes // FILE_BYTES))
    written = data.write_files(rows, location, run.table.schema, tasks, errors)
    fresh.unpersist()
    return written, replaced, marked


def update_table(spark: SparkSession, store: ObjectStore, config: KcompactConfig, topic: str, location: Location,
                 now_ms: int, *, rebuild: bool = False, dry_run: bool = False,
                 progress: Progress | None = None) -> TableReport:
    """Bring the topic's table up to date (see `compaction.table`); returns what the run did.

    Safe to rerun at any point; concurrent runs apply each record once (the loser raises
    `CommitConflictError`).
    """
    started = time.monotonic()
    with transactional_batches_read_once():  # the plan's stable offsets, then the read's transactions
        run = plan_run(store, config, topic, location, now_ms, rebuild=rebuild, dry_run=dry_run)
        if progress:
            progress.phase(f"table plan: {len(run.plan.spans)} partitions to apply, {len(run.plan.up_to_date)} up "
                           f"to date (metadata version {run.plan.metadata_version}, table version "
                           f"{run.state.version})")
        report = TableReport(run, dry_run=True) if dry_run else execute(spark, store, run, progress)
    if not dry_run:
        upkept = time.monotonic()
        report.upkeep = keep_healthy(run.table, [s.partition for s in run.plan.spans] + list(run.plan.up_to_date),
                                     now_ms)
        report.seconds["upkeep"] = time.monotonic() - upkept
        if progress:
            progress.phase(f"table {report.upkeep.summary()}")
    report.seconds["total"] = time.monotonic() - started
    return report


__all__ = ["TableReport", "TableRun", "execute", "plan_run", "update_table"]
