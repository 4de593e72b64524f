"""`compaction.read_partition` on Spark gives what `kcompact read` gives, for both isolation levels."""

from __future__ import annotations

from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from compaction import read_partition
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import table_in_store
from compaction.reader import Isolation, consumer_records, segment_ref
from compaction.storage import open_store
from compaction.tier import tier_logdir


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
