"""The segment object key layout: known keys, round trips, and keys that must be refused."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction.storage.layout import (
    SegmentObjectKey,
    Suffix,
    kafka_uuid_text,
    new_segment_id,
    parse_kafka_uuid,
    parse_segment_object_key,
    segment_object_key,
)

TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"
SEGMENT_ID = "tqimKeZwStOEOwRzT3L5oQ"
AIVEN_EXAMPLE = "someprefix/topic-MWJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log"


def test_builds_the_aiven_example_key() -> None:
    key = segment_object_key("topic", TOPIC_ID, 7, 1234, SEGMENT_ID, Suffix.LOG, prefix="someprefix/")
    assert key == AIVEN_EXAMPLE


def test_parses_the_aiven_example_key() -> None:
    parsed = parse_segment_object_key(AIVEN_EXAMPLE)
    assert parsed == SegmentObjectKey("topic", TOPIC_ID, 7, 1234, SEGMENT_ID, Suffix.LOG, "someprefix/")


@pytest.mark.parametrize(
    ("suffix", "ending"),
    [
        (Suffix.LOG, ".log"),
        (Suffix.OFFSET_INDEX, ".index"),
        (Suffix.TIME_INDEX, ".timeindex"),
        (Suffix.TXN_INDEX, ".txnindex"),
        (Suffix.PRODUCER_SNAPSHOT, ".snapshot"),
        (Suffix.LEADER_EPOCH_CHECKPOINT, ".leader-epoch-checkpoint"),
        (Suffix.BLOOM, ".bloom"),
    ],
)
def test_suffixes_match_kafka_file_extensions(suffix: Suffix, ending: str) -> None:
    key = segment_object_key("t", TOPIC_ID, 0, 0, SEGMENT_ID, suffix)
    assert key == f"t-{TOPIC_ID}/0/{'0' * 20}-{SEGMENT_ID}{ending}"
    assert parse_segment_object_key(key).suffix is suffix


def test_suffix_accepts_its_plain_string() -> None:
    assert segment_object_key("t", TOPIC_ID, 0, 5, SEGMENT_ID, "index").endswith(".index")


@pytest.mark.parametrize("topic", ["orders-v2", "a-b-c-", "-lead", "x.y_z", "_", "a--b", "A" * 249])
def test_topics_with_dashes_dots_and_underscores_parse_from_the_right(topic: str) -> None:
    key = segment_object_key(topic, TOPIC_ID, 12, 987_654, SEGMENT_ID, Suffix.LOG, prefix="p/q/")
    parsed = parse_segment_object_key(key)
    assert (parsed.topic, parsed.partition, parsed.start_offset, parsed.prefix) == (
        topic,
        12,
        987_654,
        "p/q/",
    )


def test_ids_starting_with_dash_or_underscore_parse() -> None:
    topic_id, segment_id = "-" + TOPIC_ID[1:], "_" + SEGMENT_ID[1:]
    key = segment_object_key("t-1", topic_id, 3, 9, segment_id, Suffix.LOG)
    parsed = parse_segment_object_key(key)
    assert (parsed.topic, parsed.topic_id, parsed.segment_id) == ("t-1", topic_id, segment_id)


def test_prefix_without_slash_needs_to_be_passed() -> None:
    key = segment_object_key("orders", TOPIC_ID, 0, 0, SEGMENT_ID, Suffix.LOG, prefix="kc_")
    assert parse_segment_object_key(key).topic == "kc_orders"
    parsed = parse_segment_object_key(key, prefix="kc_")
    assert (parsed.prefix, parsed.topic) == ("kc_", "orders")


def test_keys_sort_by_offset_within_a_partition() -> None:
    offsets = [0, 9, 10, 99, 1_000_000, 2**63 - 1]
    keys = [segment_object_key("t", TOPIC_ID, 0, o, new_segment_id(), Suffix.LOG) for o in offsets]
    assert sorted(keys) == keys


def test_with_suffix_names_a_sibling_file() -> None:
    parsed = parse_segment_object_key(AIVEN_EXAMPLE)
    assert parsed.with_suffix(Suffix.TIME_INDEX).key == AIVEN_EXAMPLE.removesuffix(".log") + ".timeindex"


@pytest.mark.parametrize(
    "key",
    [
        "",
        "topic/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log",  # no topic id
        f"t-{TOPIC_ID}/7/1234-{SEGMENT_ID}.log",  # offset not 20 digits
        f"t-{TOPIC_ID}/07/{'0' * 20}-{SEGMENT_ID}.log",  # non-canonical partition
        f"t-{TOPIC_ID}/-1/{'0' * 20}-{SEGMENT_ID}.log",
        f"t-{TOPIC_ID}/7/{'0' * 20}-{SEGMENT_ID}.parquet",  # unknown suffix
        f"t-{TOPIC_ID}/7/{'0' * 20}-{SEGMENT_ID}",  # no suffix
        f"t-{TOPIC_ID}/7/{'0' * 20}-{SEGMENT_ID[:-1]}.log",  # 21-char id
        f"t-{TOPIC_ID}/7/{'9' * 20}-{SEGMENT_ID}.log",  # offset beyond a signed long
        f"t-{TOPIC_ID[:-1]}B/7/{'0' * 20}-{SEGMENT_ID}.log",  # id with non-zero padding bits
        f"t!-{TOPIC_ID}/7/{'0' * 20}-{SEGMENT_ID}.log",  # illegal topic character
        f"..-{TOPIC_ID}/7/{'0' * 20}-{SEGMENT_ID}.log",
        f"t-{TOPIC_ID}/7/{'0' * 20}-{SEGMENT_ID}.log/extra",
    ],
)
def test_malformed_keys_are_refused(key: str) -> None:
    with pytest.raises(ValueError):
        parse_segment_object_key(key)


def test_parse_with_a_prefix_the_key_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="does not start with prefix"):
        parse_segment_object_key(AIVEN_EXAMPLE, prefix="other/")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"topic": "a/b"},
        {"topic": ""},
        {"topic": "a" * 250},
        {"partition": -1},
        {"start_offset": -1},
        {"start_offset": 2**63},
        {"topic_id": "not-an-id"},
        {"segment_id": str(uuid.uuid4())},
        {"suffix": "exe"},
        {"prefix": "/abs/"},
        {"prefix": "../"},
    ],
)
def test_building_refuses_invalid_fields(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "topic": "t",
        "topic_id": TOPIC_ID,
        "partition": 0,
        "start_offset": 0,
        "segment_id": SEGMENT_ID,
        "suffix": Suffix.LOG,
        "prefix": "",
    }
    fields.update(kwargs)
    with pytest.raises(ValueError):
        segment_object_key(**fields)  # type: ignore[arg-type]


def test_kafka_uuid_text_matches_kafka() -> None:
    # the topic id of the example key in Aiven's ObjectKeyFactory documentation
    value = uuid.UUID("31627a14-74df-458c-baee-3cf065d7aa49")
    assert kafka_uuid_text(value) == TOPIC_ID
    assert parse_kafka_uuid(TOPIC_ID) == value


def test_new_segment_ids_are_valid_distinct_and_never_start_with_dash() -> None:
    ids = {new_segment_id() for _ in range(2000)}
    assert len(ids) == 2000
    for text in ids:
        assert len(text) == 22 and not text.startswith("-")
        assert kafka_uuid_text(parse_kafka_uuid(text)) == text


@given(
    topic=st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True).filter(lambda t: t not in (".", "..")),
    topic_id=st.uuids().map(kafka_uuid_text),
    partition=st.integers(0, 2**31 - 1),
    start_offset=st.integers(0, 2**63 - 1),
    segment_id=st.uuids().map(kafka_uuid_text),
    suffix=st.sampled_from(Suffix),
    prefix=st.sampled_from(["", "tiered/", "a/b-c/", "x.y/"]),
)
def test_build_then_parse_round_trips(
    topic: str, topic_id: str, partition: int, start_offset: int, segment_id: str, suffix: Suffix, prefix: str
) -> None:
    key = segment_object_key(topic, topic_id, partition, start_offset, segment_id, suffix, prefix)
    parsed = parse_segment_object_key(key)
    assert parsed == SegmentObjectKey(topic, topic_id, partition, start_offset, segment_id, suffix, prefix)
    assert parsed.key == key
