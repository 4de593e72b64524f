"""`kcompact table`'s upkeep on a real Delta table (delta-rs): partitions gone from the store dropped, crowded
partitions compacted, removed files vacuumed after the retention, every other row untouched."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from compaction.config import CompactionStrategy
from compaction.topic_table.target import DataFile, Location, TopicTable
from compaction.topic_table.upkeep import SMALL_FILE_BYTES, SMALL_FILES, crowded, keep_healthy
from tests.topic_table import duckdb_rows, table_rows

OLD_CLOCK = 1_700_000_000_000  # 2023: removals stamped with it are past any retention by now


def test_crowded_partitions_have_many_small_files_making_up_most_of_them() -> None:
    small, big = SMALL_FILE_BYTES - 1, SMALL_FILE_BYTES
    files = [DataFile(f"a{i}", 0, small) for i in range(SMALL_FILES)]  # 8 small: crowded
    files += [DataFile(f"b{i}", 1, small) for i in range(SMALL_FILES - 1)]  # 7 small: not yet
    files += [DataFile(f"c{i}", 2, small) for i in range(SMALL_FILES)]  # 8 small of 16: not more than half
    files += [DataFile(f"d{i}", 2, big) for i in range(SMALL_FILES)]
    assert crowded(files) == [0]


def rows(table: TopicTable, partition: int, n: int, start: int = 0) -> pa.Table:
    keys = [b"key-%d-%d" % (partition, i) for i in range(start, start + n)]
    return pa.table({"partition": pa.array([partition] * n, pa.int32()), "key": keys, "value": keys,
                     "offset": pa.array(range(start, start + n), pa.int64()),
                     "timestamp": pa.array([OLD_CLOCK] * n, pa.int64()),
                     "headers": pa.array([[]] * n, table.schema.field("headers").type)},
                    schema=table.schema)


def test_upkeep_drops_compacts_and_vacuums(tmp_path: Path) -> None:
    location = Location.parse(str(tmp_path / "orders-table"))
    table = TopicTable(location, "orders", CompactionStrategy.OFFSET, None)
    table.open([0, 1, 5], create=True)
    uri = str(tmp_path / "orders-table")
    for i in range(SMALL_FILES + 1):  # partition 0: one small file per small update
        write_deltalake(uri, rows(table, 0, 10, start=10 * i), mode="append", partition_by=["partition"])
    write_deltalake(uri, rows(table, 1, 50), mode="append", partition_by=["partition"])
    write_deltalake(uri, rows(table, 5, 20), mode="append", partition_by=["partition"])
    before = table_rows(uri)
    gone_files = [a["path"] for a in pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
                  if a["partition.partition"] == 5]

    done = keep_healthy(table, [0, 1], OLD_CLOCK)

    assert (done.partitions_dropped, done.files_dropped) == ((5,), 1)
    assert (done.partitions_compacted, done.files_compacted) == ((0,), SMALL_FILES + 1)
    files = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    assert sorted(a["partition.partition"] for a in files) == [0, 1]  # partition 0 bin-packed into one file
    assert table_rows(uri) == {r for r in before if r[0] != 5}
    assert duckdb_rows(uri) == table_rows(uri)  # after OPTIMIZE and a dropped partition
    assert done.files_vacuumed == 1 and not any((tmp_path / "orders-table" / p).exists() for p in gone_files)
    # The compacted partition's small files were removed now: kept for time travel until the retention passes.
    assert sum(1 for _ in (tmp_path / "orders-table").glob("partition=0/*.parquet")) == SMALL_FILES + 2

    again = keep_healthy(table, [0, 1], OLD_CLOCK)
    assert (again.partitions_dropped, again.partitions_compacted, again.files_vacuumed) == ((), (), 0)
