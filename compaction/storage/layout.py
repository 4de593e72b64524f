"""Where segment objects live in the store: the key layout of Aiven's tiered-storage plugin for Kafka.

    <prefix><topic>-<topicId>/<partition>/<startOffset>-<segmentId>.<suffix>

    e.g.  tiered/orders.v2-MWJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log

- `topicId` and `segmentId` are Kafka `Uuid`s in Kafka's text form: the 16 bytes as URL-safe base64
  without padding, always 22 characters from `A-Za-z0-9-_`. A fresh segment id gives every rewrite of
  a segment a new key, which is what lets the store be create-only.
- `startOffset` is the segment's base offset padded to 20 digits, like Kafka's log file names, so
  keys of one partition sort by offset. `partition` is a plain decimal.
- `prefix` is concatenated as is (Aiven's rule), so it normally ends in `/`.
- The files of one segment differ only in `suffix` (see `Suffix`).

Topic names may contain `.`, `_` and `-`, so a key is parsed from the right: the fixed-width fields
(22-character ids, 20-digit offset) are peeled off the end, and whatever precedes `<topic>-<topicId>`
after the last `/` of the prefix is the topic.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
import uuid
from dataclasses import dataclass, replace
from enum import StrEnum

from compaction.storage.base import check_prefix

UUID_TEXT_LENGTH = 22
OFFSET_DIGITS = 20
MAX_TOPIC_LENGTH = 249
_MAX_OFFSET = 2**63 - 1
_MAX_PARTITION = 2**31 - 1
_RESERVED_UUIDS = frozenset({uuid.UUID(int=0), uuid.UUID(int=1)})  # Kafka's ZERO_UUID, METADATA_TOPIC_ID

_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_UUID_TEXT = re.compile(r"[A-Za-z0-9_-]{22}")
_SEGMENT_KEY = re.compile(
    r"(?P<prefix>.*?)(?P<topic>[A-Za-z0-9._-]+)-(?P<topic_id>[A-Za-z0-9_-]{22})"
    r"/(?P<partition>0|[1-9][0-9]*)"
    r"/(?P<start_offset>[0-9]{20})-(?P<segment_id>[A-Za-z0-9_-]{22})\.(?P<suffix>[a-z-]+)",
    re.DOTALL,
)


class Suffix(StrEnum):
    """The file kinds of one remote segment, named as Kafka's and Aiven's remote storage name them."""

    LOG = "log"
    OFFSET_INDEX = "index"
    TIME_INDEX = "timeindex"
    TXN_INDEX = "txnindex"
    PRODUCER_SNAPSHOT = "snapshot"
    LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
    BLOOM = "bloom"
    INDEXES = "indexes"  # every file but the log in one object (`compaction.storage.indexes`), as kcompact writes them


def kafka_uuid_text(value: uuid.UUID) -> str:
    """Kafka's text form of a Uuid: URL-safe base64 of its 16 bytes, without padding (22 characters)."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")


@functools.lru_cache(maxsize=4096)  # every object of a segment names its segment id and topic id again
def parse_kafka_uuid(text: str) -> uuid.UUID:
    """The Uuid written as `text` in Kafka's text form; ValueError unless `text` is exactly that form."""
    if not _UUID_TEXT.fullmatch(text):
        raise ValueError(f"not a Kafka Uuid: {text!r} (need 22 URL-safe base64 characters)")
    try:
        value = uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not a Kafka Uuid: {text!r} ({exc})") from None
    if kafka_uuid_text(value) != text:
        raise ValueError(f"not a Kafka Uuid: {text!r} (non-canonical last character)")
    return value


def new_segment_id() -> str:
    """A fresh random segment id in Kafka's text form, drawn as Kafka's `Uuid.randomUuid` draws it.

    Like Kafka, never a reserved id and never one whose text starts with `-` (it would read as a flag).
    """
    while True:
        value = uuid.uuid4()
        text = kafka_uuid_text(value)
        if value not in _RESERVED_UUIDS and not text.startswith("-"):
            return text


@dataclass(frozen=True)
class SegmentObjectKey:
    """One segment object's key, split into its fields. Validated on construction (ValueError)."""

    topic: str
    topic_id: str
    partition: int
    start_offset: int
    segment_id: str
    suffix: Suffix
    prefix: str = ""

    def __post_init__(self) -> None:
        if (
            not _TOPIC.fullmatch(self.topic)
            or self.topic in (".", "..")
            or len(self.topic) > MAX_TOPIC_LENGTH
        ):
            raise ValueError(f"invalid Kafka topic name {self.topic!r}")
        parse_kafka_uuid(self.topic_id)
        parse_kafka_uuid(self.segment_id)
        if not 0 <= self.partition <= _MAX_PARTITION:
            raise ValueError(f"invalid partition {self.partition} for topic {self.topic!r}")
        if not 0 <= self.start_offset <= _MAX_OFFSET:
            raise ValueError(f"invalid start offset {self.start_offset} for {self.topic}-{self.partition}")
        object.__setattr__(self, "suffix", Suffix(self.suffix))
        check_prefix(self.prefix)

    @property
    def key(self) -> str:
        """The object key, as `segment_object_key` builds it."""
        return (
            f"{self.prefix}{self.topic}-{self.topic_id}/{self.partition}/"
            f"{self.start_offset:0{OFFSET_DIGITS}d}-{self.segment_id}.{self.suffix.value}"
        )

    def with_suffix(self, suffix: Suffix) -> SegmentObjectKey:
        """The key of another file of the same segment (e.g. its offset index)."""
        return replace(self, suffix=suffix)


def segment_object_key(
    topic: str,
    topic_id: str,
    partition: int,
    start_offset: int,
    segment_id: str,
    suffix: Suffix | str,
    prefix: str = "",
) -> str:
    """The object key of one file of a segment; see the module docstring for the layout.

    Raises:
        ValueError: an invalid topic name, id, partition, offset, suffix or prefix.
    """
    return SegmentObjectKey(topic, topic_id, partition, start_offset, segment_id, Suffix(suffix), prefix).key


def parse_segment_object_key(key: str, prefix: str | None = None) -> SegmentObjectKey:
    """Split a segment object key into its fields; the inverse of `segment_object_key`.

    With `prefix` given, the key must start with it; without, the prefix is taken to be everything up
    to the `/` before `<topic>-<topicId>` (so prefixes not ending in `/` need to be passed).

    Raises:
        ValueError: `key` does not follow the layout.
    """
    rest = key
    if prefix is not None:
        if not key.startswith(prefix):
            raise ValueError(f"segment object key {key!r} does not start with prefix {prefix!r}")
        rest = key[len(prefix) :]
    match = _SEGMENT_KEY.fullmatch(rest)
    if match is None or (prefix is not None and match["prefix"]):
        raise ValueError(
            f"not a segment object key: {key!r} "
            "(expected <prefix><topic>-<topicId>/<partition>/<20-digit offset>-<segmentId>.<suffix>)"
        )
    try:
        suffix = Suffix(match["suffix"])
    except ValueError:
        raise ValueError(f"segment object key {key!r} has unknown suffix {match['suffix']!r}") from None
    return SegmentObjectKey(
        topic=match["topic"],
        topic_id=match["topic_id"],
        partition=int(match["partition"]),
        start_offset=int(match["start_offset"]),
        segment_id=match["segment_id"],
        suffix=suffix,
        prefix=match["prefix"] if prefix is None else prefix,
    )
