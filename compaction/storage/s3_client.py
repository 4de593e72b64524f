"""The boto3 side of the S3 backend: one shared session per process, the client settings, credentials.

Making a session loads the service models, which is slow, and an executor opens a store per task, so the
stores of a process share one. Sessions are not thread-safe, hence the lock; the clients made from them
are. Clients have botocore's retries switched off: `s3_retry.py` is the one retry layer.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import boto3
from botocore.config import Config

from compaction.storage.base import StoreSpec

_session_lock = threading.Lock()
_shared_session: Any = None


def _session() -> Any:
    """The boto3 session of this process, shared by its stores; call with `_session_lock` held."""
    global _shared_session
    if _shared_session is None:
        _shared_session = boto3.session.Session()
    return _shared_session


_clients: dict[tuple[str | None, str | None], Any] = {}


def new_client(spec: StoreSpec) -> Any:
    """The S3 client for `spec`'s endpoint and region, from the shared session, without botocore retries: one per
    endpoint and region in the process, shared by its stores (boto3's clients are thread-safe). A client per store
    cost ~9 ms to make under the session's lock and its own connections: a packed rewrite task opens a store per
    partition, 1,000 in a run of 1,000 partitions."""
    where = (spec.endpoint_url, spec.region)
    with _session_lock:
        if where not in _clients:
            _clients[where] = _make_client(spec)
        return _clients[where]


MAX_POOL_CONNECTIONS = 32
"""Connections one client keeps to the endpoint (botocore's default is 10)."""
S3_PUT_THREADS = MAX_POOL_CONNECTIONS
"""Requests of one `put_many` or `delete_many` on S3 in flight at once (`S3Store.put_threads`): as many as the client
has connections. A metadata commit of 1,000 partitions puts 1,000 small objects, each a round trip: on 8 threads,
as a local store's puts run, 7.1 s against a moto server holding each request 50 ms, on 32 threads 3.9-4.1 s (moto
itself, on the same 2 cores, then sets the pace; S3 answers each request apart)."""


def _make_client(spec: StoreSpec) -> Any:
    """A new client (call with `_session_lock` held)."""
    return _session().client(
        "s3",
        endpoint_url=spec.endpoint_url,
        region_name=spec.region,
        config=Config(
            retries={"mode": "standard", "total_max_attempts": 1},  # retries are ours: see s3_retry
            connect_timeout=10,
            read_timeout=60,
            max_pool_connections=MAX_POOL_CONNECTIONS,
        ),
    )


def credentials() -> Any:
    """The credentials boto3 resolves for this process (environment, config files, roles), or None."""
    with _session_lock:
        return _session().get_credentials()


def md5(data: bytes) -> Any:
    """MD5 as S3 uses it for ETags (not for security)."""
    return hashlib.md5(data, usedforsecurity=False)
