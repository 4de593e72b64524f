"""`kcompact table` end to end: the table equals the latest committed value per key, computed plainly from the
records (`tests.topic_table.expected_rows`), after any sequence of appends, compactions and runs, under every
strategy; incremental equals rebuild; a crash before or at the commit converges; concurrent runs apply once;
a tombstone compacted away behind the table's back rebuilds its partition.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

import compaction
from compaction.cli import main
from compaction.config import CompactionStrategy, KcompactConfig, TopicConfig
from compaction.errors import CommitConflictError
from compaction.packing import pack_for
from compaction.storage import ObjectStore, open_store
from compaction.topic_table import Location, Reason, execute, plan_run
from compaction.topic_table import run as table_run
from tests.faults import SimulatedCrash
from tests.latest_view import Strategy
from tests.scenario_log import ScenarioLog, clean, tier
from tests.topic_table import VERSION_HEADER, RandomProducer, duckdb_rows, expected_rows, table_rows

T = 1_800_000_000_000
MINUTE = 60_000
TOPIC = "users"
STRATEGIES = {
    "offset": Strategy(),
    "timestamp": Strategy(CompactionStrategy.TIMESTAMP),
    "header": Strategy(CompactionStrategy.HEADER, VERSION_HEADER),
}


def config_for(kind: str, **extra: object) -> KcompactConfig:
    settings: dict[str, object] = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
                                   "compaction.strategy": kind, **extra}
    if kind == "header":
        settings["compaction.strategy.header"] = VERSION_HEADER
    return KcompactConfig(defaults=TopicConfig.from_kafka(settings))


class Topic:
    """Two partitions (or `partitions`) of random appends, tiered into one store, and the clock of the next step."""

    def __init__(self, root: Path, seed: int, store: ObjectStore | None = None, partitions: int = 2) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.producers = [RandomProducer(ScenarioLog(TOPIC, T, partition=p), self.rng) for p in range(partitions)]
        self.store = store or open_store(str(root / "store"))
        self.now = T

    def append(self, batches: int = 6, *, leave_open: bool = False) -> None:
        self.now += MINUTE
        for p in self.producers:
            p.log.timestamp = self.now
            p.append(batches, leave_open=leave_open and self.rng.random() < 0.7)
        tier([p.log for p in self.producers], self.root / "logdir", self.store, self.now)

    def expected(self, kind: str) -> set[Any]:
        return expected_rows(self.producers, STRATEGIES[kind])


def table_uri(root: Path, name: str = "table") -> str:
    return str(root / "tables" / name)


def run_table(spark: SparkSession, topic: Topic, kind: str, uri: str, **options: Any) -> compaction.TableReport:
    topic.now += MINUTE
    return compaction.table(spark, topic.store, config_for(kind), TOPIC, uri, now_ms=topic.now, **options)


@pytest.mark.spark
@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_the_table_holds_the_latest_committed_value_per_key(spark: SparkSession, tmp_path: Path, kind: str) -> None:
    marked = 0
    topic = Topic(tmp_path, seed=sorted(STRATEGIES).index(kind))
    uri = table_uri(tmp_path)
    config = config_for(kind)
    for step, action in enumerate(["append", "table", "append", "compact", "open", "table", "append", "table",
                                   "table"]):
        if action in ("append", "open"):
            topic.append(leave_open=action == "open")
        elif action == "compact":
            topic.now += MINUTE
            clean(spark, topic.store, config, topic.now, [TOPIC])
        else:
            report = run_table(spark, topic, kind, uri)
            assert table_rows(uri) == topic.expected(kind), f"step {step}"
            assert duckdb_rows(uri) == table_rows(uri), f"step {step}: DuckDB reads other rows"
            if step > 1:  # after the first run only updates, never a rebuild
                assert all(s.reason is Reason.UPDATE for s in report.run.plan.spans), report.run.plan.render_text()
            marked += report.files_marked
    assert report.committed_version is None  # the last run found nothing new
    assert marked > 0  # Delta's MERGE marked the replaced rows deleted (deletion vectors)
    rebuilt = table_uri(tmp_path, "rebuilt")
    run_table(spark, topic, kind, rebuilt)
    assert table_rows(rebuilt) == table_rows(uri)


@pytest.mark.spark
@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_a_rebuild_by_tasks_in_key_buckets_or_by_spark_writes_the_same_table(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """A rebuild runs as a task per partition and key bucket (one bucket, three) or, for a partition too large for
    that, through Spark's aggregate: each writes the plainly computed table, transactions left open included."""
    from compaction.spark import table as data

    topic = Topic(tmp_path, seed=20 + sorted(STRATEGIES).index(kind))
    for step in range(3):
        topic.append(leave_open=step == 1)
    clean(spark, topic.store, config_for(kind), topic.now + 1, [TOPIC])
    expected = topic.expected(kind)
    assert expected
    for name, buckets in (("one", 1), ("three", 3), ("spark", None)):
        monkeypatch.setattr(data, "rebuild_buckets", lambda *_, b=buckets: b)
        uri = table_uri(tmp_path, name)
        report = run_table(spark, topic, kind, uri)
        assert {s.reason for s in report.run.plan.spans} == {Reason.NEW}
        assert table_rows(uri) == expected, name
        files = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pydict()
        if buckets is not None:  # a file per (partition, bucket) holding a key
            assert len(files["path"]) <= 2 * buckets


@pytest.mark.spark
def test_many_small_partitions_are_rebuilt_by_a_few_tasks(spark: SparkSession, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: the rebuild's items (a partition and key bucket each) are packed into tasks by bytes
    (`compaction.packing`): twelve small partitions make a few tasks a core, and the table is the plainly computed
    one."""
    from compaction.spark import table as data

    topic = Topic(tmp_path, seed=41, partitions=12)
    topic.append()
    packed: list[tuple[int, int]] = []

    def spy(sizes: list[int], parallelism: int) -> list[list[int]]:
        tasks = pack_for(sizes, parallelism)
        packed.append((len(sizes), len(tasks)))
        return tasks

    monkeypatch.setattr(data, "pack_for", spy)
    uri = table_uri(tmp_path)
    report = run_table(spark, topic, "offset", uri)
    assert {s.reason for s in report.run.plan.spans} == {Reason.NEW} and len(report.run.plan.spans) == 12
    assert table_rows(uri) == topic.expected("offset")
    [(items, tasks)] = packed
    assert items == 12 and tasks <= 2 * 2 * spark.sparkContext.defaultParallelism < items


@pytest.mark.spark
@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_an_update_by_tasks_or_by_spark_writes_the_same_table(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """An update's MERGE source comes from tasks (each takes partitions whole; "one-task" puts both partitions in
    one), run in the driver's process when small ("driver": no Spark job for them) or on Spark's executors, or, for a
    partition too large for a task, from Spark's aggregate: each gives the plainly computed table. The driver's
    threads under every strategy; each other path under one (the strategies differ in the winners, not the path)."""
    from compaction.spark import table as data

    topic = Topic(tmp_path, seed=40 + sorted(STRATEGIES).index(kind))
    topic.append(batches=12)
    names = ("driver", {"header": "spark", "offset": "tasks", "timestamp": "one-task"}[kind])
    tables = {name: table_uri(tmp_path, name) for name in names}
    for uri in tables.values():
        run_table(spark, topic, kind, uri)
    topic.append(batches=2, leave_open=True)
    expected = topic.expected(kind)
    task_groups, on_driver = data.task_groups, data.DRIVER_UPDATE_BYTES
    for name in names:
        used: list[str] = []
        monkeypatch.setattr(data, "UPDATE_TASK_BYTES", -1 if name == "spark" else data.REBUILD_TASK_BYTES)
        monkeypatch.setattr(data, "DRIVER_UPDATE_BYTES", on_driver if name == "driver" else -1)
        monkeypatch.setattr(data, "task_groups", (lambda sizes, _: [list(range(len(sizes)))]) if name == "one-task"
                            else task_groups)
        for spy in ("run_here", "task_rows", "spark_rows"):
            monkeypatch.setattr(data, spy, spying(getattr(data, spy), spy, used))
        report = run_table(spark, topic, kind, tables[name])
        assert used == [{"driver": "run_here", "spark": "spark_rows"}.get(name, "task_rows")], (name, used)
        assert {s.reason for s in report.run.plan.spans} == {Reason.UPDATE}
        assert report.files_marked, report.to_dict()  # the MERGE's deletion vectors
        assert table_rows(tables[name]) == expected, name
        assert duckdb_rows(tables[name]) == expected, name
        monkeypatch.undo()


def spying(real: Any, name: str, calls: list[str]) -> Any:
    """`real`, noting its `name` in `calls` at each call."""
    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(*args, **kwargs)

    return spy


@pytest.mark.spark
def test_a_crash_before_or_at_the_commit_converges(spark: SparkSession, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    topic = Topic(tmp_path, seed=11)
    uri = table_uri(tmp_path)
    topic.append()
    run_table(spark, topic, "offset", uri)
    before = table_rows(uri)
    topic.append()
    real_commit = table_run.commit

    def crash_before(*args: Any) -> None:
        raise SimulatedCrash("after the rows were computed, before the commit")

    monkeypatch.setattr(table_run, "commit", crash_before)
    with pytest.raises(SimulatedCrash):
        run_table(spark, topic, "offset", uri)
    assert table_rows(uri) == before  # nothing of the run is part of the table

    def crash_after(*args: Any) -> None:
        real_commit(*args)
        raise SimulatedCrash("the commit landed, the caller never heard")

    monkeypatch.setattr(table_run, "commit", crash_after)
    with pytest.raises(SimulatedCrash):
        run_table(spark, topic, "offset", uri)
    monkeypatch.setattr(table_run, "commit", real_commit)
    rerun = run_table(spark, topic, "offset", uri)
    assert rerun.committed_version is None and not rerun.run.plan.spans
    assert table_rows(uri) == topic.expected("offset")
    topic.append()
    run_table(spark, topic, "offset", uri)
    rebuilt = table_uri(tmp_path, "rebuilt")
    run_table(spark, topic, "offset", rebuilt)
    assert table_rows(uri) == table_rows(rebuilt) == topic.expected("offset")
    again = run_table(spark, topic, "offset", uri, rebuild=True)
    assert {s.reason for s in again.run.plan.spans} == {Reason.REQUESTED}
    assert table_rows(uri) == topic.expected("offset")


@pytest.mark.spark
def test_a_crash_between_the_replace_and_the_merge_leaves_the_rebuild_applied(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that rebuilds partition 1 and updates partition 0 commits twice (replace, then MERGE); dying between
    the two leaves partition 1 applied by the first commit, and the rerun updates partition 0 only."""
    topic = Topic(tmp_path, seed=15)
    uri = table_uri(tmp_path)
    topic.append()
    run_table(spark, topic, "offset", uri)
    topic.append()
    real_plan, real_commit = table_run.plan_table, table_run.commit

    def rebuild_one(*args: Any, **kwargs: Any) -> Any:
        plan = real_plan(*args, **kwargs)
        spans = tuple(dataclasses.replace(s, reason=Reason.REQUESTED, from_offset=0, read_from=0)
                      if s.partition == 1 else s for s in plan.spans)
        return dataclasses.replace(plan, spans=spans)

    def crash_before_the_merge(*args: Any) -> None:
        if not args[3][0].rebuild:
            raise SimulatedCrash("the replace landed, the MERGE never ran")
        real_commit(*args)

    monkeypatch.setattr(table_run, "plan_table", rebuild_one)
    monkeypatch.setattr(table_run, "commit", crash_before_the_merge)
    with pytest.raises(SimulatedCrash):
        run_table(spark, topic, "offset", uri)
    monkeypatch.undo()
    rerun = run_table(spark, topic, "offset", uri)
    assert [(s.partition, s.reason) for s in rerun.run.plan.spans] == [(0, Reason.UPDATE)]
    assert len(rerun.commits) == 1 and table_rows(uri) == topic.expected("offset")


@pytest.mark.spark
def test_concurrent_runs_apply_the_same_records_once(spark: SparkSession, tmp_path: Path) -> None:
    topic = Topic(tmp_path, seed=12)
    uri = table_uri(tmp_path)
    topic.append()
    run_table(spark, topic, "timestamp", uri)
    topic.append()
    location = Location.parse(uri)
    config = config_for("timestamp")
    first = plan_run(topic.store, config, TOPIC, location, topic.now + 1)
    second = plan_run(topic.store, config, TOPIC, location, topic.now + 2)
    assert first.plan.spans == second.plan.spans and first.plan.spans
    version = execute(spark, topic.store, first).committed_version
    with pytest.raises(CommitConflictError, match="rerun"):
        execute(spark, topic.store, second)
    assert DeltaTable(uri).version() == version  # the loser committed nothing
    assert table_rows(uri) == topic.expected("timestamp")
    rerun = run_table(spark, topic, "timestamp", uri)
    assert rerun.committed_version is None


@pytest.mark.spark
def test_a_tombstone_compacted_away_behind_the_table_rebuilds_its_partition(spark: SparkSession,
                                                                           tmp_path: Path) -> None:
    retention = 10 * MINUTE
    config = config_for("offset", **{"delete.retention.ms": retention})
    store = open_store(str(tmp_path / "store"))
    log = ScenarioLog(TOPIC, T)
    for key in (b"a", b"b"):
        log.record(key, key)
    log.roll()
    tier([log], tmp_path / "logdir", store, T)
    uri = table_uri(tmp_path)
    compaction.table(spark, store, config, TOPIC, uri, now_ms=T)
    log.record(b"a", None)
    log.record(b"c", b"c")
    log.roll()
    tier([log], tmp_path / "logdir", store, T + MINUTE)
    clean(spark, store, config, T + 2 * MINUTE, [TOPIC])  # keeps the tombstone, stamps its delete horizon
    clean(spark, store, config, T + 2 * MINUTE + retention + 1, [TOPIC])  # past the horizon: the tombstone goes
    report = compaction.table(spark, store, config, TOPIC, uri, now_ms=T + 3 * MINUTE + retention)
    assert [s.reason for s in report.run.plan.spans] == [Reason.TOMBSTONE_HORIZON]
    assert {r[1] for r in table_rows(uri)} == {b"b", b"c"}


@pytest.mark.spark
def test_keys_expired_by_retention_leave_the_table(spark: SparkSession, tmp_path: Path) -> None:
    config = config_for("offset", **{"cleanup.policy": "compact,delete", "retention.ms": 10 * MINUTE})
    store = open_store(str(tmp_path / "store"))
    log = ScenarioLog(TOPIC, T)
    for keys in ((b"a", b"b"), (b"b", b"c"), (b"d",)):  # three segments, a minute apart
        for key in keys:
            log.record(key, key)
        log.roll()
        log.timestamp += MINUTE
    tier([log], tmp_path / "logdir", store, T + 2 * MINUTE)
    uri = table_uri(tmp_path)
    compaction.table(spark, store, config, TOPIC, uri, now_ms=T + 2 * MINUTE)
    assert {r[1] for r in table_rows(uri)} == {b"a", b"b", b"c", b"d"}
    expired = compaction.expire(store, config, T + 10 * MINUTE + 1)  # the first segment only
    assert expired.segments_expired == 1
    report = compaction.table(spark, store, config, TOPIC, uri, now_ms=T + 11 * MINUTE)
    assert [s.reason for s in report.run.plan.spans] == [Reason.RETENTION]
    assert {r[1] for r in table_rows(uri)} == {b"b", b"c", b"d"}
    again = compaction.table(spark, store, config, TOPIC, uri, now_ms=T + 12 * MINUTE)
    assert again.committed_version is None, "the log start it applied is recorded: no second rebuild"


@pytest.mark.spark
def test_the_command_line(spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topic = Topic(tmp_path, seed=13)
    topic.append()
    config = tmp_path / "kcompact.yaml"
    config.write_text("defaults:\n  cleanup.policy: compact\n  compaction.strategy: timestamp\n")
    uri = table_uri(tmp_path)
    base = ["table", "--store", topic.store.uri, "--config", str(config), "--topic", TOPIC, "--table", uri,
            "--now", str(T)]
    assert main([*base, "--dry-run"]) == 0
    assert not Path(uri).exists()
    capsys.readouterr()
    assert main([*base, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["committed_version"] == 1 and report["plan"]["spans"][0]["reason"] == str(Reason.NEW)
    assert table_rows(uri) == topic.expected("timestamp")
    assert main([*base[:-4], "--topic", "nope", "--table", uri]) == 2
    config.write_text("defaults:\n  cleanup.policy: compact\n")
    assert main(base) == 2  # built under timestamp: an offset run is refused
    assert "strategy" in capsys.readouterr().err


@pytest.mark.spark
def test_the_table_on_each_store(spark: SparkSession, tmp_path: Path, new_store: Any) -> None:
    store = new_store()
    topic = Topic(tmp_path, seed=14, store=store)
    topic.append(leave_open=True)
    uri = f"{store.uri}/tables/{TOPIC}"
    run_table(spark, topic, "header", uri)
    topic.append()
    run_table(spark, topic, "header", uri)
    options = Location.parse(uri, store.spec.endpoint_url, store.spec.region).open().delta_storage_options()
    assert table_rows(store.delta_uri(f"tables/{TOPIC}"), options) == topic.expected("header")


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["offset", "header"])
def test_the_table_takes_the_wal_tail_too(spark: SparkSession, tmp_path: Path, kind: str) -> None:
    """Records only the WAL holds yet (`kcompact wal upload` of the active segments) are in the table, with the
    transactions they close; the table does not wait for a roll."""
    from compaction.wal.upload import upload_logdir

    topic = Topic(tmp_path, seed=21)
    topic.append()  # tiered
    uri = table_uri(tmp_path)
    run_table(spark, topic, kind, uri)
    for _ in range(2):
        topic.now += MINUTE
        for p in topic.producers:
            p.log.timestamp = topic.now
            p.append(6)
            p.log.segment_bases.pop()  # undo the append's roll: these batches stay in the active segment
            p.log.write(tmp_path / "logdir")
        upload_logdir(tmp_path / "logdir", topic.store, topic.now)
        run_table(spark, topic, kind, uri)
        assert table_rows(uri) == topic.expected(kind)
    rebuilt = table_uri(tmp_path, "rebuilt")
    run_table(spark, topic, kind, rebuilt)
    assert table_rows(rebuilt) == table_rows(uri)


@pytest.mark.spark
@pytest.mark.parametrize("where", ["rebuild", "driver", "executors", "spark"])
def test_a_corrupt_segment_fails_the_run_naming_it_and_commits_nothing(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        where: str) -> None:
    """A bit flipped at rest in a segment the run reads: the command exits 3 (corrupt input) with the task's error
    in one line naming the object and the byte, and the table is left as it was, whether the partition is rebuilt
    or updated (by threads of the driver's process, by Spark tasks, or through Spark's aggregate: a Spark task's
    error fails the job, and with it Delta's command, carrying the error back, `compaction.topic_table.tasks`)."""
    from compaction.metadata import ObjectSuffix, table_in_store
    from compaction.spark import table as data

    topic = Topic(tmp_path, seed=17)
    topic.append()
    uri = table_uri(tmp_path)
    config = tmp_path / "kcompact.yaml"
    config.write_text("defaults:\n  cleanup.policy: compact\n")
    base = ["table", "--store", topic.store.uri, "--config", str(config), "--topic", TOPIC, "--table", uri]
    if where != "rebuild":  # built: the failing run is its first update
        topic.now += MINUTE
        assert main([*base, "--now", str(topic.now)]) == 0
        topic.append()
    monkeypatch.setattr(data, "DRIVER_UPDATE_BYTES", -1 if where == "executors" else data.DRIVER_UPDATE_BYTES)
    monkeypatch.setattr(data, "UPDATE_TASK_BYTES", -1 if where == "spark" else data.UPDATE_TASK_BYTES)
    victim = table_in_store(topic.store).live_segments(TOPIC, 1)[-1]
    key = victim.object_key(ObjectSuffix.LOG) or ""
    flipped = bytearray(topic.store.get(key))
    flipped[100] ^= 0xFF
    topic.store.delete(key)  # objects are never overwritten: replace it (as a bit flip at rest would)
    topic.store.put(key, bytes(flipped))
    version = DeltaTable(uri).version() if where != "rebuild" else None
    rows = table_rows(uri) if where != "rebuild" else None
    capsys.readouterr()
    assert main([*base, "--now", str(topic.now + MINUTE)]) == 3
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("kcompact table: ")]
    assert re.fullmatch(rf"kcompact table: \w+Error: .*{re.escape(key)}.*, byte \d+: .+", line), err
    if where == "rebuild":
        assert not (Path(uri) / "_delta_log").exists() or DeltaTable(uri).version() == 0
    else:
        assert DeltaTable(uri).version() == version and table_rows(uri) == rows


@pytest.mark.spark
def test_an_update_is_a_merge_a_change_data_feed_reader_follows(spark: SparkSession, tmp_path: Path) -> None:
    """Issue 42: the update's MERGE marks the replaced rows deleted (a deletion vector on the file holding them, no
    rewrite), records the applied offsets in its own commit (Delta's txn and the commit's userMetadata), and a reader
    of Delta's change data feed sees its delete, update and insert."""
    store = open_store(str(tmp_path / "store"))
    log = ScenarioLog(TOPIC, T)
    for key in (b"a", b"b", b"c"):
        log.record(key, key * 3)
    log.roll()
    tier([log], tmp_path / "logdir", store, T)
    uri = table_uri(tmp_path)
    config = config_for("offset")
    built = compaction.table(spark, store, config, TOPIC, uri, now_ms=T)
    assert built.commits == [1] and built.rows_written == 3
    log.record(b"a", None)  # a tombstone: a's row goes
    log.record(b"b", b"new")
    log.record(b"d", b"ddd")
    log.roll()
    tier([log], tmp_path / "logdir", store, T + MINUTE)
    updated = compaction.table(spark, store, config, TOPIC, uri, now_ms=T + MINUTE)
    [version] = updated.commits
    assert updated.files_marked == 1 and updated.files_removed == 0, updated.to_dict()
    assert {r[1]: r[2] for r in table_rows(uri)} == {b"b": b"new", b"c": b"ccc", b"d": b"ddd"}
    history = dict(topic_table_of(uri).commit_infos(version, version))
    assert history[version]["operation"] == "MERGE"
    assert json.loads(history[version]["userMetadata"])["applied"] == {"0": [6, T + MINUTE, 0]}
    assert DeltaTable(uri).transaction_version(f"kcompact-table/{TOPIC}") == 2
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version).load(uri)
            .select("key", "value", "_change_type", "_commit_version").collect())
    assert sorted((bytes(r.key), r._change_type) for r in feed) == [
        (b"a", "delete"), (b"b", "update_postimage"), (b"b", "update_preimage"), (b"d", "insert")]
    assert {r._commit_version for r in feed} == {version}


def topic_table_of(uri: str) -> Any:
    from compaction.topic_table import TopicTable

    return TopicTable(Location.parse(uri), TOPIC, CompactionStrategy.OFFSET, None)


@pytest.mark.spark
def test_a_one_percent_update_writes_at_most_five_percent_of_the_tables_bytes(spark: SparkSession,
                                                                              tmp_path: Path) -> None:
    """Issue 42: an update of 1% of the keys adds its winners, deletion vectors and change data, not a rewrite."""
    store = open_store(str(tmp_path / "store"))
    log = ScenarioLog(TOPIC, T)
    rng = random.Random(42)
    keys = [b"key-%05d" % i for i in range(4000)]
    for key in keys:
        log.record(key, rng.randbytes(100))
    log.roll()
    tier([log], tmp_path / "logdir", store, T)
    uri = table_uri(tmp_path)
    compaction.table(spark, store, config_for("offset"), TOPIC, uri, now_ms=T)
    files = {p: p.stat().st_size for p in Path(uri).rglob("*") if p.is_file() and "_delta_log" not in p.parts}
    for key in rng.sample(keys, 40):
        log.record(key, rng.randbytes(100))
    log.roll()
    tier([log], tmp_path / "logdir", store, T + MINUTE)
    report = compaction.table(spark, store, config_for("offset"), TOPIC, uri, now_ms=T + MINUTE)
    assert report.files_marked and not report.files_removed, report.to_dict()
    added = sum(p.stat().st_size for p in Path(uri).rglob("*")
                if p.is_file() and "_delta_log" not in p.parts and p not in files)
    assert added <= 0.05 * sum(files.values()), (added, sum(files.values()))
