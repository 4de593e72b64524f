"""`compaction.remote_log_metadata`: the broker's RemoteLogMetadataManager requests answered on the metadata table."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from compaction.metadata import SegmentState, acquire_fencing_epoch, table_in_store
from compaction.remote_log_metadata import serve
from compaction.storage import open_store
from compaction.storage.layout import Suffix, segment_object_key

TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"
SEGMENT_ID = "tqimKeZwStOEOwRzT3L5oQ"
LATER_ID = "AAAAAAAAAAAAAAAAAAAAAQ"
PARTITION = {"topic": "orders", "partition": 3, "topic_id": TOPIC_ID, "broker_id": 7}


def _ask(store: Path, *requests: dict[str, Any]) -> list[dict[str, Any]]:
    table = table_in_store(open_store(str(store)), create=True)
    out = io.StringIO()
    serve(table, io.StringIO("".join(json.dumps(r) + "\n" for r in requests)), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _add(txn_index_empty: bool = True, segment_id: str = SEGMENT_ID, start: int = 100,
         leader_epochs: tuple[tuple[int, int], ...] = ((0, 100), (2, 150))) -> dict[str, Any]:
    return {"op": "add", **PARTITION, "segment_id": segment_id, "start_offset": start, "end_offset": start + 99,
            "max_timestamp_ms": 5, "event_timestamp_ms": 6, "segment_size_bytes": 4096,
            "txn_index_empty": txn_index_empty, "leader_epochs": [list(e) for e in leader_epochs]}


def _update(state: SegmentState) -> dict[str, Any]:
    return {"op": "update", **PARTITION, "segment_id": SEGMENT_ID, "state": state.value, "event_timestamp_ms": 9}


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
    assert "KeyError" in bad["error"] and '"op": "add"' in bad["error"]
    assert good == {"ok": True, "result": {"version": 0, "segments": []}}


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
