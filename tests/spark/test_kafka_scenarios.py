"""Scenarios after Kafka's LogCleanerTest, KIP-280's cases and the strategy property, end to end on remote segments.

Each scenario is one partition built batch by batch (`tests.scenario_log`), tiered into one local store and
cleaned by plan → stage → commit on Spark. All scenarios share one store and one schedule of passes, so a
pass is one Spark stage over every scenario cleaned at that step (`STEP_CLOCKS`); the assertions read the
live remote segments after each step with kafka-python.

Adaptations to remote segments, for every scenario:

- a pass maps every key of everything below the first uncleanable offset in one go (no partial maps, so
  no `endOffset` below the bound) and the cleaned range always starts at the log start; Kafka's
  `LogToClean(firstDirty, ...)` bounds become what our planner derives: the tier's end (Kafka's active
  segment base), a first unstable offset, or min.compaction.lag.ms;
- Kafka's `largeTimestamp` is a clock before the delete horizons set so far and `Long.MaxValue` one after,
  `runTwoPassClean(t)` a pass at t and one at t + delete.retention.ms + 1 (here: the next clock step);
- producer.id.expiration.ms is at its maximum: Kafka's unit tests never expire producers, while our clock
  moves by days between passes;
- the consumer's view (latest value per key, read_committed) must be the same after every pass.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest
from pyspark.sql import SparkSession

from compaction.config import KcompactConfig, TopicConfig
from compaction.format.batch import Header, TimestampType
from compaction.format.control import ControlType, control_key
from compaction.format.producer_snapshot import read_producer_snapshot
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import MetadataSnapshot, ObjectSuffix, table_in_store
from compaction.run.stats import PartitionStats
from compaction.storage import ObjectStore, open_store
from compaction.storage.indexes import get_part
from compaction.tier import tier_logdir
from tests.scenario_log import (
    RemoteBatch,
    RemoteRecord,
    ScenarioLog,
    clean,
    indexed_aborted_txns,
    keys_in_log,
    last_offsets_per_batch,
    last_sequences,
    offsets_in_log,
    remote_batches,
    tier,
)

T = 1_800_000_000_000
MINUTE = 60_000
HOUR = 3_600_000
DAY = 86_400_000
INT_MAX = 2**31 - 1
# The clock of each step: every step is one pass (one Spark stage) over the scenarios cleaned at it. Two steps
# at T play Kafka's repeated cleans at one time; each later clock is past the default horizon of the one before.
STEP_CLOCKS = (T, T, T + DAY + 1, T + DAY + 1, T + 2 * (DAY + 1), T + 3 * (DAY + 1))
BASE_CONFIG: dict[str, object] = {
    "cleanup.policy": "compact",
    "segment.bytes": 1024,
    "segment.index.bytes": 1024,
    "producer.id.expiration.ms": INT_MAX,
}
SEEDS = (1, 2, 5)
STRATEGIES = (("off", "offset"), ("ts", "timestamp"), ("hdr", "header"))
GENERATED = {f"{prefix}{seed}": strategy for seed in SEEDS for prefix, strategy in STRATEGIES}


def workload(seed: int) -> WorkloadSpec:
    """A small generated log dir with one topic per strategy: many aborts, timestamps out of order."""
    return WorkloadSpec(
        topics=tuple(TopicSpec(f"{prefix}{seed}", 1) for prefix, _strategy in STRATEGIES),
        records_per_partition=700, keys=60, value_bytes=16, segment_bytes=12 * 1024, records_per_batch=6,
        transactional_ratio=0.5, abort_ratio=0.5, out_of_order_ratio=0.3, tombstone_ratio=0.05, seed=seed,
    )


def long(v: int) -> bytes:
    return struct.pack(">q", v)


# --- the schedule --------------------------------------------------------------------------------------

Appends = Mapping[int, Callable[[], None]]
Build = Callable[[ScenarioLog], Appends]


@dataclass(frozen=True)
class Scenario:
    """A partition, the steps it is cleaned at, what is appended before which step, and its topic config."""

    topic: str
    build: Build
    passes: tuple[int, ...]
    config: Mapping[str, object] = field(default_factory=dict)
    segment_bytes: int = 1024
    leader_epoch: int = 0


SCENARIOS: dict[str, Scenario] = {}


def scenario(topic: str, passes: tuple[int, ...], **kw: object) -> Callable[[Build], Build]:
    """Register a scenario: `build` appends the initial batches and returns what to append before later steps."""

    def register(build: Build) -> Build:
        SCENARIOS[topic] = Scenario(topic, build, passes, **kw)  # type: ignore[arg-type]
        return build

    return register


def config_at(step: int) -> KcompactConfig:
    """The topic configs in force at `step`; `k280hdr` switches from the header strategy to offset at step 1."""
    topics = {s.topic: TopicConfig.from_kafka({**BASE_CONFIG, "segment.bytes": s.segment_bytes, **s.config})
              for s in SCENARIOS.values()}
    for topic, strategy in GENERATED.items():
        header = {"compaction.strategy.header": "version"} if strategy == "header" else {}
        topics[topic] = TopicConfig.from_kafka({**BASE_CONFIG, "compaction.strategy": strategy, **header})
    if step >= 1:
        topics["k280hdr"] = TopicConfig.from_kafka({**BASE_CONFIG, "compaction.strategy": "offset"})
    return KcompactConfig(defaults=TopicConfig.from_kafka(BASE_CONFIG), topics=topics)


@dataclass(frozen=True)
class View:
    """A partition's live remote segments after a step, and Kafka's assertion helpers over them."""

    batches: list[RemoteBatch]
    aborted: list[tuple[int, int, int]]
    cleaner_offset: int

    @classmethod
    def of(cls, store: ObjectStore, snapshot: MetadataSnapshot, topic: str) -> View:
        live = snapshot.live_segments(topic, 0)
        return cls(remote_batches(store, live), indexed_aborted_txns(store, live),
                   snapshot.partition(topic, 0).lineage.current)

    @property
    def keys(self) -> list[int]:
        return keys_in_log(self.batches)

    @property
    def offsets(self) -> list[int]:
        return offsets_in_log(self.batches)

    @property
    def last_offsets(self) -> list[int]:
        return last_offsets_per_batch(self.batches)

    @property
    def last_sequences(self) -> dict[int, int]:
        return last_sequences(self.batches)

    def survivors(self) -> dict[bytes, int]:
        """Key → offset of the data records; asserts one record per key."""
        found = [(r.key, r.offset) for b in self.batches if not b.is_control for r in b.records if r.key is not None]
        assert len({k for k, _ in found}) == len(found), f"more than one record for a key: {found}"
        return dict(found)


@dataclass
class History:
    store: ObjectStore
    logs: dict[str, ScenarioLog]
    views: dict[tuple[str, int], View] = field(default_factory=dict)
    tiered: dict[str, View] = field(default_factory=dict)
    bounds: dict[tuple[str, int], int] = field(default_factory=dict)
    stats: dict[tuple[str, int], PartitionStats] = field(default_factory=dict)
    view_changes: dict[tuple[str, int], object] = field(default_factory=dict)

    def view(self, topic: str, step: int) -> View:
        return self.views[(topic, step)]


@pytest.fixture(scope="module")
def history(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> History:
    """Run the whole schedule once: every scenario's passes, one Spark stage per step. The generated workloads of
    the strategy property are tiered with the scenarios and cleaned at step 0."""
    root = tmp_path_factory.mktemp("scenarios")
    store = open_store(str(root / "store"))
    logs: dict[str, ScenarioLog] = {}
    appends: dict[str, Appends] = {}
    for s in SCENARIOS.values():
        log = ScenarioLog(s.topic, T - HOUR, leader_epoch=s.leader_epoch, segment_bytes=s.segment_bytes)
        appends[s.topic] = s.build(log)
        logs[s.topic] = log
    for seed in SEEDS:
        generate_logdir(root / f"generated-{seed}", workload(seed))
        assert not [r.error for r in tier_logdir(root / f"generated-{seed}", store,
                                                 table_in_store(store, create=True), T - DAY) if r.error]
    out = History(store, logs)
    for step, clock in enumerate(STEP_CLOCKS):
        changed = [topic for topic, todo in appends.items() if step in todo]
        for topic in changed:
            appends[topic][step]()
        tier([logs[t] for t in (logs if step == 0 else changed)], root / "logs", store, clock)
        topics = [s.topic for s in SCENARIOS.values() if step in s.passes] + (list(GENERATED) if step == 0 else [])
        if step == 0:
            snapshot = table_in_store(store).snapshot()
            out.tiered = {topic: View.of(store, snapshot, topic) for topic in [*logs, *GENERATED]}
        done = clean(spark, store, config_at(step), clock, topics)
        out.view_changes |= {(f"{t}-{p}", step): change for (t, p), change in done.view_changes.items()}
        for sp in done.staged.partitions:
            out.stats[(sp.plan.topic, step)] = sp.stats
            assert sp.plan.regions is not None
            out.bounds[(sp.plan.topic, step)] = sp.plan.regions.first_uncleanable_offset
        snapshot = table_in_store(store).snapshot()
        for topic in topics:
            out.views[(topic, step)] = View.of(store, snapshot, topic)
    return out


# --- LogCleanerTest scenarios -------------------------------------------------------------------------


@pytest.mark.spark
def test_no_pass_changes_what_a_consumer_reads(history: History) -> None:
    """Every pass over an offset-strategy partition keeps each key's latest value (read_committed) as it was."""
    assert history.view_changes == {}


@scenario("s02", passes=(0, 1), segment_bytes=2048)
def _s02(log: ScenarioLog) -> Appends:
    log.producer(1, transactional=False)([1, 2, 3])
    log.producer(2, transactional=False)([3, 1, 4])
    log.producer(3, transactional=False)([1, 4])
    log.roll()

    def pid4() -> None:
        log.producer(4, transactional=False)([2])
        log.roll()

    return {1: pid4}


@pytest.mark.spark
def test_scenario_2_dedupe_with_idempotent_producers(history: History) -> None:
    first = history.view("s02", 0)
    assert first.last_offsets == [2, 5, 7]
    assert first.last_sequences == {1: 2, 2: 2, 3: 1}
    assert (first.keys, first.offsets) == ([2, 3, 1, 4], [1, 3, 6, 7])
    second = history.view("s02", 1)
    assert second.last_offsets == [2, 5, 7, 8]
    assert (second.keys, second.offsets) == ([3, 1, 4, 2], [3, 6, 7, 8])
    empty = second.batches[0]
    assert (empty.records, empty.producer_id, empty.base_sequence, empty.last_sequence) == ((), 1, 0, 2)
    # Kafka reloads the log and re-sends each batch to see it detected as a duplicate. Here: the producer
    # snapshot the tier carries still names, for every producer, a batch the log still holds.
    store = history.store
    last = table_in_store(store).live_segments("s02", 0)[-1]
    snapshot = read_producer_snapshot(get_part(store, last.object_key(ObjectSuffix.PRODUCER_SNAPSHOT) or "",
                                               ObjectSuffix.PRODUCER_SNAPSHOT))
    held = {(b.producer_id, b.last_offset, b.last_sequence) for b in second.batches}
    assert {(e.producer_id, e.last_offset, e.last_sequence) for e in snapshot} == {
        (1, 2, 2), (2, 5, 2), (3, 7, 1), (4, 8, 0)} <= held


@scenario("s03", passes=(0, 1, 2), config={"delete.retention.ms": 50_000})
def _s03(log: ScenarioLog) -> Appends:
    p1, p2 = log.producer(1), log.producer(2)
    p1([1, 2])
    p2([2, 3])
    p1([3, 4])
    log.commit(1)
    log.commit(2)
    p1([2, 3])
    log.abort(1)
    p2([4, 5])
    p1([5, 6])
    log.commit(1)
    log.abort(2)
    p2([6, 7])
    log.commit(2)
    log.roll()
    return {}


@pytest.mark.spark
def test_scenario_3_multi_pass_cleaning_with_aborted_transactions(history: History) -> None:
    """Adapted: Kafka's 3-key map needs passes 1 and 2 to map offsets 0-13; our first pass maps everything, so
    it already drops 3 (key 3, superseded at 4) and 14 (key 6, superseded at 17), which Kafka drops in its
    pass 3. Batch bases and the txn index follow Kafka's table pass for pass; pass 3 is identical."""
    txns = [aborted for entries in history.logs["s03"].aborted_txns().values() for aborted in entries]
    assert [(t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset) for t in txns] == [
        (1, 8, 10, 11), (2, 11, 16, 17)]
    bases = [[b.base_offset for b in history.view("s03", step).batches] for step in (0, 1, 2)]
    offsets = [history.view("s03", step).offsets for step in (0, 1, 2)]
    indexed = [history.view("s03", step).aborted for step in (0, 1, 2)]
    assert bases[0] == bases[1] == [0, 2, 4, 6, 7, 10, 13, 15, 16, 17, 19]
    assert offsets[0] == offsets[1] == [0, 2, 4, 5, 6, 7, 10, 13, 15, 16, 17, 18, 19]
    assert indexed[0] == [(1, 8, 10), (2, 11, 16)], "both aborted txns still cover (traversed) data"
    assert indexed[1] == [], "markers 10 and 16 retained but no longer indexed"
    assert bases[2] == [0, 2, 4, 6, 7, 13, 15, 17, 19]
    assert offsets[2] == [0, 2, 4, 5, 6, 7, 13, 15, 17, 18, 19]
    horizons = {b.base_offset: b.delete_horizon_ms for b in history.view("s03", 1).batches}
    assert horizons[10] == horizons[16] == T + 50_000, "the discardable markers got their horizon in pass 2"


@scenario("s04", passes=(0,), segment_bytes=2048)
def _s04(log: ScenarioLog) -> Appends:
    p1, p2 = log.producer(1), log.producer(2)
    p1([1, 2])
    p2([2, 3])
    p1([3, 4])
    log.abort(1)
    log.commit(2)
    p1([2])
    log.commit(1)
    log.roll()
    return {}


@pytest.mark.spark
def test_scenario_4_basic_transaction_aware_cleaning(history: History) -> None:
    view = history.view("s04", 0)
    assert (view.keys, view.offsets) == ([3, 2], [3, 6, 7, 8, 9])
    assert view.aborted == history.tiered["s04"].aborted == [(1, 0, 6)]
    assert history.stats[("s04", 0)].rewrite.aborted_records_removed == 4


@scenario("s05", passes=(0, 2), config={"min.compaction.lag.ms": HOUR})
def _s05(log: ScenarioLog) -> Appends:
    """Adapted: Kafka cleans "only segment 1" with an explicit LogToClean; here min.compaction.lag.ms holds
    segment 2 back at step 0 (its records are 10 minutes old), so the planner bounds the range at its base.
    Kafka's two later appends are open transactions in a segment of their own: tiered, they bound step 2's
    range by the first unstable offset instead of the active segment."""
    log.timestamp = T - 3 * HOUR
    p1, p2, p3 = log.producer(1), log.producer(2), log.producer(3)
    p1([1, 2])
    p3([2, 3])
    p2([3, 4])
    log.roll()
    log.timestamp = T - 10 * MINUTE
    p2([5, 6])
    p3([6, 7])
    p1([7, 8])
    log.abort(2)
    p3([8, 9])
    log.commit(3)
    p1([9, 10])
    log.abort(1)
    log.roll()

    def open_transactions() -> None:
        log.timestamp = STEP_CLOCKS[2] - 5 * MINUTE
        p2([11])
        p1([12])
        log.roll()

    return {2: open_transactions}


@pytest.mark.spark
def test_scenario_5_transactions_spanning_segments(history: History) -> None:
    """The aborts of segment 1's data sit in segment 2's txn index, beyond the cleaned range: they must still
    remove it (Kafka's `collectAbortedTransactions` reads past the upper bound)."""
    assert history.bounds[("s05", 0)] == 6
    assert history.view("s05", 0).keys == [2, 3, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10]
    assert history.bounds[("s05", 2)] == 19, "the open transactions at 19 and 20 bound the range"
    assert history.view("s05", 2).keys == [2, 3, 6, 7, 8, 9, 11, 12]


@scenario("s06", passes=(0, 1, 2, 4), segment_bytes=256)
def _s06(log: ScenarioLog) -> Appends:
    p = log.producer(1)
    p([1])
    p([2, 3])
    log.commit(1)
    p([2])
    log.commit(1)
    log.roll()

    def more() -> None:
        p([1, 3])
        log.commit(1)
        log.roll()

    return {1: more}


@pytest.mark.spark
def test_scenario_6_commit_marker_removal(history: History) -> None:
    first, second, again, last = (history.view("s06", step) for step in (0, 1, 2, 4))
    assert (first.keys, first.offsets) == ([1, 3, 2], [0, 2, 3, 4, 5])
    assert (second.keys, second.offsets) == ([2, 1, 3], [3, 4, 5, 6, 7, 8])
    assert again.offsets == second.offsets, "cleaning again before any horizon changes nothing"
    marker = next(b for b in again.batches if b.base_offset == 3)
    assert marker.is_control and marker.delete_horizon_ms == STEP_CLOCKS[2] + DAY
    assert last.offsets == [4, 5, 6, 7, 8]


@scenario("s07", passes=(0, 1, 2), segment_bytes=1000)
def _s07(log: ScenarioLog) -> Appends:
    p = log.producer(1)
    p([1])
    log.abort(1)
    p([2])
    p([2])
    log.commit(1)
    log.roll()
    return {}


@pytest.mark.spark
def test_scenario_7_deleted_batches_with_no_messages_read(history: History) -> None:
    first, last = history.view("s07", 0), history.view("s07", 2)
    assert (first.keys, first.offsets) == ([2], [1, 3, 4])
    assert (last.keys, last.offsets) == ([2], [3, 4])


@scenario("s08", passes=(0, 1, 2, 3, 4), segment_bytes=256)
def _s08(log: ScenarioLog) -> Appends:
    p1, p2 = log.producer(1), log.producer(2)
    p1([2, 3])
    log.roll()
    p2([2, 3])
    log.commit(2)
    log.roll()
    log.record(2, 2)
    log.record(3, 3)
    log.commit(1)
    log.roll()

    def more() -> None:
        p2([1])
        log.commit(2)
        log.roll()

    return {2: more}


@pytest.mark.spark
def test_scenario_8_commit_marker_kept_while_an_empty_batch_holds_the_sequence(history: History) -> None:
    for step in (0, 1):
        view = history.view("s08", step)
        assert (view.keys, view.offsets, view.last_offsets) == ([2, 3], [4, 5, 6, 7], [1, 3, 4, 5, 6, 7])
        assert [len(b.records) for b in view.batches[:2]] == [0, 0], "both producers' batches kept empty"
    grown = history.view("s08", 2)
    assert (grown.keys, grown.offsets, grown.last_offsets) == ([2, 3, 1], [4, 5, 6, 7, 8, 9], [1, 4, 5, 6, 7, 8, 9])
    assert history.view("s08", 3).offsets == grown.offsets
    last = history.view("s08", 4)
    assert (last.offsets, last.last_offsets) == ([5, 6, 7, 8, 9], [1, 5, 6, 7, 8, 9])


@scenario("s09", passes=(0, 2, 4))
def _s09(log: ScenarioLog) -> Appends:
    log.commit(1)
    log.record(2, 2)
    log.record(3, 3)
    log.roll()
    return {}


@pytest.mark.spark
def test_scenario_9_empty_control_batch(history: History) -> None:
    two_pass, later = history.view("s09", 2), history.view("s09", 4)
    assert (two_pass.keys, two_pass.offsets, two_pass.last_offsets) == ([2, 3], [1, 2], [0, 1, 2])
    marker = two_pass.batches[0]
    assert marker.is_control and marker.records == () and marker.producer_id == 1, "kept as an empty header"
    assert later.batches == two_pass.batches


@scenario("s10", passes=(0, 2), segment_bytes=128)
def _s10(log: ScenarioLog) -> Appends:
    log.producer(1)([1])
    log.roll()
    log.commit(1)
    log.roll()
    return {}


@pytest.mark.spark
def test_scenario_10_committed_transaction_spanning_segments(history: History) -> None:
    for step in (0, 2):
        view = history.view("s10", step)
        assert (view.offsets, view.last_offsets) == ([0, 1], [0, 1])


@scenario("s11", passes=(0, 2))
def _s11(log: ScenarioLog) -> Appends:
    log.producer(1)([1])
    log.roll()
    log.abort(1)
    log.roll()
    return {}


@pytest.mark.spark
def test_scenario_11_aborted_transaction_spanning_segments(history: History) -> None:
    for step in (0, 2):
        view = history.view("s11", step)
        assert (view.offsets, view.last_offsets, view.aborted) == ([1], [0, 1], [(1, 0, 1)])
        assert view.batches[0].records == () and not view.batches[0].is_control


@scenario("s12", passes=(0, 1, 2))
def _s12(log: ScenarioLog) -> Appends:
    p = log.producer(1)
    p([1])
    p([2, 3])
    log.abort(1)
    p([3])
    log.commit(1)
    log.roll()
    return {}


@pytest.mark.spark
def test_scenario_12_abort_marker_removal(history: History) -> None:
    first, last = history.view("s12", 0), history.view("s12", 2)
    assert (first.keys, first.offsets) == ([3], [3, 4, 5])
    assert (last.keys, last.offsets) == ([3], [4, 5])


@scenario("s13", passes=(0, 1, 2), segment_bytes=2048)
def _s13(log: ScenarioLog) -> Appends:
    log.producer(1)([1])
    log.commit(1)
    log.producer(1)([2])  # the group coordinator starts every transaction at sequence 0
    log.commit(1)
    log.record(1, 1)
    log.record(2, 1)
    log.roll()
    return {}


@pytest.mark.spark
def test_scenario_13_empty_batch_removal_with_sequence_reuse(history: History) -> None:
    first, last = history.view("s13", 0), history.view("s13", 2)
    assert (first.offsets, first.last_offsets) == ([1, 3, 4, 5], [1, 2, 3, 4, 5])
    assert (last.offsets, last.last_offsets) == ([3, 4, 5], [2, 3, 4, 5])


@scenario("s14", passes=(0, 1, 2, 3, 4, 5))
def _s14(log: ScenarioLog) -> Appends:
    log.producer(1)([2, 3])
    log.abort(1)
    log.roll()

    def newer_sequence() -> None:
        log.producer(1, transactional=False, sequence=2)([1])
        log.roll()

    return {3: newer_sequence}


@pytest.mark.spark
def test_scenario_14_abort_marker_kept_with_an_empty_batch(history: History) -> None:
    """Adapted: Kafka appends the later record in a transaction it never closes and cleans past it anyway; a
    transaction open in the tier bounds our range (the LSO), so the record is the same producer's next
    sequence, non-transactional."""
    for step in (0, 1, 2):
        view = history.view("s14", step)
        assert (view.keys, view.offsets, view.last_offsets, view.aborted) == ([], [2], [1, 2], [(1, 0, 2)])
    grown = history.view("s14", 3)
    assert (grown.keys, grown.offsets, grown.last_offsets, grown.aborted) == ([1], [2, 3], [2, 3], [(1, 0, 2)])
    last = history.view("s14", 5)
    assert (last.keys, last.offsets, last.last_offsets, last.aborted) == ([1], [3], [3], [])


@scenario("s15", passes=(0,))
def _s15(log: ScenarioLog) -> Appends:
    log.record(0, 0)
    log.producer(1, transactional=False)([0])
    pid2 = log.producer(2, transactional=False)
    pid2([0])
    log.producer(3, transactional=False)([0])
    pid2([1])
    log.roll()
    return {}


@pytest.mark.spark
def test_scenario_15_retain_last_producer_sequence(history: History) -> None:
    view = history.view("s15", 0)
    assert view.last_offsets == [1, 3, 4]
    assert view.last_sequences == {1: 0, 2: 1, 3: 0}
    assert (view.keys, view.offsets) == ([0, 1], [3, 4])


@scenario("s16", passes=(0, 1))
def _s16(log: ScenarioLog) -> Appends:
    p = log.producer(1)
    p([1])
    p([2, 3])
    log.abort(1)
    log.roll()

    def open_transaction() -> None:
        p([1, 5])
        log.roll()

    return {1: open_transaction}


@pytest.mark.spark
def test_scenario_16_retain_last_sequence_of_an_aborted_transaction(history: History) -> None:
    """The appended transaction stays open, as in Kafka's test: tiered, it bounds the range at 4 (Kafka's
    explicit clean of [3, active base) leaves the same offsets alone)."""
    first, second = history.view("s16", 0), history.view("s16", 1)
    assert (first.last_offsets, first.last_sequences, first.keys, first.offsets) == ([2, 3], {1: 2}, [], [3])
    assert history.bounds[("s16", 1)] == 4
    assert (second.last_offsets, second.last_sequences) == ([3, 5], {1: 4})
    assert (second.keys, second.offsets) == ([1, 5], [3, 4, 5])


@scenario("s17", passes=(0, 2), leader_epoch=5)
def _s17(log: ScenarioLog) -> Appends:
    log.producer(1)([1])
    log.commit(1)
    log.append([(control_key(ControlType.COMMIT), b"foo")], producer_id=2, producer_epoch=0, base_sequence=0,
               transactional=True)
    log.commit(2)
    log.roll()
    return {}


@pytest.mark.spark
def test_scenario_17_keys_equal_to_marker_keys(history: History) -> None:
    assert history.tiered["s17"].offsets == [0, 1, 2, 3]
    for step in (0, 2):
        view = history.view("s17", step)
        assert (view.offsets, view.last_offsets) == ([0, 1, 2, 3], [0, 1, 2, 3])
        assert [b.is_control for b in view.batches] == [False, True, False, True]


@scenario("s22", passes=(0, 1, 2, 4), config={"delete.retention.ms": 2 * DAY})
def _s22(log: ScenarioLog) -> Appends:
    """delete.retention.ms is 2 days so the horizon set at step 1 outlives step 2 (a day later)."""
    log.record(0, 0, timestamp=T + 10 * DAY)
    log.roll()

    def tombstone() -> None:
        log.record(0, None, timestamp=T - 2 * DAY - 10_000)
        log.roll()

    def key1() -> None:
        log.record(1, 1)
        log.roll()

    return {1: tombstone, 2: key1}


@pytest.mark.spark
def test_scenario_22_tombstone_retention(history: History) -> None:
    assert history.view("s22", 0).last_offsets == [0]
    kept = history.view("s22", 1)
    assert kept.last_offsets == [1], "the tombstone supersedes key 0 and is retained"
    (tombstone,) = kept.batches
    assert tombstone.delete_horizon_ms == T + 2 * DAY, "the horizon counts from the clean, not the record's time"
    assert tombstone.records[0].timestamp == T - 2 * DAY - 10_000
    assert history.view("s22", 2).last_offsets == [1, 2], "still retained before its horizon"
    assert history.view("s22", 4).last_offsets == [2], "gone once the horizon has passed"


@scenario("s36", passes=(0, 2), config={"min.compaction.lag.ms": HOUR})
def _s36(log: ScenarioLog) -> Appends:
    log.timestamp = T - 30 * MINUTE
    for k in (0, 1, 2, 0, 1, 3):
        log.record(k, k)
    log.roll()

    def second_block() -> None:
        log.timestamp = STEP_CLOCKS[2] - 10 * MINUTE
        log.record(0, 9)
        log.record(4, 9)
        log.roll()

    return {2: second_block}


@pytest.mark.spark
def test_scenario_36_min_compaction_lag_on_spark(history: History) -> None:
    """LogCleanerLagIntegrationTest: nothing is cleaned before the lag passes; after it, the first block is,
    and the block written since (younger than the lag) is left alone, its duplicate of key 0 included."""
    assert ("s36", 0) not in history.stats, "not even --force cleans data younger than min.compaction.lag.ms"
    untouched = history.view("s36", 0)
    assert untouched.batches == history.tiered["s36"].batches and untouched.cleaner_offset == 0
    after = history.view("s36", 2)
    assert history.bounds[("s36", 2)] == 6 and after.cleaner_offset == 6
    assert after.offsets == [2, 3, 4, 5, 6, 7]


# --- KIP-280, end to end ---------------------------------------------------------------------------


@scenario("k280ts", passes=(0,), config={"compaction.strategy": "timestamp"})
def _k280ts(log: ScenarioLog) -> Appends:
    t0 = T - HOUR
    for k, ts in (("a", 50), ("a", 10), ("a", 5), ("b", 30), ("b", 30)):
        log.record(k.encode(), b"v", timestamp=t0 + ts)
    log.roll()
    log.record(b"c", b"v", timestamp=t0 + 100)
    log.record(b"c", None, timestamp=t0 + 200)
    log.record(b"c", b"v", timestamp=t0 + 150)
    log.record(b"d", b"v", timestamp=t0 + 500)
    log.record(b"d", b"v", timestamp=t0 + 9_999, timestamp_type=TimestampType.LOG_APPEND_TIME, max_timestamp=t0 + 400)
    log.timestamp = t0 + 20
    log.append([(b"x", b"committed")], producer_id=7, producer_epoch=0, base_sequence=0, transactional=True)
    log.commit(7)
    log.timestamp = t0 + 999
    log.append([(b"x", b"aborted"), (b"y", b"aborted")], producer_id=8, producer_epoch=0, base_sequence=0,
               transactional=True)
    log.abort(8)
    log.record(b"e", b"v", timestamp=t0 + 90)
    log.record(b"e", b"v", timestamp=t0 + 80)
    log.roll()
    return {}


@pytest.mark.spark
def test_kip280_timestamp_strategy_with_out_of_order_producer_timestamps(history: History) -> None:
    view = history.view("k280ts", 0)
    assert view.survivors() == {
        b"a": 0,  # 50 beats the later 10 and 5
        b"b": 4,  # equal timestamps: the higher offset
        b"c": 6,  # the tombstone (200) competes like any record and wins
        b"d": 8,  # LogAppendTime: the batch's max timestamp (400) counts, not the record's 9999
        b"x": 10,  # the aborted x (999) never competes
        b"e": 15,
    }
    assert [r.value for b in view.batches for r in b.records if r.key == b"c"] == [None]
    last = view.batches[-1]
    assert (last.last_offset, last.records) == (16, ()), "the range's last offset survives as an empty batch"
    assert history.stats[("k280ts", 0)].invalid_versions == 0


@scenario("k280hdr", passes=(0, 1), config={"compaction.strategy": "header", "compaction.strategy.header": "version"})
def _k280hdr(log: ScenarioLog) -> Appends:
    def put(key: bytes, *headers: tuple[str, bytes | None], value: bytes | None = b"v") -> None:
        log.record(key, value, headers=[Header(k, v) for k, v in headers])

    put(b"a", ("version", long(9)))
    put(b"a", ("version", long(3)))
    put(b"b", ("version", long(3)))
    put(b"b", ("version", long(3)))
    put(b"c", ("version", long(-5)))
    put(b"c")
    log.roll()
    put(b"d")
    put(b"d", ("source", b"x"))
    put(b"e", ("version", long(1)))
    put(b"e", ("version", b"\x00\x07"))
    put(b"f", ("version", long(1)))
    put(b"f", ("version", None))
    put(b"g", ("version", long(5)))
    put(b"g", ("version", long(100)), ("version", long(2)))
    put(b"h", ("version", long(1)))
    put(b"h", ("Version", long(50)))
    put(b"i", ("version", long(9)))
    put(b"i", ("version", long(10)), value=None)
    put(b"j", ("source", b"x"), ("version", long(5)), ("other", b"y"))
    put(b"j", ("version", long(4)))
    log.roll()

    def lower_version() -> None:
        put(b"a", ("version", long(1)))
        log.roll()

    return {1: lower_version}


@pytest.mark.spark
def test_kip280_header_strategy_with_missing_short_and_duplicated_headers(history: History) -> None:
    view = history.view("k280hdr", 0)
    assert view.survivors() == {
        b"a": 0,  # 9 > 3
        b"b": 3,  # equal versions: the higher offset
        b"c": 4,  # a version (even negative) beats a missing header
        b"d": 7,  # both missing: the higher offset
        b"e": 8,  # a 2-byte value counts as missing
        b"f": 10,  # a null value counts as missing
        b"g": 12,  # the LAST occurrence (2) is the version, not the first (100)
        b"h": 14,  # the header name is exact: "Version" is not "version"
        b"i": 17,  # a tombstone with a higher version wins
        b"j": 18,  # other headers around the version do not matter
    }
    last = view.batches[-1]
    assert (last.last_offset, last.records) == (19, ()), "the range's last offset survives as an empty batch"
    assert history.stats[("k280hdr", 0)].invalid_versions == 6, "c@5, d@6, d@7, e@9, f@11, h@15"


@pytest.mark.spark
def test_kip280_strategy_change_applies_from_the_next_run(history: History) -> None:
    """Step 1 runs k280hdr with compaction.strategy=offset: the newer a@20 wins despite its lower version."""
    view = history.view("k280hdr", 1)
    assert view.survivors() == {**history.view("k280hdr", 0).survivors(), b"a": 20}


# --- the strategy property over generated workloads ----------------------------------------------------


def aborted_offsets(batches: list[RemoteBatch]) -> set[int]:
    """Offsets of every record whose transaction ended with an ABORT marker, read off the log itself."""
    pending: dict[int, list[int]] = {}
    aborted: set[int] = set()
    for b in batches:
        if not b.is_transactional:
            continue
        if not b.is_control:
            pending.setdefault(b.producer_id, []).extend(r.offset for r in b.records)
        elif b.records:
            offsets = pending.pop(b.producer_id, [])
            if struct.unpack(">hh", (b.records[0].key or b"")[:4])[1] == ControlType.ABORT:
                aborted.update(offsets)
    return aborted


def rank(record: RemoteRecord, strategy: str) -> tuple[int, int, int]:
    """KIP-280 as docs/cleaner-rules.md states it: the greatest (has version, version, offset) wins."""
    if strategy == "timestamp":
        return (1, record.timestamp, record.offset)
    if strategy == "header":
        versions = [v for k, v in record.headers if k == "version"]
        if versions and versions[-1] is not None and len(versions[-1]) == 8:
            return (1, struct.unpack(">q", versions[-1])[0], record.offset)
    return (0, 0, record.offset)


def reference_winners(batches: list[RemoteBatch], below: int, strategy: str) -> dict[bytes, int]:
    """Per key, the offset of the record the strategy keeps, among committed keyed data records below `below`."""
    aborted = aborted_offsets(batches)
    best: dict[bytes, RemoteRecord] = {}
    for b in batches:
        for r in [] if b.is_control else b.records:
            if r.key is None or r.offset >= below or r.offset in aborted:
                continue
            if r.key not in best or rank(r, strategy) > rank(best[r.key], strategy):
                best[r.key] = r
    return {k: r.offset for k, r in best.items()}


@pytest.mark.spark
def test_property_each_strategy_keeps_its_winner_and_no_aborted_data(history: History) -> None:
    """Over generated workloads (3 seeds, transactions aborting, timestamps going backwards, version headers
    missing, short or repeated), the cleaned range holds exactly each strategy's winner per key and no record
    of an aborted transaction; nothing at or above the first uncleanable offset changes."""
    mattered = set()
    for topic, strategy in GENERATED.items():
        before, after = history.tiered[topic].batches, history.view(topic, 0).batches
        bound = history.bounds[(topic, 0)]
        aborted = aborted_offsets(before)
        expected = reference_winners(before, bound, strategy)
        assert any(o < bound for o in aborted), f"{topic}: the workload must abort transactions in the range"
        if expected != reference_winners(before, bound, "offset"):
            mattered.add(strategy)
        cleaned = [r for b in after for r in b.records if r.offset < bound]
        assert not [r.offset for r in cleaned if r.offset in aborted], f"{topic}: aborted data survived"
        survivors = [(r.key, r.offset) for b in after if not b.is_control for r in b.records
                     if r.key is not None and r.offset < bound]
        assert len(survivors) == len(dict(survivors)), f"{topic}: more than one record per key"
        assert dict(survivors) == expected, f"{topic} ({strategy}): survivors are not the strategy's winners"
        untouched = [(r.offset, r.key, r.value) for b in before for r in b.records if r.offset >= bound]
        assert untouched == [(r.offset, r.key, r.value) for b in after for r in b.records if r.offset >= bound]
    assert mattered == {"timestamp", "header"}, "the workloads must make each non-offset strategy matter"
