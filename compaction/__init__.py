"""kcompact: Kafka log compaction for segments in object storage, as a Spark batch job."""

from __future__ import annotations

from compaction.errors import (
    CommitConflictError,
    ConfigError,
    CorruptInputError,
    FencedError,
    KcompactError,
    RetryableError,
)

__all__ = [
    "CommitConflictError",
    "ConfigError",
    "CorruptInputError",
    "FencedError",
    "KcompactError",
    "RetryableError",
]
