"""Per-segment key filters: the hash, the filter and its stored format, the skip policy, in-task winners,
filters of rewritten segments, bounded chunks and the metadata change that records a lazily built filter.

The compiled paths (numba over Arrow buffers) are checked against the readable ones (`xxhash`, Python ints)
bit for bit; the format against its documented byte offsets; corruption at a named offset must be refused.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import compaction.bloom.filter as filter_module
from compaction.bloom.filter import (
    BITS_OFFSET,
    CRC_OFFSET,
    FLAGS_OFFSET,
    HASH_OFFSET,
    HORIZON_OFFSET,
    K_OFFSET,
    M_OFFSET,
    N_OFFSET,
    VERSION_OFFSET,
    FilterFacts,
    FilterFormatError,
    KeyFilter,
    filter_shape,
    reference_filter,
    reference_may_contain,
)
from compaction.bloom.hashing import key_hashes, reference_hash, row_key_hashes
from compaction.bloom.segment import filter_key, read_filter, segment_facts, segment_filter
from compaction.bloom.skipping import Verdict, merge_small, regroup_around, verdict
from compaction.errors import CorruptInputError, MetadataInvariantError
from compaction.format.batch import Header, Record, build_batch, encode_batch
from compaction.format.control import ControlType, end_txn_marker
from compaction.format.scan import scan_segment
from compaction.metadata import ObjectKey, ObjectSuffix, SegmentMetadata
from compaction.metadata.change_set import AddedObjectKey, ChangeSet, apply_change_set
from compaction.metadata.snapshot import PartitionSnapshot
from compaction.planner.grouping import estimated_index_sizes, group_segments_by_size
from compaction.rewrite import upload
from compaction.rewrite.upload import DiskBudgetError, rewrite_groups, shared_scratch
from compaction.run.report import TARGET_FALSE_READ_RATE, bloom_sizing
from compaction.storage import open_store
from compaction.storage.indexes import get_part
from compaction.storage.layout import Suffix, segment_object_key
from compaction.tasks import GroupTask, InputSegment, PartitionTask, PartitionWork
from tests import factories
from tests.unit.random_batches import control_batches, data_batches

NOW = 1_800_000_000_000
TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"
keys_st = st.lists(st.binary(min_size=0, max_size=80), max_size=300)


def binary(keys: Sequence[bytes | None]) -> pa.Array:
    return pa.array(list(keys), pa.binary())


# --- the hash ------------------------------------------------------------------------------------------


@given(keys_st)
def test_compiled_xxh64_is_the_published_xxh64(keys: list[bytes]) -> None:
    assert key_hashes(binary(keys)).tolist() == [reference_hash(k) for k in keys]


def test_hash_covers_every_tail_length_and_drops_nulls() -> None:
    keys = [bytes(range(n)) for n in range(0, 70)]  # 32-byte stripes, 8/4/1-byte tails
    assert key_hashes(binary([*keys, None])).tolist() == [reference_hash(k) for k in keys]
    assert reference_hash(b"") == 0xEF46DB3751D8E999  # XXH64 of the empty input, seed 0 (xxHash's own test vector)


@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=30))
def test_row_hashes_keep_one_per_row_and_zero_for_a_null_key(keys: list[bytes | None]) -> None:
    """`row_key_hashes` (aligned with a scan's records, `rewrite.facts.RecordBits`): a hash per row, 0 where the key
    is null, and `key_hashes` is it without the nulls."""
    rows = row_key_hashes(pa.array(keys, pa.binary())).tolist()
    assert rows == [0 if k is None else reference_hash(k) for k in keys]
    present = [h for h, k in zip(rows, keys, strict=True) if k is not None]
    assert key_hashes(pa.array(keys, pa.binary())).tolist() == present


# --- the filter ------------------------------------------------------------------------------------------


@given(keys_st, st.sampled_from([0.1, 0.01, 0.0001]))
def test_compiled_filter_has_the_reference_bits_and_no_false_negative(keys: list[bytes], fpp: float) -> None:
    built = KeyFilter.of_keys(binary(keys), fpp)
    reference = reference_filter(keys, fpp)
    assert (built.m, built.k, built.n) == (reference.m, reference.k, reference.n)
    assert built.bits.tobytes() == reference.bits.tobytes()
    assert built.may_contain(key_hashes(binary(keys))).all()
    assert built.positives(key_hashes(binary(keys))) == len(keys)


@given(keys_st, st.sampled_from([0.1, 0.0001, 1e-9]), st.integers(1, 9), st.integers(0, 8))
def test_bucketed_insert_sets_the_reference_bits(keys: list[bytes], fpp: float, batch: int, shift: int) -> None:
    """A large filter's bits are set a region at a time (`_insert_bucketed`: `batch` keys' probes bucketed into
    regions of 2^`shift` bits); they are the reference's, whatever the batch and the regions, duplicates
    included; `KeyFilter.build` takes that path above `BUCKETED_BYTES`."""
    reference = reference_filter(keys, fpp)
    hashes = np.sort(key_hashes(binary(keys + keys[:3])))
    bits = np.zeros(reference.m // 8, np.uint8)
    bucket = max(1, batch * reference.k)
    filter_module._insert_bucketed(bits, reference.m, reference.k, hashes, shift, batch,
                                   np.empty(bucket, np.uint64), np.empty(bucket, np.uint64))
    assert bits.tobytes() == reference.bits.tobytes()


def test_a_filter_above_the_bucketed_size_has_the_reference_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [b"key-%d" % i for i in range(30_000)]
    monkeypatch.setattr(filter_module, "BUCKETED_BYTES", 0)
    monkeypatch.setattr(filter_module, "INSERT_KEYS", 1000)
    monkeypatch.setattr(filter_module, "MIN_REGION_BITS", 1 << 10)
    built = KeyFilter.of_keys(binary(keys), 1e-6)
    assert filter_module._region_shift(built.m) > 10  # several batches, regions of more than the least bits
    assert built.bits.tobytes() == reference_filter(keys, 1e-6).bits.tobytes()
    assert [filter_module._region_shift(m) for m in (1 << 10, (1 << 19) - 64, 1 << 19, 1 << 40)] == [10, 10, 11, 32]


def test_observed_false_positive_rate_matches_the_configured_one() -> None:
    present = binary([b"key-%08d" % i for i in range(20_000)])
    absent = key_hashes(binary([b"other-%08d" % i for i in range(200_000)]))
    for fpp in (0.01, 0.001):
        rate = KeyFilter.of_keys(present, fpp).positives(absent) / len(absent)
        assert 0.6 * fpp < rate < 1.4 * fpp, (fpp, rate)


def test_shape_and_the_empty_filter() -> None:
    assert filter_shape(0, 0.01) == (64, 1)
    m, k = filter_shape(1000, 0.01)
    assert m % 64 == 0 and 9584 <= m < 9584 + 64 and k == 7  # 9.585 bits per key, k = m/n ln 2
    empty = KeyFilter.of_keys(binary([]), 0.01)
    assert empty.positives(key_hashes(binary([b"a", b"b"]))) == 0
    with pytest.raises(ValueError, match="fpp"):
        filter_shape(10, 1.0)


def test_may_contain_agrees_with_the_reference_probe() -> None:
    f = KeyFilter.of_keys(binary([b"k%d" % i for i in range(500)]), 0.05)
    probes = [b"k%d" % i for i in range(400, 1400)]
    assert f.may_contain(key_hashes(binary(probes))).tolist() == [reference_may_contain(f, p) for p in probes]


# --- the stored format ---------------------------------------------------------------------------------


def test_format_fields_sit_at_their_documented_offsets() -> None:
    f = KeyFilter.of_keys(binary([b"a", b"b", b"c"]), 0.01, FilterFacts(NOW, True))
    data = f.to_bytes()
    assert data[:4] == b"KCBF" and data[VERSION_OFFSET] == 1 and data[HASH_OFFSET] == 1
    assert struct.unpack_from(">H", data, K_OFFSET)[0] == f.k
    assert struct.unpack_from(">Q", data, M_OFFSET)[0] == f.m
    assert struct.unpack_from(">Q", data, N_OFFSET)[0] == 3
    assert struct.unpack_from(">q", data, HORIZON_OFFSET)[0] == NOW
    assert struct.unpack_from(">I", data, FLAGS_OFFSET)[0] == 1
    assert len(data) == BITS_OFFSET + f.m // 8 and data[BITS_OFFSET:] == f.bits.tobytes()
    back = KeyFilter.from_bytes(data)
    assert (back.m, back.k, back.n, back.facts) == (f.m, f.k, f.n, f.facts)
    assert back.bits.tobytes() == f.bits.tobytes()


@pytest.mark.parametrize(
    ("position", "value", "match"),
    [
        (0, 0x4B ^ 0xFF, "magic"),
        (VERSION_OFFSET, 2, "version 1, found 2"),
        (HASH_OFFSET, 9, "hash 1, found 9"),
        (BITS_OFFSET + 3, 0x5A, "CRC-32C mismatch"),
        (HORIZON_OFFSET + 7, 0x01, "CRC-32C mismatch"),
    ],
)
def test_a_damaged_filter_is_refused_naming_the_byte(position: int, value: int, match: str) -> None:
    data = bytearray(KeyFilter.of_keys(binary([b"x%d" % i for i in range(100)]), 0.01).to_bytes())
    data[position] = value if position > 0 else data[0] ^ 0xFF
    with pytest.raises(FilterFormatError, match=match) as err:
        KeyFilter.from_bytes(bytes(data), obj="t/0/x.bloom")
    expected = {0: 0, VERSION_OFFSET: VERSION_OFFSET, HASH_OFFSET: HASH_OFFSET}.get(position, CRC_OFFSET)
    assert err.value.position == expected and "t/0/x.bloom" in str(err.value)
    with pytest.raises(FilterFormatError, match="shorter"):
        KeyFilter.from_bytes(bytes(data[:20]))


def test_a_missing_or_damaged_filter_reads_as_none(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    log = segment_object_key("t", TOPIC_ID, 0, 0, "tqimKeZwStOEOwRzT3L5oQ", Suffix.LOG)
    key = filter_key(log)
    assert key == log.removesuffix(".log") + ".bloom"
    assert read_filter(store, key) == (None, 0)
    store.put(key, b"KCBF" + b"\x00" * 50)
    f, size = read_filter(store, key)
    assert f is None and size == 54


# --- facts from a segment's scan ---------------------------------------------------------------------------


def segment(*batches: bytes) -> bytes:
    return b"".join(batches)


def data(offset: int, keys: Sequence[bytes], *, ts: int = 1_000, values: Sequence[bytes | None] | None = None,
         horizon: int | None = None, **kw: object) -> bytes:
    vals = values if values is not None else [b"v"] * len(keys)
    records = [Record(offset + i, ts, k, v) for i, (k, v) in enumerate(zip(keys, vals, strict=True))]
    return encode_batch(build_batch(records, delete_horizon_ms=horizon, **kw))  # type: ignore[arg-type]


def test_segment_filter_holds_data_keys_and_records_horizon_and_transactions() -> None:
    plain = segment(data(0, [b"a", b"b"]), data(2, [b"c"], values=[None], horizon=NOW + 5), data(3, [b"d"],
                    values=[None], horizon=NOW + 2))
    scan = scan_segment(plain)
    f = segment_filter(scan, 0.01)
    assert f.n == 4 and f.facts == FilterFacts(NOW + 2, False)
    assert f.positives(key_hashes(binary([b"a", b"b", b"c", b"d"]))) == 4
    txn = segment(data(0, [b"a"], producer_id=5, producer_epoch=0, base_sequence=0, transactional=True),
                  bytes(encode_batch(end_txn_marker(ControlType.COMMIT, 1, 1_000, 5, 0, 0, 0))))
    assert segment_facts(scan_segment(txn)) == FilterFacts(-1, True)
    assert segment_filter(scan_segment(txn), 0.01).n == 1  # the marker's control key is not a key


# --- the skip policy -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("facts", "positives", "expected"),
    [
        (None, 0, Verdict.NO_FILTER),
        (FilterFacts(), 0, Verdict.KEEP),
        (FilterFacts(), 1, Verdict.HIT),
        (FilterFacts(-1, True), 0, Verdict.TRANSACTIONAL),
        (FilterFacts(NOW, False), 0, Verdict.HORIZON_PASSED),  # horizon <= now: a rewrite drops tombstones
        (FilterFacts(NOW + 1, False), 0, Verdict.KEEP),
    ],
)
def test_verdicts(facts: FilterFacts | None, positives: int, expected: Verdict) -> None:
    assert verdict(facts, positives, NOW) is expected
    assert expected.kept == (expected is Verdict.KEEP)


SEGS = [factories.segment(i * 10, i * 10 + 9, segment_id=f"seg{i:016d}AAA", topic_id=TOPIC_ID) for i in range(8)]


@pytest.mark.parametrize(
    ("kept", "max_size", "expected"),
    [
        (set(), 300, [[0, 1, 2], [3, 4, 5], [6, 7]]),  # the planner's grouping
        ({2}, 300, [[0, 1], [3, 4, 5], [6, 7]]),  # a kept segment ends a group
        ({0, 7}, 300, [[1, 2, 3], [4, 5, 6]]),
        ({1, 2, 3, 4, 5, 6}, 300, [[0], [7]]),
        ({3}, 150, [[0], [1], [2], [4], [5], [6], [7]]),  # the disk budget caps a chunk
        (set(range(8)), 300, []),
    ],
)
def test_regroup_around_kept_segments(kept: set[int], max_size: int, expected: list[list[int]]) -> None:
    sizer = estimated_index_sizes(4096)
    groups = regroup_around(SEGS, {SEGS[i].segment_id for i in kept}, max_size=max_size, max_index_size=10**6,
                            first_uncleanable_offset=80, index_sizes=sizer)
    assert [[SEGS.index(s) for s in g] for g in groups] == expected
    if not kept:
        assert groups == group_segments_by_size(SEGS, max_size, 10**6, 80, sizer)


@pytest.mark.parametrize(
    ("sizes", "kept", "expected"),
    [
        ([90, 40, 10], {0, 1}, {0}),  # the small one joins the rewritten (dirty) one after it
        ([90, 40, 90], {0, 1, 2}, {0, 1, 2}),  # between two large kept ones it cannot merge: kept
        ([40, 40, 90], {0, 1, 2}, {2}),  # two small neighbours merge with each other
        ([40, 90], {0}, {0}),  # 40 + 90 > segment.bytes: merging would not fit
        ([20, 20, 20, 90, 20, 10], {0, 1, 2, 3, 4}, {3}),  # runs of small ones are absorbed as far as they fit
    ],
)
def test_small_segments_that_can_merge_are_not_kept(sizes: list[int], kept: set[int], expected: set[int]) -> None:
    segments = [factories.segment(i * 10, i * 10 + 9, segment_id=f"seg{i:016d}AAA", topic_id=TOPIC_ID, size=size)
                for i, size in enumerate(sizes)]
    ids = merge_small(segments, {segments[i].segment_id for i in kept}, segment_bytes=100)
    assert ids == {segments[i].segment_id for i in expected}


def version(v: int) -> tuple[Header, ...]:
    return (Header("version", struct.pack(">q", v)),)



# --- the rewrite: filters of outputs, bounded chunks -------------------------------------------------------


def partition_task(store_root: Path, sizes: Sequence[int], budget: int | None, per_group: int = 2
                   ) -> tuple[PartitionTask, dict[int, list[int]]]:
    """A partition of len(sizes) segments (one keyed record per ~100 bytes each) stored under `store_root`."""
    store = open_store(str(store_root))
    inputs, winners, offset = [], [], 0
    for i, size in enumerate(sizes):
        n = max(1, size // 100)
        log = segment(data(offset, [b"k%06d" % (offset + j) for j in range(n)], values=[b"x" * 80] * n))
        sid = f"seg{i:016d}AAA"
        key = segment_object_key("t", TOPIC_ID, 0, offset, sid, Suffix.LOG)
        store.put(key, log)
        inputs.append(InputSegment(sid, offset, offset + n - 1, {"log": key}, len(log)))
        winners.extend(range(offset, offset + n))
        offset += n
    groups = tuple(GroupTask(g, chunk[0].start_offset, chunk[-1].end_offset, tuple(chunk))
                   for g, chunk in enumerate(inputs[i:i + per_group] for i in range(0, len(inputs), per_group)))
    task = PartitionTask("t", TOPIC_ID, 0, offset, NOW, 86_400_000, 4096, (), {}, groups, disk_budget_bytes=budget)
    by_group = {g.group_id: [w for w in winners if g.start_offset <= w <= g.end_offset] for g in groups}
    return task, by_group


@pytest.mark.parametrize("in_memory", [upload.IN_MEMORY_BYTES, 0], ids=["read", "mapped"])
def test_chunks_stay_within_the_disk_budget_and_outputs_carry_their_filter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_memory: int) -> None:
    monkeypatch.setattr(upload, "IN_MEMORY_BYTES", in_memory)
    task, winners = partition_task(tmp_path / "store", [2000] * 10, budget=4_800)
    store = open_store(str(tmp_path / "store"))
    done = rewrite_groups(store, task, task.groups, winners)
    assert done.chunks == 5
    assert 0 < done.peak_temp_bytes <= 4_800
    assert done.peak_temp_bytes >= max(g.size for g in task.groups)  # it measured a whole chunk
    for result in done.groups:
        log = store.get(result.object_keys["log"])
        f = KeyFilter.from_bytes(get_part(store, result.object_keys["bloom"], Suffix.BLOOM))
        keys = scan_segment(log).records["key"]
        assert f.n == len(keys) and f.positives(key_hashes(keys)) == len(keys)
        assert result.object_keys["bloom"] == result.object_keys["indexes"]  # the filter is a part of it


def test_a_chunk_above_the_budget_is_refused_before_any_download(tmp_path: Path) -> None:
    task, winners = partition_task(tmp_path / "store", [2000] * 4, budget=3_000)
    store = open_store(str(tmp_path / "store"))
    biggest = max(g.size for g in task.groups)
    with pytest.raises(DiskBudgetError, match=f"raise --disk-budget-bytes to at least {biggest} "):
        rewrite_groups(store, task, task.groups, winners)
    assert store.stats.gets == 0 and store.stats.puts == 0


@pytest.mark.parametrize("in_memory", [upload.IN_MEMORY_BYTES, 0], ids=["read", "mapped"])
def test_a_corrupt_input_found_by_the_rewrite_is_reported_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  in_memory: int) -> None:
    """A big chunk's inputs are memory-mapped: cleaning up after a failing chunk must not replace its error (a
    CorruptInputError, which quarantines the partition) with a BufferError from a slice the traceback holds. A small
    chunk's are read."""
    monkeypatch.setattr(upload, "IN_MEMORY_BYTES", in_memory)
    task, winners = partition_task(tmp_path / "store", [2000] * 2, budget=None)
    store = open_store(str(tmp_path / "store"))
    key = task.groups[0].inputs[1].keys["log"]
    path = tmp_path / "store" / key
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # a record byte of the last batch: its CRC no longer matches
    path.write_bytes(bytes(data))
    before = sorted(o.key for o in store.list())
    with pytest.raises(CorruptInputError, match="CRC"):
        rewrite_groups(store, task, task.groups, winners)
    assert not list((tmp_path / "store").glob("**/kcompact-rewrite-*")), "the chunk's files are gone"
    # a big chunk's .log, streamed while its rewrite went on (its first input's piece was written): not created
    assert sorted(o.key for o in store.list()) == before
    assert sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file()) == sorted(
        k.rsplit("/", 1)[1] for k in before), "no temporary file either"


def test_calls_within_shared_scratch_download_into_one_directory_removed_at_its_end(tmp_path: Path) -> None:
    """A task's rewrites (`shared_scratch`, as the Spark tasks run them) share one download directory under the
    task's `temp_dir`, empty between calls and gone at the end; each call's outputs are those of a call alone."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    task, winners = partition_task(tmp_path / "store", [2000] * 4, budget=None)
    task = replace(task, temp_dir=str(scratch))
    store = open_store(str(tmp_path / "store"))
    alone = rewrite_groups(store, task, task.groups, winners)
    assert list(scratch.iterdir()) == []
    seen: list[list[Path]] = []
    with shared_scratch():
        for _ in range(3):
            done = rewrite_groups(store, task, task.groups, winners)
            seen.append(list(scratch.iterdir()))
            assert [list(d.iterdir()) for d in seen[-1]] == [[]], "empty between calls"
            assert [g.record_count for g in done.groups] == [g.record_count for g in alone.groups]
            assert done.peak_temp_bytes == alone.peak_temp_bytes
    assert len(seen[0]) == 1 and seen == [seen[0]] * 3, "one directory for the three calls"
    assert list(scratch.iterdir()) == [], "removed at the end"


@pytest.mark.parametrize("in_memory", [upload.IN_MEMORY_BYTES, 0], ids=["small", "big"])
def test_a_small_chunk_puts_its_objects_filter_included_in_one_round(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_memory: int) -> None:
    """A small chunk builds its filter piece by piece at once and puts both its objects in one `put_many`; a big one
    hands the pieces to the filter thread and writes its `.log` piece by piece as the rewrite makes them
    (`put_pieces`: one piece per input segment), then puts the `.indexes` object that holds the filter. The objects
    are the same."""
    monkeypatch.setattr(upload, "IN_MEMORY_BYTES", in_memory)
    task, winners = partition_task(tmp_path / "store", [2000] * 2, budget=None)
    store = open_store(str(tmp_path / "store"))
    rounds: list[list[str]] = []
    real, real_pieces = store.put_many, store.put_pieces
    streamed: list[int] = []

    def put_many(objects: Any, copied_from: Any = None) -> None:
        rounds.append(sorted(k.rsplit(".", 1)[1] for k in [*objects, *(copied_from or {})]))
        real(objects, copied_from)

    def put_pieces(key: str, pieces: Any) -> int:
        def counted() -> Any:
            for piece in pieces:
                streamed.append(len(piece))
                yield piece
        rounds.append([key.rsplit(".", 1)[1] + " in pieces"])
        return real_pieces(key, counted())

    monkeypatch.setattr(store, "put_many", put_many)
    monkeypatch.setattr(store, "put_pieces", put_pieces)
    (done,) = rewrite_groups(store, task, task.groups, winners).groups
    put = [suffix.split()[0] for r in rounds for suffix in r]
    assert sorted(put) == sorted({k.rsplit(".", 1)[1] for k in done.object_keys.values()}) == ["indexes", "log"]
    assert "indexes" in rounds[-1] and len(put) == 2  # the log; both indexes and the filter in one object
    assert rounds == ([["indexes", "log"]] if in_memory else [["log in pieces"], ["indexes"]]), rounds
    assert len(streamed) == (0 if in_memory else 2) and sum(streamed) in (0, done.size)
    f = KeyFilter.from_bytes(get_part(store, done.object_keys["bloom"], Suffix.BLOOM))
    assert f.positives(key_hashes(pa.array([b"k%06d" % i for i in range(40)], pa.binary()))) == 40


# --- the metadata change that records a lazily built filter ------------------------------------------------


def snapshot_with(*segments: SegmentMetadata) -> PartitionSnapshot:
    return PartitionSnapshot("t", 0, 3, None, tuple(segments))


def test_a_change_set_adds_an_object_key_to_an_untouched_row() -> None:
    s = SEGS[0]
    bloom = ObjectKey(ObjectSuffix.BLOOM, "k0.bloom")
    cs = ChangeSet.planned_from(snapshot_with(s), fencing_epoch=0, writer="w2", topic_id=TOPIC_ID,
                                added_object_keys=[AddedObjectKey(s.segment_id, bloom)])
    [after] = apply_change_set(snapshot_with(s), cs, NOW).segments
    assert after.object_key(ObjectSuffix.BLOOM) == "k0.bloom"
    assert after.writer == s.writer and after.event_timestamp_ms == s.event_timestamp_ms and after.state == s.state
    again = apply_change_set(snapshot_with(after), cs, NOW).segments[0]  # the same key again changes nothing
    assert again.object_keys == after.object_keys
    other = ChangeSet.planned_from(snapshot_with(after), fencing_epoch=0, writer="w", topic_id=TOPIC_ID,
                                   added_object_keys=[AddedObjectKey(s.segment_id, ObjectKey(ObjectSuffix.BLOOM, "x"))])
    with pytest.raises(MetadataInvariantError, match=r"expected no \.bloom object, found k0\.bloom"):
        apply_change_set(snapshot_with(after), other, NOW)
    unknown = ChangeSet.planned_from(snapshot_with(s), fencing_epoch=0, writer="w", topic_id=TOPIC_ID,
                                     added_object_keys=[AddedObjectKey("nope", bloom)])
    with pytest.raises(MetadataInvariantError, match="unknown segment nope"):
        apply_change_set(snapshot_with(s), unknown, NOW)


# --- the shape of a round ---------------------------------------------------------------------------------


def work(skipping: bool, blooms: Sequence[int] = ()) -> PartitionWork:
    segments = tuple(
        replace(s, object_keys=(*s.object_keys, ObjectKey(ObjectSuffix.BLOOM, f"k{i}.bloom"))) if i in blooms else s
        for i, s in enumerate(SEGS)
    )
    groups = tuple(GroupTask(i, s.start_offset, s.end_offset, (InputSegment(s.segment_id, s.start_offset,
                                                                            s.end_offset, {"log": f"k{i}"}, 100),))
                   for i, s in enumerate(segments))
    task = PartitionTask("t", TOPIC_ID, 0, 80, NOW, 1, 4096, (), {}, groups)
    return PartitionWork(task, segments, first_dirty_offset=50, skipping=skipping, segment_bytes=100,
                         segment_index_bytes=10**6)


def test_a_round_scans_dirty_segments_and_clean_ones_without_a_filter() -> None:
    w = work(True, blooms=(0, 1, 2))
    assert [s.segment_id for s in w.clean] == [s.segment_id for s in SEGS[:5]]  # end offsets below 50
    scans = {s.segment_id: s for s in w.scans}
    assert set(scans) == {s.segment_id for s in SEGS[3:]}
    assert [scans[s.segment_id].dirty for s in SEGS[3:]] == [False, False, True, True, True]
    assert scans[SEGS[3].segment_id].filter_key is not None and scans[SEGS[5].segment_id].filter_key is None
    task = w.reshaped({SEGS[0].segment_id})
    inputs = [i for g in task.groups for i in g.inputs]
    assert [i.segment_id for i in inputs] == [s.segment_id for s in SEGS[1:]]
    rescans = w.rescans({SEGS[0].segment_id}, set(scans))  # positive clean segments the first scan did not read
    assert [s.segment_id for s in rescans] == [s.segment_id for s in SEGS[1:3]]
    assert not any(s.dirty for s in rescans)


def test_a_forced_round_keeps_nothing_and_scans_everything() -> None:
    w = work(False, blooms=(0, 1, 2))
    assert w.clean == () and [s.dirty for s in w.scans] == [True] * 8
    ids = [[i.segment_id for i in g.inputs] for g in w.reshaped(set()).groups]
    assert ids == [[i.segment_id for i in g.inputs] for g in w.task.groups]  # the planner's groups


# --- sizing advice: how the per-key rate becomes a per-segment read rate -----------------------------------


def test_sizing_advice_flags_a_rate_too_coarse_for_the_dirty_keys() -> None:
    coarse = bloom_sizing(0.01, 100, clean_segments=40)
    assert coarse is not None and coarse.too_coarse
    assert coarse.expected_false_read_rate == pytest.approx(1 - 0.99**100, abs=1e-6)  # 63%
    assert coarse.suggested_fpp == pytest.approx(TARGET_FALSE_READ_RATE / 100, rel=0.02)
    fine = bloom_sizing(0.0005, 20, clean_segments=40)
    assert fine is not None and not fine.too_coarse and fine.expected_false_read_rate < 0.02
    assert bloom_sizing(0.01, 0, clean_segments=40) is None and bloom_sizing(0.01, 5, clean_segments=0) is None


@pytest.mark.parametrize("dirty_keys", [10, 200])
def test_suggested_fpp_keeps_segment_false_reads_near_the_target(dirty_keys: int) -> None:
    """Real filters sized at the suggested rate, each tested with D keys none of them holds: the share of
    filters that answer "maybe" is about TARGET_FALSE_READ_RATE (and at the 1% default, far above it)."""
    rng = np.random.default_rng(5)
    sizing = bloom_sizing(0.01, dirty_keys, clean_segments=1)
    assert sizing is not None
    suggested = sizing.suggested_fpp
    segments = 400
    reads = {suggested: 0, 0.01: 0}
    for _ in range(segments):
        held = rng.integers(0, 2**63, size=2000, dtype=np.int64).astype(np.uint64)
        absent = rng.integers(0, 2**63, size=dirty_keys, dtype=np.int64).astype(np.uint64)
        for fpp in reads:
            reads[fpp] += KeyFilter.build(held, fpp).positives(absent) > 0
    observed = reads[suggested] / segments
    assert observed <= 3 * TARGET_FALSE_READ_RATE, observed  # ~4 expected of 400; binomial slack
    default = reads[0.01] / segments
    assert default == pytest.approx(1 - 0.99**dirty_keys, abs=0.08), default


@given(st.lists(st.one_of(data_batches(), control_batches()), min_size=1, max_size=5), st.booleans())
def test_a_filter_part_read_from_the_records_is_the_scans(batches: list[Any], plain: bool) -> None:
    """`filter_part` hashes the keys of uncompressed batches straight from their records (`plain_key_hashes`):
    the same hashes, in order, and facts as from the scan's key column (nulls and control records left out); a
    compressed data batch leaves it to the scan."""
    from compaction.bloom.hashing import plain_key_hashes
    from compaction.bloom.segment import _part, filter_part
    from compaction.format.batch import CODEC_MASK, CONTROL_FLAG_MASK
    from compaction.format.scan import batch_fields

    if plain:
        batches = [replace(b, attributes=b.attributes & ~CODEC_MASK) for b in batches]
    data = b"".join(encode_batch(b) for b in batches)
    scanned = _part(scan_segment(data, verify_crc=False))
    part = filter_part(data)
    assert part.hashes.tolist() == scanned.hashes.tolist() and part.facts == scanned.facts
    fields = batch_fields(data, obj="x")
    compressed = any(int(a) & CODEC_MASK and not int(a) & CONTROL_FLAG_MASK for a in fields[:, 5])
    assert (plain_key_hashes(data, fields) is None) == compressed
