"""compaction.plan: Kafka's cleanable range, dirty ratio, KIP-354 delay, grouping and the run's order.

Scenarios after Kafka's LogCleanerManagerTest and LogCleanerTest (numbered across kcompact's tests),
adapted to the remote tier: the tier holds no active segment, so Kafka's "active segment base" is the log
end offset, and Kafka's LSO below the high watermark is the `first_unstable_offset` of a transaction tiered
without its marker.
"""

from __future__ import annotations

import itertools
import json
import pickle
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction.config import CleanupPolicy, KcompactConfig, TopicConfig
from compaction.errors import ConfigError
from compaction.metadata.model import (
    CleanerOffset,
    PartitionState,
    SegmentMetadata,
    TopicPartition,
)
from compaction.metadata.snapshot import MetadataSnapshot, PartitionSnapshot
from compaction.planner import (
    CompactionPlan,
    Decision,
    IndexSizes,
    UncleanableBound,
    build_plan,
    estimated_index_sizes,
    group_segments_by_size,
    plan_partition,
    regions_of,
)
from compaction.planner.explain import more_bytes_needed
from compaction.planner.regions import calculate_cleanable_bytes, clean_bytes, first_dirty_offset
from tests.factories import TOPIC_ID, segment

INT_MAX = 2**31 - 1
HOUR = 3_600_000
T0 = 1_700_000_000_000
COMPACT = frozenset({CleanupPolicy.COMPACT})


def cfg(**kw: object) -> TopicConfig:
    return TopicConfig(cleanup_policy=kw.pop("cleanup_policy", COMPACT), **kw)  # type: ignore[arg-type]


def seg(start: int, end: int, size: int = 100, max_ts: int = T0, first_ts: int | None = None, topic: str = "t",
        partition: int = 0) -> SegmentMetadata:
    return segment(start, end, segment_id=f"{topic}-{partition}-{start:012d}", topic=topic, partition=partition,
                   size=size, max_ts=max_ts, event_ts=T0, first_ts=first_ts, fencing_epoch=1)


def chain(sizes: Sequence[int], span: int = 10, **kw: object) -> list[SegmentMetadata]:
    """Adjacent segments of `span` offsets each, with the given sizes."""
    return [seg(i * span, i * span + span - 1, size, **kw) for i, size in enumerate(sizes)]  # type: ignore[arg-type]


def part(
    segments: Sequence[SegmentMetadata], checkpoint: int | None = None, topic: str = "t", p: int = 0
) -> PartitionSnapshot:
    vector = (CleanerOffset(1, checkpoint),) if checkpoint is not None else ()
    state = PartitionState(topic, TOPIC_ID, p, 1, 3, vector, (), 0, "w")
    return PartitionSnapshot(topic, p, 7, state, tuple(segments))


def snapshot(*partitions: PartitionSnapshot) -> MetadataSnapshot:
    return MetadataSnapshot(7, {TopicPartition(p.topic, p.partition): p for p in partitions})


# --- scenario 25: LogToClean byte accounting ----------------------------------------------------------

SIZES_25 = [71, 73, 79, 83, 89, 97]  # six single-record segments, segment.bytes 100
SEGS_25 = [seg(i, i, size) for i, size in enumerate(SIZES_25)]


@pytest.mark.parametrize(
    ("first_dirty", "uncleanable", "clean", "cleanable"),
    [
        (2, 4, SIZES_25[0] + SIZES_25[1], SIZES_25[2] + SIZES_25[3]),  # testLogToCleanWithUncleanableSection
        (2, 6, SIZES_25[0] + SIZES_25[1], sum(SIZES_25[2:])),  # up to the log end
        (5, 5, sum(SIZES_25[:5]), 0),  # firstDirty = uncleanable = "active" base: total = log - active
        (0, 0, 0, 0),
    ],
)
def test_log_to_clean_byte_accounting(first_dirty: int, uncleanable: int, clean: int, cleanable: int) -> None:
    assert clean_bytes(SEGS_25, first_dirty) == clean
    assert calculate_cleanable_bytes(SEGS_25, first_dirty, uncleanable) == (uncleanable, cleanable)
    unstable = uncleanable if uncleanable < 6 else None
    regions = regions_of(SEGS_25, first_dirty, cfg(segment_bytes=100), T0, first_unstable_offset=unstable)
    assert (regions.clean_bytes, regions.cleanable_bytes) == (clean, cleanable)
    assert regions.total_bytes == clean + cleanable
    assert regions.uncleanable_bytes == sum(SIZES_25[uncleanable:])
    if clean + cleanable:
        assert regions.dirty_ratio == pytest.approx(cleanable / (clean + cleanable), abs=1e-6)


def test_total_bytes_when_first_dirty_is_the_active_base() -> None:
    regions = regions_of(SEGS_25, 5, cfg(), T0, first_unstable_offset=5)
    assert regions.total_bytes == sum(SIZES_25) - SIZES_25[5]


def test_mid_segment_checkpoint_counts_the_segment_as_clean_and_dirty() -> None:
    segs = chain([100, 200, 300])  # [0,9] [10,19] [20,29]
    regions = regions_of(segs, 15, cfg(), T0)
    assert (regions.clean_bytes, regions.cleanable_bytes, regions.first_uncleanable_offset) == (300, 500, 30)


def test_uncleanable_offset_is_rounded_down_to_a_segment_base() -> None:
    segs = chain([100] * 4)
    assert calculate_cleanable_bytes(segs, 0, 25) == (20, 200)
    regions = regions_of(segs, None, cfg(), T0, first_unstable_offset=25)
    assert (regions.first_uncleanable_dirty_offset, regions.first_uncleanable_offset) == (25, 20)


# --- scenario 34: cleanable range ----------------------------------------------------------------------

EIGHT = chain([100] * 8)  # offsets [0, 80)
HALF = chain([100] * 4, max_ts=T0) + [seg(40 + i * 10, 49 + i * 10, max_ts=T0 + HOUR + 1) for i in range(4)]


@pytest.mark.parametrize(
    ("name", "segments", "min_lag", "now", "unstable", "uncleanable", "bound"),
    [
        ("ForNone: LSO 50", EIGHT, 0, T0, 50, 50, UncleanableBound.FIRST_UNSTABLE_OFFSET),
        ("ForNone: LSO inside a segment", EIGHT, 0, T0, 55, 55, UncleanableBound.FIRST_UNSTABLE_OFFSET),
        ("ActiveSegment: HW = LEO", EIGHT, 0, T0, None, 80, UncleanableBound.LOG_END),
        ("ForTime: second block is young", HALF, HOUR, T0 + HOUR + 1, None, 40, UncleanableBound.MIN_COMPACTION_LAG),
        ("ForShortTime", EIGHT, HOUR, T0 + HOUR + 1, None, 80, UncleanableBound.LOG_END),
        ("ForShortTime: lag not passed", EIGHT, HOUR, T0 + HOUR - 1, None, 0, UncleanableBound.MIN_COMPACTION_LAG),
        ("lag passes exactly at max_ts + lag", EIGHT, HOUR, T0 + HOUR, None, 80, UncleanableBound.LOG_END),
        ("LSO below the min-lag bound", HALF, HOUR, T0 + HOUR + 1, 30, 30, UncleanableBound.FIRST_UNSTABLE_OFFSET),
    ],
)  # fmt: skip
def test_cleanable_offsets(
    name: str,
    segments: list[SegmentMetadata],
    min_lag: int,
    now: int,
    unstable: int | None,
    uncleanable: int,
    bound: UncleanableBound,
) -> None:
    regions = regions_of(segments, None, cfg(min_compaction_lag_ms=min_lag), now, first_unstable_offset=unstable)
    assert (regions.first_dirty_offset, regions.first_uncleanable_dirty_offset) == (0, uncleanable), name
    assert regions.uncleanable_bound is bound, name


# testUndecidedTransactionalDataNotCleanable: an open txn at offsets 0-2, its ABORT marker at 3 tiered later.
TXN = [seg(0, 2, max_ts=T0), seg(3, 3, max_ts=T0 + HOUR + 1)]


@pytest.mark.parametrize(
    ("unstable", "now", "cleanable_range"),
    [
        (0, T0 + HOUR + 1, (0, 0)),  # no marker tiered yet: nothing
        (None, T0 + HOUR + 1, (0, 3)),  # marker tiered, its segment still within the lag
        (None, T0 + 2 * HOUR + 2, (0, 4)),  # after another lag
    ],
)
def test_undecided_transactional_data_is_not_cleanable(
    unstable: int | None, now: int, cleanable_range: tuple[int, int]
) -> None:
    regions = regions_of(TXN, None, cfg(min_compaction_lag_ms=HOUR), now, first_unstable_offset=unstable)
    assert (regions.first_dirty_offset, regions.first_uncleanable_offset) == cleanable_range


@pytest.mark.parametrize(
    ("checkpoint", "log_start", "log_end", "first_dirty", "reset"),
    [
        (None, 20, 80, 20, False),
        (30, 20, 80, 30, False),
        (80, 20, 80, 80, False),
        (81, 20, 80, 20, True),  # above the log end: corruption at the end, clean everything
        (10, 20, 80, 20, True),  # below the log start: the prefix was deleted
    ],
)
def test_checkpoint_reset(checkpoint: int | None, log_start: int, log_end: int, first_dirty: int, reset: bool) -> None:
    assert first_dirty_offset(checkpoint, log_start, log_end) == (first_dirty, reset)
    segs = [seg(o, o + 9) for o in range(log_start, log_end, 10)]
    regions = regions_of(segs, checkpoint, cfg(), T0)
    assert (regions.first_dirty_offset, regions.checkpoint_reset) == (first_dirty, reset)


def test_checkpoint_comes_from_the_lineage() -> None:
    plan = plan_partition(part(EIGHT, checkpoint=40), cfg(), T0)
    assert plan.regions is not None and plan.regions.checkpoint == 40 and plan.regions.first_dirty_offset == 40
    plan = plan_partition(part(EIGHT), cfg(), T0)
    assert plan.regions is not None and plan.regions.checkpoint is None and plan.regions.first_dirty_offset == 0


def test_filthiest_of_20_25_30_comes_first() -> None:
    logs = [part([seg(i, i, topic=f"log{n}") for i in range(n)], checkpoint=20, topic=f"log{n}") for n in (20, 25, 30)]
    plan = build_plan(snapshot(*logs), KcompactConfig(cfg(min_cleanable_dirty_ratio=0.1)), T0)
    assert [p.topic for p in plan.partitions] == ["log30", "log25", "log20"]
    assert [p.decision for p in plan.partitions] == [
        Decision.DIRTY_RATIO,
        Decision.DIRTY_RATIO,
        Decision.NOTHING_CLEANABLE,
    ]
    assert plan.partitions[0].dirty_ratio == pytest.approx(10 / 30)
    assert plan.max_dirty_percent == 33


# --- scenario 36: compaction lag ----------------------------------------------------------------------

FIRST_BLOCK = chain([100] * 3, max_ts=T0, first_ts=T0)
SECOND_BLOCK = [seg(30 + 10 * i, 39 + 10 * i, max_ts=T0 + HOUR + 1, first_ts=T0 + HOUR + 1) for i in range(3)]


@pytest.mark.parametrize(
    ("segments", "now", "decision", "first_uncleanable"),
    [
        (FIRST_BLOCK, T0, Decision.NOTHING_CLEANABLE, 0),
        (FIRST_BLOCK, T0 + HOUR - 1, Decision.NOTHING_CLEANABLE, 0),
        (FIRST_BLOCK + SECOND_BLOCK, T0 + HOUR + 1, Decision.DIRTY_RATIO, 30),  # after lag + 1: the first block
        (FIRST_BLOCK + SECOND_BLOCK, T0 + 2 * HOUR + 2, Decision.DIRTY_RATIO, 60),
    ],
)
def test_min_compaction_lag(
    segments: list[SegmentMetadata], now: int, decision: Decision, first_uncleanable: int
) -> None:
    plan = plan_partition(part(segments), cfg(min_compaction_lag_ms=HOUR), now)
    assert plan.decision is decision and plan.regions is not None
    assert plan.regions.first_uncleanable_offset == first_uncleanable


def test_min_lag_reason_says_when_the_next_segment_becomes_cleanable() -> None:
    plan = plan_partition(part(FIRST_BLOCK), cfg(min_compaction_lag_ms=HOUR), T0)
    assert plan.reason == (
        "not eligible: all 3 dirty segments are younger than min.compaction.lag.ms 1h "
        "(next becomes cleanable at 2023-11-14T23:13:20Z)"
    )


# Four clean segments, then two dirty ones whose first batches were written at T0; ratio 1.0 never passes.
MAX_LAG = chain([100] * 6, max_ts=T0, first_ts=T0)
MAX_LAG_CONFIG = cfg(min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=6 * HOUR)


@pytest.mark.parametrize(
    ("now", "delay", "decision"),
    [
        (T0 + 6 * HOUR - 1, 0, Decision.BELOW_RATIO),
        (T0 + 6 * HOUR, 0, Decision.BELOW_RATIO),  # cleanUntil == earliest: not yet (strict <)
        (T0 + 6 * HOUR + 1, 1, Decision.MUST_CLEAN),
        (T0 + 7 * HOUR, HOUR, Decision.MUST_CLEAN),
    ],
)
def test_max_compaction_lag_forces_a_clean(now: int, delay: int, decision: Decision) -> None:
    plan = plan_partition(part(MAX_LAG, checkpoint=40), MAX_LAG_CONFIG, now)
    assert (plan.max_compaction_delay_ms, plan.decision) == (delay, decision)
    assert plan.eligible is (decision is Decision.MUST_CLEAN)


def test_max_lag_uses_only_dirty_segments_and_positive_first_batch_timestamps() -> None:
    segs = [
        seg(0, 9, first_ts=T0 - 100 * HOUR),  # clean: ignored
        seg(10, 19, first_ts=-1),  # no timestamp: ignored
        seg(20, 29, first_ts=0),  # ignored (Kafka keeps values > 0)
        seg(30, 39, first_ts=None),
        seg(40, 49, first_ts=T0 + HOUR),
        seg(50, 59, first_ts=T0),
    ]
    regions = regions_of(segs, 10, cfg(max_compaction_lag_ms=HOUR), T0 + 2 * HOUR)
    assert (regions.earliest_dirty_batch_ms, regions.max_compaction_delay_ms) == (T0, HOUR)


def test_must_clean_needs_cleanable_bytes() -> None:
    # first batch is old but the segment's newest record is within min.compaction.lag.ms
    segs = [seg(0, 9, max_ts=T0 + 2 * HOUR, first_ts=T0)]
    plan = plan_partition(part(segs), cfg(min_compaction_lag_ms=HOUR, max_compaction_lag_ms=HOUR), T0 + HOUR + 1)
    assert plan.must_clean and plan.decision is Decision.NOTHING_CLEANABLE and not plan.eligible
    assert "max.compaction.lag.ms is exceeded by 1ms" in plan.reason


# --- the dirty ratio threshold is strict ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("clean", "dirty", "threshold", "decision"),
    [
        (100, 100, 0.5, Decision.BELOW_RATIO),  # 0.5 is not > 0.5
        (99, 101, 0.5, Decision.DIRTY_RATIO),
        (0, 100, 1.0, Decision.BELOW_RATIO),  # 1.0 is not > 1.0: a ratio of 1 never passes
        (100, 1, 0.0, Decision.DIRTY_RATIO),
        (100, 0, 0.0, Decision.NOTHING_CLEANABLE),
    ],
)
def test_dirty_ratio_must_be_strictly_greater(clean: int, dirty: int, threshold: float, decision: Decision) -> None:
    segs = [seg(0, 9, clean), seg(10, 19, dirty)]
    plan = plan_partition(part(segs, checkpoint=10), cfg(min_cleanable_dirty_ratio=threshold), T0)
    assert plan.decision is decision


@pytest.mark.parametrize(
    ("clean", "cleanable", "threshold"), [(100, 30, 0.5), (100, 0, 0.5), (1000, 1, 0.25), (7, 3, 0.3)]
)
def test_more_bytes_needed_is_the_least_that_passes(clean: int, cleanable: int, threshold: float) -> None:
    d = more_bytes_needed(clean, cleanable, threshold)
    assert d is not None
    assert (cleanable + d) / (clean + cleanable + d) > threshold
    assert d == 0 or (cleanable + d - 1) / (clean + cleanable + d - 1) <= threshold
    assert more_bytes_needed(clean, cleanable, 1.0) is None


# --- reasons ----------------------------------------------------------------------------------------------

RATIO_1_LAG_12H = cfg(min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=12 * HOUR)
LAG_1H = cfg(max_compaction_lag_ms=HOUR)
REASONS = [
    (part([]), cfg(), False, Decision.NOTHING_TIERED, "nothing tiered"),
    (part(EIGHT), TopicConfig(), False, Decision.NOT_COMPACTED, "cleanup.policy=delete: not a compacted topic"),
    (part(EIGHT, 80), cfg(), False, Decision.NOTHING_CLEANABLE, "not eligible: nothing dirty, all of [0, 80) is clean"),
    (part(EIGHT), cfg(), False, Decision.DIRTY_RATIO, "eligible: dirty ratio 1.00 > min.cleanable.dirty.ratio 0.50"),
    (part(EIGHT, 70), cfg(), False, Decision.BELOW_RATIO,
     "not eligible: dirty ratio 0.12 ≤ min.cleanable.dirty.ratio 0.50; eligible after ~601 B more cleanable bytes"),
    (part(chain([100, 0]), 10), cfg(), False, Decision.NOTHING_CLEANABLE,
     "not eligible: the cleanable segments [10, 20) hold 0 bytes"),
    (part(MAX_LAG, 40), RATIO_1_LAG_12H, False, Decision.BELOW_RATIO,
     "not eligible: dirty ratio 0.33 ≤ min.cleanable.dirty.ratio 1.00; no ratio exceeds 1.00: eligible only when "
     "the oldest dirty batch (2023-11-14T22:13:20Z) passes max.compaction.lag.ms 12h at 2023-11-15T10:13:20.001Z"),
    (part(MAX_LAG, 40), cfg(min_cleanable_dirty_ratio=1.0), False, Decision.BELOW_RATIO,
     "no ratio exceeds 1.00 and max.compaction.lag.ms is not set: only --force will clean it"),
    (part(EIGHT, 40), cfg(max_compaction_lag_ms=HOUR), False, Decision.BELOW_RATIO,
     "eligible after ~1 B more cleanable bytes (no dirty segment records a first-batch timestamp"),
    (part(MAX_LAG, 40), LAG_1H, False, Decision.MUST_CLEAN, "must clean: the oldest dirty batch (2023-11-14T22:13"),
    (part(EIGHT, 70), cfg(), True, Decision.FORCED, "forced (without --force: not eligible: dirty ratio 0.12"),
    (part(EIGHT, 80), cfg(), True, Decision.FORCED, "forced (without --force: not eligible: nothing dirty"),
    (part(EIGHT, 100), cfg(), False, Decision.DIRTY_RATIO, "cleaner checkpoint 100 is outside the log [0, 80]"),
]  # fmt: skip


@pytest.mark.parametrize(("snap", "config", "force", "decision", "fragment"), REASONS)
def test_reasons_say_why(
    snap: PartitionSnapshot, config: TopicConfig, force: bool, decision: Decision, fragment: str
) -> None:
    plan = plan_partition(snap, config, T0 + 10 * HOUR, force=force)
    assert plan.decision is decision
    assert fragment in plan.reason
    assert plan.reason.strip() and plan.reason.lower() not in ("no", "nope", "not eligible")


def test_unstable_reason_names_the_offset() -> None:
    plan = plan_partition(part(EIGHT), cfg(), T0, first_unstable_offset=0)
    assert plan.reason.startswith("not eligible: a transaction tiered without its marker starts at offset 0")


# --- scenarios 28, 29: segment grouping -------------------------------------------------------------

TEN = chain([300] * 10)  # segment.bytes 300, index.interval 1: every segment alike


@pytest.mark.parametrize(
    ("max_size", "max_index", "index", "lengths"),
    [
        (INT_MAX, INT_MAX, IndexSizes(16, 24), [10]),
        (1, INT_MAX, IndexSizes(16, 24), [1] * 10),
        (INT_MAX, 1, IndexSizes(16, 24), [1] * 10),
        (3 * 300 + 1, INT_MAX, IndexSizes(16, 24), [3, 3, 3, 1]),  # size of the first 3, + 1
        (3 * 300, INT_MAX, IndexSizes(16, 24), [3, 3, 3, 1]),  # <=: exactly full is fine
        (INT_MAX, 3 * 16 + 1, IndexSizes(16, 12), [3, 3, 3, 1]),  # offset-index size of the first 3, + 1
        (INT_MAX, 3 * 24 + 1, IndexSizes(12, 24), [3, 3, 3, 1]),  # time-index size of the first 3, + 1
        (INT_MAX, 3 * 16 + 1, IndexSizes(16, 24), [2, 2, 2, 2, 2]),  # both limits hold at once
    ],
)
def test_segment_grouping(max_size: int, max_index: int, index: IndexSizes, lengths: list[int]) -> None:
    groups = group_segments_by_size(TEN, max_size, max_index, 100, lambda _: index)
    assert [len(g) for g in groups] == lengths
    assert [s for g in groups for s in g] == TEN  # in order, nothing lost
    assert all(a.start_offset < b.start_offset for g in groups for a, b in itertools.pairwise(g))


@pytest.mark.parametrize(
    ("bases", "sizes", "first_uncleanable", "lengths"),
    [
        ([0, INT_MAX, INT_MAX + 1], [10, 10, 10], INT_MAX + 2, [2, 1]),  # next base - 1 - 0 == Int.MaxValue
        ([0, INT_MAX, INT_MAX + 2], [10, 10, 10], INT_MAX + 3, [1, 2]),  # one more: the second cannot join
        ([0, INT_MAX + 1], [10, 10], INT_MAX + 1, [2]),  # last one bounded by first uncleanable - 1
        ([0, INT_MAX + 1], [10, 10], INT_MAX + 2, [1, 1]),
        ([0, INT_MAX + 1], [10, 0], INT_MAX + 2, [2]),  # an empty segment joins whatever the span
        ([0, 2**40], [0, 0], 2**40 + 5, [2]),  # two empty segments merge into one
    ],
)
def test_grouping_over_sparse_offsets(
    bases: list[int], sizes: list[int], first_uncleanable: int, lengths: list[int]
) -> None:
    ends = [b - 1 for b in bases[1:]] + [first_uncleanable - 1]
    segs = [seg(b, e, size) for b, e, size in zip(bases, ends, sizes, strict=True)]
    groups = group_segments_by_size(segs, INT_MAX, INT_MAX, first_uncleanable)
    assert [len(g) for g in groups] == lengths
    for g in groups:
        if any(s.segment_size_bytes for s in g[1:]):
            assert g[-1].end_offset - g[0].start_offset <= INT_MAX


@pytest.mark.parametrize(
    ("interval", "size", "expected"),
    [
        (4096, 0, IndexSizes(0, 0)),
        (4096, 4096, IndexSizes(0, 12)),  # an entry needs more than 4096 bytes before it
        (4096, 40970, IndexSizes(80, 132)),
        (0, 610, IndexSizes(80, 132)),  # interval 0: at most one entry per 61-byte batch
    ],
)
def test_estimated_index_sizes(interval: int, size: int, expected: IndexSizes) -> None:
    assert estimated_index_sizes(interval)(seg(0, 9, size)) == expected


def test_eligible_plans_group_everything_below_the_first_uncleanable_offset() -> None:
    plan = plan_partition(part(chain([60] * 8), checkpoint=20), cfg(segment_bytes=130), T0, first_unstable_offset=70)
    assert plan.eligible and plan.regions is not None and plan.regions.first_uncleanable_offset == 70
    assert [[s.start_offset for s in g] for g in plan.groups] == [[0, 10], [20, 30], [40, 50], [60]]


# --- the run's plan -------------------------------------------------------------------------------------


def test_must_clean_comes_before_a_filthier_partition() -> None:
    filthy = part(chain([10, 90]), checkpoint=10, topic="filthy")  # ratio 0.9
    late = part(chain([80, 20], first_ts=T0), checkpoint=10, topic="late")  # ratio 0.2, but past max lag
    skip = part(chain([100, 1]), checkpoint=10, topic="skip")
    config = KcompactConfig(cfg(max_compaction_lag_ms=HOUR))
    plan = build_plan(snapshot(skip, filthy, late), config, T0 + 2 * HOUR)
    assert [(p.topic, p.decision) for p in plan.partitions] == [
        ("late", Decision.MUST_CLEAN),
        ("filthy", Decision.DIRTY_RATIO),
        ("skip", Decision.BELOW_RATIO),
    ]
    assert [p.topic for p in plan.eligible] == ["late", "filthy"]
    assert plan.max_compaction_delay_ms == HOUR and plan.delayed_partitions == 1


def test_plan_records_version_clock_and_aggregates() -> None:
    a = part(chain([100, 300]), checkpoint=10, topic="a")
    b = part(chain([100, 100]), checkpoint=10, topic="b")
    plan = build_plan(snapshot(a, b), KcompactConfig(cfg()), T0)
    assert (plan.metadata_version, plan.now_ms, plan.forced) == (7, T0, False)
    assert plan.max_dirty_percent == 75 and plan.cleanable_bytes == 300 and plan.uncleanable_bytes == 0
    assert plan.partitions[0].commit_seq == 3 and plan.partitions[0].fencing_epoch == 1


def test_force_makes_every_compacted_partition_with_data_below_its_bound_eligible() -> None:
    dirty = part(chain([100, 1]), checkpoint=10, topic="dirty")
    clean = part(chain([100, 1]), checkpoint=20, topic="clean")
    deleted = part(chain([100, 1]), topic="deleted")
    config = KcompactConfig(cfg(), {"deleted": TopicConfig()})
    plan = build_plan(snapshot(dirty, clean, deleted), config, T0, force=True)
    by_topic = {p.topic: p for p in plan.partitions}
    assert by_topic["dirty"].decision is Decision.FORCED and by_topic["dirty"].reason.startswith("forced")
    assert by_topic["clean"].decision is Decision.FORCED, "a clean partition is recompacted (tombstone expiry)"
    assert not by_topic["deleted"].eligible
    assert plan.forced and sorted(p.topic for p in plan.eligible) == ["clean", "dirty"]


def test_selection_by_topic_and_partition() -> None:
    snap = snapshot(part(EIGHT, topic="a", p=0), part(EIGHT, topic="a", p=1), part(EIGHT, topic="b", p=0))
    config = KcompactConfig(cfg())
    assert len(build_plan(snap, config, T0).partitions) == 3
    assert [(p.topic, p.partition) for p in build_plan(snap, config, T0, topics=["a"]).partitions] == [
        ("a", 0),
        ("a", 1),
    ]
    assert [(p.topic, p.partition) for p in build_plan(snap, config, T0, topics="a", partition=1).partitions] == [
        ("a", 1)
    ]
    assert [(p.topic, p.partition) for p in build_plan(snap, config, T0, partition=0).partitions] == [
        ("a", 0),
        ("b", 0),
    ]
    unknown = build_plan(snap, config, T0, topics=["c"])
    assert unknown.partitions == () and unknown.notes == ("topic c: nothing tiered (not in metadata table version 7)",)
    missing = build_plan(snap, config, T0, topics=["b"], partition=5)
    assert [(p.topic, p.partition, p.reason) for p in missing.partitions] == [("b", 5, "nothing tiered")]
    with pytest.raises(ConfigError):
        build_plan(snap, config, T0, partition=-1)


def test_first_unstable_offsets_per_partition() -> None:
    snap = snapshot(part(EIGHT, topic="a"), part(EIGHT, topic="b"))
    plan = build_plan(snap, KcompactConfig(cfg()), T0, first_unstable_offsets={TopicPartition("a", 0): 30})
    by_topic = {p.topic: p.regions for p in plan.partitions}
    assert by_topic["a"] is not None and by_topic["a"].first_uncleanable_offset == 30
    assert by_topic["b"] is not None and by_topic["b"].first_uncleanable_offset == 80


def test_renderers() -> None:
    snap = snapshot(part(EIGHT, topic="a"), part(EIGHT, 70, topic="b"), part([], topic="c"))
    plan = build_plan(snap, KcompactConfig(cfg(), {"c": TopicConfig()}), T0)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["metadata_version"] == 7 and data["summary"]["cleanable_partitions"] == 1
    assert [p["topic"] for p in data["partitions"]] == ["a", "b", "c"]
    assert data["partitions"][0]["regions"]["uncleanable_bound"] == "log end"
    assert data["partitions"][0]["groups"][0]["segment_ids"][0] == EIGHT[0].segment_id
    text = plan.render_text()
    assert "a-0  CLEAN" in text and "b-0  SKIP" in text and "c-0  SKIP" in text
    assert all(p.reason in text for p in plan.partitions)


def test_plans_are_frozen_values() -> None:
    plan = build_plan(snapshot(part(EIGHT)), KcompactConfig(cfg()), T0)
    assert plan == build_plan(snapshot(part(EIGHT)), KcompactConfig(cfg()), T0)
    with pytest.raises(AttributeError):
        plan.now_ms = 1  # type: ignore[misc]
    assert isinstance(plan, CompactionPlan)
    assert pickle.loads(pickle.dumps(plan)) == plan


# --- properties -------------------------------------------------------------------------------------------


@st.composite
def partitions(draw: st.DrawFn) -> tuple[list[SegmentMetadata], int | None, int | None]:
    n = draw(st.integers(1, 12))
    spans = draw(st.lists(st.integers(1, 50), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(0, 500), min_size=n, max_size=n))
    segs, start = [], draw(st.integers(0, 1000))
    for span, size in zip(spans, sizes, strict=True):
        ts = draw(st.integers(T0 - 10 * HOUR, T0))
        segs.append(seg(start, start + span - 1, size, max_ts=ts, first_ts=ts - draw(st.integers(0, HOUR))))
        start += span
    bases = [s.start_offset for s in segs] + [start]
    checkpoint = draw(st.one_of(st.none(), st.sampled_from(bases)))
    unstable = draw(st.integers(segs[0].start_offset, start)) if draw(st.integers(0, 3)) == 0 else None
    return segs, checkpoint, unstable


@given(
    partitions(),
    st.sampled_from([0, HOUR, 5 * HOUR]),
    st.sampled_from([5 * HOUR, 20 * HOUR, 2**63 - 1]),
    st.sampled_from([0.0, 0.3, 0.5, 1.0]),
    st.booleans(),
)
def test_regions_partition_the_log(
    case: tuple[list[SegmentMetadata], int | None, int | None], min_lag: int, max_lag: int, ratio: float, force: bool
) -> None:
    segs, checkpoint, unstable = case
    config = cfg(min_compaction_lag_ms=min_lag, max_compaction_lag_ms=max_lag, min_cleanable_dirty_ratio=ratio)
    plan = plan_partition(part(segs, checkpoint), config, T0, first_unstable_offset=unstable, force=force)
    r = plan.regions
    assert r is not None and plan.reason
    assert r.clean_bytes + r.cleanable_bytes + r.uncleanable_bytes == sum(s.segment_size_bytes for s in segs)
    assert r.log_start_offset <= r.first_dirty_offset <= r.first_uncleanable_offset <= r.log_end_offset
    assert 0.0 <= r.dirty_ratio <= 1.0
    below = r.clean_bytes + r.cleanable_bytes
    assert plan.eligible <= (r.cleanable_bytes > 0 or (force and below > 0))
    natural = r.cleanable_bytes > 0 and (r.must_clean or r.dirty_ratio > ratio)
    assert plan.eligible is ((force and below > 0) or natural)
    if plan.decision is Decision.FORCED:
        assert plan.reason.startswith("forced (without --force: ")
    else:
        assert plan.reason.startswith("not eligible") is (not plan.eligible)
    below = [s for s in segs if s.start_offset < r.first_uncleanable_offset]
    assert [s for g in plan.groups for s in g] == (below if plan.eligible else [])
