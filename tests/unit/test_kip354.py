"""Scenarios 34 (cleanable range) and 36 (compaction lag) at planner level, over metadata from tiered log dirs.

`tests/unit/test_plan.py` covers the same rules over hand-made metadata rows; here every segment row comes from
`kcompact tier` (max and first-batch timestamps read from the `.log`, open transactions from the producer
snapshot), and the plan is what `compaction.run.plan.plan` computes from the store. The tier never holds the
active segment, so Kafka's "HW = LEO" and "HW inside the active segment" both end at the tier's end.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from compaction.config import KcompactConfig, TopicConfig
from compaction.metadata import ChangeSet, SegmentState, StateChange, acquire_fencing_epoch, table_in_store
from compaction.metadata import commit as commit_change_set
from compaction.planner import Decision, PartitionPlan, Regions, UncleanableBound
from compaction.run.plan import plan
from compaction.storage import ObjectStore, open_store
from tests.scenario_log import ScenarioLog, tier

T0 = 1_700_000_000_000
HOUR = 3_600_000
LAG = {"min.compaction.lag.ms": HOUR}


def planned(store: ObjectStore, configs: Mapping[str, Mapping[str, object]], now: int) -> dict[str, PartitionPlan]:
    """The plan of every partition at `now`, by topic, as a run (not forced) would compute it."""
    config = KcompactConfig(
        defaults=TopicConfig.from_kafka({"cleanup.policy": "compact"}),
        topics={t: TopicConfig.from_kafka({"cleanup.policy": "compact", **c}) for t, c in configs.items()},
    )
    return {p.topic: p for p in plan(store, config, now).plan.partitions}


def regions(plans: Mapping[str, PartitionPlan], topic: str) -> Regions:
    found = plans[topic].regions
    assert found is not None, plans[topic].reason
    return found


def bound(plans: Mapping[str, PartitionPlan], topic: str) -> tuple[int, UncleanableBound]:
    r = regions(plans, topic)
    return r.first_uncleanable_offset, r.uncleanable_bound


def set_cleaner_offset(store: ObjectStore, topic: str, offset: int, retire_below: int = 0) -> None:
    """Commit a cleaner checkpoint (and retire the segments below `retire_below`), as a run or retention would."""
    table = table_in_store(store)
    epoch = acquire_fencing_epoch(table, topic, 0, "test", T0)
    snapshot = table.partition_snapshot(topic, 0)
    retired = [StateChange(s.segment_id, SegmentState.DELETE_SEGMENT_STARTED)
               for s in snapshot.live_segments if s.end_offset < retire_below]
    change = ChangeSet.planned_from(snapshot, fencing_epoch=epoch, writer="test", cleaner_offset=offset,
                                    state_changes=tuple(retired))
    commit_change_set(table, change, T0)


def records(log: ScenarioLog, count: int, per_segment: int) -> ScenarioLog:
    for i in range(count):
        log.record(i % 7, i)
        if (i + 1) % per_segment == 0:
            log.roll()
    log.roll()
    return log


def test_scenario_34_cleanable_offsets(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    hw = records(ScenarioLog("none", T0), 48, per_segment=6)
    timed = ScenarioLog("time", T0)
    for k in range(5):
        timed.record(k, k)
    timed.roll()
    timed.timestamp = T0 + HOUR + 1
    for k in range(5):
        timed.record(k, k)
    timed.roll()
    short = records(ScenarioLog("short", T0), 5, per_segment=1)
    undecided = ScenarioLog("undecided", T0)
    txn = undecided.producer(15)
    txn([1, 2])
    txn([3])
    undecided.roll()
    tier([hw, timed, short, undecided], tmp_path / "logs", store, T0)
    configs = {"none": {}, "time": LAG, "short": LAG, "undecided": LAG}

    t1 = planned(store, configs, T0 + HOUR + 1)
    assert bound(t1, "none") == (48, UncleanableBound.LOG_END), "testCleanableOffsetsForNone / ActiveSegment"
    assert bound(t1, "time") == (5, UncleanableBound.MIN_COMPACTION_LAG), "the first segment written at t1"
    assert bound(t1, "short") == (5, UncleanableBound.LOG_END), "testCleanableOffsetsForShortTime"
    assert regions(t1, "undecided").first_dirty_offset == 0
    assert bound(t1, "undecided") == (0, UncleanableBound.FIRST_UNSTABLE_OFFSET), "an open txn: [0, 0)"
    assert t1["undecided"].decision is Decision.NOTHING_CLEANABLE

    undecided.timestamp = T0 + HOUR + 1
    undecided.abort(15)
    undecided.roll()
    tier([undecided], tmp_path / "logs", store, undecided.timestamp)
    assert bound(planned(store, configs, T0 + HOUR + 1), "undecided") == (
        3, UncleanableBound.MIN_COMPACTION_LAG), "after the ABORT: [0, 3), the marker is younger than the lag"
    assert bound(planned(store, configs, T0 + 2 * HOUR + 2), "undecided") == (4, UncleanableBound.LOG_END)


def test_scenario_34_checkpoint_reset_and_filthiest_first(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    logs = {n: records(ScenarioLog(f"log{n}", T0), n, per_segment=5) for n in (20, 25, 30)}
    beyond = records(ScenarioLog("beyond", T0), 20, per_segment=5)
    below = records(ScenarioLog("below", T0), 20, per_segment=5)
    tier([*logs.values(), beyond, below], tmp_path / "logs", store, T0)
    for n in logs:
        set_cleaner_offset(store, f"log{n}", 20)
    set_cleaner_offset(store, "beyond", 40)
    set_cleaner_offset(store, "below", 5, retire_below=10)
    configs = {t: {"min.cleanable.dirty.ratio": 0.1} for t in ("log20", "log25", "log30", "beyond", "below")}
    plans = planned(store, configs, T0)

    assert [p.topic for p in plans.values() if p.topic.startswith("log")] == ["log30", "log25", "log20"]
    assert [plans[t].eligible for t in ("log30", "log25", "log20")] == [True, True, False]
    assert (regions(plans, "log30").first_dirty_offset, regions(plans, "log30").checkpoint_reset) == (20, False)
    over = regions(plans, "beyond")
    assert (over.checkpoint, over.first_dirty_offset, over.checkpoint_reset) == (40, 0, True), "checkpoint > LEO"
    under = regions(plans, "below")
    assert (under.log_start_offset, under.first_dirty_offset, under.checkpoint_reset) == (10, 10, True), (
        "checkpoint < log start")


def test_scenario_36_min_and_max_compaction_lag(tmp_path: Path) -> None:
    """Min lag 1 h: not cleanable before the lag passes, eligible after. Max lag 6 h with dirty ratio 1.0: the
    ratio never qualifies; a dirty first-batch timestamp older than now - max lag forces the clean (KIP-354),
    and the partition is planned before a filthier one."""
    store = open_store(str(tmp_path / "store"))
    young = records(ScenarioLog("minlag", T0), 5, per_segment=5)
    old = records(ScenarioLog("maxlag", T0), 10, per_segment=5)
    tier([young, old], tmp_path / "logs", store, T0)
    set_cleaner_offset(store, "maxlag", 5)
    configs: dict[str, Mapping[str, object]] = {
        "minlag": LAG,
        "maxlag": {"max.compaction.lag.ms": 6 * HOUR, "min.cleanable.dirty.ratio": 1.0},
    }
    before = planned(store, configs, T0 + HOUR - 1)
    assert before["minlag"].decision is Decision.NOTHING_CLEANABLE
    assert regions(before, "minlag").next_cleanable_at_ms == T0 + HOUR
    assert planned(store, configs, T0 + HOUR + 1)["minlag"].decision is Decision.DIRTY_RATIO

    on_time = planned(store, configs, T0 + 6 * HOUR)
    assert on_time["maxlag"].decision is Decision.BELOW_RATIO and on_time["maxlag"].max_compaction_delay_ms == 0
    late_run = plan(store, KcompactConfig(
        defaults=TopicConfig.from_kafka({"cleanup.policy": "compact"}),
        topics={t: TopicConfig.from_kafka({"cleanup.policy": "compact", **c}) for t, c in configs.items()},
    ), T0 + 6 * HOUR + 1000).plan
    late = {p.topic: p for p in late_run.partitions}
    assert late["maxlag"].decision is Decision.MUST_CLEAN
    assert (late["maxlag"].max_compaction_delay_ms, regions(late, "maxlag").earliest_dirty_batch_ms) == (1000, T0)
    assert late["minlag"].dirty_ratio > late["maxlag"].dirty_ratio
    assert [p.topic for p in late_run.eligible] == ["maxlag", "minlag"], "must-clean goes before the filthier one"
    assert (late_run.max_compaction_delay_ms, late_run.delayed_partitions) == (1000, 1)
