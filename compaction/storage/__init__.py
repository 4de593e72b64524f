"""Object storage behind a small interface: a local directory or S3, chosen by URI scheme.

`open_store(uri)` opens a store; `store.spec` is the small picklable value that reopens it on a Spark
executor (`spec.open()`). Backends live in `local.py` and `s3.py` (boto3 is imported only when an S3
store is opened); the layout of segment object keys is in `layout.py`.
"""

from __future__ import annotations

from compaction.storage.base import (
    DEFAULT_STORE_URI,
    ObjectInfo,
    ObjectStore,
    RetryPolicy,
    StoreSpec,
    StoreStats,
    open_store,
    register_backend,
)
from compaction.storage.local import LocalStore


def _open_s3(spec: StoreSpec) -> ObjectStore:
    from compaction.storage.s3 import S3Store  # boto3 is imported only when an S3 store is opened

    return S3Store(spec)


register_backend("file", LocalStore)
register_backend("s3", _open_s3)

__all__ = [
    "DEFAULT_STORE_URI",
    "ObjectInfo",
    "ObjectStore",
    "RetryPolicy",
    "StoreSpec",
    "StoreStats",
    "open_store",
]
