"""The end-to-end compaction tests, again on the S3 backend (a moto server on 127.0.0.1).

Every test of `test_compact.py` runs here unchanged: they take their stores from the `new_store` fixture,
which this module overrides with a fresh prefix in a moto bucket. One more test: a round that keeps segments
unread on S3, and the store requests the report counts.

The Spark Python workers reach moto through the store spec (endpoint, region); credentials come from the
workers' environment, as on a cluster (instance profile or AWS_* variables): here fake ones, handed to the
workers through the SparkContext's executor environment for this module only and removed afterwards.
Nothing logs them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction.config import KcompactConfig, TopicConfig
from compaction.metadata import table_in_store
from compaction.report import run_report
from compaction.run.commit import commit
from compaction.run.plan import plan
from compaction.run.stage import stage
from compaction.storage import ObjectStore, StoreSpec
from tests.integration.conftest import (
    BUCKET,
    FAKE_AWS_ENV,
    FAST_RETRY,
    REGION,
    TEST_PART_SIZE,
    fake_aws_env,
    moto_endpoint,
)
from tests.scenario_log import ScenarioLog, tier
from tests.spark import test_compact as core
from tests.spark.test_compact import DAY, NOW, all_records, latest_per_key, tiered

# The core end-to-end tests, collected here a second time: they take their stores from `new_store`, which this
# module overrides with S3 (a moto server on 127.0.0.1).
test_s3_end_to_end = core.test_compaction_keeps_latest_per_key_and_writes_real_segments
test_s3_rerun_changes_nothing = core.test_rerun_with_nothing_new_changes_nothing
test_s3_tombstones_go_after_their_horizon = core.test_tombstones_go_after_their_delete_horizon
test_s3_timestamp_and_header_strategies = core.test_timestamp_and_header_strategies_keep_the_strategy_winner
test_s3_corrupt_segment_quarantines_its_partition = core.test_corrupt_segment_quarantines_only_its_partition
test_s3_uncleanable_section_is_left_untouched = core.test_uncleanable_section_is_left_untouched
test_s3_incremental_rounds = core.test_incremental_rounds_over_cleaned_and_dirty_sections

__all__ = ["fake_aws_env", "moto_endpoint", "tiered"]

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module", autouse=True)
def workers_see_fake_credentials(spark: SparkSession) -> Iterator[None]:
    """Fake AWS credentials in the environment of the Spark Python workers started from now on."""
    env = spark.sparkContext.environment
    saved = {k: env.get(k) for k in FAKE_AWS_ENV}
    env.update(FAKE_AWS_ENV)
    yield
    for k, v in saved.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v


def s3_store(endpoint: str) -> ObjectStore:
    return StoreSpec.parse(f"s3://{BUCKET}/e2e-{uuid.uuid4().hex[:12]}", endpoint_url=endpoint, region=REGION,
                           retry=FAST_RETRY, part_size=TEST_PART_SIZE).open()


@pytest.fixture
def new_store(moto_endpoint: str, fake_aws_env: None) -> Callable[[], ObjectStore]:
    """`test_compact.new_store`, on S3: each call a fresh prefix in the moto bucket."""
    return lambda: s3_store(moto_endpoint)


@pytest.mark.spark
def test_s3_round_keeps_segments_unread_and_reports_its_requests(
    spark: SparkSession, tmp_path: Path, moto_endpoint: str, fake_aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also the rescan path: the clean segment holding the changed key is scanned on Spark after the filter
    test, cached, and its keys join the winners; on S3 too each object is fetched once."""
    store = s3_store(moto_endpoint)
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
    report = run_report(staged, commit(staged))
    assert latest_per_key(store, "s3keep", 0) == before
    below = table_in_store(store).partition_snapshot("s3keep", 0).lineage.current
    keys = [k for k, (offset, _v) in latest_per_key(store, "s3keep", 0).items() if offset < below]
    held = [r.key for r in all_records(store, "s3keep", 0) if r.key is not None and r.offset < below]
    assert sorted(held) == sorted(keys), "below the checkpoint each key is held once"
    [part] = report["partitions"]
    assert part["committed"] and part["segments_skipped"] > 0 and part["bytes_not_downloaded"] > 0
    assert part["fetch_ratio"] <= 1.05 and part["stats"]["cache_hits"] == part["stats"]["segments_scanned"]
    [sp] = staged.partitions
    uploaded = sum(store.size(o.key) for n in sp.new_segments for o in n.object_keys)
    requests = part["requests"]
    assert requests["puts"] >= sum(len(n.object_keys) for n in sp.new_segments)
    assert uploaded <= requests["bytes_written"] <= uploaded + 100  # + the conditional-PUT probes' bytes
    assert requests["gets"] > 0 and requests["bytes_read"] > 0
    assert report["requests"] == requests
