"""Every planned byte fetched once, skipping that works with no option tuned, and one partition on several tasks.

- A first compaction (nothing clean yet) over N segments issues one GET per segment: the rewrite takes what the
  scan fetched from the run's segment cache, and the two companions each output copies (producer snapshot, epoch
  checkpoint) are hard links on the local store. `fetch_ratio` (fetched / needed) is 1.
- After a 1% update of a contiguous key range, a round with only `cleanup.policy` and the ratio set (filters
  sized from the data) fetches at most: the dirty bytes + the clean segments that really hold a changed key
  + 2% of the clean region.
- One partition with several output chunks is rewritten by as many Spark tasks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction.config import KcompactConfig, TopicConfig
from compaction.format.scan import scan_segment
from compaction.metadata import ObjectSuffix, SegmentMetadata, table_in_store
from compaction.run.commit import commit
from compaction.run.plan import plan
from compaction.run.report import run_report
from compaction.run.stage import stage
from compaction.storage import ObjectStore, open_store
from tests.scenario_log import ScenarioLog, tier

NOW = 1_800_000_000_000
DAY = 86_400_000
KEYS, VALUE, SEGMENT = 3000, 300, 32 * 1024


def config() -> KcompactConfig:
    return KcompactConfig(defaults=TopicConfig.from_kafka({
        "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.001", "segment.bytes": str(SEGMENT)}))


def value(key: int, round_: int) -> bytes:
    return (b"%d:%d:" % (key, round_)).ljust(VALUE, b"v")


def compact(spark: SparkSession, store: ObjectStore, now: int) -> dict:
    staged = stage(spark, plan(store, config(), now))
    return run_report(staged, commit(staged)).to_dict()


@dataclass
class Rounds:
    store: ObjectStore
    first: dict  # the first compaction's report: everything dirty
    second: dict  # after a 1% update of a contiguous key range
    clean: list[SegmentMetadata]  # the clean region the second round starts from
    dirty: list[SegmentMetadata]  # the segments the update tiered
    changed: set[bytes]


@pytest.fixture(scope="module")
def rounds(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rounds]:
    root = tmp_path_factory.mktemp("fetch-once")
    store = open_store(str(root / "store"))
    log = ScenarioLog("users", NOW - 3 * DAY, segment_bytes=SEGMENT)
    for start in range(0, KEYS, 30):  # keys in order: a segment holds a contiguous key range, as a bulk load does
        log.append([(k, value(k, 0)) for k in range(start, start + 30)])
    log.roll()
    tier([log], root / "logs", store, NOW - 2 * DAY)
    first = compact(spark, store, NOW - DAY)
    clean = list(table_in_store(store).live_segments("users", 0))
    changed = range(1200, 1200 + KEYS // 100)  # 1% of the keys, one contiguous range
    for k in changed:
        log.append([(k, value(k, 1))])
    log.roll()
    tier([log], root / "logs", store, NOW - DAY // 2)
    ids = {s.segment_id for s in clean}
    dirty = [s for s in table_in_store(store).live_segments("users", 0) if s.segment_id not in ids]
    second = compact(spark, store, NOW)
    yield Rounds(store, first, second, clean, dirty, {str(k).encode() for k in changed})


@pytest.mark.spark
def test_a_first_compaction_fetches_each_segment_once(rounds: Rounds) -> None:
    part = rounds.first["partitions"][0]
    s = part["stats"]
    assert s["segments_scanned"] == part["segments_replaced"] > 1
    assert s["cache_hits"] == s["segments_scanned"], "the rewrite fetched again what the scan had fetched"
    # each output carries its last input's producer snapshot and leader-epoch checkpoint into its own .indexes
    # object: one read of that input's .indexes object (its header and both parts, first in PART_ORDER), no more
    assert part["requests"]["gets"] == s["segments_scanned"] + part["segments_written"]
    assert part["requests"]["puts"] == 2 * part["segments_written"]  # its log; indexes, snapshot, checkpoint, filter
    assert 1.0 <= part["fetch_ratio"] <= 1.05 and rounds.first["fetch_ratio"] == part["fetch_ratio"]


@pytest.mark.spark
def test_a_one_percent_clustered_update_fetches_within_the_bound_at_the_defaults(rounds: Rounds) -> None:
    part = rounds.second["partitions"][0]
    dirty_bytes = sum(s.segment_size_bytes for s in rounds.dirty)
    clean_region = sum(s.segment_size_bytes for s in rounds.clean)
    holding = [s for s in rounds.clean if _keys(rounds.store, s) & rounds.changed]
    # small clean segments rewritten only to merge with a rewritten neighbour (kept on purpose: without it every
    # round would leave one more small segment); at most one per side of each rewritten run, each < segment.bytes/2
    merged = part["stats"]["clean_bytes_rewritten"] - sum(s.segment_size_bytes for s in holding)
    assert part["stats"]["segments_merged"] <= 2 and 0 <= merged <= part["stats"]["segments_merged"] * SEGMENT / 2
    bound = dirty_bytes + sum(s.segment_size_bytes for s in holding) + 0.02 * clean_region
    assert 0 < len(holding) < len(rounds.clean) / 4 and part["segments_skipped"] > 0
    assert part["requests"]["bytes_read"] <= bound + merged, (part["requests"], dirty_bytes, holding, clean_region)
    assert part["stats"]["filter_bytes_read"] <= 0.015 * clean_region  # filters sized from the data: ~1%
    assert part["fetch_ratio"] <= 1.05


def _keys(store: ObjectStore, seg: SegmentMetadata) -> set[bytes]:
    records = scan_segment(store.get(seg.object_key(ObjectSuffix.LOG) or "")).records
    return {k for k in records["key"].to_pylist() if k is not None}


@pytest.mark.spark
def test_one_partition_is_rewritten_by_more_than_one_task(rounds: Rounds) -> None:
    first = rounds.first
    s = first["partitions"][0]["stats"]
    assert s["chunks"] == first["partitions"][0]["segments_written"] > 1
    # its small chunks packed by bytes (`compaction.packing`): a few tasks a core, each running several chunks
    assert 2 <= s["rewrite_tasks"] < s["chunks"]


def test_the_api_takes_what_a_user_types_and_refuses_the_rest(tmp_path: Path) -> None:
    import compaction

    conf = tmp_path / "kcompact.yaml"
    conf.write_text("defaults:\n  cleanup.policy: compact\n")
    table_in_store(open_store(str(tmp_path / "store")), create=True)
    run = compaction.plan(None, str(tmp_path / "store"), str(conf), NOW)
    assert run.plan.partitions == () and run.now_ms == NOW
    with pytest.raises(TypeError, match="store: expected a store URI or path"):
        compaction.plan(None, 42, str(conf))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config: expected a config file path"):
        compaction.plan(None, str(tmp_path / "store"), {"cleanup.policy": "compact"})  # type: ignore[arg-type]
