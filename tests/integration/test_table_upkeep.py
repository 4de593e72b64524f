"""`kcompact table`'s upkeep on a real Delta table, through Delta's own commands (delta-spark): partitions gone from
the store dropped (DELETE), crowded partitions compacted (OPTIMIZE), removed files vacuumed after the retention
(VACUUM), every other row untouched."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from compaction.config import CompactionStrategy
from compaction.spark import delta_table as delta
from compaction.spark.table import local_rows, row_struct
from compaction.topic_table.target import DataFile, Location, TopicTable, app_id
from compaction.topic_table.upkeep import SMALL_FILE_BYTES, SMALL_FILES, crowded, keep_healthy
from tests.spark.conftest import spark  # noqa: F401
from tests.topic_table import duckdb_rows, table_rows

CLOCK = 1_700_000_000_000


def test_crowded_partitions_have_many_small_files_making_up_most_of_them() -> None:
    small, big = SMALL_FILE_BYTES - 1, SMALL_FILE_BYTES
    files = [DataFile(f"a{i}", 0, small) for i in range(SMALL_FILES)]  # 8 small: crowded
    files += [DataFile(f"b{i}", 1, small) for i in range(SMALL_FILES - 1)]  # 7 small: not yet
    files += [DataFile(f"c{i}", 2, small) for i in range(SMALL_FILES)]  # 8 small of 16: not more than half
    files += [DataFile(f"d{i}", 2, big) for i in range(SMALL_FILES)]
    assert crowded(files) == [0]


def rows(table: TopicTable, partition: int, n: int, start: int = 0) -> pa.Table:
    keys = [b"key-%d-%d" % (partition, i) for i in range(start, start + n)]
    return pa.table({"key": keys, "value": keys, "partition": pa.array([partition] * n, pa.int32()),
                     "offset": pa.array(range(start, start + n), pa.int64()),
                     "timestamp": pa.array([CLOCK] * n, pa.int64()),
                     "headers": pa.array([[]] * n, table.schema.field("headers").type)},
                    schema=table.schema)


@pytest.mark.spark
def test_upkeep_drops_compacts_and_vacuums(spark: SparkSession, tmp_path: Path) -> None:  # noqa: F811
    location = Location.parse(str(tmp_path / "orders-table"))
    table = TopicTable(location, "orders", CompactionStrategy.OFFSET, None)
    path = table.spark_path
    delta.create(spark, path, row_struct(table.schema), table.description)
    stamp = delta.Stamp(app_id("orders"), None, {"test": "a writer's append"})
    batch = pa.concat_tables([rows(table, 0, 10 * (SMALL_FILES + 1)), rows(table, 1, 10), rows(table, 5, 20)])
    spark.conf.set("spark.sql.files.maxRecordsPerFile", "10")  # a small file per 10 rows, in one commit
    try:
        delta.append(spark, path, local_rows(spark, batch, table.schema).coalesce(1), stamp)
    finally:
        spark.conf.unset("spark.sql.files.maxRecordsPerFile")
    # removed files go at the next VACUUM (Delta's default keeps them a week)
    delta.set_properties(spark, path, {"delta.deletedFileRetentionDuration": "interval 0 seconds"})
    uri = table.uri
    before = table_rows(uri)
    gone_files = [a["path"] for a in pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
                  if a["partition.partition"] == 5]

    done = keep_healthy(spark, table, "upkeep-run", [0, 1], CLOCK)

    assert (done.partitions_dropped, done.files_dropped) == ((5,), 2)
    assert (done.partitions_compacted, done.files_compacted) == ((0,), SMALL_FILES + 1)
    files = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    assert sorted(a["partition.partition"] for a in files) == [0, 1]  # partition 0 bin-packed into one file
    assert table_rows(uri) == {r for r in before if r[0] != 5}
    assert duckdb_rows(uri) == table_rows(uri)  # after OPTIMIZE and a dropped partition
    assert done.files_vacuumed == SMALL_FILES + 3  # the dropped files and the compacted ones
    assert not any((tmp_path / "orders-table" / p).exists() for p in gone_files)
    assert sum(1 for _ in (tmp_path / "orders-table").glob("partition=0/*.parquet")) == 1

    again = keep_healthy(spark, table, "upkeep-rerun", [0, 1], CLOCK)
    assert (again.partitions_dropped, again.partitions_compacted) == ((), ())
