"""POLICY: when a cleaned segment may be left as it is, unread, by a compaction round.

Kafka's cleaner re-reads and rewrites the whole clean prefix every round (on a remote tier, downloading
cleaned segments again and again is what makes compaction expensive). kcompact keeps a cleaned
segment — same id, same objects, same metadata row — when a rewrite could not change it. Why that is safe:

**The clean-region invariant.** After any round (Kafka's or kcompact's), the records below the cleaner
checkpoint hold each key at most once: the winner of that key among every record below the checkpoint
(`compaction.strategies.winner`: offset, timestamp or header strategy alike — the rewrite keeps exactly one
winner per key). Aborted data and keyless records are gone; what remains besides winners are empty batch
headers and transaction markers. Keeping a segment that holds no dirty key preserves the invariant: its
keys are still held nowhere else below the new checkpoint.

**Which records a round can remove from a clean segment S** (every batch is walked with the same rules):

1. a record whose key has a better-ranked record elsewhere in the round. Under the invariant, a key of S
   has no other record in the clean region, so only a *dirty* record of the same key can outrank it — for
   all three strategies (with `timestamp`/`header` the clean record may even win; then nothing in S
   changes either). If S's filter proves S holds none of the run's dirty keys, no record of S loses.
2. a tombstone whose delete horizon has passed (KIP-534: removed when `horizon <= now`). The filter
   records S's earliest horizon; S is rewritten once it has passed, exactly when Kafka would drop it.
   A tombstone that has no horizon yet (written by a Kafka before KIP-534) would get one from a rewrite;
   keeping S unread keeps it longer than delete.retention.ms, which Kafka allows: removal is "at or after"
   the horizon, never before. Likewise an empty batch header kept for a producer that has expired since
   would be dropped by a rewrite; unread it stays (it holds no record).
3. aborted data, and markers (COMMIT/ABORT) that became discardable. The transaction walk
   (`CleanedTransactionMetadata`) threads state from batch to batch across the whole round: an ABORT
   marker left unread would leave its producer "aborting" for the rest of the round and drop later,
   committed data. So a segment holding any transactional or control batch is never kept unread: the
   filter records that fact, and such a segment is always rewritten, as before.

Also never kept: a segment without a readable filter (it is read; kcompact writes filters for what it
writes and, lazily, for clean segments it had to read), a segment the checkpoint cuts through (only clean
segments entirely below the first dirty offset qualify), and anything in a `--force` run: force exists to
rewrite everything below the first uncleanable offset.

A kept segment also ends a group: groups stay contiguous offset ranges (`regroup_around`). Left at that,
every round would add one small segment (its dirty tail, cleaned, next to kept segments) that no later
round merges, where Kafka's grouping would. So a segment that could be kept but is small — below half of
segment.bytes — is rewritten when it can merge: with a neighbour that is rewritten anyway or small too, the
two fitting in segment.bytes (`merge_small`). That reads at most the small segments' bytes, and only while
they are small.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from enum import StrEnum

from compaction.bloom.filter import NO_HORIZON, FilterFacts
from compaction.metadata.model import SegmentMetadata
from compaction.planner.grouping import IndexSizer, group_segments_by_size


class Verdict(StrEnum):
    """What the filter test decided for one clean segment."""

    KEEP = "keep"  # holds none of the dirty keys and nothing a rewrite would drop: left as it is
    HIT = "hit"  # the filter may hold a dirty key: rewritten
    TRANSACTIONAL = "transactional"  # transactional or control batches: the marker walk must see it
    HORIZON_PASSED = "horizon_passed"  # a delete horizon has passed: a rewrite drops tombstones
    NO_FILTER = "no_filter"  # no filter, or one this version cannot read: rewritten
    MERGED = "merged"  # could be kept, but small: rewritten to merge with a neighbour (`merge_small`)

    @property
    def kept(self) -> bool:
        return self is Verdict.KEEP


def verdict(facts: FilterFacts | None, positives: int, now_ms: int) -> Verdict:
    """The verdict for a clean segment whose filter header says `facts` (None: no readable filter) and whose
    filter gave `positives` positives among the run's dirty keys. Pure."""
    if facts is None:
        return Verdict.NO_FILTER
    if facts.transactional:
        return Verdict.TRANSACTIONAL
    if facts.horizon_ms != NO_HORIZON and facts.horizon_ms <= now_ms:
        return Verdict.HORIZON_PASSED
    return Verdict.HIT if positives else Verdict.KEEP


def clean_segments(segments: Sequence[SegmentMetadata], first_dirty_offset: int) -> list[SegmentMetadata]:
    """The segments entirely below the first dirty offset: the only ones a round may keep unread."""
    return [s for s in segments if s.end_offset < first_dirty_offset]


def regroup_around(
    segments: Sequence[SegmentMetadata],
    kept: Collection[str],
    *,
    max_size: int,
    max_index_size: int,
    first_uncleanable_offset: int,
    index_sizes: IndexSizer,
) -> list[tuple[SegmentMetadata, ...]]:
    """Kafka's `groupSegmentsBySize` over each run of consecutive segments that are not `kept` (by id).

    A kept segment ends the group before it; the last offset of a run's last segment is estimated from
    the next segment's base (the kept one's), as Kafka's `lastOffsetForFirstSegment` does. With nothing
    kept this is exactly the planner's grouping. Pure.
    """
    groups: list[tuple[SegmentMetadata, ...]] = []
    run: list[SegmentMetadata] = []

    def close(next_base: int) -> None:
        if run:
            groups.extend(group_segments_by_size(run, max_size, max_index_size, next_base, index_sizes))
            run.clear()

    for s in segments:
        if s.segment_id in kept:
            close(s.start_offset)
        else:
            run.append(s)
    close(first_uncleanable_offset)
    return groups


def merge_small(segments: Sequence[SegmentMetadata], kept: Collection[str], segment_bytes: int) -> set[str]:
    """`kept` less the small segments that can merge with a neighbour (see the module docstring). Pure.

    `segments` are the round's segments in offset order; a segment not in `kept` is rewritten. Repeats until
    nothing changes, so a run of small segments next to a rewritten one is absorbed as far as it fits.
    """
    out = set(kept)

    def small(s: SegmentMetadata) -> bool:
        return 2 * s.segment_size_bytes < segment_bytes

    changed = True
    while changed:
        changed = False
        for i, s in enumerate(segments):
            if s.segment_id not in out or not small(s):
                continue
            for j in (i - 1, i + 1):
                if not 0 <= j < len(segments):
                    continue
                other = segments[j]
                joins = other.segment_id not in out or small(other)
                if joins and s.segment_size_bytes + other.segment_size_bytes <= segment_bytes:
                    out -= {s.segment_id, other.segment_id}
                    changed = True
                    break
    return out
