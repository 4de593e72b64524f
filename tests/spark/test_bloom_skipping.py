"""Skipping on Spark: cleaned segments that hold none of a round's dirty keys are left unread, and that is safe.

One store, one schedule, several topics, so each round is one Spark stage over all of them (Spark's fixed
cost dominates small inputs):

- `acc`: the acceptance workload. 1% of the keys change; everything the round reads (every GET, counted by
  the stores of the executors and of the driver) stays within the dirty segments (fetched once: the rewrite
  takes them from the run's cache), the clean segments that really hold a changed key, their companions,
  and 2% of the clean region.
- `txn`: clean segments holding transactional batches are always rewritten (the marker walk must see them).
- `tomb`: a clean segment whose tombstones' delete horizon has passed is rewritten, and they go, as in Kafka.
- `ts`: the timestamp strategy; a clean record newer than the dirty one of its key survives and supersedes it
  (the clean segment is rescanned on Spark after the filter test, so its record joins the winners; it is
  fetched once, the rewrite takes it from the run's cache).
- `lazy`: a clean region that came without filters (a checkpoint imported from Kafka): the first round reads
  it once, writes filters under the segments' own ids and records them in the commit; the second round uses
  them and reads nothing of what it keeps.

Round 1 (everything dirty but `lazy`) runs with a disk budget of one segment over more than 10x that much
data, in a temporary directory of the test's: no rewrite task's downloads ever hold more than the budget (the
task lists its directory after every download), and nothing is left behind. Round 2 changes 1% of `acc`'s
keys and sets up the other topics' cases. Every round: the consumer's view is unchanged, and below the new
checkpoint each key is held at most once.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from compaction.bloom import KeyFilter, filter_key
from compaction.bloom.hashing import key_hashes
from compaction.config import KcompactConfig, TopicConfig
from compaction.format.scan import scan_segment
from compaction.metadata import ChangeSet, ObjectSuffix, SegmentMetadata, acquire_fencing_epoch, table_in_store
from compaction.metadata import commit as commit_change_set
from compaction.reader import Isolation, consumer_records, segment_ref
from compaction.run.commit import commit
from compaction.run.plan import plan
from compaction.run.report import run_report
from compaction.run.stage import StagedRun, stage
from compaction.storage import ObjectStore, open_store
from compaction.storage.indexes import get_part
from tests.scenario_log import ScenarioLog, tier

NOW1 = 1_800_000_000_000
DAY = 86_400_000
NOW2 = NOW1 + DAY + 1  # past the horizon of the tombstones run 1 keeps
FPP = 0.0005  # 20 dirty keys x 0.05% ~ 1% of the segments without one test positive (1% fpp would give 18%)
ACC_KEYS, ACC_VALUE, ACC_SEGMENT = 2000, 500, 24 * 1024
TOPICS = ("acc", "txn", "tomb", "ts", "lazy")


def config() -> KcompactConfig:
    base = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.0001", "bloom.filter.fpp": str(FPP),
            "segment.bytes": str(ACC_SEGMENT)}
    return KcompactConfig(defaults=TopicConfig.from_kafka(base),
                          topics={"ts": TopicConfig.from_kafka({**base, "compaction.strategy": "timestamp"})})


def value(key: int, round_: int) -> bytes:
    return (b"%d:%d:" % (key, round_)).ljust(ACC_VALUE, b"x")


def view(store: ObjectStore, topic: str) -> dict[bytes, tuple[int, bytes | None]]:
    """key -> (offset, value) of its latest record, tombstones included."""
    refs = [segment_ref(s) for s in table_in_store(store).live_segments(topic, 0)]
    return {r.key: (r.offset, r.value) for r in consumer_records(store, refs, isolation=Isolation.READ_COMMITTED)
            if r.key is not None}


def keys_of(store: ObjectStore, seg: SegmentMetadata) -> set[bytes]:
    records = scan_segment(store.get(seg.object_key(ObjectSuffix.LOG) or "")).records
    return {k for k, c in zip(records["key"].to_pylist(), records["control"].to_pylist(), strict=True)
            if k is not None and not c}


def one_per_key_below_checkpoint(store: ObjectStore, topic: str) -> None:
    below = table_in_store(store).partition_snapshot(topic, 0).lineage.current
    refs = [segment_ref(s) for s in table_in_store(store).live_segments(topic, 0)]
    keys = [r.key for r in consumer_records(store, refs) if r.key is not None and r.offset < below]
    assert len(keys) == len(set(keys)), f"{topic}: a key is held twice below the checkpoint"


@dataclass
class Round:
    run: StagedRun
    report: dict
    before: dict[str, dict[bytes, tuple[int, bytes | None]]]  # the consumer's view before the round, per topic
    after: dict[str, dict[bytes, tuple[int, bytes | None]]]  # ... and right after it
    live_before: dict[str, tuple[SegmentMetadata, ...]]
    budget: int | None = None  # the round's disk budget
    scratch: Path | None = None  # where its executors downloaded chunks
    scratch_used: bool = False  # whether anything was created in `scratch` during the round (its mtime moved)
    largest_rewritten: dict[str, int] = field(default_factory=dict)  # per topic, the largest replaced segment

    def part(self, topic: str) -> dict:
        return next(p for p in self.report["partitions"] if p["topic"] == topic)


@dataclass
class Rounds:
    store: ObjectStore
    changed: dict[str, set[bytes]]  # the keys each topic's dirty section changed (lazy: per round)
    first: Round  # acc, txn, tomb, ts: everything dirty; lazy: its imported clean region read once
    second: Round  # 1% of acc's keys changed; the other topics' cases


def run_round(spark: SparkSession, store: ObjectStore, now: int, topics: tuple[str, ...],
              budget: int | None = None, scratch: Path | None = None) -> Round:
    """One round over `topics`; with `scratch`, the executors download into it."""
    table = table_in_store(store)
    before = {t: view(store, t) for t in topics}
    live = {t: table.live_segments(t, 0) for t in topics}
    run = plan(store, config(), now, topics=list(topics), disk_budget_bytes=budget)
    assert sorted(p.topic for p in run.plan.eligible) == sorted(topics), run.plan.render_text()
    scratch_mtime = None if scratch is None else scratch.stat().st_mtime_ns
    staged = stage(spark, run, temp_dir=None if scratch is None else str(scratch))
    used = scratch is not None and scratch.stat().st_mtime_ns != scratch_mtime
    outcomes = commit(staged)
    assert all(o.committed for o in outcomes), outcomes
    after = {t: view(store, t) for t in topics}
    still_live = {s.segment_id for t in topics for s in table.live_segments(t, 0)}
    largest = {t: max((s.segment_size_bytes for s in live[t] if s.segment_id not in still_live), default=0)
               for t in topics}
    return Round(staged, run_report(staged, outcomes).to_dict(), before, after, live, budget, scratch, used, largest)


def build_logs() -> dict[str, ScenarioLog]:
    logs = {t: ScenarioLog(t, NOW1 - 10 * DAY, segment_bytes=ACC_SEGMENT) for t in TOPICS}
    for start in range(0, ACC_KEYS, 20):
        logs["acc"].append([(k, value(k, 0)) for k in range(start, start + 20)])
    for start in range(0, 400, 20):
        logs["txn"].append([(k, value(k, 0)) for k in range(start, start + 20)])
        if start == 200:
            txn = logs["txn"].producer(77)
            txn(range(1000, 1010))
            logs["txn"].commit(77)
    for start in range(0, 400, 20):
        logs["tomb"].append([(k, value(k, 0)) for k in range(start, start + 20)])
    logs["tomb"].append([(k, None) for k in range(10, 20)])  # tombstones, in their own (later) segment
    for k in range(300):
        logs["ts"].append([(k, value(k, 0))])
    for start in range(0, 600, 20):
        logs["lazy"].append([(k, value(k, 0)) for k in range(start, start + 20)])
    for log in logs.values():
        log.roll()
    return logs


def import_checkpoint(store: ObjectStore, topic: str) -> None:
    """What an import of a Kafka-cleaned log would record: its cleaner checkpoint at the log end."""
    table = table_in_store(store)
    epoch = acquire_fencing_epoch(table, topic, 0, "import", NOW1 - DAY)
    snap = table.partition_snapshot(topic, 0)
    end = snap.live_segments[-1].end_offset + 1
    change = ChangeSet.planned_from(snap, fencing_epoch=epoch, writer="import", cleaner_offset=end)
    commit_change_set(table, change, NOW1 - DAY)


def update(log: ScenarioLog, keys: list[int], round_: int) -> set[bytes]:
    for k in keys:
        log.append([(k, value(k, round_))])
    log.roll()
    return {str(k).encode() for k in keys}


@pytest.fixture(scope="module")
def rounds(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rounds]:
    root = tmp_path_factory.mktemp("skipping")
    store = open_store(str(root / "store"))
    logs = build_logs()
    rng = random.Random(6)
    tier(logs.values(), root / "logs", store, NOW1 - 3 * DAY)
    import_checkpoint(store, "lazy")
    changed = {"lazy1": update(logs["lazy"], rng.sample(range(600), 6), 1)}
    tier(logs.values(), root / "logs", store, NOW1 - 2 * DAY)
    budget = max(s.segment_size_bytes for t in TOPICS for s in table_in_store(store).live_segments(t, 0))
    (root / "scratch").mkdir()
    first = run_round(spark, store, NOW1, TOPICS, budget, root / "scratch")
    changed |= {
        "acc": update(logs["acc"], rng.sample(range(ACC_KEYS), ACC_KEYS // 100), 1),
        "txn": update(logs["txn"], [5], 1),
        "tomb": update(logs["tomb"], [100], 1),  # far from the tombstones, which sit in the last segment
        "lazy2": update(logs["lazy"], rng.sample(range(600), 6), 2),
    }
    logs["ts"].timestamp = NOW1 - 20 * DAY  # older than its clean record: the clean record keeps winning
    logs["ts"].append([(7, b"older")])
    logs["ts"].timestamp = NOW1
    logs["ts"].append([(8, b"newer")])
    logs["ts"].roll()
    changed["ts"] = {b"7", b"8"}
    tier(logs.values(), root / "logs", store, NOW1)
    second = run_round(spark, store, NOW2, TOPICS)
    yield Rounds(store, changed, first, second)


# --- every topic ---------------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("topic", ["acc", "txn", "lazy"])
def test_consumer_view_is_unchanged_and_keys_stay_unique(rounds: Rounds, topic: str) -> None:
    for r in (rounds.first, rounds.second):
        assert r.after[topic] == r.before[topic]
    one_per_key_below_checkpoint(rounds.store, topic)


@pytest.mark.spark
def test_kept_segments_keep_their_id_and_row(rounds: Rounds) -> None:
    r = rounds.second
    staged = next(p for p in r.run.partitions if p.plan.topic == "acc")
    assert staged.kept, "some clean segment of acc must be kept"
    before = {s.segment_id: s for s in r.live_before["acc"]}
    after = {s.segment_id: s for s in table_in_store(rounds.store).live_segments("acc", 0)}
    for sid in staged.kept:
        assert after[sid] == before[sid]
    assert set(staged.replaced).isdisjoint(staged.kept)
    assert set(staged.kept) | set(staged.replaced) == set(before)


# --- acceptance: what a round reads when 1% of the keys change ---------------------------------------------


@pytest.mark.spark
def test_a_round_reads_little_more_than_the_segments_holding_changed_keys(rounds: Rounds) -> None:
    r, store = rounds.second, rounds.store
    part = r.part("acc")
    staged = next(p for p in r.run.partitions if p.plan.topic == "acc")
    regions = staged.plan.regions
    assert regions is not None
    clean = [s for s in r.live_before["acc"] if s.end_offset < regions.first_dirty_offset]
    clean_bytes = sum(s.segment_size_bytes for s in clean)
    holding = [s for s in clean if keys_of(store, s) & rounds.changed["acc"]]
    true_bytes = sum(s.segment_size_bytes for s in holding)
    assert 0 < len(holding) < len(clean) // 2, "the workload must leave most clean segments without a change"
    # what the report says it read from the clean region: clean segments it rewrote, and their filters
    clean_read = part["stats"]["clean_bytes_rewritten"] + part["stats"]["filter_bytes_read"]
    assert true_bytes <= clean_read <= true_bytes + 0.02 * clean_bytes, (clean_read, true_bytes, clean_bytes)
    # ... and every GET of the round: dirty segments once (the rewrite takes them from the run's cache),
    # companions, and that
    companions = sum(store.size(s.object_key(x) or "") for s in r.live_before["acc"]
                     for x in (ObjectSuffix.PRODUCER_SNAPSHOT, ObjectSuffix.LEADER_EPOCH_CHECKPOINT)
                     if s.object_key(x))
    budget = regions.cleanable_bytes + true_bytes + 0.02 * clean_bytes + companions
    assert part["requests"]["bytes_read"] <= budget, (part["requests"], budget)
    assert part["segments_skipped"] == len(staged.kept)
    assert part["bytes_not_downloaded"] == sum(s.segment_size_bytes for s in clean if s.segment_id in staged.kept)
    assert part["bytes_not_downloaded"] >= clean_bytes - true_bytes - 0.02 * clean_bytes


@pytest.mark.spark
def test_report_carries_the_filter_figures_and_requests(rounds: Rounds) -> None:
    part = rounds.second.part("acc")
    s = part["stats"]
    assert s["dirty_keys"] == len(rounds.changed["acc"])
    assert s["filters_read"] == s["clean_segments"] and s["filters_built"] == 0
    rate = part["bloom_false_positive_rate"]
    assert set(rate) == {"segments", "keys"}
    assert s["bloom_segment_true_negatives"] == part["segments_skipped"]
    assert 0 <= s["bloom_key_false_positives"] <= s["bloom_key_absent_tests"]
    assert rate["keys"] < 20 * FPP  # 20 dirty keys x ~30 filters: a handful of tests, far below 1%
    sizing = part["bloom_sizing"]
    assert sizing["filter_fpp"] == FPP and sizing["dirty_keys"] == s["dirty_keys"] and not sizing["too_coarse"]
    assert part["requests"]["gets"] > 0 and part["requests"]["puts"] > 0
    assert rounds.second.report["requests"]["bytes_read"] >= part["requests"]["bytes_read"]


# --- what is never kept -----------------------------------------------------------------------------------


@pytest.mark.spark
def test_transactional_clean_segments_are_always_rewritten(rounds: Rounds) -> None:
    r = rounds.second
    staged = next(p for p in r.run.partitions if p.plan.topic == "txn")
    store = rounds.store
    txn_segments = []
    for s in r.live_before["txn"]:
        bloom = s.object_key(ObjectSuffix.BLOOM)  # the clean ones have one (round 1 wrote them)
        if bloom is not None and KeyFilter.from_bytes(get_part(store, bloom, ObjectSuffix.BLOOM)).facts.transactional:
            txn_segments.append(s.segment_id)
    assert txn_segments and set(txn_segments) <= set(staged.replaced)
    assert staged.kept, "segments without transactions and without key 5 are kept"


@pytest.mark.spark
def test_tombstones_past_their_horizon_go_even_when_their_segment_holds_no_dirty_key(rounds: Rounds) -> None:
    r, store = rounds.second, rounds.store
    records = list(consumer_records(store, [segment_ref(s) for s in table_in_store(store).live_segments("tomb", 0)]))
    assert not [x for x in records if x.value is None], "the horizon passed at NOW2: the tombstones must go"
    assert r.after["tomb"] == {k: v for k, v in r.before["tomb"].items() if v[1] is not None}
    staged = next(p for p in r.run.partitions if p.plan.topic == "tomb")
    assert staged.kept, "the other clean segments of tomb hold neither key 100 nor a tombstone"
    tombstoned = next(s for s in r.live_before["tomb"] if keys_of(store, s) & {b"10", b"11"})
    assert tombstoned.segment_id in staged.replaced and b"100" not in keys_of(store, tombstoned)


# --- strategies: a rescanned clean segment's record can win over a dirty one ---------------------------------


@pytest.mark.spark
def test_a_newer_clean_record_supersedes_an_older_dirty_one(rounds: Rounds) -> None:
    store = rounds.store
    latest = {r.key: r for r in consumer_records(
        store, [segment_ref(s) for s in table_in_store(store).live_segments("ts", 0)]) if r.key is not None}
    below = table_in_store(store).partition_snapshot("ts", 0).lineage.current
    assert latest[b"7"].value == value(7, 0) and latest[b"7"].offset < below, "key 7: the clean record is newer"
    assert latest[b"8"].value == b"newer"
    survivors = [r.key for r in consumer_records(
        store, [segment_ref(s) for s in table_in_store(store).live_segments("ts", 0)]) if r.key in (b"7", b"8")]
    assert sorted(survivors) == [b"7", b"8"], "exactly one record of each key survives"
    part = rounds.second.part("ts")
    assert part["segments_skipped"] > 0


# --- filters written lazily, used the round after ----------------------------------------------------------


@pytest.mark.spark
def test_filters_are_built_lazily_recorded_and_used_by_the_next_round(rounds: Rounds) -> None:
    store = rounds.store
    first = rounds.first.part("lazy")["stats"]
    assert first["filters_built"] == first["clean_segments"] > 0
    assert first["segments_skipped"] > 0
    staged = next(p for p in rounds.first.run.partitions if p.plan.topic == "lazy")
    rows = {s.segment_id: s for s in table_in_store(store).partition_snapshot("lazy", 0).segments}
    for sid in staged.kept:
        key = rows[sid].object_key(ObjectSuffix.BLOOM)
        assert key == filter_key(rows[sid].object_key(ObjectSuffix.LOG) or "")
        f = KeyFilter.from_bytes(store.get(key))
        held = key_hashes(pa.array(sorted(keys_of(store, rows[sid])), pa.binary()))
        assert f.positives(held) == len(held) > 0
    second = rounds.second.part("lazy")
    assert second["stats"]["filters_built"] == 0 and second["segments_skipped"] > 0
    clean_read = second["stats"]["clean_bytes_rewritten"] + second["stats"]["filter_bytes_read"]
    assert second["bytes_not_downloaded"] > clean_read


# --- bounded chunks ---------------------------------------------------------------------------------------


@pytest.mark.spark
def test_a_run_over_ten_times_its_disk_budget_finishes_within_it(rounds: Rounds) -> None:
    """Round 1 rewrites every topic with a disk budget of one (the largest) segment. Each task lists its
    temporary directory after every download: the peak it saw lies between the largest segment it rewrote
    (downloaded whole) and the budget. The tasks worked in the round's scratch directory and emptied it."""
    r = rounds.first
    budget = r.budget
    assert budget is not None
    rewritten = sum(p["stats"]["bytes_read"] for p in r.report["partitions"])
    assert rewritten > 10 * budget
    for p in r.report["partitions"]:
        assert p["stats"]["disk_budget_bytes"] == budget
        assert 0 < r.largest_rewritten[p["topic"]] <= p["stats"]["peak_temp_bytes"] <= budget, p["topic"]
    assert r.report["partitions"][0]["stats"]["chunks"] > 1
    assert r.scratch_used, "the tasks downloaded into the scratch directory, not elsewhere"
    assert r.scratch is not None and not list(r.scratch.rglob("*")), "temporary files are gone after the run"
