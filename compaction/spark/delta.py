"""delta-spark in the sessions kcompact launches: its jars on the driver's class path, its SQL extension and catalog.

The Python half of delta-spark (`delta`, pinned in pyproject.toml with the pyspark it supports) comes with the
venv; its JVM half (delta-spark, delta-storage, and hadoop-aws with the AWS SDK bundle for `s3a://`) is resolved
from Maven Central by `make delta` into the checkout's `.delta-jars` (delta/pom.xml), or wherever
KCOMPACT_DELTA_JARS names. Nothing is downloaded at run time: a session launched without the jars has no Delta
extension.

In local mode the driver is the executor, so the jars go on the driver JVM's class path
(`spark.driver.extraClassPath`) before it starts, where class-data sharing (compaction/spark/cds.py) can map their
classes too. Under spark-submit the JVM is running before Python and kcompact adds nothing: the jars and `SQL` are
the deployment's to pass (`--jars` and `--conf`): `kcompact table` (jobs/table.py) writes the topic table through
delta-spark (`compaction.spark.delta_table`) and fails without them.

On `s3a://` a session kcompact launches commits through kcompact's own LogStore (`LOGSTORE`, built by `make delta`
into `.delta-jars/kcompact-logstore.jar` from delta/logstore/): each commit file is one conditional put (S3's
`If-None-Match: *`), so concurrent writers in different drivers cannot overwrite each other's commit, which
delta-spark's default for S3 (`S3SingleDriverLogStore`) allows. Under spark-submit, pass the jar and
`spark.delta.logStore.s3a.impl` too (docs/topic-table.md).
"""

from __future__ import annotations

import os
from pathlib import Path

JARS_ENV = "KCOMPACT_DELTA_JARS"
"""A directory of delta-spark's jars other than the checkout's `.delta-jars`."""

CHECKOUT_JARS = Path(__file__).resolve().parents[2] / ".delta-jars"

EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
SQL: dict[str, str] = {
    "spark.sql.extensions": EXTENSION,
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
"""What a session needs to run Delta's SQL and DeltaTable API (delta-spark's `configure_spark_with_delta_pip` sets
the same two, and Ivy packages kcompact does not download)."""

CLASS_PATH = "spark.driver.extraClassPath"

LOCAL: dict[str, str] = {"spark.databricks.delta.snapshotPartitions": "4"}
"""Delta's settings for a session this process launches, unless given: a table's log state in a few Spark
partitions, not Delta's default 50 (sized for clusters): on a local[2] session a create, an append and a MERGE of a
small topic table took 9.5-12 s warm with 4, 18-22 s with 50 (2 shared cores, load ~6)."""


LOGSTORE: dict[str, str] = {"spark.delta.logStore.s3a.impl": "dev.kcompact.delta.S3ConditionalLogStore"}
"""The LogStore of `s3a://` tables when kcompact's jar is there: a commit is a conditional put."""
LOGSTORE_JAR = "kcompact-logstore.jar"


def jars_dir() -> Path:
    return Path(os.environ.get(JARS_ENV) or CHECKOUT_JARS)


def jars() -> list[Path]:
    """delta-spark's jars, sorted; empty when `make delta` has not run (or KCOMPACT_DELTA_JARS names no jars)."""
    return sorted(jars_dir().glob("*.jar"))


def local_options(settings: dict[str, str]) -> dict[str, str]:
    """The settings of a session this process launches, with delta-spark's jars and `SQL` added when the jars are
    there (a class path or extension already in `settings` is kept first)."""
    found = jars()
    if not found:
        return settings
    earlier = [settings[CLASS_PATH]] if settings.get(CLASS_PATH) else []
    logstore = LOGSTORE if any(p.name == LOGSTORE_JAR for p in found) else {}
    class_path = os.pathsep.join([*earlier, *(str(p) for p in found)])
    return with_sql({**LOCAL, **logstore, **settings, CLASS_PATH: class_path})


def with_sql(settings: dict[str, str]) -> dict[str, str]:
    """`settings` with delta-spark's extension appended to any others, and its catalog unless one is set."""
    merged = dict(settings)
    extensions = [e for e in merged.get("spark.sql.extensions", "").split(",") if e]
    if EXTENSION not in extensions:
        merged["spark.sql.extensions"] = ",".join([*extensions, EXTENSION])
    catalog = "spark.sql.catalog.spark_catalog"
    merged.setdefault(catalog, SQL[catalog])
    return merged
