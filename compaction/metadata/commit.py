"""Atomic, fenced commits to the metadata table: a partition's change lands whole or not at all, and a run's
partitions land together, in one Delta commit (or one per `batch.BATCH_PARTITIONS`).

How a partition's commit works (`commit`, and `commit_batch` for many):

1. open the table at its latest version `v` and load the partition's rows at `v` (partition filters; a batch's
   partitions in one read);
2. check the change set's preconditions against them and compute the partition's complete new row set
   (`change_set.apply_change_set`, pure);
3. write the row sets in one Delta commit on top of `v` that removes every file of exactly the partitions written
   and adds the new ones (`batch.land`, `delta_log.overwrite_partitions`; its commitInfo records the predicate
   `topic = '<t>' AND partition = <n>`, or `... partition IN (...)` per topic).

Step 3 is what makes the check in step 2 hold at commit time. The commit checks every commit that landed
after `v`: if one added or removed a file of a partition written, the write fails (`delta_log.DeltaConflict`) and
nothing of it is visible; the partitions that moved are checked again on their new rows (and count one of their
attempts), the others are written again with them, so a conflict costs only the partitions it touched:
`CommitConflictError` for a partition that kept losing, never for its neighbours in the batch. Commits to *other*
partitions do not conflict (the check is by both partition columns; the tests check both cases on a local
directory). A Delta commit is a single log entry written put-if-absent, so the new row sets land whole or not at
all; the files of an attempt that lost are never referenced, and it deletes them. Blind appends are never
used for partition data: they would skip the conflict check.

Fencing as docs/fencing.md explains it. `acquire_fencing_epoch` bumps the partition's fencing epoch in a commit of its
own, like a new leader epoch, and adds the epoch's entry to the cleaner-offset vector; `acquire_fencing_epochs` does
so for a run's partitions in one commit. Every change set carries the epoch of its run, and a partition whose epoch
is not the change set's is refused with `FencedError`, whatever the arrival order (old run commits before or after
the new run's commit); in a batch, the other partitions land. Objects a fenced run uploaded stay unreferenced; gc
finds them with `snapshot.referenced_object_keys`. A fresh partition has epoch 0, which a writer may use without
acquiring (an unfenced single writer).

`commit` never re-plans: its change set was planned from a snapshot, and only the caller can re-plan. It does rebase
one over commits that only appended segments above everything it touches (`rebase`: a broker tiering the next
segment while a compaction runs), up to `REBASE_ATTEMPTS` times; any other commit in between is a conflict, and a
`FencedError` is never rebased. Writers that hold no fencing epoch of their own (the broker's plugin, gc, retention,
a tier batch after its uploads) use `commit_current` (`commit_current_batch` for many partitions), which plans on
the latest rows and plans again when another commit, a compaction's new fencing epoch included, lands first; so do
the conveniences (`record_tier_finished`, `mark_deleted_finished`). A change set that already landed cannot land
twice (its `expected_commit_seq` is then stale, and its own rows forbid a rebase).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from deltalake import DeltaTable

from compaction.errors import (
    CommitConflictError,
    FencedError,
    KcompactError,
    MetadataInvariantError,
    MetadataVersionNotFoundError,
)
from compaction.metadata.batch import CommitResult, Landed, Outcome, Reader, known_reader, land
from compaction.metadata.change_set import (
    ChangeSet,
    PartitionRows,
    StateChange,
    acquire_rows,
    apply_change_set,
    check_preconditions,
)
from compaction.metadata.model import SegmentState, TopicPartition
from compaction.metadata.rebase import rebase
from compaction.metadata.snapshot import PartitionSnapshot
from compaction.metadata.table import MetadataTable, load_partition

REBASE_ATTEMPTS = 5
"""How many conflicts a change set of `commit` takes (each time rebased when it can be) before it gives up."""

Plan = Callable[[PartitionSnapshot], ChangeSet | None]
"""A writer's change to a partition, planned on its latest rows; None: nothing to do."""


def _one(outcome: CommitResult | KcompactError | None) -> CommitResult | None:
    if isinstance(outcome, KcompactError):
        raise outcome
    return outcome


def _result(outcome: Outcome) -> CommitResult | KcompactError | None:
    return outcome.result if isinstance(outcome, Landed) else outcome


def commit(table: MetadataTable, change_set: ChangeSet, now_ms: int) -> CommitResult:
    """Commit `change_set` atomically: all of its rows land in one Delta commit, or none.

    If commits landed on the partition since `change_set` was planned and they only appended segments above
    everything it touches, it is rebased onto them (`rebase`) and written on top, up to `REBASE_ATTEMPTS` times.

    Args:
        now_ms: the run's clock, stamped as `event_timestamp_ms` / `updated_ms`.

    Raises:
        FencedError: a run with a newer fencing epoch owns the partition. Stop; do not retry.
        CommitConflictError: another commit touched the partition since `change_set` was planned, other than by
            appending segments above it (seen in the preconditions, or by the commit's conflict check), or appends
            kept winning the race `REBASE_ATTEMPTS` times. Re-plan from a fresh snapshot.
        MetadataInvariantError, InvalidStateTransitionError, TopicIdMismatchError: the change set is wrong.

    Not idempotent by design: a replay after success fails with CommitConflictError (expected commit_seq
    n, found n + 1), which is how a caller that lost the outcome finds out; then read the partition.
    """
    result = _one(commit_batch(table, [change_set], now_ms)[change_set.tp])
    assert result is not None  # a change set always has rows to write
    return result


def commit_batch(table: MetadataTable, change_sets: Iterable[ChangeSet], now_ms: int, *, reader: Reader | None = None
                 ) -> dict[TopicPartition, CommitResult | KcompactError]:
    """Commit change sets of distinct partitions together: one Delta commit for all of them (`batch.land`), each
    partition checked, rebased or refused as `commit` does it, alone. `reader`: where the latest rows come from
    (`batch.Reader`; default: the table opened afresh for each attempt).

    Returns every partition's outcome: its `CommitResult`, or the error `commit` would have raised for it (nothing of
    that partition landed; the others did). Not idempotent, as `commit`.

    Raises:
        MetadataInvariantError: two change sets for one partition.
    """
    by_tp: dict[TopicPartition, ChangeSet] = {}
    for cs in change_sets:
        tp = cs.tp
        if tp in by_tp:
            raise MetadataInvariantError(f"{cs.topic}-{cs.partition}: two change sets for one partition in one commit")
        by_tp[tp] = cs
    planned = _PlannedVersions(table)
    outcomes = land(table, {tp: _landing(cs, planned, now_ms) for tp, cs in by_tp.items()}, REBASE_ATTEMPTS, reader)
    results: dict[TopicPartition, CommitResult | KcompactError] = {}
    for tp, outcome in outcomes.items():
        result = _result(outcome)
        assert result is not None  # a change set always has rows to write
        results[tp] = result
    return results


def _landing(cs: ChangeSet, planned: _PlannedVersions, now_ms: int) -> Callable[[PartitionSnapshot], PartitionRows]:
    """`cs`'s rows on the partition's latest rows: as planned, or rebased over appends; fenced never rebases."""

    def build(current: PartitionSnapshot) -> PartitionRows:
        try:
            check_preconditions(current, cs)
            landing = cs
        except FencedError:
            raise
        except CommitConflictError as stale:
            landing = rebase(cs, planned.partition(cs, stale), current)
        return apply_change_set(current, landing, now_ms)

    return build


class _PlannedVersions:
    """The partitions as change sets were planned from them, read by time travel once per version and partition."""

    def __init__(self, table: MetadataTable) -> None:
        self._table = table
        self._opened: dict[int, DeltaTable] = {}
        self._read: dict[tuple[int, TopicPartition], PartitionSnapshot] = {}

    def partition(self, cs: ChangeSet, stale: CommitConflictError) -> PartitionSnapshot:
        """The partition at `cs.base_version`; a version time travel cannot read any more is the plain conflict."""
        key = (cs.base_version, cs.tp)
        if key not in self._read:
            try:
                if cs.base_version not in self._opened:
                    self._opened[cs.base_version] = self._table.delta_table(cs.base_version)
            except MetadataVersionNotFoundError:
                raise stale from None
            self._read[key] = load_partition(self._opened[cs.base_version], cs.topic, cs.partition,
                                             self._table.table_uri, self._table.storage_options)
        return self._read[key]


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
    acquired = acquire_fencing_epochs(table, [tp], writer, now_ms, topic_ids={tp: topic_id} if topic_id else None,
                                      run_id=run_id, attempts=attempts)[tp]
    if isinstance(acquired, KcompactError):
        raise acquired
    return acquired.fencing_epoch


def acquire_fencing_epochs(
    table: MetadataTable,
    partitions: Iterable[TopicPartition],
    writer: str,
    now_ms: int,
    *,
    topic_ids: Mapping[TopicPartition, str] | None = None,
    run_id: str | None = None,
    attempts: int = 5,
    reader: Reader | None = None,
) -> dict[TopicPartition, PartitionSnapshot | KcompactError]:
    """`acquire_fencing_epoch` for every partition of a run, in one Delta commit (`batch.land`).

    Returns each partition as the acquiring commit left it (its `fencing_epoch` is the run's; its `version` the
    commit's, the state a change set of the run is planned from), or the error `acquire_fencing_epoch` would have
    raised for it; a partition refused or still conflicting after `attempts` tries does not hold back the others.
    `topic_ids` as `acquire_fencing_epoch`'s `topic_id`, per partition. Not idempotent: a rerun takes newer epochs.
    `reader`: where the latest rows come from (`batch.Reader`; default: the table opened afresh for each attempt).
    """
    ids = topic_ids or {}

    def taking(tp: TopicPartition) -> Callable[[PartitionSnapshot], PartitionRows]:
        return lambda current: acquire_rows(current, ids.get(tp), writer, now_ms, run_id)

    outcomes = land(table, {tp: taking(tp) for tp in set(partitions)}, attempts, reader)
    acquired: dict[TopicPartition, PartitionSnapshot | KcompactError] = {}
    for tp, outcome in outcomes.items():
        assert outcome is not None  # an acquire always has rows to write
        acquired[tp] = outcome.snapshot if isinstance(outcome, Landed) else outcome
    return acquired


def commit_current(
    table: MetadataTable,
    tp: TopicPartition,
    now_ms: int,
    plan: Plan,
    *,
    attempts: int = 5,
    reader: Reader | None = None,
) -> CommitResult | None:
    """Commit a change planned on the partition's latest rows; plan it again if another commit lands first.

    The one rule for every writer that commits under the partition's *current* state rather than a run's own
    fencing epoch: a broker through the plugin, gc, retention, a tier batch after its uploads. `plan` sees the
    rows at the version the write will be checked against, so a commit landing in between (another writer's, or a
    compaction taking a new fencing epoch) is a conflict the commit reports at write time, never a `FencedError` of
    an epoch this writer never held: it is planned again on the rows after it, up to `attempts` times. `plan`
    returning None means nothing is left to do: no commit, None returned. `commit_current_batch` is the same rule
    for many partitions in one commit.

    Raises:
        CommitConflictError: other commits kept landing first `attempts` times; rerun.
        Anything `plan` raises, at once (a deposed leader's `FencedError`, an invariant it checks), and what
        `apply_change_set` raises for a change set that breaks a rule (a fencing epoch `plan` took from elsewhere
        included: that one is `FencedError`, not retried).
    """
    return _one(commit_current_batch(table, {tp: plan}, now_ms, attempts=attempts, reader=reader)[tp])


def commit_current_batch(
    table: MetadataTable,
    plans: Mapping[TopicPartition, Plan],
    now_ms: int,
    *,
    attempts: int = 5,
    reader: Reader | None = None,
) -> dict[TopicPartition, CommitResult | KcompactError | None]:
    """`commit_current` for many partitions, in one Delta commit (`batch.land`): each partition's plan sees its latest
    rows and is planned again, alone, when a commit to it lands first.

    Returns every partition's outcome: its `CommitResult`, None when its plan found nothing to do, or the
    `KcompactError` `commit_current` would have raised for it (nothing of it landed; the others did). A plan raising
    anything else ends the call at once. Idempotent as far as the plans are (each sees the rows its last run left).
    `reader`: where the latest rows come from (`batch.Reader`; default: the table opened afresh for each attempt).
    """
    def build(plan: Plan) -> Callable[[PartitionSnapshot], PartitionRows | None]:
        def rows(current: PartitionSnapshot) -> PartitionRows | None:
            change_set = plan(current)
            return None if change_set is None else apply_change_set(current, change_set, now_ms)

        return rows

    outcomes = land(table, {tp: build(plan) for tp, plan in plans.items()}, attempts, reader)
    return {tp: _result(outcome) for tp, outcome in outcomes.items()}


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
    plan = tier_finished_plan(segment_ids, fencing_epoch=fencing_epoch, writer=writer, run_id=run_id)
    return _change(table, TopicPartition(topic, partition), attempts, now_ms, plan)


def tier_finished_plan(segment_ids: Iterable[str], *, fencing_epoch: int, writer: str, run_id: str | None = None
                       ) -> Callable[[PartitionSnapshot], ChangeSet]:
    """`record_tier_finished`'s change, for `commit_current_batch`: under `fencing_epoch`, the epoch the uploads were
    started under (a run that took the partition since fences them)."""
    changes = tuple(StateChange(i, SegmentState.COPY_SEGMENT_FINISHED) for i in segment_ids)
    return lambda current: ChangeSet.planned_from(current, fencing_epoch=fencing_epoch, writer=writer,
                                                  state_changes=changes, run_id=run_id)


def mark_deleted_finished(
    table: MetadataTable,
    segment_ids: Iterable[str],
    *,
    writer: str,
    now_ms: int,
    run_id: str | None = None,
    attempts: int = 3,
    within: tuple[Iterable[TopicPartition], Reader] | None = None,
) -> tuple[CommitResult, ...]:
    """Record that gc deleted the objects of `segment_ids` (DELETE_SEGMENT_STARTED -> FINISHED).

    One commit for every partition involved (`commit_current_batch`). gc is not fenced: it commits under the
    partition's current epoch, because finishing a deletion an owner already started cannot hurt any owner.
    Idempotent: segments already in DELETE_SEGMENT_FINISHED are skipped, and a partition with nothing left gets no
    row rewritten (none at all: no commit). `within`: the partitions that hold the ids, when the caller knows them,
    and the reader their rows come from (gc's, holding the rows it read and committed): only those are read, and
    through it; else the whole table is read to find them.

    Raises:
        MetadataInvariantError: an id the table does not know (before anything is committed).
        InvalidStateTransitionError: a segment that is not in DELETE_SEGMENT_STARTED; CommitConflictError: a
            partition kept changing. Either after the other partitions' deletions were recorded.
    """
    wanted = set(segment_ids)
    by_tp: dict[TopicPartition, set[str]] = defaultdict(set)
    if within is None:
        current = dict(table.snapshot().partitions)
        reader = known_reader(table, current)  # the rows just read, while current
    else:
        reader = within[1]
        current = reader.read(within[0])[1]
    for tp, p in current.items():
        for s in p.segments:
            if s.segment_id in wanted:
                by_tp[tp].add(s.segment_id)
    unknown = wanted - {i for ids in by_tp.values() for i in ids}
    if unknown:
        raise MetadataInvariantError(f"{table.table_uri}: unknown segment ids {sorted(unknown)}")

    plans = {tp: _deletion_plan(ids, writer, run_id) for tp, ids in by_tp.items()}
    outcomes = sorted(commit_current_batch(table, plans, now_ms, attempts=attempts, reader=reader).items())
    refused = [o for _, o in outcomes if isinstance(o, KcompactError)]
    if refused:
        raise refused[0]
    return tuple(o for _, o in outcomes if isinstance(o, CommitResult))


def _deletions_pending(current: PartitionSnapshot, ids: Iterable[str]) -> list[str]:
    return sorted(
        i for i in ids if (s := current.segment(i)) is not None and s.state is not SegmentState.DELETE_SEGMENT_FINISHED
    )


def _deletion_plan(ids: set[str], writer: str, run_id: str | None) -> Plan:
    def plan(current: PartitionSnapshot) -> ChangeSet | None:
        pending = _deletions_pending(current, ids)
        if not pending:
            return None
        return ChangeSet.planned_from(
            current,
            fencing_epoch=current.fencing_epoch,
            writer=writer,
            state_changes=(StateChange(i, SegmentState.DELETE_SEGMENT_FINISHED) for i in pending),
            run_id=run_id,
        )

    return plan
