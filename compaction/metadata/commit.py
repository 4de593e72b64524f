"""Atomic, fenced commits to the metadata table: one Delta commit per partition change.

How a commit works (`commit`):

1. open the table at its latest version `v` and load the partition's rows at `v` (partition filters);
2. check the change set's preconditions against them and compute the partition's complete new row set
   (`change_set.apply_change_set`, pure);
3. write that row set with `write_deltalake(dt_at_v, rows, mode="overwrite",
   predicate="topic = '<t>' AND partition = <n>")`: one Delta commit that removes every file of the
   partition and adds the new one.

Step 3 is what makes the check in step 2 hold at commit time. delta-rs checks every commit that landed
after `v`: if one added or removed a file of this partition, ours fails with `CommitFailedError`, which
becomes `CommitConflictError`; nothing of it is visible. Commits to *other* partitions do not conflict
(the predicate is a literal on both partition columns; the tests check both cases on a local directory).
A Delta commit is a single log entry written put-if-absent, so the new row set lands whole or not at all;
files written by a failed attempt are never referenced and vacuum removes them. Blind appends are never
used for partition data: they would skip the conflict check.

Fencing as docs/fencing.md explains it. `acquire_fencing_epoch` bumps the partition's fencing epoch in its own
commit, like a new leader epoch, and adds the epoch's entry to the cleaner-offset vector. Every change
set carries the epoch of its run, and a commit whose epoch is not the partition's raises `FencedError`,
whatever the arrival order (old run commits before or after the new run's commit). Objects a fenced run
uploaded stay unreferenced; gc finds them with `snapshot.referenced_object_keys`. A fresh partition has
epoch 0, which a writer may use without acquiring (an unfenced single writer).

`commit` never re-plans: its change set was planned from a snapshot, and only the caller can re-plan. It does rebase
one over commits that only appended segments above everything it touches (`rebase`: a broker tiering the next
segment while a compaction runs), up to `REBASE_ATTEMPTS` times; any other commit in between is a conflict, and a
`FencedError` is never rebased. Writers that hold no fencing epoch of their own (the broker's plugin, gc, retention) use
`commit_current`, which plans on the latest rows and plans again when another commit, a compaction's new fencing
epoch included, lands first; so do the conveniences (`record_tier_finished`, `mark_deleted_finished`). A change
set that already landed cannot land twice (its `expected_commit_seq` is then stale, and its own rows forbid a rebase).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from compaction.errors import (
    CommitConflictError,
    FencedError,
    MetadataInvariantError,
    MetadataVersionNotFoundError,
    TransientStoreError,
)
from compaction.metadata.change_set import (
    ChangeSet,
    PartitionRows,
    StateChange,
    acquire_rows,
    apply_change_set,
    check_preconditions,
)
from compaction.metadata.model import SegmentState, TopicPartition, check_topic, rows_to_arrow
from compaction.metadata.rebase import rebase
from compaction.metadata.snapshot import PartitionSnapshot
from compaction.metadata.table import MetadataTable, load_partition


@dataclass(frozen=True)
class CommitResult:
    """Where a commit landed: the table version it created and the partition's new commit_seq."""

    topic: str
    partition: int
    version: int
    commit_seq: int
    fencing_epoch: int


def partition_predicate(topic: str, partition: int) -> str:
    """The literal Delta predicate selecting exactly one partition's rows."""
    return f"topic = '{check_topic(topic)}' AND partition = {int(partition)}"


def _write(dt: DeltaTable, rows: PartitionRows) -> CommitResult:
    s = rows.state
    base = dt.version()
    metadata = {
        "kcompact.partition": f"{s.topic}-{s.partition}",
        "kcompact.commit_seq": str(s.commit_seq),
        "kcompact.fencing_epoch": str(s.fencing_epoch),
        "kcompact.writer": s.writer,
        "kcompact.run_id": s.run_id or "",
    }
    try:
        write_deltalake(
            dt,
            rows_to_arrow([s], rows.segments),
            mode="overwrite",
            predicate=partition_predicate(s.topic, s.partition),
            commit_properties=CommitProperties(custom_metadata=metadata),
        )
    except CommitFailedError as e:
        raise CommitConflictError(
            f"{s.topic}-{s.partition}: expected no commit to the partition after table version {base}, "
            f"found one (delta-rs: {str(e).splitlines()[0]}); re-plan and retry"
        ) from e
    except (DeltaError, OSError) as e:  # the store kept failing under delta-rs's own retries
        raise TransientStoreError(
            f"{s.topic}-{s.partition}: writing the metadata commit after table version {base} failed "
            f"(delta-rs: {str(e).splitlines()[0]}); re-read the partition and rerun"
        ) from e
    return CommitResult(s.topic, s.partition, int(dt.version()), s.commit_seq, s.fencing_epoch)


REBASE_ATTEMPTS = 5
"""How many times `commit` writes a change set it had to rebase before it gives up with the last conflict."""


def commit(table: MetadataTable, change_set: ChangeSet, now_ms: int) -> CommitResult:
    """Commit `change_set` atomically: all of its rows land in one Delta commit, or none.

    If commits landed on the partition since `change_set` was planned and they only appended segments above
    everything it touches, it is rebased onto them (`rebase`) and written on top, up to `REBASE_ATTEMPTS` times.

    Args:
        now_ms: the run's clock, stamped as `event_timestamp_ms` / `updated_ms`.

    Raises:
        FencedError: a run with a newer fencing epoch owns the partition. Stop; do not retry.
        CommitConflictError: another commit touched the partition since `change_set` was planned, other than by
            appending segments above it (seen in the preconditions, or by delta-rs at commit time), or appends kept
            winning the race `REBASE_ATTEMPTS` times. Re-plan from a fresh snapshot.
        MetadataInvariantError, InvalidStateTransitionError, TopicIdMismatchError: the change set is wrong.

    Not idempotent by design: a replay after success fails with CommitConflictError (expected commit_seq
    n, found n + 1), which is how a caller that lost the outcome finds out; then read the partition.
    """
    planned: PartitionSnapshot | None = None
    for attempt in range(1, REBASE_ATTEMPTS + 1):
        dt = table.delta_table()
        current = load_partition(dt, change_set.topic, change_set.partition, table.table_uri, table.storage_options)
        try:
            check_preconditions(current, change_set)
            landing = change_set
        except FencedError:
            raise
        except CommitConflictError as stale:
            planned = planned or _planned_snapshot(table, change_set, stale)
            landing = rebase(change_set, planned, current)
        try:
            return _write(dt, apply_change_set(current, landing, now_ms))
        except CommitConflictError:
            if attempt == REBASE_ATTEMPTS:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _planned_snapshot(table: MetadataTable, cs: ChangeSet, stale: CommitConflictError) -> PartitionSnapshot:
    """The partition as `cs` was planned from it; a version time travel cannot read any more is the plain conflict."""
    try:
        return table.partition_snapshot(cs.topic, cs.partition, cs.base_version)
    except MetadataVersionNotFoundError:
        raise stale from None


def _replanned(
    table: MetadataTable,
    tp: TopicPartition,
    build: Callable[[PartitionSnapshot], PartitionRows],
    attempts: int,
) -> CommitResult:
    """Load the latest partition, build its rows, write; if delta-rs saw a concurrent commit, start over.

    `build` raising (FencedError included) ends the loop at once: only the write's conflict is retried.
    """
    for attempt in range(1, attempts + 1):
        dt = table.delta_table()
        rows = build(load_partition(dt, tp.topic, tp.partition, table.table_uri, table.storage_options))
        try:
            return _write(dt, rows)
        except CommitConflictError:
            if attempt == attempts:
                raise
    raise MetadataInvariantError(f"attempts must be >= 1, found {attempts}")


def acquire_fencing_epoch(
    table: MetadataTable,
    topic: str,
    partition: int,
    writer: str,
    now_ms: int,
    *,
    topic_id: str | None = None,
    run_id: str | None = None,
    attempts: int = 5,
) -> int:
    """Take ownership of a partition: bump its fencing epoch in its own commit and return the new epoch.

    Every later change set of this run carries the returned epoch; any run holding an older epoch is
    fenced from then on. Two runs acquiring at once both get distinct epochs (the later one wins).
    `topic_id` is required for a partition the table does not know yet and checked otherwise.

    Raises:
        TopicIdMismatchError: `topic_id` differs from the recorded one.
        CommitConflictError: still conflicting after `attempts` tries.
    """
    tp = TopicPartition(topic, partition)
    result = _replanned(table, tp, lambda current: acquire_rows(current, topic_id, writer, now_ms, run_id), attempts)
    return result.fencing_epoch


def commit_current(
    table: MetadataTable,
    tp: TopicPartition,
    now_ms: int,
    plan: Callable[[PartitionSnapshot], ChangeSet | None],
    *,
    attempts: int = 5,
) -> CommitResult | None:
    """Commit a change planned on the partition's latest rows; plan it again if another commit lands first.

    The one rule for every writer that commits under the partition's *current* state rather than a run's own
    fencing epoch: a broker through the plugin, gc, retention, a tier run finishing its uploads. `plan` sees the
    rows at the version the write will be checked against, so a commit landing in between (another writer's, or a
    compaction taking a new fencing epoch) is a conflict delta-rs reports at write time, never a `FencedError` of
    an epoch this writer never held: it is planned again on the rows after it, up to `attempts` times. `plan`
    returning None means nothing is left to do: no commit, None returned.

    Raises:
        CommitConflictError: other commits kept landing first `attempts` times; rerun.
        Anything `plan` raises, at once (a deposed leader's `FencedError`, an invariant it checks), and what
        `apply_change_set` raises for a change set that breaks a rule (a fencing epoch `plan` took from elsewhere
        included: that one is `FencedError`, not retried).
    """
    if attempts < 1:
        raise MetadataInvariantError(f"attempts must be >= 1, found {attempts}")
    for attempt in range(1, attempts + 1):
        dt = table.delta_table()
        current = load_partition(dt, tp.topic, tp.partition, table.table_uri, table.storage_options)
        change_set = plan(current)
        if change_set is None:
            return None
        try:
            return _write(dt, apply_change_set(current, change_set, now_ms))
        except CommitConflictError:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _change(
    table: MetadataTable,
    tp: TopicPartition,
    attempts: int,
    now_ms: int,
    plan: Callable[[PartitionSnapshot], ChangeSet],
) -> CommitResult:
    result = commit_current(table, tp, now_ms, plan, attempts=attempts)
    assert result is not None  # plan never returns None
    return result


def record_tier_finished(
    table: MetadataTable,
    topic: str,
    partition: int,
    segment_ids: Iterable[str],
    *,
    fencing_epoch: int,
    writer: str,
    now_ms: int,
    run_id: str | None = None,
    attempts: int = 3,
) -> CommitResult:
    """Move uploaded segments from COPY_SEGMENT_STARTED to COPY_SEGMENT_FINISHED: they become live."""
    changes = tuple(StateChange(i, SegmentState.COPY_SEGMENT_FINISHED) for i in segment_ids)
    return _change(
        table,
        TopicPartition(topic, partition),
        attempts,
        now_ms,
        lambda current: ChangeSet.planned_from(
            current, fencing_epoch=fencing_epoch, writer=writer, state_changes=changes, run_id=run_id
        ),
    )


def mark_deleted_finished(
    table: MetadataTable,
    segment_ids: Iterable[str],
    *,
    writer: str,
    now_ms: int,
    run_id: str | None = None,
    attempts: int = 3,
) -> tuple[CommitResult, ...]:
    """Record that gc deleted the objects of `segment_ids` (DELETE_SEGMENT_STARTED -> FINISHED).

    One commit per partition involved. gc is not fenced: it commits under the partition's current epoch,
    because finishing a deletion an owner already started cannot hurt any owner. Idempotent: segments
    already in DELETE_SEGMENT_FINISHED are skipped, and a partition with nothing left gets no commit.

    Raises:
        MetadataInvariantError: an id the table does not know.
        InvalidStateTransitionError: a segment that is not in DELETE_SEGMENT_STARTED.
    """
    wanted = set(segment_ids)
    by_tp: dict[TopicPartition, set[str]] = defaultdict(set)
    for tp, p in table.snapshot().partitions.items():
        for s in p.segments:
            if s.segment_id in wanted:
                by_tp[tp].add(s.segment_id)
    unknown = wanted - {i for ids in by_tp.values() for i in ids}
    if unknown:
        raise MetadataInvariantError(f"{table.table_uri}: unknown segment ids {sorted(unknown)}")

    results = []
    for tp, ids in sorted(by_tp.items()):
        if _deletions_pending(table.partition_snapshot(tp.topic, tp.partition), ids):
            results.append(_change(table, tp, attempts, now_ms, _deletion_plan(ids, writer, run_id)))
    return tuple(results)


def _deletions_pending(current: PartitionSnapshot, ids: Iterable[str]) -> list[str]:
    return sorted(
        i for i in ids if (s := current.segment(i)) is not None and s.state is not SegmentState.DELETE_SEGMENT_FINISHED
    )


def _deletion_plan(ids: set[str], writer: str, run_id: str | None) -> Callable[[PartitionSnapshot], ChangeSet]:
    def plan(current: PartitionSnapshot) -> ChangeSet:
        return ChangeSet.planned_from(
            current,
            fencing_epoch=current.fencing_epoch,
            writer=writer,
            state_changes=(
                StateChange(i, SegmentState.DELETE_SEGMENT_FINISHED) for i in _deletions_pending(current, ids)
            ),
            run_id=run_id,
        )

    return plan
