"""KIP-280's winner rule, the reference: each record's rank, and per key the record of greatest rank.

A record's rank is `(has_version, version, offset)`, compared left to right; a key's winner is its record of
greatest rank. Ranks end in the offset, so they are unique within a log and no tie is left to break:

- `offset`: (0, 0, offset): the highest offset wins (Kafka's behaviour);
- `timestamp`: (1, timestamp, offset): the highest timestamp wins (LogAppendTime batches: the batch's max
  timestamp, as consumers see it), equal timestamps go to the higher offset;
- `header`: (1, value, offset) where value is the **last** occurrence of the configured header (exact,
  case-sensitive name) decoded as an 8-byte big-endian signed long. A value of any other length, a null value or
  no such header counts as missing, (0, 0, offset): a record that has the header beats one that hasn't, and among
  records without it (or with equal values) the higher offset wins.

Tombstones compete like any record. This module is the rule written once, record by record. The other forms apply
it where the data is, and are tested against it: `compaction.spark.ranking` (the Spark expression: the rank
columns of a DataFrame and the aggregate that keeps the greatest), and the executor's vectorized path
(`compaction.strategies.winner.ranks` over a scan's Arrow columns, `compaction.strategies.keyfold` folding them).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, NamedTuple, Protocol, TypeVar

from compaction.config import CompactionStrategy

if TYPE_CHECKING:
    from compaction.config import TopicConfig

VERSION_BYTES = 8
"""A header version is an 8-byte big-endian signed long; any other length counts as missing."""

RANK_FIELDS = ("has_version", "version", "offset")
"""The rank's fields, most significant first: the column names every form of the rule uses."""


class Rank(NamedTuple):
    has_version: int
    version: int
    offset: int


class _Header(Protocol):
    @property
    def key(self) -> str: ...

    @property
    def value(self) -> bytes | None: ...


class RankedRecord(Protocol):
    """What the rule reads of a record (`compaction.format.batch.Record` has it)."""

    @property
    def offset(self) -> int: ...

    @property
    def timestamp(self) -> int: ...

    @property
    def headers(self) -> Sequence[_Header]: ...


def header_version(value: bytes | None) -> tuple[int, int]:
    """(has_version, version) of a version header's value (None: no such header, or a null value)."""
    if value is None or len(value) != VERSION_BYTES:
        return 0, 0
    return 1, int.from_bytes(value, "big", signed=True)


@dataclass(frozen=True)
class Ranking:
    """A topic's strategy (and its header), ranking one record at a time."""

    strategy: CompactionStrategy = CompactionStrategy.OFFSET
    header: str | None = None

    @classmethod
    def of(cls, config: TopicConfig | None) -> Ranking:
        if config is None:
            return cls()
        return cls(config.compaction_strategy, config.compaction_strategy_header)

    def rank(self, record: RankedRecord) -> Rank:
        """The record's rank: the greatest of a key's ranks wins."""
        if self.strategy is CompactionStrategy.OFFSET:
            return Rank(0, 0, record.offset)
        if self.strategy is CompactionStrategy.TIMESTAMP:
            return Rank(1, record.timestamp, record.offset)
        values = [h.value for h in record.headers if h.key == self.header]
        return Rank(*header_version(values[-1] if values else None), record.offset)


K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass
class Winners(Generic[K, T]):
    """Per key the item of greatest rank offered so far."""

    best: dict[K, tuple[Rank, T]] = field(default_factory=dict)

    def offer(self, key: K, rank: Rank, item: T) -> None:
        held = self.best.get(key)
        if held is None or rank > held[0]:
            self.best[key] = (rank, item)

    def items(self) -> dict[K, T]:
        """Each key's winning item."""
        return {key: item for key, (_rank, item) in self.best.items()}


def best_per_key(rows: Iterable[tuple[K, Rank, T]]) -> dict[K, T]:
    """Per key the item of greatest rank among (key, rank, item) rows."""
    winners: Winners[K, T] = Winners()
    for key, rank, item in rows:
        winners.offer(key, rank, item)
    return winners.items()


__all__ = ["RANK_FIELDS", "VERSION_BYTES", "Rank", "RankedRecord", "Ranking", "Winners", "best_per_key",
           "header_version"]
