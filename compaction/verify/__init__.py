"""`kcompact verify`: did the compactions between two metadata table versions keep what consumers rely on?

For one partition, the latest-per-key view is read at an earlier table version (`before`, by Delta time
travel) and at a later one (`after`, the latest by default), both as a read_committed consumer sees them and
with keys ranked by the topic's `compaction.strategy` (KIP-280; offset if no config is given). Only offsets
below `before`'s log end are compared, so segments tiered in between change nothing; transactions still open
at `before` stay excluded at `after` too. Unlike a consumer (`kcompact read`), the views do not stop at the last
stable offset: only an open transaction's own records are left out, so the committed records after it, which
compaction must leave alone too, are compared as well. Compaction may change that view in exactly one way:

- a key whose winner at `before` was a **tombstone** may vanish, if the tombstone lay below the cleaner
  offset and was dropped at or after its delete horizon (KIP-534: `now >= deleteHorizonMs`). The horizon is
  read from a batch that carried the tombstone, and "now" is the clock of the run that dropped it: the
  `event_timestamp_ms` with which that run marked the last carrying segment DELETE_SEGMENT_STARTED. Both
  come from replaced segments whose objects `kcompact gc` has not deleted yet; what cannot be proven is a
  failure, never a pass.

Retention (`kcompact expire`), for a topic whose config (`--config`) says compact,delete, may change it in one more:
a key whose winner at `before` lay below `after`'s log start expired with its segment (what `after` holds of it is
not judged), and the region compared record for record starts at that log start if it is above the cleaner offset.
Without that config a moved log start is records lost like any other.

Everything else is a finding: a winner that changed (`changed`), vanished (`vanished`) or appeared from
nowhere (`appeared`), and any record at or above the current cleaner offset that differs at all
(`uncleaned_changed`): compaction never rewrites there.

Two paths give the same report. Without a SparkSession, the readable reference: it holds one partition's
latest-per-key map on the driver (`view` reads, `compare` judges, pure), which suits spot checks of small
partitions. With one (`spark=`), `compaction.spark.verify` reads the segments on the executors and compares
on Spark (`columnar` is what its tasks compute), so the driver only holds the listed problems, whatever the
partition's size. Reads only; rerunning is always safe. `report` renders the verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from compaction.config import TopicConfig
from compaction.errors import MissingObjectError
from compaction.storage.base import ObjectStore
from compaction.strategies.ranking import Ranking
from compaction.verify.compare import (
    Finding,
    KeyProblem,
    compare_views,
    judge_latest,
    judge_uncleaned,
    key_text,
    tombstone_drop_refusal,
)
from compaction.verify.report import VerifyReport
from compaction.verify.span import MAX_LISTED, VerifySpan, verify_span
from compaction.verify.view import (
    PartitionView,
    TombstoneEvidence,
    log_end_offset,
    read_view,
    tombstone_evidence,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "MAX_LISTED",
    "Finding",
    "KeyProblem",
    "PartitionView",
    "Ranking",
    "TombstoneEvidence",
    "VerifyReport",
    "VerifySpan",
    "compare_views",
    "judge_latest",
    "judge_uncleaned",
    "key_text",
    "log_end_offset",
    "read_view",
    "tombstone_drop_refusal",
    "tombstone_evidence",
    "verify_partition",
    "verify_span",
]


def verify_partition(
    store: ObjectStore,
    topic: str,
    partition: int,
    before_version: int,
    after_version: int | None = None,
    *,
    config: TopicConfig | None = None,
    spark: SparkSession | None = None,
    max_listed: int = MAX_LISTED,
) -> VerifyReport:
    """Compare the partition's latest-per-key view at `before_version` with `after_version` (latest if None).

    Args:
        config: the topic's config: its compaction.strategy ranks the records of a key (offset if None).
        spark: compare on Spark (executors read the segments; the driver's memory does not grow with the
            partition); None: the reference path, on the driver. Both give the same report.
        max_listed: how many problems and dropped tombstones the report lists (it counts them all).

    Raises:
        ConfigError: `before_version` is newer than `after_version`, or the `before` view can no longer be
            read because gc deleted the objects of its (since replaced) segments.
        MetadataVersionNotFoundError: a version that does not exist.
        CorruptInputError: a live object of `after` is missing or malformed.
    """
    span = verify_span(store, topic, partition, before_version, after_version, config)
    if spark is not None:
        from compaction.spark.verify import verify_on_spark

        return verify_on_spark(spark, store, span, max_listed=max_listed)
    return _verify_on_driver(store, span, max_listed)


def _verify_on_driver(store: ObjectStore, span: VerifySpan, max_listed: int) -> VerifyReport:
    """The reference path: both views as maps on the driver, judged by `compare_views`."""
    below, cleaned = span.log_end_offset, span.tail_from
    try:
        before = read_view(store, span.before, span.ranking, below=below, tail_from=cleaned)
    except MissingObjectError as exc:
        raise span.unreadable(exc) from exc
    after = read_view(store, span.after, span.ranking, below=below, tail_from=cleaned, also_unstable=before.unstable)
    vanished = {k: r for k, r in before.latest.items()
                if k not in after.latest and r.value is None and r.offset >= span.log_start_offset}
    evidence = tombstone_evidence(store, span.after, vanished)
    problems, expired = compare_views(before, after, evidence, span.log_start_offset)
    return span.report(keys_before=len(before.latest), keys_after=len(after.latest), problems=problems[:max_listed],
                       problem_count=len(problems), expired=expired[:max_listed], expired_count=len(expired))
