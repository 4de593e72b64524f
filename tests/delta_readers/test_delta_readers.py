"""delta-spark reads kcompact's two Delta tables as delta-rs does: the metadata table and a topic table (`kcompact
table`), through hadoop-aws's `s3a://` from S3 (the moto server of `tests/moto_s3.py`). S3 is the store where the two
differ most (a commit is a conditional PUT there, and delta-spark reads through hadoop-aws); on a local store the
tables hold the same actions and files, and the other Delta tests read those (delta-rs, DuckDB).

The project's code writes the store: two partitions of random appends
(tombstones, transactions, a version header) tiered, compacted and tabled, then more appends tiered, compacted
again (the swap removes segment rows and Parquet files and adds others: Delta remove actions) and tabled again.
`read_with_delta_spark.py` then reads every table in a delta-spark session of its own process, at the latest version
and at the one after the first round, and this test compares its rows and versions with delta-rs's.

The topic table is written by delta-spark itself (kcompact's session); the reader here is another process's session.
One more test has a delta-spark session write (the test's own: the protocol is the table's, whichever session set
it): it turns on row tracking (which kcompact's writer honours) and `delta.appendOnly` (which it cannot: every run
removes rows) on a topic table, as a user's job may, and `kcompact table` then refuses the table with exit 2 before
writing anything (`compaction.delta_protocol`).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

import compaction
from compaction.cli import main
from compaction.config import CompactionStrategy, KcompactConfig, TopicConfig
from compaction.metadata.table import METADATA_TABLE_NAME, read_rows
from compaction.spark import delta
from compaction.storage import ObjectStore, open_store
from compaction.topic_table import Location
from tests.moto_s3 import FAKE_AWS_ENV, REGION, fresh_s3_store
from tests.scenario_log import ScenarioLog, clean, tier
from tests.topic_table import VERSION_HEADER, RandomProducer

REPO = Path(__file__).resolve().parents[2]
READER = Path(__file__).with_name("read_with_delta_spark.py")
T = 1_800_000_000_000
MINUTE = 60_000
TOPIC = "users"
CONFIG = KcompactConfig(defaults=TopicConfig.from_kafka({
    "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
    "compaction.strategy": CompactionStrategy.HEADER.value, "compaction.strategy.header": VERSION_HEADER}))


@dataclass(frozen=True)
class Table:
    """One Delta table as both readers name it, and the version of it after the first round."""

    name: str
    uri: str
    options: dict[str, str]
    first_round: int

    @property
    def spark_uri(self) -> str:
        return "s3a://" + self.uri.removeprefix("s3://") if self.uri.startswith("s3://") else self.uri


def write_store(spark: SparkSession, store: ObjectStore, root: Path, table_uri: str) -> list[Table]:
    """Two rounds of append, tier, compact and `kcompact table` into `store` and `table_uri` (see the module)."""
    rng = random.Random(25)
    producers = [RandomProducer(ScenarioLog(TOPIC, T, partition=p), rng, keys=40) for p in range(2)]
    now = T
    metadata_uri = store.delta_uri(METADATA_TABLE_NAME)
    versions = []
    for _ in range(2):
        for _ in range(3):
            now += MINUTE
            for producer in producers:
                producer.log.timestamp = now
                producer.append(8)
            tier([p.log for p in producers], root / "logdir", store, now)
        now += MINUTE
        clean(spark, store, CONFIG, now, [TOPIC])
        now += MINUTE
        report = compaction.table(spark, store, CONFIG, TOPIC, table_uri, now_ms=now)
        assert report.files_marked or not versions, report.summary()  # the update's MERGE: deletion vectors
        versions.append((DeltaTable(metadata_uri, storage_options=store.delta_storage_options()).version(),
                         DeltaTable(table_uri, storage_options=table_options(store, table_uri)).version()))
    return [Table("metadata", metadata_uri, store.delta_storage_options(), versions[0][0]),
            Table("topic", table_uri, table_options(store, table_uri), versions[0][1])]


def table_options(store: ObjectStore, uri: str) -> dict[str, str]:
    return Location.parse(uri, store.spec.endpoint_url, store.spec.region).open().delta_storage_options()


def as_json(value: Any) -> Any:
    """A delta-rs (pyarrow) value in the JSON the delta-spark side writes: binary as {"hex": ...}."""
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


def canonical(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(row, sort_keys=True) for row in rows)


def delta_rs_rows(table: Table, version: int) -> list[str]:
    # The metadata table: kcompact's own read, Arrow's filesystem under delta-rs's file list. to_pyarrow_table()
    # alone can make this process abort as it exits (docs/upstream.md); QueryBuilder hung here on the S3 tables,
    # served by a thread of this process. The topic table has deletion vectors, which only delta-rs's own reader
    # (`DeltaTable.scan`) applies.
    snapshot = DeltaTable(table.uri, version=version, storage_options=table.options)
    data = pa.table(snapshot.scan()) if table.name == "topic" else read_rows(snapshot, table.options)
    return canonical([as_json(row) for row in data.to_pylist()])


def read_with_delta_spark(tmp: Path, tables: dict[str, Table], s3_endpoint: str) -> dict[str, Any]:
    """One delta-spark session in a process of its own reads every table at its first-round and latest versions."""
    return delta_spark(tmp, {
        "s3": {"endpoint": s3_endpoint, "region": REGION, "access_key": FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
               "secret_key": FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"]},
        "reads": [{"name": name, "uri": t.spark_uri, "versions": [t.first_round, DeltaTable(
            t.uri, storage_options=t.options).version()]} for name, t in tables.items()],
    })


def delta_spark(tmp: Path, request: dict[str, Any]) -> dict[str, Any]:
    """Run `read_with_delta_spark.py` in a fresh process on `request` (delta-spark's jars added); its answer."""
    assert delta.jars(), "run `make delta`"
    request = {"jars": [str(p) for p in delta.jars()], **request}
    (tmp / "request.json").write_text(json.dumps(request))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "AWS_"))}
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run([sys.executable, str(READER), str(tmp / "request.json"), str(tmp / "answer.json")],
                          env=env, capture_output=True, text=True, timeout=900)
    (tmp / "delta-spark.log").write_text(done.stderr)
    assert done.returncode == 0, f"delta-spark's reader exited {done.returncode}: {done.stderr[-3000:]}"
    answer: dict[str, Any] = json.loads((tmp / "answer.json").read_text())
    return answer


@pytest.fixture(scope="module")
def both_readers(spark: SparkSession, moto_endpoint: str, fake_aws_everywhere: None,
                 tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Table], dict[str, Any]]:
    s3_store = fresh_s3_store(moto_endpoint, "delta-readers")
    s3 = write_store(spark, s3_store, tmp_path_factory.mktemp("s3"), f"{s3_store.spec.uri}/tables/{TOPIC}")
    tables = {f"s3a-{t.name}": t for t in s3}
    return tables, read_with_delta_spark(tmp_path_factory.mktemp("delta-spark"), tables, moto_endpoint)


@pytest.mark.parametrize("name", ["s3a-metadata", "s3a-topic"])
def test_delta_spark_sees_the_rows_and_version_delta_rs_sees(
        both_readers: tuple[dict[str, Table], dict[str, Any]], name: str) -> None:
    tables, answer = both_readers
    table, seen = tables[name], answer[name]
    latest = DeltaTable(table.uri, storage_options=table.options).version()
    assert seen["latest_version"] == latest
    assert sorted(seen["rows"]) == sorted({str(table.first_round), str(latest)})
    for version, rows in seen["rows"].items():
        expected = delta_rs_rows(table, int(version))
        assert expected, f"{name} is empty at version {version}"
        assert canonical(rows) == expected, f"{name} at version {version}"


@pytest.mark.parametrize("name", ["s3a-metadata", "s3a-topic"])
def test_the_second_round_removed_and_added_rows(both_readers: tuple[dict[str, Table], dict[str, Any]],
                                                 name: str) -> None:
    """Not a trivial check: between the two versions read, rows went away (Delta remove actions) and came."""
    tables, answer = both_readers
    table = tables[name]
    first, latest = (set(canonical(answer[name]["rows"][str(v)]))
                     for v in (table.first_round, DeltaTable(table.uri, storage_options=table.options).version()))
    assert first - latest and latest - first


@pytest.mark.parametrize("name", ["s3a-metadata"])
def test_delta_spark_sees_the_metadata_table_as_reader_1_writer_2(
        both_readers: tuple[dict[str, Table], dict[str, Any]], name: str) -> None:
    detail = both_readers[1][name]["detail"]
    assert (detail["minReaderVersion"], detail["minWriterVersion"]) == (1, 2)
    assert detail["partitionColumns"] == ["topic", "partition"]


@pytest.mark.parametrize("name", ["s3a-topic"])
def test_delta_spark_sees_the_topic_table_partitioned_by_partition(
        both_readers: tuple[dict[str, Table], dict[str, Any]], name: str) -> None:
    assert both_readers[1][name]["detail"]["partitionColumns"] == ["partition"]


@pytest.mark.parametrize("name", ["s3a-topic"])
def test_delta_spark_reads_the_topic_tables_deletion_vectors(
        both_readers: tuple[dict[str, Table], dict[str, Any]], name: str) -> None:
    """The second round's update marked rows deleted: the table has the feature, live files carry vectors, and the
    rows delta-spark read at that version (compared above) are those left after applying them."""
    detail = both_readers[1][name]["detail"]
    assert {"deletionVectors", "changeDataFeed"} <= set(detail["tableFeatures"]) and detail["minReaderVersion"] == 3
    table = both_readers[0][name]
    location = Location.parse(table.uri, table.options.get("AWS_ENDPOINT_URL"), table.options.get("AWS_REGION"))
    store, latest = location.open(), DeltaTable(table.uri, storage_options=table.options).version()
    log = store.get(location.file_key(f"_delta_log/{latest:020d}.json")).decode()
    assert '"deletionVector":{' in log.replace(" ", "")  # the MERGE's commit marks rows of a live file


def test_kcompact_table_refuses_a_topic_table_another_writer_made_append_only(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: a delta-spark job (here the test's own session, which saves a JVM) turns on row tracking (its
    `rowTracking` and `domainMetadata` features, which kcompact's writer, delta-spark, honours) and `delta.appendOnly`,
    which kcompact cannot honour (every run removes rows); the next `kcompact table` exits 2 naming it, and commits
    nothing."""
    store = open_store(str(tmp_path / "store"))
    producer = RandomProducer(ScenarioLog(TOPIC, T, partition=0), random.Random(42), keys=40)
    uri = str(tmp_path / "tables" / TOPIC)
    now = T + MINUTE
    producer.log.timestamp = now
    producer.append(8)
    tier([producer.log], tmp_path / "logdir", store, now)
    compaction.table(spark, store, CONFIG, TOPIC, uri, now_ms=now + MINUTE)
    before = DeltaTable(uri).version()
    spark.sql(f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.enableRowTracking' = 'true', "
              "'delta.appendOnly' = 'true')")
    features = DeltaTable(uri).protocol().writer_features or []
    assert {"deletionVectors", "domainMetadata", "rowTracking"} <= set(features)
    version = DeltaTable(uri).version()
    assert version > before  # (enabling row tracking commits more than once: the feature, a backfill, the property)

    now += 2 * MINUTE
    producer.log.timestamp = now
    producer.append(8)
    tier([producer.log], tmp_path / "logdir", store, now)
    config = tmp_path / "kcompact.yaml"
    config.write_text(f"defaults:\n  cleanup.policy: compact\n  compaction.strategy: header\n"
                      f"  compaction.strategy.header: {VERSION_HEADER}\n")
    capsys.readouterr()
    assert main(["table", "--store", store.uri, "--config", str(config), "--topic", TOPIC, "--table", uri,
                 "--now", str(now + MINUTE)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kcompact table: UnsupportedDeltaProtocolError: {uri}: the table requires writer "
                          "feature(s) appendOnly (delta.appendOnly is true), which kcompact writing the topic table "
                          "does not implement"), err
    assert err.rstrip().endswith("nothing was written to it") and "Traceback" not in err
    assert DeltaTable(uri).version() == version
