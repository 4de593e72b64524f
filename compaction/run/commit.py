"""Commit a staged run: every partition's swap in one atomic metadata commit (`metadata.commit_batch`; one per
`metadata.BATCH_PARTITIONS` partitions), outcomes returned.

A partition's swap marks its new segments COPY_SEGMENT_FINISHED and the replaced ones DELETE_SEGMENT_STARTED and
advances the cleaner checkpoint, or is refused with "expected …, found …" (`FencedError`, `CommitConflictError`:
nothing of it landed, a rerun is safe) when a newer run or a conflicting commit got there first; its fencing epoch,
commit_seq and lineage are checked inside the commit, each partition on its own rows. One partition's refusal never
stops the others: they land in the same run (the commit is written again without it). `commit` returns every
outcome (committed, superseded, or failed at staging); with `raise_on_superseded=True` it then raises the first
`FencedError`/`CommitConflictError`, carrying the outcomes. Idempotent: a swap that already landed (an earlier
attempt whose reply was lost) is reported as committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from compaction.errors import CommitConflictError, FencedError, KcompactError
from compaction.metadata import (
    ChangeSet,
    CommitResult,
    MetadataTable,
    SegmentState,
    StateChange,
    TopicPartition,
    table_in_store,
)
from compaction.metadata import commit_batch as commit_change_sets
from compaction.metadata.batch import Reader, known_reader
from compaction.run.plan import RunPlan
from compaction.run.stage import StagedPartition, StagedRun


@dataclass(frozen=True)
class PartitionOutcome:
    topic: str
    partition: int
    committed: bool
    version: int | None
    error: str | None = None
    error_type: str | None = None
    exit_code: int = 0

    @property
    def superseded(self) -> bool:
        """A newer run or a conflicting commit got there first: nothing landed, rerunning is safe."""
        return self.error_type in (FencedError.__name__, CommitConflictError.__name__)

    @classmethod
    def failed(cls, topic: str, partition: int, error: KcompactError) -> PartitionOutcome:
        """Nothing landed for the partition: `error` says why, its exit code what to do."""
        return cls(topic, partition, False, None, **error.outcome_fields())

    def to_dict(self) -> dict[str, object]:
        """The JSON form (an entry of the run report's `failed`)."""
        return asdict(self)


def commit(staged: StagedRun, now_ms: int | None = None, *, raise_on_superseded: bool = False,
           progress: Callable[[PartitionOutcome], None] | None = None) -> list[PartitionOutcome]:
    """Commit every staged partition (their swaps in one atomic metadata commit); see the module docstring.

    `progress` is called with each partition's outcome once the commit that decides it is known (the CLI prints a
    line each).

    Raises:
        FencedError / CommitConflictError: only with `raise_on_superseded`, after every partition was tried;
            the error's `outcomes` attribute holds them all.
    """
    table = table_in_store(staged.run.store.open())
    landed = commit_partitions(table, staged.run, staged.partitions, now_ms, reader=staged.reader)
    outcomes = []
    for sp in staged.partitions:
        version = landed[sp.plan.tp]
        outcome = (PartitionOutcome.failed(sp.plan.topic, sp.plan.partition, version)
                   if isinstance(version, KcompactError) else
                   PartitionOutcome(sp.plan.topic, sp.plan.partition, True, version))
        outcomes.append(outcome)
        if progress is not None:
            progress(outcome)
    outcomes.extend(PartitionOutcome.failed(t, p, error) for (t, p), error in staged.failed.items())
    if raise_on_superseded:
        first = next((o for o in outcomes if o.superseded), None)
        if first is not None:
            error_type = FencedError if first.error_type == FencedError.__name__ else CommitConflictError
            where = f"{first.topic}-{first.partition}"
            message = first.error or ""
            error = error_type(message if message.startswith(f"{where}: ") else f"{where}: {message}")
            error.outcomes = outcomes  # type: ignore[attr-defined]
            raise error
    return outcomes


def commit_partition(table: MetadataTable, run: RunPlan, sp: StagedPartition, now_ms: int | None = None) -> int:
    """Land one partition's swap (`commit_partitions` of one); raises FencedError / CommitConflictError when
    superseded."""
    version = commit_partitions(table, run, [sp], now_ms)[sp.plan.tp]
    if isinstance(version, KcompactError):
        raise version
    return version


def commit_partitions(table: MetadataTable, run: RunPlan, staged: Sequence[StagedPartition],
                      now_ms: int | None = None, *, reader: Reader | None = None
                      ) -> dict[TopicPartition, int | KcompactError]:
    """Land the swaps of `staged` together; each partition's table version, or why it was refused (FencedError /
    CommitConflictError when superseded).

    Idempotent: if a swap already landed (an earlier attempt whose reply was lost), the table version that holds it
    is returned instead of a refusal. Kept segments are untouched, except that a filter written for one in this run
    joins its row's object keys, in the same commit. `reader`: where the partitions' latest rows come from (default:
    the table, and while it is still at their version the rows the staged partitions were taken at).
    """
    results = commit_change_sets(table, [_swap(run, sp) for sp in staged], run.now_ms if now_ms is None else now_ms,
                                 reader=reader or known_reader(table, {sp.plan.tp: sp.snapshot for sp in staged}))
    landed = {tp: r.version if isinstance(r, CommitResult) else r for tp, r in results.items()}
    # The outcome may be unknown, not refused: a commit that landed (an earlier attempt of this run, or an entry the
    # store could not tell as its own after a lost reply) is refused when tried again. Its new segment ids are fresh,
    # so finding them all in the table proves it landed.
    unknown = [sp for sp in staged if sp.new_segments
               and isinstance(landed[sp.plan.tp], CommitConflictError)]
    if unknown:
        current = table.partition_snapshots(sp.plan.tp for sp in unknown)
        for sp in unknown:
            found = current[sp.plan.tp]
            if all(found.segment(n.segment_id) is not None for n in sp.new_segments):
                landed[sp.plan.tp] = found.version
    return landed


def _swap(run: RunPlan, sp: StagedPartition) -> ChangeSet:
    """One partition's swap, planned from the snapshot its fencing epoch was taken at."""
    return ChangeSet.planned_from(
        sp.snapshot,
        fencing_epoch=sp.fencing_epoch,
        writer=run.writer,
        new_segments=sp.new_segments,
        state_changes=tuple(StateChange(s, SegmentState.DELETE_SEGMENT_STARTED) for s in sp.replaced),
        cleaner_offset=sp.cleaner_offset,
        run_id=run.run_id,
        added_object_keys=sp.added_object_keys,
    )


__all__ = ["PartitionOutcome", "commit", "commit_partition", "commit_partitions"]
