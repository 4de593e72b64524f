"""gc's execution: list, snapshot, plan, then retire -> delete objects -> finish, in that order.

The metadata changes before any object goes: no metadata row that a reader could serve ever points at a deleted
object. A row is moved to DELETE_SEGMENT_STARTED before any of its objects go, and DELETE_SEGMENT_FINISHED is
recorded only after they went. Each of the two steps is one metadata commit for every partition
(`commit_current_batch`); a partition that keeps losing to other commits is left for the next run, and the others go
on. A crash between two steps leaves a state the next run finishes: deleting a missing object succeeds,
`mark_deleted_finished` skips finished rows, and a DELETE_SEGMENT_STARTED row whose objects are all gone needs no
grace.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from dataclasses import replace

from compaction.errors import KcompactError
from compaction.gc.plan import (
    DEFAULT_GRACE_MS,
    DEFAULT_ORPHAN_GRACE_MS,
    GcPlan,
    GraceMs,
    PartitionGcPlan,
    grace_function,
    plan_gc,
    segment_action,
)
from compaction.gc.report import GcReport
from compaction.gc.wal import execute_wal_gc, plan_wal_gc
from compaction.metadata import (
    METADATA_TABLE_NAME,
    ChangeSet,
    MetadataSnapshot,
    MetadataTable,
    PartitionSnapshot,
    SegmentState,
    StateChange,
    TopicPartition,
    commit_current_batch,
    mark_deleted_finished,
)
from compaction.metadata.batch import Reader, known_reader
from compaction.metadata.table import reading
from compaction.metadata.upkeep import expire_log, expire_rows_files, vacuum_data_files
from compaction.storage.base import ObjectStore
from compaction.wal.model import WAL_TABLE_NAME
from compaction.wal.table import FINISHED_ROWS_RETENTION_MS, WalTable


def default_writer() -> str:
    return f"kcompact-gc@{socket.gethostname()}"


def collect_garbage(
    store: ObjectStore,
    table: MetadataTable,
    now_ms: int,
    *,
    grace_ms: GraceMs = DEFAULT_GRACE_MS,
    orphan_grace_ms: int = DEFAULT_ORPHAN_GRACE_MS,
    dry_run: bool = False,
    writer: str | None = None,
) -> GcReport:
    """Delete the objects no reader needs any more and record it in the metadata table.

    Lists the store first, then reads the metadata snapshot, plans (`compaction.gc.plan`, and for combined WAL
    objects `compaction.gc.wal`) and, unless `dry_run`, executes it, then expires the metadata table's old log
    entries (`metadata.upkeep.expire_log`, docs/metadata-table.md) and deletes its rows files and data files no
    version needs (`upkeep.expire_rows_files`, `upkeep.vacuum_data_files`). Idempotent: a rerun after success changes
    nothing, a rerun after a crash at any point converges. Never deletes an object of a live segment, of the
    metadata table, a combined object an entry still needs, or a key that is not a segment object key.

    Args:
        now_ms: the run's clock; every grace is measured against it.
        grace_ms: file.delete.delay.ms, for every topic or as a function of the topic name.
        orphan_grace_ms: the minimum age of an unreferenced object before it is deleted; keep it above the
            longest time a compaction run takes from its first upload to its commit.
        dry_run: plan and report only; nothing in the store or the table changes.
        writer: recorded as the writer of gc's metadata commits (default `kcompact-gc@<host>`).

    Raises:
        CommitConflictError: a partition kept changing under gc; rerun.
        TransientStoreError: the store kept failing; rerun.
    """
    listing = list(store.list(""))
    snapshot = table.snapshot()
    plan = plan_gc(listing, snapshot, now_ms, grace_ms=grace_ms, orphan_grace_ms=orphan_grace_ms)
    wal_table = WalTable.in_store(store)
    wal_plan = plan_wal_gc(wal_table.objects(), snapshot, now_ms, grace_function(grace_ms))
    if dry_run:
        report = plan.report(dry_run=True)
    else:
        report = execute_gc(plan, store, table, grace_ms=grace_ms, writer=writer or default_writer(),
                            read=snapshot).report(dry_run=False)
        upkeep = expire_log(table)  # first: it gives an older table the properties `vacuum_data_files` reads
        prefix, rows_files, vacuumed = METADATA_TABLE_NAME + "/", 0, 0
        if table.table_uri.rstrip("/") == store.delta_uri(METADATA_TABLE_NAME).rstrip("/"):  # the listing holds it
            own = [replace(o, key=o.key[len(prefix):]) for o in listing if o.key.startswith(prefix)]
            with reading(f"{table.table_uri} (upkeep)"):
                latest = table.delta_table()  # one load for both
            rows_files = expire_rows_files(table, own, lambda keys: store.delete_many(prefix + k for k in keys), now_ms,
                                           orphan_grace_ms, dt=latest)
            vacuumed = vacuum_data_files(table, own, lambda keys: store.delete_many(prefix + k for k in keys), now_ms,
                                         dt=latest)
        report = replace(report, metadata_log=f"{upkeep.summary()}; {rows_files} rows files of replaced "
                                              f"commits deleted; {vacuumed} data files removed longer ago than "
                                              "delta.deletedFileRetentionDuration deleted")
        if wal_plan.deletions:
            wal_plan = execute_wal_gc(wal_plan, store, wal_table, now_ms)
    if not wal_table.exists():
        return report
    wal, summary = wal_plan.to_dict(store, dry_run=dry_run), wal_plan.summary(store, dry_run=dry_run)
    if not dry_run:
        forgotten = wal_table.forget_finished(now_ms - FINISHED_ROWS_RETENTION_MS)
        compacted, vacuumed = wal_table.upkeep(lambda path: store.exists(f"{WAL_TABLE_NAME}/{path}"))
        wal["table_upkeep"] = {"rows_dropped_objects": forgotten, "files_compacted": compacted,
                               "files_vacuumed": vacuumed}
        summary += (f"; WAL table: rows of {forgotten} objects deleted over a day ago dropped, {compacted} small files "
                    f"compacted, {vacuumed} removed files vacuumed")
    return replace(report, wal=wal, wal_summary=summary)


def execute_gc(plan: GcPlan, store: ObjectStore, table: MetadataTable, *, grace_ms: GraceMs, writer: str,
               read: MetadataSnapshot | None = None) -> GcPlan:
    """Carry out `plan`; returns it as executed (rows that a concurrent commit moved first are dropped). `read`: the
    snapshot `plan` was made from, whose rows both commits (retiring rows, finishing deletions) start from while no
    other commit landed since.

    Raises:
        CommitConflictError: a partition's rows kept changing under gc; everything else was done. Rerun.
    """
    reader = known_reader(table, {} if read is None else {p.tp: read.partition(p.topic, p.partition)
                                                         for p in plan.partitions})
    retired, refused = _retire(table, [p for p in plan.partitions if p.retire], plan.now_ms, grace_function(grace_ms),
                               writer, reader)
    done = []
    for p in plan.partitions:
        tp = p.tp
        if tp in refused:
            continue
        ids = retired.get(tp, frozenset())
        deletions = tuple(d for d in p.deletions if not d.retire_first or d.segment_id in ids)
        done.append(replace(p, retire=tuple(i for i in p.retire if i in ids), deletions=deletions))
    _delete(store, (k for p in done for d in p.deletions for k in d.keys))
    finished = [d.segment_id for p in done for d in p.deletions]
    if finished:
        mark_deleted_finished(table, finished, writer=writer, now_ms=plan.now_ms,
                              within=([p.tp for p in done if p.deletions], reader))
    _delete(store, (o.key for p in done for o in p.orphans))
    if refused:
        raise next(iter(refused.values()))
    return replace(plan, partitions=tuple(done))


def _delete(store: ObjectStore, keys: Iterable[str]) -> None:
    store.delete_many(keys)


def _retire(table: MetadataTable, partitions: Iterable[PartitionGcPlan], now_ms: int,
            grace: Callable[[str], int], writer: str, reader: Reader, attempts: int = 3
            ) -> tuple[dict[TopicPartition, frozenset[str]], dict[TopicPartition, KcompactError]]:
    """Move each partition's `retire` to DELETE_SEGMENT_STARTED, all in one commit, re-deciding each row on the
    latest table; (the ids retired per partition, the partitions refused).

    gc is not fenced: like `mark_deleted_finished` it commits under the partition's current epoch
    (`commit_current_batch`), and a row that a concurrent commit moved meanwhile (a tier run finishing or retiring it,
    a compaction taking the partition) is decided again on the rows after it.
    """
    retired: dict[TopicPartition, frozenset[str]] = {}

    def retiring(p: PartitionGcPlan) -> Callable[[PartitionSnapshot], ChangeSet | None]:
        tp, grace_ms = p.tp, grace(p.topic)

        def plan(current: PartitionSnapshot) -> ChangeSet | None:
            rows = [s for s in map(current.segment, p.retire) if s is not None]
            todo = [s for s in rows if segment_action(current, s, now_ms, grace_ms, ()).retires]
            retired[tp] = frozenset(s.segment_id for s in todo)
            if not todo:
                return None
            return ChangeSet.planned_from(
                current,
                fencing_epoch=current.fencing_epoch,
                writer=writer,
                state_changes=[StateChange(s.segment_id, SegmentState.DELETE_SEGMENT_STARTED) for s in todo],
                topic_id=todo[0].topic_id,
            )

        return plan

    plans = {p.tp: retiring(p) for p in partitions}
    outcomes = commit_current_batch(table, plans, now_ms, attempts=attempts, reader=reader)
    refused = {tp: o for tp, o in sorted(outcomes.items()) if isinstance(o, KcompactError)}
    return {tp: ids for tp, ids in retired.items() if tp not in refused}, refused
