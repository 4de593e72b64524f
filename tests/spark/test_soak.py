"""Property soak: many generated workloads, compacted again and again through crashes; nothing is ever lost.

A workload is one partition of its own topic with its own random shape (keys, skew, tombstones, idempotent and
transactional producers, aborts, codecs, batch sizes, out-of-order timestamps, leader epoch changes) and its own
topic config (compaction.strategy offset / timestamp / header, dirty ratio, output segment size, tombstone
retention). The first workload of each round is a compact,delete topic whose retention.ms falls inside its records'
time span at run 2's clock, so run 2 expires a prefix of it first: a key whose latest record lay below the new log
start may then be missing, nothing else. To keep 200 of them affordable, one round puts many workloads in one store
and compacts them all in one plan → stage → commit (one Spark job for all eligible partitions). A round:

1. tier the first part of every workload; take the latest-per-key view (under each topic's strategy);
2. run 1, with an injected fault (see `FAULTS`); the view must not move;
3. tier the rest (new dirty data behind a cleaned head); take the view again;
4. run 2 at a later clock (past the offset topics' tombstone retention), with another fault; then rerun to
   convergence; the view must not move;
5. gc that dies half-way, then gc with every grace passed: no orphan left, the view still the same;
6. the referee: the same workloads tiered into a second store and never compacted must show the same view.

Non-offset topics keep their tombstones for good: under KIP-280 an expired tombstone may hand its key to an
older-ranked record at a higher offset, a legitimate change of the view (Kafka's own semantics), not a loss.

`make test` runs one small round (KCOMPACT_SOAK unset); `make soak` (KCOMPACT_SOAK=full) 10 rounds of 20.
KCOMPACT_SOAK_SEED picks the workloads; the summary line prints it with the counts.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from compaction.config import KcompactConfig, TopicConfig
from compaction.format.codecs import Codec
from compaction.gc import collect_garbage
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import table_in_store
from compaction.run.commit import commit
from compaction.run.plan import RunPlan, plan
from compaction.run.stage import StagedRun, stage
from compaction.storage import ObjectStore, open_store
from compaction.tier import tier_logdir
from tests.faults import SimulatedCrash, failing_uploads
from tests.latest_view import Entry, Strategy, View, store_problems, view_differences, views

cleaner_module = importlib.import_module("compaction.run.commit")
compact_module = importlib.import_module("compaction.spark.pipeline")
gc_execute_module = importlib.import_module("compaction.gc.execute")

FULL = os.environ.get("KCOMPACT_SOAK") == "full"
ROUNDS, PER_ROUND = (10, 20) if FULL else (1, 5)
SEED = int(os.environ.get("KCOMPACT_SOAK_SEED", "20261122"))
NOW = 1_800_000_000_000
HOUR = 3_600_000
DAY = 24 * HOUR
LATER = NOW + DAY + 2 * HOUR  # run 2's clock: past the offset topics' delete.retention.ms since run 1
Expired = Callable[[tuple[str, int], Entry], bool]
FAULTS = ("none", "driver_dies_after_reading", "executor_dies_mid_upload", "upload_retries_run_out",
          "dies_around_commit", "zombie")


@dataclass
class Tally:
    workloads: int = 0
    runs: int = 0
    checks: int = 0
    expired_partitions: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    differences: list[str] = field(default_factory=list)

    def check(self, where: str, expected: dict, store: ObjectStore, strategies: dict[str, Strategy],
              expired: Expired | None = None, log_starts: dict[tuple[str, int], int] | None = None) -> None:
        self.checks += 1
        found = view_differences(expected, views(store, expected, strategies), expired, log_starts)
        self.differences += [f"{where}: {d}" for d in found]


def log_starts(store: ObjectStore, config: KcompactConfig, partitions: list[tuple[str, int]]
               ) -> dict[tuple[str, int], int]:
    """The log start of each compact,delete partition: retention may have expired what lay below it."""
    table = table_in_store(store)
    starts = {tp: table.live_segments(*tp)[0].start_offset for tp in partitions
              if config.for_topic(tp[0]).has_retention and table.live_segments(*tp)}
    return starts


def random_workload(rng: random.Random, topic: str, *, retention: bool = False) -> tuple[WorkloadSpec, TopicConfig]:
    records = rng.randint(120, 400)
    spec = WorkloadSpec(
        topics=(TopicSpec(topic, 1),),
        records_per_partition=records,
        keys=rng.choice([3, 10, 30, 80]),
        key_skew=rng.uniform(0.6, 1.6),
        value_bytes=rng.randint(8, 80),
        tombstone_ratio=rng.choice([0.0, 0.05, 0.2, 0.4]),
        segment_bytes=rng.choice([3, 5, 8]) * 1024,
        index_interval_bytes=rng.choice([256, 1024, 4096]),
        records_per_batch=rng.choice([1, 3, 10]),
        transactional_ratio=rng.choice([0.0, 0.2, 0.5]),
        abort_ratio=rng.choice([0.0, 0.3, 0.7]),
        idempotent_ratio=rng.uniform(0, 0.5),
        leader_epoch_changes=rng.randint(0, 3),
        start_ms=NOW - rng.choice([HOUR, 2 * DAY, 30 * DAY]) - records * 50,
        out_of_order_ratio=rng.choice([0.0, 0.05, 0.3]),
        codecs=tuple(rng.sample(list(Codec), rng.randint(1, len(Codec)))),
        seed=rng.randrange(1 << 30),
    )
    strategy = "offset" if retention else rng.choice(["offset", "offset", "timestamp", "header"])
    settings: dict[str, Any] = {
        "cleanup.policy": "compact,delete" if retention else "compact",
        "compaction.strategy": strategy,
        "min.cleanable.dirty.ratio": rng.choice(["0.01", "0.2", "0.5"]),
        "segment.bytes": rng.choice([6 * 1024, 20 * 1024, 1024 * 1024]),
        "delete.retention.ms": rng.choice([HOUR, DAY]) if strategy == "offset" else 1000 * DAY,
        "min.compaction.lag.ms": rng.choice([0, 0, HOUR]),
    }
    if strategy == "header":
        settings["compaction.strategy.header"] = "version"
    if retention:  # at run 2's clock, the records older than a point inside the workload's time span expire
        settings["retention.ms"] = LATER - spec.start_ms - int(rng.uniform(0.2, 0.8) * records * spec.ms_per_record)
    return spec, TopicConfig.from_kafka(settings)


def copy_head(full: Path, head: Path, rng: random.Random) -> None:
    """The first segments of every partition directory of `full` (a random cut), as a broker held them then."""
    for part in sorted(full.iterdir()):
        bases = sorted(int(f.name.split(".")[0]) for f in part.glob("*.log"))
        cut = bases[rng.randint(1, len(bases) - 1)] if len(bases) > 1 else bases[0]
        (head / part.name).mkdir(parents=True)
        for f in part.iterdir():
            stem = f.name.split(".")[0]
            if not stem.isdigit() or int(stem) <= cut:
                shutil.copy(f, head / part.name / f.name)


def run_with_fault(spark: SparkSession, store: ObjectStore, config: KcompactConfig, now_ms: int, fault: str,
                   rng: random.Random, monkeypatch: pytest.MonkeyPatch, tally: Tally) -> None:
    """One compaction run with `fault` injected; whatever survives of it must leave the view as it was."""
    run = plan(store, config, now_ms)
    tally.runs += 1
    tally.faults[fault] += 1
    topics = sorted({p.topic for p in run.plan.eligible})
    if not topics:
        return
    victim = rng.choice(topics)
    if fault == "driver_dies_after_reading":
        with monkeypatch.context() as m:
            m.setattr(compact_module, "stage_partitions", _raise("driver died after reading"))
            with pytest.raises(SimulatedCrash):
                stage(spark, run)
    elif fault in ("executor_dies_mid_upload", "upload_retries_run_out"):
        transient = fault == "upload_retries_run_out"
        faulty = replace(run, store=failing_uploads(run.store, fail_at=rng.randint(1, 8), match=f"{victim}-",
                                                    transient=transient))
        try:
            outcomes = commit(stage(spark, faulty))
        except Exception as exc:  # the Spark job died with its task
            assert not transient and "simulated fault" in str(exc), exc
        else:
            assert all(o.committed or (o.topic == victim and o.exit_code == 4) for o in outcomes), outcomes
    elif fault == "dies_around_commit":
        _die_around_commit(stage(spark, run), rng, monkeypatch)
    elif fault == "zombie":
        zombie = stage(spark, run)
        newer = stage(spark, plan(store, config, now_ms))
        assert all(o.committed for o in commit(newer))
        assert not any(o.committed for o in commit(zombie)), "a fenced run committed"
        tally.runs += 1
    else:
        outcomes = commit(stage(spark, run))
        assert all(o.committed for o in outcomes), outcomes


def _raise(message: str) -> Callable[..., Any]:
    def die(*args: Any, **kwargs: Any) -> Any:
        raise SimulatedCrash(message)

    return die


def _die_around_commit(staged: StagedRun, rng: random.Random, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commit a random subset of the staged partitions (the driver died after uploading the rest); their commit
    lands and then the driver dies, never hearing of it (outcome unknown)."""
    if not staged.partitions:
        return
    rng.shuffle(staged.partitions)
    staged.partitions[:] = staged.partitions[: rng.randint(1, len(staged.partitions))]
    real = cleaner_module.commit_change_sets

    def commit_change_sets(table: Any, changes: Any, now_ms: int, **kwargs: Any) -> Any:
        real(table, changes, now_ms, **kwargs)
        raise SimulatedCrash("the commit landed, then the driver died")

    with monkeypatch.context() as m:
        m.setattr(cleaner_module, "commit_change_sets", commit_change_sets)
        with contextlib.suppress(SimulatedCrash):
            commit(staged)


def horizons_passed(store: ObjectStore, config: KcompactConfig, partitions: list[tuple[str, int]],
                    at_ms: int) -> Expired:
    """Which tombstones may be gone by `at_ms`: those below the offset run 1 cleaned up to (run 1, at NOW, set
    their delete horizon to NOW + delete.retention.ms), when that horizon is not after `at_ms`."""
    table = table_in_store(store)
    cleaned = {tp: table.partition_snapshot(*tp).lineage.current for tp in partitions}

    def expired(tp: tuple[str, int], entry: Entry) -> bool:
        horizon = NOW + config.for_topic(tp[0]).delete_retention_ms
        return entry[0] < (cleaned[tp] or 0) and horizon <= at_ms

    return expired


def converge(spark: SparkSession, store: ObjectStore, config: KcompactConfig, now_ms: int, tally: Tally) -> None:
    for _ in range(3):
        run: RunPlan = plan(store, config, now_ms)
        if not run.plan.eligible:
            return
        tally.runs += 1
        outcomes = commit(stage(spark, run))
        assert all(o.committed for o in outcomes), outcomes
    pytest.fail("the reruns did not converge")


def gc_that_dies_then_gc(store: ObjectStore, now_ms: int, rng: random.Random,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    table = table_in_store(store)
    live = {o.key for p in table.snapshot().partitions.values() for s in p.live_segments for o in s.object_keys}
    limit, deleted = rng.randint(1, 6), []
    real = store.delete

    def delete(key: str) -> None:
        if len(deleted) == limit:
            raise SimulatedCrash(f"gc died deleting {key}")
        deleted.append(key)
        real(key)

    with monkeypatch.context() as m:
        m.setattr(store, "delete", delete)
        if rng.random() < 0.3:
            m.setattr(gc_execute_module, "mark_deleted_finished", _raise("gc died before recording the deletions"))
        with contextlib.suppress(SimulatedCrash):
            collect_garbage(store, table, now_ms)
    collect_garbage(store, table, now_ms)
    assert not set(deleted) & live, "gc deleted an object of a live segment"


@pytest.mark.spark
def test_soak_nothing_is_ever_lost(spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(SEED)
    tally = Tally()
    started = time.monotonic()
    for r in range(ROUNDS):
        root = tmp_path / f"round-{r}"
        topics, strategies = {}, {}
        for w in range(PER_ROUND):
            topic = f"soak-r{r}-w{w}"
            spec, topics[topic] = random_workload(rng, topic, retention=w == 0)
            strategies[topic] = Strategy(topics[topic].compaction_strategy, topics[topic].compaction_strategy_header)
            generate_logdir(root / "full", spec)
        config = KcompactConfig(defaults=TopicConfig.from_kafka({"cleanup.policy": "compact"}), topics=topics)
        partitions = [(t, 0) for t in topics]
        copy_head(root / "full", root / "head", rng)
        store = open_store(str(root / "store"))
        tier_logdir(root / "head", store, table_in_store(store, create=True), NOW - DAY)
        tally.workloads += PER_ROUND
        first = {tp: table_in_store(store).live_segments(*tp)[0].start_offset for tp in partitions}

        expected: dict[tuple[str, int], View] = views(store, partitions, strategies)
        run_with_fault(spark, store, config, NOW, rng.choice(FAULTS), rng, monkeypatch, tally)
        tally.check(f"round {r}, run 1", expected, store, strategies)
        expired = horizons_passed(store, config, partitions, LATER)

        tier_logdir(root / "full", store, table_in_store(store), NOW + HOUR)
        expected = views(store, partitions, strategies)
        later = LATER
        run_with_fault(spark, store, config, later, rng.choice(FAULTS), rng, monkeypatch, tally)
        tally.check(f"round {r}, run 2", expected, store, strategies, expired, log_starts(store, config, partitions))
        converge(spark, store, config, later, tally)
        starts = log_starts(store, config, partitions)
        tally.check(f"round {r}, rerun", expected, store, strategies, expired, starts)
        tally.expired_partitions += sum(1 for tp, s in starts.items() if s > first[tp])

        gc_now = max(later, int(time.time() * 1000)) + 2 * DAY
        gc_that_dies_then_gc(store, gc_now, rng, monkeypatch)
        problems = store_problems(store)
        tally.differences += [f"round {r}, after gc: {p}" for p in problems]
        tally.check(f"round {r}, after gc", expected, store, strategies, expired, starts)

        referee = open_store(str(root / "referee"))
        tier_logdir(root / "full", referee, table_in_store(referee, create=True), NOW + HOUR)
        truth = views(referee, partitions, strategies)
        final = views(store, partitions, strategies)
        tally.differences += [f"round {r}, referee: {d}" for d in view_differences(truth, final, expired, starts)]

    summary = (f"soak (seed {SEED}): {tally.workloads} workloads in {ROUNDS} rounds, {tally.runs} compaction runs, "
               f"faults {dict(sorted(tally.faults.items()))}, {tally.checks} view checks, "
               f"{tally.expired_partitions} of {ROUNDS} compact,delete partitions expired by retention, "
               f"{len(tally.differences)} latest-per-key differences, {time.monotonic() - started:.0f} s")
    with capsys.disabled():
        print(f"\n{summary}")
    assert tally.differences == [], "\n".join([summary, *tally.differences[:20]])
    assert tally.workloads >= (200 if FULL else 1)
    assert tally.expired_partitions == ROUNDS, "every round's compact,delete workload expires a prefix at run 2"
