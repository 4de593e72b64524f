"""Commit a staged run: each partition's swap in one atomic metadata commit, outcomes returned.

A partition's commit marks its new segments COPY_SEGMENT_FINISHED and the replaced ones DELETE_SEGMENT_STARTED and
advances the cleaner checkpoint, or is refused with "expected …, found …" (`FencedError`, `CommitConflictError`:
nothing landed, a rerun is safe) when a newer run or a conflicting commit got there first. One partition's refusal
never stops the others. `commit` returns every outcome (committed, superseded, or failed at staging); with
`raise_on_superseded=True` it then raises the first `FencedError`/`CommitConflictError`, carrying the outcomes.
Idempotent: a swap that already landed (an earlier attempt whose reply was lost) is reported as committed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from compaction.errors import CommitConflictError, FencedError, KcompactError
from compaction.metadata import ChangeSet, MetadataTable, SegmentState, StateChange, table_in_store
from compaction.metadata import commit as commit_change_set
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
    """Commit every staged partition (one atomic metadata commit each); see the module docstring.

    `progress` is called after each partition's outcome is known (the CLI prints a line with an ETA).

    Raises:
        FencedError / CommitConflictError: only with `raise_on_superseded`, after every partition was tried;
            the error's `outcomes` attribute holds them all.
    """
    table = table_in_store(staged.run.store.open())
    outcomes = []
    for sp in staged.partitions:
        try:
            version = commit_partition(table, staged.run, sp, now_ms)
            outcome = PartitionOutcome(sp.plan.topic, sp.plan.partition, True, version)
        except KcompactError as exc:
            outcome = PartitionOutcome.failed(sp.plan.topic, sp.plan.partition, exc)
        outcomes.append(outcome)
        if progress is not None:
            progress(outcome)
    outcomes.extend(PartitionOutcome.failed(t, p, error) for (t, p), error in staged.failed.items())
    if raise_on_superseded:
        first = next((o for o in outcomes if o.superseded), None)
        if first is not None:
            error_type = FencedError if first.error_type == FencedError.__name__ else CommitConflictError
            error = error_type(f"{first.topic}-{first.partition}: {first.error}")
            error.outcomes = outcomes  # type: ignore[attr-defined]
            raise error
    return outcomes


def commit_partition(table: MetadataTable, run: RunPlan, sp: StagedPartition, now_ms: int | None = None) -> int:
    """Land one partition's swap; raises FencedError / CommitConflictError when superseded.

    Idempotent: if this very swap already landed (an earlier attempt whose reply was lost), returns the
    table version that holds it instead of refusing. Kept segments are untouched, except that a filter written
    for one in this run joins its row's object keys, in the same commit.
    """
    change = ChangeSet.planned_from(
        sp.snapshot,
        fencing_epoch=sp.fencing_epoch,
        writer=run.writer,
        new_segments=sp.new_segments,
        state_changes=tuple(StateChange(s, SegmentState.DELETE_SEGMENT_STARTED) for s in sp.replaced),
        cleaner_offset=sp.cleaner_offset,
        run_id=run.run_id,
        added_object_keys=sp.added_object_keys,
    )
    try:
        return commit_change_set(table, change, run.now_ms if now_ms is None else now_ms).version
    except CommitConflictError:
        # The outcome may be unknown, not refused: a commit whose reply was lost is reported as a conflict
        # when delta-rs retries it. Its new segment ids are fresh, so finding them in the table proves it landed.
        current = table.partition_snapshot(sp.plan.topic, sp.plan.partition)
        if sp.new_segments and all(current.segment(n.segment_id) is not None for n in sp.new_segments):
            return current.version
        raise


__all__ = ["PartitionOutcome", "commit", "commit_partition"]
