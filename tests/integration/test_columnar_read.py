"""The columnar consumer read (`reader.segment_batches`, the scan's kernels) against the record-by-record reference
(`reader.segment_records`): the same records, headers and errors, on every kind of input a store holds."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from compaction.cli import main
from compaction.errors import ConfigError, CorruptInputError, MetadataVersionNotFoundError, UnknownPartitionError
from compaction.format import scan
from compaction.generate import TopicSpec, WorkloadSpec
from compaction.metadata import ObjectSuffix, table_in_store
from compaction.reader import (
    ConsumerRead,
    Isolation,
    SegmentRef,
    last_stable_offset,
    log_refs,
    log_transactions,
    segment_batches,
    segment_records,
    transactional_batches_read_once,
)
from compaction.spark.read import partition_read
from compaction.storage import ObjectStore, open_store
from compaction.tier import tier_logdir
from compaction.wal.upload import upload_logdir
from tests.scenario_log import transactions_across_tier_and_wal
from tests.tiered_logdir import generated_logdir

NOW = 1_800_000_000_000
SPEC = WorkloadSpec(topics=(TopicSpec("orders", 2),), records_per_partition=3000, keys=150,
                    segment_bytes=24 * 1024, seed=5).ending_at(NOW)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logdir(tmp_path_factory, "columnar", SPEC)


@pytest.fixture
def store(generated: Path, tmp_path: Path) -> ObjectStore:
    """The workload tiered, its active segments uploaded as WAL objects: the log ends in the WAL."""
    logdir = Path(shutil.copytree(generated, tmp_path / "logdir"))
    store = open_store(str(tmp_path / "store"))
    tier_logdir(logdir, store, table_in_store(store, create=True), NOW)
    upload_logdir(logdir, store, NOW, max_object_bytes=16 * 1024)
    return store


def reference(store: ObjectStore, ref: SegmentRef, **read: Any) -> list[tuple[Any, ...]]:
    return [(r.offset, r.timestamp, r.key, r.value, [(h.key, h.value) for h in r.headers])
            for r in segment_records(store, ref, ConsumerRead(**read))]


def columnar(store: ObjectStore, ref: SegmentRef, **read: Any) -> list[tuple[Any, ...]]:
    batches = list(segment_batches(store, ref, ConsumerRead(**read)))
    assert all(b.schema == scan.CONSUMER_SCHEMA for b in batches)
    return [(r["offset"], r["timestamp"], r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]])
            for r in pa.Table.from_batches(batches, scan.CONSUMER_SCHEMA).to_pylist()]


def assert_same_reads(store: ObjectStore, topic: str, partition: int, from_offsets: list[int]) -> int:
    refs = log_refs(store, topic, partition)
    aborted, unstable = log_transactions(store, refs)
    compared = 0
    for isolation in Isolation:
        for from_offset in from_offsets:
            for ref in refs:
                read = {"from_offset": from_offset, "isolation": isolation, "aborted": aborted,
                        "unstable_from": unstable}
                expected = reference(store, ref, **read)
                assert columnar(store, ref, **read) == expected, (ref.log_key, isolation, from_offset)
                compared += len(expected)
    return compared


def test_every_segment_and_wal_slice_reads_the_same(store: ObjectStore) -> None:
    for partition in (0, 1):
        refs = log_refs(store, "orders", partition)
        assert any(r.wal for r in refs) and any(not r.wal for r in refs)
        end = refs[-1].end_offset
        assert assert_same_reads(store, "orders", partition, [0, end // 3, end - 5]) > 3000


def test_transactions_spanning_the_tier_and_the_wal(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    transactions_across_tier_and_wal(store, tmp_path / "logdir", NOW)
    assert assert_same_reads(store, "orders", 0, [0, 2]) > 0


def test_large_reads_come_in_several_batches(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = next(r for r in log_refs(store, "orders", 0) if not r.wal)
    whole = columnar(store, ref)
    monkeypatch.setattr(scan, "CONSUMER_BATCH_BYTES", 1000)
    batches = list(segment_batches(store, ref))
    assert len(batches) > 5 and all(b.num_rows for b in batches)
    assert columnar(store, ref) == whole


def test_a_key_predicate_keeps_the_keyed_records_it_selects(store: ObjectStore) -> None:
    """`segment_batches(keys=...)`: the records of the whole read whose key is not null and selected, in order."""
    def even(keys: pa.Array) -> Any:
        return [k is not None and k[-1] % 2 == 0 for k in keys.to_pylist()]

    for ref in log_refs(store, "orders", 0):
        whole = columnar(store, ref)
        batches = list(segment_batches(store, ref, keys=even))
        rows = pa.Table.from_batches(batches, scan.CONSUMER_SCHEMA).to_pylist()
        assert [r["offset"] for r in rows] == [r[0] for r in whole if r[2] is not None and r[2][-1] % 2 == 0]
        assert len(rows) < len(whole)


def test_an_empty_read_is_one_empty_batch(store: ObjectStore) -> None:
    ref = next(r for r in log_refs(store, "orders", 0) if not r.wal)
    batches = list(segment_batches(store, ref, ConsumerRead(from_offset=ref.end_offset + 1)))
    assert [b.num_rows for b in batches] == [0]


def test_damage_is_the_same_error_naming_the_object_and_position(store: ObjectStore, tmp_path: Path) -> None:
    segment = table_in_store(store).live_segments("orders", 1)[1]
    key = segment.object_key(ObjectSuffix.LOG) or ""
    path = tmp_path / "store" / key  # the store never overwrites: damage the file under it
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    ref = next(r for r in log_refs(store, "orders", 1) if r.log_key == key)
    for from_offset in (0, (ref.start_offset + ref.end_offset) // 2):
        with pytest.raises(CorruptInputError) as expected:
            reference(store, ref, from_offset=from_offset)
        with pytest.raises(CorruptInputError) as got:
            columnar(store, ref, from_offset=from_offset)
        assert (type(got.value), got.value.obj, got.value.position) == (
            type(expected.value), expected.value.obj, expected.value.position)
        assert got.value.obj == store.object_uri(key)



def test_a_run_reads_each_segments_transactional_batches_once(store: ObjectStore) -> None:
    """Inside `transactional_batches_read_once`, the plan's last stable offset and the read's open and aborted
    transactions read each tier segment once between them; outside it, each pass reads it again."""
    refs = [r for r in log_refs(store, "orders", 1) if not r.wal]

    def passes() -> tuple[int, tuple[Any, ...]]:
        before = store.stats.bytes_read
        found = (last_stable_offset(store, refs), log_transactions(store, refs))
        return store.stats.bytes_read - before, found

    twice, expected = passes()
    with transactional_batches_read_once():
        once, found = passes()
        again, _ = passes()
    assert found == expected
    segments = sum(len(store.get(r.log_key)) for r in refs)
    assert twice >= 2 * segments and once < twice - segments + 1 and again < segments
    assert passes()[0] == twice


def test_the_last_stable_offset_ignores_a_wal_objects_batches_past_its_slice(tmp_path: Path) -> None:
    """A WAL slice may end before its object does: a marker past the slice's end has not happened yet for the log
    that slice ends, so the transaction it closes is still open there."""
    store = open_store(str(tmp_path / "store"))
    log = transactions_across_tier_and_wal(store, tmp_path / "logdir", NOW)
    refs = log_refs(store, "orders", 0)
    marker = next(b for b in log.batches if b.is_control and b.producer_id == 8)
    first = min(b.base_offset for b in log.batches if b.producer_id == 8)
    assert last_stable_offset(store, refs) > marker.base_offset  # whole: 8 committed
    cut = [replace(r, end_offset=marker.base_offset - 1) if r.wal and r.end_offset >= marker.base_offset else r
           for r in refs if r.start_offset < marker.base_offset]
    assert any(r.wal for r in cut)
    assert last_stable_offset(store, cut) == first


def test_a_partition_the_store_never_held_is_an_error_not_an_empty_log(
        store: ObjectStore, generated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt topic or partition, or the wrong store: exit 2 naming it (Kafka's UNKNOWN_TOPIC_OR_PARTITION), not
    an empty read that exits 0. A partition that only the WAL holds yet is known."""
    with pytest.raises(UnknownPartitionError, match="holds no partition orders-7"):
        log_refs(store, "orders", 7)
    # what the API takes from a user is checked as the command line checks it: exit 2, no traceback
    with pytest.raises(UnknownPartitionError, match="numbered from 0"):
        log_refs(store, "orders", -1)
    with pytest.raises(MetadataVersionNotFoundError, match="no table version -1"):
        log_refs(store, "orders", 0, version=-1)
    with pytest.raises(ConfigError, match="from_offset -1"):
        partition_read(store, log_refs(store, "orders", 0), -1, Isolation.READ_COMMITTED)
    nowhere = str(tmp_path / "no-store-here")
    for command in ("read", "segments"):
        for uri, topic, partition in ((store.uri, "ordrs", 0), (store.uri, "orders", 7), (nowhere, "orders", 0)):
            assert main([command, "--store", uri, "--topic", topic, "--partition", str(partition)]) == 2
            assert f"holds no partition {topic}-{partition}" in capsys.readouterr().err
    wal_only = open_store(str(tmp_path / "wal-only"))
    upload_logdir(Path(shutil.copytree(generated, tmp_path / "logdir-wal")), wal_only, NOW)
    capsys.readouterr()
    assert main(["segments", "--store", wal_only.uri, "--topic", "orders", "--partition", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "0 live segments"
    assert main(["read", "--store", wal_only.uri, "--topic", "orders", "--partition", "1"]) == 0
    assert capsys.readouterr().out.count("\n") > 0
