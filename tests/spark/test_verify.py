"""`kcompact verify` against real runs: a CLI compaction on Spark verifies clean (and writes its report, metrics
and progress), tombstones dropped after their horizon verify clean, and tampered stores fail listing the keys.

The tampering commits through the metadata table's own API, as a buggy or rogue writer would: it drops a live
segment, or swaps one for a rewrite missing a batch, or records a run that dropped tombstones before their
delete horizon. The expected keys come from the consumer reader's pieces, not from verify (`committed_records`).

Every verdict is reached twice, by the reference path on the driver and on Spark (`verify_both`), and the two
reports must be the same: counts, listed keys, findings and their wording.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F

from compaction.cli import main
from compaction.config import KcompactConfig, TopicConfig
from compaction.errors import ConfigError, ExitCode
from compaction.format.batch import Record
from compaction.format.segment import iter_batches
from compaction.gc import collect_garbage
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import (
    ChangeSet,
    NewSegment,
    ObjectKey,
    ObjectSuffix,
    SegmentState,
    StateChange,
    acquire_fencing_epoch,
    table_in_store,
)
from compaction.metadata import commit as commit_change_set
from compaction.packing import MAX_TASK_BYTES, OPEN_COST_BYTES, task_budget
from compaction.reader import ConsumerRead, Isolation, SegmentRef, log_transactions, segment_records, segment_ref
from compaction.retention import expire
from compaction.run.commit import commit
from compaction.run.plan import plan
from compaction.run.stage import stage
from compaction.spark.packed import packed_frame
from compaction.spark.verify import _SEGMENTS, key_counts
from compaction.storage import ObjectStore, open_store
from compaction.storage.layout import new_segment_id, parse_segment_object_key
from compaction.tier import tier_logdir
from compaction.verify import Finding, VerifyReport, verify_partition
from tests.prometheus_text import parse_strict
from tests.unit.run_reports import sample_report

TOPIC = "orders"
NOW = 1_800_000_000_000
DAY = 86_400_000
CONFIG_YAML = """
defaults:
  cleanup.policy: compact
  min.cleanable.dirty.ratio: 0.01
  delete.retention.ms: 86400000
"""
CONFIG = KcompactConfig(defaults=TopicConfig.from_kafka({"cleanup.policy": "compact",
                                                         "min.cleanable.dirty.ratio": "0.01"}))


def committed_records(store: ObjectStore, refs: list[SegmentRef]) -> Iterator[Record]:
    """What verify compares of the log `refs`: the records a read_committed consumer receives, but read on past a
    transaction still open (its own records skipped), as `compaction.verify` does, where a consumer stops at it."""
    read = ConsumerRead(0, Isolation.READ_COMMITTED, *log_transactions(store, refs))
    for ref in sorted(refs, key=lambda r: r.start_offset):
        yield from segment_records(store, ref, read)


def latest_per_key(store: ObjectStore, version: int | None = None) -> dict[bytes, Record]:
    """The reference: the last record of each key of `committed_records`."""
    refs = [segment_ref(s) for s in table_in_store(store).live_segments(TOPIC, 0, version)]
    return {r.key: r for r in committed_records(store, refs) if r.key is not None}


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify")
    spec = WorkloadSpec(topics=(TopicSpec(TOPIC, 1),), records_per_partition=3000, keys=250,
                        segment_bytes=48 * 1024, tombstone_ratio=0.06, seed=5)
    generate_logdir(root / "logs", spec)
    store = open_store(str(root / "store"))
    tier_logdir(root / "logs", store, table_in_store(store, create=True), NOW - 10 * DAY)
    return root / "store"


def verify_both(spark: SparkSession, store: ObjectStore, before: int, after: int | None = None, *,
                config: TopicConfig | None = None, max_listed: int = 10_000) -> VerifyReport:
    """The reference path's report, after checking that the Spark path gives the same one."""
    reference = verify_partition(store, TOPIC, 0, before, after, config=config, max_listed=max_listed)
    on_spark = verify_partition(store, TOPIC, 0, before, after, config=config, max_listed=max_listed, spark=spark)
    assert on_spark.to_dict() == reference.to_dict()
    assert list(on_spark.render_text()) == list(reference.render_text())
    assert on_spark.expired_tombstones == reference.expired_tombstones
    return reference


def copy_of(store_dir: Path, tmp_path: Path) -> ObjectStore:
    """A private copy of a local store (objects and metadata table; the Delta log's paths are relative)."""
    shutil.copytree(store_dir, tmp_path / "store")
    return open_store(str(tmp_path / "store"))


@dataclass(frozen=True)
class CliRun:
    store: Path
    exit_code: int
    stderr: str
    out: Path


@pytest.fixture(scope="module")
def compacted(spark: SparkSession, tiered: Path, tmp_path_factory: pytest.TempPathFactory) -> CliRun:
    """`kcompact compact` run in-process (it reuses the shared session and leaves it running)."""
    out = tmp_path_factory.mktemp("cli-out")
    store_dir = out / "store"
    shutil.copytree(tiered, store_dir)
    (out / "kcompact.yaml").write_text(CONFIG_YAML)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["compact", "--store", str(store_dir), "--config", str(out / "kcompact.yaml"), "--now", str(NOW),
                     "--report-json", str(out / "report.json"), "--html-report", str(out / "report.html"),
                     "--metrics-file", str(out / "kcompact.prom")])
    return CliRun(store_dir, code, err.getvalue(), out)


@pytest.mark.spark
def test_a_cli_compaction_verifies_clean_and_reports(compacted: CliRun, spark: SparkSession,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert compacted.exit_code == 0
    assert "plan: 1 partitions" in compacted.stderr and "commit 1/1 orders-0: committed" in compacted.stderr
    report = json.loads((compacted.out / "report.json").read_text())
    assert report.keys() == sample_report().keys(), "tests/unit/run_reports.py must follow the real report"
    assert report["partitions"][0].keys() == sample_report()["partitions"][0].keys()
    assert spark.sparkContext._jsc is not None, "the CLI must not stop a session it did not start"
    metrics = parse_strict((compacted.out / "kcompact.prom").read_text())
    assert metrics[("kcompact_bytes_read_total", "")] == report["bytes_read"] > 0
    assert metrics[("kcompact_bytes_written_total", "")] == report["bytes_written"] > 0
    assert metrics[("kcompact_partition_committed", '{topic="orders",partition="0"}')] == 1
    assert "orders-0" in (compacted.out / "report.html").read_text()

    before = report["metadata_version_planned"]
    code = main(["verify", "--store", str(compacted.store), "--topic", TOPIC, "--partition", "0",
                 "--before", str(before), "--config", str(compacted.out / "kcompact.yaml"), "--json"])
    verdict = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK and verdict["ok"] and verdict["problems"] == []
    assert verdict["cleaner_offset_after"] > 0 and verdict["keys_before"] == verdict["keys_after"] > 0
    # A misspelt topic or partition verifies nothing: exit 2 naming it, never a pass.
    for topic, partition in (("ordrs", "0"), (TOPIC, "3")):
        code = main(["verify", "--store", str(compacted.store), "--topic", topic, "--partition", partition,
                     "--before", str(before), "--reference"])
        assert code == ExitCode.CONFIG and f"holds no partition {topic}-{partition}" in capsys.readouterr().err
    # So does a --before version older than the partition's first tiering (version 0: the empty table).
    code = main(["verify", "--store", str(compacted.store), "--topic", TOPIC, "--partition", "0", "--before", "0",
                 "--reference"])
    assert code == ExitCode.CONFIG and "at version 0, the --before version" in capsys.readouterr().err


def expired_tombstone_keys(store: ObjectStore, before: int) -> set[bytes]:
    """Keys whose winner at `before` is a tombstone below the cleaner offset: a clean past the horizon drops them."""
    cleaned = table_in_store(store).partition_snapshot(TOPIC, 0, before).lineage.current
    return {k for k, r in latest_per_key(store, before).items() if r.value is None and r.offset < cleaned}


def cleaned_past_the_horizon(spark: SparkSession, compacted: CliRun, tmp_path: Path, recorded_ms: int | None = None
                             ) -> tuple[ObjectStore, int, set[bytes]]:
    """A copy of the compacted store cleaned again a day later, past the delete horizon, its commit recorded at
    `recorded_ms` (default: the clean's own clock); returns it, the version before and the tombstones' keys that
    clean drops."""
    store = copy_of(compacted.store, tmp_path)
    before = table_in_store(store).version()
    expected = expired_tombstone_keys(store, before)
    assert expected, "the workload must leave tombstones for the second clean"
    staged = stage(spark, plan(store, CONFIG, NOW + DAY + 1, force=True))
    assert all(o.committed for o in commit(staged, now_ms=recorded_ms))
    return store, before, expected


@pytest.mark.spark
def test_tombstones_dropped_after_their_delete_horizon_verify_clean(spark: SparkSession, compacted: CliRun,
                                                                     tmp_path: Path) -> None:
    store, before, expected = cleaned_past_the_horizon(spark, compacted, tmp_path)
    report = verify_both(spark, store, before)
    assert report.ok, list(report.render_text())
    assert set(report.expired_tombstones) == expected
    assert not expected & latest_per_key(store).keys()


@pytest.mark.spark
def test_keys_expired_by_retention_pass_for_a_compact_delete_topic(spark: SparkSession, compacted: CliRun,
                                                                   tmp_path: Path) -> None:
    store = copy_of(compacted.store, tmp_path)
    table = table_in_store(store)
    before = json.loads((compacted.out / "report.json").read_text())["metadata_version_planned"]
    live = table.live_segments(TOPIC, 0)
    config = TopicConfig.from_kafka({"cleanup.policy": "compact,delete", "retention.ms": -1,
                                     "retention.bytes": sum(s.segment_size_bytes for s in live) // 2})
    expired = expire(table, KcompactConfig(defaults=config), NOW).partitions[0].retention
    assert expired.expired and expired.log_start_offset > 0
    kept = latest_per_key(store)
    gone = {k for k, r in latest_per_key(store, before).items() if r.offset < expired.log_start_offset}
    assert gone and not gone & kept.keys(), "the expired prefix held the only records of some keys"

    report = verify_both(spark, store, before, config=config)
    assert report.ok, list(report.render_text())
    assert report.log_start_offset == expired.log_start_offset and report.keys_after == len(kept)
    lost = verify_both(spark, store, before)  # without the topic's config, retention is not trusted
    assert not lost.ok and gone <= {p.key for p in lost.problems}


@pytest.mark.spark
def test_a_run_that_dropped_tombstones_before_their_horizon_fails(spark: SparkSession, compacted: CliRun,
                                                                  tmp_path: Path) -> None:
    store, before, expected = cleaned_past_the_horizon(spark, compacted, tmp_path, recorded_ms=NOW + 1)  # a day early
    report = verify_both(spark, store, before)
    assert {p.key for p in report.problems} == expected
    assert {p.finding for p in report.problems} == {Finding.VANISHED}
    assert all("before its delete horizon" in p.detail for p in report.problems)


@pytest.mark.spark
def test_dropping_a_live_segment_fails_listing_its_keys(spark: SparkSession, tiered: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    store = copy_of(tiered, tmp_path)
    table = table_in_store(store)
    before, latest = table.version(), latest_per_key(store)
    epoch = acquire_fencing_epoch(table, TOPIC, 0, "rogue@test", NOW)
    snap = table.partition_snapshot(TOPIC, 0)
    victim = snap.live_segments[1]
    commit_change_set(table, ChangeSet.planned_from(
        snap, fencing_epoch=epoch, writer="rogue@test", cleaner_offset=victim.end_offset + 1,
        state_changes=[StateChange(victim.segment_id, SegmentState.DELETE_SEGMENT_STARTED)]), NOW)
    # The victim's own latest keys, and those its transaction markers and index decided (aborted data before it
    # resurfaces; a transaction left without its marker hides its producer's later records from read_committed).
    after = latest_per_key(store)
    expected = {k for k in latest.keys() | after.keys() if latest.get(k) != after.get(k)}
    assert {k for k, r in latest.items() if victim.start_offset <= r.offset <= victim.end_offset} <= expected

    report = verify_both(spark, store, before)
    assert {p.key for p in report.problems} == expected
    assert {p.finding for p in report.problems} <= {Finding.CHANGED, Finding.VANISHED}
    truncated = verify_both(spark, store, before, max_listed=3)
    assert truncated.problems == report.problems[:3] and truncated.problem_count == len(expected) > 3
    assert "FAILED" in next(truncated.render_text()) and not truncated.ok
    code = main(["verify", "--store", str(tmp_path / "store"), "--topic", TOPIC, "--partition", "0",
                 "--before", str(before), "--max-keys", "1000"])
    out = capsys.readouterr().out
    assert code == ExitCode.VERIFY_FAILED == 5
    assert f"FAILED, {len(expected)} keys lost or changed" in out
    assert all(f"key {k.decode()!r}" in out for k in expected)

    collect_garbage(store, table, NOW + DAY, grace_ms=0, orphan_grace_ms=0)
    with pytest.raises(ConfigError, match="gc deleted its replaced segments"):
        verify_partition(store, TOPIC, 0, before)  # what cannot be read anymore is never a pass
    with pytest.raises(ConfigError, match="gc deleted its replaced segments"):
        verify_partition(store, TOPIC, 0, before, spark=spark)


@pytest.mark.spark
def test_a_rewrite_missing_a_batch_fails_listing_exactly_its_latest_keys(spark: SparkSession, tiered: Path,
                                                                         tmp_path: Path) -> None:
    store = copy_of(tiered, tmp_path)
    table = table_in_store(store)
    before, latest = table.version(), latest_per_key(store)
    victim = table.live_segments(TOPIC, 0)[2]
    log_key = victim.object_key(ObjectSuffix.LOG) or ""
    data = store.get(log_key)
    pos, batch = next((pos, b) for pos, b in iter_batches(data) if not b.is_transactional and not b.is_control
                      and any(latest.get(r.key) == r for r in b.records))
    expected = {r.key for r in batch.records if latest.get(r.key) == r}
    tampered = data[:pos] + data[pos + batch.size:]
    new_key = replace(parse_segment_object_key(log_key), segment_id=new_segment_id())
    store.put(new_key.key, tampered)
    keys = [ObjectKey(ObjectSuffix.LOG, new_key.key)]
    for obj in victim.object_keys:  # the other files (the transaction index above all) as they were
        if obj.suffix is not ObjectSuffix.LOG:
            copied = replace(parse_segment_object_key(obj.key), segment_id=new_key.segment_id).key
            if not store.exists(copied):  # an .indexes object holds several files
                store.put(copied, store.get(obj.key))
            keys.append(ObjectKey(obj.suffix, copied))
    epoch = acquire_fencing_epoch(table, TOPIC, 0, "rogue@test", NOW)
    snap = table.partition_snapshot(TOPIC, 0)
    rewrite = NewSegment(segment_id=new_key.segment_id, start_offset=victim.start_offset,
                         end_offset=victim.end_offset, max_timestamp_ms=victim.max_timestamp_ms,
                         segment_leader_epochs=victim.segment_leader_epochs, segment_size_bytes=len(tampered),
                         object_keys=tuple(keys))
    commit_change_set(table, ChangeSet.planned_from(
        snap, fencing_epoch=epoch, writer="rogue@test", new_segments=[rewrite], cleaner_offset=victim.end_offset + 1,
        state_changes=[StateChange(victim.segment_id, SegmentState.DELETE_SEGMENT_STARTED)]), NOW)

    report = verify_both(spark, store, before)
    assert not report.ok
    assert {p.key for p in report.problems} == expected
    assert {p.finding for p in report.problems} <= {Finding.CHANGED, Finding.VANISHED}


@pytest.mark.spark
def test_a_change_above_the_cleaner_offset_fails_record_by_record(spark: SparkSession, tiered: Path,
                                                                   tmp_path: Path) -> None:
    """Never compacted: the cleaner offset is 0, so every record must stay; a segment dropped without moving
    the cleaner offset changes the uncleaned region."""
    store = copy_of(tiered, tmp_path)
    table = table_in_store(store)
    before = table.version()
    epoch = acquire_fencing_epoch(table, TOPIC, 0, "rogue@test", NOW)
    snap = table.partition_snapshot(TOPIC, 0)
    victim = snap.live_segments[-2]
    commit_change_set(table, ChangeSet.planned_from(
        snap, fencing_epoch=epoch, writer="rogue@test",
        state_changes=[StateChange(victim.segment_id, SegmentState.DELETE_SEGMENT_STARTED)]), NOW)

    def consumed(version: int | None) -> dict[int, Record]:
        refs = [segment_ref(s) for s in table_in_store(store).live_segments(TOPIC, 0, version)]
        return {r.offset: r for r in committed_records(store, refs)}

    was, now = consumed(before), consumed(None)
    differ = {o for o in was.keys() | now.keys() if was.get(o) != now.get(o)}
    assert {o for o in differ if victim.start_offset <= o <= victim.end_offset}
    report = verify_both(spark, store, before)
    uncleaned = [p for p in report.problems if p.finding is Finding.UNCLEANED_CHANGED]
    assert report.cleaner_offset_after == 0 and uncleaned
    assert {(p.before or p.after).offset for p in uncleaned if p.before or p.after} <= differ
    reported = {p.key for p in report.problems}
    assert {(was.get(o) or now[o]).key for o in differ} == reported
    assert len(reported) == report.problem_count == len(report.problems)


@pytest.mark.spark
@pytest.mark.parametrize("strategy", ["offset", "timestamp", "header"])
def test_both_paths_rank_by_the_topics_strategy(spark: SparkSession, compacted: CliRun, strategy: str) -> None:
    """The run compacted by offset: verified under another strategy, keys whose winner under it was dropped are
    findings, the same on both paths. The workload's version headers often rank an older record first; its few
    out-of-order timestamps never reorder one key's records that this run dropped."""
    config = TopicConfig.from_kafka({"cleanup.policy": "compact", "compaction.strategy": strategy,
                                     **({"compaction.strategy.header": "version"} if strategy == "header" else {})})
    before = json.loads((compacted.out / "report.json").read_text())["metadata_version_planned"]
    report = verify_both(spark, open_store(str(compacted.store)), before, config=config)
    assert report.strategy == strategy and report.keys_before > 0
    assert report.ok == (strategy != "header"), list(report.render_text())
    assert {p.finding for p in report.problems} <= {Finding.CHANGED}


@pytest.mark.spark
def test_key_counts_come_from_the_observation_or_else_from_a_query_of_their_own(spark: SparkSession) -> None:
    latest = spark.createDataFrame([(b"k1", 1, 1), (b"k2", 1, None), (b"k3", None, 1), (b"k4", None, 2)],
                                   "key binary, b int, a int")
    observed = Observation("observed")
    latest.observe(observed, F.count("b").alias("before"), F.count("a").alias("after")).collect()
    assert key_counts(observed, latest.limit(0)) == (2, 3)  # the observation's: no query of its own
    assert key_counts(Observation("never on a query"), latest, wait_s=0) == (2, 3)
    pending = Observation("no action ran")
    latest.observe(pending, F.count("b").alias("before"), F.count("a").alias("after"))
    started = time.monotonic()
    assert key_counts(pending, latest, wait_s=0.5) == (2, 3)
    assert time.monotonic() - started < 30, "waited for an observation that never came"


def test_many_small_segments_are_read_by_a_few_tasks(spark: SparkSession) -> None:
    """Issue 41: the view tasks take segments packed by bytes (`compaction.packing`): 500 segments of 100 KB make
    one task per task budget of their weight (bytes plus `OPEN_COST_BYTES` each, at most `MAX_TASK_BYTES` a task),
    not 500; a segment larger than a task's budget has one of its own; every segment is read once."""
    rows = [(i % 2, 100 * i, f"t/{i}.log") for i in range(500)]
    frame = packed_frame(spark, rows, [100_000] * 500, _SEGMENTS)
    budget = task_budget([100_000] * 500, spark.sparkContext.defaultParallelism)
    assert budget <= MAX_TASK_BYTES
    per_task = budget // (100_000 + OPEN_COST_BYTES)
    assert frame.rdd.getNumPartitions() == -(-500 // per_task) < 500 / 16
    assert sorted(tuple(r) for r in frame.collect()) == sorted(rows)
    large = packed_frame(spark, rows[:3], [1 << 30, 1 << 30, 10], _SEGMENTS)
    assert sorted(len(part) for part in large.rdd.glom().collect()) == [1, 1, 1]
    assert packed_frame(spark, [], [], _SEGMENTS).count() == 0
