"""A run that dies at any step loses nothing: the view holds, a rerun converges, gc leaves no orphan.

The steps of a run and where each test breaks it (Kafka's `.cleaned`/`.swap` recovery has the same
question to answer: what does the next run find, and is it safe to go on from there?):

- after reading: the driver read the table, txn indexes and producer snapshots and took the fencing
  epochs, then died before Spark ran;
- mid-upload, on an executor: the n-th object upload of one partition kills the task (and the Spark job), or
  fails for good as the store's retries run out (that partition alone fails, retryable); `tests/faults.py`
  ships the fault inside the store spec, since a driver-side monkeypatch does not reach Python workers;
- after upload, before commit; during commit, before anything landed; and "outcome unknown": the commit
  landed but the caller never heard (a lost reply, seen by the caller as a conflict or as a crash);
- during gc: mid-delete, before the deletions are recorded, and while sweeping orphans.

Each test ends the same way: rerun to convergence, gc with every grace passed, and check that the
latest-per-key view (read_committed) never changed and that no object is left that no row accounts for.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from compaction.config import KcompactConfig, TopicConfig
from compaction.errors import CommitConflictError
from compaction.gc import collect_garbage
from compaction.generate import TopicSpec, WorkloadSpec
from compaction.metadata import SegmentState, referenced_object_keys, table_in_store
from compaction.run.commit import commit, commit_partition
from compaction.run.plan import plan
from compaction.run.stage import stage
from compaction.storage import ObjectStore
from tests.faults import SimulatedCrash, failing_uploads
from tests.latest_view import store_problems, view_differences, views
from tests.tiered_logdir import generated_logdir, tiered_store

cleaner_module = importlib.import_module("compaction.run.commit")
compact_module = importlib.import_module("compaction.spark.pipeline")
gc_execute_module = importlib.import_module("compaction.gc.execute")

NOW = 1_800_000_000_000
DAY = 86_400_000
TOPIC = "events"
PARTITIONS = [(TOPIC, p) for p in range(4)]
# segment.bytes just above one input segment: every input segment is its own output group, so a partition
# uploads several groups (2 objects each) and a crash can fall between two of them.
CONFIG = KcompactConfig(defaults=TopicConfig.from_kafka({"cleanup.policy": "compact", "segment.bytes": 20_000,
                                                         "min.cleanable.dirty.ratio": "0.01"}))
SPEC = WorkloadSpec(topics=(TopicSpec(TOPIC, len(PARTITIONS)),), records_per_partition=600, keys=40,
                    segment_bytes=16 * 1024, value_bytes=60, tombstone_ratio=0.1, transactional_ratio=0.3,
                    abort_ratio=0.5, seed=7)  # every partition eligible, 1-3 groups, aborted transactions in each


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logdir(tmp_path_factory, "crash-logdir", SPEC)


@pytest.fixture
def store(logdir: Path, tmp_path: Path) -> ObjectStore:
    return tiered_store(logdir, tmp_path, NOW - 10 * DAY)


def gc_now() -> int:
    """A gc clock past every grace: the runs' clock (NOW) and the objects' mtimes (the wall clock) + 2 days."""
    return max(NOW, int(time.time() * 1000)) + 2 * DAY


def rerun(spark: SparkSession, store: ObjectStore, now_ms: int = NOW) -> None:
    """Compact until nothing is eligible; every outcome must be a commit."""
    for _ in range(3):
        run = plan(store, CONFIG, now_ms)
        if not run.plan.eligible:
            return
        outcomes = commit(stage(spark, run))
        assert all(o.committed for o in outcomes), outcomes
    pytest.fail("a rerun did not converge in 3 runs")


def gc_crashing(store: ObjectStore, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """One gc that dies at `where`: 'delete' (the 2nd segment-object delete), 'finish' (after the segment
    objects went, before DELETE_SEGMENT_FINISHED is recorded) or 'orphans' (the 2nd orphan delete)."""
    table = table_in_store(store)
    real_delete = store.delete
    referenced = referenced_object_keys(table.snapshot())
    dies_at = {"delete": "segment", "orphans": "orphan"}.get(where)
    seen = {"segment": 0, "orphan": 0}

    def delete(key: str) -> None:
        kind = "segment" if key in referenced else "orphan"
        seen[kind] += 1
        if kind == dies_at and seen[kind] == 2:
            raise SimulatedCrash(f"gc died deleting {key}")
        real_delete(key)

    def finish(*args: Any, **kwargs: Any) -> Any:
        raise SimulatedCrash("gc died before recording DELETE_SEGMENT_FINISHED")

    with monkeypatch.context() as m:
        m.setattr(store, "delete", delete)
        if where == "finish":
            m.setattr(gc_execute_module, "mark_deleted_finished", finish)
        with pytest.raises(SimulatedCrash):
            collect_garbage(store, table, gc_now())
    assert seen[dies_at or "segment"] >= 1, f"gc never reached {where!r}"


def converges(spark: SparkSession, store: ObjectStore, before: dict, monkeypatch: pytest.MonkeyPatch,
              gc_crashes: tuple[str, ...]) -> None:
    """Rerun, check the view; one gc per crash point in `gc_crashes`, each dying there, checking the view after
    each; gc again: nothing left over."""
    rerun(spark, store)
    assert not view_differences(before, views(store, PARTITIONS))
    for where in gc_crashes:
        gc_crashing(store, monkeypatch, where)
        assert not view_differences(before, views(store, PARTITIONS))
    collect_garbage(store, table_in_store(store), gc_now())
    assert store_problems(store) == []
    assert not view_differences(before, views(store, PARTITIONS))
    pending = [s for _tp, p in table_in_store(store).snapshot().partitions.items() for s in p.segments
               if s.state is SegmentState.DELETE_SEGMENT_STARTED]
    assert pending == [], "every replaced segment is finished once its grace passed"


@pytest.mark.spark
def test_crashes_before_the_commit_converge(spark: SparkSession, store: ObjectStore,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver dies after reading (fencing epochs taken, before the Spark job); then the next run's executor
    dies mid-upload: the 2nd upload of an output group of partition 2 (each is a task of its own), so its .log is
    uploaded and its .indexes object is not. Each time nothing becomes live; then a rerun converges."""
    before = views(store, PARTITIONS)
    table = table_in_store(store)
    live_before = {tp: table.live_segments(*tp) for tp in PARTITIONS}

    def died(*args: Any, **kwargs: Any) -> Any:
        raise SimulatedCrash("driver died after reading, before the Spark job")

    with monkeypatch.context() as m:
        m.setattr(compact_module, "stage_partitions", died)
        with pytest.raises(SimulatedCrash):
            stage(spark, plan(store, CONFIG, NOW))
    after = table_in_store(store)
    assert all(after.partition_snapshot(*tp).fencing_epoch == 1 for tp in PARTITIONS), "epochs were taken"
    assert {tp: after.live_segments(*tp) for tp in PARTITIONS} == live_before

    run = plan(store, CONFIG, NOW, topics=[TOPIC], partition=2)  # a run of partition 2 alone: a cheaper crash
    assert [p.partition for p in run.plan.eligible] == [2]
    with pytest.raises(Exception, match="simulated fault on upload 2"):
        stage(spark, replace(run, store=failing_uploads(run.store, fail_at=2, match=f"/{2}/")))
    assert {tp: table_in_store(store).live_segments(*tp) for tp in PARTITIONS} == live_before
    partial = [p for p in store_problems(store) if p.startswith("orphan") and f"/{2}/" in p]
    assert len(partial) >= 1, "the crash happened mid-upload: some objects of partition 2 were written"
    assert not view_differences(before, views(store, PARTITIONS))
    converges(spark, store, before, monkeypatch, gc_crashes=("delete", "finish"))


@pytest.mark.spark
def test_crashes_around_the_commit_converge(spark: SparkSession, store: ObjectStore,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """One run, four fates: p0's uploads are done but its commit fails before anything lands (as if the driver
    died between upload and commit); p1's commit lands but its reply is lost and surfaces as a conflict (what
    delta-rs reports when it retries a put-if-absent that had landed: see test_s3_faults); p2's uploads fail
    on the executor for good (the store's retries ran out: the partition fails alone, retryable); p3's commit
    lands and the driver dies before it hears.
    """
    before = views(store, PARTITIONS)
    table = table_in_store(store)
    live_before = {tp: table.live_segments(*tp) for tp in PARTITIONS}
    run = plan(store, CONFIG, NOW)
    staged = stage(spark, replace(run, store=failing_uploads(run.store, fail_at=2, match=f"/{2}/", transient=True)))
    staged.run = run  # commit through the plain store
    assert sorted(sp.plan.partition for sp in staged.partitions) == [0, 1, 3]
    real_commit: Callable[..., Any] = cleaner_module.commit_change_sets

    def commit_with_faults(table: Any, changes: Any, now_ms: int, **kwargs: Any) -> Any:
        partitions = {change.partition for change in changes}
        if 0 in partitions:
            raise SimulatedCrash("simulated: the driver died before the commit landed")
        results = real_commit(table, changes, now_ms, **kwargs)
        if 1 in partitions:  # the reply of the whole commit is lost
            return {tp: CommitConflictError("simulated: the commit landed, its reply was lost") for tp in results}
        if 3 in partitions:
            raise SimulatedCrash("simulated: the commit landed, then the driver died")
        return results

    by_partition = {sp.plan.partition: sp for sp in staged.partitions}
    with monkeypatch.context() as m:
        m.setattr(cleaner_module, "commit_change_sets", commit_with_faults)
        with pytest.raises(SimulatedCrash, match="before the commit landed"):
            commit_partition(table, run, by_partition[0])
        staged.partitions = [by_partition[1]]
        outcomes = {o.partition: o for o in commit(staged)}
        with pytest.raises(SimulatedCrash, match="then the driver died"):
            commit_partition(table, run, by_partition[3])
    assert outcomes[1].committed, "the lost reply is reconciled: p1's own swap is found in the table"
    assert (outcomes[2].committed, outcomes[2].exit_code) == (False, 4), outcomes[2]
    assert outcomes[2].error_type == "TransientStoreError", outcomes[2]
    table = table_in_store(store)
    for p in (0, 2):
        assert table.live_segments(TOPIC, p) == live_before[(TOPIC, p)], f"nothing of p{p} landed"
    for p in (1, 3):
        live = {s.segment_id for s in table.live_segments(TOPIC, p)}
        assert {n.segment_id for n in by_partition[p].new_segments} <= live, f"p{p}'s commit landed"
    assert not view_differences(before, views(store, PARTITIONS))

    # The caller that lost p1's reply retries the very same commit: it finds its own swap, never lands a second.
    version = table.version()
    assert commit_partition(table, run, by_partition[1]) == version
    assert table_in_store(store).version() == version
    converges(spark, store, before, monkeypatch, gc_crashes=("orphans",))
