"""`kcompact compact` on a compact,delete topic: as Kafka's cleaner does for such a log, the run applies retention.ms
first (its own commit), compacts the log that leaves, reports both, and verifies clean against the
version it planned from, given the topic's config. `plan` and `--dry-run` show the expiry and change nothing; a
run with nothing to compact still expires.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction.cli import main
from compaction.config import load_config
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import MetadataTable, table_in_store
from compaction.reader import Isolation, consumer_records, segment_ref
from compaction.retention import expire
from compaction.run.commit import commit
from compaction.run.plan import plan
from compaction.run.stage import stage
from compaction.storage import ObjectStore, open_store
from compaction.tier import tier_logdir

RETENTION_MS = 60_000
EXPIRED = 3
SPEC = WorkloadSpec(topics=(TopicSpec("orders", 1),), records_per_partition=1500, keys=80, segment_bytes=16 * 1024,
                    seed=7, start_ms=1_700_000_000_000)


def latest(store: ObjectStore, table: MetadataTable, from_offset: int = 0) -> dict[bytes, tuple]:
    """The last record of each key a read_committed consumer gets, at or above `from_offset`."""
    refs = [segment_ref(s) for s in table.live_segments("orders", 0)]
    read = consumer_records(store, refs, isolation=Isolation.READ_COMMITTED)
    return {r.key: (r.offset, r.value) for r in read if r.key and r.offset >= from_offset}


@pytest.fixture
def tiered(tmp_path: Path) -> tuple[ObjectStore, int]:
    """orders-0 tiered, and a clock at which retention.ms expires exactly its first EXPIRED live segments."""
    generate_logdir(tmp_path / "logs", SPEC)
    store = open_store(str(tmp_path / "store"))
    table = table_in_store(store, create=True)
    tier_logdir(tmp_path / "logs", store, table, SPEC.start_ms)
    live = table.live_segments("orders", 0)
    assert len(live) > EXPIRED + 2
    return store, min(s.max_timestamp_ms for s in live[EXPIRED:]) + RETENTION_MS


def write_config(path: Path, ratio: str, extra: str = "") -> Path:
    path.write_text(f"topics:\n  orders:\n    cleanup.policy: compact,delete\n    retention.ms: {RETENTION_MS}\n"
                    f"    min.cleanable.dirty.ratio: {ratio}\n{extra}")
    return path


@pytest.mark.spark
def test_compact_expires_first_then_compacts_what_is_left(spark: SparkSession, tiered: tuple[ObjectStore, int],
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, now = tiered
    table = table_in_store(store)
    live = table.live_segments("orders", 0)
    log_start = live[EXPIRED].start_offset
    expected = latest(store, table, log_start)
    version = table.version()
    conf = write_config(tmp_path / "kcompact.yaml", "0.01")
    base = ["--store", str(tmp_path / "store"), "--config", str(conf), "--now", str(now)]

    assert main(["plan", *base, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["retention"]["segments_expired"] == EXPIRED and doc["retention"]["dry_run"]
    [part] = doc["partitions"]
    assert part["groups"][0]["base_offset"] == log_start, "planned on the log the expiry leaves"
    assert main(["compact", *base, "--dry-run"]) == 0
    assert f"would expire {EXPIRED} segments" in capsys.readouterr().out
    assert table.version() == version, "plan and --dry-run change nothing"

    report_file = tmp_path / "report.json"
    assert main(["compact", *base, "--report-json", str(report_file)]) == 0
    out = capsys.readouterr().out
    assert f"expired {EXPIRED} segments" in out
    report = json.loads(report_file.read_text())
    assert report["retention"]["segments_expired"] == EXPIRED and not report["retention"]["dry_run"]
    assert report["metadata_version_planned"] == version and report["partitions"][0]["committed"]
    assert table.live_segments("orders", 0)[0].start_offset == log_start
    assert latest(store, table) == expected, "the latest record of every key above the log start is kept"

    verify = ["verify", "--store", str(tmp_path / "store"), "--topic", "orders", "--partition", "0",
              "--before", str(version)]
    assert main([*verify, "--config", str(conf)]) == 0
    assert main(verify) == 5, "without the topic's config the expiry is a loss"
    capsys.readouterr()
    assert main(["compact", *base, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["retention"]["segments_expired"] == 0 and again["partitions"] == []


@pytest.mark.spark
def test_a_run_with_nothing_to_compact_still_expires(tiered: tuple[ObjectStore, int], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    store, now = tiered
    table = table_in_store(store)
    log_start = table.live_segments("orders", 0)[EXPIRED].start_offset
    conf = write_config(tmp_path / "kcompact.yaml", "1")  # a dirty ratio is never above 1: nothing is eligible
    assert main(["compact", "--store", str(tmp_path / "store"), "--config", str(conf), "--now", str(now),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["partitions"] == [] and report["retention"]["segments_expired"] == EXPIRED
    assert table.live_segments("orders", 0)[0].start_offset == log_start


@pytest.mark.spark
def test_an_expiry_racing_a_compaction_loses_nothing(spark: SparkSession, tiered: tuple[ObjectStore, int],
                                                     tmp_path: Path) -> None:
    """`kcompact expire` commits between a run's plan and its stage: the stage re-decides, finds nothing left to
    expire and compacts on. Or between its stage and its commit: the commit conflicts (exit 4, nothing landed) and
    the rerun lands. Either way every key's latest record above the log start is kept."""
    store, now = tiered
    table = table_in_store(store)
    log_start = table.live_segments("orders", 0)[EXPIRED].start_offset
    expected = latest(store, table, log_start)
    config = load_config(write_config(tmp_path / "kcompact.yaml", "0.01", "    segment.bytes: 16384\n"))

    run = plan(store, config, now)
    assert expire(table, config, now).segments_expired == EXPIRED  # after the plan, before the stage
    staged = stage(spark, run)
    assert staged.retention is not None and staged.retention.segments_expired == 0, "re-decided: nothing left"
    assert all(o.committed for o in commit(staged))
    assert latest(store, table) == expected

    staged = stage(spark, plan(store, config, now, force=True))
    live = table.live_segments("orders", 0)
    assert len(live) > 1, "16 KiB output segments"
    assert any(s.segment_size_bytes == 0 for s in live), "a group whose every record was superseded"
    assert all(s.max_timestamp_ms >= 0 for s in live), "an empty output ages with its inputs, as in Kafka"
    later = live[0].max_timestamp_ms + RETENTION_MS + 1  # the first live segment expires, at least
    assert expire(table, config, later).segments_expired >= 1  # after the stage, before the commit
    [outcome] = commit(staged)
    assert not outcome.committed and outcome.exit_code == 4, outcome
    assert all(o.committed for o in commit(stage(spark, plan(store, config, later, force=True))))
    new_start = table.live_segments("orders", 0)[0].start_offset
    assert latest(store, table) == {k: v for k, v in expected.items() if v[0] >= new_start}
