"""leader-epoch-checkpoint and partition.metadata: round trips, Kafka's parser rules, errors naming lines."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction.errors import CorruptIndexError
from compaction.format.checkpoints import (
    EpochEntry,
    PartitionMetadata,
    base64_to_uuid,
    encode_leader_epoch_checkpoint,
    encode_partition_metadata,
    epochs_in_range,
    leader_epoch_cache,
    new_topic_id,
    read_leader_epoch_checkpoint,
    read_partition_metadata,
    uuid_to_base64,
    write_checkpoint_file,
)

CHECKPOINT = "topic-0/leader-epoch-checkpoint"
METADATA = "topic-0/partition.metadata"

epoch_entries = st.lists(
    st.builds(EpochEntry, st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)), max_size=20
)


# --- leader-epoch-checkpoint -----------------------------------------------------------------------


def test_spec_example() -> None:
    data = b"0\n2\n0 0\n3 1234\n"
    assert read_leader_epoch_checkpoint(data) == [EpochEntry(0, 0), EpochEntry(3, 1234)]
    assert encode_leader_epoch_checkpoint([EpochEntry(0, 0), EpochEntry(3, 1234)]) == data


@given(epoch_entries)
def test_round_trip(entries: list[EpochEntry]) -> None:
    assert read_leader_epoch_checkpoint(encode_leader_epoch_checkpoint(entries), CHECKPOINT) == entries


@pytest.mark.parametrize("data", [b"", b"0\n", b"0"])
def test_empty_or_countless_files_have_no_entries(data: bytes) -> None:
    assert read_leader_epoch_checkpoint(data) == []


def test_reader_accepts_what_java_readline_and_split_accept() -> None:
    assert read_leader_epoch_checkpoint("0\r\n1\r\n5\t\t77  ") == [EpochEntry(5, 77)]


@pytest.mark.parametrize(
    ("data", "line", "position", "what"),
    [
        (b"1\n0\n", 1, 0, "unrecognised version 1"),
        (b"zero\n0\n", 1, 0, "expected an integer"),
        (b"0\ntwo\n", 2, 2, "expected an integer"),
        (b"0\n2\n0 0\n3 1234 9\n", 4, 8, "expected 'epoch startOffset'"),
        (
            b"0\n2\n0 0\n\n3 1234\n",
            4,
            8,
            "expected 'epoch startOffset'",
        ),  # the source throws, it does not skip
        (b"0\n1\n 3 1234\n", 3, 4, "expected 'epoch startOffset'"),  # leading space: an empty first field
        (b"0\n1\n-1 5\n", 3, 4, "must be >= 0"),
        (b"0\n1\n2147483648 5\n", 3, 4, "must be >= 0"),
        (b"0\n3\n0 0\n3 1234\n", 2, 2, "expected 3 entries, found 2"),
    ],
)
def test_malformed_checkpoint_names_file_and_line(data: bytes, line: int, position: int, what: str) -> None:
    with pytest.raises(CorruptIndexError) as info:
        read_leader_epoch_checkpoint(data, CHECKPOINT)
    assert (info.value.obj, info.value.position) == (CHECKPOINT, position)
    assert f"line {line}:" in str(info.value) and what in str(info.value)


def test_epochs_in_range_clamps_the_first_entry_and_drops_later_epochs() -> None:
    entries = [EpochEntry(0, 0), EpochEntry(3, 100), EpochEntry(5, 200), EpochEntry(8, 300)]
    assert epochs_in_range(entries, 150, 300) == [EpochEntry(3, 150), EpochEntry(5, 200)]
    assert epochs_in_range(entries, 100, 250) == [EpochEntry(3, 100), EpochEntry(5, 200)]
    assert epochs_in_range(entries, 0, 100) == [EpochEntry(0, 0)]
    assert epochs_in_range(entries, 350, 400) == [EpochEntry(8, 350)]
    assert epochs_in_range(entries, -1, -1) == entries
    assert epochs_in_range([], 10, 20) == []


def test_leader_epoch_cache_replays_assign() -> None:
    entries = [EpochEntry(0, 0), EpochEntry(2, 50), EpochEntry(2, 60), EpochEntry(3, 40), EpochEntry(5, 100)]
    # (2, 60) repeats the latest epoch later: ignored; (3, 40) truncates (2, 50), whose start is above 40.
    assert leader_epoch_cache(entries) == [EpochEntry(0, 0), EpochEntry(3, 40), EpochEntry(5, 100)]
    assert epochs_in_range([EpochEntry(0, 1), EpochEntry(1, 0)], 0, 1) == [EpochEntry(1, 0)]


@given(epoch_entries, st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_epochs_in_range_entries_lie_in_range(entries: list[EpochEntry], start: int, end: int) -> None:
    got = epochs_in_range(entries, start, end)
    assert all(start <= e.start_offset < end for e in got)
    assert got == leader_epoch_cache(got)  # still a valid cache: epochs and offsets strictly increase


def test_write_checkpoint_file_is_atomic_and_leaves_no_tmp(tmp_path: Path) -> None:
    target = tmp_path / "leader-epoch-checkpoint"
    write_checkpoint_file(target, encode_leader_epoch_checkpoint([EpochEntry(1, 5)]))
    assert read_leader_epoch_checkpoint(target.read_bytes()) == [EpochEntry(1, 5)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leader-epoch-checkpoint"]


# --- partition.metadata and Uuid -------------------------------------------------------------------


@given(st.binary(min_size=16, max_size=16))
def test_uuid_text_form_round_trip(raw: bytes) -> None:
    text = uuid_to_base64(raw)
    assert len(text) == 22 and "=" not in text and "+" not in text and "/" not in text
    assert base64_to_uuid(text) == raw


def test_uuid_text_form_matches_kafka() -> None:
    # Kafka: new Uuid(0x0000000000000000L, 0x0000000000000001L).toString() == "AAAAAAAAAAAAAAAAAAAAAQ"
    assert uuid_to_base64(bytes(15) + b"\x01") == "AAAAAAAAAAAAAAAAAAAAAQ"
    assert uuid_to_base64(b"\xff" * 16) == "_____________________w"
    assert base64_to_uuid("_____________________w==") == b"\xff" * 16  # padding is optional for Java too


@pytest.mark.parametrize(
    "text", ["short", "AAAAAAAAAAAAAAAAAAAAA+", "AAAAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAA!Q"]
)
def test_invalid_uuid_text(text: str) -> None:
    with pytest.raises(ValueError):
        base64_to_uuid(text)


def test_new_topic_id_is_a_v4_uuid_and_skips_reserved_and_dash() -> None:
    draws = iter([b"\xf8" + bytes(15), b"\x12" * 16])  # the first one's text form starts with '-'
    topic_id = new_topic_id(lambda n: next(draws))
    raw = base64_to_uuid(topic_id)
    assert uuid.UUID(bytes=raw).version == 4 and not topic_id.startswith("-")
    assert raw == uuid.UUID(bytes=b"\x12" * 16, version=4).bytes
    assert len(new_topic_id()) == 22


def test_partition_metadata_round_trip() -> None:
    topic_id = uuid_to_base64(uuid.UUID("6ba7b810-9dad-41d1-80b4-00c04fd430c8").bytes)
    data = encode_partition_metadata(topic_id)
    assert data == f"version: 0\ntopic_id: {topic_id}\n".encode()
    assert read_partition_metadata(data, METADATA) == PartitionMetadata(topic_id, 0)


@pytest.mark.parametrize(
    ("data", "line", "position"),
    [
        (b"version: 1\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ\n", 1, 0),
        (b"version 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ\n", 1, 0),
        (b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n", 2, 11),  # the zero Uuid
        (b"version: 0\ntopic_id: not-a-uuid\n", 2, 11),
        (b"version: 0\ntopic: AAAAAAAAAAAAAAAAAAAAAQ\n", 2, 11),
    ],
)
def test_malformed_partition_metadata_names_file_and_line(data: bytes, line: int, position: int) -> None:
    with pytest.raises(CorruptIndexError) as info:
        read_partition_metadata(data, METADATA)
    assert (info.value.obj, info.value.position) == (METADATA, position)
    assert f"line {line}:" in str(info.value)


def test_partition_metadata_missing_lines() -> None:
    with pytest.raises(CorruptIndexError, match="expected 'version: 0'"):
        read_partition_metadata(b"version: 0\n", METADATA)
