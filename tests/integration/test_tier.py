"""`kcompact tier`, `segments` and `read` on both backends: tiered data reads back exactly; reruns, crashes converge."""

from __future__ import annotations

import base64
import dataclasses
import importlib
import itertools
import json
import shutil
from pathlib import Path

import pyarrow.dataset as pads
import pytest
from deltalake import DeltaTable

from compaction.cli import main
from compaction.errors import CorruptInputError
from compaction.format.checkpoints import EpochEntry
from compaction.format.control import ControlType, batch_control_type
from compaction.format.producer_snapshot import ProducerStateEntry, producer_state_from_log, read_producer_snapshot
from compaction.format.segment import iter_batches
from compaction.gc import collect_garbage
from compaction.gc.plan import DEFAULT_ORPHAN_GRACE_MS
from compaction.generate import TopicSpec, WorkloadSpec
from compaction.metadata import (
    METADATA_SCHEMA,
    ChangeSet,
    NewSegment,
    ObjectKey,
    ObjectSuffix,
    SegmentState,
    TopicPartition,
    commit,
    table_in_store,
)
from compaction.metadata.snapshot import referenced_object_keys
from compaction.reader import ConsumerRead, Isolation, consumer_records, segment_records, segment_ref
from compaction.storage import ObjectStore, open_store
from compaction.storage.indexes import READ_AHEAD, get_part, read_header
from compaction.storage.layout import new_segment_id, segment_object_key
from compaction.tier import tier_logdir
from compaction.tier.logdir import partitions
from tests.tiered_logdir import generated_logdir

NOW = 1_800_000_000_000
SPEC = WorkloadSpec(topics=(TopicSpec("orders", 2), TopicSpec("users.v2", 1)), records_per_partition=2500,
                    keys=200, segment_bytes=40 * 1024, seed=11)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_logdir(tmp_path_factory, "gen", SPEC)


@pytest.fixture
def logdir(generated: Path, tmp_path: Path) -> Path:
    """A private copy: tests may damage it."""
    return Path(shutil.copytree(generated, tmp_path / "logdir"))


def rolled_records(part_dir: Path) -> list[tuple]:
    """Decode the original files: every data record of the rolled (non-active) segments."""
    logs = sorted(part_dir.glob("*.log"))[:-1]
    out = []
    for log in logs:
        for _pos, batch in iter_batches(log.read_bytes()):
            if not batch.is_control:
                out.extend((r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch.records)
    return out


def read_back(store: ObjectStore, topic: str, partition: int, isolation: Isolation = Isolation.READ_UNCOMMITTED,
              from_offset: int = 0) -> list[tuple]:
    refs = [segment_ref(s) for s in table_in_store(store).live_segments(topic, partition)]
    return [(r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in consumer_records(store, refs, isolation=isolation, from_offset=from_offset)]


def test_tiered_partitions_read_back_exactly(logdir: Path, store: ObjectStore) -> None:
    results = tier_logdir(logdir, store, table_in_store(store, create=True), NOW)
    assert [r.error for r in results] == [None, None, None]
    for topic, partition in [("orders", 0), ("orders", 1), ("users.v2", 0)]:
        expected = rolled_records(logdir / f"{topic}-{partition}")
        assert read_back(store, topic, partition) == expected
        assert read_back(store, topic, partition, from_offset=1000) == [r for r in expected if r[0] >= 1000]
        live = table_in_store(store).live_segments(topic, partition)
        assert len(live) == len(list((logdir / f"{topic}-{partition}").glob("*.log"))) - 1
        assert all(s.end_offset + 1 == n.start_offset for s, n in itertools.pairwise(live))
        for seg in live:
            assert store.get(seg.object_key(ObjectSuffix.LOG) or "") == (
                logdir / f"{topic}-{partition}" / f"{seg.start_offset:020d}.log").read_bytes()


def test_reading_from_an_offset_fetches_only_the_segment_tail(logdir: Path, store: ObjectStore) -> None:
    """A ranged GET from the offset index's entry on: fewer bytes, the same records, errors name the position
    in the whole object."""
    tier_logdir(logdir, store, table_in_store(store, create=True), NOW)
    seg = max(table_in_store(store).live_segments("orders", 0), key=lambda s: s.segment_size_bytes)
    ref = segment_ref(seg)
    middle = (seg.start_offset + seg.end_offset) // 2
    whole = [(r.offset, r.value) for r in segment_records(store, ref) if r.offset >= middle]
    before = store.stats.bytes_read
    tail = [(r.offset, r.value) for r in segment_records(store, ref, ConsumerRead(from_offset=middle))]
    fetched = store.stats.bytes_read - before
    index_size = store.size(ref.offset_index_key or "")
    assert tail == whole and tail[0][0] == middle
    assert fetched - index_size < 0.75 * seg.segment_size_bytes, (fetched, seg.segment_size_bytes)
    data = bytearray(store.get(ref.log_key))
    last = max(pos for pos, _b in iter_batches(bytes(data)))
    data[last + 30] ^= 0xFF  # inside the CRC-covered part of the last batch
    store.delete(ref.log_key)
    store.put(ref.log_key, bytes(data))
    with pytest.raises(CorruptInputError, match=rf"byte {last + 17}\b"):
        list(segment_records(store, ref, ConsumerRead(from_offset=middle)))


def test_read_committed_drops_aborted_transactions_and_stops_at_the_open_ones(logdir: Path,
                                                                            local_store: ObjectStore) -> None:
    tier_logdir(logdir, local_store, table_in_store(local_store, create=True), NOW)
    part = logdir / "orders-0"
    batches = [b for log in sorted(part.glob("*.log"))[:-1] for _p, b in iter_batches(log.read_bytes())]
    aborted_pids: dict[int, list[tuple[int, int]]] = {}
    open_first: dict[int, int] = {}
    for b in batches:
        if b.is_transactional and not b.is_control:
            open_first.setdefault(b.producer_id, b.base_offset)
        if b.is_control:
            first = open_first.pop(b.producer_id, None)
            if batch_control_type(b) is ControlType.ABORT and first is not None:
                aborted_pids.setdefault(b.producer_id, []).append((first, b.base_offset))
    assert aborted_pids, "the workload must contain aborted transactions"

    def aborted(b) -> bool:  # type: ignore[no-untyped-def]
        ranges = aborted_pids.get(b.producer_id, [])
        return b.is_transactional and any(f <= b.base_offset <= last for f, last in ranges)

    stable = min(open_first.values(), default=batches[-1].next_offset)  # the tier's last stable offset
    expected = [r.offset for b in batches if not b.is_control and not aborted(b) and b.base_offset < stable
                for r in b.records]
    got = [r[0] for r in read_back(local_store, "orders", 0, Isolation.READ_COMMITTED)]
    assert got == expected
    assert len(got) < len(read_back(local_store, "orders", 0))


def test_rerun_copies_only_new_segments(logdir: Path, tmp_path: Path, local_store: ObjectStore,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    table = table_in_store(local_store, create=True)
    early = tmp_path / "early"
    for part in logdir.iterdir():
        (early / part.name).mkdir(parents=True)
        logs = sorted(part.glob("*.log"))
        for f in part.iterdir():
            stem = f.name.split(".")[0]
            if not stem.isdigit() or int(stem) <= int(logs[3].name.split(".")[0]):
                shutil.copy(f, early / part.name / f.name)
    first = tier_logdir(early, local_store, table, NOW)
    assert all(len(r.copied) == 3 for r in first)
    version = table.version()
    again = tier_logdir(early, local_store, table, NOW)
    assert all(not r.copied for r in again) and table.version() == version
    batch_module, reads = importlib.import_module("compaction.metadata.batch"), []
    real = batch_module.load_partitions
    monkeypatch.setattr(batch_module, "load_partitions", lambda *args: reads.append(args) or real(*args))
    later = tier_logdir(logdir, local_store, table, NOW)
    assert all(r.already_tiered == 3 and r.copied for r in later)
    assert reads == [], "its commits start from the rows it read first, and from what each commit wrote"
    assert read_back(local_store, "orders", 1) == rolled_records(logdir / "orders-1")


def test_crash_mid_upload_leaves_nothing_live_and_rerun_converges(logdir: Path, store: ObjectStore,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch's one commit comes after its uploads: a crash before it leaves objects no row names (gc's orphans,
    deleted once older than its orphan grace) and no row at all; a rerun tiers everything again."""
    table = table_in_store(store, create=True)
    real_put_file = store.put_file
    calls = {"n": 0}

    def crashing_put_file(key: str, path: object) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash mid-upload")
        real_put_file(key, path)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "put_file", crashing_put_file)
    with pytest.raises(RuntimeError):
        tier_logdir(logdir, store, table, NOW)
    assert table.version() == 0 and table.snapshot().partitions == {}, "nothing committed before the uploads end"
    left = {o.key for o in store.list() if o.key.endswith(".log")}
    assert left  # what was uploaded before the crash (other partitions' uploads go on beside it)
    monkeypatch.setattr(store, "put_file", real_put_file)
    results = tier_logdir(logdir, store, table, NOW)
    assert [r.error for r in results] == [None] * len(results) and table.version() == 1
    assert read_back(store, "orders", 0) == rolled_records(logdir / "orders-0")
    assert not left & referenced_object_keys(table.snapshot()), "the crashed run's objects are orphans"
    report = collect_garbage(store, table, NOW + DEFAULT_ORPHAN_GRACE_MS + 1)
    assert report.totals.orphans_deleted >= len(left)
    assert not left & {o.key for o in store.list()}
    assert read_back(store, "orders", 0) == rolled_records(logdir / "orders-0")


def test_copy_started_rows_another_writer_left_are_retired(logdir: Path, local_store: ObjectStore) -> None:
    """A COPY_SEGMENT_STARTED row (an older tier's, or a broker copy that died between its add and its finish) is
    never live; the next tier of its partition moves it to DELETE_SEGMENT_STARTED, for gc, in the same commit."""
    table = table_in_store(local_store, create=True)
    current = table.partition_snapshot("orders", 0)
    topic_id = next(p.topic_id for p in partitions(logdir) if p.tp == current.tp)
    sid = new_segment_id()
    key = segment_object_key("orders", topic_id, 0, 0, sid, ObjectSuffix.LOG)
    started = NewSegment(segment_id=sid, start_offset=0, end_offset=9, max_timestamp_ms=NOW,
                         segment_leader_epochs=(EpochEntry(0, 0),), segment_size_bytes=1,
                         object_keys=(ObjectKey(ObjectSuffix.LOG, key),), state=SegmentState.COPY_SEGMENT_STARTED)
    commit(table, ChangeSet.planned_from(current, fencing_epoch=0, writer="broker-1", new_segments=[started],
                                         topic_id=topic_id), NOW)
    results = {r.tp: r for r in tier_logdir(logdir, local_store, table, NOW)}
    assert results[TopicPartition("orders", 0)].abandoned_attempts == 1
    assert results[TopicPartition("orders", 1)].abandoned_attempts == 0
    states = {s.segment_id: s.state for s in table.partition_snapshot("orders", 0).segments}
    assert states[started.segment_id] is SegmentState.DELETE_SEGMENT_STARTED
    assert read_back(local_store, "orders", 0) == rolled_records(logdir / "orders-0")


def test_corrupt_segment_fails_only_its_partition(logdir: Path, local_store: ObjectStore,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    victim = sorted((logdir / "orders-1").glob("*.log"))[2]
    data = bytearray(victim.read_bytes())
    data[500] ^= 0xFF
    victim.write_bytes(bytes(data))
    code = main(["tier", "--logdir", str(logdir), "--store", local_store.uri, "--now", str(NOW), "--json"])
    assert code == 3
    report = json.loads(capsys.readouterr().out)
    failed = [p for p in report["partitions"] if p["error"]]
    assert [(p["topic"], p["partition"], p["error_type"]) for p in failed] == [("orders", 1, "CrcMismatchError")]
    assert str(victim) in failed[0]["error"] and "byte" in failed[0]["error"]
    table = table_in_store(local_store)
    assert table.partition_snapshot("orders", 1).segments == ()
    assert table.live_segments("orders", 0)


def test_missing_or_garbage_index_is_rebuilt(logdir: Path, local_store: ObjectStore) -> None:
    part = logdir / "users.v2-0"
    original = (part / "00000000000000000000.index").read_bytes()
    (part / "00000000000000000000.index").unlink()
    second = sorted(part.glob("*.index"))[1]
    second.write_bytes(b"\xff" * 16)
    [result] = [r for r in tier_logdir(logdir, local_store, table_in_store(local_store, create=True), NOW)
                if r.topic == "users.v2"]
    assert result.rebuilt_indexes == 2
    first = table_in_store(local_store).live_segments("users.v2", 0)[0]
    assert get_part(local_store, first.object_key(ObjectSuffix.OFFSET_INDEX) or "", ObjectSuffix.OFFSET_INDEX
                    ) == original


def test_metadata_table_is_plain_delta(logdir: Path, local_store: ObjectStore) -> None:
    tier_logdir(logdir, local_store, table_in_store(local_store, create=True), NOW)
    dt = DeltaTable(local_store.delta_uri("_kcompact_metadata"))
    via_delta = dt.to_pyarrow_table()
    assert via_delta.schema.names == METADATA_SCHEMA.names
    via_files = pads.dataset(dt.file_uris(), format="parquet", partitioning=None).to_table()
    assert via_files.num_rows == via_delta.num_rows
    assert set(via_delta.column("segment_id").drop_null().to_pylist()) == {
        s for s in via_files.column("segment_id").drop_null().to_pylist()}


def test_the_tier_reports_its_metadata_table_requests(logdir: Path, local_store: ObjectStore,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Beside the segments' PUTs, what the one commit put in the metadata table: a data file per partition and the
    commit file (a rows file from 8 partitions on); a rerun that copies nothing commits nothing."""
    partitions = len([d for d in logdir.iterdir() if d.is_dir()])
    for puts in (partitions + 1, 0):
        assert main(["tier", "--logdir", str(logdir), "--store", local_store.uri, "--now", str(NOW), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["metadata_requests"]["puts"] == puts, report["metadata_requests"]
        assert (report["metadata_requests"]["bytes_written"] > 0) == (puts > 0)
    assert main(["tier", "--logdir", str(logdir), "--store", local_store.uri, "--now", str(NOW)]) == 0
    assert capsys.readouterr().out.strip().endswith("0 PUTs; the metadata table 0 PUTs)")


def test_cli_segments_and_read(logdir: Path, local_store: ObjectStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tier", "--logdir", str(logdir), "--store", local_store.uri, "--now", str(NOW)]) == 0
    capsys.readouterr()
    assert main(["segments", "--store", local_store.uri, "--topic", "orders", "--partition", "0", "--json"]) == 0
    segs = json.loads(capsys.readouterr().out)
    assert segs[0]["start_offset"] == 0 and segs[0]["state"] == "COPY_SEGMENT_FINISHED"
    assert segs[0]["log_uri"].endswith(".log") and "orders-" in segs[0]["log_uri"]
    assert main(["read", "--store", local_store.uri, "--topic", "orders", "--partition", "0",
                 "--from-offset", "5"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["offset"] >= 5 and set(lines[0]) == {"offset", "timestamp", "key", "value", "headers"}
    expected = [r for r in rolled_records(logdir / "orders-0") if r[0] >= 5]

    def plain(b64: str | None) -> bytes | None:
        return None if b64 is None else base64.b64decode(b64)

    assert [(d["offset"], d["timestamp"], plain(d["key"]), plain(d["value"]),
             tuple((h["key"], plain(h["value"])) for h in d["headers"])) for d in lines] == [
        (o, t, k, v, tuple((h.key, h.value) for h in hs)) for o, t, k, v, hs in expected]


def without_snapshots(logdir: Path, into: Path) -> Path:
    """A copy of `logdir` without its producer snapshots, as a tool other than a broker may write one."""
    shutil.copytree(logdir, into)
    for snap in into.rglob("*.snapshot"):
        snap.unlink()
    return into


def tier_snapshots(store: ObjectStore, topic: str, partition: int) -> list[list[ProducerStateEntry]]:
    """The producer snapshot object of every live segment, in offset order."""
    live = table_in_store(store).live_segments(topic, partition)
    keys = [s.object_key(ObjectSuffix.PRODUCER_SNAPSHOT) for s in live]
    assert None not in keys, "every tiered segment must come with a producer snapshot"
    return [read_producer_snapshot(get_part(store, k or "", ObjectSuffix.PRODUCER_SNAPSHOT), obj=k) for k in keys]


def replayed(store: ObjectStore, topic: str, partition: int) -> list[list[ProducerStateEntry]]:
    """The producer state at the end of every live segment, replayed from the tier's logs from the start."""
    state: dict[int, ProducerStateEntry] = {}
    out = []
    for seg in table_in_store(store).live_segments(topic, partition):
        state = producer_state_from_log(store.get(seg.object_key(ObjectSuffix.LOG) or ""), initial=state.values())
        out.append(list(state.values()))
    return out


def as_the_generator_writes(entries: list[ProducerStateEntry]) -> list[ProducerStateEntry]:
    """The one field where the generator's snapshots differ from Kafka's: before a producer's first marker,
    Kafka's `ProducerStateEntry.empty` gives coordinatorEpoch -1, the generator writes 0."""
    return [dataclasses.replace(e, coordinator_epoch=max(e.coordinator_epoch, 0)) for e in entries]


def test_a_log_dir_without_snapshots_is_tiered_with_one_per_segment(logdir: Path, tmp_path: Path,
                                                                    local_store: ObjectStore) -> None:
    bare = without_snapshots(logdir, tmp_path / "bare")
    results = tier_logdir(bare, local_store, table_in_store(local_store, create=True), NOW)
    with_kafkas = open_store(str(tmp_path / "with-kafkas"))
    kept = tier_logdir(logdir, with_kafkas, table_in_store(with_kafkas, create=True), NOW)
    assert [r.built_snapshots for r in results] == [len(r.copied) for r in results]
    assert [r.built_snapshots for r in kept] == [0, 0, 0]
    for topic, partition in [("orders", 0), ("orders", 1), ("users.v2", 0)]:
        built = tier_snapshots(local_store, topic, partition)
        assert built == replayed(local_store, topic, partition)
        assert [as_the_generator_writes(s) for s in built] == tier_snapshots(with_kafkas, topic, partition)
        assert any(e.has_open_txn for s in built for e in s) and any(
            e.coordinator_epoch >= 0 for s in built for e in s), "transactions must have run through the state"


def test_an_incremental_tier_carries_the_state_from_the_stores_last_snapshot(logdir: Path, tmp_path: Path,
                                                                             local_store: ObjectStore) -> None:
    bare = without_snapshots(logdir, tmp_path / "bare")
    early = tmp_path / "early"
    for part in bare.iterdir():
        (early / part.name).mkdir(parents=True)
        fourth = sorted(part.glob("*.log"))[3].name.split(".")[0]
        for f in part.iterdir():
            stem = f.name.split(".")[0]
            if not stem.isdigit() or stem <= fourth:
                shutil.copy(f, early / part.name / f.name)
    table = table_in_store(local_store, create=True)
    assert all(r.built_snapshots == 3 for r in tier_logdir(early, local_store, table, NOW))
    read_before = local_store.stats.bytes_read
    later = tier_logdir(bare, local_store, table, NOW)
    read = local_store.stats.bytes_read - read_before
    aside = open_store(local_store.uri)  # its reads are not counted in local_store's
    last_snapshots = [s.object_key(ObjectSuffix.PRODUCER_SNAPSHOT) or ""
                      for r in later for s in table.live_segments(r.topic, r.partition)[2:3]]
    # each a part of its segment's .indexes object: the first READ_AHEAD bytes (the header and the snapshot, first
    # in PART_ORDER), then what of the snapshot lies past them
    def fetched(key: str) -> int:
        _start, end = read_header(aside.get(key), obj=key)[ObjectSuffix.PRODUCER_SNAPSHOT]
        return min(READ_AHEAD, aside.size(key)) + max(0, end - READ_AHEAD)

    assert read == sum(fetched(k) for k in last_snapshots), "no log replayed from the store"
    assert all(r.built_snapshots == len(r.copied) > 0 for r in later)
    for topic, partition in [("orders", 0), ("orders", 1), ("users.v2", 0)]:
        assert tier_snapshots(local_store, topic, partition) == replayed(local_store, topic, partition)
