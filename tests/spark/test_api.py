"""The public API: compaction.plan / stage / commit / compact, and a superseded run raising FencedError."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import compaction
from compaction.config import KcompactConfig, TopicConfig
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import table_in_store
from compaction.storage import open_store
from compaction.tier import tier_logdir

NOW = 1_800_000_000_000
CONFIG = KcompactConfig(defaults=TopicConfig.from_kafka({"cleanup.policy": "compact"}))


@pytest.mark.spark
def test_superseded_run_raises_fenced_and_leaves_nothing_live(spark: SparkSession, tmp_path: Path) -> None:
    generate_logdir(tmp_path / "logs", WorkloadSpec(topics=(TopicSpec("t", 1),), records_per_partition=2000,
                                                    keys=100, segment_bytes=32 * 1024, seed=4))
    store = open_store(str(tmp_path / "store"))
    tier_logdir(tmp_path / "logs", store, table_in_store(store, create=True), NOW)
    zombie = compaction.stage(spark, compaction.plan(spark, store, CONFIG, NOW))
    report = compaction.compact(spark, store, CONFIG, NOW, force=True)
    assert [p.committed for p in report.partitions] == [True]
    # its own metadata commits alone (the zombie's fencing commit came before): two data files, two commit files
    assert report.metadata_requests.puts == 4 and report.to_dict()["metadata_requests"]["puts"] == 4
    live_before = table_in_store(store).live_segments("t", 0)
    with pytest.raises(compaction.FencedError, match="expected fencing epoch") as err:
        compaction.commit(zombie)
    assert isinstance(err.value, compaction.RetryableError)
    assert [o.committed for o in err.value.outcomes] == [False]  # type: ignore[attr-defined]
    live_after = table_in_store(store).live_segments("t", 0)
    assert live_after == live_before
    zombie_ids = {s.segment_id for sp in zombie.partitions for s in sp.new_segments}
    assert zombie_ids and not zombie_ids & {s.segment_id for s in live_after}
