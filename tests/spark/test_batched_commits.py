"""A run's metadata writes are batched, still fenced per partition (issue 41).

A compaction takes the fencing epochs of all its partitions in one Delta commit and lands all their swaps in one
more, `kcompact tier` records STARTED and FINISHED in two, gc records its deletions in one: the count is read from
the table's history, for 40 partitions. And within the one swap commit each partition is still its own: a concurrent
commit to one partition (retention expiring a segment the run replaces) refuses that partition with the conflict
and the others land in the same run, in one commit; a newer run's epoch on some partitions fences those and no
other. After each: the view of every partition the run committed is the one before, and gc leaves no orphan.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from compaction.config import KcompactConfig, TopicConfig
from compaction.errors import CommitConflictError, FencedError
from compaction.gc import collect_garbage
from compaction.generate import TopicSpec, WorkloadSpec
from compaction.metadata import (
    ChangeSet,
    MetadataTable,
    SegmentState,
    StateChange,
    TopicPartition,
    acquire_fencing_epochs,
    commit_current,
    table_in_store,
)
from compaction.metadata.table import read_rows
from compaction.run.commit import PartitionOutcome, commit
from compaction.run.plan import plan
from compaction.run.stage import stage
from compaction.storage import ObjectStore
from tests.latest_view import store_problems, view_differences, views
from tests.tiered_logdir import generated_logdir, tiered_store

batch_module = importlib.import_module("compaction.metadata.batch")

NOW = 1_800_000_000_000
DAY = 86_400_000
CONFIG = KcompactConfig(defaults=TopicConfig.from_kafka({"cleanup.policy": "compact",
                                                         "min.cleanable.dirty.ratio": "0.01"}))
WIDE = WorkloadSpec(topics=(TopicSpec("wide", 40),), records_per_partition=120, keys=20, segment_bytes=3 * 1024,
                    value_bytes=40, tombstone_ratio=0.1, transactional_ratio=0.0, seed=11)  # all 40 eligible
FOUR = WorkloadSpec(topics=(TopicSpec("four", 4),), records_per_partition=300, keys=30, segment_bytes=8 * 1024,
                    value_bytes=60, tombstone_ratio=0.1, transactional_ratio=0.0, seed=5)
PARTITIONS = [("four", p) for p in range(4)]


def history_after(store: ObjectStore, version: int) -> list[dict[str, Any]]:
    """The metadata table's Delta commits after `version`, oldest first."""
    table = table_in_store(store)
    return sorted((h for h in DeltaTable(table.table_uri).history() if h["version"] > version),
                  key=lambda h: h["version"])


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["topic"], r["partition"], r["row_kind"], r["segment_id"] or ""))


def every_reader_reads_the_same_rows(spark: SparkSession, store: ObjectStore) -> int:
    """The metadata table as kcompact reads it, and as delta-rs, DuckDB's delta extension and Spark's Delta reader
    read it: the same rows (its data files are kcompact's own encoding, `compaction.metadata.small_parquet`). The
    number of rows."""
    import duckdb
    from duckdb_extensions import import_extension

    table = table_in_store(store)
    ours = _sorted(read_rows(table.delta_table(), table.storage_options).to_pylist())
    assert _sorted(DeltaTable(table.table_uri).to_pyarrow_table().to_pylist()) == ours, "delta-rs"
    with duckdb.connect() as con:
        import_extension("delta", con=con)
        con.sql("LOAD delta")
        path = table.table_uri.removeprefix("file://").replace("'", "''")
        duck = con.sql(f"SELECT * FROM delta_scan('{path}')").to_arrow_table().to_pylist()
    assert _sorted(duck) == ours, "DuckDB"
    sparks = [r.asDict(recursive=True) for r in spark.read.format("delta").load(table.table_uri).collect()]
    assert _sorted(sparks) == ours, "Spark"
    return len(ours)


def gc_leaves_nothing(store: ObjectStore) -> None:
    collect_garbage(store, table_in_store(store), max(NOW, int(time.time() * 1000)) + 2 * DAY)
    assert store_problems(store) == []


@pytest.fixture(scope="module")
def wide_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logdir(tmp_path_factory, "wide-logdir", WIDE)


@pytest.fixture(scope="module")
def four_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logdir(tmp_path_factory, "four-logdir", FOUR)


@pytest.fixture
def four(four_logdir: Path, tmp_path: Path) -> ObjectStore:
    store = tiered_store(four_logdir, tmp_path, NOW - 10 * DAY)
    assert len(plan(store, CONFIG, NOW).plan.eligible) == len(PARTITIONS)
    return store


def by_partition(outcomes: list[PartitionOutcome]) -> dict[int, PartitionOutcome]:
    return {o.partition: o for o in outcomes}


@pytest.mark.spark
def test_the_delta_commits_of_a_run_do_not_grow_with_its_partitions(
    spark: SparkSession, wide_logdir: Path, tmp_path: Path
) -> None:
    store = tiered_store(wide_logdir, tmp_path, NOW - 10 * DAY)
    tiered = history_after(store, 0)  # version 0 created the table
    assert len(tiered) == 1, "tier: the uploads, then FINISHED for all 40 partitions in one commit"
    assert [h["kcompact.partitions"] for h in tiered] == ["40"]

    run = plan(store, CONFIG, NOW)
    assert len(run.plan.eligible) == 40
    outcomes = commit(stage(spark, run))
    assert all(o.committed for o in outcomes) and len(outcomes) == 40, outcomes
    compaction = history_after(store, run.plan.metadata_version)
    assert len(compaction) == 2, "acquire, swap (and a third, retention, when a compact,delete topic is in scope)"
    assert [(h["kcompact.partitions"], h["kcompact.run_id"]) for h in compaction] == [("40", run.run_id)] * 2
    assert {o.version for o in outcomes} == {compaction[-1]["version"]}
    assert every_reader_reads_the_same_rows(spark, store) > 40 * 2  # a partition row, old and new segments each

    version = table_in_store(store).version()
    gc_leaves_nothing(store)
    collected = history_after(store, version)
    assert len(collected) == 1 and collected[0]["kcompact.partitions"] == "40", "gc: every deletion in one commit"


@pytest.mark.spark
def test_a_concurrent_commit_costs_the_run_only_its_partition(
    spark: SparkSession, four: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention expires the first segment of partition 1 between the swap commit's read and its write (a row the
    run replaces): partition 1 reports the conflict (exit 4, rerun safe), the other three land in the same run, in the
    one write, which drops partition 1; a rerun then compacts partition 1 too."""
    before = views(four, PARTITIONS)
    run = plan(four, CONFIG, NOW)
    staged = stage(spark, run)
    assert len(staged.partitions) == 4
    table = table_in_store(four)
    expired = table.live_segments("four", 1)[0].segment_id
    real, writes = batch_module.overwrite_partitions, []

    def retention_first(*args: Any) -> Any:
        writes.append(sum(len(rows) for rows in args[3].values()))
        if len(writes) == 1:
            monkeypatch.setattr(batch_module, "overwrite_partitions", real)
            expire_first_segment(table, expired)
            monkeypatch.setattr(batch_module, "overwrite_partitions", retention_first)
        return real(*args)

    monkeypatch.setattr(batch_module, "overwrite_partitions", retention_first)
    version = table.version()
    outcomes = by_partition(commit(staged))
    monkeypatch.setattr(batch_module, "overwrite_partitions", real)

    lost = outcomes.pop(1)
    assert (lost.committed, lost.error_type, lost.exit_code) == (False, CommitConflictError.__name__, 4), lost
    assert f"segment {expired}" in (lost.error or "")
    assert len(writes) == 1, "the swap commit landed without partition 1, whose new rows then refused its swap"
    assert {o.version for o in outcomes.values()} == {version + 2} and all(o.committed for o in outcomes.values())
    mine = {n.segment_id for sp in staged.partitions if sp.plan.partition == 1 for n in sp.new_segments}
    assert not mine & {s.segment_id for s in table.partition_snapshot("four", 1).segments}
    others = [tp for tp in PARTITIONS if tp[1] != 1]
    assert not view_differences({tp: before[tp] for tp in others}, views(four, others))

    again = commit(stage(spark, plan(four, CONFIG, NOW)))
    assert [(o.partition, o.committed) for o in again] == [(1, True)], again
    gc_leaves_nothing(four)
    assert not view_differences({tp: before[tp] for tp in others}, views(four, others))


def expire_first_segment(table: MetadataTable, segment_id: str) -> None:
    """What `kcompact expire` commits for partition 1: its first segment to DELETE_SEGMENT_STARTED."""
    commit_current(table, TopicPartition("four", 1), NOW, lambda current: ChangeSet.planned_from(
        current, fencing_epoch=current.fencing_epoch, writer="kcompact-retention@test",
        state_changes=[StateChange(segment_id, SegmentState.DELETE_SEGMENT_STARTED)]))


@pytest.mark.spark
def test_a_newer_runs_epoch_fences_only_its_partitions(spark: SparkSession, four: ObjectStore) -> None:
    """Run A stages all four partitions; a newer run takes partitions 0 and 2 (its stage's first commit). A's swap
    commit fences those two, FencedError each, and lands 1 and 3 in one commit."""
    before = views(four, PARTITIONS)
    staged = stage(spark, plan(four, CONFIG, NOW))
    table = table_in_store(four)
    live_before = {p: table.live_segments("four", p) for p in (0, 2)}
    acquire_fencing_epochs(table, [TopicPartition("four", 0), TopicPartition("four", 2)], "a newer run", NOW,
                           run_id="newer")
    version = table.version()

    outcomes = by_partition(commit(staged))

    assert table.version() == version + 1
    for p in (0, 2):
        assert (outcomes[p].committed, outcomes[p].error_type, outcomes[p].exit_code) == (
            False, FencedError.__name__, 4), outcomes[p]
        assert "expected fencing epoch 1, found 2" in (outcomes[p].error or "")
        assert table.live_segments("four", p) == live_before[p], "nothing of the zombie's swap landed"
    assert [(outcomes[p].committed, outcomes[p].version) for p in (1, 3)] == [(True, version + 1)] * 2
    assert not view_differences(before, views(four, PARTITIONS))
    gc_leaves_nothing(four)
    assert not view_differences(before, views(four, PARTITIONS))
