"""`compaction.read_partition` on Spark gives what `kcompact read` gives, for both isolation levels, read_committed
stopping at the last stable offset."""

from __future__ import annotations

from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from compaction import read_partition
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import table_in_store
from compaction.reader import Isolation, consumer_records, last_stable_offset, log_refs, segment_ref
from compaction.storage import open_store
from compaction.tier import tier_logdir
from tests.scenario_log import consumed, open_transactions_mid_log


@pytest.mark.spark
@pytest.mark.parametrize("isolation", list(Isolation))
def test_read_partition_matches_the_cli_reader(spark: SparkSession, tmp_path: Path, isolation: Isolation) -> None:
    spec = WorkloadSpec(topics=(TopicSpec("orders", 1),), records_per_partition=2000, keys=150,
                        segment_bytes=48 * 1024, seed=3)
    generate_logdir(tmp_path / "logs", spec)
    store = open_store(str(tmp_path / "store"))
    tier_logdir(tmp_path / "logs", store, table_in_store(store, create=True), 1_800_000_000_000)
    refs = [segment_ref(s) for s in table_in_store(store).live_segments("orders", 0)]
    expected = [(r.offset, r.timestamp, r.key, r.value, [(h.key, h.value) for h in r.headers])
                for r in consumer_records(store, refs, isolation=isolation, from_offset=100)]
    df = read_partition(spark, store, "orders", 0, isolation=isolation.value, from_offset=100)
    assert df.columns == ["offset", "timestamp", "key", "value", "headers"]
    assert_df_equality(df, spark.createDataFrame(expected, df.schema))  # same rows, in offset order
    assert len(expected) > 1000


@pytest.mark.spark
def test_read_partition_stops_at_the_last_stable_offset_as_the_cli_reader_does(spark: SparkSession,
                                                                                tmp_path: Path) -> None:
    """A transaction left open mid-log, in the tier (orders-0) and in the WAL tail (orders-1): read_committed stops
    at its first offset, from any offset, as `kcompact read` does; read_uncommitted reads to the log end."""
    store = open_store(str(tmp_path / "store"))
    for log in open_transactions_mid_log(store, tmp_path / "logdir", 1_800_000_000_000):
        refs = log_refs(store, log.topic, log.partition)
        stable = last_stable_offset(store, refs)
        assert stable < log.next_offset - 1
        for isolation in Isolation:
            for from_offset in (0, stable - 1, stable, stable + 2):
                expected = [(r.offset, r.timestamp, r.key, r.value, [(h.key, h.value) for h in r.headers])
                            for r in consumer_records(store, refs, isolation=isolation, from_offset=from_offset)]
                assert [row[0] for row in expected] == [o for o, _v in consumed(log.batches, isolation, from_offset)]
                if from_offset == 0 or (isolation is Isolation.READ_COMMITTED and from_offset >= stable):
                    assert (expected == []) is (from_offset > 0)
                df = read_partition(spark, store, log.topic, log.partition, isolation=isolation.value,
                                    from_offset=from_offset)
                assert_df_equality(df, spark.createDataFrame(expected, df.schema))
