"""The topic table's commits on S3 from more than one driver: kcompact's LogStore for `s3a://` (delta/logstore/,
`compaction.spark.delta`) puts a commit file only if it is absent (S3's `If-None-Match: *`), so a rival driver's
commit of the same version is never overwritten, which delta-spark's default for S3 allows. And each table run's
stamps stay in a session of its own (`compaction.spark.delta_table.own_session`).

The race is made deterministic with the test proxy in front of moto: when the commit file's PUT arrives, the proxy
first puts the rival's commit of that version straight into moto, then forwards the PUT.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from compaction.spark import delta as delta_jars
from compaction.spark import delta_table
from tests.moto_s3 import FAKE_AWS_ENV, REGION, make_bucket, moto_client
from tests.s3_proxy import FlakyProxy, running_proxy

BUCKET = "kcompact-logstore"
OURS = "dev.kcompact.delta.S3ConditionalLogStore"
DEFAULT = "io.delta.storage.S3SingleDriverLogStore"
RIVAL = '{"commitInfo": {"operation": "RIVAL"}}\n'

pytestmark = [pytest.mark.spark, pytest.mark.s3]


@pytest.fixture(scope="module")
def bucket_proxy(moto_endpoint: str) -> Iterator[FlakyProxy]:
    """A bucket of its own on the moto server, reached by s3a:// through a proxy (its own bucket, so the per-bucket
    endpoint this sets reaches no other test's s3a:// paths)."""
    make_bucket(moto_endpoint, BUCKET)
    yield from running_proxy(moto_endpoint)


@pytest.fixture
def s3a(spark: SparkSession, bucket_proxy: FlakyProxy, fake_aws_env: None) -> FlakyProxy:
    options = {"AWS_ENDPOINT_URL": bucket_proxy.endpoint, "AWS_REGION": REGION,
               "AWS_ACCESS_KEY_ID": FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
               "AWS_SECRET_ACCESS_KEY": FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"]}
    delta_table.configure(spark, f"s3://{BUCKET}/t", options)
    bucket_proxy.fault = lambda method, path, seen: None
    return bucket_proxy


def write(spark: SparkSession, store_class: str, uri: str, lines: list[str], overwrite: bool = False) -> None:
    """One LogStore write of `lines` to `uri`, as Delta's commit makes it."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    store = functools.reduce(getattr, store_class.split("."), jvm)(conf)
    actions = jvm.java.util.ArrayList()
    for line in lines:
        actions.add(line)
    store.write(jvm.org.apache.hadoop.fs.Path(uri), actions.iterator(), overwrite, conf)


def rival_lands_first(proxy: FlakyProxy, moto_endpoint: str, key: str) -> None:
    """When the PUT of `key` reaches the proxy, another driver's commit of it lands in moto first."""
    def fault(method: str, path: str, seen: int) -> None:
        if method == "PUT" and path.split("?")[0].endswith(key) and seen == 0:
            moto_client(moto_endpoint).put_object(Bucket=BUCKET, Key=key, Body=RIVAL.encode())

    proxy.fault = fault


def test_sessions_kcompact_launches_commit_s3a_tables_through_its_logstore(spark: SparkSession) -> None:
    assert any(p.name == delta_jars.LOGSTORE_JAR for p in delta_jars.jars()), "make delta builds the LogStore's jar"
    assert spark.conf.get("spark.delta.logStore.s3a.impl") == OURS


def test_a_commit_never_overwrites_a_rival_drivers_commit_of_the_same_version(
        spark: SparkSession, s3a: FlakyProxy, moto_endpoint: str) -> None:
    key = "race/_delta_log/00000000000000000001.json"
    rival_lands_first(s3a, moto_endpoint, key)
    with pytest.raises(Py4JJavaError) as raised:
        write(spark, OURS, f"s3a://{BUCKET}/{key}", ['{"commitInfo": {"operation": "OURS"}}'])
    assert raised.value.java_exception.getClass().getName() == "java.nio.file.FileAlreadyExistsException"
    body = moto_client(moto_endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
    assert body == RIVAL  # the rival's commit stands, whole


def test_delta_sparks_default_for_s3_would_overwrite_it(spark: SparkSession, s3a: FlakyProxy,
                                                      moto_endpoint: str) -> None:
    """Why kcompact has its own LogStore: the default checks, then puts; a rival landing in between is lost."""
    key = "race-default/_delta_log/00000000000000000001.json"
    rival_lands_first(s3a, moto_endpoint, key)
    write(spark, DEFAULT, f"s3a://{BUCKET}/{key}", ['{"commitInfo": {"operation": "OURS"}}'])
    body = moto_client(moto_endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
    assert "RIVAL" not in body


def test_absent_files_are_written_and_overwrites_still_overwrite(spark: SparkSession, s3a: FlakyProxy,
                                                                 moto_endpoint: str) -> None:
    key = "plain/_delta_log/00000000000000000000.json"
    uri = f"s3a://{BUCKET}/{key}"
    write(spark, OURS, uri, ['{"a": 1}', '{"b": 2}'])
    assert moto_client(moto_endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read() == b'{"a": 1}\n{"b": 2}\n'
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        write(spark, OURS, uri, ['{"a": 3}'])
    write(spark, OURS, uri, ['{"c": 4}'], overwrite=True)  # Delta overwrites only checkpoints' _last_checkpoint
    assert moto_client(moto_endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read() == b'{"c": 4}\n'


def test_a_delta_table_on_s3_commits_through_it(spark: SparkSession, s3a: FlakyProxy, moto_endpoint: str) -> None:
    """Delta's own writer on an s3a:// table: two appends are versions 0 and 1, each a conditional put."""
    path = f"s3a://{BUCKET}/table"
    spark.range(3).write.format("delta").save(path)
    spark.range(2).write.format("delta").mode("append").save(path)
    assert spark.read.format("delta").load(path).count() == 5
    listed = moto_client(moto_endpoint).list_objects_v2(Bucket=BUCKET, Prefix="table/_delta_log/")
    commits = sorted(o["Key"].rsplit("/", 1)[1] for o in listed["Contents"] if o["Key"].endswith(".json"))
    assert commits == ["00000000000000000000.json", "00000000000000000001.json"]


def test_a_runs_stamp_reaches_no_other_sessions_commit(spark: SparkSession, tmp_path: Path) -> None:
    """A stamp set in one run's session is not in a commit another session makes meanwhile (two table runs in one
    notebook's threads, or the notebook's own Delta writes), and the run's session keeps the parent's SQL confs,
    its Parquet codec zstd unless the parent chose one."""
    spark.conf.set("spark.sql.shuffle.partitions", "7")
    try:
        run = delta_table.own_session(spark)
        assert run.conf.get("spark.sql.shuffle.partitions") == "7"
        assert run.conf.get(delta_table.PARQUET_CODEC) == "zstd"  # the table's files, unless the session chose
        spark.conf.set(delta_table.PARQUET_CODEC, "gzip")
        assert delta_table.own_session(spark).conf.get(delta_table.PARQUET_CODEC) == "gzip"
        assert spark.conf.get(delta_table.PARQUET_CODEC) == "gzip"  # the parent's own conf is not touched
        stamp = delta_table.Stamp("kcompact-table/a", 1, {"applied": "a"})
        other = str(tmp_path / "other")
        with delta_table.stamped(run, stamp):
            spark.range(1).write.format("delta").save(other)  # another session, while the stamp is set
        log = (tmp_path / "other" / "_delta_log" / "00000000000000000000.json").read_text().splitlines()
        info = next(json.loads(line)["commitInfo"] for line in log if "commitInfo" in line)
        assert "userMetadata" not in info
        assert not any("txn" in json.loads(line) for line in log)
    finally:
        spark.conf.unset("spark.sql.shuffle.partitions")
        spark.conf.unset(delta_table.PARQUET_CODEC)
