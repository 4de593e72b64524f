"""kcompact's object store as a Kafka broker's RemoteStorageManager reaches it, served over a pipe.

The tiered plugin (`kafka/tiered-plugin`, `KcompactRemoteStorageManager`) starts
`python -m compaction.remote_storage --store STORE [--endpoint-url URL]` for a store that is not a local directory
(`s3://bucket/prefix`), and speaks JSON lines with it on stdin/stdout. The objects are read and written by
kcompact's own store (`compaction.storage`): the same client, retries, conditional create-only PUTs and multipart
uploads as `kcompact compact`, so what the broker tiers and what kcompact writes cannot differ in layout or rules.

Requests are served concurrently (a pool of `--threads`): the broker copies segments and reads several remote
segments at once, and one slow upload must not hold up a consumer's fetch. Each request carries an `id`, which its
answer repeats; answers come in the order they finish. Like the metadata process, this one ends when its stdin
closes and ignores SIGTERM and SIGINT (a broker's stop may signal its process group while it still finishes a copy).

Requests (`op` and its fields, as `compaction/pipes.json` names them: each request is checked against it;
every answer is a line `{"id": N, "ok": true, "result": ...}` or
`{"id": N, "ok": false, "error": "<one line naming the object's URI>", "type": "<kcompact error class>"}`):

- `put_file`: create `key` from the local file `path` (the broker's segment file, read in place);
- `put`: create `key` holding `data` (base64: the leader-epoch checkpoint Kafka passes as bytes);
- `get`: the bytes `[start, end)` of `key` (`end` null: to the end), cut short at the object's end: the answer's
  result is `{"length": N}` and the N bytes follow its line as they are, so that neither side encodes or parses
  megabytes of base64 (docs/broker.md has the figures). The plugin asks for chunks, so a fetch that reads
  a little of a segment downloads a little, and keeps a segment's chunks for the broker's next fetches of it (its
  `ChunkCache`), several requests in flight ahead of the reader;
- `delete`: remove `key`; idempotent;
- `list`: the objects under `prefix` whose key ends with `suffix`, as `{"objects": [[key, size], ...]}` in key order:
  the plugin lists a partition's `.log` objects to learn which segment follows the one a consumer is finishing, and
  fetches its first chunk before the broker asks for it.

A missing object answers `MissingObjectError`, an existing one on create `ObjectExistsError`.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from compaction.errors import KcompactError
from compaction.pipes import check_request
from compaction.storage import ObjectStore, open_store


def _put_file(store: ObjectStore, req: Mapping[str, Any]) -> None:
    store.put_file(req["key"], req["path"])


def _put(store: ObjectStore, req: Mapping[str, Any]) -> None:
    store.put(req["key"], base64.b64decode(req["data"]))


def _get(store: ObjectStore, req: Mapping[str, Any]) -> bytes:
    return store.get(req["key"], req.get("start", 0), req.get("end"))


def _delete(store: ObjectStore, req: Mapping[str, Any]) -> None:
    store.delete(req["key"])


def _list(store: ObjectStore, req: Mapping[str, Any]) -> dict[str, list[list[str | int]]]:
    suffix = req.get("suffix", "")
    return {"objects": [[o.key, o.size] for o in store.list(req["prefix"]) if o.key.endswith(suffix)]}


_OPS: dict[str, Callable[[ObjectStore, Mapping[str, Any]], Any]] = {
    "put_file": _put_file, "put": _put, "get": _get, "delete": _delete, "list": _list,
}


def answer(store: ObjectStore, line: str) -> bytes:
    """The answer to one request line, as written: a JSON line, and for a `get` the bytes after it. Any failure is an
    error answer naming the object, so the broker gets it as a RemoteStorageException and the process goes on
    serving."""
    req: Any = None
    try:
        req = json.loads(line)
        result = _OPS[check_request("store", req)](store, req)
        if isinstance(result, bytes):
            return _line({"id": req["id"], "ok": True, "result": {"length": len(result)}}) + result
        return _line({"id": req["id"], "ok": True, "result": result})
    except KcompactError as e:
        error, kind = str(e), type(e).__name__
    except Exception as e:
        key = req.get("key") if isinstance(req, dict) else None
        where = f"{store.object_uri(key)}: " if isinstance(key, str) and key else ""
        error, kind = f"{where}{type(e).__name__}: {e} (request: {line.strip()[:200]})", "InternalError"
    request_id = req.get("id") if isinstance(req, dict) else None
    return _line({"id": request_id, "ok": False, "error": error.replace("\n", " "), "type": kind})


def _line(answer: Mapping[str, Any]) -> bytes:
    return (json.dumps(answer) + "\n").encode()


def serve(store: ObjectStore, requests: IO[str], answers: IO[bytes], threads: int) -> None:
    """Answer every request line of `requests` until it closes, up to `threads` at once; returns when all are
    answered."""
    lock = threading.Lock()

    def reply(line: str) -> None:
        written = answer(store, line)
        with lock:
            answers.write(written)
            answers.flush()

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="remote-storage") as pool:
        for line in requests:
            if line.strip():
                pool.submit(reply, line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the store's URI (s3://bucket/prefix or a directory)")
    parser.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS_ENDPOINT_URL or AWS's)")
    parser.add_argument("--threads", type=int, default=8, help="requests served at once")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    store = open_store(args.store, endpoint_url=args.endpoint_url)
    answers = sys.stdout.buffer
    answers.write(_line({"id": None, "ok": True, "result": {"ready": store.uri}}))
    answers.flush()
    serve(store, sys.stdin, answers, args.threads)


if __name__ == "__main__":
    main()
