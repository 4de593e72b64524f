"""Read Delta tables with delta-spark and write what it sees as JSON: run by the project's python in a process of its
own (a session apart from the writers', as another team's job would be), not by pytest.

Its jars are .delta-jars (delta-spark and hadoop-aws from Maven Central, `make delta`, delta/pom.xml).
`test_delta_readers.py` writes the tables with the project's own code (delta-rs), runs this script on a request
file and compares its answer with what delta-rs reads.

Request (JSON): `jars` (paths for the driver's class path), `s3` (`endpoint`, `region`, `access_key`, `secret_key`
for `s3a://` through hadoop-aws), `reads`: a list of `{"name", "uri", "versions": [int, ...]}`. Answer (JSON, to the
given path): per name, `latest_version` (from `DeltaTable.history`), `detail` (`DeltaTable.detail`'s protocol,
features and partitioning) and `rows` per version read, each row a JSON object with binary values as {"hex": ...}.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import SparkSession


def session(jars: list[str], s3: dict[str, str]) -> SparkSession:
    builder = (SparkSession.builder.master("local[2]").appName("kcompact-delta-readers")
               # local mode: the driver is the executor, so a class path instead of spark.jars, which would
               # copy every jar (the AWS SDK bundle is ~690 MB) into the executor's work dir at each start
               .config("spark.driver.extraClassPath", ":".join(jars))
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.databricks.delta.snapshotPartitions", "2")
               .config("spark.driver.memory", "1g")
               # a short-lived JVM on a busy machine: C1 only, which warms up in a fraction of C2's CPU time
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1"))
    for name, value in {
        "fs.s3a.endpoint": s3["endpoint"],
        "fs.s3a.endpoint.region": s3["region"],
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "fs.s3a.access.key": s3["access_key"],
        "fs.s3a.secret.key": s3["secret_key"],
    }.items():
        builder = builder.config(f"spark.hadoop.{name}", value)
    return builder.getOrCreate()


def plain(value: Any) -> Any:
    """A Row's value as JSON: binary as {"hex": ...}, structs and maps as objects, arrays as lists."""
    if isinstance(value, (bytes, bytearray)):
        return {"hex": bytes(value).hex()}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "asDict"):
        return plain(value.asDict(recursive=True))
    return value


def read(spark: SparkSession, uri: str, versions: list[int]) -> dict[str, Any]:
    table = DeltaTable.forPath(spark, uri)
    latest = table.history(1).collect()[0]["version"]
    detail = table.detail().collect()[0].asDict(recursive=True)
    rows = {}
    for version in versions:
        frame = spark.read.format("delta").option("versionAsOf", version).load(uri)
        rows[str(version)] = [plain(row.asDict(recursive=True)) for row in frame.collect()]
    return {
        "latest_version": latest,
        "detail": {k: plain(detail[k]) for k in ("format", "partitionColumns", "minReaderVersion",
                                                 "minWriterVersion", "tableFeatures", "numFiles")},
        "rows": rows,
    }


def main(request_path: str, answer_path: str) -> None:
    with open(request_path) as f:
        request = json.load(f)
    spark = session(request["jars"], request["s3"])
    try:
        answer = {r["name"]: read(spark, r["uri"], r["versions"]) for r in request["reads"]}
    finally:
        spark.stop()
    with open(answer_path, "w") as f:
        json.dump(answer, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
