"""Rebasing a change set over segments appended since it was planned: a broker's tiering does not cost a compaction.

A change set planned at table version V is stale once any commit touched its partition after V, and `commit` used to
refuse it. Most such commits are harmless to it: a broker (or `kcompact tier`) appending the next segments of the
log, above everything the change set replaces or reads. `rebase` moves the change set onto the latest state when
every change since V is of that kind, comparing the partition at V with the latest:

- the partition row keeps its topic id and cleaner offsets (the fencing epoch is checked by the caller first: a
  zombie is fenced, never rebased); its leader-epoch lineage may grow;
- every segment row of V is unchanged, except one that was still being uploaded at V (COPY_SEGMENT_STARTED, which
  nothing reads) above the change set's range, which may since have finished or been abandoned;
- every segment row added since V starts above the change set's range, or is already being deleted: a new leader's
  copy over the tier goes to DELETE_SEGMENT_STARTED at its finish, its part above the tier's end live as a row of
  its own (`compaction.tier.overlap`). Such a row never served a reader: added live below the range, it would have
  overlapped the live rows the change set replaces. An upload still in progress in the range stays a conflict.

The range ends at the highest offset the change set touches: the last offset of each row it changes or adds a file
to, of each segment it adds, and the offset below its new cleaner offset. Anything else (another compaction, a new
cleaner offset, a row below the range) is a conflict as before. Rebasing a change set that already landed is refused
(its own rows changed the partition below the range), so it still cannot land twice; one that changes no segment row
(only the partition row, e.g. a cleaner offset that does not move) is never rebased, since its landing leaves no row
to tell it from an append. Pure.
"""

from __future__ import annotations

from dataclasses import replace

from compaction.errors import CommitConflictError
from compaction.metadata.change_set import ChangeSet
from compaction.metadata.model import SegmentMetadata, SegmentState
from compaction.metadata.snapshot import PartitionSnapshot


def range_end(cs: ChangeSet, planned: PartitionSnapshot) -> int:
    """The highest offset `cs` touches in `planned` (-1 if none): rows it changes, segments it adds, its cleaner
    offset."""
    touched = [c.segment_id for c in cs.state_changes] + [a.segment_id for a in cs.added_object_keys]
    ends = [s.end_offset for i in touched if (s := planned.segment(i)) is not None]
    ends += [n.end_offset for n in cs.new_segments]
    if cs.cleaner_offset is not None:
        ends.append(cs.cleaner_offset - 1)
    return max(ends, default=-1)


def _describe(s: SegmentMetadata) -> str:
    return f"segment {s.segment_id} [{s.start_offset}, {s.end_offset}] {s.state.name}"


def _why_not(cs: ChangeSet, planned: PartitionSnapshot, current: PartitionSnapshot, end: int) -> str | None:
    """What, since `planned`, is not a segment appended above `end`; None if nothing."""
    if not (cs.new_segments or cs.state_changes or cs.added_object_keys):
        return "a change set that changes no segment row, whose own landing (a lost reply) looks like an append"
    before, after = ([(c.epoch, c.offset) for c in p.state.cleaner_offsets] if p.state else []
                     for p in (planned, current))
    if before != after:
        return f"cleaner offsets (epoch, offset) {before} became {after}"
    for i in [c.segment_id for c in cs.state_changes] + [a.segment_id for a in cs.added_object_keys]:
        if planned.segment(i) is None:
            return f"segment {i} is not in the planned version"
    for old in planned.segments:
        new = current.segment(old.segment_id)
        if new == old:
            continue
        if new is None:
            return f"{_describe(old)} vanished"
        if old.state is not SegmentState.COPY_SEGMENT_STARTED or old.start_offset <= end:
            return f"{_describe(old)} became {new.state.name} (writer {new.writer!r})"
    for new in current.segments:
        if (planned.segment(new.segment_id) is None and new.start_offset <= end
                and new.state in (SegmentState.COPY_SEGMENT_STARTED, SegmentState.COPY_SEGMENT_FINISHED)):
            return f"{_describe(new)} was added by {new.writer!r}"
    return None


def rebase(cs: ChangeSet, planned: PartitionSnapshot, current: PartitionSnapshot) -> ChangeSet:
    """`cs`, planned from `planned`, as if planned from `current`, when every change in between only appended
    segments above the range `cs` touches (see the module docstring).

    The caller checks the topic id and fencing epoch first (`change_set.check_preconditions`).

    Raises:
        CommitConflictError: another change landed in between ("expected …, found …"); re-plan and retry.
    """
    end = range_end(cs, planned)
    why = _why_not(cs, planned, current, end)
    if why is not None:
        raise CommitConflictError(
            f"{cs.topic}-{cs.partition}: expected commit_seq {cs.expected_commit_seq}, found {current.commit_seq} "
            f"(planned at table version {planned.version}, now at {current.version}): expected no commit to the "
            f"partition after table version {planned.version} but segments appended above offset {end}, found "
            f"{why}; re-plan and retry"
        )
    return replace(cs, base_version=current.version, expected_commit_seq=current.commit_seq)
