"""kcompact: Kafka log compaction for segments in object storage, as a Spark batch job.

The public API, for notebooks and orchestrators (the CLI and `jobs/` use the same functions):

    run = compaction.plan(spark, "s3://bucket/tier", "conf/kcompact.yaml")  # frozen plan: reads metadata only
    staged = compaction.stage(spark, run)          # rewrite + upload on Spark; only compact,delete expiry visible
    outcomes = compaction.commit(staged)           # one atomic metadata commit, each partition checked alone
    report = compaction.compact(spark, store, config)  # all three; a RunReport, report.to_dict() is the JSON
    compaction.expire(store, config)               # retention of compact,delete topics (no Spark)

Every function takes a store as a URI or path (local directory, `s3://bucket/prefix`) or an open `ObjectStore`,
and a config as a YAML path or a loaded `KcompactConfig`; anything else is a `TypeError`. Every step is safe to
rerun. pyspark is imported only when a function needs it.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

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

    from compaction.config import KcompactConfig
    from compaction.gc import GcReport
    from compaction.retention import RetentionReport
    from compaction.run.commit import PartitionOutcome
    from compaction.run.plan import RunPlan
    from compaction.run.report import RunReport
    from compaction.run.stage import StagedRun
    from compaction.storage import ObjectStore
    from compaction.topic_table import TableReport
    from compaction.verify import VerifyReport

    Store = str | ObjectStore
    Config = str | KcompactConfig


def read_partition(spark: SparkSession, store: Store, topic: str, partition: int, **options: Any) -> DataFrame:
    """A partition's consumer view as a DataFrame (see `compaction.spark.read.read_partition`)."""
    from compaction.arguments import as_store
    from compaction.spark.read import read_partition as _read

    return _read(spark, as_store(store), topic, partition, **options)


def plan(spark: SparkSession | None, store: Store, config: Config, now_ms: int | None = None,
         **options: Any) -> RunPlan:
    """Plan a run (`compaction.run.plan.plan`). `spark` is accepted for symmetry: planning reads only metadata.

    Options: topics, partition, force, disk_budget_bytes. `now_ms` defaults to the wall clock, read once here.
    """
    from compaction.arguments import as_config, as_store
    from compaction.run.plan import plan as _plan

    return _plan(as_store(store), as_config(config), now_ms, **options)


def stage(spark: SparkSession, run: RunPlan) -> StagedRun:
    """Rewrite and upload the eligible partitions of `run` (`compaction.run.stage.stage`); of the compaction nothing
    becomes visible. The retention of its compact,delete partitions (`run.retention`) is committed first."""
    from compaction.run.stage import stage as _stage

    return _stage(spark, run)


def commit(staged: StagedRun, *, raise_on_superseded: bool = True) -> list[PartitionOutcome]:
    """Commit every staged partition (`compaction.run.commit.commit`) and return the outcomes.

    By default it then raises the first `FencedError`/`CommitConflictError` if a partition was superseded (the
    error's `outcomes` holds them all); the other partitions are committed regardless. Corrupt (quarantined)
    partitions never raise: they are in the outcomes with their error. Rerunning is safe.
    """
    from compaction.run.commit import commit as _commit

    return _commit(staged, raise_on_superseded=raise_on_superseded)


def compact(spark: SparkSession, store: Store, config: Config, now_ms: int | None = None,
            **options: Any) -> RunReport:
    """plan → stage → commit; returns the run report (`compaction.run.report.RunReport`: typed fields, and
    `report.to_dict()` is the JSON report the CLI writes). Superseded partitions are reported (exit code 4 in the
    report), not raised, so a scheduled run always returns its report."""
    from dataclasses import replace

    from compaction.arguments import as_store
    from compaction.metadata import table_requests
    from compaction.run.report import requests_since, run_report

    opened = as_store(store)
    before = table_requests(opened)
    run = plan(spark, opened, config, now_ms, **options)
    staged = stage(spark, run)
    return replace(run_report(staged, commit(staged, raise_on_superseded=False)),
                   metadata_requests=requests_since(before, opened))


def table(spark: SparkSession, store: Store, config: Config, topic: str, table_uri: str, now_ms: int | None = None,
          *, rebuild: bool = False, dry_run: bool = False) -> TableReport:
    """Bring the Delta table at `table_uri` (a local path or s3://) up to date with `topic`'s latest value per key
    (`compaction.table`): incremental, exactly once, safe to rerun; `report.to_dict()` is the JSON report.

    Raises `CommitConflictError` (exit 4, rerun) if a concurrent run applied the same partitions first.
    """
    import time

    from compaction.arguments import as_config, as_store
    from compaction.topic_table import Location, update_table

    opened = as_store(store)
    clock = int(time.time() * 1000) if now_ms is None else now_ms
    location = Location.parse(table_uri, endpoint_url=opened.spec.endpoint_url, region=opened.spec.region)
    return update_table(spark, opened, as_config(config), topic, location, clock, rebuild=rebuild, dry_run=dry_run)


def verify(store: Store, topic: str, partition: int, before_version: int, after_version: int | None = None, *,
           config: Config | None = None, spark: SparkSession | None = None) -> VerifyReport:
    """Compare a partition's latest record per key at two metadata versions (`compaction.verify`): on Spark with
    a flat driver when `spark` is given, else on this process (the reference path)."""
    from compaction.arguments import as_config, as_store
    from compaction.verify import verify_partition

    topic_config = None if config is None else as_config(config).for_topic(topic)
    return verify_partition(as_store(store), topic, partition, before_version, after_version, config=topic_config,
                            spark=spark)


def gc(store: Store, config: Config | None = None, now_ms: int | None = None, *, dry_run: bool = False) -> GcReport:
    """Delete replaced and orphaned objects after their grace (`compaction.gc.collect_garbage`); each topic's
    grace is its file.delete.delay.ms from `config` (Kafka's default without one)."""
    import time

    from compaction.arguments import as_config, as_store
    from compaction.gc import collect_garbage
    from compaction.metadata import table_in_store

    opened = as_store(store)
    loaded = None if config is None else as_config(config)
    clock = int(time.time() * 1000) if now_ms is None else now_ms
    kwargs: dict[str, Any] = {}
    if loaded is not None:
        kwargs["grace_ms"] = lambda topic: loaded.for_topic(topic).file_delete_delay_ms
    return collect_garbage(opened, table_in_store(opened), clock, dry_run=dry_run, **kwargs)


def expire(store: Store, config: Config, now_ms: int | None = None, *, topics: list[str] | None = None,
           partition: int | None = None, dry_run: bool = False) -> RetentionReport:
    """Apply retention.ms / retention.bytes to the `compact,delete` topics of `config` (`compaction.retention`):
    their expired segments go to DELETE_SEGMENT_STARTED in one commit for every partition; `gc` deletes the
    objects."""
    import time

    from compaction.arguments import as_config, as_store
    from compaction.metadata import table_in_store
    from compaction.retention import expire as expire_segments

    clock = int(time.time() * 1000) if now_ms is None else now_ms
    return expire_segments(table_in_store(as_store(store)), as_config(config), clock, topics=topics,
                           partition=partition, dry_run=dry_run)


__all__ = [
    "CommitConflictError",
    "ConfigError",
    "CorruptInputError",
    "FencedError",
    "KcompactError",
    "RetryableError",
    "commit",
    "compact",
    "expire",
    "gc",
    "plan",
    "read_partition",
    "stage",
    "table",
    "verify",
]


class _Api(types.ModuleType):
    """The package `compaction`, whose functions `gc` and `verify` share their names with subpackages.

    Python's import system sets a subpackage as an attribute of its parent when it is first imported, so the first
    `import compaction.gc` (which `compaction.gc(...)` itself does) would replace the function by the module, and a
    notebook's second call would fail with "'module' object is not callable". The functions keep their names; the
    subpackages stay importable by their full names (`from compaction.gc import collect_garbage`).
    """

    def __setattr__(self, name: str, value: object) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


_SHADOWED = frozenset({"gc", "verify"})
sys.modules[__name__].__class__ = _Api
