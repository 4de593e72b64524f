"""Retention of compact,delete topics (`compaction.retention.plan`): which prefix of the live segments expires.

Kafka's own `UnifiedLog.deleteOldSegments` judges the same rules on real log dirs in
tests/kafka/test_retention_referee.py; here the explicit cases and the invariants every answer must keep.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction.config import ConfigValueError, KcompactConfig, TopicConfig
from compaction.metadata import SegmentState, broker_writer
from compaction.metadata.snapshot import build_snapshot
from compaction.retention import Breach, RetentionReport, expired_prefix, plan_retention
from tests.factories import segment

HOUR = 3_600_000
NOW = 1_700_000_000_000


def log(*segments: tuple[int, int]) -> list:
    """Consecutive segments of 10 offsets each, from (size, max timestamp) pairs."""
    return [segment(10 * i, 10 * i + 9, size=size, max_ts=ts) for i, (size, ts) in enumerate(segments)]


def config(ms: int = -1, size: int = -1, policy: str = "compact,delete") -> TopicConfig:
    return TopicConfig.from_kafka({"cleanup.policy": policy, "retention.ms": ms, "retention.bytes": size})


def starts(expired: tuple) -> list[int]:
    return [e.start_offset for e in expired]


def test_defaults_are_kafkas() -> None:
    c = TopicConfig()
    assert (c.retention_ms, c.retention_bytes) == (604_800_000, -1)
    assert not c.has_retention and config().has_retention
    assert TopicConfig.from_kafka({"retention.ms": "-1", "retention.bytes": "1073741824"}).retention_bytes == 2**30


@pytest.mark.parametrize("bad", ["-2", "x", True])
def test_retention_ms_is_checked_like_kafka(bad: object) -> None:
    with pytest.raises(ConfigValueError, match=r"retention\.ms"):
        TopicConfig.from_kafka({"retention.ms": bad})


def test_time_expires_the_old_prefix_strictly() -> None:
    segs = log((100, NOW - 3 * HOUR), (100, NOW - 2 * HOUR - 1), (100, NOW - 2 * HOUR), (100, NOW))
    expired = expired_prefix(segs, config(ms=2 * HOUR), NOW)
    assert starts(expired) == [0, 10], "now - max timestamp == retention.ms is kept (Kafka's `>`)"
    assert {e.breach for e in expired} == {Breach.TIME}


def test_the_walk_stops_at_the_first_kept_segment() -> None:
    segs = log((100, NOW - 5 * HOUR), (100, NOW), (100, NOW - 5 * HOUR), (100, NOW))
    assert starts(expired_prefix(segs, config(ms=HOUR), NOW)) == [0]


def test_size_keeps_the_partition_at_or_above_retention_bytes() -> None:
    segs = log((100, NOW), (100, NOW), (100, NOW), (50, NOW))
    assert starts(expired_prefix(segs, config(size=150), NOW)) == [0, 10], "350 - 100 - 100 = 150 >= 150"
    assert starts(expired_prefix(segs, config(size=151), NOW)) == [0]
    assert starts(expired_prefix(segs, config(size=350), NOW)) == []


def test_size_then_time() -> None:
    segs = log((100, NOW), (100, NOW - 5 * HOUR), (100, NOW - 5 * HOUR), (100, NOW))
    expired = expired_prefix(segs, config(ms=HOUR, size=300), NOW)
    assert [(e.start_offset, e.breach) for e in expired] == [(0, Breach.SIZE), (10, Breach.TIME), (20, Breach.TIME)]


def test_the_last_segment_never_expires() -> None:
    segs = log((100, NOW - 9 * HOUR), (100, NOW - 9 * HOUR))
    assert starts(expired_prefix(segs, config(ms=HOUR, size=0), NOW)) == [0]
    assert expired_prefix(segs[:1], config(ms=0, size=0), NOW) == ()


def test_without_timestamps_a_segment_ages_from_when_it_went_live() -> None:
    empty = [segment(0, 9, size=0, max_ts=-1, event_ts=NOW - HOUR), segment(10, 19, max_ts=NOW - 9 * HOUR),
             segment(20, 29, max_ts=NOW)]
    assert starts(expired_prefix(empty, config(ms=HOUR), NOW)) == []
    assert starts(expired_prefix(empty, config(ms=HOUR - 1), NOW)) == [0, 10]


@pytest.mark.parametrize("policy", ["compact", "delete"])
def test_only_compact_delete_topics_expire(policy: str) -> None:
    segs = log((100, 0), (100, 0), (100, 0))
    assert expired_prefix(segs, config(ms=0, size=0, policy=policy), NOW) == ()


def test_plan_covers_the_compact_delete_partitions_in_scope() -> None:
    rows = [*log((100, 0), (100, 0)),
            *(segment(s.start_offset, s.end_offset, topic="other", max_ts=0) for s in log((1, 0), (1, 0))),
            segment(20, 29, max_ts=0, partition=1), segment(30, 39, max_ts=0, partition=1)]
    snap = build_snapshot(5, [], rows)
    kc = KcompactConfig(topics={"t": config(ms=HOUR)})
    plan = plan_retention(snap, kc, NOW)
    assert [(p.topic, p.partition, starts(p.expired), p.log_start_offset) for p in plan.partitions] == [
        ("t", 0, [0], 10), ("t", 1, [20], 30)]
    assert plan.metadata_version == 5
    assert [p.partition for p in plan_retention(snap, kc, NOW, topics=["t"], partition=1).partitions] == [1]
    assert plan_retention(snap, kc, NOW, topics=["other"]).partitions == ()


def test_a_partition_a_broker_tiers_is_held_back_with_a_note() -> None:
    rows = [*log((100, 0), (100, 0)), replace(segment(20, 29, max_ts=0), writer=broker_writer(7))]
    plan = plan_retention(build_snapshot(3, [], rows), KcompactConfig(topics={"t": config(ms=HOUR)}), NOW)
    assert plan.partitions == () and len(plan.notes) == 1
    assert plan.notes[0].startswith("t-0 not expired: broker-7 tiers it") and "on the broker's topic" in plan.notes[0]
    report = RetentionReport.planned(plan)
    assert report.to_dict()["notes"] == list(plan.notes) and "note: t-0 not expired" in report.summary()


def test_replaced_rows_are_not_live_and_not_counted() -> None:
    rows = [segment(0, 9, size=1000, max_ts=0, state=SegmentState.DELETE_SEGMENT_STARTED), *log((100, NOW),
            (100, NOW))]
    p = plan_retention(build_snapshot(1, [], rows), KcompactConfig(topics={"t": config(size=150)}), NOW).partitions[0]
    assert (starts(p.expired), p.retained_bytes) == ([], 200), "200 - 100 < 150: nothing goes"


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(-HOUR, 10 * HOUR)), max_size=12),
       st.integers(-1, 5 * HOUR), st.integers(-1, 3000))
def test_invariants(pairs: list[tuple[int, int]], ms: int, size: int) -> None:
    segs = log(*((b, NOW - age) for b, age in pairs))
    expired = expired_prefix(segs, config(ms, size), NOW)
    n = len(expired)
    assert starts(expired) == [s.start_offset for s in segs[:n]], "a prefix, in order"
    assert n < max(len(segs), 1), "the last segment stays"
    sizes = [e for e in expired if e.breach is Breach.SIZE]
    assert sizes == list(expired[:len(sizes)]), "the size pass comes first"
    if size >= 0 and sizes:
        assert sum(s.segment_size_bytes for s in segs[n:]) + sum(e.size_bytes for e in expired[len(sizes):]) \
            >= size, "the size pass never takes the partition below retention.bytes"
    for e in expired[len(sizes):]:
        assert ms >= 0 and NOW - e.max_timestamp_ms > ms
    if n < len(segs) - 1:
        assert not (ms >= 0 and NOW - segs[n].max_timestamp_ms > ms), "the walk stopped"
