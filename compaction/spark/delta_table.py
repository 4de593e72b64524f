"""The delta-spark operations the topic table needs (`compaction.topic_table`): Delta's own writer does every write.

Each command kcompact runs on the table is **stamped** (`Stamp`): Delta's idempotent-write transaction
(`txnAppId` = `kcompact-table/<topic>`, `txnVersion` = the commit's sequence number, one above the last one the
table recorded) and the commit's `userMetadata`, a JSON record of what the table has applied of each partition once
the commit lands (`compaction.topic_table.target`). Both ride in the command's own commit, set through the session's
SQL confs `spark.databricks.delta.write.txnAppId` / `.txnVersion` and `spark.databricks.delta.commitInfo.userMetadata`
for the length of the command and unset after it, in a session of the run's own (`own_session`: the same application
and confs, a SQL conf of its own), so a stamp never reaches a command that another run, or the notebook around it,
runs in the same application at the same time. Delta skips a stamped command whose `txnVersion` the table already
recorded (a concurrent run landed the same sequence number first), and fails one whose read overlaps a concurrent
commit of the same app id (`ConcurrentTransactionException`): either way the caller finds its commit missing
(`compaction.topic_table.target.TopicTable.landed`) and raises `CommitConflictError` (exit 4, rerun safe), as it
does for Delta's other concurrent-modification exceptions (`conflicts`).

Operations: `create` (deletion vectors and Change Data Feed on), `replace` (a DataFrame overwrite with
`replaceWhere` on the rebuilt partitions), `merge` (the update: rows matched on (partition, key); a source row whose
value is null, a tombstone, deletes its key's row; others update it or insert one), `delete_partitions`, `optimize`
and `vacuum`, each through Delta's own command. An `s3://` table is written through hadoop-aws's `s3a://`,
configured per bucket from the store's settings (`configure`).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from compaction.errors import CommitConflictError

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
PROPERTIES = {"delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "true"}
"""The table's properties at creation: updates mark rows deleted (deletion vectors) instead of rewriting files, and
a downstream reader can follow its changes (`readChangeFeed`)."""
PARTITION_COLUMN = "partition"


@dataclass(frozen=True)
class Stamp:
    """What one command's commit records: Delta's idempotent-write transaction (`app_id`, `version`; no transaction
    when `version` is None) and the commit's `userMetadata` (`metadata`, JSON)."""

    app_id: str
    version: int | None
    metadata: Mapping[str, Any]


PARQUET_CODEC = "spark.sql.parquet.compression.codec"
TABLE_CODEC = "zstd"
"""The table's Parquet files are zstd-compressed unless the session names another codec than Spark's default
(snappy): values and headers compress several times better, so a run writes, and a MERGE reads, fewer bytes."""


def own_session(spark: SparkSession) -> SparkSession:
    """A session for one table run: `spark`'s application, catalog and cache, and a copy of its SQL confs, but a
    conf of its own, so the stamps `stamped` sets in it are seen by no other session's commands (Spark's
    `newSession`; the static confs and the Hadoop configuration are the application's, shared). Its Parquet codec
    is `TABLE_CODEC` unless `spark` set another than Spark's default."""
    child = spark.newSession()
    for name, value in spark.conf.getAll.items():
        if spark.conf.isModifiable(name) and name not in (TXN_APP_ID, TXN_VERSION, USER_METADATA):
            child.conf.set(name, value)
    if spark.conf.get(PARQUET_CODEC, "snappy") == "snappy":
        child.conf.set(PARQUET_CODEC, TABLE_CODEC)
    return child


@contextlib.contextmanager
def stamped(spark: SparkSession, stamp: Stamp | None) -> Iterator[None]:
    """The session's confs set to `stamp` for the commands run inside, unset after them (whatever happens); a Delta
    concurrent-modification exception raised inside as `CommitConflictError`."""
    confs = {} if stamp is None else {USER_METADATA: json.dumps(dict(stamp.metadata), sort_keys=True)}
    if stamp is not None and stamp.version is not None:
        confs |= {TXN_APP_ID: stamp.app_id, TXN_VERSION: str(stamp.version)}
    for name, value in confs.items():
        spark.conf.set(name, value)
    try:
        yield
    except Exception as exc:
        if (conflict := conflicts(exc)) is not None:
            raise CommitConflictError(f"a concurrent commit changed the table first ({conflict}); nothing of this "
                                      "command was committed: rerun") from exc
        raise
    finally:
        for name in confs:
            spark.conf.unset(name)


_CONFLICTS = re.compile(r"(Concurrent\w*Exception|MetadataChangedException|ProtocolChangedException"
                        r"|DELTA_CONCURRENT_\w+|DELTA_METADATA_CHANGED|DELTA_PROTOCOL_CHANGED)")


def conflicts(exc: BaseException) -> str | None:
    """The name of Delta's concurrent-modification exception `exc` is (or wraps), None when it is another error."""
    found = _CONFLICTS.search(str(exc)) or _CONFLICTS.search(type(exc).__name__)
    return None if found is None else found.group(1)


def spark_path(uri: str) -> str:
    """The table as Spark's filesystems name it: `s3://` through hadoop-aws's `s3a://`, a `file://` URI or path as
    it is."""
    return "s3a://" + uri.removeprefix("s3://") if uri.startswith("s3://") else uri


def configure(spark: SparkSession, uri: str, options: Mapping[str, str]) -> None:
    """For an `s3://` table: hadoop-aws's per-bucket settings of its bucket (`fs.s3a.bucket.<bucket>.*`) from the
    store's settings (`options`, as delta-rs names them: `ObjectStore.delta_storage_options`): endpoint (path-style
    when one is set), region and static credentials (without them hadoop-aws's default chain finds the
    environment's). Nothing for a local table."""
    if not uri.startswith("s3://"):
        return
    bucket = uri.removeprefix("s3://").partition("/")[0]
    settings: dict[str, str] = {}
    if endpoint := options.get("AWS_ENDPOINT_URL"):
        settings |= {"endpoint": endpoint, "path.style.access": "true",
                     "connection.ssl.enabled": str(not endpoint.startswith("http://")).lower()}
    if region := options.get("AWS_REGION"):
        settings["endpoint.region"] = region
    if (key := options.get("AWS_ACCESS_KEY_ID")) and (secret := options.get("AWS_SECRET_ACCESS_KEY")):
        token = options.get("AWS_SESSION_TOKEN")
        settings |= {"access.key": key, "secret.key": secret, "aws.credentials.provider":
                     "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider" if token
                     else "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}
        if token:
            settings["session.token"] = token
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for name, value in settings.items():
        hadoop.set(f"fs.s3a.bucket.{bucket}.{name}", value)


def delta_schema(schema: StructType) -> StructType:
    """`schema` as Delta takes it: nested fields nullable (Delta enforces NOT NULL at the top level only and refuses
    a table declaring one inside an array or map)."""
    def loose(kind: DataType, top: bool) -> DataType:
        if isinstance(kind, StructType):
            return StructType([StructField(f.name, loose(f.dataType, False), f.nullable if top else True)
                               for f in kind.fields])
        if isinstance(kind, ArrayType):
            return ArrayType(loose(kind.elementType, False), True)
        if isinstance(kind, MapType):
            return MapType(loose(kind.keyType, False), loose(kind.valueType, False), True)
        return kind

    out = loose(schema, True)
    assert isinstance(out, StructType)
    return out


def create(spark: SparkSession, path: str, schema: StructType, description: str) -> None:
    """Create the table at `path` unless there is one: `schema` (`delta_schema`), partitioned by `partition`, its
    description `description`, `PROPERTIES` set (Delta's protocol for them: reader 3 / writer 7 with
    `deletionVectors` and `changeDataFeed`). A concurrent creation that won is left as it is."""
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(delta_schema(schema))
    builder = builder.partitionedBy(PARTITION_COLUMN).comment(description)
    for name, value in PROPERTIES.items():
        builder = builder.property(name, value)
    with contextlib.suppress(CommitConflictError), stamped(spark, None):
        builder.execute()


def set_properties(spark: SparkSession, path: str, properties: Mapping[str, str], stamp: Stamp | None = None
                   ) -> None:
    """Set table properties (Delta's `ALTER TABLE ... SET TBLPROPERTIES`)."""
    pairs = ", ".join(f"'{k}' = '{v}'" for k, v in sorted(properties.items()))
    with stamped(spark, stamp):
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({pairs})")


def _in(partitions: Sequence[int], column: str = PARTITION_COLUMN) -> str:
    return f"{column} IN ({', '.join(str(int(p)) for p in sorted(set(partitions)))})"


def replace(spark: SparkSession, path: str, rows: DataFrame, partitions: Sequence[int], stamp: Stamp) -> None:
    """Replace the rows of `partitions` by `rows` (theirs only): one overwrite commit with `replaceWhere`."""
    writer = rows.write.format("delta").mode("overwrite").option("replaceWhere", _in(partitions))
    with stamped(spark, stamp):
        writer.save(path)


def append(spark: SparkSession, path: str, rows: DataFrame, stamp: Stamp) -> None:
    """Append `rows` in one commit (with none, a commit that records only its stamp)."""
    with stamped(spark, stamp):
        rows.write.format("delta").mode("append").save(path)


def merge(spark: SparkSession, path: str, source: DataFrame, partitions: Sequence[int], stamp: Stamp) -> None:
    """Apply `source` (a row per changed (partition, key) of `partitions`: its winner, value null for a tombstone)
    to the table in one MERGE: a tombstone deletes the key's row, another winner updates it or is inserted. With
    deletion vectors on, Delta marks the replaced rows deleted rather than rewriting their files."""
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, path)
    on = f"{_in(partitions, 't.partition')} AND t.partition = s.partition AND t.key = s.key"
    with stamped(spark, stamp):
        (table.alias("t").merge(source.alias("s"), on)
         .whenMatchedDelete("s.value IS NULL")
         .whenMatchedUpdateAll("s.value IS NOT NULL")
         .whenNotMatchedInsertAll("s.value IS NOT NULL")
         .execute())


def delete_partitions(spark: SparkSession, path: str, partitions: Sequence[int], stamp: Stamp) -> None:
    """Delete every row of `partitions` (Delta's DELETE; whole files, by partition)."""
    from delta.tables import DeltaTable

    with stamped(spark, stamp):
        DeltaTable.forPath(spark, path).delete(_in(partitions))


def optimize(spark: SparkSession, path: str, partitions: Sequence[int], stamp: Stamp) -> None:
    """Bin-pack the small files of `partitions` (Delta's OPTIMIZE; it also rewrites the files whose deletion vectors
    delete more than `spark.databricks.delta.optimize.maxDeletedRowsRatio` of their rows)."""
    from delta.tables import DeltaTable

    with stamped(spark, stamp):
        DeltaTable.forPath(spark, path).optimize().where(_in(partitions)).executeCompaction()


def vacuum(spark: SparkSession, path: str, stamp: Stamp) -> None:
    """Delete the files no version within the table's `delta.deletedFileRetentionDuration` reads (Delta's VACUUM,
    which logs its start and end as commits of their own): `LITE`, which finds them in the log's removes rather
    than listing the whole table (on a local session 5-8 s against 40-60 s for the full listing of a small table),
    or the full one when Delta says the log no longer holds what LITE needs (`DELTA_CANNOT_VACUUM_LITE`)."""
    with stamped(spark, stamp):
        try:
            spark.sql(f"VACUUM delta.`{path}` LITE")
        except Exception as exc:
            if "DELTA_CANNOT_VACUUM_LITE" not in str(exc):
                raise
            spark.sql(f"VACUUM delta.`{path}`")


__all__ = ["PROPERTIES", "Stamp", "append", "configure", "conflicts", "create", "delete_partitions", "delta_schema",
           "merge", "optimize", "own_session", "replace", "set_properties", "spark_path", "stamped", "vacuum"]
