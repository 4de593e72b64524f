"""S3 that misbehaves on the wire: a flaky HTTP proxy on 127.0.0.1 in front of the moto server.

Every fault is a real HTTP answer that boto3 (and, for the metadata table, delta-rs) has to parse and survive:
a `Fault` decides, per request, whether to forward it, answer an S3 error (503 SlowDown, 500 InternalError,
403 AccessDenied) without forwarding, or forward it and then answer 503 as if the reply was lost; `latency` may hold
a request back first (requests wait on it concurrently, as on a network). Stores reach
the proxy through `spec_through`; the test's own reads go to moto directly (`direct`).
"""

from __future__ import annotations

import http.client
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from compaction.storage import ObjectStore, RetryPolicy, StoreSpec
from tests.moto_s3 import BUCKET, FAST_RETRY, REGION, TEST_PART_SIZE

Fault = Callable[[str, str, int], "tuple[int, str] | str | None"]
"""(method, path, how many times this method+path was seen before) -> (status, S3 error code) to answer
without forwarding, "lose" to forward and then answer 503 as if the reply was lost, or None to forward."""

_ERROR_XML = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{code} (injected by the '
              'test proxy)</Message><RequestId>kcompact-test</RequestId></Error>')
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


@dataclass
class FlakyProxy:
    """A threaded HTTP/1.1 proxy that forwards to `upstream` unless `fault` says otherwise; records what it injected."""

    upstream: str
    fault: Fault = lambda method, path, seen: None
    latency: Callable[[str, str], None] = lambda method, path: None  # before forwarding, outside the lock: may sleep
    endpoint: str = ""  # the proxy's URL, once started
    injected: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, code)
    _seen: dict[tuple[str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> str:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers:
                    if name.lower() not in _HOP_BY_HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)) if self.command != "HEAD" else
                                 dict((k.lower(), v) for k, v in headers).get("content-length", "0"))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _error(self, status: int, code: str) -> None:
                body = _ERROR_XML.format(code=code).encode()
                self._answer(status, [("Content-Type", "application/xml")], b"" if self.command == "HEAD" else body)

            def _handle(self) -> None:
                body = self._body()
                decision = proxy.decide(self.command, self.path)
                proxy.latency(self.command, self.path)
                if isinstance(decision, tuple):
                    self._error(*decision)
                    return
                status, headers, reply = proxy.forward(self.command, self.path, dict(self.headers), body)
                if decision == "lose":
                    self._error(503, "ServiceUnavailable")
                    return
                self._answer(status, headers, reply)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.endpoint

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def decide(self, method: str, path: str) -> tuple[int, str] | str | None:
        with self._lock:
            seen = self._seen.get((method, path), 0)
            self._seen[(method, path)] = seen + 1
            decision = self.fault(method, path, seen)
            if decision is not None:
                self.injected.append((method, path, decision if isinstance(decision, str) else decision[1]))
            return decision

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, list, bytes]:
        target = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=30)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(method, path, body=body if body or method in ("PUT", "POST") else None, headers=sent)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()




def running_proxy(upstream: str) -> Iterator[FlakyProxy]:
    """A started proxy in front of `upstream` (the session's moto server), forwarding everything until the test
    sets `fault`; stopped afterwards."""
    p = FlakyProxy(upstream)
    p.start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FlakyProxy]:
    """A flaky proxy in front of the session's moto server, for one test (a plugin of tests/conftest.py)."""
    yield from running_proxy(moto_endpoint)


def spec_through(proxy: FlakyProxy, retry: RetryPolicy = FAST_RETRY) -> StoreSpec:
    return StoreSpec.parse(f"s3://{BUCKET}/faults-{uuid.uuid4().hex[:12]}/store",
                           endpoint_url=proxy.endpoint, region=REGION, retry=retry,
                           part_size=TEST_PART_SIZE)


def fast_delta_retries(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """delta-rs retries once after 10 ms instead of ten times with backoff: the same paths, a faster test."""
    options = store.delta_storage_options()
    monkeypatch.setattr(store, "delta_storage_options",
                        lambda: {**options, "max_retries": "1", "backoff_config.init_backoff": "10ms"})


def is_segment_object(path: str) -> bool:
    return "_kcompact_metadata" not in path and "/_kcompact/" not in path and urlsplit(path).path.count("/") > 3



def commit_entry(path: str) -> int | None:
    """The table version a PUT of `path` commits, if it is a Delta log entry."""
    name = urlsplit(path).path.rsplit("/", 1)[-1]
    return int(name[:-5]) if "/_delta_log/" in path and name.endswith(".json") and name[:-5].isdigit() else None




def direct(store: ObjectStore, moto_endpoint: str) -> ObjectStore:
    """The same store without the proxy, for the test's own reads."""
    return StoreSpec.parse(store.uri, endpoint_url=moto_endpoint, region=REGION).open()
