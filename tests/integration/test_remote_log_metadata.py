"""`compaction.remote_log_metadata`: the broker's RemoteLogMetadataManager requests answered on the metadata table."""

from __future__ import annotations

import importlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from compaction.format.batch import build_batch, encode_batch
from compaction.format.control import ControlType
from compaction.format.indexes import read_txn_index
from compaction.format.indexes.rebuild import build_indexes
from compaction.format.segment import iter_batch_headers
from compaction.metadata import SegmentState, acquire_fencing_epoch, table_in_store
from compaction.remote_log_metadata import RemoteTier, serve
from compaction.storage import open_store
from compaction.storage.indexes import get_part
from compaction.storage.layout import Suffix, segment_object_key
from tests.factories import marker, record

batch_module = importlib.import_module("compaction.metadata.batch")

TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"
SEGMENT_ID = "tqimKeZwStOEOwRzT3L5oQ"
LATER_ID = "AAAAAAAAAAAAAAAAAAAAAQ"
PARTITION = {"topic": "orders", "partition": 3, "topic_id": TOPIC_ID, "broker_id": 7}


def _ask(store: Path, *requests: dict[str, Any]) -> list[dict[str, Any]]:
    opened = open_store(str(store))
    out = io.StringIO()
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    serve(RemoteTier.of(table_in_store(opened, create=True), opened), io.StringIO(lines), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _add(txn_index_empty: bool = True, segment_id: str = SEGMENT_ID, start: int = 100,
         leader_epochs: tuple[tuple[int, int], ...] = ((0, 100), (2, 150))) -> dict[str, Any]:
    return {"op": "add", **PARTITION, "segment_id": segment_id, "start_offset": start, "end_offset": start + 99,
            "max_timestamp_ms": 5, "event_timestamp_ms": 6, "segment_size_bytes": 4096,
            "txn_index_empty": txn_index_empty, "leader_epochs": [list(e) for e in leader_epochs]}


def _copy(transactional: bool | None = None, **add: Any) -> dict[str, Any]:
    """The plugin's one request for a whole copy: the add's fields and the storage manager's finding."""
    return {**_add(**add), "op": "copy", "transactional": transactional}


def _update(state: SegmentState, segment_id: str = SEGMENT_ID, transactional: bool | None = None) -> dict[str, Any]:
    return {"op": "update", **PARTITION, "segment_id": segment_id, "state": state.value, "event_timestamp_ms": 9,
            "transactional": transactional}


@pytest.mark.parametrize("transactional", [True, False, None])
def test_a_finished_copy_records_what_the_plugin_found_in_its_batches(tmp_path: Path,
                                                                      transactional: bool | None) -> None:
    """The storage manager's finding (a transactional or control batch in the copied segment, passed by Kafka as
    the segment's custom metadata) goes into the row as the copy finishes; null, from a storage manager that does
    not say, leaves the row unknown."""
    answers = _ask(tmp_path, _add(), _update(SegmentState.COPY_SEGMENT_FINISHED, transactional=transactional))
    assert all(a["ok"] for a in answers), answers
    (live,) = table_in_store(open_store(str(tmp_path))).live_segments("orders", 3)
    assert live.transactional is transactional


def test_the_broker_rows_are_kcompact_rows(tmp_path: Path) -> None:
    answers = _ask(tmp_path, _add(txn_index_empty=False), {"op": "segments", **PARTITION},
                   _update(SegmentState.COPY_SEGMENT_FINISHED), {"op": "segments", **PARTITION})
    assert all(a["ok"] for a in answers), answers
    started, finished = answers[1]["result"]["segments"], answers[3]["result"]["segments"]
    assert [(s["state"], s["live"]) for s in started] == [("COPY_SEGMENT_STARTED", False)]
    assert [(s["state"], s["live"], s["txn_index"]) for s in finished] == [("COPY_SEGMENT_FINISHED", True, True)]

    (live,) = table_in_store(open_store(str(tmp_path))).live_segments("orders", 3)
    assert (live.start_offset, live.end_offset, live.writer) == (100, 199, "broker-7")
    assert [(e.epoch, e.start_offset) for e in live.segment_leader_epochs] == [(0, 100), (2, 150)]
    assert live.object_key(Suffix.LOG) == segment_object_key("orders", TOPIC_ID, 3, 100, SEGMENT_ID, Suffix.LOG)
    assert {o.suffix for o in live.object_keys} == {Suffix.LOG, Suffix.OFFSET_INDEX, Suffix.TIME_INDEX,
                                                    Suffix.TXN_INDEX, Suffix.PRODUCER_SNAPSHOT,
                                                    Suffix.LEADER_EPOCH_CHECKPOINT}


def test_a_refused_request_is_an_error_answer_naming_the_rule(tmp_path: Path) -> None:
    answers = _ask(tmp_path, _add(), _update(SegmentState.COPY_SEGMENT_FINISHED),
                   _update(SegmentState.COPY_SEGMENT_STARTED))
    assert [a["ok"] for a in answers] == [True, True, False]
    assert (answers[2]["type"], answers[2]["version"]) == ("InvalidStateTransitionError", 2)  # the version it read
    assert "COPY_SEGMENT_FINISHED -> COPY_SEGMENT_STARTED" in answers[2]["error"]


def test_the_broker_writes_under_its_leader_epochs_and_the_current_fencing_epoch(tmp_path: Path) -> None:
    """The segment's leader epochs are the broker's; kcompact acquiring the partition fences its runs, not the
    broker, whose rows take the partition's current fencing epoch."""
    _ask(tmp_path, _add())
    table = table_in_store(open_store(str(tmp_path)))
    epoch = acquire_fencing_epoch(table, "orders", 3, "kcompact-run", 10)
    later = _add(segment_id=LATER_ID, start=200, leader_epochs=((2, 200), (3, 260)))
    answers = _ask(tmp_path, _update(SegmentState.COPY_SEGMENT_FINISHED), later)
    assert all(a["ok"] for a in answers), answers
    p = table.partition_snapshot("orders", 3)
    assert [s.fencing_epoch for s in p.segments] == [epoch, epoch] and p.fencing_epoch == epoch
    assert [[(e.epoch, e.start_offset) for e in s.segment_leader_epochs] for s in p.segments] == [
        [(0, 100), (2, 150)], [(2, 200), (3, 260)]]
    assert [(e.epoch, e.start_offset) for e in p.state.leader_epochs] == [(0, 100), (2, 150), (3, 260)]  # type: ignore[union-attr]


def test_a_deposed_leaders_copy_is_fenced_by_the_leader_epoch(tmp_path: Path) -> None:
    """The leader of epoch 3 tiered a segment; the deposed leader of epoch 2 then adds one: refused, not written."""
    newer = _add(segment_id=LATER_ID, start=200, leader_epochs=((3, 200),))
    deposed = _add(start=300, leader_epochs=((2, 300),))
    answers = _ask(tmp_path, newer, deposed)
    assert [a["ok"] for a in answers] == [True, False]
    assert answers[1]["type"] == "FencedError"
    assert "expected leader epoch 3 or newer, found 2" in answers[1]["error"]
    assert SEGMENT_ID in answers[1]["error"] and "broker-7" in answers[1]["error"]
    segments = table_in_store(open_store(str(tmp_path))).partition_snapshot("orders", 3).segments
    assert [s.segment_id for s in segments] == [LATER_ID]


def test_a_bad_request_is_answered_and_the_next_one_served(tmp_path: Path) -> None:
    bad, good = _ask(tmp_path, {"op": "add", **PARTITION}, {"op": "segments", **PARTITION})
    assert (bad["ok"], bad["type"]) == (False, "InternalError")
    assert "ValueError: metadata request 'add' lacks segment_id, start_offset" in bad["error"], bad
    assert '"op": "add"' in bad["error"]
    assert good == {"ok": True, "result": {"topic": "orders", "partition": 3, "version": 0, "segments": []}}


def test_an_empty_segment_shows_the_broker_no_timestamp(tmp_path: Path) -> None:
    """A segment that holds no batch (a compaction output that kept nothing) carries its inputs' largest timestamp
    for retention; the broker sees -1, so that its lookup by timestamp passes it for the next segment."""
    empty = {**_add(), "segment_size_bytes": 0}
    answers = _ask(tmp_path, empty, _add(segment_id=LATER_ID, start=200, leader_epochs=((2, 200),)),
                   {"op": "segments", **PARTITION})
    assert all(a["ok"] for a in answers), answers
    assert [s["max_timestamp_ms"] for s in answers[2]["result"]["segments"]] == [-1, 5]
    assert {s.max_timestamp_ms for s in table_in_store(open_store(str(tmp_path))).partition_snapshot(
        "orders", 3).segments} == {5}, "the row keeps it"


COPY_ID = "CCCCCCCCCCCCCCCCCCCCCQ"


def _copy_log() -> bytes:
    """A replica's segment [50, 149] as Kafka writes it: an aborted transaction of producer 8 at 50..59 (ABORT at 60),
    plain batches of ten, an aborted transaction of producer 7 at 100..104 (ABORT at 105), plain batches to 149."""
    batches = [build_batch([record(o, o % 7, ts=o) for o in range(50, 60)], transactional=True, producer_id=8,
                           producer_epoch=0, base_sequence=0, partition_leader_epoch=0),
               marker(ControlType.ABORT, 60, 8, ts=60)]
    batches += [build_batch([record(o, o % 7, ts=o) for o in range(b, min(b + 10, 100))], partition_leader_epoch=0)
                for b in range(61, 100, 10)]
    batches += [build_batch([record(o, o % 7, ts=o) for o in range(100, 105)], transactional=True, producer_id=7,
                            producer_epoch=0, base_sequence=0, partition_leader_epoch=1),
                marker(ControlType.ABORT, 105, 7, ts=105, leader_epoch=1)]
    batches += [build_batch([record(o, o % 7, ts=o) for o in range(b, min(b + 10, 150))], partition_leader_epoch=1)
                for b in range(106, 150, 10)]
    return b"".join(encode_batch(b) for b in batches)


def _tier_then_copy(tmp_path: Path, copy_log: bytes, copy_end: int = 149,
                    copy_epochs: tuple[tuple[int, int], ...] = ((0, 50), (1, 100)), *, one_request: bool = False
                    ) -> list[dict[str, Any]]:
    """The old leader (broker 7) tiered [0, 49] and [50, 99] in leader epoch 0; the new leader (broker 8, epoch 1)
    then copies its own segment [50, copy_end], rolled elsewhere, with every file the plugin writes: an `add` and an
    `update`, or (`one_request`) the plugin's `copy`. The answers, the copy's in the next to last place."""
    store = open_store(str(tmp_path))
    indexes = build_indexes(copy_log, 50, index_interval_bytes=100)
    files = {Suffix.LOG: copy_log, Suffix.OFFSET_INDEX: indexes.offset_index, Suffix.TIME_INDEX: indexes.time_index,
             Suffix.TXN_INDEX: indexes.txn_index or b"", Suffix.PRODUCER_SNAPSHOT: b"snapshot at 150",
             Suffix.LEADER_EPOCH_CHECKPOINT: b"0\n2\n0 0\n1 100\n"}
    for suffix, body in files.items():
        store.put(segment_object_key("orders", TOPIC_ID, 3, 50, COPY_ID, suffix), body)
    old = [_add(segment_id=SEGMENT_ID, start=0, leader_epochs=((0, 0),)), _update(SegmentState.COPY_SEGMENT_FINISHED),
           _add(segment_id=LATER_ID, start=50, leader_epochs=((0, 50),)),
           _update(SegmentState.COPY_SEGMENT_FINISHED, LATER_ID)]
    copy = {**_add(txn_index_empty=False, segment_id=COPY_ID, start=50, leader_epochs=copy_epochs),
            "end_offset": copy_end, "broker_id": 8, "segment_size_bytes": len(copy_log)}
    finish = {**_update(SegmentState.COPY_SEGMENT_FINISHED, COPY_ID), "broker_id": 8}
    copying = [{**copy, "op": "copy", "transactional": None}] if one_request else [copy, finish]
    return _ask(tmp_path, {**old[0], "end_offset": 49}, old[1], {**old[2], "end_offset": 99}, old[3], *copying,
                {"op": "segments", **PARTITION})


@pytest.mark.parametrize("one_request", [False, True], ids=["add-update", "copy"])
def test_a_new_leaders_copy_over_the_tier_goes_live_trimmed(tmp_path: Path, one_request: bool) -> None:
    """Issue 40's failover: the new leader's replica rolled at 50, not 100, so its first copy [50, 149] overlaps the
    tier's [50, 99]. It goes live as its part from 100 on (a new segment id, Kafka's files for that base), the copy
    is superseded, and the tier goes on from 150; the old leader's rows, possibly compacted, stay as they were. The
    plugin's one-request `copy` ends the same as its add and update."""
    log = _copy_log()
    answers = _tier_then_copy(tmp_path, log, one_request=one_request)
    assert all(a["ok"] for a in answers), answers
    store = open_store(str(tmp_path))
    p = table_in_store(store).partition_snapshot("orders", 3)
    assert [(s.start_offset, s.end_offset, s.writer) for s in p.live_segments] == [
        (0, 49, "broker-7"), (50, 99, "broker-7"), (100, 149, "broker-8")]
    copy, trimmed = p.segment(COPY_ID), p.live_segments[-1]
    assert copy is not None and copy.state is SegmentState.DELETE_SEGMENT_STARTED, "gc deletes the copy's objects"
    assert [(e.epoch, e.start_offset) for e in trimmed.segment_leader_epochs] == [(1, 100)]
    assert [s["segment_id"] for s in answers[-1]["result"]["segments"] if s["live"]][-1] == trimmed.segment_id

    def body(suffix: Suffix) -> bytes:
        key = trimmed.object_key(suffix)
        in_object = Suffix.LOG if suffix is Suffix.LOG else Suffix.INDEXES  # the trimmed copy is kcompact's
        assert key == segment_object_key("orders", TOPIC_ID, 3, 100, trimmed.segment_id, in_object)
        return get_part(store, key, suffix)

    kept = [(h.base_offset, h.last_offset) for h in iter_batch_headers(log) if h.base_offset >= 100]
    assert [(h.base_offset, h.last_offset) for h in iter_batch_headers(body(Suffix.LOG), verify_crc=True)] == kept
    assert body(Suffix.LOG) == log[len(log) - trimmed.segment_size_bytes:]
    rebuilt = build_indexes(body(Suffix.LOG), 100)
    assert (body(Suffix.OFFSET_INDEX), body(Suffix.TIME_INDEX)) == (rebuilt.offset_index, rebuilt.time_index)
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in read_txn_index(body(Suffix.TXN_INDEX))] == [
        (7, 100, 105)], "the entry whose ABORT lies in the kept part, not producer 8's"
    assert (body(Suffix.PRODUCER_SNAPSHOT), body(Suffix.LEADER_EPOCH_CHECKPOINT)) == (
        b"snapshot at 150", b"0\n2\n0 0\n1 100\n")
    assert trimmed.max_timestamp_ms == 149 and trimmed.segment_size_bytes < len(log)


@pytest.mark.parametrize("one_request", [False, True], ids=["add-update", "copy"])
def test_a_copy_wholly_below_the_tier_end_is_superseded(tmp_path: Path, one_request: bool) -> None:
    log = b"".join(encode_batch(build_batch([record(o, o % 7, ts=o)])) for o in range(50, 100))
    answers = _tier_then_copy(tmp_path, log, copy_end=99, copy_epochs=((0, 50),), one_request=one_request)
    assert all(a["ok"] for a in answers), answers
    p = table_in_store(open_store(str(tmp_path))).partition_snapshot("orders", 3)
    assert [(s.start_offset, s.end_offset, s.writer) for s in p.live_segments] == [(0, 49, "broker-7"),
                                                                                 (50, 99, "broker-7")]
    assert p.segment(COPY_ID).state is SegmentState.DELETE_SEGMENT_STARTED  # type: ignore[union-attr]


@pytest.mark.parametrize("one_request", [False, True], ids=["add-update", "copy"])
def test_a_batch_across_the_tier_end_is_refused_naming_its_byte(tmp_path: Path, one_request: bool) -> None:
    """Replicas share batch boundaries, so the tier's end is one of the copy's; a batch across it cannot be cut
    without re-encoding: the update is an error answer naming the object and byte, and nothing is committed."""
    batches = [build_batch([record(o, 1, ts=o) for o in range(b, b + 10)]) for b in range(50, 150, 10)]
    batches[4] = build_batch([record(o, 1, ts=o) for o in range(95, 105)])  # 90..94 left out: 95..104 crosses 99
    batches[5] = build_batch([record(o, 1, ts=o) for o in range(105, 110)])
    log = b"".join(encode_batch(b) for b in batches)
    answers = _tier_then_copy(tmp_path, log, one_request=one_request)
    refused = answers[-2]
    assert (refused["ok"], refused["type"]) == (False, "MetadataInvariantError"), refused
    position = sum(len(encode_batch(b)) for b in batches[:4])
    assert f"byte {position} of " in refused["error"] and f"00000000000000000050-{COPY_ID}.log" in refused["error"]
    p = table_in_store(open_store(str(tmp_path))).partition_snapshot("orders", 3)
    assert p.segment(COPY_ID).state is SegmentState.COPY_SEGMENT_STARTED  # type: ignore[union-attr]
    assert [s.end_offset for s in p.live_segments] == [49, 99]
    # the one-request copy too committed its add first: the row is as an add alone leaves it, which gc retires


def test_a_compaction_taking_the_partition_never_fences_the_broker(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: a compaction takes fencing epoch 1 between the broker's read of the partition and its commit. The
    broker holds no fencing epoch: its commit is planned again under epoch 1 and lands, where it raised FencedError
    (expected fencing epoch 0, found 1) and the broker retried the copy a task round later."""
    _ask(tmp_path, _add())
    real, raced = batch_module._write, []

    def write_after_a_compaction_took_the_partition(reader: Any, dt: Any, base: int, rows: Any, checkpoint: bool
                                                     ) -> Any:
        if not raced:
            raced.append(-1)  # the compaction's own commit goes through here too
            raced[0] = acquire_fencing_epoch(table_in_store(open_store(str(tmp_path))), "orders", 3,
                                             "kcompact compact@test", 10)
        return real(reader, dt, base, rows, checkpoint)

    monkeypatch.setattr(batch_module, "_write", write_after_a_compaction_took_the_partition)
    (answer,) = _ask(tmp_path, _update(SegmentState.COPY_SEGMENT_FINISHED))
    assert answer["ok"], answer
    p = table_in_store(open_store(str(tmp_path))).partition_snapshot("orders", 3)
    assert raced == [1] and p.fencing_epoch == 1
    assert [(s.state, s.fencing_epoch) for s in p.segments] == [(SegmentState.COPY_SEGMENT_FINISHED, 1)]


def test_a_batch_commits_its_partitions_writes_together_and_refuses_each_alone(tmp_path: Path) -> None:
    """The plugin's group commit: writes of two partitions in one request, one Delta commit; a deposed leader's
    copy among them is refused alone, and each answer is the one its own request would have had."""
    newer = _add(segment_id=LATER_ID, start=200, leader_epochs=((3, 200),))
    (first,) = _ask(tmp_path, newer)
    other = {**PARTITION, "partition": 4}
    writes = [_add(start=300, leader_epochs=((2, 300),)),  # partition 3: a deposed leader's copy
              {**_add(), **other}]  # partition 4: a first copy
    (bad,) = _ask(tmp_path, {"op": "batch", "requests": [*writes, {**_add(), **other}]})
    assert not bad["ok"] and "one write per partition" in bad["error"]
    (answered,) = _ask(tmp_path, {"op": "batch", "requests": writes})
    fenced, copied = answered["result"]["answers"]
    assert (fenced["ok"], fenced["type"]) == (False, "FencedError")
    assert copied["ok"] and copied["result"]["version"] == first["result"]["version"] + 1
    assert [(s["start_offset"], s["state"]) for s in copied["result"]["segments"]] == [(100, "COPY_SEGMENT_STARTED")]
    table = table_in_store(open_store(str(tmp_path)))
    assert table.version() == first["result"]["version"] + 1  # one commit for the batch
    assert [s.segment_id for s in table.partition_snapshot("orders", 3).segments] == [LATER_ID]


@pytest.mark.parametrize("transactional", [True, False, None])
def test_a_copy_is_one_commit_of_a_finished_row(tmp_path: Path, transactional: bool | None) -> None:
    """The plugin's `copy` (the broker's add held until its COPY_SEGMENT_FINISHED): one Delta commit, the row live at
    once with the add's fields, the broker's writer and leader epochs, and the storage manager's finding."""
    (copied,) = _ask(tmp_path, _copy(transactional, txn_index_empty=False))
    assert copied["ok"], copied
    assert copied["result"]["version"] == 1, "the table's creation, then the copy's one commit"
    assert [(s["state"], s["live"], s["txn_index"]) for s in copied["result"]["segments"]] == [
        ("COPY_SEGMENT_FINISHED", True, True)]
    table = table_in_store(open_store(str(tmp_path)))
    assert table.version() == 1
    (live,) = table.live_segments("orders", 3)
    assert (live.start_offset, live.end_offset, live.writer, live.transactional) == (100, 199, "broker-7",
                                                                                     transactional)
    assert [(e.epoch, e.start_offset) for e in live.segment_leader_epochs] == [(0, 100), (2, 150)]
    assert live.event_timestamp_ms == 6
    assert {o.suffix for o in live.object_keys} == {Suffix.LOG, Suffix.OFFSET_INDEX, Suffix.TIME_INDEX,
                                                    Suffix.TXN_INDEX, Suffix.PRODUCER_SNAPSHOT,
                                                    Suffix.LEADER_EPOCH_CHECKPOINT}


def test_a_deposed_leaders_copy_is_fenced_and_nothing_committed(tmp_path: Path) -> None:
    newer = _copy(segment_id=LATER_ID, start=200, leader_epochs=((3, 200),))
    deposed = _copy(start=300, leader_epochs=((2, 300),))
    answers = _ask(tmp_path, newer, deposed)
    assert [a["ok"] for a in answers] == [True, False]
    assert answers[1]["type"] == "FencedError" and "expected leader epoch 3 or newer, found 2" in answers[1]["error"]
    table = table_in_store(open_store(str(tmp_path)))
    assert [s.segment_id for s in table.partition_snapshot("orders", 3).segments] == [LATER_ID]
    assert table.version() == 1


def test_a_batch_of_copies_commits_together_and_an_overlapping_one_alone(tmp_path: Path) -> None:
    """Copies of three partitions in one batch: a deposed leader's is refused, a first copy lands in the batch's
    commit, and one that overlaps its partition's tier is committed after it in two steps (as `add` and `update`),
    superseded; each answer is the one its own request would have had."""
    other, third = {**PARTITION, "partition": 4}, {**PARTITION, "partition": 5}
    (first,) = _ask(tmp_path, {"op": "batch", "requests": [
        _copy(segment_id=LATER_ID, start=200, leader_epochs=((3, 200),)), {**_copy(), **third}]})
    assert all(a["ok"] for a in first["result"]["answers"]), first
    version = table_in_store(open_store(str(tmp_path))).version()
    writes = [_copy(start=300, leader_epochs=((2, 300),)),  # partition 3: a deposed leader's copy
              {**_copy(), **other},  # partition 4: a first copy
              {**_copy(segment_id=COPY_ID), **third}]  # partition 5: [100, 199] again (a retried copy)
    (answered,) = _ask(tmp_path, {"op": "batch", "requests": writes})
    fenced, copied, overlapping = answered["result"]["answers"]
    assert (fenced["ok"], fenced["type"]) == (False, "FencedError")
    assert copied["ok"] and copied["result"]["version"] == version + 1
    assert [(s["start_offset"], s["state"]) for s in copied["result"]["segments"]] == [(100, "COPY_SEGMENT_FINISHED")]
    assert overlapping["ok"] and overlapping["result"]["version"] == version + 3, "the batch, then add and update"
    assert {(s["segment_id"], s["state"], s["live"]) for s in overlapping["result"]["segments"]} == {
        (SEGMENT_ID, "COPY_SEGMENT_FINISHED", True), (COPY_ID, "DELETE_SEGMENT_STARTED", False)}
    assert table_in_store(open_store(str(tmp_path))).version() == version + 3
