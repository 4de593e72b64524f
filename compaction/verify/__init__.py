"""`kcompact verify`: did the compactions between two metadata table versions keep what consumers rely on?

For one partition, the latest-per-key view is read at an earlier table version (`before`, by Delta time
travel) and at a later one (`after`, the latest by default), both as a read_committed consumer sees them and
with keys ranked by the topic's `compaction.strategy` (KIP-280; offset if no config is given). Only offsets
below `before`'s log end are compared, so segments tiered in between change nothing; transactions still open
at `before` stay excluded at `after` too. Compaction may change that view in exactly one way:

- a key whose winner at `before` was a **tombstone** may vanish, if the tombstone lay below the cleaner
  offset and was dropped at or after its delete horizon (KIP-534: `now >= deleteHorizonMs`). The horizon is
  read from a batch that carried the tombstone, and "now" is the clock of the run that dropped it: the
  `event_timestamp_ms` with which that run marked the last carrying segment DELETE_SEGMENT_STARTED. Both
  come from replaced segments whose objects `kcompact gc` has not deleted yet; what cannot be proven is a
  failure, never a pass.

Everything else is a finding: a winner that changed (`changed`), vanished (`vanished`) or appeared from
nowhere (`appeared`), and any record at or above the current cleaner offset that differs at all
(`uncleaned_changed`): compaction never rewrites there.

Pure Python, no Spark: it holds one partition's latest-per-key map in memory, which suits spot checks of a
partition right after a run (and before gc removes the replaced segments the `before` version points at).
Reads only; rerunning is always safe. `view` reads, `compare` judges (pure), `report` renders the verdict.
"""

from __future__ import annotations

from compaction.config import TopicConfig
from compaction.errors import ConfigError, MissingObjectError
from compaction.metadata import table_in_store
from compaction.storage.base import ObjectStore
from compaction.verify.compare import Finding, KeyProblem, compare_views, key_text, tombstone_drop_refusal
from compaction.verify.report import VerifyReport
from compaction.verify.view import (
    PartitionView,
    Ranking,
    TombstoneEvidence,
    log_end_offset,
    read_view,
    tombstone_evidence,
)

__all__ = [
    "Finding",
    "KeyProblem",
    "PartitionView",
    "Ranking",
    "TombstoneEvidence",
    "VerifyReport",
    "compare_views",
    "key_text",
    "log_end_offset",
    "read_view",
    "tombstone_drop_refusal",
    "tombstone_evidence",
    "verify_partition",
]


def verify_partition(
    store: ObjectStore,
    topic: str,
    partition: int,
    before_version: int,
    after_version: int | None = None,
    *,
    config: TopicConfig | None = None,
) -> VerifyReport:
    """Compare the partition's latest-per-key view at `before_version` with `after_version` (latest if None).

    Args:
        config: the topic's config: its compaction.strategy ranks the records of a key (offset if None).

    Raises:
        ConfigError: `before_version` is newer than `after_version`, or the `before` view can no longer be
            read because gc deleted the objects of its (since replaced) segments.
        MetadataVersionNotFoundError: a version that does not exist.
        CorruptInputError: a live object of `after` is missing or malformed.
    """
    table = table_in_store(store)
    after_snap = table.partition_snapshot(topic, partition, after_version)
    if before_version > after_snap.version:
        raise ConfigError(f"--before {before_version} is newer than --after {after_snap.version}")
    before_snap = table.partition_snapshot(topic, partition, before_version)
    ranking = Ranking.of(config)
    below, cleaned = log_end_offset(before_snap), after_snap.lineage.current
    try:
        before = read_view(store, before_snap, ranking, below=below, tail_from=cleaned)
    except MissingObjectError as exc:
        raise ConfigError(
            f"{topic}-{partition} at metadata version {before_version} can no longer be read ({exc}): gc deleted "
            "its replaced segments; verify within file.delete.delay.ms of a run, or pass a later --before"
        ) from exc
    after = read_view(store, after_snap, ranking, below=below, tail_from=cleaned, also_unstable=before.unstable)
    vanished = {k: r for k, r in before.latest.items() if k not in after.latest and r.value is None}
    evidence = tombstone_evidence(store, after_snap, vanished)
    problems, expired = compare_views(before, after, evidence)
    return VerifyReport(
        topic=topic,
        partition=partition,
        before_version=before_snap.version,
        after_version=after_snap.version,
        strategy=ranking.strategy.value,
        log_end_offset=below,
        cleaner_offset_before=before.cleaner_offset,
        cleaner_offset_after=after.cleaner_offset,
        keys_before=len(before.latest),
        keys_after=len(after.latest),
        expired_tombstones=tuple(expired),
        problems=tuple(problems),
    )
