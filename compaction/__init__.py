"""kcompact: Kafka log compaction for segments in object storage, as a Spark batch job.

The public API, for notebooks and orchestrators (the CLI and `jobs/` use the same functions):

    run = compaction.plan(spark, store, config)     # frozen plan: reads the metadata table only
    staged = compaction.stage(spark, run)           # rewrite + upload on Spark; nothing visible yet
    outcomes = compaction.commit(staged)            # one atomic metadata commit per partition
    report = compaction.compact(spark, store, config)  # all three, returns the run report

Every step is safe to rerun. pyspark is imported only when a function needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The planner package is imported first so that the `plan` function below, not the package, is the attribute
# `compaction.plan`; later imports of its submodules find it in sys.modules and leave the attribute alone.
import compaction.plan as _planner  # noqa: F401
from compaction.errors import (
    CommitConflictError,
    ConfigError,
    CorruptInputError,
    FencedError,
    KcompactError,
    RetryableError,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from compaction.cleaner import PartitionOutcome, RunPlan, StagedRun
    from compaction.config import KcompactConfig
    from compaction.storage import ObjectStore


def read_partition(spark: SparkSession, store: ObjectStore, topic: str, partition: int, **options: Any) -> DataFrame:
    """A partition's consumer view as a DataFrame (see `compaction.spark.read.read_partition`)."""
    from compaction.spark.read import read_partition as _read

    return _read(spark, store, topic, partition, **options)


def plan(spark: SparkSession | None, store: ObjectStore, config: KcompactConfig, now_ms: int | None = None,
         **options: Any) -> RunPlan:
    """Plan a run (`compaction.cleaner.plan`). `spark` is accepted for symmetry: planning reads only metadata.

    Options: topics, partition, force. `now_ms` defaults to the wall clock, read once here.
    """
    from compaction.cleaner import plan as _plan

    return _plan(store, config, now_ms, **options)


def stage(spark: SparkSession, run: RunPlan) -> StagedRun:
    """Rewrite and upload the eligible partitions of `run` (`compaction.cleaner.stage`); nothing becomes visible."""
    from compaction.cleaner import stage as _stage

    return _stage(spark, run)


def commit(staged: StagedRun) -> list[PartitionOutcome]:
    """Commit every staged partition, then raise the first `FencedError`/`CommitConflictError` if any was superseded.

    The other partitions are committed regardless; the raised error carries `.outcomes` (all of them). Corrupt
    (quarantined) partitions do not raise: they are in the outcomes with their error. Rerunning is safe.
    """
    from compaction.cleaner import commit as _commit

    outcomes = _commit(staged)
    for outcome in outcomes:
        if outcome.error_type in ("FencedError", "CommitConflictError"):
            error_type = FencedError if outcome.error_type == "FencedError" else CommitConflictError
            error = error_type(f"{outcome.topic}-{outcome.partition}: {outcome.error}")
            error.outcomes = outcomes  # type: ignore[attr-defined]
            raise error
    return outcomes


def compact(spark: SparkSession, store: ObjectStore, config: KcompactConfig, now_ms: int | None = None,
            **options: Any) -> dict[str, Any]:
    """plan → stage → commit; returns the run report (`compaction.report.run_report`)."""
    from compaction.cleaner import commit as _commit
    from compaction.cleaner import stage as _stage
    from compaction.report import run_report

    run = plan(spark, store, config, now_ms, **options)
    staged = _stage(spark, run)
    return run_report(staged, _commit(staged))


__all__ = [
    "CommitConflictError",
    "ConfigError",
    "CorruptInputError",
    "FencedError",
    "KcompactError",
    "RetryableError",
    "commit",
    "compact",
    "plan",
    "read_partition",
    "stage",
]
