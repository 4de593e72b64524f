"""`compaction.remote_storage`: the broker's RemoteStorageManager requests answered on kcompact's store, on each
backend (a local directory and S3 on moto), and the process's own life: ready line, --endpoint-url, stdin closing."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from compaction.remote_storage import serve
from compaction.storage import ObjectStore
from tests.moto_s3 import BUCKET, FAKE_AWS_ENV, UNSET_AWS_ENV

KEY = "orders-MWJ6FHTfRYy67jzwZdeqSQ/3/00000000000000000100-tqimKeZwStOEOwRzT3L5oQ.log"


def _ask(store: ObjectStore, *requests: dict[str, Any], threads: int = 4) -> dict[int, dict[str, Any]]:
    out = io.BytesIO()
    lines = "".join(json.dumps({"id": i, **r}) + "\n" for i, r in enumerate(requests, 1))
    serve(store, io.StringIO(lines), out, threads)
    answers = _answers(out.getvalue())
    assert sorted(a["id"] for a in answers) == list(range(1, len(requests) + 1))
    return {a["id"]: a for a in sorted(answers, key=lambda a: a["id"])}


def _answers(written: bytes) -> list[dict[str, Any]]:
    """Each answer line, with `data` the bytes that follow a `get`'s."""
    answers, stream = [], io.BytesIO(written)
    while line := stream.readline():
        answer = json.loads(line)
        result = answer.get("result")
        if isinstance(result, dict) and "length" in result:
            answer["data"] = stream.read(result["length"])
            assert len(answer["data"]) == result["length"]
        answers.append(answer)
    return answers


def _data(answer: dict[str, Any]) -> bytes:
    assert answer["ok"], answer
    return bytes(answer["data"])


def test_objects_are_written_read_by_range_and_deleted(store: ObjectStore, tmp_path: Path) -> None:
    segment = tmp_path / "00000000000000000100.log"
    segment.write_bytes(b"0123456789")
    epochs = base64.b64encode(b"0\n1\n0 100\n").decode()
    written = _ask(store, {"op": "put_file", "key": KEY, "path": str(segment)},
                   {"op": "put", "key": KEY + "-epochs", "data": epochs})
    assert all(a["ok"] for a in written.values()), written
    got = _ask(store, {"op": "get", "key": KEY, "start": 2, "end": 5},
               {"op": "get", "key": KEY, "start": 8, "end": 100},
               {"op": "get", "key": KEY, "start": 10, "end": 14},
               {"op": "get", "key": KEY + "-epochs", "start": 0, "end": None})
    assert [_data(got[i]) for i in (1, 2, 3, 4)] == [b"234", b"89", b"", b"0\n1\n0 100\n"]
    deleted = _ask(store, {"op": "delete", "key": KEY}, {"op": "delete", "key": KEY + "-never-written"}, threads=1)
    assert all(a["ok"] for a in deleted.values()), deleted
    assert not store.exists(KEY)


def test_a_partitions_objects_are_listed_by_suffix_with_their_sizes(store: ObjectStore) -> None:
    partition = KEY.rsplit("/", 1)[0] + "/"
    later = partition + "00000000000000000200-bbbbbbbbbbbbbbbbbbbbbb.log"
    for key, data in ((KEY, b"0123456789"), (KEY[:-3] + "index", b"ix"), (later, b"abc"), ("other/1.log", b"x")):
        store.put(key, data)
    listed = _ask(store, {"op": "list", "prefix": partition, "suffix": ".log"},
                  {"op": "list", "prefix": "none/", "suffix": ""})
    assert listed[1]["result"] == {"objects": [[KEY, 10], [later, 3]]}
    assert listed[2]["result"] == {"objects": []}


def test_failures_are_answers_naming_the_object(store: ObjectStore, tmp_path: Path) -> None:
    segment = tmp_path / "s.log"
    segment.write_bytes(b"x")
    answers = _ask(store, {"op": "put_file", "key": KEY, "path": str(segment)}, threads=1)
    assert answers[1]["ok"]
    again, missing, unknown = _ask(store, {"op": "put_file", "key": KEY, "path": str(segment)},
                                   {"op": "get", "key": KEY + "x", "start": 0, "end": 4},
                                   {"op": "rename", "key": KEY}).values()
    assert (again["ok"], again["type"]) == (False, "ObjectExistsError"), again
    assert store.object_uri(KEY) in again["error"]
    assert (missing["type"], store.object_uri(KEY + "x") in missing["error"]) == ("MissingObjectError", True)
    assert unknown["type"] == "InternalError" and store.object_uri(KEY) in unknown["error"]


@pytest.mark.s3
def test_the_process_opens_an_s3_store_at_its_endpoint_and_ends_with_its_stdin(moto_endpoint: str,
                                                                              tmp_path: Path) -> None:
    segment = tmp_path / "s.log"
    segment.write_bytes(b"from the broker")
    env = {k: v for k, v in os.environ.items() if k not in UNSET_AWS_ENV} | FAKE_AWS_ENV
    store = f"s3://{BUCKET}/remote-storage-{tmp_path.name}"
    requests = [{"id": 1, "op": "put_file", "key": KEY, "path": str(segment)},
                {"id": 2, "op": "get", "key": KEY, "start": 5, "end": None}]
    done = subprocess.run([sys.executable, "-m", "compaction.remote_storage", "--store", store,
                           "--endpoint-url", moto_endpoint, "--threads", "1"],
                          input="".join(json.dumps(r) + "\n" for r in requests).encode(), capture_output=True,
                          env=env, timeout=60, check=True)
    ready, put, get = _answers(done.stdout)
    assert ready == {"id": None, "ok": True, "result": {"ready": store}}
    assert put == {"id": 1, "ok": True, "result": None}
    assert get["result"] == {"length": 10}
    assert _data(get) == b"the broker"
