"""A compaction round on the S3 backend (a moto server on 127.0.0.1) that keeps segments unread, and the store
requests the report counts. (Every test of `test_compact.py` also runs on S3: `new_store` in conftest.py.)

The Spark Python workers reach moto through the store spec (endpoint, region); credentials come from the
workers' environment, as on a cluster (instance profile or AWS_* variables): here fake ones, handed to the
workers through the SparkContext's executor environment for this test only and removed afterwards.
Nothing logs them.
"""

from __future__ import annotations

import importlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from compaction.config import KcompactConfig, TopicConfig
from compaction.metadata import table_in_store
from compaction.run.commit import commit
from compaction.run.plan import plan
from compaction.run.report import run_report
from compaction.run.stage import stage
from compaction.storage import ObjectStore
from compaction.tier import tier_logdir
from tests.moto_s3 import fresh_s3_store
from tests.s3_proxy import FlakyProxy, spec_through
from tests.scenario_log import ScenarioLog, tier
from tests.spark.partition_reads import all_records, latest_per_key, latest_per_key_of_topic

fused_module = importlib.import_module("compaction.spark.fused")

NOW = 1_800_000_000_000
DAY = 86_400_000

pytestmark = pytest.mark.s3


@pytest.mark.spark
def test_s3_round_keeps_segments_unread_and_reports_its_requests(
    spark: SparkSession, tmp_path: Path, moto_endpoint: str, fake_aws_env: None, workers_see_fake_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Also the rescan path: the clean segment holding the changed key is scanned on Spark after the filter
    test, cached, and its keys join the winners; on S3 too each object is fetched once."""
    store = fresh_s3_store(moto_endpoint)
    config = KcompactConfig(defaults=TopicConfig.from_kafka({
        "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.0001", "bloom.filter.fpp": "0.001",
        "segment.bytes": str(16 * 1024)}))
    log = ScenarioLog("s3keep", NOW - 5 * DAY, segment_bytes=16 * 1024)
    for start in range(0, 600, 20):
        log.append([(k, b"v%d" % k + b"x" * 300) for k in range(start, start + 20)])
    log.roll()
    tier([log], tmp_path / "logs", store, NOW - 4 * DAY)
    assert all(o.committed for o in commit(stage(spark, plan(store, config, NOW - 3 * DAY))))
    log.append([(7, b"changed")])
    log.roll()
    tier([log], tmp_path / "logs", store, NOW - 2 * DAY)
    before = latest_per_key(store, "s3keep", 0)
    staged = stage(spark, plan(store, config, NOW))
    report = run_report(staged, commit(staged)).to_dict()
    assert latest_per_key(store, "s3keep", 0) == before
    below = table_in_store(store).partition_snapshot("s3keep", 0).lineage.current
    keys = [k for k, (offset, _v) in latest_per_key(store, "s3keep", 0).items() if offset < below]
    held = [r.key for r in all_records(store, "s3keep", 0) if r.key is not None and r.offset < below]
    assert sorted(held) == sorted(keys), "below the checkpoint each key is held once"
    [part] = report["partitions"]
    assert part["committed"] and part["segments_skipped"] > 0 and part["bytes_not_downloaded"] > 0
    assert part["fetch_ratio"] <= 1.05 and part["stats"]["cache_hits"] == part["stats"]["segments_scanned"]
    [sp] = staged.partitions
    objects = {o.key for n in sp.new_segments for o in n.object_keys}  # an .indexes object is named once a file
    uploaded = sum(store.size(k) for k in objects)
    requests = part["requests"]
    assert requests["puts"] >= len(objects) == 2 * len(sp.new_segments)  # a .log and an .indexes object each
    assert uploaded <= requests["bytes_written"] <= uploaded + 100  # + the conditional-PUT probes' bytes
    assert requests["gets"] > 0 and requests["bytes_read"] > 0
    assert report["requests"] == requests


def _many_small_partitions(store: ObjectStore, logdir: Path) -> list[ScenarioLog]:
    """8 small partitions of one topic, three rolled segments of updates each, tiered."""
    logs = [ScenarioLog("many", NOW - 5 * DAY, partition=p, segment_bytes=4 * 1024) for p in range(8)]
    for log in logs:
        for start in range(0, 60, 10):
            log.append([(k % 25, b"v%d-%d" % (log.partition, k) + b"x" * 200) for k in range(start, start + 10)])
        log.roll()
        log.write(logdir)
    assert [r.error for r in tier_logdir(logdir, store, table_in_store(store, create=True), NOW - 4 * DAY)] == (
        [None] * len(logs))
    return logs


def _compacted_at_latency(spark: SparkSession, proxy: FlakyProxy, logdir: Path) -> tuple[dict[str, Any], int]:
    """A store behind `proxy`, 8 small partitions tiered and compacted while each GET of a segment's `.log` takes
    50 ms; the run's report and the most such GETs the proxy saw at once."""
    store = spec_through(proxy).open()
    logs = _many_small_partitions(store, logdir)
    before = latest_per_key_of_topic(store, "many")
    assert len(before) == len(logs)
    lock, flying, most = threading.Lock(), [0], [0]

    def slow_segment_reads(method: str, path: str) -> None:
        if method == "GET" and path.split("?")[0].endswith(".log"):
            with lock:
                flying[0] += 1
                most[0] = max(most[0], flying[0])
            time.sleep(0.05)
            with lock:
                flying[0] -= 1

    proxy.latency = slow_segment_reads
    config = KcompactConfig(defaults=TopicConfig.from_kafka({"cleanup.policy": "compact",
                                                            "min.cleanable.dirty.ratio": "0.0001"}))
    staged = stage(spark, plan(store, config, NOW))
    report = run_report(staged, commit(staged)).to_dict()
    proxy.latency = lambda method, path: None
    assert latest_per_key_of_topic(store, "many") == before
    return report, most[0]


@pytest.mark.spark
def test_small_partitions_are_rewritten_several_at_a_time_each_counting_its_own_requests(
    spark: SparkSession, tmp_path: Path, proxy: FlakyProxy, fake_aws_env: None, workers_see_fake_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On S3 a task rewrites up to `UNITS_IN_FLIGHT` of its small partitions at once (each is a few round trips one
    after another), and each partition's report still counts its own requests: the same counts as one at a time."""
    at_once, most = _compacted_at_latency(spark, proxy, tmp_path / "at-once")
    monkeypatch.setattr(fused_module, "UNITS_IN_FLIGHT", 1)
    one_by_one, most_one_by_one = _compacted_at_latency(spark, proxy, tmp_path / "one-by-one")
    assert most_one_by_one <= 2 < most, "two tasks (local[2]); several partitions of each task at once"

    def counts(report: dict[str, Any]) -> dict[int, tuple[int, int]]:
        parts = report["partitions"]
        assert len(parts) == 8 and all(p["committed"] for p in parts)
        return {p["partition"]: (p["requests"]["gets"], p["requests"]["puts"]) for p in parts}

    a, b = counts(at_once), counts(one_by_one)
    assert {p: gets for p, (gets, _puts) in a.items()} == {p: gets for p, (gets, _puts) in b.items()}
    # each task's first write runs the conditional-PUT probe (2 PUTs) in its partition's requests: which partition
    # that is depends on which one writes first
    assert sorted(puts for _gets, puts in a.values()) == sorted(puts for _gets, puts in b.values())
    assert at_once["requests"] == one_by_one["requests"]
    assert all(gets >= 3 and puts >= 2 for gets, puts in a.values())
