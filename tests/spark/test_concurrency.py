"""Zombies and races: two runs on one partition, whatever the interleaving, and exactly one of them wins.

docs/fencing.md's cases, through the plan/stage/commit API: run A (the old owner) stages; run B takes the partition
(a newer fencing epoch, like a new leader epoch) and stages too. Whether A's commit arrives after B's or before
it, A is fenced and nothing of it becomes live; B's swap is what readers see. A third run planned before B
committed, but staged after, is refused before it uploads anything. Then the same with both runs in threads
on the one SparkSession, committing at the same instant; and through the CLI, whose run a newer one takes over
between its stage and its commit: it exits 4 and its report names the fenced partitions.

After every scenario: the latest-per-key view is the one before, and gc (graces passed) removes every object
the losers uploaded, leaving none that no row accounts for.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from compaction.cli import main
from compaction.config import KcompactConfig, TopicConfig
from compaction.errors import CommitConflictError, FencedError
from compaction.gc import collect_garbage
from compaction.generate import TopicSpec, WorkloadSpec
from compaction.metadata import METADATA_TABLE_NAME, acquire_fencing_epoch, table_in_store
from compaction.run.commit import commit, commit_partition
from compaction.run.plan import plan
from compaction.run.stage import StagedRun, stage
from compaction.storage import ObjectStore
from tests.borrowed_session import BorrowedSession
from tests.latest_view import store_problems, view_differences, views
from tests.tiered_logdir import generated_logdir, tiered_store

cleaner_module = importlib.import_module("compaction.run.stage")
session_module = importlib.import_module("compaction.spark.session")

NOW = 1_800_000_000_000
DAY = 86_400_000
TOPIC = "shared"
PARTITIONS = [(TOPIC, 0), (TOPIC, 1)]
SETTINGS = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
CONFIG = KcompactConfig(defaults=TopicConfig.from_kafka(SETTINGS))
SPEC = WorkloadSpec(topics=(TopicSpec(TOPIC, 2),), records_per_partition=500, keys=40, segment_bytes=20 * 1024,
                    value_bytes=60, tombstone_ratio=0.1, transactional_ratio=0.3, seed=7)  # both eligible


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logdir(tmp_path_factory, "concurrency-logdir", SPEC)


@pytest.fixture
def store(logdir: Path, tmp_path: Path) -> ObjectStore:
    store = tiered_store(logdir, tmp_path, NOW - 10 * DAY)
    assert len(plan(store, CONFIG, NOW).plan.eligible) == len(PARTITIONS)
    return store


def new_ids(staged: StagedRun, partition: int) -> set[str]:
    return {n.segment_id for sp in staged.partitions if sp.plan.partition == partition for n in sp.new_segments}


def ids_in_table(store: ObjectStore, partition: int) -> set[str]:
    return {s.segment_id for s in table_in_store(store).partition_snapshot(TOPIC, partition).segments}


def live_ids(store: ObjectStore, partition: int) -> set[str]:
    return {s.segment_id for s in table_in_store(store).live_segments(TOPIC, partition)}


def gc_leaves_nothing(store: ObjectStore, before: dict) -> None:
    collect_garbage(store, table_in_store(store), max(NOW, int(time.time() * 1000)) + 2 * DAY)
    assert store_problems(store) == []
    assert not view_differences(before, views(store, PARTITIONS))


@pytest.mark.spark
def test_a_zombie_is_fenced_whichever_commit_arrives_first(spark: SparkSession, store: ObjectStore) -> None:
    before = views(store, PARTITIONS)
    run_a, run_b, run_c = (plan(store, CONFIG, NOW) for _ in range(3))
    staged_a = stage(spark, run_a)  # A owns both partitions (epoch 1) ...
    staged_b = stage(spark, run_b)  # ... until B takes them (epoch 2): A is a zombie from here on
    a = {sp.plan.partition: sp for sp in staged_a.partitions}
    b = {sp.plan.partition: sp for sp in staged_b.partitions}
    assert sorted(a) == sorted(b) == [0, 1]
    table = table_in_store(store)

    commit_partition(table, run_b, b[0])  # partition 0: the zombie's commit arrives after B's
    with pytest.raises(FencedError, match="epoch"):
        commit_partition(table, run_a, a[0])
    with pytest.raises(FencedError, match="epoch"):  # partition 1: the zombie's commit arrives first
        commit_partition(table, run_a, a[1])
    commit_partition(table, run_b, b[1])

    for p in (0, 1):
        assert not new_ids(staged_a, p) & ids_in_table(store, p), "nothing of the zombie is in the table"
        assert new_ids(staged_b, p) <= live_ids(store, p)
        snap = table_in_store(store).partition_snapshot(TOPIC, p)
        assert (snap.fencing_epoch, snap.lineage.current) == (b[p].fencing_epoch, b[p].cleaner_offset)
    assert not view_differences(before, views(store, PARTITIONS))

    listed = {o.key for o in store.list("") if not o.key.startswith(METADATA_TABLE_NAME)}
    staged_c = stage(spark, run_c)  # planned before B committed: its planned segments are gone
    assert staged_c.partitions == []
    assert {tp: type(e) for tp, e in staged_c.failed.items()} == {tp: CommitConflictError for tp in PARTITIONS}
    assert {o.exit_code for o in commit(staged_c)} == {4}
    assert {o.key for o in store.list("") if not o.key.startswith(METADATA_TABLE_NAME)} == listed, "no upload"
    gc_leaves_nothing(store, before)


@pytest.mark.spark
def test_two_runs_racing_on_one_partition_have_one_winner(spark: SparkSession, store: ObjectStore) -> None:
    before = views(store, PARTITIONS)
    runs = [plan(store, CONFIG, NOW) for _ in range(2)]
    start = threading.Barrier(2)

    def stage_now(run: Any) -> StagedRun:
        start.wait()
        return stage(spark, run)  # both jobs share the one SparkSession

    with ThreadPoolExecutor(2) as pool:
        staged = list(pool.map(stage_now, runs))
    assert all(len(s.partitions) + len(s.failed) == len(PARTITIONS) for s in staged)
    go = threading.Barrier(2)

    def commit_now(s: StagedRun) -> list[Any]:
        go.wait()
        return commit(s)

    with ThreadPoolExecutor(2) as pool:
        outcomes = [{o.partition: o for o in run_outcomes} for run_outcomes in pool.map(commit_now, staged)]
    for p in (0, 1):
        results = [o[p] for o in outcomes]
        assert sum(o.committed for o in results) == 1, results
        [loser] = [i for i, o in enumerate(results) if not o.committed]
        assert results[loser].exit_code == 4
        assert results[loser].error_type in ("FencedError", "CommitConflictError"), results[loser]
        assert not new_ids(staged[loser], p) & ids_in_table(store, p), "the loser left nothing in the table"
        assert new_ids(staged[1 - loser], p) <= live_ids(store, p)
    assert not view_differences(before, views(store, PARTITIONS))
    gc_leaves_nothing(store, before)


@pytest.mark.spark
def test_the_cli_loser_exits_4_and_reports_the_fenced_partitions(
    spark: SparkSession, store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = views(store, PARTITIONS)
    live_before = {p: table_in_store(store).live_segments(TOPIC, p) for p in (0, 1)}
    config = tmp_path / "kcompact.yaml"
    config.write_text("defaults:\n" + "".join(f"  {k}: {v!r}\n" for k, v in SETTINGS.items()))
    real_stage = cleaner_module.TakenRun.stage

    def stage_then_a_newer_run_takes_over(taken: Any, spark: Any) -> StagedRun:
        staged = real_stage(taken, spark)
        for tp in PARTITIONS:  # what a newer run's stage does first: the CLI's run is a zombie from here on
            acquire_fencing_epoch(table_in_store(store), *tp, "a newer run", NOW, run_id="newer")
        return staged

    monkeypatch.setattr(session_module, "build_session", lambda *args, **kwargs: BorrowedSession(spark))
    monkeypatch.setattr(cleaner_module.TakenRun, "stage", stage_then_a_newer_run_takes_over)
    code = main(["compact", "--store", store.uri, "--config", str(config), "--now", str(NOW), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 4
    assert sorted((f["topic"], f["partition"], f["error_type"], f["exit_code"]) for f in report["failed"]) == [
        (TOPIC, 0, "FencedError", 4), (TOPIC, 1, "FencedError", 4)]
    assert not any(p["committed"] for p in report["partitions"])
    for p in (0, 1):
        assert {s.segment_id for s in table_in_store(store).partition_snapshot(TOPIC, p).segments} == {
            s.segment_id for s in live_before[p]}, "nothing of the fenced run is in the table"
    assert not view_differences(before, views(store, PARTITIONS))
    gc_leaves_nothing(store, before)
