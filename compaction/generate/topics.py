"""The topics of a generated log dir: names, partition counts and deterministic topic ids."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from compaction.format.checkpoints import new_topic_id
from compaction.metadata.model import TopicPartition


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 2


def iter_partitions(topics: Iterable[TopicSpec]) -> Iterator[TopicPartition]:
    """Every partition, topic by topic."""
    for topic in topics:
        for p in range(topic.partitions):
            yield TopicPartition(topic.name, p)


def seeded_topic_id(seed_text: str) -> str:
    """A topic id (Kafka's Uuid text form) drawn from a generator seeded with `seed_text`: same text, same id."""
    return new_topic_id(random.Random(seed_text).randbytes)


def topic_ids(topics: Iterable[TopicSpec], seed: int) -> dict[str, str]:
    """The topic ids `kcompact generate` gives these topics under `seed` (both modes give the same)."""
    return {t.name: seeded_topic_id(f"{seed}/{t.name}") for t in topics}
