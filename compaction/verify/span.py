"""What one `kcompact verify` compares: a partition at two metadata table versions, and the bounds that apply.

Read once on the driver from the metadata table (Delta time travel); both the reference path and the Spark
path start from it and end in its `report`, so they check the same offsets under the same rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compaction.config import TopicConfig
from compaction.errors import ConfigError, MissingObjectError, UnknownPartitionError
from compaction.metadata import PartitionSnapshot, table_in_store
from compaction.storage.base import ObjectStore
from compaction.strategies.ranking import Ranking
from compaction.verify.compare import KeyProblem
from compaction.verify.report import VerifyReport
from compaction.verify.view import log_end_offset

MAX_LISTED = 10_000
"""Problems (and dropped tombstones) a report lists by default; it counts them all."""


@dataclass(frozen=True)
class VerifySpan:
    """The partition at `before` and `after`, compared below `log_end_offset` (`before`'s log end); records at
    or above `tail_from` (`after`'s cleaner offset, or its log start if retention moved that higher) must be
    identical, and a key whose winner at `before` lay below `log_start_offset` expired with retention.

    `expires`: the topic's config says compact,delete, so retention may have moved the log start; for any other
    topic a moved log start is lost records like any other."""

    topic: str
    partition: int
    before: PartitionSnapshot
    after: PartitionSnapshot
    ranking: Ranking
    expires: bool = False

    @property
    def log_end_offset(self) -> int:
        return log_end_offset(self.before)

    @property
    def cleaner_offset(self) -> int:
        return self.after.lineage.current

    @property
    def log_start_offset(self) -> int:
        """`after`'s log start, below which `kcompact expire` (retention.ms / retention.bytes) removed everything; 0
        unless the topic `expires`."""
        return (_log_start(self.after) or 0) if self.expires else 0

    @property
    def tail_from(self) -> int:
        """Where the region compaction never rewrites begins, of what retention left."""
        return max(self.cleaner_offset, self.log_start_offset)

    def unreadable(self, exc: MissingObjectError) -> ConfigError:
        """The usage error for a `before` view whose objects gc deleted: never a pass."""
        return ConfigError(
            f"{self.topic}-{self.partition} at metadata version {self.before.version} can no longer be read "
            f"({exc}): gc deleted its replaced segments; verify within file.delete.delay.ms of a run, or pass a "
            "later --before"
        )

    def report(
        self, *, keys_before: int, keys_after: int, problems: Sequence[KeyProblem], problem_count: int,
        expired: Sequence[bytes], expired_count: int,
    ) -> VerifyReport:
        return VerifyReport(
            topic=self.topic,
            partition=self.partition,
            before_version=self.before.version,
            after_version=self.after.version,
            strategy=self.ranking.strategy.value,
            log_end_offset=self.log_end_offset,
            log_start_offset=self.log_start_offset,
            cleaner_offset_before=self.before.lineage.current,
            cleaner_offset_after=self.cleaner_offset,
            keys_before=keys_before,
            keys_after=keys_after,
            expired_tombstones=tuple(expired),
            problems=tuple(problems),
            problem_count=problem_count,
            expired_tombstone_count=expired_count,
        )


def verify_span(
    store: ObjectStore, topic: str, partition: int, before_version: int, after_version: int | None,
    config: TopicConfig | None,
) -> VerifySpan:
    """Read both snapshots. Raises ConfigError if `before_version` is newer than `after_version`,
    UnknownPartitionError if the metadata table holds no row of the partition at `after_version` or `before_version`
    (a misspelt topic or partition, or a version before it was tiered, verifies nothing: it must not pass),
    and MetadataVersionNotFoundError for a version that does not exist."""
    table = table_in_store(store, write=False)  # verify only reads
    after = table.partition_snapshot(topic, partition, after_version)
    if not after.exists:
        raise UnknownPartitionError(f"the metadata table of {store.uri} holds no partition {topic}-{partition} at "
                                    f"version {after.version}: nothing to verify (check the topic and the partition)")
    if before_version > after.version:
        raise ConfigError(f"--before {before_version} is newer than --after {after.version}")
    before = table.partition_snapshot(topic, partition, before_version)
    if not before.exists:
        raise UnknownPartitionError(f"the metadata table of {store.uri} holds no partition {topic}-{partition} at "
                                    f"version {before.version}, the --before version: nothing to compare (use a "
                                    "version at or after its first tiering, e.g. a run report's "
                                    "metadata_version_planned)")
    return VerifySpan(topic, partition, before, after, Ranking.of(config),
                      expires=config is not None and config.has_retention)


def _log_start(p: PartitionSnapshot) -> int | None:
    return p.live_segments[0].start_offset if p.live_segments else None
