"""`kcompact expire` on both backends: a compact,delete topic's expired prefix leaves the log in one commit, readers
stop serving it at once, `kcompact gc` deletes its objects after the grace, and nothing else changes.

The log dir is generated and tiered for real; the clock of each run is chosen from the tiered segments' own
largest timestamps, so the expected prefix follows from the data (tests/unit/test_retention.py holds the rules,
tests/kafka/test_retention_referee.py Kafka's verdict on them).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from compaction.cli import main
from compaction.config import KcompactConfig, TopicConfig
from compaction.errors import CommitConflictError, ConfigError
from compaction.gc import collect_garbage
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import MetadataTable, PartitionRows, SegmentState, acquire_fencing_epoch, table_in_store
from compaction.reader import consumer_records, segment_ref
from compaction.retention import Breach, expire
from compaction.storage import ObjectStore, open_store
from compaction.tier import tier_logdir

execute_module = importlib.import_module("compaction.retention.execute")
batch_module = importlib.import_module("compaction.metadata.batch")

RETENTION_MS = 60_000
SPEC = WorkloadSpec(topics=(TopicSpec("orders", 1), TopicSpec("users", 1)), records_per_partition=400, keys=60,
                    segment_bytes=8 * 1024, seed=5, start_ms=1_700_000_000_000)
CONFIG = KcompactConfig(topics={
    "orders": TopicConfig.from_kafka({"cleanup.policy": "compact,delete", "retention.ms": RETENTION_MS}),
    "users": TopicConfig.from_kafka({"cleanup.policy": "compact", "retention.ms": 0}),
})


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("retention-logdir")
    generate_logdir(root, SPEC)
    return root


def view(store: ObjectStore, table: MetadataTable, topic: str) -> list[tuple]:
    refs = [segment_ref(s) for s in table.live_segments(topic, 0)]
    return [(r.offset, r.key, r.value) for r in consumer_records(store, refs)]


def clock_expiring(table: MetadataTable, count: int) -> int:
    """A clock at which exactly the first `count` live segments of orders-0 are older than retention.ms."""
    live = table.live_segments("orders", 0)
    oldest_kept = min(s.max_timestamp_ms for s in live[count:])
    assert max(s.max_timestamp_ms for s in live[:count]) < oldest_kept, "the workload's segments grow older in order"
    return oldest_kept + RETENTION_MS


def test_expire_then_gc(store: ObjectStore, logdir: Path) -> None:
    table = table_in_store(store, create=True)
    tier_logdir(logdir, store, table, SPEC.start_ms)
    live = table.live_segments("orders", 0)
    assert len(live) >= 4
    before = {t: view(store, table, t) for t in ("orders", "users")}
    version = table.version()
    now = clock_expiring(table, 3)

    dry = expire(table, CONFIG, now, dry_run=True)
    assert (dry.segments_expired, table.version()) == (3, version), "a dry run changes nothing"

    report = expire(table, CONFIG, now)
    [orders] = report.partitions
    assert (orders.retention.topic, orders.version, report.segments_expired) == ("orders", version + 1, 3)
    assert {s.breach for s in orders.retention.expired} == {Breach.TIME}
    log_start = live[3].start_offset
    assert orders.retention.log_start_offset == log_start
    assert table.live_segments("orders", 0) == live[3:]
    assert view(store, table, "orders") == [r for r in before["orders"] if r[0] >= log_start]
    assert view(store, table, "users") == before["users"], "a compact topic is never expired"
    expired = [table.partition_snapshot("orders", 0).segment(s.segment_id) for s in live[:3]]
    assert {(s.state, s.event_timestamp_ms) for s in expired} == {(SegmentState.DELETE_SEGMENT_STARTED, now)}

    assert expire(table, CONFIG, now).segments_expired == 0 and table.version() == version + 1, "idempotent"

    kept_keys = {o.key for s in live[3:] for o in s.object_keys}
    gone_keys = {o.key for s in live[:3] for o in s.object_keys}
    assert collect_garbage(store, table, now + 59_999).to_dict()["totals"]["objects_deleted"] == 0, "grace"
    collect_garbage(store, table, now + 60_000)
    listed = {o.key for o in store.list("")}
    assert kept_keys <= listed and not gone_keys & listed
    assert view(store, table, "orders") == [r for r in before["orders"] if r[0] >= log_start]


def test_cli(local_store: ObjectStore, logdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = table_in_store(local_store, create=True)
    tier_logdir(logdir, local_store, table, SPEC.start_ms)
    conf = tmp_path / "kcompact.yaml"
    conf.write_text("topics:\n  orders:\n    cleanup.policy: compact,delete\n    retention.ms: -1\n"
                    "    retention.bytes: 1\n")
    live = table.live_segments("orders", 0)
    base = ["--store", local_store.uri.removeprefix("file://"), "--config", str(conf)]
    version = table.version()

    assert main(["expire", *base, "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["dry_run"], doc["segments_expired"], table.version()) == (True, len(live) - 1, version)
    assert main(["expire", *base, "--topic", "orders", "--partition", "1"]) == 0
    assert "expired 0 segments" in capsys.readouterr().out

    assert main(["expire", *base]) == 0
    out = capsys.readouterr().out
    assert f"orders-0: {len(live) - 1} segments ({len(live) - 1} by retention.bytes)" in out
    assert table.live_segments("orders", 0) == live[-1:], "only the last segment stays, whatever retention.bytes"

    verify = ["verify", *base[:2], "--topic", "orders", "--partition", "0", "--before", str(version), "--reference"]
    assert main(verify) == 5, "without the topic's config, expired records are lost records"
    assert "FAILED" in capsys.readouterr().out
    assert main([*verify, "--config", str(conf), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["log_start_offset"] == live[-1].start_offset

    assert main(["expire", *base[:2], "--config", str(tmp_path / "missing.yaml")]) == 2
    assert main(["expire", *base, "--partition", "0"]) == 2, "--partition needs --topic"
    with pytest.raises(ConfigError):
        expire(table, KcompactConfig(), 0, partition=-1)


def test_an_expiry_that_loses_a_race_decides_again(local_store: ObjectStore, logdir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction takes the partition (a new fencing epoch) between the expiry's read and its commit: the commit
    conflicts, the expiry reads the partition again and commits under the new epoch. One that keeps losing raises
    CommitConflictError (exit 4), having committed nothing."""
    table = table_in_store(local_store, create=True)
    tier_logdir(logdir, local_store, table, SPEC.start_ms)
    now = clock_expiring(table, 2)
    real = batch_module._write
    races = {"left": 1}

    def write_after_a_race(reader: object, dt: object, base: int, rows: Sequence[PartitionRows], checkpoint: bool
                           ) -> object:
        if races["left"] and rows[0].state.writer != "kcompact compact@test":
            races["left"] -= 1
            acquire_fencing_epoch(table, "orders", 0, "kcompact compact@test", now)
        return real(reader, dt, base, rows, checkpoint)

    monkeypatch.setattr(batch_module, "_write", write_after_a_race)
    report = expire(table, CONFIG, now)
    assert report.segments_expired == 2 and races["left"] == 0
    assert table.partition_snapshot("orders", 0).fencing_epoch == 1

    version = table.version()
    races["left"] = execute_module.ATTEMPTS
    with pytest.raises(CommitConflictError):
        expire(table, CONFIG, clock_expiring(table, 1))
    assert table.version() == version + execute_module.ATTEMPTS, "only the racing compactions' epochs landed"


def test_an_expiry_of_many_partitions_is_one_commit(tmp_path: Path) -> None:
    """Issue 41: the expiries of every partition in scope land in one Delta commit, not one per partition."""
    spec = WorkloadSpec(topics=(TopicSpec("orders", 12),), records_per_partition=200, keys=30,
                        segment_bytes=4 * 1024, seed=8, start_ms=SPEC.start_ms)
    generate_logdir(tmp_path / "logdir", spec)
    store = open_store(str(tmp_path / "store"))
    table = table_in_store(store, create=True)
    tier_logdir(tmp_path / "logdir", store, table, spec.start_ms)
    version = table.version()
    report = expire(table, KcompactConfig(topics={"orders": TopicConfig.from_kafka(
        {"cleanup.policy": "compact,delete", "retention.ms": -1, "retention.bytes": 1})}), spec.start_ms)
    assert len([p for p in report.partitions if p.retention.expired]) == 12
    assert table.version() == version + 1 and {p.version for p in report.partitions} == {version + 1}
    assert all(len(table.live_segments("orders", p)) == 1 for p in range(12)), "only each last segment stays"
