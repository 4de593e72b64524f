"""The Python side of the plugin's pipes against their schema (`compaction/pipes.json`): what each op's handler reads
and what it answers, through the real processes' `serve` on a local store. The plugin's `PipeSchemaTest` checks what
the Java side sends against the same file."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest

from compaction.metadata import SegmentState, broker_writer, table_in_store
from compaction.metadata.model import BROKER_WRITER_PREFIX
from compaction.pipes import SCHEMA, WRITER_PREFIX, check_request, request_fields
from compaction.remote_log_metadata import RemoteTier
from compaction.remote_log_metadata import serve as serve_metadata
from compaction.remote_storage import serve as serve_store
from compaction.storage import open_store

TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"
PARTITION = {"topic": "orders", "partition": 3, "topic_id": TOPIC_ID, "broker_id": 7}
READ: list[tuple[int, str]] = []


class Reading(dict[str, Any]):
    """A request object that notes each field a handler reads (`[]` or `get`)."""

    def __getitem__(self, key: str) -> Any:
        READ.append((id(self), key))
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        READ.append((id(self), key))
        return super().get(key, default)


def _metadata_requests() -> list[dict[str, Any]]:
    def add(segment_id: str, partition: int, start: int) -> dict[str, Any]:
        return {"op": "add", **PARTITION, "partition": partition, "segment_id": segment_id, "start_offset": start,
                "end_offset": start + 99, "max_timestamp_ms": 5, "event_timestamp_ms": 6, "segment_size_bytes": 4096,
                "txn_index_empty": False, "leader_epochs": [[0, start]]}

    def update(segment_id: str, partition: int) -> dict[str, Any]:
        return {"op": "update", **PARTITION, "partition": partition, "segment_id": segment_id,
                "state": SegmentState.COPY_SEGMENT_FINISHED.value, "event_timestamp_ms": 9, "transactional": False}

    return [
        add("tqimKeZwStOEOwRzT3L5oQ", 3, 100),
        update("tqimKeZwStOEOwRzT3L5oQ", 3),
        {"op": "segments", **PARTITION},
        {"op": "batch", "requests": [add("AAAAAAAAAAAAAAAAAAAAAQ", 4, 0), add("AAAAAAAAAAAAAAAAAAAAAg", 3, 200)]},
        {**add("AAAAAAAAAAAAAAAAAAAAAw", 5, 0), "op": "copy", "transactional": True},
        {"op": "batch", "requests": [{**add("AAAAAAAAAAAAAAAAAAAABA", 6, 0), "op": "copy", "transactional": None},
                                     update("AAAAAAAAAAAAAAAAAAAAAQ", 4)]},
        {"op": "load", "partitions": [{"topic": "orders", "partition": 3}, {"topic": "orders", "partition": 4}]},
        {"op": "follow", "since": 0},
    ]


def _served(serve: Any, target: Any, requests: list[dict[str, Any]]) -> tuple[list[Reading], list[dict[str, Any]]]:
    """Each request as the handlers got it (noting what they read) and each answer's line."""
    parsed: list[Reading] = []

    def hook(pairs: dict[str, Any]) -> Reading:
        return Reading(pairs)

    lines = io.StringIO("".join(json.dumps(r) + "\n" for r in requests))
    original = json.loads
    answers = io.BytesIO() if serve is serve_store else io.StringIO()

    def loads(text: str | bytes, **kwargs: Any) -> Any:
        if isinstance(text, str) and text.strip() in {json.dumps(r) for r in requests}:
            parsed.append(original(text, object_hook=hook))
            return parsed[-1]
        return original(text, **kwargs)

    json.loads = loads  # both modules call json.loads on each request line
    try:
        serve(target, lines, answers, 1) if serve is serve_store else serve(target, lines, answers)
    finally:
        json.loads = original
    text = answers.getvalue()
    if isinstance(text, str):
        return parsed, [original(line) for line in text.splitlines() if line.strip()]
    found, at = [], 0
    while at < len(text):  # a `get` answer's line is followed by its bytes
        end = text.index(b"\n", at)
        found.append(original(text[at:end]))
        at = end + 1 + ((found[-1].get("result") or {}).get("length", 0) if found[-1]["ok"] else 0)
    return parsed, found


def _read_by(request: dict[str, Any]) -> set[str]:
    return {key for owner, key in READ if owner == id(request)}


def test_the_metadata_handlers_read_only_the_schemas_fields_and_answer_its_fields(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    READ.clear()
    parsed, answers = _served(serve_metadata, RemoteTier.of(table_in_store(store, create=True), store),
                              _metadata_requests())
    schema = SCHEMA["metadata"]
    assert [set(a) for a in answers] == [set(schema["answer"])] * len(answers), answers
    for request, answer in zip(parsed, answers, strict=True):
        op = request["op"]
        assert _read_by(request) <= set(request_fields("metadata", op)), op
        result, fields = answer["result"], schema["results"][op]
        partitions = [result] if fields == "partition" else result.get("partitions", [])
        assert fields == "partition" or set(result) == set(fields), (op, result)
        for partition in partitions:
            assert set(partition) == set(schema["partition"]), (op, partition)
            assert partition["segments"], (op, partition)
            for segment in partition["segments"]:
                assert set(segment) == set(schema["segment"]), (op, segment)
        for inner, inner_answer in zip(request.get("requests", []), result.get("answers", []), strict=True):
            assert _read_by(inner) <= set(request_fields("metadata", inner["op"]))
            assert inner_answer["ok"], inner_answer
            assert set(inner_answer["result"]) == set(schema["partition"])
        for inner in request.get("partitions", []):
            assert _read_by(inner) <= set(schema["load_partition"])


def test_the_store_handlers_read_only_the_schemas_fields_and_answer_its_fields(tmp_path: Path) -> None:
    source = tmp_path / "segment.log"
    source.write_bytes(b"0123456789")
    requests = [
        {"op": "put_file", "id": 1, "key": "t/0/a.log", "path": str(source)},
        {"op": "put", "id": 2, "key": "t/0/a.epochs", "data": base64.b64encode(b"0\n1\n0 0\n").decode()},
        {"op": "get", "id": 3, "key": "t/0/a.log", "start": 2, "end": 6},
        {"op": "list", "id": 4, "prefix": "t/0/", "suffix": ".log"},
        {"op": "delete", "id": 5, "key": "t/0/a.log"},
    ]
    READ.clear()
    parsed, answers = _served(serve_store, open_store(str(tmp_path / "store")), requests)
    schema = SCHEMA["store"]
    by_id = {a["id"]: a for a in answers}
    for request in parsed:
        op = request["op"]
        assert _read_by(request) <= set(request_fields("store", op)), op
        answer = by_id[request["id"]]
        assert set(answer) == set(schema["answer"]), answer
        fields = schema["results"][op]
        assert (answer["result"] is None) if fields is None else set(answer["result"]) == set(fields), answer


@pytest.mark.parametrize(("pipe", "request_", "expected"), [
    ("metadata", {"op": "update", **PARTITION, "segment_id": "x", "state": "COPY_SEGMENT_FINISHED"},
     "metadata request 'update' lacks event_timestamp_ms, transactional"),
    ("metadata", {"op": "drop"}, "expected op one of ['add', 'batch', 'copy', 'follow', 'load', 'segments', 'update']"),
    ("store", {"op": "get", "id": 1, "key": "k", "start": 0}, "store request 'get' lacks end"),
    ("store", [1], "expected a JSON object as a store request, found list"),
])
def test_a_request_missing_a_field_is_refused_by_name(pipe: str, request_: Any, expected: str) -> None:
    with pytest.raises(ValueError, match="^" + expected.replace("[", r"\[").replace("]", r"\]")):
        check_request(pipe, request_)


def test_a_request_missing_a_field_gets_an_error_answer_naming_it(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    out = io.StringIO()
    bad = {"op": "add", **PARTITION, "segment_id": "tqimKeZwStOEOwRzT3L5oQ"}
    serve_metadata(RemoteTier.of(table_in_store(store, create=True), store), io.StringIO(json.dumps(bad) + "\n"), out)
    (answer,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert not answer["ok"] and "metadata request 'add' lacks start_offset" in answer["error"], answer
    assert table_in_store(store).live_segments("orders", 3) == ()


def test_the_broker_writer_name_is_the_schemas() -> None:
    assert WRITER_PREFIX == BROKER_WRITER_PREFIX == "broker-" and broker_writer(7) == "broker-7"
