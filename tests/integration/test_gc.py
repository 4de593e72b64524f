"""`kcompact gc` on both backends: grace periods, manifest-first order, crash convergence, no orphan left.

Every test starts from one scenario, built for real: a tiered log dir (tier_logdir), a simulated
compaction of orders-0 that replaces its first two live segments by one (their two .log files
concatenated, uploaded under a fresh segment id), a fenced run's upload in orders-0 that no row
references (the orphans), a broker's copy of users-0's next segment that died after its add (an abandoned
COPY_SEGMENT_STARTED row), and an object that is not a segment key. Object mtimes come from the store's clock, so the
scenario's clock `t0` is the wall clock and every `now` is relative to it.
"""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from deltalake import write_deltalake

from compaction.cli import main
from compaction.format.checkpoints import EpochEntry
from compaction.gc import GcReport, collect_garbage
from compaction.generate import TopicSpec, WorkloadSpec, generate_logdir
from compaction.metadata import (
    METADATA_TABLE_NAME,
    ChangeSet,
    CleanerOffset,
    MetadataTable,
    NewSegment,
    ObjectKey,
    ObjectSuffix,
    SegmentMetadata,
    SegmentState,
    StateChange,
    acquire_fencing_epoch,
    commit,
    referenced_object_keys,
    table_in_store,
)
from compaction.metadata.change_set import merge_leader_epochs
from compaction.metadata.model import rows_to_arrow
from compaction.metadata.table import load_partitions
from compaction.reader import consumer_records, segment_ref
from compaction.storage import ObjectStore
from compaction.storage.layout import new_segment_id, parse_segment_object_key
from compaction.storage.local import LocalStore
from compaction.tier import tier_logdir

batch_module = importlib.import_module("compaction.metadata.batch")

execute_module = importlib.import_module("compaction.gc.execute")

GRACE = 60_000
ORPHAN_GRACE = 600_000
SLACK = 60_000  # wall-clock time the scenario may take to build, so mtimes may be later than t0
SPEC = WorkloadSpec(topics=(TopicSpec("orders", 1), TopicSpec("users", 1)), records_per_partition=300, keys=60,
                    segment_bytes=10 * 1024, seed=3)
PARTITIONS = [("orders", 0), ("users", 0)]
UNKNOWN_KEY = "notes/readme.txt"


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gc-logdir")
    generate_logdir(root, SPEC)
    return root


@dataclass(frozen=True)
class Scenario:
    store: ObjectStore
    table: MetadataTable
    t0: int
    replaced: tuple[SegmentMetadata, ...]
    abandoned: tuple[SegmentMetadata, ...]
    orphan_keys: tuple[str, ...]
    views: dict[tuple[str, int], list[tuple]]

    @property
    def after_all_graces(self) -> int:
        return self.t0 + ORPHAN_GRACE + SLACK


def consumer_view(store: ObjectStore, table: MetadataTable, topic: str, partition: int) -> list[tuple]:
    refs = [segment_ref(s) for s in table.live_segments(topic, partition)]
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in consumer_records(store, refs)]


def abandon_copy_of_users(store: ObjectStore, table: MetadataTable, now_ms: int) -> None:
    """What a broker's copy of users-0's next segment leaves when it dies between its add (COPY_SEGMENT_STARTED,
    committed by the plugin's two-commit path or an older kcompact) and its finish: the row, never live, and the
    object it had uploaded."""
    snap = table.partition_snapshot("users", 0)
    last = snap.live_segments[-1]
    data = store.get(last.object_key(ObjectSuffix.LOG) or "")
    start, sid = last.end_offset + 1, new_segment_id()
    key = replace(parse_segment_object_key(last.object_key(ObjectSuffix.LOG) or ""), segment_id=sid,
                  start_offset=start).key
    store.put(key, data)
    started = NewSegment(
        segment_id=sid,
        start_offset=start,
        end_offset=start + last.end_offset - last.start_offset,
        max_timestamp_ms=last.max_timestamp_ms,
        segment_leader_epochs=(EpochEntry(last.segment_leader_epochs[-1].epoch, start),),
        segment_size_bytes=len(data),
        object_keys=(ObjectKey(ObjectSuffix.LOG, key),),
        state=SegmentState.COPY_SEGMENT_STARTED,
    )
    commit(table, ChangeSet.planned_from(snap, fencing_epoch=snap.fencing_epoch, writer="broker-1",
                                         new_segments=[started]), now_ms)


def compact_first_two(store: ObjectStore, table: MetadataTable, now_ms: int) -> tuple[SegmentMetadata, ...]:
    """A compaction of orders-0: its first two live segments become one, committed under a new epoch."""
    epoch = acquire_fencing_epoch(table, "orders", 0, "kcompact compact@test", now_ms)
    snap = table.partition_snapshot("orders", 0)
    a, b = snap.live_segments[:2]
    data = b"".join(store.get(s.object_key(ObjectSuffix.LOG) or "") for s in (a, b))
    sid = new_segment_id()
    key = parse_segment_object_key(a.object_key(ObjectSuffix.LOG) or "")
    store.put(replace(key, segment_id=sid).key, data)
    merged = NewSegment(
        segment_id=sid,
        start_offset=a.start_offset,
        end_offset=b.end_offset,
        max_timestamp_ms=max(a.max_timestamp_ms, b.max_timestamp_ms),
        segment_leader_epochs=merge_leader_epochs(a.segment_leader_epochs, b.segment_leader_epochs),
        segment_size_bytes=len(data),
        object_keys=(ObjectKey(ObjectSuffix.LOG, replace(key, segment_id=sid).key),),
        record_count=(a.record_count or 0) + (b.record_count or 0),
    )
    cs = ChangeSet.planned_from(
        snap,
        fencing_epoch=epoch,
        writer="kcompact compact@test",
        new_segments=[merged],
        state_changes=[StateChange(s.segment_id, SegmentState.DELETE_SEGMENT_STARTED) for s in (a, b)],
        cleaner_offset=b.end_offset + 1,
    )
    commit(table, cs, now_ms)
    return a, b


def upload_orphan(store: ObjectStore, table: MetadataTable) -> tuple[str, ...]:
    """What a fenced run leaves behind: a rewrite of orders-0's last segment uploaded, never committed."""
    seg = table.live_segments("orders", 0)[-1]
    sid = new_segment_id()
    keys = []
    for obj in seg.object_keys[:2]:
        key = replace(parse_segment_object_key(obj.key), segment_id=sid).key
        store.put(key, store.get(obj.key))
        keys.append(key)
    return tuple(keys)


def build_scenario(store: ObjectStore, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    t0 = int(time.time() * 1000)
    table = table_in_store(store, create=True)
    results = tier_logdir(logdir, store, table, t0)
    assert [r.error for r in results] == [None] * len(results)
    abandon_copy_of_users(store, table, t0)
    before = consumer_view(store, table, "orders", 0)
    replaced = compact_first_two(store, table, t0)
    assert consumer_view(store, table, "orders", 0) == before
    orphan_keys = upload_orphan(store, table)
    store.put(UNKNOWN_KEY, b"not a segment")
    abandoned = tuple(s for s in table.partition_snapshot("users", 0).segments
                      if s.state is SegmentState.COPY_SEGMENT_STARTED)
    assert abandoned and {s.state for s in abandoned} == {SegmentState.COPY_SEGMENT_STARTED}
    views = {tp: consumer_view(store, table, *tp) for tp in PARTITIONS}
    return Scenario(store, table, t0, replaced, abandoned, orphan_keys, views)


@pytest.fixture
def scenario(store: ObjectStore, logdir: Path, monkeypatch: pytest.MonkeyPatch) -> Scenario:
    """The scenario on each backend in turn."""
    return build_scenario(store, logdir, monkeypatch)


def gc(s: Scenario, now_ms: int, *, dry_run: bool = False) -> GcReport:
    return collect_garbage(s.store, s.table, now_ms, grace_ms=GRACE, orphan_grace_ms=ORPHAN_GRACE, dry_run=dry_run)


def keys_in(store: ObjectStore) -> set[str]:
    return {o.key for o in store.list("")}


def object_keys(*segments: SegmentMetadata) -> set[str]:
    return {o.key for s in segments for o in s.object_keys}


def states(table: MetadataTable, *segments: SegmentMetadata) -> set[SegmentState]:
    snap = table.snapshot()
    return {snap.partition(s.topic, s.partition).segment(s.segment_id).state for s in segments}  # type: ignore[union-attr]


def assert_live_data_intact(s: Scenario) -> None:
    snap, keys = s.table.snapshot(), keys_in(s.store)
    for tp in PARTITIONS:
        live = snap.live_segments(*tp)
        assert object_keys(*live) <= keys
        refs = [segment_ref(seg) for seg in live]
        assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in consumer_records(s.store, refs)] == (
            s.views[tp])


def assert_no_orphan(s: Scenario) -> None:
    """Every object is metadata, the planted non-segment object, or referenced by a not-finished row."""
    referenced = referenced_object_keys(s.table.snapshot())
    leftover = {k for k in keys_in(s.store) if not k.startswith(METADATA_TABLE_NAME + "/")} - referenced
    assert leftover == {UNKNOWN_KEY}


def test_gc_waits_for_each_grace_and_a_dry_run_foretells_it(scenario: Scenario, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    s = scenario
    before = {o.key: o.size for o in s.store.list("")}
    metadata_before = {k for k in before if k.startswith(METADATA_TABLE_NAME + "/")}
    version = s.table.version()

    early = gc(s, s.t0 + GRACE - 1)
    assert keys_in(s.store) == before.keys() and s.table.version() == version
    assert (early.totals.objects_deleted, early.totals.segments_finished, early.totals.segments_retired) == (0, 0, 0)
    assert early.totals.segments_waiting == 2 and early.totals.orphans_waiting == len(s.orphan_keys)
    assert states(s.table, *s.replaced) == {SegmentState.DELETE_SEGMENT_STARTED}
    assert states(s.table, *s.abandoned) == {SegmentState.COPY_SEGMENT_STARTED}

    dry = gc(s, s.t0 + GRACE + SLACK, dry_run=True)
    assert keys_in(s.store) == before.keys() and s.table.version() == version
    assert any("would be deleted" in line for line in dry.summary())
    reads, full_reads = [], []  # the partitions' rows its commits read from the table's files; its whole reads
    monkeypatch.setattr(batch_module, "load_partitions", lambda *args: reads.append(args) or load_partitions(*args))
    whole = MetadataTable.snapshot
    monkeypatch.setattr(MetadataTable, "snapshot", lambda table, *a: full_reads.append(a) or whole(table, *a))
    deletes = s.store.stats.deletes
    segments_due = gc(s, s.t0 + GRACE + SLACK)
    monkeypatch.undo()
    gone = object_keys(*s.replaced, *s.abandoned) & before.keys()
    assert len(gone) > 1 and s.store.stats.deletes - deletes == (len(gone) if isinstance(s.store, LocalStore) else 1), (
        "a DELETE per object on a local directory, one DeleteObjects for them all on S3")
    assert reads == [], "both commits start from the rows of the snapshot gc read (no other commit landed)"
    assert len(full_reads) == 1, "the table read whole once, to plan"
    assert {**dry.to_dict(), "dry_run": False} == segments_due.to_dict(), "a dry run reports what gc then does"
    assert states(s.table, *s.replaced, *s.abandoned) == {SegmentState.DELETE_SEGMENT_FINISHED}
    assert not object_keys(*s.replaced, *s.abandoned) & keys_in(s.store)
    assert set(s.orphan_keys) <= keys_in(s.store), "orphans wait for their own, longer grace"
    assert segments_due.totals.orphans_waiting == len(s.orphan_keys)
    assert_live_data_intact(s)

    orphans_due = gc(s, s.after_all_graces)
    assert not set(s.orphan_keys) & keys_in(s.store)
    assert UNKNOWN_KEY in keys_in(s.store) and orphans_due.unknown_objects == (UNKNOWN_KEY,)
    assert metadata_before <= keys_in(s.store)
    assert_live_data_intact(s)
    assert_no_orphan(s)

    totals = segments_due.totals + orphans_due.totals
    deleted = (object_keys(*s.replaced, *s.abandoned) | set(s.orphan_keys)) & before.keys()
    assert totals.segments_finished == len(s.replaced) + len(s.abandoned)
    assert totals.segments_retired == len(s.abandoned)
    assert totals.orphans_deleted == len(s.orphan_keys)
    assert (totals.objects_deleted, totals.bytes_freed) == (len(deleted), sum(before[k] for k in deleted))
    by_tp = {(p.topic, p.partition): p.counts for p in segments_due.partitions}
    assert by_tp["orders", 0].segments_finished == 2 and by_tp["users", 0].segments_retired == len(s.abandoned)

    keys, version = keys_in(s.store), s.table.version()
    again = gc(s, s.after_all_graces + GRACE)
    assert keys_in(s.store) == keys and s.table.version() == version
    assert again.totals.is_empty and again.to_dict()["partitions"] == []


def test_crash_between_object_deletes_and_commit_converges(scenario: Scenario,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    s = scenario

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated crash before DELETE_SEGMENT_FINISHED is recorded")

    with monkeypatch.context() as m:
        m.setattr(execute_module, "mark_deleted_finished", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            gc(s, s.after_all_graces)
    assert not object_keys(*s.replaced, *s.abandoned) & keys_in(s.store)
    assert states(s.table, *s.replaced, *s.abandoned) == {SegmentState.DELETE_SEGMENT_STARTED}
    assert_live_data_intact(s)

    report = gc(s, s.after_all_graces)  # the same clock: the retired rows' own grace has not passed
    assert states(s.table, *s.replaced, *s.abandoned) == {SegmentState.DELETE_SEGMENT_FINISHED}
    assert report.totals.segments_finished == len(s.replaced) + len(s.abandoned)
    assert report.totals.objects_deleted == len(s.orphan_keys)  # the segment objects were gone already
    assert_live_data_intact(s)
    assert_no_orphan(s)


def forge_zombies(s: Scenario, *key_sets: tuple[ObjectKey, ...]) -> list[SegmentMetadata]:
    """Rows written around the commit path, claiming a cleaner offset for an epoch nobody was granted."""
    honest = s.table.live_segments("orders", 0)[-1]
    zombies = [replace(honest, segment_id=new_segment_id(), object_keys=keys, cleaner_offsets=(CleanerOffset(7, 5),))
               for keys in key_sets]
    write_deltalake(s.table.delta_table(), rows_to_arrow([], zombies), mode="append")
    return zombies


def test_zombie_rows_are_retired_then_deleted_a_grace_later(scenario: Scenario) -> None:
    s = scenario
    honest = s.table.live_segments("orders", 0)[-1]
    own = ObjectKey(ObjectSuffix.LOG, replace(parse_segment_object_key(honest.object_keys[0].key),
                                              segment_id=new_segment_id()).key)
    s.store.put(own.key, b"a zombie's upload")
    zombie, sharing = forge_zombies(s, (own,), honest.object_keys)  # `sharing` names a live segment's objects
    assert {z.segment_id for z in s.table.partition_snapshot("orders", 0).zombie_segments} == {
        zombie.segment_id, sharing.segment_id}

    first = gc(s, s.after_all_graces)
    assert states(s.table, zombie, sharing) == {SegmentState.DELETE_SEGMENT_STARTED}
    assert own.key in keys_in(s.store) and first.totals.segments_retired == len(s.abandoned) + 2

    second = gc(s, s.after_all_graces + GRACE)
    assert states(s.table, zombie, sharing) == {SegmentState.DELETE_SEGMENT_FINISHED}
    assert own.key not in keys_in(s.store)
    assert second.totals.shared_keys_kept == len({o.key for o in honest.object_keys})
    assert_live_data_intact(s)
    assert_no_orphan(s)


def test_cli_gc_takes_the_grace_per_topic_from_the_config(local_store: ObjectStore, logdir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    s = build_scenario(local_store, logdir, monkeypatch)
    config = tmp_path / "kcompact.yaml"
    config.write_text(f"defaults:\n  file.delete.delay.ms: {GRACE}\n"
                      f"topics:\n  orders:\n    file.delete.delay.ms: {10 * ORPHAN_GRACE}\n")
    now = s.t0 + GRACE + SLACK
    args = ["gc", "--store", s.store.uri, "--now", str(now), "--orphan-grace-ms", str(ORPHAN_GRACE)]
    assert main([*args, "--config", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["totals"]["segments_finished"] == len(s.abandoned)
    assert states(s.table, *s.replaced) == {SegmentState.DELETE_SEGMENT_STARTED}
    assert states(s.table, *s.abandoned) == {SegmentState.DELETE_SEGMENT_FINISHED}

    assert main([*args, "--config", str(config), "--grace-ms", str(GRACE), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run, nothing changed" in out and "orders-0: 2 segments would be finished" in out
    assert states(s.table, *s.replaced) == {SegmentState.DELETE_SEGMENT_STARTED}
    assert main([*args, "--grace-ms", "-1"]) == 2
