"""A stock Kafka broker tiers into an s3:// store (a moto server on 127.0.0.1) through kcompact's plugin, and
kcompact's own commands work on what it wrote.

`rsm.config.kcompact.store=s3://bucket/prefix`: the broker's RemoteStorageManager copies each rolled segment's files
through kcompact's store in Python (`compaction.remote_storage`) and reads them back by ranges; the
RemoteLogMetadataManager keeps the rows in the metadata table on the same S3 prefix. One broker serves the module
(CI time). The fixture produces until the broker has tiered several segments and deleted them locally; the tests
then check, in file order: the objects are kcompact's layout and `kcompact segments` lists the broker's segments; a
consumer reads the tier back from offset 0; a compaction killed between its uploads and its commit, while the broker
keeps tiering, changes nothing the broker serves; the rerun (`compaction.compact`, what `kcompact compact` runs, in
this session's Spark: a second Spark JVM for the CLI cost ~30 s more here) commits and a consumer gets the compacted
view; `kcompact gc` clears what the killed run left.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

import compaction
from compaction.metadata import SegmentState, referenced_object_keys, table_in_store
from compaction.storage import StoreSpec
from compaction.storage.layout import Suffix, parse_segment_object_key
from tests.faults import SimulatedCrash
from tests.kafka.tiered import (
    TOPIC,
    Tier,
    Writer,
    create_tiered_topic,
    local_log_start,
    plugin_overrides,
    read_all,
    tier_settled,
    wait_for,
)
from tests.kafka_runtime import KafkaBroker
from tests.moto_s3 import BUCKET, FAKE_AWS_ENV, REGION, UNSET_AWS_ENV

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

run_commit = importlib.import_module("compaction.run.commit")

pytestmark = pytest.mark.s3
FOLLOW_S = 2.0  # the metadata manager follows the table every kcompact.metadata.follow.ms (1 s), and a margin
CONFIG = f"topics:\n  {TOPIC}:\n    cleanup.policy: compact\n    min.cleanable.dirty.ratio: 0.01\n"


@dataclass
class S3Tier(Tier):
    """The module's broker on S3, and kcompact's config for the topic."""

    config: str = ""


@pytest.fixture(scope="module")
def s3_tier(kafka_runtime: str, tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str,
            spark: SparkSession) -> Iterator[S3Tier]:
    """The broker (and its Python processes, and Spark's workers) see fake credentials only; every test of the
    module shares it."""
    workdir = tmp_path_factory.mktemp("tiered-s3")
    executor_env = spark.sparkContext.environment
    saved = {k: executor_env.get(k) for k in FAKE_AWS_ENV}
    with pytest.MonkeyPatch.context() as env:
        for name, value in FAKE_AWS_ENV.items():
            env.setenv(name, value)
        for name in UNSET_AWS_ENV:
            env.delenv(name, raising=False)
        executor_env.update(FAKE_AWS_ENV)
        store = StoreSpec.parse(f"s3://{BUCKET}/broker-{uuid.uuid4().hex[:12]}", endpoint_url=moto_endpoint,
                                region=REGION).open()
        broker = KafkaBroker(workdir / "kafka", jars=["tiered-plugin"], overrides=plugin_overrides(store))
        broker.start()
        tier = S3Tier(broker, store, [], config=str(workdir / "kcompact.yaml"))
        try:
            create_tiered_topic(broker)
            tier.writer = Writer(tier)
            wait_for("the broker tiered 3 segments to S3 and deleted them locally",
                     lambda: local_log_start(broker) > 0 and len(tier.live()) >= 3, broker, step=tier.writer.round)
            (workdir / "kcompact.yaml").write_text(CONFIG)
            yield tier
        finally:
            tier.writer = None  # its producers go before the broker does
            broker.stop()
            for k, v in saved.items():
                if v is None:
                    executor_env.pop(k, None)
                else:
                    executor_env[k] = v


def test_the_broker_writes_kcompacts_layout_and_kcompact_lists_its_segments(s3_tier: S3Tier) -> None:
    live = s3_tier.live()
    assert {o.key for s in live for o in s.object_keys} <= {o.key for o in s3_tier.store.list()}
    for s in live:
        assert all(_is_segment_key(o.key) for o in s.object_keys), s.object_keys
        assert s.writer == "broker-1"
    listed = s3_tier.cli("segments", "--topic", TOPIC, "--partition", "0").stdout
    assert all(s3_tier.store.object_uri(s.object_key(Suffix.LOG) or "") in listed for s in live), listed


def test_a_consumer_reads_the_tier_back_from_offset_0(s3_tier: S3Tier) -> None:
    assert read_all(s3_tier.broker, len(s3_tier.uncompacted())) == s3_tier.uncompacted()


def test_a_compaction_killed_before_its_commit_changes_nothing_the_broker_serves(s3_tier: S3Tier,
                                                                                spark: SparkSession) -> None:
    """The run uploads its segments and dies before committing, while a producer keeps the broker tiering: the
    broker's rows and reads are as if the run never happened, and its uploads are orphans (no row names them)."""
    writer = s3_tier.writer
    assert writer is not None
    live_before = s3_tier.live()
    stop = threading.Event()

    def keep_producing() -> None:  # a few rolls' worth: on S3 the broker tiers a segment in ~1 s
        for _ in range(10):
            if stop.is_set():
                return
            writer.updates(20)
            time.sleep(0.5)

    def died(*args: Any, **kwargs: Any) -> Any:
        raise SimulatedCrash("compaction died after its uploads, before its commit")

    producing = threading.Thread(target=keep_producing, name="producer")
    producing.start()
    try:
        with pytest.MonkeyPatch.context() as patch, pytest.raises(SimulatedCrash):
            patch.setattr(run_commit, "commit_change_sets", died)
            compaction.compact(spark, s3_tier.store, s3_tier.config)
    finally:
        stop.set()
        producing.join(60)
    wait_for("the broker tiered everything and its active segment is empty", lambda: tier_settled(s3_tier),
             s3_tier.broker)
    live = s3_tier.live()
    assert live[: len(live_before)] == live_before and len(live) > len(live_before)
    assert all(s.writer == "broker-1" for s in live)
    assert s3_tier.partition().lineage.current == 0, "nothing compacted"
    assert _orphans(s3_tier), "the killed run uploaded nothing"
    assert read_all(s3_tier.broker, len(s3_tier.uncompacted())) == s3_tier.uncompacted()


def test_the_rerun_commits_and_a_consumer_gets_the_compacted_view(s3_tier: S3Tier, spark: SparkSession) -> None:
    report = compaction.compact(spark, s3_tier.store, s3_tier.config).to_dict()
    assert [p["committed"] for p in report["partitions"]] == [True], json.dumps(report, default=str)[:3000]
    s3_tier.cleaned = s3_tier.partition().lineage.current
    assert s3_tier.cleaned > 0
    expected = s3_tier.view(committed=True)
    assert len(expected) < len(s3_tier.uncompacted())
    time.sleep(FOLLOW_S)  # the broker serves the swap once its follower has read the commit
    assert read_all(s3_tier.broker, len(expected)) == expected


def test_kcompact_gc_clears_what_the_killed_run_left(s3_tier: S3Tier) -> None:
    orphans = _orphans(s3_tier)
    before = s3_tier.partition()
    replaced = [s for s in before.segments if s.state is SegmentState.DELETE_SEGMENT_STARTED]
    abandoned = [s for s in before.segments if s.state is SegmentState.COPY_SEGMENT_STARTED]
    assert orphans and replaced
    gc = s3_tier.cli("gc", "--grace-ms", "0", "--orphan-grace-ms", "0", "--json")
    totals = json.loads(gc.stdout)["totals"]
    rows = "\n".join(f"{s.segment_id} {s.state.name} {s.start_offset}-{s.end_offset} {s.writer}"
                     for s in before.segments)
    assert (totals["segments_finished"], totals["segments_retired"]) == (len(replaced) + len(abandoned),
                                                                         len(abandoned)), f"{gc.stdout}\n{rows}"
    after = s3_tier.partition().segments
    assert not [s for s in after if s.state in (SegmentState.DELETE_SEGMENT_STARTED,
                                                 SegmentState.COPY_SEGMENT_STARTED)], after
    assert _orphans(s3_tier) == set()
    assert not any(s3_tier.store.exists(k) for k in orphans)
    expected = s3_tier.view(committed=True)
    assert read_all(s3_tier.broker, len(expected)) == expected


def _is_segment_key(key: str) -> bool:
    try:
        parse_segment_object_key(key)
    except ValueError:
        return False
    return True


def _orphans(tier: S3Tier) -> set[str]:
    """Segment objects in the store that no row of the table names."""
    listed = {o.key for o in tier.store.list() if _is_segment_key(o.key)}
    return listed - referenced_object_keys(table_in_store(tier.store).snapshot())
