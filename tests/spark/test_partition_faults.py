"""A store failure in one partition costs that partition, not the run: compaction through the flaky S3 proxy.

Three partitions are tiered to moto without faults; the compaction run then goes through the proxy of
`tests/s3_proxy.py`, which breaks one partition's requests for good (every attempt answers 503 SlowDown, so
the store's retries, and delta-rs's, run out):

- its segment objects, read by the Spark scan tasks on the executors;
- its metadata rows, read by the driver when staging takes the partition, after another commit landed since the
  run was planned (else staging takes the rows the plan read, and reads none);
- its producer snapshots and transaction indexes, read by the driver while planning.

Each way that partition fails with `TransientStoreError` (kept in the report, exit code 4: rerun), nothing of
it changes, and the other two commit with the latest record per key unchanged. A rerun without the fault
compacts it too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction.config import KcompactConfig, TopicConfig
from compaction.errors import ExitCode
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import acquire_fencing_epoch, table_in_store
from compaction.run.commit import commit
from compaction.run.plan import plan
from compaction.run.report import run_report
from compaction.run.stage import stage
from compaction.storage import ObjectStore
from compaction.tier import tier_logdir
from tests.factories import TOPIC_ID
from tests.latest_view import views
from tests.moto_s3 import FAST_RETRY
from tests.s3_proxy import Fault, FlakyProxy, direct, fast_delta_retries, spec_through

NOW = 1_800_000_000_000
DAY = 86_400_000
PARTITIONS = [("orders", 0), ("orders", 1), ("users", 0)]
BROKEN = ("orders", 1)
CONFIG = KcompactConfig(defaults=TopicConfig.from_kafka({"cleanup.policy": "compact",
                                                         "min.cleanable.dirty.ratio": "0.01"}))

pytestmark = [pytest.mark.s3, pytest.mark.spark]


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("partition-faults")
    generate_logdir(root, WorkloadSpec(topics=(TopicSpec("orders", 2), TopicSpec("users", 1)),
                                       records_per_partition=1500, keys=120, segment_bytes=16 * 1024, seed=5))
    return root


@pytest.fixture
def store(proxy: FlakyProxy, moto_endpoint: str, fake_aws_env: None, workers_see_fake_credentials: None,
          logdir: Path, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    """A store reached through the proxy, tiered (without faults) ten days before the run."""
    store = spec_through(proxy, FAST_RETRY).open()
    fast_delta_retries(store, monkeypatch)
    tier_logdir(logdir, store, table_in_store(store, create=True), NOW - 10 * DAY)
    return store


def run_with_fault(spark: SparkSession, store: ObjectStore, proxy: FlakyProxy, fault: Fault,
                   planning: bool = False, moved: bool = False) -> dict:
    """Plan (with `fault` on if `planning`, else without), then stage and commit with `fault` on (after another
    partition's commit if `moved`); the report."""
    if planning:
        proxy.fault = fault
    run = plan(store, CONFIG, NOW)
    eligible = {(p.topic, p.partition) for p in run.plan.eligible}
    assert eligible == (set(PARTITIONS) - {BROKEN} if planning else set(PARTITIONS))
    if moved:  # a commit to a partition of no run: staging reads the run's partitions afresh
        acquire_fencing_epoch(table_in_store(store), "elsewhere", 0, "another run", NOW, topic_id=TOPIC_ID)
    proxy.fault = fault
    staged = stage(spark, run)
    report = run_report(staged, commit(staged)).to_dict()
    proxy.fault = lambda method, path, seen: None
    return report


def live_ids(store: ObjectStore) -> dict[tuple[str, int], list[str]]:
    table = table_in_store(store)
    return {tp: [s.segment_id for s in table.live_segments(*tp)] for tp in PARTITIONS}


def check_only_broken_failed(report: dict, store: ObjectStore, moto_endpoint: str,
                             live_before: dict[tuple[str, int], list[str]], before: dict) -> None:
    clean = direct(store, moto_endpoint)
    assert [(f["topic"], f["partition"], f["error_type"], f["exit_code"]) for f in report["failed"]] == [
        (*BROKEN, "TransientStoreError", ExitCode.RETRYABLE)], report["failed"]
    assert report["exit_code"] == ExitCode.RETRYABLE
    # the store's 503 SlowDown, as boto3 or delta-rs name it, or as Arrow's S3 client (the metadata table's data
    # files are read through it: compaction.metadata.table.read_rows) does
    error = report["failed"][0]["error"]
    assert "SlowDown" in error or "SERVICE_UNAVAILABLE" in error, error
    committed = {(p["topic"], p["partition"]) for p in report["partitions"]}
    assert committed == set(PARTITIONS) - {BROKEN}
    live_after = live_ids(clean)
    assert live_after[BROKEN] == live_before[BROKEN], "nothing of the failed partition was swapped"
    assert all(live_after[tp] != live_before[tp] for tp in committed)
    assert views(clean, PARTITIONS) == before, "latest record per key unchanged"


def rerun_converges(spark: SparkSession, store: ObjectStore, moto_endpoint: str, before: dict) -> None:
    report = run_report(staged := stage(spark, plan(store, CONFIG, NOW + 1)), commit(staged)).to_dict()
    assert report["failed"] == [] and {(p["topic"], p["partition"]) for p in report["partitions"]} == {BROKEN}
    assert views(direct(store, moto_endpoint), PARTITIONS) == before


def segment_reads_of(tp: tuple[str, int], *suffixes: str) -> Callable[[str, str], bool]:
    """Whether a request reads one of `tp`'s segment objects whose key ends with one of `suffixes`."""
    topic, partition = tp
    return lambda method, path: (method == "GET" and "_kcompact" not in path and f"/{topic}-" in path
                                 and f"/{partition}/" in path and path.split("?")[0].endswith(suffixes))


_METADATA_ROWS = f"_kcompact_metadata/topic%3D{BROKEN[0]}/partition%3D{BROKEN[1]}/"
BROKEN_READS: dict[str, tuple[Callable[[str, str], bool], bool]] = {
    # the reads that keep failing, and whether they are the planner's (else staging's, or its Spark tasks'); for
    # staging's read of the rows, another partition's commit lands after the plan
    "scan-task-segments": (segment_reads_of(BROKEN, ".log"), False),
    "staging-metadata-rows": (lambda method, path: method == "GET" and _METADATA_ROWS in path, False),
    "plan-producer-state": (segment_reads_of(BROKEN, ".indexes", ".snapshot", ".txnindex"), True),
}


@pytest.mark.parametrize("reads", list(BROKEN_READS))
def test_reads_that_keep_failing_fail_their_partition_only(
    spark: SparkSession, store: ObjectStore, proxy: FlakyProxy, moto_endpoint: str, reads: str
) -> None:
    before = views(direct(store, moto_endpoint), PARTITIONS)
    live_before = live_ids(direct(store, moto_endpoint))
    hits, planning = BROKEN_READS[reads]
    report = run_with_fault(spark, store, proxy, lambda m, p, seen: (503, "SlowDown") if hits(m, p) else None,
                            planning=planning, moved=reads == "staging-metadata-rows")
    assert proxy.injected, "the fault was reached"
    check_only_broken_failed(report, store, moto_endpoint, live_before, before)
    rerun_converges(spark, store, moto_endpoint, before)


def test_staging_and_the_commit_read_no_partition_rows_when_no_other_commit_landed(
    spark: SparkSession, store: ObjectStore, proxy: FlakyProxy, moto_endpoint: str
) -> None:
    """The plan read every partition's rows; with no other commit since, taking the partitions and committing their
    swaps reads none of the table's data files again (each commit is the next version: `known_reader`), and the
    run is the same run."""
    before = views(direct(store, moto_endpoint), PARTITIONS)
    rows_read: list[str] = []

    def record(method: str, path: str, seen: int) -> None:
        if method == "GET" and "_kcompact_metadata/topic%3D" in path:
            rows_read.append(path)
        return None

    report = run_with_fault(spark, store, proxy, record)
    assert rows_read == []
    assert report["failed"] == [] and {(p["topic"], p["partition"]) for p in report["partitions"]} == set(PARTITIONS)
    assert views(direct(store, moto_endpoint), PARTITIONS) == before
