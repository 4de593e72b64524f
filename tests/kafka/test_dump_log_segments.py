"""Kafka's tools read what kcompact writes (issue 25, deliverable 4), and `tests/kafka_dump.dump_check` can fail.

`dump_check` runs Kafka's DumpLogSegments (`--deep-iteration --verify-index-only`, `--index-sanity-check`) and
Kafka's leader-epoch checkpoint reader in one JVM. Here it judges:

- kcompact's outputs on a generated workload with what a broker-written one lacks (every codec, leader-epoch
  changes, out-of-order timestamps, dense indexes): the tiered segments, a first compaction, and a second one past
  the delete horizon (tombstones and markers removed, batches emptied); the broker-written input is checked in
  `test_broker_input.py`;
- one damaged copy per kind of damage, all in one run: each is reported, naming its file, and the intact copy is not.
"""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import compaction
from compaction.config import CleanupPolicy, KcompactConfig, TopicConfig
from compaction.format.segment import iter_batch_headers
from compaction.generate.topics import TopicSpec
from compaction.generate.workload import WorkloadSpec, generate_logdir
from compaction.metadata import table_in_store
from compaction.storage import ObjectStore, open_store
from compaction.tier import tier_logdir
from tests.kafka_dump import dump_check, materialise_partition

DAY = 86_400_000
SPEC = WorkloadSpec(topics=(TopicSpec("orders", 1),), records_per_partition=3000, keys=150, segment_bytes=48 * 1024,
                    index_interval_bytes=1024, tombstone_ratio=0.1, seed=25)
NOW = SPEC.start_ms + SPEC.records_per_partition * SPEC.ms_per_record + 60_000
CRC_POSITION = 17  # base offset 8, batch length 4, partition leader epoch 4, magic 1 (DefaultRecordBatch.CRC_OFFSET)


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> ObjectStore:
    root = tmp_path_factory.mktemp("dump-log-segments")
    generate_logdir(root / "logs", SPEC)
    store = open_store(str(root / "store"))
    results = tier_logdir(root / "logs", store, table_in_store(store, create=True), NOW)
    assert [r.error for r in results] == [None]
    return store


def _config() -> KcompactConfig:
    compacted = TopicConfig(cleanup_policy=frozenset({CleanupPolicy.COMPACT}), min_cleanable_dirty_ratio=0.01)
    return KcompactConfig(topics={"orders": compacted})


def test_kafkas_tools_read_kcompacts_tiered_and_compacted_segments(
        spark: SparkSession, tiered: ObjectStore, tmp_path: Path) -> None:
    files = materialise_partition(tiered, "orders", 0, tmp_path / "tiered" / "orders-0")
    first = compaction.compact(spark, tiered, _config(), NOW)
    assert first.exit_code == 0, first.to_dict()
    files += materialise_partition(tiered, "orders", 0, tmp_path / "compacted" / "orders-0")
    second = compaction.compact(spark, tiered, _config(), NOW + 2 * DAY, force=True)  # past delete.retention.ms
    assert second.exit_code == 0, second.to_dict()
    files += materialise_partition(tiered, "orders", 0, tmp_path / "past-horizon" / "orders-0")
    assert {f.suffix for f in files} >= {".log", ".index", ".timeindex", ".txnindex", ".snapshot"}
    assert len({f.parent for f in files}) == 3
    dump_check(files, tmp_path / "dump")


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def _damage(kind: str, d: Path) -> str:
    """Damages one file of the segment set in `d`; returns the text the findings must hold for it."""
    base = min(d.glob("*.log"), key=lambda f: f.name).stem
    log, index, timeindex = d / f"{base}.log", d / f"{base}.index", d / f"{base}.timeindex"
    if kind == "batch-crc":
        second = [h.position for h in iter_batch_headers(log.read_bytes())][1]
        _flip(log, second + CRC_POSITION)
        return "isvalid: false"
    if kind == "index-entry":  # entry 1 points where entry 0 does: not the batch ending at entry 1's offset
        data = bytearray(index.read_bytes())
        data[12:16] = data[4:8]
        index.write_bytes(bytes(data))
        return f"Mismatches in :{index}"
    if kind == "timeindex-entry":
        data = bytearray(timeindex.read_bytes())
        (ts,) = struct.unpack_from(">q", data, 0)
        struct.pack_into(">q", data, 0, ts - 1)
        timeindex.write_bytes(bytes(data))
        return f"Found timestamp mismatch in :{timeindex}"
    if kind == "index-length":  # not a whole number of entries: a broker rebuilds such an index at startup
        index.write_bytes(index.read_bytes() + b"\0\0\0")
        return "CorruptIndexException"
    if kind == "producer-snapshot":
        snapshot = min(d.glob("*.snapshot"))
        _flip(snapshot, snapshot.stat().st_size - 3)
        return f"{snapshot}: Snapshot is corrupt (CRC is no longer valid)"
    if kind == "leader-epochs":
        checkpoint = d / f"{base}.leader-epoch-checkpoint"
        checkpoint.write_text("0\n2\n3 100\n1 200\n")
        return f"{checkpoint}: EpochEntry[epoch=1, startOffset=200] follows EpochEntry[epoch=3, startOffset=100]"
    raise AssertionError(kind)


KINDS = ("batch-crc", "index-entry", "timeindex-entry", "index-length", "producer-snapshot", "leader-epochs")


def test_dump_check_reports_each_kind_of_damage_naming_the_file(tiered: ObjectStore, tmp_path: Path) -> None:
    intact = tmp_path / "intact" / "orders-0"
    files = materialise_partition(tiered, "orders", 0, intact)
    expected = []
    for kind in KINDS:
        d = tmp_path / kind / "orders-0"
        shutil.copytree(intact, d)
        expected.append(_damage(kind, d))
        files += sorted(d.iterdir())
    with pytest.raises(AssertionError) as failed:
        dump_check(files, tmp_path / "dump")
    message = str(failed.value)
    for kind, text in zip(KINDS, expected, strict=True):
        assert text in message, f"{kind}: {text!r} not reported:\n{message}"
    assert str(intact) not in message, message
    assert f"{tmp_path / 'batch-crc'}" in message  # a batch line names the log it was dumped from


def test_dump_check_refuses_files_it_cannot_judge(tmp_path: Path) -> None:
    (tmp_path / "partition.metadata").write_text("version: 0\n")
    with pytest.raises(ValueError, match="not a Kafka-named"):
        dump_check([tmp_path / "partition.metadata"], tmp_path / "dump")
    (tmp_path / "00000000000000000000.index").write_bytes(b"")
    with pytest.raises(ValueError, match=re.escape("reads 00000000000000000000.log beside it")):
        dump_check([tmp_path / "00000000000000000000.index"], tmp_path / "dump")
