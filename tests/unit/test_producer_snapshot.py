"""Producer snapshots: layout, round trip, corruption at named bytes, and the state replayed from batches."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction.errors import CorruptIndexError, CorruptInputError
from compaction.format.batch import (
    Record,
    RecordBatch,
    build_batch,
    crc32c,
    decode_batch,
    empty_batch_header,
    encode_batch,
)
from compaction.format.control import ControlType
from compaction.format.indexes import build_indexes
from compaction.format.producer_snapshot import (
    ProducerStateEntry,
    encode_producer_snapshot,
    expire_producers,
    open_transactions,
    producer_state_from_batches,
    producer_state_from_log,
    read_producer_snapshot,
)
from compaction.format.segment import iter_batch_headers
from tests import factories

SNAPSHOT = "topic-0/00000000000000000042.snapshot"

int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
entries = st.lists(
    st.builds(ProducerStateEntry, int64, int16, int32, int64, int32, int64, int32, int64), max_size=20
)


@given(entries)
def test_round_trip(items: list[ProducerStateEntry]) -> None:
    data = encode_producer_snapshot(items)
    assert len(data) == 10 + 46 * len(items)
    assert read_producer_snapshot(data, SNAPSHOT) == items


def test_layout_version_crc_count_entries() -> None:
    entry = ProducerStateEntry(7, 2, 41, 1000, 4, 1_700_000_000_000, 5, 990)
    data = encode_producer_snapshot([entry])
    body = struct.pack(">i", 1) + struct.pack(">qhiqiqiq", 7, 2, 41, 1000, 4, 1_700_000_000_000, 5, 990)
    assert data == struct.pack(">hI", 1, crc32c(body)) + body
    assert encode_producer_snapshot([]) == struct.pack(">hIi", 1, crc32c(bytes(4)), 0)


def test_bad_crc_names_file_and_the_crc_field() -> None:
    data = bytearray(encode_producer_snapshot([ProducerStateEntry(7, 2, 41, 1000, 4, 123, 5, -1)]))
    data[10 + 20] ^= 0x01  # a bit of the entry's lastOffset
    with pytest.raises(CorruptIndexError) as info:
        read_producer_snapshot(bytes(data), SNAPSHOT)
    assert (info.value.obj, info.value.position) == (SNAPSHOT, 2)
    assert "CRC-32C mismatch" in str(info.value) and SNAPSHOT in str(info.value)


def with_crc(version: int, body: bytes) -> bytes:
    return struct.pack(">hI", version, crc32c(body)) + body


@pytest.mark.parametrize(
    ("data", "position", "what"),
    [
        (b"\x00\x01\x00", 3, "too few"),
        (with_crc(2, struct.pack(">i", 0)), 0, "unknown snapshot version 2"),
        (with_crc(1, struct.pack(">i", -1)), 6, "negative entry count"),
        (with_crc(1, struct.pack(">i", 2) + bytes(46)), 56, "2 entries need 102 bytes"),
        (with_crc(1, struct.pack(">i", 1) + bytes(47)), 56, "1 entries need 56 bytes"),
    ],
)
def test_malformed_snapshot_names_the_byte(data: bytes, position: int, what: str) -> None:
    with pytest.raises(CorruptIndexError) as info:
        read_producer_snapshot(data, SNAPSHOT)
    assert (info.value.obj, info.value.position) == (SNAPSHOT, position)
    assert what in str(info.value)


# --- producer state --------------------------------------------------------------------------------


def data(
    base: int, n: int, ts: int, *, pid: int = 5, epoch: int = 0, seq: int = 0, txn: bool = False
) -> RecordBatch:
    records = [Record(base + i, ts + i, b"k", b"v") for i in range(n)]
    return build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=txn)


def marker(
    kind: ControlType, offset: int, pid: int, *, epoch: int = 0, coordinator_epoch: int = 3
) -> RecordBatch:
    return factories.marker(kind, offset, pid, ts=9_000 + offset, epoch=epoch, coordinator_epoch=coordinator_epoch)


def test_idempotent_producer_keeps_its_last_batch() -> None:
    state = producer_state_from_batches([data(0, 3, 100), data(3, 2, 200, seq=3), data(5, 1, 300, pid=-1)])
    assert state == {5: ProducerStateEntry(5, 0, 4, 4, 1, 201, -1, -1)}


def test_sequence_wraps_like_kafka() -> None:
    state = producer_state_from_batches([data(0, 3, 100, seq=2**31 - 2)])
    assert state[5].last_sequence == 0


def test_open_transaction_records_its_first_offset() -> None:
    state = producer_state_from_batches(
        [data(10, 2, 100, pid=7, txn=True), data(12, 2, 110, pid=7, txn=True, seq=2)]
    )
    assert state[7] == ProducerStateEntry(7, 0, 3, 13, 1, 111, -1, 10)
    assert open_transactions(state.values()) == {7: 10}


def test_marker_closes_the_transaction_and_sets_coordinator_epoch_and_timestamp() -> None:
    batches = [data(10, 2, 100, pid=7, txn=True), marker(ControlType.COMMIT, 12, 7, coordinator_epoch=4)]
    assert producer_state_from_batches(batches)[7] == ProducerStateEntry(7, 0, 1, 11, 1, 9_012, 4, -1)


def test_marker_with_a_bumped_epoch_clears_the_batch_metadata() -> None:
    batches = [data(10, 2, 100, pid=7, txn=True), marker(ControlType.ABORT, 12, 7, epoch=1)]
    assert producer_state_from_batches(batches)[7] == ProducerStateEntry(7, 1, -1, -1, 0, 9_012, 3, -1)


def test_an_emptied_marker_completes_nothing() -> None:
    emptied = decode_batch(empty_batch_header(marker(ControlType.ABORT, 12, 7)))
    state = producer_state_from_batches([data(10, 2, 100, pid=7, txn=True), emptied])
    assert state[7].current_txn_first_offset == 10


def test_non_transactional_write_inside_a_transaction_is_corrupt() -> None:
    with pytest.raises(CorruptInputError, match="still open"):
        producer_state_from_batches([data(10, 2, 100, pid=7, txn=True), data(12, 1, 100, pid=7)])


def test_undecoded_control_batch_is_refused() -> None:
    header = next(iter_batch_headers(_encode([marker(ControlType.COMMIT, 12, 7)])))
    with pytest.raises(ValueError, match="decoded"):
        producer_state_from_batches([header])


def _encode(batches: list[RecordBatch]) -> bytes:
    return b"".join(encode_batch(b) for b in batches)


def mixed_log() -> list[RecordBatch]:
    return [
        data(0, 3, 100, pid=5),
        data(3, 2, 110, pid=7, txn=True),
        data(5, 1, 120, pid=-1),
        data(6, 2, 130, pid=8, txn=True, seq=0),
        marker(ControlType.ABORT, 8, 7),
        data(9, 2, 140, pid=5, seq=3),
        marker(ControlType.COMMIT, 11, 8, coordinator_epoch=9),
        data(12, 1, 150, pid=7, txn=True, seq=2),
    ]


def test_state_from_log_decodes_only_markers_and_matches_decoded_batches() -> None:
    batches = mixed_log()
    from_log = producer_state_from_log(_encode(batches), "seg.log")
    assert from_log == producer_state_from_batches(batches)
    assert list(from_log) == [5, 7, 8]
    assert open_transactions(from_log.values()) == {7: 12}


@given(st.integers(0, 8))
def test_state_continues_from_a_snapshot(split: int) -> None:
    batches = mixed_log()
    head = producer_state_from_batches(batches[:split])
    snapshot = encode_producer_snapshot(head.values())
    resumed = producer_state_from_batches(batches[split:], initial=read_producer_snapshot(snapshot))
    assert resumed == producer_state_from_batches(batches)


def test_snapshot_open_transactions_feed_the_txn_index_rebuild() -> None:
    batches = mixed_log()
    head = _encode(batches[:7])
    tail = _encode([*batches[7:], data(13, 1, 160, pid=9, txn=True), marker(ControlType.ABORT, 14, 7)])
    carried = open_transactions(producer_state_from_log(head).values())
    built = build_indexes(tail, 12, txn_first_offsets=carried)
    assert built.txn_index is not None and built.open_txns == {9: 13}


def test_expiry_keeps_open_transactions() -> None:
    state = {
        1: ProducerStateEntry(1, timestamp=1_000),
        2: ProducerStateEntry(2, timestamp=1_000, current_txn_first_offset=5),
        3: ProducerStateEntry(3, timestamp=50_000),
    }
    assert list(expire_producers(state, now_ms=61_000, expiration_ms=60_000)) == [2, 3]
    assert list(expire_producers(state, now_ms=60_999, expiration_ms=60_000)) == [1, 2, 3]
