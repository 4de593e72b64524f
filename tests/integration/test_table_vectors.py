"""The topic table's deletion vectors and its own Delta commits, on real Delta tables: the format against Delta's
protocol and the readers (delta-rs's scan, DuckDB), the log replay that finds each live file's vector (through a
checkpoint too), the conflict rule of kcompact's commits, and the vacuum of vector files."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from compaction.config import CompactionStrategy
from compaction.errors import CommitConflictError, CorruptInputError
from compaction.topic_table.deletion_vectors import (
    DeletionVector,
    VectorFile,
    deserialize,
    read_vector,
    z85_decode,
    z85_encode,
)
from compaction.topic_table.delta_log import log_files
from compaction.topic_table.target import Applied, DataFile, Location, TopicTable, retention_ms, upgraded_protocol
from compaction.topic_table.tasks import deleted_rows
from tests.topic_table import duckdb_rows, table_rows

CLOCK = 1_800_000_000_000


def test_z85_names_a_vector_file_as_the_delta_protocol_does() -> None:
    # The protocol's example: prefix "ab", then the UUID d2c639aa-8816-431a-aaf6-d3fe2512ff61 in Z85.
    dv = DeletionVector("ab^-aqEH.-t@S}K{vb[*k^", 4, 10, 1)
    assert dv.file_name == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    data = os.urandom(16)
    assert z85_decode(z85_encode(data)) == data and len(z85_encode(data)) == 20
    with pytest.raises(ValueError):
        z85_decode("ab\"de")


def test_a_vector_file_reads_back_and_names_what_is_wrong() -> None:
    vectors = VectorFile()
    first = vectors.add(np.array([1, 3, 70_000, 2**33], np.uint64))
    second = vectors.add(np.arange(0, 5000, 2, dtype=np.uint64))
    data = vectors.data()
    assert data[0] == 1 and first.offset == 1 and second.offset == 1 + 8 + first.size
    assert read_vector(data, first, obj="dv").tolist() == [1, 3, 70_000, 2**33]
    assert read_vector(data, second, obj="dv").tolist() == list(range(0, 5000, 2))
    crc_at = second.offset + 4 + second.size
    broken = data[:crc_at] + bytes([data[crc_at] ^ 1]) + data[crc_at + 1:]
    with pytest.raises(CorruptInputError, match=f"dv-file, byte {crc_at}: deletion vector: CRC-32"):
        read_vector(broken, second, obj="dv-file")
    with pytest.raises(CorruptInputError, match="says 5 rows"):
        read_vector(data, DeletionVector(first.path_or_inline, first.offset, first.size, 5), obj="dv")
    with pytest.raises(CorruptInputError, match=r"byte 0: .*format version"):
        read_vector(b"\x02" + data[1:], first, obj="dv")
    with pytest.raises(CorruptInputError, match="the file ends at"):
        read_vector(data[:crc_at], second, obj="dv")
    vector = data[first.offset + 4:first.offset + 4 + first.size]
    with pytest.raises(CorruptInputError, match="dv, byte 5: deletion vector: expected the magic"):
        deserialize(struct.pack("<I", 7) + vector[4:], obj="dv", position=5)
    with pytest.raises(CorruptInputError, match="byte 9: deletion vector: not a Roaring bitmap"):
        deserialize(vector[:4] + b"\xff" * 3, obj="dv", position=5)


def rows(table: TopicTable, partition: int, keys: range) -> pa.Table:
    names = [b"key-%d" % i for i in keys]
    return pa.table({"partition": pa.array([partition] * len(names), pa.int32()), "key": names, "value": names,
                     "offset": pa.array(keys, pa.int64()), "timestamp": pa.array([CLOCK] * len(names), pa.int64()),
                     "headers": pa.array([[]] * len(names), table.schema.field("headers").type)}, schema=table.schema)


def keys_of(uri: str) -> list[bytes]:
    return sorted(r[1] for r in table_rows(uri))


def vectors_on(table: TopicTable, partitions: list[int]) -> None:
    """Turn the table's deletion vectors on by a commit of nothing else."""
    table.open(partitions, create=False)
    table.use_deletion_vectors()
    table.commit([], [], {}, CLOCK, {})


def mark(table: TopicTable, file: DataFile, positions: list[int], offset: int) -> tuple[DataFile, DeletionVector]:
    """Put a vector file deleting `positions` (its old vector's too) of `file` and return the mark to commit."""
    store = table.location.open()
    old = deleted_rows(store, table.location, file.vector)
    vectors = VectorFile()
    vector = vectors.add(np.union1d(old, np.array(positions, np.uint64)))
    store.put(table.location.file_key(vectors.name), vectors.data())
    return file, vector


def test_marked_rows_leave_every_reader_and_the_log_replay_finds_each_vector(tmp_path: Path) -> None:
    uri = str(tmp_path / "users-table")
    table = TopicTable(Location.parse(uri), "users", CompactionStrategy.OFFSET, None)
    table.open([0, 1], create=True)
    write_deltalake(uri, rows(table, 0, range(0, 10)), mode="append", partition_by=["partition"])
    write_deltalake(uri, rows(table, 1, range(10, 15)), mode="append", partition_by=["partition"])
    vectors_on(table, [0, 1])
    state = table.open([0, 1], create=False)
    assert table.deletion_vectors() and all(f.vector is None and f.rows for f in state.files)
    p0 = next(f for f in state.files if f.partition == 0)

    table.commit([], [], {0: Applied(10, CLOCK)}, CLOCK, {"step": 1}, [mark(table, p0, [1, 3], 1)])
    assert keys_of(uri) == sorted(b"key-%d" % i for i in range(15) if i not in (1, 3))
    assert duckdb_rows(uri) == table_rows(uri)
    state = table.open([0, 1], create=False)
    p0 = next(f for f in state.files if f.partition == 0)
    assert p0.vector is not None and p0.vector.cardinality == 2 and state.applied[0].offset == 10

    # A second mark replaces the first (the remove names the old vector, or both adds would stay live).
    table.commit([], [], {0: Applied(11, CLOCK)}, CLOCK, {"step": 2}, [mark(table, p0, [9], 2)])
    assert keys_of(uri) == sorted(b"key-%d" % i for i in range(15) if i not in (1, 3, 9))
    assert duckdb_rows(uri) == table_rows(uri)
    DeltaTable(uri).create_checkpoint()  # the replay now starts from the checkpoint's adds
    state = table.open([0, 1], create=False)
    p0 = next(f for f in state.files if f.partition == 0)
    assert p0.vector is not None and p0.vector.cardinality == 3
    assert log_files(table.location.open(), table.location.name, state.version).live[p0.path] == p0.vector

    # The same table object reads only the commits since its last replay: no listing, one GET for one commit.
    table.commit([], [], {0: Applied(12, CLOCK)}, CLOCK, {"step": 3})
    stats = table._store.stats
    gets, lists = stats.gets, stats.lists
    assert next(f for f in table.open([0, 1], create=False).files if f.partition == 0).vector == p0.vector
    assert (stats.gets - gets, stats.lists - lists) == (1, 0)

    # Removing a marked file (a rebuild, a dropped partition) removes it with its vector.
    table.commit([], [p0], {}, CLOCK, {"step": 4})
    assert keys_of(uri) == sorted(b"key-%d" % i for i in range(10, 15))
    assert duckdb_rows(uri) == table_rows(uri)


def test_a_commit_conflicts_with_one_that_applied_or_marked_the_same_first(tmp_path: Path) -> None:
    uri = str(tmp_path / "users-table")
    first, second, third = (TopicTable(Location.parse(uri), "users", CompactionStrategy.OFFSET, None)
                            for _ in range(3))
    first.open([0, 1], create=True)
    write_deltalake(uri, rows(first, 0, range(0, 10)), mode="append", partition_by=["partition"])
    write_deltalake(uri, rows(first, 1, range(10, 20)), mode="append", partition_by=["partition"])
    vectors_on(first, [0, 1])
    files = {f.partition: f for f in first.open([0, 1], create=False).files}
    second.open([0, 1], create=False)
    third.open([0, 1], create=False)
    version = first.commit([], [], {0: Applied(10, CLOCK)}, CLOCK, {}, [mark(first, files[0], [0], 1)])
    with pytest.raises(CommitConflictError, match="applied kcompact-table/users/0"):
        second.commit([], [], {0: Applied(10, CLOCK)}, CLOCK, {}, [mark(second, files[0], [2], 1)])
    with pytest.raises(CommitConflictError, match="removed partition=0/"):
        second.commit([], [], {}, CLOCK, {}, [mark(second, files[0], [2], 1)])
    # Another partition's commit lands after the one it did not see.
    assert third.commit([], [], {1: Applied(20, CLOCK)}, CLOCK, {}, [mark(third, files[1], [5], 1)]) == version + 1
    assert keys_of(uri) == sorted(b"key-%d" % i for i in range(20) if i not in (0, 15))


def test_vacuum_deletes_only_old_vector_files_nothing_names(tmp_path: Path) -> None:
    uri = str(tmp_path / "users-table")
    table = TopicTable(Location.parse(uri), "users", CompactionStrategy.OFFSET, None)
    table.open([0], create=True)
    write_deltalake(uri, rows(table, 0, range(0, 10)), mode="append", partition_by=["partition"])
    vectors_on(table, [0])
    (p0,) = table.open([0], create=False).files
    _, vector = mark(table, p0, [4], 1)
    table.commit([], [], {}, CLOCK, {}, [(p0, vector)])
    orphan = VectorFile()
    orphan.add(np.array([1], np.uint64))  # written by a run that died before its commit
    store = table.location.open()
    store.put(table.location.file_key(orphan.name), orphan.data())
    old = (CLOCK - retention_ms({}) - 1000) / 1000
    for name in (orphan.name, vector.file_name):
        os.utime(Path(uri) / name, (old, old))
    gone = table.vacuum(CLOCK)
    assert gone == [orphan.name]
    assert (Path(uri) / vector.file_name).exists() and not (Path(uri) / orphan.name).exists()
    assert keys_of(uri) == sorted(b"key-%d" % i for i in range(10) if i != 4)
    assert retention_ms({"delta.deletedFileRetentionDuration": "interval 2 days"}) == 2 * 86_400_000


def test_vectors_are_turned_on_in_the_commit_of_the_data_and_a_run_that_read_before_it_conflicts(
        tmp_path: Path) -> None:
    uri = str(tmp_path / "users-table")
    first, second = (TopicTable(Location.parse(uri), "users", CompactionStrategy.OFFSET, None) for _ in range(2))
    first.open([0], create=True)
    write_deltalake(uri, rows(first, 0, range(0, 10)), mode="append", partition_by=["partition"])
    before = DeltaTable(uri)
    (p0,) = first.open([0], create=False).files
    second.open([0], create=False)
    first.use_deletion_vectors()
    assert first.deletion_vectors() and not second.deletion_vectors()
    assert DeltaTable(uri).version() == before.version()  # asked for, not committed: a run that fails leaves nothing
    first.commit([], [], {0: Applied(10, CLOCK)}, CLOCK, {}, [mark(first, p0, [2], 1)])
    after = DeltaTable(uri)
    assert after.version() == before.version() + 1
    protocol = after.protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert protocol.reader_features == ["deletionVectors"]
    assert sorted(protocol.writer_features or []) == ["appendOnly", "deletionVectors", "invariants"]
    meta = after.metadata()
    assert meta.configuration == {"delta.enableDeletionVectors": "true"}
    assert (meta.id, meta.name, meta.description, meta.partition_columns, meta.created_time) == (
        before.metadata().id, before.metadata().name, before.metadata().description,
        before.metadata().partition_columns, before.metadata().created_time)
    assert after.schema() == before.schema() and keys_of(uri) == sorted(b"key-%d" % i for i in range(10) if i != 2)
    assert duckdb_rows(uri) == table_rows(uri)
    # A run that read the table before the upgrade: its commit conflicts, and its rerun finds the feature on.
    second.use_deletion_vectors()
    with pytest.raises(CommitConflictError, match="changed the table's metadata or protocol"):
        second.commit([], [], {}, CLOCK, {})
    second.open([0], create=False)
    second.use_deletion_vectors()
    assert second.deletion_vectors()
    version = second.commit([], [], {}, CLOCK, {})
    commit = (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text()
    assert '"protocol"' not in commit and '"metaData"' not in commit


@pytest.mark.parametrize(("reader", "writer", "readers", "writers", "expected"), [
    (1, 2, [], [], ["appendOnly", "deletionVectors", "invariants"]),
    (1, 4, [], [], ["appendOnly", "changeDataFeed", "checkConstraints", "deletionVectors", "generatedColumns",
                    "invariants"]),
    (3, 7, ["columnMapping"], ["columnMapping", "appendOnly"], ["appendOnly", "columnMapping", "deletionVectors"]),
])
def test_the_upgraded_protocol_lists_every_feature_the_old_one_implied(
        reader: int, writer: int, readers: list[str], writers: list[str], expected: list[str]) -> None:
    protocol = upgraded_protocol(reader, writer, readers, writers)
    assert (protocol["minReaderVersion"], protocol["minWriterVersion"]) == (3, 7)
    assert protocol["writerFeatures"] == expected
    assert protocol["readerFeatures"] == sorted({*readers, "deletionVectors"})
    assert upgraded_protocol(2, 5, [], [])["readerFeatures"] == ["columnMapping", "deletionVectors"]
