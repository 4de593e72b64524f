"""A segment's `.indexes` object (`compaction.storage.indexes`): its layout, its reads and their requests, and the
errors for one that is not kcompact's."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from compaction.dump import dump_path, format_doc
from compaction.errors import MissingObjectError
from compaction.storage import open_store
from compaction.storage.indexes import (
    MAX_HEADER_BYTES,
    PART_CODES,
    PART_ORDER,
    READ_AHEAD,
    CorruptIndexesObjectError,
    get_part,
    get_parts,
    pack_parts,
    read_header,
    segment_keys,
    segment_objects,
    unpack_parts,
)
from compaction.storage.layout import Suffix, segment_object_key

PARTS = {
    Suffix.TIME_INDEX: b"t" * 24,
    Suffix.OFFSET_INDEX: b"o" * 16,
    Suffix.LEADER_EPOCH_CHECKPOINT: b"0\n1\n0 0\n",
    Suffix.BLOOM: b"",
}


def _by_kind(parts: dict[Suffix, bytes]) -> bytes:
    """An `.indexes` object as kcompact wrote them before `PART_ORDER`: the parts by kind code."""
    ordered = sorted(parts.items(), key=lambda item: PART_CODES[item[0]])
    head = b"KCIX\x01" + bytes([len(ordered)])
    return b"".join([head, *(struct.pack(">BQ", PART_CODES[s], len(d)) for s, d in ordered), *(d for _s, d in ordered)])


def test_parts_round_trip_in_part_order_whatever_the_mapping_order():
    data = pack_parts(PARTS)
    assert data[:6] == b"KCIX\x01\x04"
    # kinds in PART_ORDER: checkpoint (5), filter (6), offset index (1), time index (2)
    assert [data[6 + 9 * i] for i in range(4)] == [5, 6, 1, 2]
    assert unpack_parts(data, obj="x") == PARTS
    header = read_header(data, obj="x", size=len(data))
    assert header[Suffix.LEADER_EPOCH_CHECKPOINT] == (6 + 36, 6 + 36 + 8)
    assert header[Suffix.OFFSET_INDEX] == (6 + 36 + 8, 6 + 36 + 8 + 16)
    assert header[Suffix.TIME_INDEX][1] == len(data)
    assert list(PART_ORDER) == sorted(PART_CODES, key=PART_ORDER.index), "every part kind has its place"


def test_an_object_laid_out_by_kind_reads_the_same(store):
    """Objects written before `PART_ORDER` (parts by kind code) read part by part as they did."""
    key = "t-MWJ6FHTfRYy67jzwZdeqSQ/0/00000000000000000000-tqimKeZwStOEOwRzT3L5oQ.indexes"
    parts = {**PARTS, Suffix.PRODUCER_SNAPSHOT: b"p" * 31}
    store.put(key, _by_kind(parts))
    assert unpack_parts(_by_kind(parts), obj="x") == parts
    assert {s: get_part(store, key, s) for s in parts} == parts
    carried = {Suffix.PRODUCER_SNAPSHOT: key, Suffix.LEADER_EPOCH_CHECKPOINT: key}
    assert get_parts(store, carried) == {s: parts[s] for s in carried}


def test_a_segments_objects_and_the_keys_its_row_names():
    def key(suffix: Suffix) -> str:
        return segment_object_key("t", "MWJ6FHTfRYy67jzwZdeqSQ", 3, 42, "tqimKeZwStOEOwRzT3L5oQ", suffix)

    objects, keys = segment_objects(key, b"log bytes", PARTS)
    assert sorted(objects) == sorted([key(Suffix.LOG), key(Suffix.INDEXES)])
    assert objects[key(Suffix.LOG)] == b"log bytes"
    assert unpack_parts(objects[key(Suffix.INDEXES)], obj="x") == PARTS
    assert keys == {Suffix.LOG: key(Suffix.LOG), Suffix.INDEXES: key(Suffix.INDEXES),
                    **{s: key(Suffix.INDEXES) for s in PARTS}}
    assert segment_keys(key, []) == {Suffix.LOG: key(Suffix.LOG)}


@pytest.fixture
def store(tmp_path):
    return open_store(str(tmp_path / "store"))


def test_a_part_is_read_with_its_header_in_one_request(store):
    """The first request asks for `READ_AHEAD` bytes: a small object's parts come with its header."""
    key = "t-MWJ6FHTfRYy67jzwZdeqSQ/0/00000000000000000000-tqimKeZwStOEOwRzT3L5oQ.indexes"
    store.put(key, pack_parts(PARTS))
    size = len(pack_parts(PARTS))
    before = (store.stats.gets, store.stats.bytes_read)
    assert get_part(store, key, Suffix.TIME_INDEX) == PARTS[Suffix.TIME_INDEX]
    assert (store.stats.gets, store.stats.bytes_read) == (before[0] + 1, before[1] + size), "the whole object, once"
    before = (store.stats.gets, store.stats.bytes_read)
    carried = {Suffix.OFFSET_INDEX: key, Suffix.TIME_INDEX: key}
    assert get_parts(store, carried) == {s: PARTS[s] for s in carried}
    assert (store.stats.gets, store.stats.bytes_read) == (before[0] + 1, before[1] + size)


def test_a_part_past_the_read_ahead_costs_one_more_request_for_its_bytes_alone(store):
    """Past `READ_AHEAD`, a part costs one more request, from where the first ended: no byte is fetched twice."""
    large = "t-MWJ6FHTfRYy67jzwZdeqSQ/0/00000000000000000001-tqimKeZwStOEOwRzT3L5oQ.indexes"
    big = bytes(range(256)) * 1024
    snapshot = b"s" * 40
    store.put(large, pack_parts({Suffix.PRODUCER_SNAPSHOT: snapshot, Suffix.OFFSET_INDEX: big,
                                 Suffix.TIME_INDEX: b"tail"}))
    header = 6 + 3 * 9
    before = (store.stats.gets, store.stats.bytes_read)
    assert get_part(store, large, Suffix.PRODUCER_SNAPSHOT) == snapshot  # first in PART_ORDER: within the read-ahead
    assert (store.stats.gets, store.stats.bytes_read) == (before[0] + 1, before[1] + READ_AHEAD)
    before = (store.stats.gets, store.stats.bytes_read)
    assert get_part(store, large, Suffix.TIME_INDEX) == b"tail"
    assert (store.stats.gets, store.stats.bytes_read) == (before[0] + 2, before[1] + READ_AHEAD + 4)
    before = (store.stats.gets, store.stats.bytes_read)
    assert get_part(store, large, Suffix.OFFSET_INDEX) == big  # straddles the read-ahead's end
    assert (store.stats.gets, store.stats.bytes_read) == (before[0] + 2, before[1] + header + len(snapshot) + len(big))
    assert MAX_HEADER_BYTES == 78 and READ_AHEAD >= MAX_HEADER_BYTES


def test_a_part_missing_or_cut_short_is_an_error_naming_the_object(store):
    key = "t-MWJ6FHTfRYy67jzwZdeqSQ/0/00000000000000000000-tqimKeZwStOEOwRzT3L5oQ.indexes"
    store.put(key, pack_parts(PARTS))
    with pytest.raises(MissingObjectError, match=r"holds no \.txnindex part"):
        get_part(store, key, Suffix.TXN_INDEX)
    big = pack_parts({**PARTS, Suffix.OFFSET_INDEX: b"o" * 2 * READ_AHEAD})
    for n, (data, ends) in enumerate([  # within the read-ahead (the object ends there), then past it
            (pack_parts(PARTS), f"ends at byte {len(pack_parts(PARTS)) - 30}"),
            (big, f"ends at or before byte {len(big) - 24}")]):  # the time index's start: nothing of it there
        cut = key.replace("00000000000000000000-", f"0000000000000000000{n + 2}-")
        store.put(cut, data[:-30])
        with pytest.raises(CorruptIndexesObjectError, match=f"reach byte {len(data)}, the object {ends}") as caught:
            get_part(store, cut, Suffix.TIME_INDEX)
        assert store.object_uri(cut) in str(caught.value)
        assert get_part(store, cut, Suffix.LEADER_EPOCH_CHECKPOINT) == PARTS[Suffix.LEADER_EPOCH_CHECKPOINT]


def test_a_key_of_its_own_is_read_as_the_file(store):
    key = "t-MWJ6FHTfRYy67jzwZdeqSQ/0/00000000000000000000-tqimKeZwStOEOwRzT3L5oQ.index"
    store.put(key, b"not a container")
    assert get_part(store, key, Suffix.OFFSET_INDEX) == b"not a container"
    assert get_parts(store, {Suffix.OFFSET_INDEX: key}) == {Suffix.OFFSET_INDEX: b"not a container"}


def _entry(code: int, length: int) -> bytes:
    return struct.pack(">BQ", code, length)


@pytest.mark.parametrize(("data", "message", "position"), [
    (b"KCI", "shorter than an .indexes header", 3),
    (b"NOPE\x01\x01" + _entry(1, 0), "not an .indexes object", 0),
    (b"KCIX\x02\x01" + _entry(1, 0), "unsupported .indexes version 2", 4),
    (b"KCIX\x01\x00", "0 parts", 5),
    (b"KCIX\x01\x09" + _entry(1, 0) * 9, "9 parts", 5),
    (b"KCIX\x01\x02" + _entry(1, 0), "header of 2 parts cut", 15),
    (b"KCIX\x01\x01" + _entry(9, 0), "unknown part kind 9", 6),
    (b"KCIX\x01\x02" + _entry(1, 0) + _entry(1, 0), "repeated part kind 1", 15),
    (b"KCIX\x01\x01" + _entry(1, 5) + b"abc", "parts add up to 20 bytes, the object holds 18", 18),
])
def test_an_object_that_is_not_one_is_refused_naming_the_byte(data, message, position):
    with pytest.raises(CorruptIndexesObjectError, match=message) as caught:
        read_header(data, obj="s3://b/x.indexes", size=len(data))
    assert caught.value.position == position
    assert "s3://b/x.indexes" in str(caught.value)


def test_a_corrupt_object_read_from_the_store_names_it(store):
    key = "t-MWJ6FHTfRYy67jzwZdeqSQ/0/00000000000000000000-tqimKeZwStOEOwRzT3L5oQ.indexes"
    store.put(key, b"KCIX\x01\x01" + _entry(9, 100) + b"short")
    with pytest.raises(CorruptIndexesObjectError, match="unknown part kind 9") as caught:
        get_part(store, key, Suffix.OFFSET_INDEX)
    assert store.object_uri(key) in str(caught.value)


def test_nothing_but_known_parts_goes_in():
    with pytest.raises(ValueError, match="not a part"):
        pack_parts({Suffix.LOG: b"x"})
    with pytest.raises(ValueError, match="at least one part"):
        pack_parts({})


def test_the_bytes_the_broker_plugins_test_reads():
    """`KcompactRemoteStorageManagerTest.PACKED` (the plugin reads these parts by range): the same bytes."""
    java = (Path(__file__).parents[2] / "kafka/tiered-plugin/src/test/java/dev/kcompact/tiered/"
            "KcompactRemoteStorageManagerTest.java").read_text()
    hexed = "".join(re.findall(r'"([0-9a-f]+)"', java[java.index("String PACKED"):java.index(";", java.index(
        "String PACKED"))]))
    files = {Suffix.OFFSET_INDEX: b"offsets", Suffix.TIME_INDEX: b"times", Suffix.PRODUCER_SNAPSHOT: b"producers",
             Suffix.LEADER_EPOCH_CHECKPOINT: b"0\n1\n0 1234\n", Suffix.BLOOM: b"filter"}
    assert bytes.fromhex(hexed) == pack_parts(files)
    by_kind = "".join(re.findall(r'"([0-9a-f]+)"', java[java.index("String PACKED_BY_KIND"):java.index(";", java.index(
        "String PACKED_BY_KIND"))]))
    assert bytes.fromhex(by_kind) == _by_kind(files), "the plugin's test also reads the layout written before"


def test_kcompact_dump_lists_an_indexes_objects_parts(tmp_path):
    path = tmp_path / "00000000000000000042-tqimKeZwStOEOwRzT3L5oQ.indexes"
    path.write_bytes(pack_parts(PARTS))
    doc = dump_path(path, print_data=False)
    assert doc["type"] == "indexes"
    assert [(e["part"], e["size"]) for e in doc["entries"]] == [
        ("leader-epoch-checkpoint", 8), ("bloom", 0), ("index", 16), ("timeindex", 24)]
    assert list(format_doc(doc, print_data=False))[1] == "part: leader-epoch-checkpoint position: 42 size: 8"
    path.write_bytes(b"KCIX\x01\x01" + _entry(1, 5))
    with pytest.raises(CorruptIndexesObjectError, match="parts add up to 20 bytes, the object holds 15"):
        dump_path(path, print_data=False)
