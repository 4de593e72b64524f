"""The WAL's pure parts: the log resolved by leader epoch, where an upload starts, packing, roll cuts, gc decisions."""

from __future__ import annotations

import itertools

import pytest

from compaction.errors import FencedError
from compaction.format.batch import Record, build_batch, encode_batch
from compaction.format.checkpoints import EpochEntry
from compaction.format.segment import iter_batch_headers
from compaction.gc.wal import plan_wal_gc
from compaction.metadata import SegmentState
from compaction.wal.log import NO_END, resolve
from compaction.wal.model import WalEntry, WalObject, objects_from_rows, objects_to_arrow
from compaction.wal.roll import RollRules, _Batch, cut
from compaction.wal.upload import _Run, pack, upload_from

TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAQ"


def entry(start: int, end: int, epoch: int = 0, partition: int = 0, pos: int = 0) -> WalEntry:
    return WalEntry("t", TOPIC_ID, partition, start, end, epoch, pos, pos + 100 * (end - start + 1), 0, end - start + 1)


def obj(object_id: str, *entries: WalEntry, created: int = 0, state: SegmentState = SegmentState.COPY_SEGMENT_FINISHED
        ) -> WalObject:
    return WalObject(object_id.ljust(22, "A"), f"wal/{object_id.ljust(22, 'A')}.wal",
                     max((e.end_position for e in entries), default=0), state, 1, "test", created, created, entries)


def pairs(*objects: WalObject) -> list[tuple[WalObject, WalEntry]]:
    return [(o, e) for o in objects for e in o.entries]


def spans(log: object) -> list[tuple[str, int, int]]:
    return [(s.object_id[:2], s.first_offset, s.last_offset) for s in log.slices]  # type: ignore[attr-defined]


def test_contiguous_entries_make_one_log_from_the_lowest_offset() -> None:
    log = resolve("t", 0, None, (), pairs(obj("b1", entry(10, 19)), obj("a1", entry(0, 9))))
    assert spans(log) == [("a1", 0, 9), ("b1", 10, 19)]
    assert log.end_offset == 20 and log.latest_epoch == 0


def test_the_log_starts_at_the_tier_end_and_skips_what_the_tier_covers() -> None:
    log = resolve("t", 0, 15, [EpochEntry(0, 0)], pairs(obj("a1", entry(0, 9)), obj("b1", entry(10, 19))))
    assert spans(log) == [("b1", 15, 19)]
    assert resolve("t", 0, 20, [EpochEntry(0, 0)], pairs(obj("a1", entry(0, 19)))).slices == ()


def test_a_gap_ends_the_log() -> None:
    log = resolve("t", 0, None, (), pairs(obj("a1", entry(0, 9)), obj("b1", entry(20, 29))))
    assert spans(log) == [("a1", 0, 9)] and log.end_offset == 10


def test_copies_of_the_same_epoch_are_read_once_the_longest_first() -> None:
    log = resolve("t", 0, None, (), pairs(obj("a1", entry(0, 9)), obj("a2", entry(0, 14), created=5),
                                          obj("a3", entry(10, 29), created=9)))
    assert spans(log) == [("a2", 0, 14), ("a3", 15, 29)]


def test_a_newer_epoch_truncates_what_an_older_leader_wrote_at_or_above_its_start() -> None:
    old = obj("a1", entry(0, 149, epoch=5))
    new = obj("b1", entry(120, 199, epoch=6))
    log = resolve("t", 0, None, (), pairs(old, new))
    assert spans(log) == [("a1", 0, 119), ("b1", 120, 199)]
    assert log.valid_end(5) == 120 and log.valid_end(6) == NO_END
    # An older leader's later upload (epoch 5 above 120) is never part of the log, whatever its arrival order.
    late = obj("c1", entry(150, 179, epoch=5), created=99)
    assert spans(resolve("t", 0, None, (), pairs(old, new, late))) == spans(log)


def test_a_newer_epoch_below_the_tier_end_is_used_from_the_tier_end() -> None:
    log = resolve("t", 0, 130, [EpochEntry(5, 0)], pairs(obj("b1", entry(120, 199, epoch=6))))
    assert spans(log) == [("b1", 130, 199)]


def test_epoch_end_answers_offsets_for_leader_epoch() -> None:
    log = resolve("t", 0, None, (), pairs(obj("a1", entry(0, 99, epoch=2)), obj("b1", entry(100, 149, epoch=4))))
    assert log.epoch_end(2) == 100 and log.epoch_end(3) == 100 and log.epoch_end(4) == 150
    assert log.epoch_end(1) is None


def test_upload_from_an_empty_store_starts_at_the_log_dir_start() -> None:
    empty = resolve("t", 0, None, (), ())
    assert upload_from(empty, [EpochEntry(0, 0)], 0, 50) == 0


def test_a_rerun_of_the_same_leader_continues_at_the_store_end() -> None:
    log = resolve("t", 0, None, (), pairs(obj("a1", entry(0, 149, epoch=5))))
    assert upload_from(log, [EpochEntry(5, 0)], 0, 200) == 150


def test_a_diverged_new_leader_uploads_from_the_divergence_point() -> None:
    log = resolve("t", 0, None, (), pairs(obj("a1", entry(0, 149, epoch=5))))
    assert upload_from(log, [EpochEntry(5, 0), EpochEntry(6, 120)], 0, 200) == 120
    # ... never below the tier, which is committed data
    tiered = resolve("t", 0, 130, [EpochEntry(5, 0)], pairs(obj("a1", entry(130, 149, epoch=5))))
    assert upload_from(tiered, [EpochEntry(5, 0), EpochEntry(6, 120)], 0, 200) == 130


def test_a_deposed_leader_is_fenced() -> None:
    log = resolve("t", 0, None, (), pairs(obj("a1", entry(0, 119, epoch=5)), obj("b1", entry(120, 199, epoch=6))))
    with pytest.raises(FencedError, match="deposed leader"):
        upload_from(log, [EpochEntry(5, 0)], 0, 180)


def _headers(n: int, size_records: int, epoch: int = 0, ts0: int = 1000, ts_step: int = 10) -> tuple[bytes, list]:
    records = [Record(i, ts0 + i * ts_step, b"k%d" % i, b"v" * size_records) for i in range(n)]
    data = b"".join(encode_batch(build_batch([r], partition_leader_epoch=epoch)) for r in records)
    return data, list(iter_batch_headers(data))


def test_pack_fills_objects_up_to_the_limit_at_batch_boundaries() -> None:
    data, hs = _headers(10, 50)
    size = hs[0].size
    runs = [_Run("t", TOPIC_ID, p, 0, memoryview(data), tuple(hs)) for p in range(3)]
    objects = list(pack(runs, 4 * size))
    assert [sum(e.size for e in entries) for entries, _ in objects] == [4 * size] * 7 + [2 * size]
    for entries, parts in objects:
        assert sum(len(p) for p in parts) == sum(e.size for e in entries)
        assert entries[0].start_position == 0
        assert all(a.end_position == b.start_position for a, b in itertools.pairwise(entries))
    second = objects[2][0]  # holds the end of partition 0 and the start of partition 1
    assert [(e.partition, e.start_offset, e.end_offset) for e in second] == [(0, 8, 9), (1, 0, 1)]


def test_a_batch_larger_than_the_limit_gets_an_object_of_its_own() -> None:
    data, hs = _headers(3, 50)
    objects = list(pack([_Run("t", TOPIC_ID, 0, 0, memoryview(data), tuple(hs))], hs[0].size - 1))
    offsets = [[(e.start_offset, e.end_offset) for e in entries] for entries, _ in objects]
    assert offsets == [[(0, 0)], [(1, 1)], [(2, 2)]]


def _batches(n: int, **kw: int) -> list[_Batch]:
    data, hs = _headers(n, 50, **kw)
    return [_Batch(h, memoryview(data)[h.position : h.position + h.size], "x") for h in hs]


def test_cut_rolls_before_a_batch_that_would_pass_segment_bytes() -> None:
    bs = _batches(10)
    rules = RollRules(segment_bytes=3 * bs[0].header.size, max_segment_ms=10**9, index_interval_bytes=4096)
    rolled, tail = cut(bs, rules, now_ms=0)
    assert [len(s) for s in rolled] == [3, 3, 3] and len(tail) == 1


def test_cut_rolls_when_a_batch_is_more_than_segment_ms_newer_than_the_first() -> None:
    bs = _batches(10, ts_step=10)  # max timestamps 1000, 1010, ...
    rules = RollRules(segment_bytes=10**9, max_segment_ms=25, index_interval_bytes=4096)
    rolled, tail = cut(bs, rules, now_ms=1095)
    assert [len(s) for s in rolled] == [3, 3, 3]  # 1030 - 1000 = 30 > 25 starts the second segment
    assert len(tail) == 1  # first batch at 1090: 1095 - 1090 = 5, not older than 25 at --now
    rolled, tail = cut(bs, rules, now_ms=1116)
    assert [len(s) for s in rolled] == [3, 3, 3, 1] and tail == []


def test_a_full_open_segment_rolls_an_idle_one_stays() -> None:
    bs = _batches(4)
    full = RollRules(segment_bytes=4 * bs[0].header.size, max_segment_ms=10**9, index_interval_bytes=4096)
    assert [len(s) for s in cut(bs, full, 0)[0]] == [4]
    roomy = RollRules(segment_bytes=10**9, max_segment_ms=10**9, index_interval_bytes=4096)
    assert cut(bs, roomy, 0) == ([], bs)


def test_rules_use_max_compaction_lag_for_compacted_topics() -> None:
    from compaction.config import CleanupPolicy, TopicConfig

    compacted = TopicConfig(cleanup_policy=frozenset({CleanupPolicy.COMPACT}), max_compaction_lag_ms=5000)
    assert RollRules.of(compacted).max_segment_ms == 5000
    assert RollRules.of(TopicConfig(max_compaction_lag_ms=5000)).max_segment_ms == 604_800_000


def test_wal_rows_round_trip() -> None:
    o = obj("a1", entry(0, 9, partition=0), entry(0, 4, partition=1, pos=1000))
    assert objects_from_rows(objects_to_arrow([o]).to_pylist()) == [o]


# --- gc decisions -------------------------------------------------------------------------------------

GRACE = 60_000


def _plan(objects: list[WalObject], now: int, tier_end: int | None = None, tier_ts: int = 0) -> dict[str, str]:
    from compaction.metadata.model import ObjectKey, ObjectSuffix, SegmentMetadata
    from compaction.metadata.snapshot import build_snapshot

    segments = []
    if tier_end is not None:
        segments.append(SegmentMetadata("SEGMENTAAAAAAAAAAAAAAQ", "t", TOPIC_ID, 0, 0, tier_end - 1, 0, tier_ts,
                                        (EpochEntry(0, 0),), 1, SegmentState.COPY_SEGMENT_FINISHED, (),
                                        (ObjectKey(ObjectSuffix.LOG, "k"),), "w", 0))
    snapshot = build_snapshot(1, [], segments)
    plan = plan_wal_gc(objects, snapshot, now, lambda _t: GRACE)
    out = {d.object_id[:2]: d.reason for d in plan.deletions}
    out["waiting"] = str(plan.waiting)
    out["needed"] = str(plan.needed)
    return out


def test_gc_keeps_what_the_log_uses_and_deletes_what_the_tier_covers_after_the_grace() -> None:
    a, b = obj("a1", entry(0, 9), created=100), obj("b1", entry(10, 19), created=200)
    assert _plan([a, b], now=10**9) == {"waiting": "0", "needed": "2"}
    # The tier covers a1 since its segment became live at 5000: deleted a grace after that, not after a1's upload.
    assert _plan([a, b], now=5000 + GRACE - 1, tier_end=10, tier_ts=5000) == {"waiting": "1", "needed": "1"}
    assert _plan([a, b], now=5000 + GRACE, tier_end=10, tier_ts=5000) == {"a1": "not_needed", "waiting": "0",
                                                                           "needed": "1"}


def test_gc_deletes_a_truncated_object_a_grace_after_the_newer_epoch_arrived() -> None:
    old = obj("a1", entry(0, 149, epoch=5), created=100)
    stale = obj("c1", entry(150, 179, epoch=5), created=150)
    new = obj("b1", entry(120, 199, epoch=6), created=7000)
    assert _plan([old, stale, new], now=7000 + GRACE) == {"c1": "not_needed", "waiting": "0", "needed": "2"}
    assert _plan([old, stale, new], now=7000 + GRACE - 1) == {"waiting": "1", "needed": "2"}


def test_gc_never_deletes_an_entry_beyond_a_gap() -> None:
    assert _plan([obj("a1", entry(0, 9)), obj("b1", entry(20, 29))], now=10**12) == {"waiting": "0", "needed": "2"}


def test_gc_retires_abandoned_uploads_after_the_grace_and_finishes_started_deletions() -> None:
    started = obj("a1", entry(0, 9), created=100, state=SegmentState.COPY_SEGMENT_STARTED)
    deleting = obj("b1", entry(0, 9), created=100, state=SegmentState.DELETE_SEGMENT_STARTED)
    assert _plan([started, deleting], now=100 + GRACE - 1) == {"b1": "delete_started", "waiting": "0", "needed": "0"}
    assert _plan([started], now=100 + GRACE) == {"a1": "abandoned", "waiting": "0", "needed": "0"}
