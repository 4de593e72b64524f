"""The table run's planner as a small table of cases: update from the applied offset, or rebuild, and why."""

from __future__ import annotations

import pytest

from compaction.config import CompactionStrategy
from compaction.topic_table.plan import PartitionSource, Reason, plan_partition, plan_table
from compaction.topic_table.target import Applied, Location
from tests.factories import segment

RETENTION = 1000
T = 1_000_000


# Offsets 0-99 compacted (cleaner offset 100) at `compacted_ms`, 100-199 tiered at T.
def source(compacted_ms: int = T, first: int = 0, stable: int = 200) -> PartitionSource:
    compacted = segment(first, 99, segment_id=f"s{first}", topic_id="id", event_ts=compacted_ms, object_keys=())
    tiered = segment(100, 199, segment_id="s100", topic_id="id", event_ts=T, object_keys=())
    return PartitionSource(0, [compacted, tiered], 100, stable)


@pytest.mark.parametrize(
    ("src", "applied", "rebuild", "expected"),
    [
        (source(), None, False, (Reason.NEW, 0, 200)),
        (source(), Applied(150, T), False, (Reason.UPDATE, 150, 200)),
        (source(), Applied(150, T), True, (Reason.REQUESTED, 0, 200)),
        (source(), Applied(200, T), False, None),  # up to date
        (source(stable=120), Applied(120, T), False, None),  # an open transaction holds the LSO
        (source(first=60), Applied(50, T), False, (Reason.LOG_START, 0, 200)),
        # compacted past the applied offset before the horizon: an update
        (source(compacted_ms=T + RETENTION - 1), Applied(50, T), False, (Reason.UPDATE, 50, 200)),
        # at or after it: a tombstone above the applied offset may be gone
        (source(compacted_ms=T + RETENTION), Applied(50, T), False, (Reason.TOMBSTONE_HORIZON, 0, 200)),
        # ... but not when the compaction stayed below the applied offset
        (source(compacted_ms=T + RETENTION), Applied(100, T), False, (Reason.UPDATE, 100, 200)),
        # retention moved the log start up since the table applied [0, 200): the expired keys must go
        (source(first=60), Applied(200, T, log_start=0), False, (Reason.RETENTION, 0, 200)),
        (source(first=60), Applied(200, T, log_start=60), False, None),
        (source(first=60), Applied(200, T), False, None),  # a table that never recorded its log start
    ],
)
def test_what_a_partition_applies(src: PartitionSource, applied: Applied | None, rebuild: bool,
                                  expected: tuple[Reason, int, int] | None) -> None:
    span = plan_partition(src, applied, CompactionStrategy.OFFSET, RETENTION, rebuild)
    assert (None if span is None else (span.reason, span.from_offset, span.to_offset)) == expected
    assert span is None or span.log_start == src.segments[0].start_offset


def test_timestamp_and_header_updates_read_from_the_start() -> None:
    for strategy, read_from in [(CompactionStrategy.OFFSET, 150), (CompactionStrategy.TIMESTAMP, 0),
                                (CompactionStrategy.HEADER, 0)]:
        span = plan_partition(source(), Applied(150, T), strategy, RETENTION, False)
        assert span is not None and (span.from_offset, span.read_from) == (150, read_from)


def test_the_plan_renders_every_partition() -> None:
    plan = plan_table("t", 7, 3, T, [source()], {0: Applied(150, T)}, CompactionStrategy.OFFSET, RETENTION)
    assert plan.to_dict()["spans"][0]["from_offset"] == 150
    assert "t-0: update [150, 200)" in "\n".join(plan.render_text())


@pytest.mark.parametrize(("uri", "store", "name"), [
    ("/data/tables/orders", "file:///data/tables", "orders"),
    ("s3://bucket/tables/orders/", "s3://bucket/tables", "orders"),
    ("s3://bucket/orders", "s3://bucket", "orders"),
])
def test_where_a_table_lives(uri: str, store: str, name: str) -> None:
    location = Location.parse(uri)
    assert (location.spec.uri, location.name) == (store, name)
