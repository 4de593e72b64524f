"""Corrupt input quarantines its partition, names the object and the byte, and commits nothing for it.

One store, one topic, one partition per kind of damage, and one compaction run through the CLI (so the exit
code and the JSON report are checked on the way), on the shared local[2] SparkSession. Corruption is written
at a named byte offset, computed from Kafka's batch layout (`compaction.format.batch`):

| partition | damage                                               | where it is found                          |
|-----------|------------------------------------------------------|--------------------------------------------|
| 0         | none                                                 | compacts                                   |
| 1         | a record byte in two segments (CRC-32C mismatch)     | executor scan                              |
| 2         | the last segment cut in the middle of a batch        | executor scan                              |
| 3         | a batch's magic byte set to 1 (a legacy message set) | executor scan                              |
| 4         | garbage offset and time indexes                      | nowhere: never read, rewritten ones rebuilt |
| 5         | a segment's .log object deleted from the store       | executor scan                              |
| 6         | a row names a .txnindex object never written         | driver, reading txn indexes                |
| 7         | a txn index with an unknown entry version            | driver, reading txn indexes                |
| 8         | the last segment's producer snapshot is garbage      | driver, planning (open transactions)       |

What a compaction reads: every scanned segment's .log (twice: scan and rewrite), every live segment's
.txnindex, and the last live segment's producer .snapshot; .index and .timeindex are never read (the rewrite
builds new ones) and .snapshot / leader-epoch-checkpoint of a group's last input are copied as bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compaction.cli import main
from compaction.format.batch import CRC_OFFSET, MAGIC_OFFSET, RECORDS_OFFSET
from compaction.format.indexes import build_indexes
from compaction.format.segment import iter_batches
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import ChangeSet, ObjectKey, ObjectSuffix, SegmentMetadata, commit, table_in_store
from compaction.metadata.change_set import AddedObjectKey
from compaction.spark.session import build_session
from compaction.storage import open_store
from compaction.storage.indexes import get_part, is_parts_key, pack_parts, read_header, unpack_parts
from compaction.storage.layout import Suffix, segment_object_key
from compaction.storage.local import LocalStore
from compaction.tier import tier_logdir
from tests.borrowed_session import BorrowedSession
from tests.latest_view import view_differences, views

NOW = 1_800_000_000_000
DAY = 86_400_000
TOPIC = "bad"
PARTITIONS = [(TOPIC, p) for p in range(9)]
SETTINGS = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
SPEC = WorkloadSpec(topics=(TopicSpec(TOPIC, len(PARTITIONS)),), records_per_partition=400, keys=40,
                    segment_bytes=12 * 1024, value_bytes=60, transactional_ratio=0.1, seed=7)  # all eligible


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """The test run's one SparkSession: getOrCreate hands out the session tests/spark/conftest.py builds (or
    builds it, to be handed to that fixture later); that fixture stops it at the end of the run."""
    yield build_session("local[2]", "kcompact-tests", {"spark.driver.memory": "1g"})


def path_of(store: LocalStore, key: str | None) -> Path:
    assert key is not None
    return store.root / key


def batch_positions(data: bytes) -> list[int]:
    return [pos for pos, _batch in iter_batches(data)]


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def add_object_key(store: LocalStore, seg: SegmentMetadata, suffix: Suffix, data: bytes | None) -> str:
    """Make `seg`'s row name a `suffix` object (written with `data`, or never written if None)."""
    table = table_in_store(store)
    current = table.partition_snapshot(seg.topic, seg.partition)
    key = segment_object_key(seg.topic, current.topic_id or "", seg.partition, seg.start_offset, seg.segment_id,
                             suffix)
    if data is not None:
        store.put(key, data)
    change = ChangeSet.planned_from(current, fencing_epoch=current.fencing_epoch, writer="test",
                                    added_object_keys=[AddedObjectKey(seg.segment_id, ObjectKey(suffix, key))])
    commit(table, change, NOW - DAY)
    return key


Expected = dict[int, tuple[str, dict[str, int | None]]]  # partition -> (error type, {object key: byte position})


def damage(store: LocalStore) -> Expected:
    """Damage partitions 1-8 (see the module docstring); per partition the error type and the objects it may
    name (with the byte position it must name): either of two damaged segments may be found first."""
    live = {p: table_in_store(store).live_segments(TOPIC, p) for _t, p in PARTITIONS}
    crc: dict[str, int | None] = {}
    for seg in live[1][:2]:  # a record byte of the second batch, in each of two segments
        log = path_of(store, seg.object_key(ObjectSuffix.LOG))
        second = batch_positions(log.read_bytes())[1]
        flip(log, second + RECORDS_OFFSET + 2)
        crc[seg.object_key(ObjectSuffix.LOG) or ""] = second + CRC_OFFSET
    expected: Expected = {1: ("CrcMismatchError", crc)}

    last_log = path_of(store, live[2][-1].object_key(ObjectSuffix.LOG))
    data = last_log.read_bytes()
    cut_batch = batch_positions(data)[-1]
    last_log.write_bytes(data[: cut_batch + 30])  # mid-header of the last batch
    expected[2] = ("TruncatedSegmentError", {live[2][-1].object_key(ObjectSuffix.LOG) or "": cut_batch})

    log3 = path_of(store, live[3][0].object_key(ObjectSuffix.LOG))
    third = batch_positions(log3.read_bytes())[2]
    data3 = bytearray(log3.read_bytes())
    data3[third + MAGIC_OFFSET] = 1
    log3.write_bytes(bytes(data3))
    expected[3] = ("UnsupportedMagicError", {live[3][0].object_key(ObjectSuffix.LOG) or "": third + MAGIC_OFFSET})

    for seg in live[4]:
        replace_part(store, seg, ObjectSuffix.OFFSET_INDEX, b"\xffgarbage-index\x01")
        replace_part(store, seg, ObjectSuffix.TIME_INDEX, b"\x00" * 5)

    gone = live[5][0].object_key(ObjectSuffix.LOG) or ""
    path_of(store, gone).unlink()
    expected[5] = ("MissingObjectError", {gone: None})

    no_txn = [s for s in live[6] if s.object_key(ObjectSuffix.TXN_INDEX) is None]
    expected[6] = ("MissingObjectError", {add_object_key(store, no_txn[0], Suffix.TXN_INDEX, None): None})

    no_txn = [s for s in live[7] if s.object_key(ObjectSuffix.TXN_INDEX) is None]
    bad_entry = b"\x05" + b"\x00" * 33  # one 34-byte AbortedTxn entry of version 5
    expected[7] = ("CorruptIndexError", {add_object_key(store, no_txn[0], Suffix.TXN_INDEX, bad_entry): 0})

    snapshot = live[8][-1].object_key(ObjectSuffix.PRODUCER_SNAPSHOT) or ""
    at = replace_part(store, live[8][-1], ObjectSuffix.PRODUCER_SNAPSHOT, b"\x00\x07 not a producer snapshot")
    expected[8] = ("CorruptIndexError", {snapshot: at})  # the byte of the .indexes object, not of its part
    return expected


def replace_part(store: LocalStore, seg: SegmentMetadata, suffix: Suffix, data: bytes) -> int:
    """Rewrites, in place, the `.indexes` object holding `seg`'s file `suffix` with that part's bytes replaced by
    `data` (its header still valid); the part's position in the object."""
    key = seg.object_key(suffix) or ""
    assert is_parts_key(key), key
    path = path_of(store, key)
    parts = unpack_parts(path.read_bytes(), obj=key)
    packed = pack_parts({**parts, suffix: data})
    path.write_bytes(packed)
    return read_header(packed, obj=key)[suffix][0]


@pytest.mark.spark
def test_corrupt_input_quarantines_only_its_partition_through_the_cli(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    generate_logdir(tmp_path / "logs", SPEC)
    store = open_store(str(tmp_path / "store"))
    assert isinstance(store, LocalStore)
    tier_logdir(tmp_path / "logs", store, table_in_store(store, create=True), NOW - 10 * DAY)
    before = views(store, PARTITIONS)
    expected = damage(store)
    table = table_in_store(store)
    live_before = {p: table.live_segments(TOPIC, p) for _t, p in PARTITIONS}
    config = tmp_path / "kcompact.yaml"
    config.write_text("defaults:\n" + "".join(f"  {k}: {v!r}\n" for k, v in SETTINGS.items()))

    monkeypatch.setattr("compaction.spark.session.build_session", lambda *a, **k: BorrowedSession(spark))
    code = main(["compact", "--store", store.uri, "--config", str(config), "--now", str(NOW), "--json"])
    out, err = capsys.readouterr()
    assert out.startswith("{"), f"no report (exit {code}): {err}"
    report = json.loads(out)
    assert code == 3
    failed = {f["partition"]: f for f in report["failed"]}
    assert sorted(failed) == sorted(expected), report["failed"]
    for p, (error_type, objects) in expected.items():
        f = failed[p]
        assert (f["topic"], f["exit_code"]) == (TOPIC, 3), f
        assert error_type in f"{f['error_type']}: {f['error']}", f
        [position] = [pos for k, pos in objects.items() if store.object_uri(k) in f["error"]]
        if position is not None:
            assert re.search(rf"\bbyte {position}\b", f["error"]), f
    committed = {p["partition"] for p in report["partitions"] if p["committed"]}
    assert committed == {0, 4}, "the healthy partition and the one with garbage indexes still compact"

    table = table_in_store(store)
    for p in expected:
        assert table.live_segments(TOPIC, p) == live_before[p], f"nothing committed for partition {p}"
    for p in (0, 4):
        assert table.live_segments(TOPIC, p) != live_before[p]
    intact = [tp for tp in PARTITIONS if tp[1] in (0, 4, 8)]  # a consumer cannot read the others either
    assert not view_differences({tp: before[tp] for tp in intact}, views(store, intact))
    old_ids = {s.segment_id for s in live_before[4]}
    rewritten = [s for s in table.live_segments(TOPIC, 4) if s.segment_id not in old_ids]
    assert rewritten
    for seg in rewritten:  # built from the rewritten log, not carried over
        log = store.get(seg.object_key(ObjectSuffix.LOG) or "")
        rebuilt = build_indexes(log, seg.start_offset, 4096)
        assert get_part(store, seg.object_key(ObjectSuffix.OFFSET_INDEX) or "", Suffix.OFFSET_INDEX
                        ) == rebuilt.offset_index
        assert get_part(store, seg.object_key(ObjectSuffix.TIME_INDEX) or "", Suffix.TIME_INDEX) == rebuilt.time_index


def test_a_partition_quarantined_at_planning_fails_the_run_even_with_nothing_to_compact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unreadable producer snapshot holds its partition back at planning; with no other partition to compact
    the run must still exit 3 and list the failure (an orchestrator acting on exit codes would miss it)."""
    generate_logdir(tmp_path / "logs", WorkloadSpec(topics=(TopicSpec(TOPIC, 1),), records_per_partition=400,
                                                    keys=40, segment_bytes=4096, seed=5))
    store = open_store(str(tmp_path / "store"))
    tier_logdir(tmp_path / "logs", store, table_in_store(store, create=True), NOW - 10 * DAY)
    live = table_in_store(store).live_segments(TOPIC, 0)
    last = next(s for s in reversed(live) if s.object_key(ObjectSuffix.PRODUCER_SNAPSHOT))
    replace_part(store, last, ObjectSuffix.PRODUCER_SNAPSHOT, b"\x00\x07 not a producer snapshot")
    config = tmp_path / "kcompact.yaml"
    config.write_text("defaults:\n" + "".join(f"  {k}: {v!r}\n" for k, v in SETTINGS.items()))
    code = main(["compact", "--store", store.uri, "--config", str(config), "--now", str(NOW), "--json"])
    out, _err = capsys.readouterr()
    report = json.loads(out[out.index("{"):])
    assert code == 3 and report["exit_code"] == 3
    [failed] = report["failed"]
    assert (failed["topic"], failed["partition"], failed["exit_code"]) == (TOPIC, 0, 3)
    assert store.object_uri(last.object_key(ObjectSuffix.PRODUCER_SNAPSHOT) or "") in failed["error"]
    assert table_in_store(store).live_segments(TOPIC, 0) == live
