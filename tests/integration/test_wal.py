"""`kcompact wal upload` / `list`, reads across tier and WAL, failover, bad objects, crashes and gc of combined
objects, on the local store and on S3 (moto). The roll (a Spark job) is in tests/spark/test_wal_roll.py."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from deltalake import write_deltalake

from compaction.cli import main
from compaction.errors import (
    CorruptInputError,
    CrcMismatchError,
    InvalidStateTransitionError,
    MissingObjectError,
    TransientStoreError,
    TruncatedSegmentError,
)
from compaction.gc import collect_garbage
from compaction.metadata import SegmentState, table_in_store
from compaction.reader import Isolation, consumer_records, log_refs
from compaction.storage import ObjectStore
from compaction.wal import table as wal_table_module
from compaction.wal.model import objects_to_arrow
from compaction.wal.table import WalTable
from compaction.wal.upload import upload_logdir
from tests.scenario_log import ScenarioLog, consumed, tier, transactions_across_tier_and_wal

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from kafka.record.memory_records import MemoryRecords

NOW = 1_700_000_000_000
GRACE = 60_000


def filled(topic: str, partition: int = 0, n: int = 30, *, epoch: int = 0, roll_every: int = 10) -> ScenarioLog:
    log = ScenarioLog(topic, NOW - 10_000, partition, leader_epoch=epoch)
    for i in range(n):
        log.record(i % 7, f"{topic}-{partition}-{i}".encode())
        if (i + 1) % roll_every == 0:
            log.roll()
    return log


def read(store: ObjectStore, log: ScenarioLog, isolation: Isolation = Isolation.READ_UNCOMMITTED
         ) -> list[tuple[int, bytes]]:
    refs = log_refs(store, log.topic, log.partition)
    return [(r.offset, r.value or b"") for r in consumer_records(store, refs, isolation=isolation)]


def test_upload_packs_many_partitions_into_small_objects_and_reads_back_every_record(
    store: ObjectStore, tmp_path: Path
) -> None:
    logs = [filled("orders", 0), filled("orders", 1), filled("users", 0, n=45)]
    for log in logs:
        log.write(tmp_path / "logdir")
    report = upload_logdir(tmp_path / "logdir", store, NOW, broker_id=3, max_object_bytes=1500)
    assert report.exit_code == 0
    objects = WalTable.in_store(store).objects()
    assert len(objects) == len(report.objects) > 3
    assert all(o.size <= 1500 and o.state is SegmentState.COPY_SEGMENT_FINISHED and o.broker_id == 3
               for o in objects)
    assert any(len({e.tp for e in o.entries}) > 1 for o in objects), "no object combines partitions"
    for o in objects:  # the referee decodes every entry's bytes on its own, CRCs checked
        data = store.get(o.key)
        assert len(data) == o.size
        for e in o.entries:
            records = MemoryRecords(data[e.start_position : e.end_position])
            offsets = []
            while (batch := records.next_batch()) is not None:
                assert batch.validate_crc()
                offsets.extend(r.offset for r in batch)
            assert offsets[0] == e.start_offset and offsets[-1] == e.end_offset
    for log in logs:
        assert read(store, log) == consumed(log.batches)


def test_a_rerun_uploads_nothing_and_new_data_only_what_is_new(store: ObjectStore, tmp_path: Path) -> None:
    log, other = filled("orders", 0), filled("orders", 1)
    log.write(tmp_path / "logdir")
    other.write(tmp_path / "logdir")
    upload_logdir(tmp_path / "logdir", store, NOW)
    puts = store.stats.puts
    again = upload_logdir(tmp_path / "logdir", store, NOW + 1)
    assert again.objects == [] and store.stats.puts == puts
    assert {p.status for p in again.partitions} == {"up_to_date"}
    for i in range(30, 37):
        log.record(i, f"late-{i}".encode())
    log.write(tmp_path / "logdir")
    more = upload_logdir(tmp_path / "logdir", store, NOW + 2)
    [entry] = [e for o in more.objects for e in o.entries]
    assert (entry.topic, entry.partition, entry.start_offset, entry.end_offset) == ("orders", 0, 30, 36)
    assert read(store, log) == consumed(log.batches)


def test_read_crosses_from_the_tier_into_the_wal_with_transactions_spanning_both(
    store: ObjectStore, tmp_path: Path
) -> None:
    log = transactions_across_tier_and_wal(store, tmp_path / "logdir", NOW)
    assert table_in_store(store).live_segments("orders", 0), "nothing was tiered"
    refs = log_refs(store, "orders", 0)
    assert [r.wal for r in refs] == [False, True]
    for isolation in Isolation:
        assert read(store, log, isolation) == consumed(log.batches, isolation)
    assert [o for o, _v in read(store, log, Isolation.READ_COMMITTED)] == [0, 3, 4, 7]


def test_failover_follows_the_newest_epoch_and_fences_the_deposed_leader(store: ObjectStore, tmp_path: Path) -> None:
    old = filled("orders", 0, n=15, epoch=5)
    old.write(tmp_path / "broker1")
    assert upload_logdir(tmp_path / "broker1", store, NOW, broker_id=1).exit_code == 0
    # The old leader writes on (offsets 15..19, epoch 5) and uploads, but a follower that had only 0..11 is
    # elected with epoch 6 and writes its own 12..21.
    for i in range(15, 20):
        old.record(i, f"lost-{i}".encode())
    old.write(tmp_path / "broker1")
    upload_logdir(tmp_path / "broker1", store, NOW + 1, broker_id=1)
    new = ScenarioLog("orders", NOW - 10_000, 0, leader_epoch=5, batches=old.batches[:12], segment_bases=[0, 10])
    new.leader_epoch = 6
    for i in range(12, 22):
        new.record(i, f"new-{i}".encode())
    new.write(tmp_path / "broker2")
    report = upload_logdir(tmp_path / "broker2", store, NOW + 2, broker_id=2)
    [p] = report.partitions
    assert (p.status, p.from_offset, p.diverged_at, p.end_offset) == ("uploaded", 12, 12, 22)
    assert read(store, new) == consumed(new.batches)
    # The deposed leader appends more under epoch 5: fenced, nothing uploaded, the log unchanged.
    for i in range(20, 25):
        old.record(i, f"deposed-{i}".encode())
    old.write(tmp_path / "broker1")
    objects_before = len(WalTable.in_store(store).objects())
    fenced = upload_logdir(tmp_path / "broker1", store, NOW + 3, broker_id=1)
    assert fenced.exit_code == 4 and fenced.partitions[0].status == "fenced"
    assert len(WalTable.in_store(store).objects()) == objects_before
    assert read(store, new) == consumed(new.batches)
    # gc: the object holding only the deposed epoch-5 tail (15..19) goes a grace after epoch 6 arrived.
    assert collect_garbage(store, table_in_store(store, create=True), NOW + 2 + GRACE - 1).wal["objects_deleted"] == 0
    gone = collect_garbage(store, table_in_store(store), NOW + 2 + GRACE).wal
    assert gone is not None and gone["objects_deleted"] == 1
    assert read(store, new) == consumed(new.batches)


def test_cli_upload_and_list(store: ObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    filled("orders", 0).write(tmp_path / "logdir")
    filled("users", 0).write(tmp_path / "logdir")
    endpoint = ["--endpoint-url", store.spec.endpoint_url] if store.spec.endpoint_url else []
    assert main(["wal", "upload", "--logdir", str(tmp_path / "logdir"), "--store", store.uri, *endpoint,
                 "--now", str(NOW), "--json"]) == 0
    upload = json.loads(capsys.readouterr().out)
    assert upload["objects"] == 1 and {p["status"] for p in upload["partitions"]} == {"uploaded"}
    assert main(["wal", "list", "--store", store.uri, *endpoint, "--topic", "users", "--json"]) == 0
    [item] = json.loads(capsys.readouterr().out)
    assert set(item) == {"object_id", "uri", "size", "state", "broker_id", "created_ms", "entries"}
    assert item["uri"] == store.object_uri(f"wal/{item['object_id']}.wal") and item["created_ms"] == NOW
    assert [(e["topic"], e["start_offset"], e["end_offset"], e["leader_epoch"]) for e in item["entries"]] == [
        ("users", 0, 29, 0)]


def _damaged(store: ObjectStore, tmp_path: Path, damage: str) -> tuple[ScenarioLog, str, int]:
    log, other = filled("orders", 0), filled("users", 0)
    log.write(tmp_path / "logdir")
    other.write(tmp_path / "logdir")
    upload_logdir(tmp_path / "logdir", store, NOW, max_object_bytes=800)
    o = next(o for o in WalTable.in_store(store).objects() if any(e.topic == "orders" for e in o.entries))
    e = next(e for e in o.entries if e.topic == "orders")
    path = Path(store.uri.removeprefix("file://")) / o.key
    if damage == "missing":
        store.delete(o.key)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: e.end_position - 3])
    else:
        data = bytearray(path.read_bytes())
        data[e.start_position + 61] ^= 0xFF  # inside the first record of the entry
        path.write_bytes(bytes(data))
    return other, o.key, e.start_position


@pytest.mark.parametrize(("damage", "error"), [("missing", MissingObjectError), ("truncated", TruncatedSegmentError),
                                               ("crc", CrcMismatchError)])
def test_a_bad_wal_object_fails_the_read_naming_the_object_and_position(
    local_store: ObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, error: type
) -> None:
    other, key, position = _damaged(local_store, tmp_path, damage)
    refs = log_refs(local_store, "orders", 0)
    with pytest.raises(error) as caught:
        list(consumer_records(local_store, refs))
    assert caught.value.obj == local_store.object_uri(key)  # type: ignore[attr-defined]
    if damage == "crc":
        assert caught.value.position == position + 17  # type: ignore[attr-defined]  # the batch's CRC field
    assert main(["read", "--store", local_store.uri, "--topic", "orders", "--partition", "0"]) == 3
    assert local_store.object_uri(key) in capsys.readouterr().err
    assert read(local_store, other) == consumed(other.batches), "another partition's read was affected"


def test_an_upload_that_dies_after_started_leaves_nothing_visible_and_the_rerun_converges(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = filled("orders", 0)
    log.write(tmp_path / "logdir")
    real_put = type(store).put

    def failing_put(self: ObjectStore, key: str, data: bytes) -> None:
        if key.startswith("wal/"):
            raise TransientStoreError(f"injected: PUT {key} failed")
        real_put(self, key, data)

    monkeypatch.setattr(type(store), "put", failing_put)
    failed = upload_logdir(tmp_path / "logdir", store, NOW)
    assert failed.exit_code == 4 and failed.partitions[0].error_type == "TransientStoreError"
    [started] = WalTable.in_store(store).objects()
    assert started.state is SegmentState.COPY_SEGMENT_STARTED
    assert log_refs(store, "orders", 0) == []
    monkeypatch.setattr(type(store), "put", real_put)
    assert upload_logdir(tmp_path / "logdir", store, NOW + 1).exit_code == 0
    assert read(store, log) == consumed(log.batches)
    # gc retires the abandoned attempt a grace later; the log is untouched.
    report = collect_garbage(store, table_in_store(store, create=True), NOW + GRACE)
    assert report.wal is not None and report.wal["deleted"][0]["object_id"] == started.object_id
    states = {o.object_id: o.state for o in WalTable.in_store(store).objects()}
    assert states[started.object_id] is SegmentState.DELETE_SEGMENT_FINISHED
    assert read(store, log) == consumed(log.batches)


def test_finished_and_delete_started_of_one_object_never_both_land(
    local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uploader finishing an object while gc retires it: whichever commits second is refused by Delta's
    conflict check, re-plans, and finds a transition KIP-405 does not allow."""
    filled("orders", 0).write(tmp_path / "logdir")
    table = WalTable.in_store(local_store, create=True)
    upload_logdir(tmp_path / "logdir", local_store, NOW)
    [o] = table.objects()
    # Put it back to STARTED, as an upload in flight would have it.
    in_flight = replace(o, state=SegmentState.COPY_SEGMENT_STARTED)
    write_deltalake(table.table_uri, objects_to_arrow([in_flight]), mode="overwrite",
                    predicate=f"object_id = '{o.object_id}'")
    real_write = wal_table_module.write_deltalake
    raced = []

    def racing_write(dt: object, data: object, **kwargs: object) -> None:
        if not raced:  # gc's retire lands between the uploader's read and its commit
            raced.append(True)
            WalTable.in_store(local_store).change_state([o.object_id], SegmentState.DELETE_SEGMENT_STARTED, NOW)
        real_write(dt, data, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(wal_table_module, "write_deltalake", racing_write)
    with pytest.raises(InvalidStateTransitionError):
        table.change_state([o.object_id], SegmentState.COPY_SEGMENT_FINISHED, NOW)
    [after] = table.objects()
    assert after.state is SegmentState.DELETE_SEGMENT_STARTED


def test_a_corrupt_local_segment_fails_its_partition_before_anything_of_it_is_uploaded(
    local_store: ObjectStore, tmp_path: Path
) -> None:
    bad, good = filled("orders", 0), filled("users", 0)
    bad.write(tmp_path / "logdir")
    good.write(tmp_path / "logdir")
    segment = tmp_path / "logdir" / "orders-0" / f"{10:020d}.log"
    data = bytearray(segment.read_bytes())
    data[-5] ^= 0x01  # the last batch of the second segment: every batch before it is valid
    segment.write_bytes(bytes(data))
    report = upload_logdir(tmp_path / "logdir", local_store, NOW)
    status = {p.topic: p for p in report.partitions}
    assert report.exit_code == 3 and status["orders"].error_type == "CrcMismatchError"
    assert str(segment) in (status["orders"].error or "") and status["users"].status == "uploaded"
    assert {e.topic for o in WalTable.in_store(local_store).objects() for e in o.entries} == {"users"}


def test_gc_dry_run_lists_the_combined_objects_it_would_delete_and_deletes_nothing(
    store: ObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = filled("orders", 0)
    log.write(tmp_path / "logdir")
    upload_logdir(tmp_path / "logdir", store, NOW, max_object_bytes=800)
    # Tier the same log (a broker's KIP-405 copy): every combined object is covered from then on.
    tier([log], tmp_path / "logdir", store, NOW + 1)
    covered = [o for o in WalTable.in_store(store).objects() if o.entries[0].end_offset < 30]
    assert covered, "nothing covered: the test would not test the listing"
    endpoint = ["--endpoint-url", store.spec.endpoint_url] if store.spec.endpoint_url else []
    args = ["gc", "--store", store.uri, *endpoint, "--now", str(NOW + 1 + GRACE)]
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(f"would delete {store.object_uri(o.key)}" in out for o in covered), out
    assert all(store.exists(o.key) for o in covered)
    assert main([*args, "--dry-run", "--json"]) == 0
    listed = {d["uri"] for d in json.loads(capsys.readouterr().out)["wal"]["would_delete"]}
    assert listed == {store.object_uri(o.key) for o in covered}
    assert read(store, log) == consumed(log.batches)


@pytest.mark.parametrize("batch", ["middle", "last"])
def test_a_damaged_base_offset_which_no_crc_covers_is_caught_not_skipped(
    local_store: ObjectStore, tmp_path: Path, batch: str
) -> None:
    """A batch's base offset is outside its CRC (as in Kafka): a damaged one must fail the read, not end it early."""
    log = filled("orders", 0, n=12, roll_every=100)  # one entry of 12 single-record batches
    log.write(tmp_path / "logdir")
    upload_logdir(tmp_path / "logdir", local_store, NOW)
    [o] = WalTable.in_store(local_store).objects()
    from compaction.format.segment import iter_batch_headers

    data = bytearray(local_store.get(o.key))
    headers = list(iter_batch_headers(bytes(data)))
    victim = headers[5] if batch == "middle" else headers[-1]
    data[victim.position] ^= 0x55  # the high byte of the base offset: a huge offset, CRC still valid
    (Path(local_store.uri.removeprefix("file://")) / o.key).write_bytes(bytes(data))
    with pytest.raises(CorruptInputError) as caught:
        list(consumer_records(local_store, log_refs(local_store, "orders", 0)))
    assert caught.value.obj == local_store.object_uri(o.key)  # type: ignore[attr-defined]
    assert caught.value.position is not None  # type: ignore[attr-defined]
